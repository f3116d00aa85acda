"""One topic partition's event streams: its tail and its rows, indexed, recovered and trimmed.

Role: ``PartitionKeys`` is what a topic holds of the key index (``PersistentTopic.streams``):
reservations for its appends (``reservations.py``), reads of a key's versions for
``broker/event_streams.py`` (the tail first, then RocksDB, ``rows.py``), and the work the
index's thread and maintenance do for it: writing confirmed reservations to RocksDB in batches,
recovering after a restart, moving an idle watermark, deleting the rows retention trimmed.

Recovery. On open the entries after the watermark are read from the managed ledger and indexed
again, so after ``kill -9`` every acknowledged append has its version and the next append sees
the right head. Batches are not synced (a lost suffix is rebuilt the same way); the index's
``sync`` syncs the write-ahead log before trimming, and trimming keeps every ledger above the
durable watermark, so entries are never deleted before their versions are durable. An index
whose watermark lies beyond the partition's end belongs to a deleted topic of the same name and
is dropped.

Trimming. Retention deletes whole ledgers; their rows are deleted afterwards (``cleanup``, via
the ``E`` rows), but each key's ``H`` row stays: versions are never renumbered, trimmed ones
read as ``DataLost``.

Invariants: one writer of the partition's rows and watermarks at a time (the indexer,
maintenance or close); nothing is written for a partition once it is dropped; recovery reads at
most ``REBUILD_STEP_ENTRIES`` entries per batch it writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rocksdict import Rdict

from broker.entry_format import Message, decode_entry
from broker.errors import MagnetarError
from broker.key_index.reservations import KeyReservation, KeyTail
from broker.key_index.rows import EntryRows, Head, PartitionRows, StreamRow
from broker.limits import REBUILD_STEP_ENTRIES
from broker.message_fields import ExpectedVersion
from broker.message_id import Position

if TYPE_CHECKING:
    from broker.managed_ledger import ManagedLedger
    from broker.managed_ledger_reads import Entry

log = logging.getLogger(__name__)


@dataclass
class IndexCounters:
    """What the index did, over all its partitions (``KeyIndex.statistics``)."""

    rows_indexed: int = 0
    batches_written: int = 0
    entries_rebuilt: int = 0
    mismatches: int = 0
    rows_cleaned: int = 0
    syncs: int = 0


class PartitionKeys:
    """The event streams of one topic partition. Created by :meth:`KeyIndex.partition`."""

    def __init__(self, db: Rdict, pid: int, name: str, ml: ManagedLedger, counters: IndexCounters,
                 wake: Callable[[PartitionKeys], None]) -> None:
        self.name = name
        self.ml = ml
        self._counters = counters
        self._wake = wake
        """Tell the index's thread this partition has confirmed reservations to write."""
        self._rows = PartitionRows(db, pid)
        self._tail = KeyTail(ml.display_name, self._rows.head, self._mismatched, self._confirmed)
        self._writing = threading.Lock()
        """One writer of this partition's rows and state at a time (indexer, maintenance, close)."""
        self._listeners: list[Callable[[], None]] = []
        self.durable_watermark = self._rows.watermark
        self.dropped = False

    @property
    def watermark(self) -> int:
        """Every keyed message below this offset is indexed."""
        return self._rows.watermark

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
        return self._tail.reservation_of_keys(keys, expected)

    def _mismatched(self) -> None:
        self._counters.mismatches += 1

    def _confirmed(self) -> None:
        self._wake(self)
        for listener in list(self._listeners):
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the confirming thread; it must only schedule work) whenever
        keyed messages become readable."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # --- heads ----------------------------------------------------------------------------
    def head(self, key: str) -> Head | None:
        """The key's last readable (durable) version and its offset; None: no message."""
        return self._tail.head(key)

    def versions_of_entry(self, first_offset: int) -> dict[int, int] | None:
        """{batch index: version} of the keyed messages of the entry starting at ``first_offset``
        (None when the index has no record of that entry)."""
        pending = self._tail.entry_versions(first_offset)
        return pending if pending is not None else self._rows.entry_versions(first_offset)

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
        # the tail first: rows it hands to RocksDB meanwhile are then found there
        tail = self._tail.readable_rows(key, first_version, last_version)
        upper = tail[0].version if tail else last_version + 1
        return self._rows.rows(key, first_version, upper, last_version) + tail

    def first_row_at_or_after(self, key: str, offset: int) -> StreamRow | None:
        """The first readable row of ``key`` whose offset is ``>= offset`` (the first version
        retention kept, when ``offset`` is the partition's first offset)."""
        found = self._rows.first_row_at_or_after(key, offset)
        return found if found is not None else self._tail.first_readable_at_or_after(key, offset)

    # --- indexing (the indexer thread) --------------------------------------------------------
    def index_confirmed(self) -> int:
        """Write the confirmed reservations at the head of the tail to RocksDB (up to
        ``INDEX_BATCH_ROWS_MAX`` rows); the rows written."""
        with self._writing:
            return 0 if self.dropped else self._index_confirmed()

    def _index_confirmed(self) -> int:
        batch, rows = self._tail.confirmed_batch()
        if not batch:
            return 0
        last = batch[-1]
        self._write([(r.first_offset, r.position, [(i, v, k) for (i, k), v in zip(r.keyed, r.versions, strict=True)])
                     for r in batch if r.position is not None], last.first_offset + last.message_count)
        self._tail.indexed(batch)
        return rows

    def _write(self, entries: Iterable[EntryRows], watermark: int) -> None:
        """One batch: the rows of ``entries`` ((first offset, position, [(batch index, version,
        key)])), their ``E`` rows, the heads they move, and the new watermark."""
        rows = self._rows.write(entries, watermark)
        self._counters.rows_indexed += rows
        self._counters.batches_written += 1

    # --- recovery -------------------------------------------------------------------------
    def recover(self, entries_from: Callable[[int], Iterator[Entry]]) -> int:
        """Index the entries after the watermark (they were appended, perhaps acknowledged,
        but not indexed when the broker stopped); the number of entries read."""
        end = self.ml.confirmed_next_offset()
        if self.watermark > end:
            log.warning("the key index of %s ends at offset %d, beyond the partition's end %d: it belonged to a "
                        "deleted topic of the same name; rebuilding it", self.ml.display_name, self.watermark, end)
            self._rows.delete_all()
            self._tail.forget_heads()
        start = max(self.watermark, self.ml.first_offset)
        if start > self.watermark and self.watermark < end:
            log.warning("entries %d..%d of %s were trimmed before the key index held them: the versions of their "
                        "keys continue from what the index holds", self.watermark, start - 1, self.ml.display_name)
        read = 0
        pending: list[EntryRows] = []
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
                    head = self._tail.indexed_head(key)
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
            self._rows.sync()
        self._tail.forget_heads()  # rebuilt heads are in RocksDB; the cache refills on use
        self.durable_watermark = self.watermark
        self._counters.entries_rebuilt += read
        return read

    # --- maintenance ----------------------------------------------------------------------
    def advance_idle_watermark(self) -> None:
        """With nothing pending, every keyed message below the confirmed end is indexed: move
        the watermark there (keyless appends otherwise leave it behind)."""
        end = self.ml.confirmed_next_offset()
        with self._writing, self._tail.lock:
            if self._tail.has_pending or end <= self.watermark or self.dropped:
                return
            self._rows.set_watermark(end)

    def cleanup(self) -> int:
        """Delete the rows of entries retention trimmed (below the partition's first offset);
        heads stay. The rows deleted."""
        with self._writing:
            return self._cleanup()

    def _cleanup(self) -> int:
        first = self.ml.first_offset
        if first <= self._rows.cleaned_below or self.dropped:
            return 0
        deleted = self._rows.clean_below(first)
        self._counters.rows_cleaned += deleted
        return deleted

    def pending_rows(self) -> int:
        return self._tail.pending_rows()

    def flush(self) -> None:
        """Index everything confirmed so far, now, and move the watermark as far as it goes."""
        while self.index_confirmed():
            pass
        self.advance_idle_watermark()

    def has_confirmed_pending(self) -> bool:
        return self._tail.has_confirmed_pending()
