"""The bookie's network face: one ``LedgerStorage`` served over TCP with the bookie protocol.

Role: ``magnetar bookie`` runs this on an asyncio loop. Each connection decodes request frames
(``storage/bookie_protocol.py``) and calls the storage's front door: adds (one entry, or a
writer's group of them as one journal item) and fences go to the journal and are answered when
their group is synced (the journal writer hands the completions to the loop, one wake-up per
burst, and each connection writes a burst of answers in one ``writelines``; while the journal is
idle the loop writes and syncs the adds it received itself, with no hand-over); reads, range reads
and deletes are answered at once.

Invariants:
- An ADD is answered OK only after the storage's Future resolved, i.e. its journal record is
  fsync'd: an acknowledged entry survives ``kill -9`` of the bookie.
- A fenced ledger refuses plain adds (``FENCED``); recovery adds pass.
- Bounded: a connection with ``inflight_requests_max`` requests unanswered stops reading until
  half of them are answered, so a fast client cannot queue unbounded work in the bookie; a range
  answer holds at most ``entries_max`` entries and ``RANGE_BYTES_MAX`` bytes.
- A malformed frame closes its connection; other connections go on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, cast

from storage.bookie_protocol import (
    FrameDecoder,
    Kind,
    ProtocolError,
    Request,
    decode_request,
    encode_error,
    encode_ok,
    encode_range,
)
from storage.errors import MagnetarError, NoSuchEntry
from storage.ledger_storage import LAST_ADD_CONFIRMED, LedgerStorage
from storage.limits import INFLIGHT_REQUESTS_MAX, RANGE_BYTES_MAX, RANGE_ENTRIES_MAX

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BookieServerStats:
    connections: int
    connections_total: int
    requests: int
    adds: int
    reads: int
    range_reads: int
    errors: int
    bytes_in: int
    bytes_out: int


class BookieServer:
    """Serves ``storage`` on ``host:port`` (port 0: any free port, see :attr:`port`)."""

    def __init__(self, storage: LedgerStorage, host: str, port: int, *,
                 inflight_requests_max: int = INFLIGHT_REQUESTS_MAX) -> None:
        self.storage = storage
        self.host = host
        self.port = port
        self.inflight_requests_max = inflight_requests_max
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._connections: set[_BookieConnection] = set()
        self._done: deque[tuple[_BookieConnection, list[bytes]]] = deque()
        self._done_lock = threading.Lock()
        self._drain_scheduled = False
        self.counters: dict[str, int] = dict.fromkeys(
            ("connections_total", "requests", "adds", "reads", "range_reads", "errors", "bytes_in", "bytes_out"), 0)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # An idle journal is written by this loop: no hand-over to the journal thread and back.
        self.storage.write_journal_on_caller_thread(self._loop.call_soon)
        self._server = await self._loop.create_server(lambda: _BookieConnection(self), self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self.storage.write_journal_on_caller_thread(None)
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):
                connection.abort()
            for _ in range(3):  # let the aborted transports close their sockets
                await asyncio.sleep(0)
            await self._server.wait_closed()
            self._server = None

    def statistics(self) -> BookieServerStats:
        c = self.counters
        return BookieServerStats(len(self._connections), c["connections_total"], c["requests"], c["adds"], c["reads"],
                                 c["range_reads"], c["errors"], c["bytes_in"], c["bytes_out"])

    # Completions arrive on the journal thread (or on the loop, which wrote an idle journal
    # itself); the loop writes them.
    def completed(self, connection: _BookieConnection, parts: list[bytes]) -> None:
        with self._done_lock:
            self._done.append((connection, parts))
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        assert self._loop is not None
        try:
            if threading.get_ident() == self._loop_thread:
                self._loop.call_soon(self._drain)
            else:
                self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the bookie is shutting down
            return

    def _drain(self) -> None:
        with self._done_lock:
            self._drain_scheduled = False
            done, self._done = self._done, deque()
        by_connection: dict[_BookieConnection, list[bytes]] = {}
        for connection, parts in done:
            by_connection.setdefault(connection, []).extend(parts)
            connection.answered(1)
        for connection, parts in by_connection.items():
            connection.write(parts)


class _BookieConnection(asyncio.Protocol):
    def __init__(self, server: BookieServer) -> None:
        self._server = server
        self._decoder = FrameDecoder()
        self._transport: asyncio.Transport | None = None
        self._inflight = 0
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self._server._connections.add(self)
        self._server.counters["connections_total"] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        self._transport = None

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        counters = self._server.counters
        counters["bytes_in"] += len(data)
        try:
            frames = self._decoder.feed(data)
            requests = [decode_request(frame) for frame in frames]
        except ProtocolError as exc:
            log.warning("closing a bookie connection: %s", exc)
            self.abort()
            return
        out: list[bytes] = []
        for request in requests:
            counters["requests"] += 1
            out.extend(self._handle(request))
        if out:
            self.write(out)
        if self._inflight >= self._server.inflight_requests_max and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def write(self, parts: list[bytes]) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._server.counters["bytes_out"] += sum(len(p) for p in parts)
        self._transport.writelines(parts)

    def answered(self, count: int) -> None:
        self._inflight -= count
        if self._paused and self._inflight <= self._server.inflight_requests_max // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    # --- requests ---------------------------------------------------------------------------
    def _handle(self, request: Request) -> list[bytes]:
        """Answer now (the parts to write) or later, through the server's completions."""
        storage = self._server.storage
        try:
            if request.kind is Kind.ADD:
                self._server.counters["adds"] += len(request.datas)
                future: Future[Any] = storage.add_entries(request.ledger_id, request.entry_ids, request.datas,
                                                          recovery=request.recovery)
                self._answer_later(request, future, lambda entry_id: encode_ok(Kind.ADD, request.request_id,
                                                                               entry_id=entry_id))
                return []
            if request.kind is Kind.FENCE:
                self._answer_later(request, storage.fence(request.ledger_id),
                                   lambda _: encode_ok(Kind.FENCE, request.request_id))
                return []
            if request.kind is Kind.READ:
                self._server.counters["reads"] += 1
                entry_id = request.entry_id
                if entry_id == LAST_ADD_CONFIRMED:
                    entry_id = storage.get_last_add_confirmed(request.ledger_id)
                    if entry_id < 0:
                        raise NoSuchEntry(f"ledger {request.ledger_id} has no entry")
                return encode_ok(Kind.READ, request.request_id, entry_id=entry_id,
                                 data=storage.get_entry(request.ledger_id, entry_id))
            if request.kind is Kind.READ_RANGE:
                self._server.counters["range_reads"] += 1
                return encode_range(request.request_id, self._read_range(request))
            storage.delete_ledger(request.ledger_id)
            return encode_ok(Kind.DELETE, request.request_id)
        except MagnetarError as exc:
            self._server.counters["errors"] += 1
            return [encode_error(request.kind, request.request_id, exc)]

    def _answer_later(self, request: Request, future: Future[Any], ok: Callable[[Any], list[bytes]]) -> None:
        self._inflight += 1

        def done(finished: Future[Any]) -> None:
            error = finished.exception()
            if error is None:
                parts = ok(finished.result())
            else:
                self._server.counters["errors"] += 1
                parts = [encode_error(request.kind, request.request_id, error)]
            self._server.completed(self, parts)

        future.add_done_callback(done)

    def _read_range(self, request: Request) -> list[tuple[int, bytes]]:
        """The entries of ``first..last`` this bookie holds, bounded by count and bytes (the
        first one found is always included)."""
        storage = self._server.storage
        last = min(request.last_entry_id, storage.get_last_add_confirmed(request.ledger_id))
        entries_max = max(1, min(request.entries_max, RANGE_ENTRIES_MAX))
        bytes_max = max(1, min(request.bytes_max, RANGE_BYTES_MAX))
        found: list[tuple[int, bytes]] = []
        size = 0
        for entry_id in range(request.entry_id, last + 1):
            try:
                data = storage.get_entry(request.ledger_id, entry_id)
            except NoSuchEntry:
                continue
            if found and size + len(data) > bytes_max:
                break
            found.append((entry_id, data))
            size += len(data)
            if len(found) >= entries_max:
                break
        return found
