"""The edge's bounds: every connection, request, response and session the API holds has one.

Role: one frozen ``EdgeLimits`` carries the bounds that ``api/connection_guard.py`` (TCP
connections and slow clients), ``api/request_guard.py`` (request bodies and concurrent calls
per role), the read and pull routes (response bytes) and the WebSocket and REST consumers
(outstanding bytes, consumers per role and namespace) enforce. Each bound is a named setting
with its unit in the name; ``api/config.py`` maps ``standalone.conf`` keys onto them (the table
below, also in the README) and refuses values outside ``LIMIT_RANGES``.

Invariant: every value is positive and within its range, checked at construction, so no bound
can be switched off by a typo.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class EdgeLimits:
    connections_max: int = 10_000
    """Open TCP connections of the web service, all listeners (HTTP and WebSocket); more are answered 503."""
    connections_per_role_max: int = 1_000
    """In-flight HTTP requests plus open WebSocket sessions of one role (with authentication on)."""
    header_timeout_ms: int = 10_000
    """A connection must deliver a request's complete headers this soon after it opens or after
    its previous response; otherwise it is closed (slow or silent clients)."""
    header_bytes_max: int = 8 * 1024
    """A request's line and headers: a longer head is answered 431 ``headers_too_large`` and its
    connection closed, before more of it is read (Pulsar's ``httpMaxRequestHeaderSize``)."""
    idle_timeout_ms: int = 30_000
    """A keep-alive HTTP connection with no request in flight is closed after this long."""
    body_timeout_ms: int = 60_000
    """A request body must arrive within this long once its headers did (408 otherwise)."""
    body_bytes_max: int = 16 * MIB
    """Request body of an authenticated caller (a 5 MiB message in base64, inside JSON, fits)."""
    unauthenticated_body_bytes_max: int = 0
    """Request body read before the caller is known, with authentication on: a request with a
    body and no valid token is answered 401 without reading it."""
    read_response_bytes_max: int = 8 * MIB
    """Payload bytes in one range-read answer (at least one message is always returned)."""
    pull_response_bytes_max: int = 8 * MIB
    """Payload bytes in one REST pull answer (at least one message is always returned)."""
    consumer_unacked_bytes_max: int = 16 * MIB
    """Bytes delivered to one consumer and not yet acknowledged (each message counting its share
    of its stored entry; a reader's, its payload); delivery pauses above it (at least one message
    is always delivered)."""
    rest_consumers_max: int = 1_000
    rest_consumers_per_role_max: int = 100
    rest_consumers_per_namespace_max: int = 500
    topics_pattern_bytes_max: int = 512
    """Length of a ``topicsPattern`` regular expression."""
    ws_frame_bytes_max: int = 8 * MIB
    """One WebSocket frame as received (a 5 MiB message, base64-encoded inside its JSON frame,
    fits): a larger one is not read, its connection is closed with 1009 (``api/ws/protocol.py``)."""

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            low, high = LIMIT_RANGES[item.name]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{item.name} must be an integer in {low}..{high}, not {value!r}")

    @property
    def header_timeout_s(self) -> float:
        return self.header_timeout_ms / 1000.0

    @property
    def idle_timeout_s(self) -> float:
        return self.idle_timeout_ms / 1000.0

    @property
    def body_timeout_s(self) -> float:
        return self.body_timeout_ms / 1000.0


LIMIT_RANGES: dict[str, tuple[int, int]] = {
    "connections_max": (1, 1_000_000),
    "connections_per_role_max": (1, 1_000_000),
    "header_timeout_ms": (100, 600_000),
    "header_bytes_max": (1024, MIB),
    "idle_timeout_ms": (100, 3_600_000),
    "body_timeout_ms": (100, 3_600_000),
    "body_bytes_max": (1024, 1024 * MIB),
    "unauthenticated_body_bytes_max": (0, MIB),
    "read_response_bytes_max": (1024, 1024 * MIB),
    "pull_response_bytes_max": (1024, 1024 * MIB),
    "consumer_unacked_bytes_max": (1024, 1024 * MIB),
    "rest_consumers_max": (1, 100_000),
    "rest_consumers_per_role_max": (1, 100_000),
    "rest_consumers_per_namespace_max": (1, 100_000),
    "topics_pattern_bytes_max": (1, 4096),
    "ws_frame_bytes_max": (64 * 1024, 256 * MIB),
}
"""Accepted range of each setting (inclusive)."""

CONFIG_KEYS: dict[str, str] = {
    "maxHttpServerConnections": "connections_max",
    "maxConnectionsPerRole": "connections_per_role_max",
    "httpHeaderTimeoutMillis": "header_timeout_ms",
    "httpMaxRequestHeaderSize": "header_bytes_max",
    "httpIdleTimeoutMillis": "idle_timeout_ms",
    "httpBodyTimeoutMillis": "body_timeout_ms",
    "httpMaxRequestSize": "body_bytes_max",
    "httpMaxUnauthenticatedRequestSize": "unauthenticated_body_bytes_max",
    "maxReadResponseBytes": "read_response_bytes_max",
    "maxPullResponseBytes": "pull_response_bytes_max",
    "maxUnackedBytesPerConsumer": "consumer_unacked_bytes_max",
    "maxRestConsumers": "rest_consumers_max",
    "maxRestConsumersPerRole": "rest_consumers_per_role_max",
    "maxRestConsumersPerNamespace": "rest_consumers_per_namespace_max",
    "maxTopicsPatternLength": "topics_pattern_bytes_max",
    "webSocketMaxTextFrameSize": "ws_frame_bytes_max",
}
"""``standalone.conf`` key → setting (Pulsar's key where Pulsar has one: ``maxHttpServerConnections``,
``httpMaxRequestSize``, ``httpMaxRequestHeaderSize``, ``webSocketMaxTextFrameSize``)."""
