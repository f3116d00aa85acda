"""Connections of the web service's listeners: how many, how slow, and what happens when there are too many.

Role: the TCP edge. uvicorn accepts every connection and waits for a request for as long as the
client likes; a client that opens many connections and sends nothing (or a byte at a time)
would hold file descriptors until the process has none left, and then every file the storage
opens fails. ``guarded_http_protocol`` wraps uvicorn's HTTP protocol class with a
``ConnectionGuard``:

- at most ``connections_max`` open connections per web service, its plain and TLS listeners
  together (HTTP, and the WebSocket sessions they upgrade to); one more is answered
  ``503 too_many_connections`` and closed at once;
- a request's headers must be complete within ``header_timeout_ms`` of the connection opening
  or of the previous response; otherwise the connection is closed;
- a request's line and headers may take ``header_bytes_max`` bytes: the parser is fed no more
  of a head than that, and a head that has not ended by then is answered
  ``431 headers_too_large`` and its connection closed (uvicorn's httptools parser keeps an
  unfinished head whole, however long, and grows it by copying: unbounded memory and
  quadratic time for a client that has not even been authenticated yet); bodies are fed as
  they come (``api/request_guard.py`` bounds them);
- idle keep-alive connections close after ``idle_timeout_ms`` (uvicorn's keep-alive timer);
- a response's writes are coalesced (``CoalescedWrites``, httptools): each is held until the
  next or the end of the event loop's turn, so a small answer's head and body leave in one
  system call and one segment, not two;
- on a TLS listener, the client certificate the handshake verified reaches every request of the
  connection in its ASGI scope (``api/tls.py``), for ``AuthenticationProviderTls``;
- a connection whose first request is a WebSocket upgrade on ``/ws/`` (``GET``, ``Upgrade:
  websocket``, ``Connection: upgrade``) is handed, with the head and whatever followed it, to the
  WebSocket edge (``api/ws/server.py``), which owns the transport from then on; uvicorn's parser
  never sees it. The head is held here until it ends, within ``header_bytes_max`` and
  ``header_timeout_ms`` as any head. An upgrade on a connection that already served a request
  goes to uvicorn, which serves no WebSocket: it is answered 426 by the route.

``effective_connections_max`` keeps the bound under the process's file-descriptor limit, with
room for the storage's files. ``quiet_accept_errors`` makes a failed ``accept()`` (out of file
descriptors) a single warning per episode instead of a traceback per attempt.

Invariants: an admitted connection is released exactly once, when its transport is lost,
whichever protocol (HTTP or WebSocket) owns it then; refused connections never reach the
application.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api.limits import ACCEPT_ERROR_QUIET_S, COALESCED_WRITE_BYTES_MAX, FD_RESERVE_MIN
from api.tls import tls_peer_of, with_tls_peer

log = logging.getLogger(__name__)


def _refusal(status_line: str, code: str, message: str) -> bytes:
    """A complete HTTP answer with the JSON error body ``{code, message}``, closing the connection."""
    body = json.dumps({"code": code, "message": message}, separators=(",", ":")).encode()
    return (f"HTTP/1.1 {status_line}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


_REFUSAL = _refusal("503 Service Unavailable", "too_many_connections", "the broker holds its connection limit")


@dataclass(frozen=True)
class ConnectionGuardStats:
    open_connections: int
    connections_max: int
    admitted: int
    refused: int
    header_timeouts: int
    heads_too_large: int


class ConnectionGuard:
    """Counts the web service's open connections (every listener); thread-safe (several servers may share a process)."""

    def __init__(self, connections_max: int, header_timeout_s: float, header_bytes_max: int) -> None:
        self.connections_max = connections_max
        self.header_timeout_s = header_timeout_s
        self.header_bytes_max = header_bytes_max
        self.head_refusal = _refusal("431 Request Header Fields Too Large", "headers_too_large",
                                     f"the request line and headers exceed {header_bytes_max} bytes")
        self._open: set[object] = set()
        self._lock = threading.Lock()
        self._admitted = self._refused = self._header_timeouts = self._heads_too_large = 0

    def admit(self, transport: object) -> bool:
        with self._lock:
            if len(self._open) >= self.connections_max:
                self._refused += 1
                return False
            self._open.add(transport)
            self._admitted += 1
            return True

    def release(self, transport: object) -> None:
        with self._lock:
            self._open.discard(transport)

    def timed_out(self) -> None:
        with self._lock:
            self._header_timeouts += 1

    def head_too_large(self) -> None:
        with self._lock:
            self._heads_too_large += 1

    def statistics(self) -> ConnectionGuardStats:
        with self._lock:
            return ConnectionGuardStats(len(self._open), self.connections_max, self._admitted, self._refused,
                                        self._header_timeouts, self._heads_too_large)


def effective_connections_max(configured: int) -> int:
    """``configured``, but below the file-descriptor limit with a reserve for everything else."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    reserve = max(FD_RESERVE_MIN, soft // 4)
    return max(1, min(configured, soft - reserve))


def raise_file_limit() -> int:
    """Raise the soft file-descriptor limit to the hard one (as Pulsar's scripts advise); the
    soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


WebSocketEdge = Callable[[asyncio.BaseTransport, Callable[[], None]], asyncio.Protocol]
"""Takes over a connection whose upgrade request was recognised: its protocol from now on,
given the transport and what releases the connection's place in the guard once it is lost."""
WEBSOCKET_REQUEST_START = b"GET /ws/"


def is_websocket_upgrade(head: bytes) -> bool:
    """Whether a request head (line and headers, without the blank line) asks for a WebSocket:
    ``Upgrade: websocket`` and ``upgrade`` among the ``Connection`` options."""
    upgrade = connection = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"upgrade":
            upgrade = value.strip().lower() == b"websocket"
        elif name == b"connection":
            connection = b"upgrade" in (option.strip() for option in value.lower().split(b","))
    return upgrade and connection


class CoalescedWrites:
    """The transport one response is written to, as its writer sees it: a write (up to
    ``COALESCED_WRITE_BYTES_MAX``) is held until the next one or the end of the event loop's
    turn, whichever comes first, and goes out with it. uvicorn writes a response's head and its
    body in two calls; sent as they come, they are two system calls and two segments, so the
    client wakes twice for one answer. Order is kept; ``close`` sends what is held first."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held, self._held = self._held, None
        if held is not None and len(data) <= COALESCED_WRITE_BYTES_MAX:
            self._transport.write(held + data)
            return
        if held is not None:  # a large body is not copied to join a head: two writes
            self._transport.write(held)
        if len(data) > COALESCED_WRITE_BYTES_MAX:
            self._transport.write(data)
            return
        self._held = bytes(data)
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


def guarded_http_protocol(base: type[Any], guard: ConnectionGuard,
                          websocket_edge: WebSocketEdge | None = None) -> Callable[..., asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol ``base`` (h11 or httptools) under ``guard``. The
    head bound is applied here for httptools, whose parser has none; h11 applies its own
    (``server_options`` sets it to the same bound). With ``websocket_edge``, a first request that
    is a WebSocket upgrade on ``/ws/`` is handed to it."""
    bounds_heads = hasattr(base, "on_headers_complete")

    class GuardedHttpProtocol(base):  # type: ignore[misc]
        _admitted = False
        _websocket_head: bytearray | None = None
        """The start of the first request while it may be a WebSocket upgrade (None: it is not)."""
        _header_timer: asyncio.TimerHandle | None = None
        _cycle_at_arm: object = None
        _head_bytes = 0
        """Bytes fed to the parser since the last head ended, outside request bodies."""
        _heads_ended = 0
        _in_body = False
        """Between a head's end and its message's end, as the parser sees it."""

        def connection_made(self, transport: asyncio.Transport) -> None:
            if not guard.admit(transport):
                transport.write(_REFUSAL)
                transport.close()
                return
            self._admitted = True
            if websocket_edge is not None:
                self._websocket_head = bytearray()
            super().connection_made(transport)
            peer = tls_peer_of(transport)
            if peer is not None:
                self.app: Any = with_tls_peer(self.app, peer)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if not self._admitted:
                return
            if self._websocket_head is not None:
                data = self._upgrade_or_not(data)
                if not data:
                    return
            if self._in_body or not bounds_heads:
                super().data_received(data)
            else:
                self._receive_head(data)
            if self._header_timer is not None and self.cycle is not self._cycle_at_arm:
                self._disarm_header_timer()  # headers complete

        def _receive_head(self, data: bytes) -> None:
            """Feed ``data`` while a head is awaited: never more of a head than the bound; what
            follows the head's end (a body, the next request) is fed as the parser's state says."""
            while data:
                if self._in_body:
                    super().data_received(data)
                    return
                heads_ended = self._heads_ended
                room = guard.header_bytes_max - self._head_bytes
                head, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
                self._head_bytes += len(head)
                if head:
                    super().data_received(head)
                if self.transport.is_closing():
                    return  # refused by the parser
                if data and self._heads_ended == heads_ended:
                    self._refuse_head()
                    return

        def _upgrade_or_not(self, data: bytes) -> bytes:
            """Hold the first request's head while it may be a WebSocket upgrade on ``/ws/``;
            hand it over once it is one. What uvicorn's parser is to read (b"": nothing yet)."""
            head = self._websocket_head
            assert head is not None
            if not head and data[:len(WEBSOCKET_REQUEST_START)] != WEBSOCKET_REQUEST_START[:len(data)]:
                self._websocket_head = None  # the usual first read: not held, not copied
                return data
            searched = max(0, len(head) - 3)  # a head held a byte at a time costs linear time
            head += data
            known = min(len(head), len(WEBSOCKET_REQUEST_START))
            if head[:known] != WEBSOCKET_REQUEST_START[:known]:
                self._websocket_head = None
                return bytes(head)
            end = head.find(b"\r\n\r\n", searched)
            if end < 0:
                if len(head) > guard.header_bytes_max:
                    self._websocket_head = None
                    self._refuse_head()
                return b""
            self._websocket_head = None
            if not is_websocket_upgrade(bytes(head[:end])):
                return bytes(head)
            self._hand_over(bytes(head))
            return b""

        def _hand_over(self, data: bytes) -> None:
            """The WebSocket edge owns the transport from now on. uvicorn's server waits, when it
            shuts down, for every protocol in its set of connections to be lost; this one never
            hears of the transport again, so it leaves the set here, as uvicorn's own upgrade does."""
            assert websocket_edge is not None
            self._disarm_header_timer()
            self.connections.discard(self)
            transport = self.transport
            protocol = websocket_edge(transport, lambda: guard.release(transport))
            transport.set_protocol(protocol)
            protocol.data_received(data)

        def on_headers_complete(self) -> None:  # httptools' callback
            self._heads_ended += 1
            self._head_bytes = 0
            self._in_body = True
            super().on_headers_complete()
            cycle = getattr(self, "cycle", None)
            if cycle is not None and cycle.transport is self.transport:  # the request's answer
                cycle.transport = CoalescedWrites(self.transport)

        def on_message_complete(self) -> None:  # httptools' callback, also when uvicorn ignores the rest
            self._in_body = False
            super().on_message_complete()

        def _refuse_head(self) -> None:
            """431 for a head over the bound (unless an answer is under way: then only the close)."""
            guard.head_too_large()
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(guard.head_refusal)
            self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()  # the next request's headers get the same time

        def connection_lost(self, exc: Exception | None) -> None:
            if not self._admitted:
                return
            self._disarm_header_timer()
            guard.release(self.transport)
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._cycle_at_arm = self.cycle
            self._header_timer = self.loop.call_later(guard.header_timeout_s, self._headers_too_slow)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.transport.get_protocol() is self and self.cycle is self._cycle_at_arm \
                    and not self.transport.is_closing():
                guard.timed_out()
                self.transport.close()

    return GuardedHttpProtocol


class _AcceptErrorFilter:
    """Loop exception handler: a failed ``accept()`` is one warning per quiet period, no
    traceback; everything else goes to the previous (or default) handler."""

    def __init__(self, previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None) -> None:
        self._previous = previous
        self._last_logged_s = -ACCEPT_ERROR_QUIET_S
        self.suppressed = 0
        self.retries_after_close = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if _accept_retry_after_close(context):
            # asyncio retries a failed accept() a second later; if the listener closed meanwhile
            # (a shutdown during a descriptor shortage) the retry finds no socket: nothing to do
            self.retries_after_close += 1
            log.debug("accept retry after the listener closed: ignored")
            return
        if "accept" not in str(context.get("message", "")):
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self._last_logged_s < ACCEPT_ERROR_QUIET_S:
            self.suppressed += 1
            return
        self._last_logged_s = now
        log.warning("accepting connections failed (%s); new connections wait until descriptors free up "
                    "(%d such failures not logged since the last warning)", context.get("exception"),
                    self.suppressed)
        self.suppressed = 0


def _accept_retry_after_close(context: dict[str, Any]) -> bool:
    handle = context.get("handle")
    callback = getattr(handle, "_callback", None)
    return getattr(callback, "__name__", "") == "_start_serving" and isinstance(context.get("exception"), ValueError)


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> _AcceptErrorFilter:
    handler = _AcceptErrorFilter(loop.get_exception_handler())
    loop.set_exception_handler(handler)
    return handler
