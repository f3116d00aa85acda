"""Connections from the broker to remote bookies: one asyncio loop thread for all of them.

Role: ``RemoteBookie`` (``broker/bookkeeper/remote_bookie.py``) turns the ``Bookie`` calls into request
frames (``storage/bookie_protocol.py``) and hands them here. Any thread may submit; the frames
of one burst reach the loop with one wake-up and each connection writes them in one
``writelines``. Responses complete the callers' futures on the loop thread, in the order the
bookie answers (request ids match them up, so adds pipeline).

Bounds and failure handling (every bound a named setting of ``BookieNetworkConfig``):
- at most ``inflight_adds_max`` entries added and unanswered per bookie (a group add counts
  each of its entries): a caller waits up to
  ``add_wait_ms_max`` for room, then gets the retriable ``BookieBusy``;
- every request has a deadline (``request_timeout_ms``); the first request that misses it closes
  its connection, which fails everything in flight on it with ``BookieUnavailable`` (a bookie
  that stopped answering is treated as gone, so the ledger changes its ensemble at once);
- a lost or refused connection is retried with exponential backoff between
  ``reconnect_backoff_ms_min`` and ``reconnect_backoff_ms_max``; while backing off, requests to
  that bookie fail at once instead of queueing.

Invariant: no request is left without an answer: each one's future completes with the bookie's
response, a timeout, or the connection's failure. Synchronous waits are refused on the loop
thread itself (they could never finish).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

from broker.bookkeeper.bookie import BookieUnavailable
from broker.errors import BrokerError
from broker.limits import LOOP_START_TIMEOUT_S, TIMEOUT_CHECK_INTERVAL_S
from storage import FrameDecoder, LightFuture, ProtocolError, Response, decode_response, new_future


class BookieBusy(BrokerError):
    """Back-pressure: a bookie had ``inflight_adds_max`` adds unanswered for ``add_wait_ms_max``."""

    code = "bookie_busy"
    http_status = 503
    retriable = True


class BookieTimeout(BookieUnavailable):
    code = "bookie_timeout"


@dataclass(frozen=True)
class BookieNetworkConfig:
    request_timeout_ms: int = 5_000
    connect_timeout_ms: int = 2_000
    reconnect_backoff_ms_min: int = 50
    reconnect_backoff_ms_max: int = 2_000
    inflight_adds_max: int = 4_096
    add_wait_ms_max: int = 10_000
    read_ahead_entries: int = 256
    read_ahead_bytes_max: int = 2 * 1024 * 1024
    read_cache_bytes_max: int = 32 * 1024 * 1024

    @classmethod
    def test_min(cls) -> BookieNetworkConfig:
        return cls(request_timeout_ms=2_000, connect_timeout_ms=1_000, reconnect_backoff_ms_max=500,
                   inflight_adds_max=64, read_ahead_entries=8, read_ahead_bytes_max=64 * 1024,
                   read_cache_bytes_max=256 * 1024)


@dataclass(frozen=True)
class BookieConnectionStats:
    address: str
    connected: bool
    inflight: int
    requests: int
    responses: int
    timeouts: int
    connects: int
    failures: int


class _State(Enum):
    DISCONNECTED = "disconnected"
    CONNECTING = "connecting"
    CONNECTED = "connected"


@dataclass
class _Pending:
    future: LightFuture[Any]
    deadline_s: float
    adds: int
    """How many entries this request adds (0: not an add): released from the bound when it ends."""
    value: Callable[[Response], Any] | None
    """Turns an OK response into the future's result (None: the response itself); a non-OK
    response completes the future with the storage error it carries."""


class BookieNetwork:
    """The loop thread and one :class:`BookieConnection` per bookie address."""

    def __init__(self, config: BookieNetworkConfig | None = None) -> None:
        self.config = config or BookieNetworkConfig()
        self._ids = itertools.count(1)
        self._connections: dict[str, BookieConnection] = {}
        self._lock = threading.Lock()
        self._outbox: deque[tuple[BookieConnection, int, list[bytes], _Pending]] = deque()
        self._wake_scheduled = False
        self._closed = False
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="magnetar-bookie-io", daemon=True)
        self._thread.start()
        started.wait(LOOP_START_TIMEOUT_S)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(started.set)
        self._loop.call_soon(self._check_timeouts)
        self._loop.run_forever()

    @property
    def loop_thread(self) -> threading.Thread:
        return self._thread

    def connection(self, address: str) -> BookieConnection:
        with self._lock:
            connection = self._connections.get(address)
            if connection is None:
                connection = self._connections[address] = BookieConnection(self, address)
            return connection

    def connections(self) -> list[BookieConnection]:
        with self._lock:
            return list(self._connections.values())

    def next_request_id(self) -> int:
        return next(self._ids)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        async def shut() -> None:
            for connection in self.connections():
                connection.fail_all(BookieUnavailable("the broker's bookie client is closed"))
            for _ in range(3):  # let the aborted transports close their sockets
                await asyncio.sleep(0)

        with contextlib.suppress(TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(LOOP_START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(LOOP_START_TIMEOUT_S)
        self._loop.close()

    # --- submitting ------------------------------------------------------------------------------
    def submit(self, connection: BookieConnection, request_id: int, parts: list[bytes], *,
               adds: int = 0, value: Callable[[Response], Any] | None = None) -> Future[Any]:
        """Send a request (its encoded frame ``parts``). The future gets ``value(response)`` for
        an OK answer (the response itself without ``value``), the bookie's error otherwise, or
        ``BookieUnavailable`` when no answer comes."""
        future: LightFuture[Any] = new_future()
        pending = _Pending(future, time.monotonic() + self.config.request_timeout_ms / 1000.0, adds, value)
        with self._lock:
            if self._closed:
                raise BookieUnavailable("the broker's bookie client is closed")
            self._outbox.append((connection, request_id, parts, pending))
            if self._wake_scheduled:
                return future
            self._wake_scheduled = True
        self._loop.call_soon_threadsafe(self._flush_outbox)
        return future

    def wait(self, future: Future[Response]) -> Response:
        """Block for a response (not on the loop thread); a missed deadline is ``BookieTimeout``."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a synchronous bookie call on the bookie I/O thread would never finish")
        try:
            return future.result(timeout=self.config.request_timeout_ms / 1000.0 + 1.0)
        except TimeoutError:
            raise BookieTimeout("no answer from the bookie in time") from None

    def _flush_outbox(self) -> None:
        with self._lock:
            self._wake_scheduled = False
            items, self._outbox = self._outbox, deque()
        batches: dict[BookieConnection, list[bytes]] = {}
        for connection, request_id, parts, pending in items:
            if connection.accept(request_id, pending):
                batches.setdefault(connection, []).extend(parts)
            else:
                connection.queue(request_id, parts, pending)
        for connection, parts in batches.items():
            connection.write(parts)

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for connection in self.connections():
            connection.expire(now)
        if not self._closed:
            self._loop.call_later(TIMEOUT_CHECK_INTERVAL_S, self._check_timeouts)

    def call_soon(self, callback: Callable[[], Any]) -> None:
        self._loop.call_soon_threadsafe(callback)


class BookieConnection(asyncio.Protocol):
    """The connection to one bookie (state lives on the loop thread; the add bound is shared)."""

    def __init__(self, network: BookieNetwork, address: str) -> None:
        self.network = network
        self.address = address
        host, _, port = address.rpartition(":")
        self._host, self._port = host, int(port)
        self._state = _State.DISCONNECTED
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder()
        self._pending: dict[int, _Pending] = {}
        self._waiting: list[tuple[int, list[bytes], _Pending]] = []
        self._retry_at_s = 0.0
        self._backoff_s = network.config.reconnect_backoff_ms_min / 1000.0
        self._adds = 0
        self._adds_waiting = 0
        self._adds_cv = threading.Condition(threading.Lock())
        self.counters = dict.fromkeys(("requests", "responses", "timeouts", "connects", "failures"), 0)

    @property
    def backing_off(self) -> bool:
        """True while a failed connection waits before its next attempt."""
        return self._state is _State.DISCONNECTED and time.monotonic() < self._retry_at_s

    def statistics(self) -> BookieConnectionStats:
        c = self.counters
        return BookieConnectionStats(self.address, self._state is _State.CONNECTED, len(self._pending),
                                     c["requests"], c["responses"], c["timeouts"], c["connects"], c["failures"])

    # --- the add bound (any thread) ----------------------------------------------------------------
    def reserve_add(self, entries: int = 1) -> None:
        """Take room for ``entries`` adds, waiting up to ``add_wait_ms_max`` (a group larger
        than the whole bound waits for an idle connection). On the loop thread itself (a ledger
        resending its pending entries after an ensemble change) it never waits: those resends
        replace requests already counted against some bookie's bound."""
        config = self.network.config

        def room() -> bool:
            return self._adds + entries <= config.inflight_adds_max or self._adds == 0

        with self._adds_cv:
            if room() or threading.current_thread() is self.network.loop_thread:
                self._adds += entries
                return
            self._adds_waiting += 1
            try:
                if not self._adds_cv.wait_for(room, config.add_wait_ms_max / 1000.0):
                    raise BookieBusy(f"bookie {self.address} has {self._adds} adds unanswered")
                self._adds += entries
            finally:
                self._adds_waiting -= 1

    def release_add(self, entries: int = 1) -> None:
        with self._adds_cv:
            self._adds -= entries
            if self._adds_waiting:
                self._adds_cv.notify_all()

    # --- the loop thread -------------------------------------------------------------------------
    def accept(self, request_id: int, pending: _Pending) -> bool:
        """Register a request to write now (connected), or say it must wait or fail."""
        if self._state is _State.CONNECTED:
            self._pending[request_id] = pending
            self.counters["requests"] += 1
            return True
        return False

    def queue(self, request_id: int, parts: list[bytes], pending: _Pending) -> None:
        if self._state is _State.DISCONNECTED:
            if time.monotonic() < self._retry_at_s:
                self._finish(pending, error=BookieUnavailable(f"bookie {self.address} is unreachable (retrying)"))
                return
            self._connect()
        self._waiting.append((request_id, parts, pending))

    def _connect(self) -> None:
        self._state = _State.CONNECTING
        self.counters["connects"] += 1
        self.network._loop.create_task(self._open())

    async def _open(self) -> None:
        timeout_s = self.network.config.connect_timeout_ms / 1000.0
        try:
            await asyncio.wait_for(self.network._loop.create_connection(lambda: self, self._host, self._port),
                                   timeout_s)
        except (OSError, TimeoutError) as exc:
            self._broken(BookieUnavailable(f"cannot connect to bookie {self.address}: {exc}"))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self._state = _State.CONNECTED
        self._decoder = FrameDecoder()
        self._backoff_s = self.network.config.reconnect_backoff_ms_min / 1000.0
        waiting, self._waiting = self._waiting, []
        parts: list[bytes] = []
        for request_id, request_parts, pending in waiting:
            self._pending[request_id] = pending
            self.counters["requests"] += 1
            parts.extend(request_parts)
        if parts:
            self.write(parts)

    def write(self, parts: list[bytes]) -> None:
        if self._transport is not None:
            self._transport.writelines(parts)

    def data_received(self, data: bytes) -> None:
        try:
            responses = [decode_response(frame) for frame in self._decoder.feed(data)]
        except ProtocolError as exc:
            self._broken(BookieUnavailable(f"bookie {self.address} sent a malformed frame: {exc}"))
            return
        for response in responses:
            pending = self._pending.pop(response.request_id, None)
            if pending is not None:
                self.counters["responses"] += 1
                self._finish(pending, response=response)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._transport = None
            self._broken(BookieUnavailable(f"connection to bookie {self.address} lost: {exc or 'closed'}"))

    def expire(self, now_s: float) -> None:
        waiting_expired = [w for w in self._waiting if w[2].deadline_s <= now_s]
        if waiting_expired:
            self._waiting = [w for w in self._waiting if w[2].deadline_s > now_s]
            for _, _, pending in waiting_expired:
                self._finish(pending, error=BookieTimeout(f"bookie {self.address}: no connection in time"))
        oldest = next(iter(self._pending.values()), None)
        if oldest is not None and oldest.deadline_s <= now_s:
            self.counters["timeouts"] += 1
            self._broken(BookieTimeout(f"bookie {self.address} did not answer within "
                                       f"{self.network.config.request_timeout_ms} ms"))

    def _broken(self, error: BookieUnavailable) -> None:
        """Close the connection, fail everything in flight or queued, back off before retrying."""
        self.counters["failures"] += 1
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()
        self._state = _State.DISCONNECTED
        self._retry_at_s = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self.network.config.reconnect_backoff_ms_max / 1000.0)
        self.fail_all(error)

    def fail_all(self, error: BookieUnavailable) -> None:
        pending, self._pending = self._pending, {}
        waiting, self._waiting = self._waiting, []
        for item in pending.values():
            self._finish(item, error=error)
        for _, _, item in waiting:
            self._finish(item, error=error)
        if self._transport is not None:
            with contextlib.suppress(RuntimeError):
                self._transport.abort()
            self._transport = None
            self._state = _State.DISCONNECTED

    def _finish(self, pending: _Pending, *, response: Response | None = None,
                error: BaseException | None = None) -> None:
        if pending.adds:
            self.release_add(pending.adds)
        if response is None or pending.value is None:
            pending.future.try_finish(response, error)
            return
        failure = response.error()
        if failure is not None:
            pending.future.try_finish(None, failure)
        else:
            pending.future.try_finish(pending.value(response), None)
