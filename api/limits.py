"""The edge's bounds: every connection, request, response and session the API holds has one.

Role: the one place for the limits of ``api/`` (HTTP, WebSocket, admin, console and Pulsar's
binary protocol in ``api/pulsar/``). One frozen ``EdgeLimits`` carries the bounds an operator
sets, which ``api/connection_guard.py`` (TCP connections and slow clients),
``api/request_guard.py`` (request bodies and concurrent calls per role), the read and pull routes
(response bytes) and the WebSocket and REST consumers (outstanding bytes, consumers per role and
namespace) enforce; ``api/config.py`` maps ``standalone.conf`` keys onto them (``CONFIG_KEYS``)
and refuses values outside ``LIMIT_RANGES``. The module constants below it are the fixed bounds
(request parameters' ranges and defaults, frames, queues, remembered state, intervals), which the
modules import from here. README's "All limits" table is generated from this module
(``tools/limits_table.py``).

Invariants: every bound carries its unit in its name and a one-line docstring saying what it
bounds; every ``EdgeLimits`` value is positive and within its range, checked at construction, so
no bound can be switched off by a typo; this module imports nothing of the project.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

KIB = 1024
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
    """REST consumers open at once."""
    rest_consumers_per_role_max: int = 100
    """REST consumers one role holds open (with authentication on)."""
    rest_consumers_per_namespace_max: int = 500
    """REST consumers open on the topics of one namespace."""
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

# Fixed bounds of the HTTP routes.
READ_MESSAGES_DEFAULT = 1000
"""Messages one range read answers unless ``maxMessages`` says otherwise."""
READ_MESSAGES_MAX = 100_000
"""A range read's ``maxMessages``."""
READ_BYTES_DEFAULT = 8 * MIB
"""Payload bytes one range or stream read answers unless ``maxBytes`` says otherwise."""
READ_BYTES_MAX = 64 * MIB
"""A range or stream read's ``maxBytes``."""
STREAM_READ_MESSAGES_DEFAULT = 100
"""Versions one stream read answers unless ``maxMessages`` says otherwise."""
STREAM_READ_MESSAGES_MAX = 10_000
"""A stream read's ``maxMessages``."""
MESSAGES_PER_REQUEST_MAX = 10_000
"""Messages in one REST produce request (PIP-64)."""
PULL_MESSAGES_DEFAULT = 100
"""Messages one REST pull answers unless ``maxMessages`` says otherwise."""
PULL_MESSAGES_MAX = 10_000
"""A REST pull's ``maxMessages``."""
PULL_WAIT_MS_MAX = 30_000
"""A REST pull's ``waitTimeMs``."""
PULLS_IN_FLIGHT_MAX = 64
"""Concurrent pulls on one REST consumer."""
ACK_TIMEOUT_MS_DEFAULT = 30_000
"""A REST consumer's ack timeout unless ``ackTimeoutMillis`` says otherwise."""
ACK_TIMEOUT_MS_MIN = 1_000
"""A REST consumer's ``ackTimeoutMillis``, at least."""
ACK_TIMEOUT_MS_MAX = 3_600_000
"""A REST consumer's ``ackTimeoutMillis``, at most."""
NEGATIVE_ACK_DELAY_MS_DEFAULT = 60_000
"""A REST consumer's redelivery delay after a negative acknowledgement, unless set."""
NEGATIVE_ACK_DELAY_MS_MAX = 3_600_000
"""A REST consumer's ``negativeAckRedeliveryDelayMillis``."""
REDELIVER_COUNT_MAX = 1_000
"""A REST consumer's ``maxRedeliverCount``."""
ACK_IDS_PER_REQUEST_MAX = 10_000
"""Message ids (and offsets) in one REST acknowledgement."""
REST_CONSUMER_IDLE_MS = 60_000
"""A REST consumer not pulled for this long (or its ack timeout, if longer) is closed."""
REST_CONSUMER_SWEEP_INTERVAL_MS = 1_000
"""How often idle REST consumers are looked for."""
TOPICS_LISTED_MAX = 1000
"""Topics of a namespace listed by the console's broker overview (``truncated`` says there are more)."""
ROLES_PER_LIST_MAX = 1000
"""Longest ``adminRoles`` / ``allowedClusters`` list a tenant may be given."""
BROKER_ID_CHARS_MAX = 300
"""The ``destinationBroker`` of a bundle unload."""
LISTENER_NAME_CHARS_MAX = 64
"""An advertised listener's name (``advertisedListeners``; a lookup's ``listenerName``)."""
ADVERTISED_LISTENER_URLS_COUNT_MAX = 64
"""URLs in ``advertisedListeners`` (Pulsar has no bound; a broker has a few)."""
RETENTION_MINUTES_OR_MB_MAX = 2**31 - 1
"""``defaultRetentionTimeInMinutes`` and ``defaultRetentionSizeInMB`` (-1: unlimited)."""
REFUSED_BODY_DRAIN_BYTES_MAX = 64 * KIB
"""A refused request's body up to this size is read and dropped, so its connection closes cleanly."""
FD_RESERVE_MIN = 64
"""File descriptors kept for the storage (journal, entry logs, RocksDB) and the process."""
ACCEPT_ERROR_QUIET_S = 60.0
"""A failed ``accept()`` is logged once per this many seconds."""
COALESCED_WRITE_BYTES_MAX = 64 * 1024
"""A response's writes up to this size are held to leave with the next (head and body in one
system call); a larger one goes out as it is, not copied to join another."""
CONSOLE_FILES_MAX = 64
"""Files the web console serves (all read into memory at start)."""
CONSOLE_FILE_BYTES_MAX = 512 * KIB
"""One file the web console serves."""

# Fixed bounds of WebSocket sessions.
RECEIVER_QUEUE_MESSAGES_MAX = 1000
"""A WebSocket consumer's ``receiverQueueSize`` (Pulsar caps it at 1000)."""
WS_PENDING_MESSAGES_MAX = 10_000
"""A WebSocket producer's ``maxPendingMessages``."""
WS_BATCH_MESSAGES_MAX = 10_000
"""A WebSocket producer's ``batchingMaxMessages``."""
PERMITS_PER_FRAME_MAX = 100_000
"""``permitMessages`` of one WebSocket permit frame."""
SENT_IDS_REMEMBERED_MAX = 4 * RECEIVER_QUEUE_MESSAGES_MAX
"""Message ids a WebSocket consumer remembers having sent, to match acknowledgements."""
DELIVERY_BACKLOG_FRAMES_MAX = RECEIVER_QUEUE_MESSAGES_MAX
"""Message frames a WebSocket consumer's connection holds unsent before delivery pauses."""
WS_CREDIT_CHECK_INTERVAL_S = 1.0
"""How often a WebSocket consumer tops up its credit without being asked."""
READER_FILL_MESSAGES_MAX = 1000
"""Messages a WebSocket reader takes from the broker at once."""
READER_SEND_BYTES_MAX = 1 * MIB
"""Payload bytes a WebSocket reader turns into frames at once (one message always)."""
WS_BACKLOG_BYTES_MAX = 1 * MIB
"""Bytes of text frames a connection holds for a slow peer before its session is held back."""
WS_RECEIVE_QUEUE_FRAMES_MAX = 256
"""Received frames a session left waiting before the socket stops being read."""
WS_RECEIVE_QUEUE_BYTES_MAX = 4 * MIB
"""Bytes of received frames a session left waiting before the socket stops being read."""
WS_PING_INTERVAL_S = 20.0
"""A ping to every open WebSocket this often; one unanswered by the next is closed."""
WS_CLOSE_TIMEOUT_S = 10.0
"""How long a closing WebSocket waits for the peer's close frame before closing."""
CLOSE_REASON_BYTES_MAX = 120
"""A close frame's reason, cut to fit a control frame (125 bytes with the code)."""
WS_ERROR_TEXT_CHARS_MAX = 300
"""An error's text in a WebSocket error frame (longer text is cut)."""
METRIC_ERROR_LABEL_CHARS_MAX = 200
"""An error's text in a metric's ``error`` label (``magnetar_topic_offload_failing``; longer text is cut)."""
WS_DCB_PENDING_FRAMES_MAX = 16
"""Frames one WebSocket DCB socket carries out at once (reading pauses beyond)."""

# Fixed bounds of the binary protocol (``api/pulsar/``).
COMMAND_BYTES_MAX = 1 * MIB
"""A command without its payload (topic names, ids, schemas)."""
FRAME_OVERHEAD_BYTES = 64 * KIB
"""What a frame may hold beyond its message: the command, metadata, batch headers."""
SEND_GROUP_COMMANDS_MAX = 1000
"""Consecutive SENDs of one read handed to the producers as one group."""
FLOW_PERMITS_MAX = 1 << 20
"""Permits one FLOW command grants (more are cut to this)."""
CLOSED_PRODUCERS_REMEMBERED_MAX = 10_000
"""Producers closed by the broker that one connection remembers (the oldest forgotten first)."""
TOPIC_LIST_WATCHES_PER_CONNECTION_MAX = 100
"""Topic-list watches (WATCH_TOPIC_LIST) one connection holds."""
ERROR_MESSAGE_CHARS_MAX = 1000
"""The message text of an ERROR or failed-command answer (longer text is cut)."""

# --- authentication and the clusters admin API ---
BASIC_VERIFIED_ENTRIES_MAX = 1024
"""Verified (user, password digest) pairs the Basic provider remembers, least recently used first out."""
URL_CHARS_MAX = 2048
"""A cluster URL in a clusters admin body (service, broker and web service URLs)."""

# --- the event loop's stall monitor (api/loop_stalls.py) ---
LONGEST_STALL_MIN_S = 0.005
"""A late heartbeat kept with its attribution among the longest stalls from this lateness on."""
INJECTED_STALL_MS_MAX = 1000
"""The longest stall the test-only hook (``MAGNETAR_TEST_HOOKS=1``) injects."""

# --- error answers (api/errors.py) ---
VALIDATION_PROBLEM_ITEMS_MAX = 10
"""Problems of an invalid request named in its 400 answer (the first ones found)."""
