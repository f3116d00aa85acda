"""The offset and time index of a managed ledger: Kafka's sparse index, per ledger.

Role: a topic partition's messages have gap-free offsets across its ledgers; finding the entry
that holds an offset, or the first one published at or after a time, must not read the
partition from the start. Each ledger's ``LedgerInfo`` keeps the (first offset, entry id,
publish time) of every ``index_interval_entries``-th entry and of any entry that follows
``index_interval_bytes`` of unsampled ones (Kafka's ``index.interval.bytes``), so a lookup
bisects the ledgers, then the samples, and reads forward a bounded number of entries and bytes.
A closed ledger's samples are persisted beside the ledger list. ``PositionHints`` remembers,
for a bounded number of recent reads, where each entry read and the entry after the last start,
so a reader that goes on where it stopped finds its next offset without reading anything.

Invariants: samples are in offset and entry order; a sample never names an entry past the
ledger's end; hints are only ever true (entries never change) and at most
``POSITION_HINT_RANGES_MAX`` reads of ``POSITION_HINT_ENTRIES_MAX`` entries in all are kept.
"""

from __future__ import annotations

import array
import bisect
import json
import operator
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from broker.limits import POSITION_HINT_ENTRIES_MAX, POSITION_HINT_RANGES_MAX
from broker.message_id import Position
from broker.metadata.store import MetadataStore
from broker.offload.offloader import OffloadContext

Sample = tuple[int, int, int]
"""(first offset, entry id, publish ms) of a sampled entry."""


@dataclass
class LedgerInfo:
    """One ledger of a managed ledger: what it holds, and its samples."""

    ledger_id: int
    first_offset: int
    entries: int = 0
    size_bytes: int = 0
    messages: int = 0
    created_ms: int = 0
    closed_ms: int = 0
    first_publish_ms: int = 0
    last_publish_ms: int = 0
    sparse_index: list[Sample] = field(default_factory=list)
    unsampled_bytes: int = 0
    """Bytes of the entries after the last sampled one (rebuilt by recovery, not persisted)."""
    offload_context: OffloadContext | None = None
    """The ledger's offload attempt (``broker/managed_ledger_offload.py``); None: never offloaded
    (and absent from the stored JSON, so lists written before tiered storage read the same)."""

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"ledgerId": self.ledger_id, "firstOffset": self.first_offset, "entries": self.entries,
                               "size": self.size_bytes, "messages": self.messages, "ctime": self.created_ms,
                               "closedTime": self.closed_ms, "firstPublishMs": self.first_publish_ms,
                               "lastPublishMs": self.last_publish_ms}
        if self.offload_context is not None:
            obj["offloadContext"] = self.offload_context.to_json()
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LedgerInfo:
        context = obj.get("offloadContext")
        return cls(ledger_id=obj["ledgerId"], first_offset=obj["firstOffset"], entries=obj["entries"],
                   size_bytes=obj["size"], messages=obj["messages"], created_ms=obj["ctime"],
                   closed_ms=obj["closedTime"], first_publish_ms=obj["firstPublishMs"],
                   last_publish_ms=obj["lastPublishMs"],
                   offload_context=None if context is None else OffloadContext.from_json(context))

    @property
    def offloaded(self) -> bool:
        """A complete copy is in the object store (Pulsar's internalStats ``offloaded``)."""
        return self.offload_context is not None and self.offload_context.complete

    @property
    def local_deleted(self) -> bool:
        """The bookies' copy is deleted (or being deleted): only the offloaded copy is read."""
        return self.offload_context is not None and self.offload_context.bookkeeper_deleted

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.messages

    def sample(self, entry_id: int, first_offset: int, publish_ms: int, size_bytes: int, *,
               interval_entries: int, interval_bytes: int) -> None:
        """Add entry ``entry_id`` to the samples when it is due, by count or by bytes."""
        if entry_id % interval_entries == 0 or self.unsampled_bytes >= interval_bytes:
            self.sparse_index.append((first_offset, entry_id, publish_ms))
            self.unsampled_bytes = 0
        self.unsampled_bytes += size_bytes

    def drop_samples_past_end(self) -> None:
        self.sparse_index = [s for s in self.sparse_index if s[1] < self.entries]

    def start_for_offset(self, offset: int) -> int:
        """The entry to read forward from to find ``offset`` in this ledger."""
        start = bisect.bisect_right([s[0] for s in self.sparse_index], offset) - 1
        return self.sparse_index[start][1] if start >= 0 else 0

    def start_for_time(self, publish_time_ms: int) -> int:
        """The entry to read forward from to find the first one published at or after a time."""
        start = bisect.bisect_left([s[2] for s in self.sparse_index], publish_time_ms) - 1
        return self.sparse_index[start][1] if start >= 0 else 0


def ledger_holding(infos: Sequence[LedgerInfo], offset: int) -> LedgerInfo:
    """The ledger (of those with entries, in order) whose offsets include ``offset``."""
    written = [i for i in infos if i.entries > 0]
    return written[bisect.bisect_right([i.first_offset for i in written], offset) - 1]


class SampleStore:
    """Closed ledgers' samples in the metadata store, at ``{managed ledger path}/sparse-index/{id}``."""

    def __init__(self, store: MetadataStore, ml_path: str) -> None:
        self._store = store
        self._ml_path = ml_path

    def path(self, ledger_id: int) -> str:
        return f"{self._ml_path}/sparse-index/{ledger_id}"

    def save(self, info: LedgerInfo) -> None:
        self._store.put(self.path(info.ledger_id), json.dumps(info.sparse_index).encode())

    def load(self, ledger_id: int) -> list[Sample]:
        stat = self._store.get(self.path(ledger_id))
        return [] if stat is None else [(a, b, c) for a, b, c in json.loads(stat.value)]


_FIRST_OFFSET = operator.attrgetter("first_offset")


class _ReadRange(NamedTuple):
    """The consecutive entries of one read of a ledger, the first at ``first_entry_id``: entry
    ``first_entry_id + i`` starts at ``first_offsets[i]``, or (None: each holds one message) at
    ``first_offset + i``."""

    ledger_id: int
    first_entry_id: int
    first_offset: int
    last_first_offset: int
    first_offsets: array.array[int] | None
    next_position: Position | None
    """Where the entry after the last starts (None: the last is the ledger's last)."""

    @property
    def size(self) -> int:
        """What the range counts against ``entries_max``: its offsets kept (one without them)."""
        return 1 if self.first_offsets is None else len(self.first_offsets)


class PositionHints:
    """Where the entries of recent reads start, and the entry after each read's last, by first
    offset: the newest ``ranges_max`` reads, at most ``entries_max`` entries' offsets in all
    (oldest forgotten first). A read is remembered as one range: its first entry's position
    and, unless each of its entries holds one message (then an entry's offset says which it
    is), its entries' first offsets in an array made in one C loop, so remembering 1,000
    entries costs about what one does. A reader that goes on where a read ended finds its range
    by that offset; any other offset is looked for in the ranges, newest first."""

    def __init__(self, ranges_max: int = POSITION_HINT_RANGES_MAX,
                 entries_max: int = POSITION_HINT_ENTRIES_MAX) -> None:
        self._ranges: OrderedDict[int, _ReadRange] = OrderedDict()  # by the offset after each; oldest first
        self._entries = 0
        self._ranges_max, self._entries_max = ranges_max, entries_max
        self._lock = threading.Lock()

    def get(self, offset: int) -> Position | None:
        with self._lock:
            ended = self._ranges.get(offset)
            if ended is not None and ended.next_position is not None:
                return ended.next_position
            for held in reversed(self._ranges.values()):
                if held.first_offset <= offset <= held.last_first_offset:
                    first_offsets = held.first_offsets
                    if first_offsets is None:
                        return Position(held.ledger_id, held.first_entry_id + offset - held.first_offset)
                    index = bisect.bisect_left(first_offsets, offset)
                    if first_offsets[index] == offset:
                        return Position(held.ledger_id, held.first_entry_id + index)
        return None

    def remember(self, info: LedgerInfo, entries: Sequence[Any]) -> None:
        """After reading ``entries`` (consecutive, of ledger ``info``): where each starts, and
        where the entry after the last does (the newest ``entries_max`` of them when more)."""
        last = entries[-1]
        kept = entries[max(0, len(entries) - self._entries_max):]
        first = kept[0]
        next_entry_id = last.position.entry_id + 1
        if next_entry_id - first.position.entry_id != len(kept):  # not consecutive: hints must be true
            return
        one_message_each = last.last_offset - first.first_offset + 1 == len(kept)
        read = _ReadRange(info.ledger_id, first.position.entry_id, first.first_offset, last.first_offset,
                          None if one_message_each else array.array("q", map(_FIRST_OFFSET, kept)),
                          Position(info.ledger_id, next_entry_id) if next_entry_id < info.entries else None)
        end_offset = last.last_offset + 1
        with self._lock:
            replaced = self._ranges.pop(end_offset, None)
            self._entries += read.size - (replaced.size if replaced is not None else 0)
            self._ranges[end_offset] = read
            while len(self._ranges) > 1 and (len(self._ranges) > self._ranges_max or self._entries > self._entries_max):
                _, forgotten = self._ranges.popitem(last=False)
                self._entries -= forgotten.size

    def statistics(self) -> PositionHintStats:
        with self._lock:
            return PositionHintStats(ranges=len(self._ranges), entries=self._entries)


@dataclass(frozen=True)
class PositionHintStats:
    ranges: int
    entries: int
