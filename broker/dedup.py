"""Producer deduplication: a resent (producer name, sequence id) is acknowledged, not stored.

Role: before a publish reaches the managed ledger, the topic asks :meth:`check`; an entry whose
highest sequence id is not above the producer's last *pushed* one is a duplicate. Pushed ids
advance at publish time (so pipelined sends are ordered); persisted ids advance when the entry
is durable. A duplicate of an entry that is still in flight is reported as such
(``in_flight``) so the caller can wait for it instead of answering too early.

Persistence (Pulsar's scheme, without a cursor): every ``snapshot_interval_entries`` entries,
and on close, ``{producer: last sequence id}`` plus the offset it covers is written to the
metadata store (not synced: it only shortens the replay below). On open the snapshot is loaded
and every entry after its offset is replayed (each stored entry carries its producer name and
sequence ids), so the state is exact after a restart or a crash. At most ``producers_max``
producers are tracked; beyond that the least recently active one is forgotten. For each producer
the end offset of its last stored entry is kept too, so a resend of that entry can be answered
with its first results (``last_entry_end``).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from broker.metadata.store import MetadataStore


class DedupStatus(Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    IN_FLIGHT = "in_flight"


@dataclass(frozen=True)
class DedupStats:
    producers: int
    duplicates: int
    snapshots: int
    snapshot_offset: int


class Deduplication:
    def __init__(self, store: MetadataStore, path: str, *, snapshot_interval_entries: int = 1000,
                 producers_max: int = 100_000) -> None:
        self._store = store
        self._path = path
        self._interval = snapshot_interval_entries
        self._producers_max = producers_max
        self._pushed: OrderedDict[str, int] = OrderedDict()
        self._persisted: dict[str, int] = {}
        self._ends: dict[str, int] = {}
        """Per producer: one past the last offset of its last stored entry."""
        self._lock = threading.Lock()
        self._entries_since_snapshot = 0
        self._snapshot_offset = 0
        self._duplicates = 0
        self._snapshots = 0

    def load(self, replay: Callable[[int], Iterable[tuple[str, int, int]]]) -> None:
        """Load the snapshot, then apply ``(producer, highest sequence id, next offset)`` of
        every entry stored after it."""
        stat = self._store.get(self._path)
        if stat is not None:
            obj = json.loads(stat.value)
            self._persisted = {str(k): int(v) for k, v in obj["producers"].items()}
            self._ends = {str(k): int(v) for k, v in obj.get("ends", {}).items()}
            self._snapshot_offset = int(obj["offset"])
        for producer, sequence_id, next_offset in replay(self._snapshot_offset):
            if sequence_id > self._persisted.get(producer, -1):
                self._persisted[producer] = sequence_id
                self._ends[producer] = next_offset
        self._pushed = OrderedDict(self._persisted)

    def check(self, producer: str, highest_sequence_id: int) -> DedupStatus:
        """Classify a publish and, when it is new, reserve its sequence id."""
        with self._lock:
            if highest_sequence_id <= self._persisted.get(producer, -1):
                self._duplicates += 1
                return DedupStatus.DUPLICATE
            if highest_sequence_id <= self._pushed.get(producer, -1):
                self._duplicates += 1
                return DedupStatus.IN_FLIGHT
            self._pushed[producer] = highest_sequence_id
            self._pushed.move_to_end(producer)
            while len(self._pushed) > self._producers_max:
                forgotten, _ = self._pushed.popitem(last=False)
                self._persisted.pop(forgotten, None)
                self._ends.pop(forgotten, None)
            return DedupStatus.NEW

    def rollback(self, producer: str, highest_sequence_id: int, previous: int) -> None:
        """Undo a reservation whose publish failed before being stored."""
        with self._lock:
            if self._pushed.get(producer) == highest_sequence_id:
                self._pushed[producer] = max(previous, self._persisted.get(producer, -1))

    def reset_pushed(self, producer: str) -> None:
        """A store of ``producer``'s failed: what it reserved and did not store is free again."""
        with self._lock:
            if producer in self._pushed:
                self._pushed[producer] = self._persisted.get(producer, -1)

    def persisted(self, producer: str, highest_sequence_id: int, next_offset: int, entries: int = 1) -> None:
        """Record ``entries`` durable entries ending at ``highest_sequence_id``; snapshot every
        ``snapshot_interval_entries`` entries."""
        with self._lock:
            if highest_sequence_id > self._persisted.get(producer, -1):
                self._persisted[producer] = highest_sequence_id
                self._ends[producer] = next_offset
            self._entries_since_snapshot += entries
            due = self._entries_since_snapshot >= self._interval
        if due:
            self.snapshot(next_offset)

    def snapshot(self, next_offset: int) -> None:
        with self._lock:
            body = json.dumps({"producers": self._persisted, "ends": self._ends, "offset": next_offset},
                              sort_keys=True).encode()
            self._entries_since_snapshot = 0
            self._snapshot_offset = next_offset
            self._snapshots += 1
        # Not synced: entries after the snapshot's offset are replayed on open anyway, so a
        # snapshot lost to a power failure only means a longer replay. A synced write here cost
        # the journal writer (this runs where entries become durable) an fsync twice a second.
        self._store.put(self._path, body, durable=False)

    def last_sequence_id(self, producer: str) -> int:
        """The highest durable sequence id of ``producer`` (-1 if unknown): what a reconnecting
        producer resumes after."""
        return self._persisted.get(producer, -1)

    def last_entry_end(self, producer: str, highest_sequence_id: int) -> int | None:
        """One past the last offset of the entry whose highest sequence id is
        ``highest_sequence_id``, when that is ``producer``'s last stored entry (else None)."""
        with self._lock:
            if self._persisted.get(producer) != highest_sequence_id:
                return None
            return self._ends.get(producer)

    def pushed_sequence_id(self, producer: str) -> int:
        return self._pushed.get(producer, -1)

    def statistics(self) -> DedupStats:
        return DedupStats(len(self._pushed), self._duplicates, self._snapshots, self._snapshot_offset)
