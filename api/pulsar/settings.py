"""The binary front end's settings: ports, TLS files and the bounds of a connection.

Role: ``magnetar standalone`` and ``magnetar broker`` build one ``PulsarSettings`` from
``--pulsar-port`` and Pulsar's configuration keys (``brokerServicePort``,
``brokerServicePortTls``, the TLS keys of ``api/tls.py``, ``advertisedAddress``,
``advertisedListeners``, ``internalListenerName``,
``maxMessageSize``, ``authenticationRefreshCheckSeconds``), Magnetar's bounds on a connection
before its handshake (``maxHandshakeFrameBytes``, ``maxHandshakeBufferBytes``,
``handshakeTimeoutMillis``) and the per-role shares of ``ROLE_SHARE_KEYS``; the server and every
session read their bounds from it. Every bound is a named setting with its unit in the name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from api.limits import FRAME_OVERHEAD_BYTES
from api.tls import TlsConfig
from broker import AdvertisedListener

MIB = 1024 * 1024


ROLE_SHARE_KEYS: dict[str, str] = {
    "brokerMaxConnectionsPerRole": "connections_per_role_max",
    "maxTopicListWatchersPerRole": "topic_list_watchers_per_role_max",
}
"""``standalone.conf`` key → per-role share (Pulsar has none: it bounds connections per IP)."""
ROLE_SHARE_RANGE = (1, 1_000_000)


@dataclass(frozen=True)
class PulsarSettings:
    host: str = "0.0.0.0"
    port: int = 6650
    """``pulsar://`` listener port; 0 turns the plain listener off."""
    tls_port: int = 0
    """``pulsar+ssl://`` listener port (6651 when certificates are configured); 0 = off."""
    tls: TlsConfig = field(default_factory=TlsConfig)
    """The certificate, the authorities client certificates must be signed by, the versions."""
    advertised_host: str | None = None
    """The host lookups answer with; default: the address the client connected to."""
    advertised_listeners: tuple[AdvertisedListener, ...] = ()
    """Pulsar's ``advertisedListeners`` (``api/pulsar/listeners.py``): with them, a lookup answers
    the listener the client names, or the internal one."""
    internal_listener_name: str = ""
    """``internalListenerName``: the listener of lookups that name none (one of the above)."""
    max_message_size_bytes: int = 5 * MIB
    """Told to clients in CONNECTED; larger messages are chunked by the client or refused."""
    pending_sends_max: int = 10_000
    """Sends of one connection stored or waiting for their receipt before the connection stops
    being read (TCP then holds the client back)."""
    write_buffer_bytes_max: int = 1 * MIB
    """Outgoing bytes queued for a slow client before deliveries stop (they wait, in the
    broker's flow control, until the buffer drained): with what one delivery writes past it, the
    most a client that stops reading holds in its connection (the kernel's socket buffer takes
    the bursts of a client that reads)."""
    keepalive_interval_s: float = 30.0
    """A PING is sent after this long without traffic; a connection silent for two intervals
    is closed."""
    auth_refresh_check_s: float = 60.0
    """How often connections are checked for an expired token (Pulsar's
    ``authenticationRefreshCheckSeconds``): a client that can refresh is sent AUTH_CHALLENGE and
    must answer within one more period; one that cannot is disconnected."""
    connections_max: int = 10_000
    """Binary-protocol connections open at once; more are closed as they are accepted."""
    handshake_frame_bytes_max: int = 64 * 1024
    """A frame received before the connection's handshake completed (``maxHandshakeFrameBytes``):
    a CONNECT with a token or another credential fits; a larger frame closes the connection
    from its header, before its bytes are read."""
    handshake_buffer_bytes_max: int = 16 * MIB
    """Bytes held in partial frames by all connections whose handshake has not completed
    (``maxHandshakeBufferBytes``); a connection that would take the sum past it is closed."""
    handshake_timeout_s: float = 10.0
    """A connection is closed unless its handshake completed this soon after it was accepted
    (``handshakeTimeoutMillis``)."""
    connections_per_role_max: int = 1_000
    """Connections one role may hold, with authentication on (``brokerMaxConnectionsPerRole``):
    a CONNECT beyond it is answered TooManyRequests and the connection closed."""
    topic_list_watchers_per_role_max: int = 1_000
    """Topic-list watches one role may hold on the server (``maxTopicListWatchersPerRole``), its
    share of the broker's pool of 10,000: more are refused with TooManyRequests."""
    lookup_threads: int = 4
    """Threads working out lookups on a cluster broker (they read ZooKeeper, so never on the loop)."""
    lookups_pending_max: int = 10_000
    """Lookups in flight on the server before more are refused with TooManyRequests (Pulsar's
    ``maxConcurrentLookupRequest``)."""
    entries_remembered_max: int = 100_000
    """Entries per consumer whose delivered messages are remembered to map acks to offsets."""

    @property
    def frame_bytes_max(self) -> int:
        return self.max_message_size_bytes + FRAME_OVERHEAD_BYTES

    @property
    def tls_enabled(self) -> bool:
        return self.tls_port > 0 and self.tls.configured
