"""Broker-side entry cache: recent entries of every managed ledger, for tailing readers.

Role: every entry a managed ledger appends is inserted here; a cursor reading near the tail is
served from memory, while a backlogged cursor misses and reads through the bookie (catch-up
read), as in Pulsar. Keys are ``(ledger_id, entry_id)``; ledger ids are globally unique. An entry
is kept as the ``Entry`` a read gives (``broker/entry.py``), with the offsets and publish time
the managed ledger knew when it appended it: a read takes a run of them as they are
(``get_run``), one lookup an entry, parsing nothing and making nothing.

Invariants: ``size_bytes <= capacity_bytes`` after every insert: over capacity, the oldest
entries are evicted down to ``eviction_watermark`` times capacity; entries older than
``entry_age_ms_max`` are evicted on the next insert or :meth:`evict_expired`. Time is injected.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from broker.entry import Entry


@dataclass(frozen=True)
class EntryCacheStats:
    entries: int
    size_bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    evicted_by_size: int
    evicted_by_age: int


class EntryCache:
    def __init__(self, capacity_bytes: int, *, entry_age_ms_max: int = 1000, eviction_watermark: float = 0.9,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity_bytes = capacity_bytes
        self._age_s_max = entry_age_ms_max / 1000.0
        self._watermark_bytes = int(capacity_bytes * eviction_watermark)
        self._clock = clock
        self._entries: OrderedDict[tuple[int, int], tuple[Entry, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.size_bytes = 0
        self._hits = self._misses = self._by_size = self._by_age = 0

    def insert(self, entry: Entry) -> None:
        if len(entry.data) > self._watermark_bytes:
            return
        now = self._clock()
        with self._lock:
            key = (entry.position.ledger_id, entry.position.entry_id)
            old = self._entries.pop(key, None)
            if old is not None:
                self.size_bytes -= len(old[0].data)
            self._entries[key] = (entry, now)
            self.size_bytes += len(entry.data)
            self._evict_locked(now)

    def get_run(self, ledger_id: int, first: int, last: int, bytes_left: int | None = None,
                stop_after_offset: int | None = None) -> tuple[list[Entry], int]:
        """The cached entries from ``first`` (up to ``last``) up to the first one not cached, until
        their bytes reach ``bytes_left`` or up to the one holding ``stop_after_offset``; and the
        entry looked up and not found (-1: none was). A hit is counted for each entry given, a
        miss for the one not found."""
        run: list[Entry] = []
        get, append = self._entries.get, run.append
        missed = -1
        size = 0
        for entry_id in range(first, last + 1):
            item = get((ledger_id, entry_id))
            if item is None:
                missed = entry_id
                break
            entry = item[0]
            append(entry)
            if bytes_left is not None:
                size += len(entry.data)
                if size >= bytes_left:
                    break
            if stop_after_offset is not None and entry.last_offset >= stop_after_offset:
                break
        self._hits += len(run)
        self._misses += missed >= 0
        return run, missed

    def evict_expired(self) -> None:
        with self._lock:
            self._evict_locked(self._clock())

    def _evict_locked(self, now: float) -> None:
        while self._entries:  # insertion order is age order
            key, (entry, inserted) = next(iter(self._entries.items()))
            if now - inserted <= self._age_s_max:
                break
            del self._entries[key]
            self.size_bytes -= len(entry.data)
            self._by_age += 1
        if self.size_bytes > self.capacity_bytes:
            while self._entries and self.size_bytes > self._watermark_bytes:
                _, (entry, _) = self._entries.popitem(last=False)
                self.size_bytes -= len(entry.data)
                self._by_size += 1

    def invalidate_ledger(self, ledger_id: int) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == ledger_id]:
                self.size_bytes -= len(self._entries.pop(key)[0].data)

    def statistics(self) -> EntryCacheStats:
        with self._lock:
            return EntryCacheStats(len(self._entries), self.size_bytes, self.capacity_bytes, self._hits,
                                   self._misses, self._by_size, self._by_age)
