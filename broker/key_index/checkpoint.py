"""Where a partition's key index is recorded: its checkpoint, in the topic's metadata.

Role: the key index of a topic partition is a derived view of the topic, stored with it. Its
rows live in segments (``segment.py``), ledgers of the topic's own storage; which segments make
up the index, up to which offset they cover the topic, and which topic they belong to is one
record in the metadata store beside the managed ledger's list, at
``/managed-ledgers/{name}/key-index``, written with compare-and-set (as the cursors' snapshots
are)::

    {"incarnation": "<the managed ledger's>", "indexedTo": 1234, "cleanedBelow": 500,
     "segments": [{"ledgerId": 7, "fromOffset": 0, "toOffset": 1000, "rows": 800, "keys": 90}, ...],
     "pending": [9]}

``indexedTo``: every keyed message below it has its row in a segment. ``cleanedBelow``: the
rows of offsets below it were dropped by a compaction, but each key's last row. ``pending``: ledgers
the index owns that are not segments: being written (named before they are created) or let go
of (compacted away, or of a record found unusable) and not deleted yet (named until they are),
so a crash never leaves a ledger nobody knows (the next opening deletes them). ``incarnation`` is
the managed ledger's, made when the topic was first created: a record of another incarnation (a
deleted topic's, a restored backup's) is never used.

Invariants: a segment is named in ``segments`` only once its ledger is closed; ``indexedTo``
never goes back while the record is this incarnation's; the record is written only by the broker
that serves the topic (a compare-and-set conflict means another broker took it over).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from broker.errors import CorruptEntry
from broker.metadata.store import MetadataStore


def record_path(managed_ledger_name: str) -> str:
    return f"/managed-ledgers/{managed_ledger_name}/key-index"


@dataclass(frozen=True)
class SegmentInfo:
    ledger_id: int
    from_offset: int
    """The first offset whose rows it may hold."""
    to_offset: int
    """One past the last offset whose rows it may hold."""
    rows: int
    keys: int

    def to_json(self) -> dict[str, int]:
        return {"ledgerId": self.ledger_id, "fromOffset": self.from_offset, "toOffset": self.to_offset,
                "rows": self.rows, "keys": self.keys}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SegmentInfo:
        return cls(int(obj["ledgerId"]), int(obj["fromOffset"]), int(obj["toOffset"]), int(obj["rows"]),
                   int(obj["keys"]))


@dataclass(frozen=True)
class Checkpoint:
    incarnation: str
    indexed_to: int
    segments: tuple[SegmentInfo, ...] = ()
    """Oldest first: their offset ranges follow one another."""
    pending: tuple[int, ...] = field(default=())
    cleaned_below: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps({"incarnation": self.incarnation, "indexedTo": self.indexed_to,
                           "cleanedBelow": self.cleaned_below, "segments": [s.to_json() for s in self.segments],
                           "pending": list(self.pending)}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Checkpoint:
        try:
            obj = json.loads(raw)
            return cls(str(obj["incarnation"]), int(obj["indexedTo"]),
                       tuple(SegmentInfo.from_json(s) for s in obj["segments"]),
                       tuple(int(p) for p in obj.get("pending", ())), int(obj.get("cleanedBelow", 0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntry(f"unreadable key index record: {exc}") from exc

    def with_pending(self, ledger_id: int) -> Checkpoint:
        return replace(self, pending=(*self.pending, ledger_id))

    def committed(self, ledger_id: int, segment: SegmentInfo | None, indexed_to: int,
                  replaces: tuple[int, ...] = ()) -> Checkpoint:
        """The record once ``ledger_id`` (pending) is written: it joins the segments (in place of
        the ones it ``replaces``, a compaction) and the index covers the topic to ``indexed_to``."""
        kept = [s for s in self.segments if s.ledger_id not in replaces]
        if segment is not None:
            kept.append(segment)
        kept.sort(key=lambda s: (s.from_offset, s.to_offset))
        return replace(self, indexed_to=max(self.indexed_to, indexed_to), segments=tuple(kept),
                       pending=tuple(p for p in self.pending if p != ledger_id))


class CheckpointStore:
    """Reads and compare-and-sets one partition's record."""

    def __init__(self, store: MetadataStore, managed_ledger_name: str) -> None:
        self._store = store
        self.path = record_path(managed_ledger_name)
        self._version: int | None = None

    def load(self) -> Checkpoint | None:
        stat = self._store.get(self.path)
        if stat is None:
            self._version = None
            return None
        self._version = stat.version
        return Checkpoint.from_bytes(stat.value)

    def save(self, checkpoint: Checkpoint) -> None:
        """Compare-and-set (``BadVersion`` when someone else wrote it since it was read)."""
        expected = -1 if self._version is None else self._version
        self._version = self._store.put(self.path, checkpoint.to_bytes(), expected).version

    def delete(self) -> None:
        self._store.delete_recursive(self.path)
        self._version = None
