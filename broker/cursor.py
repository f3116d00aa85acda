"""ManagedCursor: a subscription's durable position in a managed ledger.

State, in offsets (every message has one; an entry holds a contiguous range of them):
``mark_delete_offset`` (every offset below it is acknowledged) and ``acked``, the individually
acknowledged offsets above it, as ranges. Acking one message of a batch is acking its offset,
so batch-index acks need nothing extra; an entry is consumed when all its offsets are. Pulsar's
view (mark-delete *position*, individually deleted *entry* ranges, batch ack sets) is derived.

Persistence: every state change is appended, whole, to the cursor's own ledger; appends are
group-committed (one in flight, later changes coalesce into the next), and an ack's Future
resolves once a persisted state includes it. The metadata store holds a snapshot pointing at
the cursor ledger; when that ledger grows past ``cursor_ledger_entries_max`` a new one is
started, the snapshot is swapped by compare-and-set, and the old ledger deleted. At most
``acked_ranges_persisted_max`` ranges are persisted (the oldest holes win).

Ownership: the broker that restores a cursor (loading its topic) fences the cursor ledger and
writes the snapshot back at once, so a broker that served the topic before can no longer swap
it (its compare-and-set expects the older version). A cursor whose persist failed as fenced, or
lost that compare-and-set, or whose managed ledger was taken over, persists nothing more: its
later acks fail as fenced, and the broker now serving the topic delivers them again.

Invariants: ``mark_delete_offset`` never moves backwards except by an explicit seek/reset;
after a crash the cursor is restored from its last persisted state, so an acknowledged message
(whose ack Future resolved) is never redelivered and an unacknowledged one is never skipped.
Non-durable cursors (readers) keep the same state in memory only.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from broker.bookkeeper.ledger_handle import LedgerHandle
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.entry import Entry
from broker.errors import (
    BadVersion,
    InvalidRequest,
    LedgerFenced,
    MagnetarError,
    NoSuchEntry,
    NotFound,
    ServiceUnitNotReady,
)
from broker.limits import (
    ACKED_RANGES_PERSISTED_MAX,
    CURSOR_LEDGER_ENTRIES_MAX,
    CURSOR_PERSIST_INTERVAL_S_MIN,
    CURSOR_READ_BYTES_MAX,
    CURSOR_RESTORE_ATTEMPTS_MAX,
    READ_BATCH_ENTRIES,
)
from broker.managed_ledger import ManagedLedger
from broker.message_id import Position
from broker.metadata.store import MetadataStore
from broker.range_set import RangeSet

_DATA = attrgetter("data")

_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


class _DelayedSubmits:
    """Hands jobs to the persistence thread at a given time: one daemon timer thread over a heap
    (each cursor has at most one job waiting, so the heap is bounded by the cursors)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cv = threading.Condition()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def submit_at(self, due_s: float, job: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (due_s, next(self._ids), job))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="magnetar-cursor-timer", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cv.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, job = heapq.heappop(self._heap)
            with contextlib.suppress(RuntimeError):  # the interpreter is shutting down
                _persist_executor().submit(job)


_DELAYED = _DelayedSubmits()


def _persist_executor() -> ThreadPoolExecutor:
    """One thread persists every cursor's state (each cursor has at most one job queued)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="magnetar-cursor")
        return _EXECUTOR


@dataclass(frozen=True)
class CursorStats:
    name: str
    durable: bool
    mark_delete_offset: int
    read_offset: int
    acked_ranges: int
    backlog_messages: int
    messages_consumed: int
    persisted_states: int
    cursor_ledger_id: int


class ManagedCursor:
    def __init__(self, ml: ManagedLedger, name: str, *, durable: bool, mark_delete_offset: int,
                 acked: RangeSet | None = None, properties: dict[str, int] | None = None,
                 ledgers: LedgerManager | None = None, store: MetadataStore | None = None) -> None:
        self.ml = ml
        self.name = name
        self.durable = durable
        self.mark_delete_offset = mark_delete_offset
        self.acked = acked or RangeSet()
        self.properties = dict(properties or {})
        self.read_offset = mark_delete_offset
        self._read_position: tuple[int, Position] | None = None
        """(read offset, position of the entry starting there): saves a lookup per batch."""
        self._lock = threading.RLock()
        self._ledgers = ledgers
        self._store = store
        self._path = f"{ml._path}/cursors/{name}"
        self._ledger: LedgerHandle | None = None
        self._retired_ledger_id = -1
        """A cursor ledger recovered on restore: deleted once a new one is in the snapshot."""
        self._snapshot_version = -1
        self._taken_over = False
        """Another broker restored this cursor (see the module docstring): nothing more is persisted."""
        self._change_seq = 0
        self._persisted_seq = 0
        self._persisted_md = mark_delete_offset
        self._persist_in_flight = False
        self._persist_started_s = 0.0
        self._waiters: list[tuple[int, Future[None]]] = []
        self._consumed = 0
        self._persisted_states = 0
        self._normalize()

    # --- acknowledgement ---------------------------------------------------------------
    def ack(self, offsets: Iterable[int]) -> Future[None]:
        """Acknowledge individual messages by offset; resolves once persisted."""
        with self._lock:
            floor = self.mark_delete_offset
            acked = self.acked
            start = end = -1  # a run of consecutive offsets, added as one range
            for offset in offsets:
                if offset < floor:
                    continue
                self._consumed += 1
                if offset == end:
                    end += 1
                    continue
                if end > start:
                    acked.add(start, end)
                start, end = offset, offset + 1
            if end > start:
                acked.add(start, end)
            self._normalize()
            return self._changed()

    def ack_range(self, start_offset: int, end_offset: int) -> Future[None]:
        """Acknowledge ``[start, end)``."""
        with self._lock:
            self.acked.add(max(start_offset, self.mark_delete_offset), end_offset)
            self._normalize()
            return self._changed()

    def ack_cumulative(self, offset: int) -> Future[None]:
        """Acknowledge every message up to and including ``offset``."""
        with self._lock:
            if offset + 1 > self.mark_delete_offset:
                self._consumed += offset + 1 - self.mark_delete_offset - self.acked.count_in(
                    self.mark_delete_offset, offset + 1)
                self.mark_delete_offset = offset + 1
            self._normalize()
            return self._changed()

    def set_properties(self, properties: dict[str, int]) -> Future[None]:
        """Replace the cursor's properties (persisted with its state)."""
        with self._lock:
            self.properties = dict(properties)
            return self._changed()

    def is_acked(self, offset: int) -> bool:
        return offset < self.mark_delete_offset or offset in self.acked

    def _normalize(self) -> None:
        """Fold ranges touching the mark-delete offset into it."""
        self.acked.discard_below(self.mark_delete_offset)
        first = self.acked.first_range()
        if first is not None and first[0] <= self.mark_delete_offset:
            self.mark_delete_offset = self.acked.pop_first()[1]
        self.read_offset = max(self.read_offset, self.mark_delete_offset)

    # --- reading -------------------------------------------------------------------------
    def read_entries(self, max_entries: int = READ_BATCH_ENTRIES,
                     max_bytes: int = CURSOR_READ_BYTES_MAX) -> list[Entry]:
        """Entries from the read position on, skipping wholly acknowledged ones; advances it.
        At most ``max_entries`` entries and, past the first, ``max_bytes`` of them (counting
        those skipped: they were read too)."""
        with self._lock:
            start = self.read_offset
            cached = self._read_position
        if start >= self.ml.confirmed_next_offset():
            return []
        if cached is not None and cached[0] == start:
            position = cached[1]
        else:
            position, _ = self.ml.offset_to_position(start)
        result: list[Entry] = []
        size = 0
        while len(result) < max_entries and size < max_bytes:
            entries = self.ml.read_entries(position, max_entries - len(result), max_bytes=max_bytes - size)
            if not entries:
                break
            size += sum(map(len, map(_DATA, entries)))
            with self._lock:
                for entry in entries:
                    if not self.acked.covers(max(entry.first_offset, self.mark_delete_offset),
                                             entry.last_offset + 1) and entry.last_offset >= self.mark_delete_offset:
                        result.append(entry)
                self.read_offset = max(self.read_offset, entries[-1].last_offset + 1)
            position = self.ml.next_position(entries[-1].position)
            with self._lock:
                if self.read_offset == entries[-1].last_offset + 1:
                    self._read_position = (self.read_offset, position)
        return result

    def has_more(self) -> bool:
        return self.read_offset < self.ml.confirmed_next_offset()

    def seek(self, offset: int) -> None:
        """Move the read position (not the acknowledgements) to ``offset``."""
        with self._lock:
            self.read_offset = max(offset, self.mark_delete_offset)

    def rewind(self) -> None:
        """Read again from the oldest unacknowledged message (redelivery after reconnect)."""
        with self._lock:
            self.read_offset = self.mark_delete_offset

    def reset_to_offset(self, offset: int) -> Future[None]:
        """Reset the subscription: everything before ``offset`` acked, everything after not."""
        offset = max(min(offset, self.ml.confirmed_next_offset()), self.ml.first_offset)
        with self._lock:
            self.mark_delete_offset = offset
            self.acked.clear()
            self.read_offset = offset
            return self._changed()

    def reset_to_time(self, publish_time_ms: int) -> Future[None]:
        return self.reset_to_offset(self.ml.time_to_offset(publish_time_ms))

    def reset_to_position(self, position: Position, *, inclusive: bool = True) -> Future[None]:
        entry = self.ml.read_entry(position)
        return self.reset_to_offset(entry.first_offset if inclusive else entry.last_offset + 1)

    def skip(self, messages: int) -> Future[None]:
        """Acknowledge the next ``messages`` unacknowledged messages."""
        with self._lock:
            offset, end = self.mark_delete_offset, self.ml.confirmed_next_offset()
            while messages > 0 and offset < end:
                if offset not in self.acked:
                    self.acked.add(offset, offset + 1)
                    messages -= 1
                offset += 1
            self._normalize()
            return self._changed()

    def skip_all(self) -> Future[None]:
        """Clear the backlog."""
        return self.ack_cumulative(self.ml.confirmed_next_offset() - 1)

    def expire_before(self, offset: int) -> Future[None] | None:
        if offset <= self.mark_delete_offset:
            return None
        return self.ack_cumulative(offset - 1)

    # --- derived views -------------------------------------------------------------------
    def backlog_messages(self) -> int:
        end = self.ml.confirmed_next_offset()
        with self._lock:
            start = max(self.mark_delete_offset, self.ml.first_offset)
            return max(0, end - start - self.acked.count_in(start, end))

    def backlog_bytes(self) -> int:
        """Bytes of the ledgers (partly) unconsumed, scaled by the unconsumed message share."""
        total_messages = self.ml.confirmed_next_offset() - self.ml.first_offset
        if total_messages <= 0:
            return 0
        size = sum(i.size_bytes for i in self.ml.ledger_infos())
        return size * self.backlog_messages() // total_messages

    def mark_delete_position(self) -> Position:
        """Pulsar's mark-delete position: the last wholly consumed entry."""
        md = self.mark_delete_offset
        if md <= self.ml.first_offset:
            first = self.ml.first_position()
            return Position(first.ledger_id, first.entry_id - 1)
        try:
            position, _ = self.ml.offset_to_position(md - 1)
        except NoSuchEntry:
            return self.ml.last_confirmed
        entry = self.ml.read_entry(position)
        if entry.last_offset == md - 1:
            return position
        return Position(position.ledger_id, position.entry_id - 1)

    def acked_ranges(self) -> list[tuple[int, int]]:
        return list(self.acked.ranges())

    def nth_unacked_offset(self, n: int) -> int | None:
        """The offset of the ``n``-th (1-based) unacknowledged message, None past the end
        (Pulsar's peek position: acknowledged messages are not counted)."""
        if n < 1:
            raise InvalidRequest(f"message position must be >= 1, not {n}")
        end = self.ml.confirmed_next_offset()
        with self._lock:
            offset = max(self.mark_delete_offset, self.ml.first_offset)
            remaining = n
            for start, stop in self.acked.ranges():
                if stop <= offset:
                    continue
                gap = max(0, start - offset)
                if remaining <= gap:
                    break
                remaining -= gap
                offset = max(offset, stop)
        candidate = offset + remaining - 1
        return candidate if candidate < end else None

    # --- persistence ---------------------------------------------------------------------
    def _state_json(self) -> bytes:
        ranges = list(self.acked.ranges())[:ACKED_RANGES_PERSISTED_MAX]
        return json.dumps({"md": self.mark_delete_offset, "ranges": ranges, "props": self.properties},
                          separators=(",", ":")).encode()

    def _changed(self) -> Future[None]:
        future: Future[None] = Future()
        if not self.durable:
            future.set_result(None)
            return future
        self._change_seq += 1
        self._waiters.append((self._change_seq, future))
        if not self._persist_in_flight:
            self._persist_in_flight = True
            _persist_executor().submit(self._persist)
        return future

    def _persist(self) -> None:
        """Runs on the persistence thread: never inside a bookie callback, so it may block."""
        assert self._ledgers is not None
        self._persist_started_s = time.monotonic()
        with self._lock:
            seq, state, md = self._change_seq, self._state_json(), self.mark_delete_offset
        if self._taken_over or self.ml.taken_over:
            self._taken_over = True
            self._persisted(seq, md, LedgerFenced(f"cursor {self.name} of {self.ml.display_name}: another broker "
                                                  "serves the topic"))
            return
        try:
            if self._ledger is None or self._ledger.last_add_confirmed + 1 >= CURSOR_LEDGER_ENTRIES_MAX:
                self._switch_ledger(state)
                self._persisted(seq, md, None)
                return
            future = self._ledger.append([state])
        except MagnetarError as exc:
            self._persisted(seq, md, exc)
            return
        future.add_done_callback(lambda f: self._persisted(seq, md, f.exception()))

    def _switch_ledger(self, state: bytes) -> None:
        """Start a new cursor ledger holding ``state`` and point the snapshot at it."""
        assert self._ledgers is not None and self._store is not None
        new_ledger = self._ledgers.create(self.ml.config.quorum, {"cursor": self.name})
        new_ledger.append([state]).result(timeout=60)
        snapshot = json.dumps({"cursorLedger": new_ledger.ledger_id, "state": json.loads(state)}).encode()
        self._snapshot_version = self._store.put(self._path, snapshot, self._snapshot_version).version
        old, self._ledger = self._ledger, new_ledger
        if old is not None:
            with contextlib.suppress(MagnetarError):  # an unreferenced cursor ledger is harmless
                old.close()
                self._ledgers.delete(old.ledger_id)
        if self._retired_ledger_id >= 0:
            with contextlib.suppress(MagnetarError):
                self._ledgers.delete(self._retired_ledger_id)
            self._retired_ledger_id = -1

    def _persisted(self, seq: int, md: int, error: BaseException | None) -> None:
        with self._lock:
            done = [w for w in self._waiters if w[0] <= seq]
            self._waiters = [w for w in self._waiters if w[0] > seq]
            if error is None:
                self._persisted_seq, self._persisted_md = seq, md
                self._persisted_states += 1
            else:
                self._ledger = None  # the next persist starts a fresh cursor ledger
                if isinstance(error, (LedgerFenced, BadVersion)):
                    self._taken_over = True
            self._persist_in_flight = bool(self._waiters)
            if self._persist_in_flight:  # acks that came meanwhile: one write for all of them
                due_s = self._persist_started_s + CURSOR_PERSIST_INTERVAL_S_MIN
                if due_s <= time.monotonic():
                    _persist_executor().submit(self._persist)
                else:
                    _DELAYED.submit_at(due_s, self._persist)
        for _, future in done:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    @property
    def persisted_mark_delete_offset(self) -> int:
        return self._persisted_md if self.durable else self.mark_delete_offset

    def flush(self) -> None:
        """Persist now (if anything changed) and wait."""
        with self._lock:
            future = self._changed()
        future.result(timeout=60)

    def close(self) -> None:
        """Wait until every change made so far is persisted (or failed), then close the ledger."""
        if not self.durable:
            return
        with self._lock:
            pending = [future for _, future in self._waiters]
        for future in pending:
            with contextlib.suppress(MagnetarError):
                future.result(timeout=60)
        with self._lock:
            if self._ledger is not None:
                with contextlib.suppress(MagnetarError):
                    self._ledger.close()

    def statistics(self) -> CursorStats:
        return CursorStats(self.name, self.durable, self.mark_delete_offset, self.read_offset, len(self.acked),
                           self.backlog_messages(), self._consumed, self._persisted_states,
                           self._ledger.ledger_id if self._ledger else -1)


class CursorManager:
    """The cursors of one managed ledger: opens, restores, deletes them; feeds trimming."""

    def __init__(self, ml: ManagedLedger, ledgers: LedgerManager, store: MetadataStore) -> None:
        self.ml = ml
        self._ledgers = ledgers
        self._store = store
        self._cursors: dict[str, ManagedCursor] = {}
        self._lock = threading.Lock()
        ml.cursor_positions = self.durable_mark_delete_offsets
        for name in store.children(f"{ml._path}/cursors"):
            self._restore(name)

    def durable_mark_delete_offsets(self) -> list[int]:
        """What trimming must keep for each durable cursor: the lower of its persisted
        mark-delete (a crash restores that) and its current one (a reset may have moved it back)."""
        return [min(c.persisted_mark_delete_offset, c.mark_delete_offset)
                for c in list(self._cursors.values()) if c.durable]

    def _restore(self, name: str) -> ManagedCursor:
        for _ in range(CURSOR_RESTORE_ATTEMPTS_MAX):
            try:
                return self._restore_once(name)
            except BadVersion:  # another broker wrote the snapshot meanwhile: read it again
                continue
        raise ServiceUnitNotReady(f"subscription {name} of {self.ml.display_name} kept changing while it was "
                                  "restored; retry")

    def _restore_once(self, name: str) -> ManagedCursor:
        path = f"{self.ml._path}/cursors/{name}"
        stat = self._store.get(path)
        if stat is None:
            raise NotFound(f"subscription {name} of {self.ml.display_name} does not exist")
        snapshot: dict[str, Any] = json.loads(stat.value)
        state: dict[str, Any] = snapshot["state"]
        handle = None
        if snapshot.get("cursorLedger", -1) >= 0:
            try:
                handle = self._ledgers.open(int(snapshot["cursorLedger"]), recovery=True)
                if handle.last_add_confirmed >= 0:
                    state = json.loads(handle.read_entry(handle.last_add_confirmed))
            except (NotFound, NoSuchEntry, MagnetarError):
                handle = None
        cursor = ManagedCursor(self.ml, name, durable=True, mark_delete_offset=int(state["md"]),
                               acked=RangeSet([(int(s), int(e)) for s, e in state["ranges"]]),
                               properties=state.get("props", {}), ledgers=self._ledgers, store=self._store)
        # Written back unchanged: a broker that served the topic before, whose compare-and-set
        # expects this version, can no longer swap the snapshot (its cursor ledger is fenced).
        # Only the version matters, so the write need not be synced: on one machine there is no
        # other broker, and a cluster's metadata store (ZooKeeper) makes every write durable.
        cursor._snapshot_version = self._store.put(path, stat.value, stat.version, durable=False).version
        cursor._ledger = None  # a recovered ledger is closed; the next persist starts a new one
        cursor._retired_ledger_id = handle.ledger_id if handle is not None else -1
        self._cursors[name] = cursor
        return cursor

    def open(self, name: str, *, initial: str | int = "latest", durable: bool = True) -> ManagedCursor:
        """Open (or create at ``initial``: "earliest", "latest" or an offset) a cursor."""
        with self._lock:
            cursor = self._cursors.get(name)
            if cursor is not None:
                return cursor
            start = self._initial_offset(initial)
            cursor = ManagedCursor(self.ml, name, durable=durable, mark_delete_offset=start,
                                   ledgers=self._ledgers, store=self._store)
            if durable:
                empty = json.dumps({"cursorLedger": -1, "state": {"md": start, "ranges": [], "props": {}}})
                try:
                    cursor._snapshot_version = self._store.put(cursor._path, empty.encode(), -1).version
                except BadVersion:
                    return self._restore(name)
                self._cursors[name] = cursor
            return cursor

    def _initial_offset(self, initial: str | int) -> int:
        if initial == "earliest":
            return self.ml.first_offset
        if initial == "latest":
            return self.ml.confirmed_next_offset()
        if isinstance(initial, int):
            return max(self.ml.first_offset, min(initial, self.ml.confirmed_next_offset()))
        raise InvalidRequest(f"initial position must be earliest, latest or an offset, not {initial!r}")

    def get(self, name: str) -> ManagedCursor | None:
        return self._cursors.get(name)

    def names(self) -> list[str]:
        return sorted(self._cursors)

    def delete(self, name: str) -> None:
        with self._lock:
            cursor = self._cursors.pop(name, None)
        if cursor is None:
            raise NotFound(f"subscription {name} of {self.ml.display_name} does not exist")
        ledger = cursor._ledger
        self._store.delete_recursive(cursor._path)
        if ledger is not None:
            with contextlib.suppress(MagnetarError):
                ledger.close()
            self._ledgers.delete(ledger.ledger_id)

    def close(self) -> None:
        for cursor in list(self._cursors.values()):
            cursor.close()
