"""The durable half of one partition's key index: its record and the segments the record names.

Role: ``PartitionKeys`` (``partition.py``) keeps the tail of versions not yet durable in the
index and decides when to checkpoint; a ``SegmentSet`` does the writing. It loads the record
(``checkpoint.py``) and checks it belongs to this topic (``load``), writes confirmed rows as a
new segment ledger (``segment.py``) and records it (``commit``), merges the segments without
the rows of trimmed entries (``compact``), and deletes the index with its topic (``drop``).

A record whose segment ledger is gone or damaged is not used (the index is rebuilt); one whose
segments cannot be read *now* (bookies away) fails the opening as retriable
(``ServiceUnitNotReady``) rather than rebuild what retention may no longer hold.

Invariants: a segment ledger is named in the record (``pending``) before it is created, and in
``segments`` only once it is closed; a ledger let go of (compacted away, or of a record found
unusable) stays ``pending`` until it is deleted, so a crash never leaves a ledger nobody knows;
an opening writes the record back before it deletes anything; every
record write is a compare-and-set, and ``BadVersion`` (another broker serves the topic now) is
raised to the caller with nothing half-recorded; ``segments`` changes only under the
partition's lock, so readers see the old list or the new one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from broker.errors import (
    BadVersion,
    CorruptEntry,
    MagnetarError,
    NoSuchEntry,
    NoSuchLedger,
    ServiceUnitNotReady,
)
from broker.key_index.checkpoint import Checkpoint, CheckpointStore, SegmentInfo
from broker.key_index.segment import Row, Segment, SegmentWriter, merge_rows
from broker.limits import SEGMENT_APPEND_ENTRIES, SEGMENT_WRITE_WAIT_S

if TYPE_CHECKING:
    from broker.bookkeeper.bookie import QuorumConfig
    from broker.bookkeeper.ledger_handle import LedgerHandle
    from broker.bookkeeper.ledger_manager import LedgerManager
    from broker.metadata.store import MetadataStore

Segments = list[tuple[SegmentInfo, Segment]]
"""A partition's segments with their descriptions, oldest first, as the record names them."""


class SegmentHost(Protocol):
    """What a segment set needs of the broker's key index (``index.py``): the metadata store and
    the ledgers, and the shared segment reads."""

    ledgers: LedgerManager
    store: MetadataStore

    def open_segment(self, ledger_id: int) -> Segment: ...
    def forget_segment(self, ledger_id: int) -> None: ...


class SegmentSet:
    def __init__(self, host: SegmentHost, name: str, incarnation: str, quorum: Callable[[], QuorumConfig],
                 lock: threading.Lock) -> None:
        self._host = host
        self.name = name
        self._quorum = quorum
        """The topic's current quorum (its namespace's persistence policy), for new segments."""
        self._record = CheckpointStore(host.store, name)
        self.checkpoint = Checkpoint(incarnation, 0)
        self.segments: Segments = []
        self._lock = lock

    @property
    def indexed_to(self) -> int:
        """Every keyed message below this offset has its row in a segment."""
        return self.checkpoint.indexed_to

    def load(self, incarnation: str, end: int) -> str:
        """Read the record, keep it and open its segments when they are this topic's (else start
        empty), and write it back: from then on an earlier owner's writes are refused, and only
        then is anything deleted (ledgers let go of stay pending until they are). The reason the
        record was not used ("" when it was, or there was none); ``BadVersion`` when an earlier
        owner wrote it between the read and the write-back (read it again)."""
        found = self._record.load()
        checkpoint, segments, why = self._usable(found, incarnation, end)
        if checkpoint is None:
            let_go: tuple[int, ...] = ()
            if found is not None:
                let_go = (*(s.ledger_id for s in found.segments), *found.pending)
            checkpoint = Checkpoint(incarnation, 0, pending=let_go)
        self._save(checkpoint)
        with self._lock:
            self.segments = segments
        left = self.delete_ledgers(checkpoint.pending)
        if left != checkpoint.pending:
            with contextlib.suppress(MagnetarError):  # else the next opening deletes them
                self._save(replace(checkpoint, pending=left))
        return why if found is not None else ""

    def _usable(self, found: Checkpoint | None, incarnation: str, end: int) -> tuple[Checkpoint | None, Segments, str]:
        if found is None:
            return None, [], "no record"
        if found.incarnation != incarnation:
            return None, [], (f"its record belongs to incarnation {found.incarnation or '(none)'} of the topic, "
                              f"not {incarnation} (the topic was deleted and created again, or the metadata "
                              "restored)")
        if found.indexed_to > end:
            return None, [], (f"its record covers offsets up to {found.indexed_to}, beyond the topic's end {end} "
                              "(the metadata was restored from an older copy)")
        segments: Segments = []
        for info in found.segments:
            try:
                segments.append((info, self._host.open_segment(info.ledger_id)))
            except (NoSuchLedger, NoSuchEntry, CorruptEntry) as exc:  # gone or damaged: it never comes back
                return None, [], f"its segment ledger {info.ledger_id} cannot be read ({exc})"
            except MagnetarError as exc:  # bookies away for now: rebuilding could restart trimmed versions
                raise ServiceUnitNotReady(f"the key index segment {info.ledger_id} of {self.name} cannot be read "
                                          f"now ({exc}); retry") from exc
        return found, segments, ""

    def commit(self, rows: list[Row], from_offset: int, indexed_to: int) -> None:
        """Record ``rows`` (sorted) as a new segment covering ``from_offset..indexed_to``, or
        only the new ``indexed_to`` when there are none (keyless appends)."""
        if not rows:
            self._save(self.checkpoint.committed(-1, None, indexed_to))
            return
        info, segment = self._write_segment(rows, from_offset, indexed_to)
        self._save_segment(self.checkpoint.committed(info.ledger_id, info, indexed_to), info.ledger_id)
        with self._lock:
            self.segments.append((info, segment))

    def compact(self, first_kept: int) -> int:
        """Merge every segment into one, dropping the rows of offsets below ``first_kept`` but
        each key's last row (versions never restart); the rows dropped."""
        merged = list(self.segments)
        before = sum(info.rows for info, _ in merged)
        info, segment = self._write_segment(_kept_rows(merged, first_kept), merged[0][0].from_offset,
                                            merged[-1][0].to_offset)
        replaced = tuple(i.ledger_id for i, _ in merged)
        committed = self.checkpoint.committed(info.ledger_id, info, self.checkpoint.indexed_to, replaced)
        self._save_segment(replace(committed, cleaned_below=max(self.checkpoint.cleaned_below, first_kept),
                                   pending=(*committed.pending, *replaced)), info.ledger_id)  # named until deleted
        with self._lock:
            self.segments = [(info, segment)]
        left = self.delete_ledgers(replaced)
        # the compaction stands even if this write is refused: its segments stay pending, for the next opening
        with contextlib.suppress(MagnetarError):
            self._save(replace(self.checkpoint, pending=tuple(p for p in self.checkpoint.pending
                                                              if p not in replaced or p in left)))
        return before - info.rows

    def cleanup_due(self, first_offset: int, share: float) -> bool:
        """Whether retention trimmed ``share`` of what the segments cover since the last compaction."""
        if not self.segments:
            return False
        covered_from = max(self.segments[0][0].from_offset, self.checkpoint.cleaned_below)
        covered = self.segments[-1][0].to_offset - covered_from
        return covered > 0 and first_offset - covered_from >= covered * share

    def drop(self) -> None:
        """Delete the segments and the record (the topic is deleted), whoever wrote them last."""
        found = self._record.load()
        ledgers = [s.ledger_id for s in self.checkpoint.segments] + list(self.checkpoint.pending)
        if found is not None:
            ledgers += [s.ledger_id for s in found.segments] + list(found.pending)
        self.delete_ledgers(sorted(set(ledgers)))
        with contextlib.suppress(MagnetarError):
            self._record.delete()

    def delete_ledgers(self, ledger_ids: Iterable[int]) -> tuple[int, ...]:
        """Delete ``ledger_ids`` (a missing one is already gone); those that could not be
        deleted now, which the record keeps pending so a later opening deletes them."""
        left: list[int] = []
        for ledger_id in ledger_ids:
            self._host.forget_segment(ledger_id)
            try:
                self._host.ledgers.delete(ledger_id)
            except MagnetarError:
                left.append(ledger_id)
        return tuple(left)

    def _save(self, checkpoint: Checkpoint) -> None:
        self._record.save(checkpoint)
        self.checkpoint = checkpoint

    def _save_segment(self, checkpoint: Checkpoint, ledger_id: int) -> None:
        """Save ``checkpoint``, which names the new segment ``ledger_id``; refused (another broker
        opened the index since it was named pending, and may have deleted it before it existed),
        the segment is deleted: nobody names it."""
        try:
            self._save(checkpoint)
        except BadVersion:
            self.delete_ledgers([ledger_id])
            raise

    def _write_segment(self, rows: Iterator[Row] | list[Row], from_offset: int,
                       to_offset: int) -> tuple[SegmentInfo, Segment]:
        """A new segment ledger holding ``rows``, named in the record as pending first."""
        ledger_id = self._host.ledgers.allocate_id()
        self._save(self.checkpoint.with_pending(ledger_id))  # named before it exists: never a ledger nobody knows
        handle = self._host.ledgers.create(self._quorum(), {"key-index": self.name}, ledger_id=ledger_id)
        writer = SegmentWriter()
        for row in rows:
            writer.add(row)
            if writer.rows % (SEGMENT_APPEND_ENTRIES * 300) == 0:
                _append(handle, writer.take_blocks())
        _append(handle, writer.finish())
        handle.close()
        info = SegmentInfo(handle.ledger_id, from_offset, to_offset, writer.rows, writer.keys)
        return info, self._host.open_segment(handle.ledger_id)


def _append(handle: LedgerHandle, blocks: list[bytes]) -> None:
    for at in range(0, len(blocks), SEGMENT_APPEND_ENTRIES):
        handle.append(blocks[at:at + SEGMENT_APPEND_ENTRIES]).result(timeout=SEGMENT_WRITE_WAIT_S)


def _kept_rows(segments: Segments, first_kept: int) -> Iterator[Row]:
    """The rows of ``segments`` in order, without those of offsets below ``first_kept`` except
    each key's last row."""
    previous: Row | None = None
    for row in merge_rows([segment.all_rows() for _, segment in segments]):
        if previous is not None and (previous[0] != row[0] or previous[2] >= first_kept):
            yield previous
        previous = row
    if previous is not None:
        yield previous
