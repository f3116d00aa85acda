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
        key = (ledger_id, entry_id)
        with self._lock:
            data = self._entries.get(key)
            if data is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return data

    def count_hits(self, hits: int) -> None:
        """Entries served as cached without a lookup (a range read took them from a log read's
        read-ahead, which would have gone through the cache)."""
        with self._lock:
            self.hits += hits

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        if len(data) > self.capacity_bytes:
            return
        key = (ledger_id, entry_id)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.size_bytes -= len(old)
            self._entries[key] = data
            self.size_bytes += len(data)
            while self.size_bytes > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
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
