"""Write cache: the bookie's memtable.

Role in the write path: ``add_entries`` puts each entry here before journaling it; reads look
here first. ``LedgerStorage`` keeps two of these: the *active* buffer taking new entries and
the one *being flushed*. A flush swaps them, writes the flushed buffer's entries sorted by
(ledger, entry) to the entry log, so one ledger's entries are adjacent on disk, then drops it.

Invariants:
- ``size_bytes`` never exceeds ``capacity_bytes``: ``put`` answers ``FULL`` instead of
  growing, and the caller applies back-pressure.
- Once :meth:`seal` returns, no ``put`` lands in this buffer (it answers ``SEALED`` and the
  caller retries on the new active buffer): a flush sees every entry that was put before it.
- Locks are sharded by ledger (a ledger has one writer), so writers of different ledgers never
  queue on one lock; the capacity check reads the shards' sizes without their locks, so a
  buffer can exceed its capacity by at most one entry per shard.
- A buffer being flushed is never mutated by the flush; it is dropped whole afterwards, so a
  reader that looked it up just before the drop still finds its entries there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class WriteCacheStats:
    entries: int
    size_bytes: int
    capacity_bytes: int


PUT_OK = 0
PUT_FULL = 1
PUT_SEALED = 2


LOCK_SHARDS = 16


class WriteCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: dict[tuple[int, int], bytes] = {}
        self._last_entry: dict[int, int] = {}
        self._locks = [threading.Lock() for _ in range(LOCK_SHARDS)]
        self._sizes = [0] * LOCK_SHARDS
        self._sealed = False
        self.size_seen_bytes = 0
        """The total size as of the latest put (a cheap hint for the flush trigger)."""

    @property
    def size_bytes(self) -> int:
        return sum(self._sizes)

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> int:
        """Store an entry: ``PUT_OK``; ``PUT_FULL`` or ``PUT_SEALED`` store nothing."""
        key = (ledger_id, entry_id)
        shard = ledger_id % LOCK_SHARDS
        with self._locks[shard]:
            if self._sealed:
                return PUT_SEALED
            old = self._entries.get(key)
            grow = len(data) - (len(old) if old is not None else 0)
            total = sum(self._sizes) + grow
            if total > self.capacity_bytes and self._entries:
                return PUT_FULL
            self._entries[key] = data
            self._sizes[shard] += grow
            self.size_seen_bytes = total
            if entry_id > self._last_entry.get(ledger_id, -1):
                self._last_entry[ledger_id] = entry_id
            return PUT_OK

    def seal(self) -> None:
        """Refuse every later put (the buffer is about to be flushed)."""
        for lock in self._locks:
            lock.acquire()
        self._sealed = True
        for lock in reversed(self._locks):
            lock.release()

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._entries.get((ledger_id, entry_id))

    def get_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """The entries of ``ledger_id`` from ``first_entry_id`` on that this buffer holds, up to
        the first it does not hold or ``last_entry_id``."""
        run: list[bytes] = []
        get = self._entries.get
        for entry_id in range(first_entry_id, last_entry_id + 1):
            data = get((ledger_id, entry_id))
            if data is None:
                break
            run.append(data)
        return run

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id of ``ledger_id`` in this buffer, or -1."""
        return self._last_entry.get(ledger_id, -1)

    def remove(self, ledger_id: int, entry_id: int) -> None:
        shard = ledger_id % LOCK_SHARDS
        with self._locks[shard]:
            data = self._entries.pop((ledger_id, entry_id), None)
            if data is not None:
                self._sizes[shard] -= len(data)

    def delete_ledger(self, ledger_id: int) -> None:
        shard = ledger_id % LOCK_SHARDS
        with self._locks[shard]:
            doomed = [k for k in list(self._entries) if k[0] == ledger_id]
            for key in doomed:
                self._sizes[shard] -= len(self._entries.pop(key))
            self._last_entry.pop(ledger_id, None)

    def __len__(self) -> int:
        return len(self._entries)

    def sorted_entries(self) -> Iterator[tuple[int, int, bytes]]:
        keys = sorted(self._entries)  # one C-level pass: atomic under the interpreter lock
        entries = self._entries
        for key in keys:
            data = entries.get(key)
            if data is not None:  # a failed add may have been removed meanwhile
                yield key[0], key[1], data

    def statistics(self) -> WriteCacheStats:
        return WriteCacheStats(len(self._entries), self.size_bytes, self.capacity_bytes)
