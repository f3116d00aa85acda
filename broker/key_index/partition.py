"""The event streams of one topic partition: versions given on append, rows kept with the topic.

Role: an *event stream* is the messages with one key in one partition; its *version* is the
0-based number of the key's message (-1: the key has none). ``PartitionKeys`` numbers keyed
messages as they are appended, checks what a conditional append expects of its keys, and
answers reads by version (``broker/event_streams.py``).

Write path. ``reservation_of_keys`` prepares one entry's keyed messages; the managed ledger calls
it under the lock that assigns offsets (``ManagedLedger.append``'s ``on_offsets``): there it
checks the expected versions (``KeyVersionMismatch``: nothing written) and gives each keyed
message the next version of its key. Those versions live in memory (the *tail*) until the
entry is durable (``confirmed``: readers see it from then on) or has failed (``failed``:
withdrawn, so versions stay dense). A checkpoint (``checkpoint``, run by the key index's thread
every ``KEY_INDEX_CHECKPOINT_INTERVAL_S`` or at ``KEY_INDEX_CHECKPOINT_ROWS`` confirmed rows)
writes the confirmed rows as a segment (``segment.py``), a ledger of the topic's own storage,
and records it in the topic's metadata (``checkpoint.py``), both through the partition's
``SegmentSet`` (``segment_set.py``); only then do they leave the tail.

DCB events (``derived.py``, ``broker/dcb.py``): a message whose properties name a type and tags
is numbered, besides its key's stream, in one derived stream per type and per tag, the same way
(on append and when entries are read again on open); ``rows_from_offset`` reads a stream's rows
after an offset, and ``_reserve`` checks a DCB condition against the tail under the offset lock
(``DcbConditionFailed``; ``DcbIndexMoved`` when a checkpoint moved the segments it was checked
against), as it checks expected versions.

Opening (after a restart, a failover, a bundle move): the record is read and checked against the
managed ledger's incarnation and end, its segments' indexes are loaded, and only the entries
after ``indexedTo`` are read again. A record of another incarnation, one running past the
topic's end, or one whose segments cannot be read is not used: it is logged in one line and the
index is rebuilt from the entries retention kept. No broker needs a local disk for the index.

Retention: the managed ledger never trims past ``durable_watermark`` (the record's
``indexedTo``), so every version a trim removes has its row in a segment; a compaction of the
segments drops the rows of trimmed entries but keeps each key's last row, so versions never
restart and a trimmed version reads as ``DataLost`` naming the first kept one.

Invariants: a key's versions are dense and in offset order; a version, once acknowledged, never
changes; the tail holds at most ``PENDING_ROWS_MAX`` rows (beyond, appends are refused with the
retriable ``KeyIndexBusy``); keys are at most ``KEY_BYTES_MAX`` bytes; one writer (the broker
serving the topic) changes the record, by compare-and-set: an opening writes the record back
(reading it again if an earlier owner's late checkpoint changed it meanwhile), and from then on
the earlier owner's writes are refused; a checkpoint's ``indexedTo`` covers every row it writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from broker.entry_format import decode_entry
from broker.errors import (
    BadVersion,
    DcbConditionFailed,
    DcbIndexMoved,
    InvalidRequest,
    KeyIndexBusy,
    KeyVersionMismatch,
    MagnetarError,
)
from broker.key_index.checkpoint import SegmentInfo
from broker.key_index.derived import DcbCondition, DcbItem, IndexKey, keys_of_messages
from broker.key_index.segment import Row, Segment, StreamRow, key_bytes, row_of
from broker.key_index.segment_set import SegmentHost, SegmentSet
from broker.limits import (
    KEY_HEADS_CACHED_MAX,
    KEY_INDEX_CHECKPOINT_INTERVAL_S,
    KEY_INDEX_CHECKPOINT_ROWS,
    KEY_INDEX_ENTRY_ROWS_MAX,
    KEY_INDEX_SEGMENTS_MAX,
    PENDING_ROWS_MAX,
)
from broker.message_fields import EXISTS, ExpectedVersion, check_key
from broker.message_id import Position

if TYPE_CHECKING:
    from broker.entry import Entry
    from broker.managed_ledger import ManagedLedger

log = logging.getLogger(__name__)

OPEN_ATTEMPTS = 3
"""Times an opening reads the record again when an earlier owner's late checkpoint changed it
between the read and the write-back."""
CLEANUP_SHARE = 0.5
"""A compaction drops trimmed rows once retention trimmed this share of the offsets the
segments cover since the last one."""

Head = tuple[int, int]
"""A key's (version, offset)."""


class IndexHost(SegmentHost, Protocol):
    """What a partition needs of the broker's key index (``index.py``) beyond its segments: the
    checkpoint thread's wake-up and the counters it adds to."""

    checkpoints: int
    compactions: int
    dcb_entries_read: int
    dcb_rows_read: int
    entries_replayed: int
    mismatches: int
    rows_cleaned: int
    rows_indexed: int

    def wake(self, keys: PartitionKeys) -> None: ...


class KeyReservation:
    """One entry's keyed messages: versions given under the offset lock (:meth:`__call__`),
    visible once the entry is durable (:meth:`confirmed`) or withdrawn (:meth:`failed`)."""

    __slots__ = ("_expected", "_keys", "condition", "dcb", "first_offset", "keyed", "message_count", "position",
                 "versions")

    def __init__(self, keys: PartitionKeys, keyed: list[tuple[int, IndexKey]], message_count: int,
                 expected: Mapping[str, ExpectedVersion] | None, dcb: Sequence[frozenset[bytes]] = (),
                 condition: DcbCondition | None = None) -> None:
        self._keys = keys
        self.keyed = keyed
        """(batch index, stream) of every keyed message, in batch order, then (batch index,
        derived stream) of every DCB event (``derived.py``)."""
        self.message_count = message_count
        self._expected = expected
        self.dcb = dcb
        """Each message's derived streams (empty: no message is a DCB event)."""
        self.condition = condition
        self.versions: list[int] = []
        """The version of each keyed message (parallel to ``keyed``), once reserved."""
        self.first_offset = -1
        self.position: Position | None = None

    def __call__(self, first_offset: int) -> None:
        """Under the managed ledger's offset lock: check the expectations, number the messages."""
        self._keys._reserve(self, first_offset)

    def confirmed(self, position: Position) -> None:
        self._keys._confirm(self, position)

    def failed(self) -> None:
        self._keys._withdraw(self)

    def message_versions(self) -> tuple[int | None, ...]:
        """The version of every message of the entry (None for a keyless one); empty when the
        entry has no keyed message (a DCB event's derived streams are no key's)."""
        out: list[int | None] = [None] * self.message_count
        keyed = False
        for (index, key), version in zip(self.keyed, self.versions, strict=True):
            if type(key) is str:
                out[index] = version
                keyed = True
        return tuple(out) if keyed else ()


class PartitionKeys:
    """The event streams of one topic partition. Created, and opened, by :meth:`KeyIndex.partition`."""

    def __init__(self, index: IndexHost, name: str, ml: ManagedLedger) -> None:
        self._index = index
        self.name = name
        self.ml = ml
        self._lock = threading.Lock()
        """Guards the tail and the segment list (taken under the managed ledger's offset lock:
        held only briefly, never across a ledger read)."""
        self._durable = SegmentSet(index, name, ml.incarnation, lambda: ml.config.quorum, self._lock)
        """The record and the segments it names."""
        self._writing = threading.Lock()
        """One writer of this partition's segments and record at a time (checkpoints, compactions)."""
        self._pending: deque[KeyReservation] = deque()
        """Reserved entries not yet in a segment, in offset order."""
        self._tail: dict[IndexKey, deque[tuple[int, KeyReservation, int]]] = {}
        """Per key, its versions not yet in a segment: (version, reservation, batch index)."""
        self._pending_rows = 0
        self._heads: OrderedDict[IndexKey, Head | None] = OrderedDict()
        """Each key's last row in the segments (None: it has none), least recently used first."""
        self._listeners: list[Callable[[], None]] = []
        self.durable_watermark = 0
        """The record's ``indexedTo``: the managed ledger trims no further."""
        self._checkpointed_s = time.monotonic()
        self.dropped = False
        self.taken_over = False

    # --- the write path ---------------------------------------------------------------------
    def reservation_of_keys(self, keys: Sequence[str | None],
                            expected: Mapping[str, ExpectedVersion] | None = None,
                            dcb: Sequence[frozenset[bytes]] = (),
                            condition: DcbCondition | None = None) -> KeyReservation | None:
        """What an entry whose messages have ``keys`` (None: no key) and derived streams ``dcb``
        needs from the index (None: nothing: no key, no DCB event, no condition, and no earlier
        reservation can be outstanding). Call with the topic's publish lock held, so
        reservations are made in append order."""
        if not expected and condition is None and not dcb and not self._pending and keys.count(None) == len(keys):
            return None
        return KeyReservation(self, _keyed([(i, check_key(key)) for i, key in enumerate(keys) if key is not None],
                                           dcb), len(keys), expected, dcb, condition)

    def prefetch_heads(self, keys: Iterable[IndexKey | None]) -> None:
        """Read the stored heads of ``keys`` into the cache (outside every lock), so numbering
        them under the offset lock never waits for a segment read. One pass under the lock finds
        the keys neither in the tail nor cached; only those are read."""
        with self._lock:
            missing = {key for key in keys if key is not None and key not in self._tail and key not in self._heads}
            segments = list(self._durable.segments)
        if not missing:
            return
        found = {key: self._read_head(key, segments) for key in missing}
        with self._lock:
            if segments == self._durable.segments:  # no checkpoint moved them meanwhile
                for key, head in found.items():
                    self._remember_head(key, head)

    def _reserve(self, reservation: KeyReservation, first_offset: int, *, replaying: bool = False) -> None:
        with self._lock:
            self._forget_failed_from(first_offset)
            current = self._check(reservation._expected) if reservation._expected else {}
            if reservation.condition is not None:
                self._check_condition(reservation.condition, first_offset)
            if not reservation.keyed:
                return
            if not replaying and len(reservation.keyed) > KEY_INDEX_ENTRY_ROWS_MAX:
                raise InvalidRequest(f"one entry of {self.ml.display_name} may carry at most "
                                     f"{KEY_INDEX_ENTRY_ROWS_MAX} keyed messages and DCB index rows, "
                                     f"not {len(reservation.keyed)}")
            if self._pending_rows + len(reservation.keyed) > PENDING_ROWS_MAX:
                raise KeyIndexBusy(f"the key index of {self.ml.display_name} is {self._pending_rows} versions "
                                   "behind; retry shortly")
            reservation.first_offset = first_offset
            versions = reservation.versions
            for index, key in reservation.keyed:
                tail = self._tail.get(key)
                if tail:
                    version = tail[-1][0] + 1
                else:
                    latest = current.get(key) if type(key) is str else None
                    if latest is None:
                        head = self._stored_head_locked(key)
                        latest = -1 if head is None else head[0]
                    version = latest + 1
                    if tail is None:
                        tail = self._tail[key] = deque()
                tail.append((version, reservation, index))
                versions.append(version)
            self._pending.append(reservation)
            self._pending_rows += len(versions)

    def _check(self, expected: Mapping[str, ExpectedVersion]) -> dict[str, int]:
        """Each expected key's latest version (``KeyVersionMismatch`` unless all are as expected)."""
        current: dict[str, int] = {}
        met = True
        for key, wanted in expected.items():  # one pass: this runs per key under the publish lock
            version = current[key] = self._assigned_version(key)
            if version != wanted and (wanted != EXISTS or version < 0):
                met = False
        if not met:
            self._index.mismatches += 1
            wrong = ", ".join(f"{k!r} is at {current[k]}, not {expected[k]}" for k in list(expected)[:5]
                              if not _meets(current[k], expected[k]))
            raise KeyVersionMismatch(f"key version mismatch on {self.ml.display_name}: {wrong}",
                                     current_key_versions=current)
        return current

    def _check_condition(self, condition: DcbCondition, first_offset: int) -> None:
        """(With the lock, under the offset lock.) ``DcbConditionFailed`` when an event matching
        the condition lies at or after its offset: in the tail (in flight or confirmed), or any
        event at all (the one at that offset) for an item matching every event. The segments
        were checked before the lock; ``DcbIndexMoved`` when a checkpoint replaced them since."""
        if condition.segments != self._durable.segments:
            raise DcbIndexMoved(f"the key index of {self.ml.display_name} was checkpointed while the condition "
                                "was checked; check it again")
        found = [(condition.after if first_offset > condition.after else None) if item.matches_all
                 else self._tail_match(item, condition.after) for item in condition.items]
        first = min((offset for offset in found if offset is not None), default=None)
        if first is not None:
            raise DcbConditionFailed(f"the event at position {first + 1} of {self.ml.display_name} matches the "
                                     f"append's condition (after position {condition.after})", position=first + 1)

    def _tail_match(self, item: DcbItem, after: int) -> int | None:
        """(With the lock.) The offset of the first event of the tail at or after offset ``after`` matching
        ``item``, read from its rarest derived stream's tail (a tagged item), or from each of its
        types' (None: no such event)."""
        tails = self._tail
        sources = [min(item.tags, key=lambda k: len(tails.get(k, ())))] if item.tags else list(item.types)
        first: int | None = None
        for key in sources:
            for _, reservation, index in reversed(tails.get(key, ())):  # newest first, down to ``after``
                offset = reservation.first_offset + index
                if offset < after:
                    break
                if item.matches(reservation.dcb[index]) and (first is None or offset < first):
                    first = offset
        return first

    def _assigned_version(self, key: str) -> int:
        """The key's latest version, counting appends still in flight (call with the lock)."""
        tail = self._tail.get(key)
        if tail:
            return tail[-1][0]
        head = self._stored_head_locked(key)
        return -1 if head is None else head[0]

    def _forget_failed_from(self, first_offset: int) -> None:
        """Offsets at or above ``first_offset`` are being given out again: the managed ledger
        went back to its confirmed end after a failed add, so every reservation still pending
        there failed (its ``failed`` call may simply not have arrived yet)."""
        while self._pending and self._pending[-1].position is None and self._pending[-1].first_offset >= first_offset:
            self._remove_last(self._pending[-1])

    def _remove_last(self, reservation: KeyReservation) -> None:
        """Withdraw ``reservation``, the last pending one of its keys (call with the lock)."""
        self._pending.remove(reservation)
        for index, key in reversed(reservation.keyed):
            tail = self._tail[key]
            if tail[-1][1] is reservation:
                tail.pop()
            else:  # not reached while failures follow append order; kept exact all the same
                tail.remove(next(row for row in tail if row[1] is reservation and row[2] == index))
            if not tail:
                del self._tail[key]
        self._pending_rows -= len(reservation.versions)

    def _confirm(self, reservation: KeyReservation, position: Position) -> None:
        if not reservation.versions:
            return
        reservation.position = position
        if self._pending_rows >= KEY_INDEX_CHECKPOINT_ROWS:
            self._index.wake(self)
        for listener in list(self._listeners):
            listener()

    def _withdraw(self, reservation: KeyReservation) -> None:
        with self._lock:
            if reservation.position is None and reservation in self._pending:
                failed_from = self._pending.index(reservation)
                for later in list(self._pending)[failed_from:][::-1]:  # later ones failed with it
                    if later.position is None:
                        self._remove_last(later)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the confirming thread; it must only schedule work) whenever
        keyed messages become readable."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # --- heads ------------------------------------------------------------------------------
    def _stored_head_locked(self, key: IndexKey) -> Head | None:
        """The key's last row in the segments (call with the lock; a miss reads a segment)."""
        heads = self._heads
        if key in heads:
            heads.move_to_end(key)
            return heads[key]
        head = self._read_head(key, self._durable.segments)
        self._remember_head(key, head)
        return head

    def _stored_head(self, key: IndexKey) -> Head | None:
        with self._lock:
            if key in self._heads:
                self._heads.move_to_end(key)
                return self._heads[key]
            segments = list(self._durable.segments)
        head = self._read_head(key, segments)
        with self._lock:
            if segments == self._durable.segments:  # no checkpoint moved it meanwhile
                self._remember_head(key, head)
        return head

    @staticmethod
    def _read_head(key: IndexKey, segments: list[tuple[SegmentInfo, Segment]]) -> Head | None:
        raw = key_bytes(key)
        for _, segment in reversed(segments):
            row = segment.last_row(raw)
            if row is not None:
                return row[1], row[2]
        return None

    def _remember_head(self, key: IndexKey, head: Head | None) -> None:
        heads = self._heads
        heads[key] = head
        heads.move_to_end(key)
        while len(heads) > KEY_HEADS_CACHED_MAX:
            heads.popitem(last=False)

    def head(self, key: IndexKey) -> Head | None:
        """The key's last readable (durable) version and its offset; None: no message."""
        with self._lock:
            for version, reservation, index in reversed(self._tail.get(key, ())):
                if reservation.position is not None:
                    return version, reservation.first_offset + index
        return self._stored_head(key)

    # --- reading ----------------------------------------------------------------------------
    def _snapshot(self, key: IndexKey) -> tuple[list[tuple[SegmentInfo, Segment]], list[StreamRow]]:
        """(the segments, the key's readable tail rows) as one consistent view."""
        with self._lock:
            tail = [StreamRow(version, r.first_offset + index, r.position)
                    for version, r, index in self._tail.get(key, ()) if r.position is not None]
            return list(self._durable.segments), tail

    def rows(self, key: IndexKey, first_version: int, last_version: int) -> list[StreamRow]:
        """The readable rows of versions ``first_version..last_version`` (ascending; versions
        beyond the head are simply absent). Rows whose entries retention trimmed but which no
        compaction dropped yet are included: the caller compares offsets."""
        if first_version > last_version:
            return []
        segments, tail = self._snapshot(key)
        raw = key_bytes(key)
        rows: list[StreamRow] = []
        upper = tail[0].version if tail else last_version + 1
        for _, segment in segments:
            rows.extend(row_of(r) for r in segment.rows(raw, first_version, min(last_version, upper - 1)))
        return rows + [r for r in tail if first_version <= r.version <= last_version]

    def readable_end(self, confirmed_end: int) -> int:
        """The offset before which every entry's rows are readable: ``confirmed_end`` (the
        managed ledger's confirmed end, read first), or the first offset of the oldest entry
        the managed ledger confirmed but whose rows are not confirmed here yet, if smaller. A
        reader that reports how far it looked never claims an entry whose rows it could not see."""
        with self._lock:
            unconfirmed = [r.first_offset for r in self._pending if r.position is None]
        return min([confirmed_end, *unconfirmed])

    def first_row_at_or_after(self, key: IndexKey, offset: int) -> StreamRow | None:
        """The first readable row of ``key`` whose offset is ``>= offset`` (the first version
        retention kept, when ``offset`` is the partition's first offset)."""
        segments, tail = self._snapshot(key)
        raw = key_bytes(key)
        for info, segment in segments:
            if info.to_offset <= offset:
                continue
            for row in segment.rows(raw, 0, 1 << 64):
                if row[2] >= offset:
                    return row_of(row)
        return next((r for r in tail if r.offset >= offset), None)

    def durable_segments(self) -> list[tuple[SegmentInfo, Segment]]:
        """The segments as they stand (what a DCB condition checks before the offset lock)."""
        with self._lock:
            return list(self._durable.segments)

    def rows_from_offset(self, key: IndexKey, offset: int, max_rows: int,
                         segments: list[tuple[SegmentInfo, Segment]] | None = None) -> list[StreamRow]:
        """Up to ``max_rows`` readable rows of ``key`` whose offsets are ``>= offset``, ascending,
        found by bisecting each segment that covers offsets after ``offset`` (never a read of
        the rows before it). With ``segments``: only their rows (a DCB condition's first check)."""
        durable, tail = self._snapshot(key)
        if segments is not None:
            durable, tail = segments, []
        raw = key_bytes(key)
        upper = tail[0].version if tail else 1 << 64
        found: list[StreamRow] = []
        for info, segment in durable:
            if info.to_offset <= offset or len(found) >= max_rows:
                continue
            found.extend(row_of(r) for r in segment.rows_from_offset(raw, offset, max_rows - len(found))
                         if r[1] < upper)
        found.extend(r for r in tail if r.offset >= offset)
        del found[max_rows:]
        self._index.dcb_rows_read += len(found)
        return found

    def count_dcb_entries_read(self, entries: int) -> None:
        """Count entries a DCB read or condition read to see the events its rows name."""
        self._index.dcb_entries_read += entries

    def versions_of_entry(self, first_offset: int) -> dict[int, int] | None:
        """{batch index: version} of the keyed messages of the entry starting at ``first_offset``
        (None when the index has no record of that entry)."""
        with self._lock:
            for reservation in self._pending:
                if reservation.first_offset == first_offset and reservation.position is not None:
                    return {index: version for (index, key), version in zip(reservation.keyed, reservation.versions,
                                                                              strict=True) if type(key) is str}
        try:
            position, _ = self.ml.offset_to_position(first_offset)
            entry = self.ml.read_entry(position)
        except MagnetarError:
            return None
        found: dict[int, int] = {}
        for index, message in enumerate(decode_entry(entry.data).messages):
            if message.key is None:
                continue
            row = self._row_at(message.key, first_offset + index)
            if row is None:
                return None
            found[index] = row.version
        return found

    def _row_at(self, key: IndexKey, offset: int) -> StreamRow | None:
        segments, tail = self._snapshot(key)
        raw = key_bytes(key)
        for info, segment in segments:
            if info.from_offset <= offset < info.to_offset:
                for row in segment.rows(raw, 0, 1 << 64):
                    if row[2] == offset:
                        return row_of(row)
        return next((r for r in tail if r.offset == offset), None)

    def entry_ending_at(self, end_offset: int, count: int) -> tuple[Position, int, int, tuple[int | None, ...]] | None:
        """(position, first offset, publish time, message versions) of the stored entry of
        ``count`` messages whose last offset is ``end_offset - 1``; None if there is none."""
        try:
            position, _ = self.ml.offset_to_position(end_offset - 1)
            entry = self.ml.read_entry(position)
        except MagnetarError:
            return None
        if entry.message_count != count or entry.last_offset != end_offset - 1:
            return None
        versions = self.versions_of_entry(entry.first_offset)
        by_index = tuple(versions.get(i) for i in range(count)) if versions else ()
        return position, entry.first_offset, entry.publish_time_ms, by_index

    # --- opening ----------------------------------------------------------------------------
    def open(self, entries_from: Callable[[int], Iterator[Entry]]) -> int:
        """Load the checkpoint (or find it unusable and start over) and number the entries after
        it; the number of entries read again."""
        end = self.ml.confirmed_next_offset()
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            try:
                why = self._durable.load(self.ml.incarnation, end)
                break
            except BadVersion:  # the last owner's late checkpoint landed meanwhile: read it again
                if attempt == OPEN_ATTEMPTS:
                    raise
        if why:
            log.warning("the key index of %s is not used: %s; rebuilding it from the entries retention kept",
                        self.ml.display_name, why)
        indexed_to = self.durable_watermark = self._durable.indexed_to
        start = max(indexed_to, self.ml.first_offset)
        if start > indexed_to and indexed_to < end:
            log.warning("entries %d..%d of %s were trimmed before the key index held them: the versions of their "
                        "keys continue from what the index holds", indexed_to, start - 1, self.ml.display_name)
        read = self._replay(entries_from, start, end) if start < end else 0
        self._index.entries_replayed += read
        return read

    def _replay(self, entries_from: Callable[[int], Iterator[Entry]], start: int, end: int) -> int:
        """Number the keyed messages of the entries ``start..end`` as appends would have, as
        confirmed reservations (the next checkpoint writes them)."""
        read = 0
        for entry in entries_from(start):
            if entry.first_offset >= end:
                break
            if self._pending_rows >= KEY_INDEX_CHECKPOINT_ROWS:  # the tail stays bounded however much is read again
                self.checkpoint(upto=entry.first_offset)
            read += 1
            keys: list[str | None] = []
            properties: list[Mapping[str, str]] = []
            for message in decode_entry(entry.data).messages:
                offset = entry.first_offset if message.offset is None else message.offset
                keys.append(message.key if offset >= start else None)
                properties.append(message.properties if offset >= start else {})
            dcb = keys_of_messages(properties)
            if keys.count(None) == len(keys) and not dcb:
                continue
            reservation = KeyReservation(self, _keyed([(i, k) for i, k in enumerate(keys) if k is not None], dcb),
                                         len(keys), None, dcb)
            if self._pending_rows + len(reservation.keyed) > PENDING_ROWS_MAX:  # never refused on replay
                self.checkpoint(upto=entry.first_offset)
            self._reserve(reservation, entry.first_offset, replaying=True)
            reservation.position = entry.position
        return read

    # --- checkpoints ------------------------------------------------------------------------
    def checkpoint_due(self, now_s: float) -> bool:
        """Whether the tail is full enough, or old enough, for a checkpoint now."""
        if self._pending_rows >= KEY_INDEX_CHECKPOINT_ROWS:
            return True
        if now_s - self._checkpointed_s < KEY_INDEX_CHECKPOINT_INTERVAL_S:
            return False
        return bool(self._pending) or self.ml.confirmed_next_offset() > self._durable.indexed_to

    def checkpoint(self, *, upto: int | None = None) -> int:
        """Write the confirmed rows at the head of the tail as a segment and record it, with the
        index covering the topic as far as nothing keyed is unconfirmed (and no further than
        ``upto``, while entries are read again on open); the rows written."""
        with self._writing:
            if self.dropped or self.taken_over:
                return 0
            end = self.ml.confirmed_next_offset()  # read before the tail: every keyed entry below it is there
            with self._lock:
                batch: list[KeyReservation] = []
                stop: int | None = None
                for reservation in self._pending:
                    if reservation.position is None:
                        stop = reservation.first_offset
                        break
                    batch.append(reservation)
            # a row confirmed after ``end`` was read is in the batch: the record must cover it,
            # or the next opening numbers its entry again
            covered = batch[-1].first_offset + batch[-1].message_count if batch else 0
            indexed_to = max(end, covered)
            if stop is not None:  # never past a keyed entry not yet durable, nor a keyless one (``end``)
                indexed_to = min(indexed_to, stop)
            if upto is not None:
                indexed_to = min(indexed_to, upto)
            self._checkpointed_s = time.monotonic()
            if not batch and indexed_to <= self._durable.indexed_to:
                return 0
            rows = sorted((key_bytes(key), version, r.first_offset + index, r.position.ledger_id,
                           r.position.entry_id)
                          for r in batch if r.position is not None
                          for (index, key), version in zip(r.keyed, r.versions, strict=True))
            try:
                self._commit(rows, batch[0].first_offset if batch else indexed_to, indexed_to)
            except BadVersion:
                self._taken_over_by_another()
                return 0
            with self._lock:
                for reservation in batch:
                    self._pending.popleft()
                    for (index, key), version in zip(reservation.keyed, reservation.versions, strict=True):
                        tail = self._tail[key]
                        tail.popleft()
                        self._remember_head(key, (version, reservation.first_offset + index))
                        if not tail:
                            del self._tail[key]
                    self._pending_rows -= len(reservation.versions)
            self._index.rows_indexed += len(rows)
            self._index.checkpoints += 1
            if len(self._durable.segments) > KEY_INDEX_SEGMENTS_MAX:
                self._compact()
            return len(rows)

    def advance_for_trim(self) -> None:
        """Before trimming: when the record lags behind the current ledger, checkpoint now (the
        confirmed rows as a segment, or only the record for keyless appends), so retention is
        not held back until the next timed checkpoint. At most once per ledger rollover."""
        infos = self.ml.ledger_infos()
        if len(infos) > 1 and self._durable.indexed_to < infos[-1].first_offset:
            try:
                self.checkpoint()
            except MagnetarError as exc:  # trimming waits for the next checkpoint instead
                log.warning("the key index record of %s could not be advanced: %s", self.ml.display_name, exc)

    def _commit(self, rows: list[Row], from_offset: int, indexed_to: int) -> None:
        self._durable.commit(rows, from_offset, indexed_to)
        self.durable_watermark = self._durable.indexed_to

    def _compact(self) -> None:
        """(With ``_writing``.) Merge the segments, dropping the rows of trimmed entries."""
        try:
            dropped = self._durable.compact(self.ml.first_offset)
        except BadVersion:
            self._taken_over_by_another()
            return
        self._index.rows_cleaned += dropped
        self._index.compactions += 1

    def cleanup(self) -> int:
        """Compact the segments once retention trimmed ``CLEANUP_SHARE`` of what they cover
        since the last compaction: the rows dropped."""
        with self._writing:
            if self.dropped or self.taken_over or not self._durable.cleanup_due(self.ml.first_offset, CLEANUP_SHARE):
                return 0
            cleaned = self._index.rows_cleaned
            self._compact()
            return self._index.rows_cleaned - cleaned

    def _taken_over_by_another(self) -> None:
        log.warning("the key index record of %s was changed by another broker: it serves the topic now; this "
                    "broker writes no more of its index", self.ml.display_name)
        self.taken_over = True

    def drop(self) -> None:
        """Delete the index: its segments and its record (its topic is deleted)."""
        with self._writing:
            self.dropped = True
            self._durable.drop()

    def pending_rows(self) -> int:
        return self._pending_rows

    def segments(self) -> int:
        return len(self._durable.segments)


def _keyed(keyed: list[tuple[int, IndexKey]], dcb: Sequence[frozenset[bytes]]) -> list[tuple[int, IndexKey]]:
    """An entry's streams: its keyed messages', then each DCB event's derived ones (in a fixed
    order, so an entry read again on open numbers them as its append did)."""
    for index, derived in enumerate(dcb):
        keyed.extend((index, key) for key in sorted(derived))
    return keyed


def _meets(current: int, expected: ExpectedVersion) -> bool:
    return current >= 0 if expected == EXISTS else current == expected

