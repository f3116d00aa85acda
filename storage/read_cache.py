"""Read cache: entries read from entry logs, plus the read-ahead that follows them.

Role in the read path: after the write cache and the buffer being flushed miss, the read cache
is asked; on a miss the entry comes from the entry log, and the entries that follow it in the
same log for the same ledger (read ahead in the same ``pread``) are put here, so a catch-up
reader costs one disk read per read-ahead batch instead of one per entry.

Invariants: ``size_bytes <= capacity_bytes`` after every call (least recently used entries are
evicted first); an entry larger than the whole cache is not cached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReadCacheStats:
    entries: int
    size_bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    evictions: int


class ReadCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        run = self.get_run(ledger_id, entry_id, entry_id)
        return run[0] if run else None

    def get_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """The cached entries of ``first_entry_id..last_entry_id`` up to the first one not cached,
        each made the most recently used, under one acquisition of the lock (a hit counted for
        each, a miss only when the first is not cached)."""
        run: list[bytes] = []
        with self._lock:
            entries = self._entries
            get, move_to_end = entries.get, entries.move_to_end
            for entry_id in range(first_entry_id, last_entry_id + 1):
                key = (ledger_id, entry_id)
                data = get(key)
                if data is None:
                    break
                move_to_end(key)
                run.append(data)
            self.hits += len(run)
            self.misses += not run
        return run

    def count_hits(self, hits: int) -> None:
        """Entries served as cached without a lookup (a range read took them from a log read's
        read-ahead, which would have gone through the cache)."""
        with self._lock:
            self.hits += hits

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.put_many(ledger_id, [(entry_id, data)])

    def put_many(self, ledger_id: int, entries: Sequence[tuple[int, bytes]]) -> None:
        """:meth:`put` of each ``(entry id, data)`` of ``ledger_id``, in order, under one
        acquisition of the lock (an entry-log read's read-ahead)."""
        capacity = self.capacity_bytes
        with self._lock:
            cached = self._entries
            for entry_id, data in entries:
                if len(data) > capacity:
                    continue
                key = (ledger_id, entry_id)
                old = cached.pop(key, None)
                if old is not None:
                    self.size_bytes -= len(old)
                cached[key] = data
                self.size_bytes += len(data)
            while self.size_bytes > capacity:
                _, evicted = cached.popitem(last=False)
                self.size_bytes -= len(evicted)
                self.evictions += 1

    def delete_ledger(self, ledger_id: int) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == ledger_id]:
                self.size_bytes -= len(self._entries.pop(key))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.size_bytes = 0

    def statistics(self) -> ReadCacheStats:
        with self._lock:
            return ReadCacheStats(len(self._entries), self.size_bytes, self.capacity_bytes,
                                  self.hits, self.misses, self.evictions)
