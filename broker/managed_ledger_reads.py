"""Reading a managed ledger's entries: from the broker's entry cache, else by range reads of its
ledgers, remembering where offsets are.

Role: ``ManagedLedger`` (``broker/managed_ledger.py``) reads through one ``LedgerReads``: cursors,
readers and dispatch (``read_entries``), and the offset and time lookups, which read forward
from a sparse-index sample (``read_range``, ``broker/offset_index.py``). Consecutive entries the
cache does not hold are fetched from the bookies in one range read, a run of at most
``READ_RUN_ENTRIES_MAX`` entries (``LOOKUP_RUN_ENTRIES_MAX`` for a lookup, which stops at its
offset) and, at the ledger's average entry size, ``READ_RUN_BYTES_MAX`` bytes (one entry
always). Every read remembers, as ``PositionHints``, where the offset after each entry it read
lives, so a reader that goes on where it stopped looks nothing up.

Invariants: entries never change once confirmed, so a remembered position or a cached entry is
never stale (a trimmed ledger's handle is forgotten, its entries refused by the managed ledger
before any lookup). At most ``READ_HANDLES_MAX`` handles of closed ledgers are opened for
reading (the oldest is dropped); the current ledger is read through its writer's handle. A
handle reads where the ledger's info says now: one opened on the bookies before the ledger's
offload was saved complete is replaced by the copy's, and a run the bookies no longer answer
(the local copy deleted meanwhile) is read once more from the copy. A failed read of an
offloaded copy raises ``OffloadReadError`` (naming the ledger), never other data; a handle that
answers no entry is ``NoSuchEntry``, never a read without end.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable

from broker.bookkeeper.ledger_handle import LedgerHandle
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.entry import Entry
from broker.entry_cache import EntryCache
from broker.entry_format import message_count
from broker.entry_format.broker_metadata import prefix_fields
from broker.errors import NoSuchEntry, NoSuchLedger
from broker.limits import LOOKUP_RUN_ENTRIES_MAX, READ_HANDLES_MAX, READ_RUN_BYTES_MAX, READ_RUN_ENTRIES_MAX
from broker.message_id import Position
from broker.offload.offloader import LedgerOffloader, OffloadReadError, ReadHandle
from broker.offset_index import LedgerInfo, PositionHints

try:
    from broker.entry_format._common_entry import stored_entries as _stored_entries
except ImportError:  # installed without a C compiler: the loop of _read_run reads every entry
    NATIVE_STORED_ENTRIES = False
else:
    NATIVE_STORED_ENTRIES = True
"""Whether a run's entries are made natively (``_common_entry.c``'s ``stored_entries``)."""

_DATA = operator.itemgetter(1)
"""An ``Entry``'s ``data``."""


class LedgerReads:
    def __init__(self, ledgers: LedgerManager, cache: EntryCache, current: Callable[[], LedgerHandle | None],
                 offloader: LedgerOffloader | None = None) -> None:
        """``current``: the managed ledger's current ledger's handle (None: none is open);
        ``offloader``: the broker's object store, if one is configured."""
        self._ledgers = ledgers
        self._cache = cache
        self._current = current
        self._offloader = offloader
        self._handles: dict[int, tuple[ReadHandle, str | None]] = {}
        """Open handles by ledger, each with where it reads: the uuid of the complete offloaded
        copy it was opened on, or None for the bookies."""
        self._handles_lock = threading.Lock()
        self.hints = PositionHints()

    def keep(self, handle: LedgerHandle) -> None:
        """Read a ledger just closed (or recovered) through ``handle`` from now on."""
        with self._handles_lock:
            self._handles[handle.ledger_id] = (handle, None)

    def forget(self, ledger_id: int) -> None:
        """The ledger was trimmed, or is read from elsewhere now: its handle goes."""
        with self._handles_lock:
            self._handles.pop(ledger_id, None)

    def read_entries(self, infos: list[LedgerInfo], start: Position, max_entries: int, *,
                     max_bytes: int) -> list[Entry]:
        """Up to ``max_entries`` confirmed entries of ``infos`` from ``start`` on, across ledgers."""
        result: list[Entry] = []
        size = 0
        for info in list(infos):
            if info.ledger_id < start.ledger_id or info.entries == 0:
                continue
            first = start.entry_id if info.ledger_id == start.ledger_id else 0
            last = min(info.entries - 1, first + max_entries - len(result) - 1)
            if first > last:
                continue
            entries = self.read_range(info, first, last, max_bytes=max_bytes - size)
            result += entries
            size += sum(map(len, map(_DATA, entries)))
            if size >= max_bytes:
                return result
            if len(result) >= max_entries:
                break
        return result

    def _handle_for(self, info: LedgerInfo) -> ReadHandle:
        """The ledger's handle, opened where its info says it is read from now: a handle opened
        before its offload was saved complete (the bookies') is replaced by the copy's."""
        ledger_id = info.ledger_id
        current = self._current()
        if current is not None and current.ledger_id == ledger_id:
            return current
        wanted = _copy_uuid(info)
        with self._handles_lock:
            kept = self._handles.get(ledger_id)
        if kept is not None and kept[1] == wanted:
            return kept[0]
        handle = self._open(info)
        with self._handles_lock:
            self._handles.pop(ledger_id, None)
            while len(self._handles) >= READ_HANDLES_MAX:
                self._handles.pop(next(iter(self._handles)))
            self._handles[ledger_id] = (handle, wanted)
        return handle

    def _open(self, info: LedgerInfo) -> ReadHandle:
        """A ledger with a complete offloaded copy is read from the store (as Pulsar does, also
        during the deletion lag: the copy readers use is the one that stays); others from the
        bookies."""
        context = info.offload_context
        if context is None or not context.complete:
            return self._ledgers.open(info.ledger_id, recovery=False)
        if self._offloader is not None:
            return self._offloader.open(info.ledger_id, context.uuid, context.driver_metadata,
                                        context.driver_name)
        if not context.bookkeeper_deleted:
            return self._ledgers.open(info.ledger_id, recovery=False)
        raise OffloadReadError(f"ledger {info.ledger_id} is offloaded ({context.driver_name}) and deleted locally, "
                               "but no offload driver is configured (managedLedgerOffloadDriver)")

    def read_range(self, info: LedgerInfo, first: int, last: int, *,
                           stop_after_offset: int | None = None, max_bytes: int | None = None) -> list[Entry]:
        """Entries ``first..last`` of one ledger (fewer when ``max_bytes`` or ``stop_after_offset``
        ends the range early): from the broker's cache where it has them (consecutive ones at
        once), the rest through the ledger's range read, a run of at most
        ``READ_RUN_ENTRIES_MAX`` (``LOOKUP_RUN_ENTRIES_MAX`` with ``stop_after_offset``; fewer
        when the ledger's average entry would pass ``max_bytes`` or ``READ_RUN_BYTES_MAX``) at a
        time. Every entry
        after the first is remembered as where the offset after its predecessor lives, and so is
        the entry after the last one read."""
        handle = self._handle_for(info)
        run_entries = READ_RUN_ENTRIES_MAX if stop_after_offset is None else LOOKUP_RUN_ENTRIES_MAX
        entries: list[Entry] = []
        size = 0
        entry_id = first
        missed = -1  # the entry a cached run stopped at, not in the cache (looked up once)
        while entry_id <= last:
            if max_bytes is not None and size >= max_bytes:
                break
            bytes_left = None if max_bytes is None else max_bytes - size
            run_last = min(last, entry_id + run_entries - 1)
            run, missed = ([], -1) if entry_id == missed else \
                self._cache.get_run(info.ledger_id, entry_id, run_last, bytes_left, stop_after_offset)
            if not run:
                known_first = entries[-1].last_offset + 1 if entries else None
                run = self._read_run_anywhere(handle, info, entry_id, run_last, known_first, bytes_left)
            if not run:
                raise NoSuchEntry(f"ledger {info.ledger_id} answered no entry from {entry_id}")
            if stop_after_offset is not None:  # up to the entry holding it
                held = next((i for i, entry in enumerate(run) if entry.last_offset >= stop_after_offset), None)
                if held is not None:
                    entries += run[:held + 1]
                    break
            entries += run
            size += sum(map(len, map(_DATA, run)))
            entry_id += len(run)
        if entries:
            self.hints.remember(info, entries)
        return entries

    def _read_run_anywhere(self, handle: ReadHandle, info: LedgerInfo, first: int, last: int,
                           first_offset: int | None, bytes_left: int | None) -> list[Entry]:
        """A run through ``handle``; when that was the bookies' and the ledger was offloaded
        (and maybe deleted locally) while it read, once more through the copy."""
        try:
            return self._read_run(handle, info, first, last, first_offset, bytes_left)
        except (NoSuchEntry, NoSuchLedger):
            if _copy_uuid(info) is None or handle is self._current():
                raise
            return self._read_run(self._handle_for(info), info, first, last, first_offset, bytes_left)

    def _read_run(self, handle: ReadHandle, info: LedgerInfo, first: int, last: int, first_offset: int | None,
                  bytes_left: int | None) -> list[Entry]:
        """Entries from ``first`` on, read from the bookies in one range read. ``first_offset``,
        when the caller knows it, spares parsing the first entry's ``MessageMetadata``; every
        later entry's first offset follows from the one before (offsets have no gaps)."""
        count = min(last - first + 1, READ_RUN_ENTRIES_MAX)
        if info.entries:
            average = max(1, info.size_bytes // info.entries)
            run_bytes = READ_RUN_BYTES_MAX if bytes_left is None else min(bytes_left, READ_RUN_BYTES_MAX)
            count = max(1, min(count, -(-run_bytes // average)))
        payloads = handle.read(first, first + count - 1)
        if not payloads:
            return []
        ledger_id = info.ledger_id
        if first_offset is None:
            first_offset = prefix_fields(payloads[0])[1] - message_count(payloads[0]) + 1
        run: list[Entry] = _stored_entries(payloads, ledger_id, first, first_offset, Entry, Position) \
            if NATIVE_STORED_ENTRIES and type(payloads) is list else []
        if len(run) < len(payloads):  # the rest (none, usually) read here: an unusual prefix, or a malformed one
            if run:
                first_offset = run[-1].last_offset + 1
            position = Position.of_stored
            for entry_id, data in enumerate(payloads[len(run):], start=first + len(run)):
                broker_timestamp_ms, index = prefix_fields(data)
                run.append(Entry(position(ledger_id, entry_id), data, first_offset, index, broker_timestamp_ms))
                first_offset = index + 1
        return run


def _copy_uuid(info: LedgerInfo) -> str | None:
    """The complete offloaded copy a ledger is read from, or None: it is read from the bookies."""
    context = info.offload_context
    return context.uuid if context is not None and context.complete else None
