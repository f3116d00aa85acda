"""The read path of the embedded bookie: caches first, then the entry log with read-ahead.

Role: ``LedgerStorage.get_entry`` and ``get_entries`` read here, in this order: the active write
cache ─▶ the buffer being flushed ─▶ the read cache ─▶ the location index ─▶ the entry log. An
entry-log read fills the read cache with the entries that follow in the same log (read-ahead)
when it continues the ledger's last read (or is its first): a reader that jumps about a ledger
(the reads of one key's stream) reads only its entry, and goes back to read-ahead on its next
sequential miss. A range read takes the read-ahead's entries at once instead of through the
cache, and the entries it asks for come in its log read (up to ``read_ahead_bytes_max`` of
them) wherever it starts: they are wanted, not read ahead.

Invariants: an entry is read from the first place that has it (the caches hold exactly what
the log would give); a read racing garbage collection looks the entry up again (at most three
times) rather than failing; a transient failure to read is ``StorageBusy``, any other
``CorruptEntry``; where each ledger's last read ended is remembered for at most
``READ_POSITIONS_MAX`` ledgers (least recently read go first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from storage.config import StorageConfig
from storage.entry_location_index import EntryLocationIndex
from storage.entry_log import EntryLogger, LogMissing
from storage.errors import CorruptEntry, NoSuchEntry, StorageBusy
from storage.flusher import Flusher
from storage.io_errors import OnceLog, describe, is_transient
from storage.limits import READ_POSITIONS_MAX
from storage.read_cache import ReadCache
from storage.write_cache import WriteCache


@dataclass(frozen=True)
class ReadPathStats:
    write_cache_hits: int
    flushing_cache_hits: int
    read_cache_hits: int
    entry_log_reads: int
    random_reads: int
    """Entry-log reads without read-ahead (not where the ledger's last read ended)."""


class EntryReader:
    """Reads entries through the caches and the entry logs; safe to call from any thread."""

    def __init__(self, config: StorageConfig, caches: Flusher, read_cache: ReadCache, index: EntryLocationIndex,
                 logs: EntryLogger, busy: OnceLog) -> None:
        self.config = config
        self._caches = caches
        """The write caches (``active``, then ``flushing``)."""
        self._read_cache = read_cache
        self._index = index
        self._logs = logs
        self._busy = busy
        """Logs transient failures of storage calls once."""
        self._hits = [0, 0, 0, 0, 0]  # write cache, being flushed, read cache, entry log, of which random
        self._read_positions: OrderedDict[int, int] = OrderedDict()
        """Ledger → the entry after its last entry-log read and read-ahead (LRU, bounded)."""
        self._read_positions_lock = threading.Lock()

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's bytes (``NoSuchEntry`` when it is nowhere)."""
        cached = self._cached_run(ledger_id, entry_id, entry_id)
        return cached[0] if cached else self._read_from_log(ledger_id, entry_id)

    def _cached_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """Consecutive entries from ``first_entry_id`` (up to ``last_entry_id``) out of the first
        cache that holds that one, asked in this order: the write cache, the buffer being
        flushed, the read cache (counted)."""
        caches: tuple[WriteCache | ReadCache, ...] = (self._caches.active, self._caches.flushing, self._read_cache)
        for source, cache in enumerate(caches):
            run = cache.get_run(ledger_id, first_entry_id, last_entry_id)
            if run:
                self._hits[source] += len(run)
                return run
        return []

    def get_entries(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """Entries ``first..last`` of a ledger in order, each as :meth:`get_entry` returns it
        (``NoSuchEntry`` for one that is missing). An entry-log read's read-ahead serves the
        following entries of the range at once, not through the read cache (counted as read-cache
        hits, which they would have been); what it read past ``last_entry_id`` goes to the cache."""
        found: list[bytes] = []
        entry_id = first_entry_id
        while entry_id <= last_entry_id:
            run = self._cached_run(ledger_id, entry_id, last_entry_id)
            if run:
                found += run
                entry_id += len(run)
                continue
            data, ahead = self._read_log_run(ledger_id, entry_id, last_entry_id - entry_id)
            found.append(data)
            entry_id += 1
            used = 0
            for ahead_entry, ahead_data in ahead:
                if ahead_entry != entry_id or entry_id > last_entry_id:
                    break
                found.append(ahead_data)
                entry_id += 1
                used += 1
            self._hits[2] += used
            self._read_cache.count_hits(used)
            self._read_cache.put_many(ledger_id, ahead[used:])
        return found

    def _read_from_log(self, ledger_id: int, entry_id: int) -> bytes:
        data, ahead = self._read_log_run(ledger_id, entry_id)
        self._read_cache.put_many(ledger_id, ahead)
        return data

    def _read_log_run(self, ledger_id: int, entry_id: int, wanted: int = 0) -> tuple[bytes, list[tuple[int, bytes]]]:
        """The entry from its entry log, with the entries of the ledger that follow it there:
        the ``wanted`` ones a range read asks for next (in the same read, up to
        ``read_ahead_bytes_max`` of them), and read-ahead beyond them when the read continues
        where the ledger's last one ended."""
        for _ in range(3):  # GC may move the entry between the lookup and the read
            location = self._index.get(ledger_id, entry_id)
            if location == 0:
                break
            sequential = self._continues_last_read(ledger_id, entry_id)
            try:
                data, ahead = self._logs.read(
                    location, ledger_id, entry_id,
                    read_ahead_entries=max(wanted, sequential * self.config.read_ahead_entries_max),
                    read_ahead_bytes=self.config.read_ahead_bytes_max if wanted or sequential else 0)
            except LogMissing:
                continue
            except OSError as exc:
                if is_transient(exc):
                    self._busy.failed(exc)
                    raise StorageBusy(f"entry {ledger_id}:{entry_id} cannot be read now ({describe(exc)}); "
                                      "retry") from exc
                raise CorruptEntry(f"entry {ledger_id}:{entry_id} unreadable: {exc}") from exc
            self._hits[3] += 1
            self._hits[4] += not sequential
            self._remember_read(ledger_id, entry_id + 1 + len(ahead))
            return data, ahead
        raise NoSuchEntry(f"entry {ledger_id}:{entry_id} does not exist")

    def _continues_last_read(self, ledger_id: int, entry_id: int) -> bool:
        """Whether a log read of ``entry_id`` should read ahead: the ledger's first remembered
        read, or the entry right after where its last read (and read-ahead) ended."""
        with self._read_positions_lock:
            expected = self._read_positions.get(ledger_id)
        return expected is None or expected == entry_id

    def _remember_read(self, ledger_id: int, next_entry_id: int) -> None:
        with self._read_positions_lock:
            self._read_positions[ledger_id] = next_entry_id
            self._read_positions.move_to_end(ledger_id)
            while len(self._read_positions) > READ_POSITIONS_MAX:
                self._read_positions.popitem(last=False)

    def statistics(self) -> ReadPathStats:
        return ReadPathStats(*self._hits)
