"""The key index: per topic partition, key → version → offset (and the entry holding it), in RocksDB.

Role: an *event stream* is the messages with one key in one partition; its *version* is the
0-based number of the key's message (-1: the key has none). This module numbers keyed
messages as they are appended, checks what a conditional append expects of its keys, and keeps
``(partition, key, version) → (offset, ledger, entry)`` so that one key's events are read
without scanning the partition (``broker/event_streams.py``).

Write path. ``PartitionKeys.reservation`` prepares one entry's keyed messages; the managed
ledger calls it under the lock that assigns offsets (``ManagedLedger.add_entry``'s
``on_offsets``): there it checks the expected versions (``KeyVersionMismatch``: nothing
written) and gives each keyed message the next version of its key. Those versions live in
memory (the *tail*) until the entry is durable (``confirmed``: readers see it from then on) or
has failed (``failed``: withdrawn, so versions stay dense). A background thread writes
confirmed entries to RocksDB in batches of up to ``INDEX_BATCH_ROWS_MAX`` rows, off the
publish path: under the offset lock only dictionary work happens, never a RocksDB write.

RocksDB layout (one instance per broker, ``{data_dir}/key-index``; integers big-endian)::

    "C"                                   → next partition id u32
    "T" name                              → partition id u32
    "S" id                                → [indexed-to offset u64][cleaned-below offset u64]
    "H" id key                            → [version u64][offset u64]        the key's head
    "V" id [len u16] key [version u64]    → [offset u64][ledger u64][entry u64]
    "E" id [first offset u64]             → the entry's (batch index, version, key) triples

Recovery. Rows and the ``S`` watermark ("every keyed message below this offset is indexed")
are written in one batch, so the index is always a consistent prefix; on open the entries after
the watermark are read from the managed ledger and indexed again, so after ``kill -9`` every
acknowledged append has its version and the next append sees the right head. Batches are not
synced (a lost suffix is rebuilt the same way); ``sync`` syncs the write-ahead log before
trimming, and trimming keeps every ledger above the durable watermark, so entries are never
deleted before their versions are durable. An index whose watermark lies beyond the partition's
end belongs to a deleted topic of the same name and is dropped.

Trimming. Retention deletes whole ledgers; their rows are deleted afterwards (``cleanup``, via
the ``E`` rows), but each key's ``H`` row stays: versions are never renumbered, trimmed ones
read as ``DataLost``.

Invariants: a key's versions are dense and in offset order; a version, once acknowledged, never
changes; the tail holds at most ``PENDING_ROWS_MAX`` rows (beyond, appends are refused with the
retriable ``KeyIndexBusy``); keys are at most ``KEY_BYTES_MAX`` bytes.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rocksdict import Rdict, WriteBatch

from broker.entry_format import Message, decode_entry
from broker.errors import KeyIndexBusy, KeyVersionMismatch, MagnetarError
from broker.message_fields import EXISTS, ExpectedVersion, check_key
from broker.message_id import Position
from storage import iterate_prefix, open_rdict

if TYPE_CHECKING:
    from broker.managed_ledger import Entry, ManagedLedger

log = logging.getLogger(__name__)

INDEX_BATCH_ROWS_MAX = 10_000
"""Rows the indexer writes in one RocksDB batch (rocksdict holds the interpreter lock while it
writes, so batches stay bounded)."""
PENDING_ROWS_MAX = 1_000_000
"""Versions assigned but not yet in RocksDB, per partition, before appends are refused."""
HEADS_CACHED_MAX = 100_000
"""Keys whose indexed head each partition keeps in memory (least recently used go first)."""
INDEXER_IDLE_WAIT_S = 1.0
REBUILD_STEP_ENTRIES = 1000

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_HEAD = struct.Struct(">QQ")
_ROW = struct.Struct(">QQQ")
_STATE = struct.Struct(">QQ")
_TRIPLE = struct.Struct(">IQH")
_NEXT_ID = b"C"

Head = tuple[int, int]
"""A key's (version, offset)."""


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One version of a stream: the message's offset and the entry holding it."""

    version: int
    offset: int
    position: Position


@dataclass(frozen=True)
class KeyIndexStats:
    partitions: int
    pending_rows: int
    """Versions assigned and not yet written to RocksDB (all partitions)."""
    rows_indexed: int
    batches_written: int
    entries_rebuilt: int
    """Entries read again on open because they were after the index's watermark."""
    version_mismatches: int
    rows_cleaned: int
    """Rows deleted after retention trimmed their entries."""
    syncs: int


def _key_bytes(key: str) -> bytes:
    return key.encode(errors="surrogatepass")


class KeyReservation:
    """One entry's keyed messages: versions given under the offset lock (:meth:`__call__`),
    visible once the entry is durable (:meth:`confirmed`) or withdrawn (:meth:`failed`)."""

    __slots__ = ("_expected", "_keys", "first_offset", "keyed", "message_count", "position", "versions")

    def __init__(self, keys: PartitionKeys, keyed: list[tuple[int, str]], message_count: int,
                 expected: Mapping[str, ExpectedVersion] | None) -> None:
        self._keys = keys
        self.keyed = keyed
        """(batch index, key) of every keyed message, in batch order."""
        self.message_count = message_count
        self._expected = expected
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
        entry has no keyed message."""
        if not self.keyed:
            return ()
        out: list[int | None] = [None] * self.message_count
        for (index, _), version in zip(self.keyed, self.versions, strict=True):
            out[index] = version
        return tuple(out)


class PartitionKeys:
    """The event streams of one topic partition. Created by :meth:`KeyIndex.partition`."""

    def __init__(self, index: KeyIndex, pid: int, name: str, ml: ManagedLedger) -> None:
        self._index = index
        self._db = index.db
        self.name = name
        self.ml = ml
        self._pid = _U32.pack(pid)
        self._lock = threading.Lock()
        """Guards the tail (taken under the managed ledger's offset lock: held only briefly)."""
        self._writing = threading.Lock()
        """One writer of this partition's rows and state at a time (indexer, maintenance, close)."""
        self._pending: deque[KeyReservation] = deque()
        """Reserved entries not yet in RocksDB, in offset order."""
        self._tail: dict[str, deque[tuple[int, KeyReservation, int]]] = {}
        """Per key, its versions not yet in RocksDB: (version, reservation, batch index)."""
        self._pending_rows = 0
        self._heads: OrderedDict[str, Head | None] = OrderedDict()
        self._listeners: list[Callable[[], None]] = []
        self.watermark, self.cleaned_below = self._load_state()
        self.durable_watermark = self.watermark
        self.dropped = False

    # --- keys of RocksDB ------------------------------------------------------------------
    def _state_key(self) -> bytes:
        return b"S" + self._pid

    def _head_key(self, key: str) -> bytes:
        return b"H" + self._pid + _key_bytes(key)

    def _row_prefix(self, key: str) -> bytes:
        raw = _key_bytes(key)
        return b"V" + self._pid + _U16.pack(len(raw)) + raw

    def _entry_key(self, first_offset: int) -> bytes:
        return b"E" + self._pid + _U64.pack(first_offset)

    def _load_state(self) -> tuple[int, int]:
        raw = self._db.get(self._state_key())
        return (0, 0) if raw is None else _STATE.unpack(raw)

    # --- the write path ---------------------------------------------------------------------
    def reservation(self, messages: Sequence[Message],
                    expected: Mapping[str, ExpectedVersion] | None = None) -> KeyReservation | None:
        """What the entry of ``messages`` needs from the index (None: nothing, it has no key,
        expects nothing, and no earlier reservation can be outstanding). Call with the topic's
        publish lock held, so reservations are made in append order."""
        return self.reservation_of_keys([m.key for m in messages], expected)

    def reservation_of_keys(self, keys: Sequence[str | None],
                            expected: Mapping[str, ExpectedVersion] | None = None) -> KeyReservation | None:
        """:meth:`reservation` for an entry whose messages have ``keys`` (None: no key)."""
        if not expected and not self._pending and keys.count(None) == len(keys):
            return None
        keyed = [(i, check_key(key)) for i, key in enumerate(keys) if key is not None]
        return KeyReservation(self, keyed, len(keys), expected)

    def _reserve(self, reservation: KeyReservation, first_offset: int) -> None:
        with self._lock:
            self._forget_failed_from(first_offset)
            current = self._check(reservation._expected) if reservation._expected else {}
            if not reservation.keyed:
                return
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
                    latest = current.get(key)
                    if latest is None:
                        head = self._indexed_head(key)
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

    def _assigned_version(self, key: str) -> int:
        """The key's latest version, counting appends still in flight (call with the lock)."""
        tail = self._tail.get(key)
        if tail:
            return tail[-1][0]
        head = self._indexed_head(key)
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

    # --- heads ----------------------------------------------------------------------------
    def _indexed_head(self, key: str) -> Head | None:
        """The key's head as RocksDB has it (cached; call with the lock)."""
        heads = self._heads
        if key in heads:
            heads.move_to_end(key)
            return heads[key]
        raw = self._db.get(self._head_key(key))
        head: Head | None = None if raw is None else _HEAD.unpack(raw)
        heads[key] = head
        if len(heads) > HEADS_CACHED_MAX:
            heads.popitem(last=False)
        return head

    def head(self, key: str) -> Head | None:
        """The key's last readable (durable) version and its offset; None: no message."""
        with self._lock:
            for version, reservation, index in reversed(self._tail.get(key, ())):
                if reservation.position is not None:
                    return version, reservation.first_offset + index
            return self._indexed_head(key)

    def versions_of_entry(self, first_offset: int) -> dict[int, int] | None:
        """{batch index: version} of the keyed messages of the entry starting at ``first_offset``
        (None when the index has no record of that entry)."""
        with self._lock:
            for reservation in self._pending:
                if reservation.first_offset == first_offset and reservation.position is not None:
                    return {index: version for (index, _), version in zip(reservation.keyed, reservation.versions,
                                                                            strict=True)}
        raw = self._db.get(self._entry_key(first_offset))
        return None if raw is None else {index: version for index, version, _ in _unpack_triples(raw)}

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

    # --- reading ----------------------------------------------------------------------------
    def rows(self, key: str, first_version: int, last_version: int) -> list[StreamRow]:
        """The readable rows of versions ``first_version..last_version`` (ascending; versions
        beyond the head are simply absent). Rows whose entries retention trimmed but whose
        rows are not yet cleaned up are included: the caller compares offsets."""
        if first_version > last_version:
            return []
        with self._lock:  # the tail first: rows it hands to RocksDB meanwhile are then found there
            tail = [StreamRow(version, r.first_offset + index, r.position)
                    for version, r, index in self._tail.get(key, ())
                    if r.position is not None and first_version <= version <= last_version]
        rows: list[StreamRow] = []
        prefix = self._row_prefix(key)
        upper = tail[0].version if tail else last_version + 1
        for raw_key, value in iterate_prefix(self._db, prefix, prefix + _U64.pack(first_version)):
            version = _U64.unpack_from(raw_key, len(prefix))[0]
            if version >= upper or version > last_version:
                break
            offset, ledger_id, entry_id = _ROW.unpack(value)
            rows.append(StreamRow(version, offset, Position(ledger_id, entry_id)))
        return rows + tail

    def first_row_at_or_after(self, key: str, offset: int) -> StreamRow | None:
        """The first readable row of ``key`` whose offset is ``>= offset`` (the first version
        retention kept, when ``offset`` is the partition's first offset)."""
        prefix = self._row_prefix(key)
        for raw_key, value in iterate_prefix(self._db, prefix):
            row_offset, ledger_id, entry_id = _ROW.unpack(value)
            if row_offset >= offset:
                return StreamRow(_U64.unpack_from(raw_key, len(prefix))[0], row_offset, Position(ledger_id, entry_id))
        with self._lock:
            for version, r, index in self._tail.get(key, ()):
                if r.position is not None and r.first_offset + index >= offset:
                    return StreamRow(version, r.first_offset + index, r.position)
        return None

    # --- indexing (the indexer thread) --------------------------------------------------------
    def index_confirmed(self) -> int:
        """Write the confirmed reservations at the head of the tail to RocksDB (up to
        ``INDEX_BATCH_ROWS_MAX`` rows); the rows written."""
        with self._writing:
            return 0 if self.dropped else self._index_confirmed()

    def _index_confirmed(self) -> int:
        with self._lock:
            batch: list[KeyReservation] = []
            rows = 0
            for reservation in self._pending:
                if reservation.position is None or rows >= INDEX_BATCH_ROWS_MAX:
                    break
                batch.append(reservation)
                rows += len(reservation.versions)
        if not batch:
            return 0
        last = batch[-1]
        self._write([(r.first_offset, r.position, [(i, v, k) for (i, k), v in zip(r.keyed, r.versions, strict=True)])
                     for r in batch if r.position is not None], last.first_offset + last.message_count)
        with self._lock:
            for reservation in batch:
                self._pending.popleft()
                for _, key in reservation.keyed:
                    tail = self._tail[key]
                    version, _, index = tail.popleft()
                    self._heads[key] = (version, reservation.first_offset + index)
                    self._heads.move_to_end(key)
                    if not tail:
                        del self._tail[key]
                self._pending_rows -= len(reservation.versions)
            while len(self._heads) > HEADS_CACHED_MAX:
                self._heads.popitem(last=False)
        return rows

    def _write(self, entries: Iterable[tuple[int, Position, list[tuple[int, int, str]]]], watermark: int) -> None:
        """One batch: the rows of ``entries`` ((first offset, position, [(batch index, version,
        key)])), their ``E`` rows, the heads they move, and the new watermark."""
        batch = WriteBatch(raw_mode=True)
        heads: dict[str, Head] = {}
        rows = 0
        for first_offset, position, triples in entries:
            for index, version, key in triples:
                offset = first_offset + index
                batch.put(self._row_prefix(key) + _U64.pack(version), _ROW.pack(offset, position.ledger_id,
                                                                                position.entry_id))
                heads[key] = (version, offset)
            batch.put(self._entry_key(first_offset), _pack_triples(triples))
            rows += len(triples)
        for key, head in heads.items():
            batch.put(self._head_key(key), _HEAD.pack(*head))
        self.watermark = max(self.watermark, watermark)
        batch.put(self._state_key(), _STATE.pack(self.watermark, self.cleaned_below))
        self._db.write(batch)
        self._index.rows_indexed += rows
        self._index.batches_written += 1

    # --- recovery -------------------------------------------------------------------------
    def recover(self, entries_from: Callable[[int], Iterator[Entry]]) -> int:
        """Index the entries after the watermark (they were appended, perhaps acknowledged,
        but not indexed when the broker stopped); the number of entries read."""
        end = self.ml.confirmed_next_offset()
        if self.watermark > end:
            log.warning("the key index of %s ends at offset %d, beyond the partition's end %d: it belonged to a "
                        "deleted topic of the same name; rebuilding it", self.ml.display_name, self.watermark, end)
            self._index._delete_partition_rows(self._pid)
            self.watermark = self.cleaned_below = 0
            self._heads.clear()
        start = max(self.watermark, self.ml.first_offset)
        if start > self.watermark and self.watermark < end:
            log.warning("entries %d..%d of %s were trimmed before the key index held them: the versions of their "
                        "keys continue from what the index holds", self.watermark, start - 1, self.ml.display_name)
        read = 0
        pending: list[tuple[int, Position, list[tuple[int, int, str]]]] = []
        counted: dict[str, int] = {}
        for entry in entries_from(start) if start < end else ():
            read += 1
            triples = []
            for message in decode_entry(entry.data).messages:
                offset = entry.first_offset if message.offset is None else message.offset
                if message.key is None or offset < start:
                    continue
                key = message.key
                version = counted.get(key)
                if version is None:
                    head = self._indexed_head(key)
                    version = -1 if head is None else head[0]
                counted[key] = version = version + 1
                triples.append((offset - entry.first_offset, version, key))
            if triples:
                pending.append((entry.first_offset, entry.position, triples))
            if len(pending) >= REBUILD_STEP_ENTRIES:
                self._write(pending, entry.last_offset + 1)
                pending = []
        self._write(pending, end)
        if read:
            self._db.flush_wal(True)
        self._heads.clear()  # rebuilt heads are in RocksDB; the cache refills on use
        self.durable_watermark = self.watermark
        self._index.entries_rebuilt += read
        return read

    # --- maintenance ----------------------------------------------------------------------
    def advance_idle_watermark(self) -> None:
        """With nothing pending, every keyed message below the confirmed end is indexed: move
        the watermark there (keyless appends otherwise leave it behind)."""
        end = self.ml.confirmed_next_offset()
        with self._writing, self._lock:
            if self._pending or end <= self.watermark or self.dropped:
                return
            self.watermark = end
            self._db.put(self._state_key(), _STATE.pack(self.watermark, self.cleaned_below))

    def cleanup(self) -> int:
        """Delete the rows of entries retention trimmed (below the partition's first offset);
        heads stay. The rows deleted."""
        with self._writing:
            return self._cleanup()

    def _cleanup(self) -> int:
        first = self.ml.first_offset
        if first <= self.cleaned_below or self.dropped:
            return 0
        prefix = b"E" + self._pid
        batch = WriteBatch(raw_mode=True)
        deleted = in_batch = 0
        for raw_key, value in iterate_prefix(self._db, prefix, prefix + _U64.pack(self.cleaned_below)):
            if _U64.unpack_from(raw_key, len(prefix))[0] >= first:
                break
            for _, version, key in _unpack_triples(value):
                batch.delete(self._row_prefix(key) + _U64.pack(version))
                in_batch += 1
            batch.delete(raw_key)
            if in_batch >= INDEX_BATCH_ROWS_MAX:
                self._db.write(batch)
                batch, deleted, in_batch = WriteBatch(raw_mode=True), deleted + in_batch, 0
        self.cleaned_below = first
        batch.put(self._state_key(), _STATE.pack(self.watermark, self.cleaned_below))
        self._db.write(batch)
        deleted += in_batch
        self._index.rows_cleaned += deleted
        return deleted

    def pending_rows(self) -> int:
        return self._pending_rows

    def flush(self) -> None:
        """Index everything confirmed so far, now, and move the watermark as far as it goes."""
        while self.index_confirmed():
            pass
        self.advance_idle_watermark()

    def has_confirmed_pending(self) -> bool:
        with self._lock:
            return bool(self._pending) and self._pending[0].position is not None


def _meets(current: int, expected: ExpectedVersion) -> bool:
    return current >= 0 if expected == EXISTS else current == expected


def _pack_triples(triples: Sequence[tuple[int, int, str]]) -> bytes:
    parts = []
    for index, version, key in triples:
        raw = _key_bytes(key)
        parts.append(_TRIPLE.pack(index, version, len(raw)))
        parts.append(raw)
    return b"".join(parts)


def _unpack_triples(raw: bytes) -> Iterator[tuple[int, int, str]]:
    at = 0
    while at < len(raw):
        index, version, size = _TRIPLE.unpack_from(raw, at)
        at += _TRIPLE.size
        yield index, version, raw[at:at + size].decode(errors="surrogatepass")
        at += size


class KeyIndex:
    """The broker's key index: one RocksDB, one indexer thread, a ``PartitionKeys`` per open
    topic partition."""

    def __init__(self, path: str) -> None:
        self.db: Rdict = open_rdict(path)
        self.db.flush_wal(True)  # what the last run wrote unsynced is durable before trimming relies on it
        self._lock = threading.Lock()
        self._partitions: dict[str, PartitionKeys] = {}
        self._dirty: set[PartitionKeys] = set()
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self.rows_indexed = self.batches_written = self.entries_rebuilt = 0
        self.mismatches = self.rows_cleaned = self.syncs = 0
        self._thread = threading.Thread(target=self._run, name="magnetar-key-index", daemon=True)
        self._thread.start()

    def partition(self, name: str, ml: ManagedLedger, entries_from: Callable[[int], Iterator[Entry]]) -> PartitionKeys:
        """The streams of partition ``name`` (its managed ledger ``ml``), recovered: the entries
        after the index's watermark are indexed before this returns."""
        with self._lock:
            raw = self.db.get(b"T" + name.encode())
            if raw is None:
                pid = _U32.unpack(self.db.get(_NEXT_ID) or _U32.pack(1))[0]
                batch = WriteBatch(raw_mode=True)
                batch.put(b"T" + name.encode(), _U32.pack(pid))
                batch.put(_NEXT_ID, _U32.pack(pid + 1))
                self.db.write(batch)
            else:
                pid = _U32.unpack(raw)[0]
        keys = PartitionKeys(self, pid, name, ml)
        keys.recover(entries_from)
        with self._lock:
            self._partitions[name] = keys
        return keys

    def forget(self, name: str) -> None:
        """Stop indexing partition ``name`` (closed): what is confirmed is written first."""
        with self._lock:
            keys = self._partitions.pop(name, None)
            if keys is not None:
                self._dirty.discard(keys)
        if keys is not None:
            keys.flush()
            keys.dropped = True

    def drop(self, name: str) -> None:
        """Delete partition ``name``'s index (its topic is deleted)."""
        with self._lock:
            keys = self._partitions.pop(name, None)
            if keys is not None:
                self._dirty.discard(keys)
        if keys is not None:
            with keys._writing:  # no batch of it is written after its rows are gone
                keys.dropped = True
        with self._lock:
            raw = self.db.get(b"T" + name.encode())
            if raw is None:
                return
            self._delete_partition_rows(raw)
            self.db.delete(b"T" + name.encode())

    def _delete_partition_rows(self, pid: bytes) -> None:
        upper = _U32.pack(_U32.unpack(pid)[0] + 1)
        batch = WriteBatch(raw_mode=True)
        for kind in (b"S", b"H", b"V", b"E"):
            batch.delete_range(kind + pid, kind + upper)
        self.db.write(batch)

    def wake(self, keys: PartitionKeys) -> None:
        with self._wake:
            if not self._dirty:
                self._wake.notify()
            self._dirty.add(keys)

    def _run(self) -> None:
        """Index dirty partitions until :meth:`close` (which indexes what is left itself)."""
        while True:
            with self._wake:
                while not self._dirty and not self._stopping:
                    self._wake.wait(INDEXER_IDLE_WAIT_S)
                if self._stopping:
                    return
                dirty, self._dirty = self._dirty, set()
            for keys in dirty:
                if keys.dropped:
                    continue
                try:
                    keys.index_confirmed()
                except Exception:  # RocksDB refused: the rows stay in the tail and are tried again
                    log.exception("indexing the keys of %s failed; retrying", keys.name)
                    with self._wake:
                        self._wake.wait(INDEXER_IDLE_WAIT_S)
                if keys.has_confirmed_pending():
                    with self._wake:
                        self._dirty.add(keys)

    def sync(self) -> None:
        """Make what is indexed durable (one write-ahead-log sync, the interpreter lock released)
        and let trimming go up to it; advance idle partitions' watermarks first."""
        with self._lock:
            partitions = list(self._partitions.values())
        for keys in partitions:
            keys.advance_idle_watermark()
        marks = [(keys, keys.watermark) for keys in partitions]
        if any(mark > keys.durable_watermark for keys, mark in marks):
            self.db.flush_wal(True)
            self.syncs += 1
            for keys, mark in marks:
                keys.durable_watermark = max(keys.durable_watermark, mark)

    def cleanup(self) -> None:
        with self._lock:
            partitions = list(self._partitions.values())
        for keys in partitions:
            keys.cleanup()

    def flush(self) -> None:
        """Index everything confirmed so far in every partition, now."""
        with self._lock:
            partitions = list(self._partitions.values())
        for keys in partitions:
            keys.flush()

    def statistics(self) -> KeyIndexStats:
        with self._lock:
            partitions = list(self._partitions.values())
        return KeyIndexStats(len(partitions), sum(k.pending_rows() for k in partitions), self.rows_indexed,
                             self.batches_written, self.entries_rebuilt, self.mismatches, self.rows_cleaned,
                             self.syncs)

    def close(self) -> None:
        """Index everything confirmed, sync, stop the thread and close RocksDB."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()
        with self._lock:
            names = list(self._partitions)
        for name in names:
            self.forget(name)
        self.db.flush_wal(True)
        self.db.close()

