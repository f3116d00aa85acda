"""The broker's key index: one ``PartitionKeys`` per open topic partition, one thread for their
checkpoints, one cache of segment blocks.

Role: ``KeyIndex.partition`` opens a partition's streams when its topic loads (reading its
checkpoint from the metadata store and its segments from the ledgers, then the entries after
it); a thread checks every ``KEY_INDEX_CHECK_INTERVAL_S`` which partitions have a checkpoint due (or are
woken by a full tail) and writes them; ``forget`` writes a last checkpoint when a topic is
unloaded gracefully, so the next owner reads as little as possible again; ``drop`` deletes a
deleted topic's index. Segment reads go through one cache of decoded blocks, bounded in bytes.

Invariants: the index holds nothing on a local disk (no data directory is needed for it);
segment ledgers are read through read-only handles, kept while the segment is in use; the
block cache holds at most ``block_cache_bytes_max`` bytes of decoded rows.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.errors import MagnetarError
from broker.key_index.checkpoint import CheckpointStore
from broker.key_index.partition import PartitionKeys
from broker.key_index.segment import Row, Segment, SegmentIndex, decode_block
from broker.limits import KEY_INDEX_BLOCK_CACHE_BYTES_MAX, KEY_INDEX_CHECK_INTERVAL_S

if TYPE_CHECKING:
    from broker.bookkeeper.ledger_handle import LedgerHandle
    from broker.bookkeeper.ledger_manager import LedgerManager
    from broker.entry import Entry
    from broker.managed_ledger import ManagedLedger
    from broker.metadata.store import MetadataStore

log = logging.getLogger(__name__)

ROW_FOOTPRINT_BYTES = 120
"""What a decoded row costs in memory, about (a tuple of bytes and four integers)."""


@dataclass(frozen=True)
class KeyIndexStats:
    partitions: int
    pending_rows: int
    """Versions assigned and not yet in a segment (all partitions)."""
    rows_indexed: int
    """Rows written to segments by checkpoints."""
    checkpoints: int
    segments: int
    entries_replayed: int
    """Entries read again on open because they were after a checkpoint."""
    version_mismatches: int
    rows_cleaned: int
    """Rows of trimmed entries dropped by compactions."""
    compactions: int
    block_cache_hits: int
    block_cache_misses: int
    dcb_rows_read: int
    """Rows of derived streams DCB reads and conditions took (``derived.py``)."""
    dcb_entries_read: int
    """Entries DCB reads and conditions read to see the events those rows name."""


class KeyIndex:
    def __init__(self, ledgers: LedgerManager, store: MetadataStore, *,
                 block_cache_bytes_max: int = KEY_INDEX_BLOCK_CACHE_BYTES_MAX,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledgers = ledgers
        self.store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._partitions: dict[str, PartitionKeys] = {}
        self._due: set[PartitionKeys] = set()
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self._handles: dict[int, LedgerHandle] = {}
        self._blocks: OrderedDict[tuple[int, int], list[Row]] = OrderedDict()
        self._block_bytes = 0
        self._block_bytes_max = block_cache_bytes_max
        self._block_lock = threading.Lock()
        self.rows_indexed = self.checkpoints = self.entries_replayed = 0
        self.mismatches = self.rows_cleaned = self.compactions = 0
        self.block_hits = self.block_misses = 0
        self.dcb_rows_read = self.dcb_entries_read = 0
        self._thread = threading.Thread(target=self._run, name="magnetar-key-index", daemon=True)
        self._thread.start()

    # --- partitions -------------------------------------------------------------------------
    def partition(self, name: str, ml: ManagedLedger, entries_from: Callable[[int], Iterator[Entry]]) -> PartitionKeys:
        """The streams of partition ``name`` (its managed ledger ``ml``), opened: its checkpoint
        loaded and the entries after it numbered before this returns."""
        keys = PartitionKeys(self, name, ml)
        keys.open(entries_from)
        with self._lock:
            self._partitions[name] = keys
        return keys

    def forget(self, name: str, *, last_checkpoint: bool = True) -> None:
        """Stop indexing partition ``name`` (closed, or unloaded): what is confirmed is written
        in a last checkpoint first, unless ``last_checkpoint`` is False (the topic was abandoned:
        another broker may serve it already, and the record is no longer this one's to write)."""
        with self._lock:
            keys = self._partitions.pop(name, None)
            if keys is not None:
                self._due.discard(keys)
        if keys is None:
            return
        try:
            if last_checkpoint:
                keys.checkpoint()
        except MagnetarError as exc:  # the next owner reads the entries after the last checkpoint again
            log.warning("the last key index checkpoint of %s failed: %s", keys.ml.display_name, exc)
        keys.dropped = True

    def drop(self, name: str) -> None:
        """Delete partition ``name``'s index: its segments and its record (its topic is deleted)."""
        with self._lock:
            keys = self._partitions.pop(name, None)
            if keys is not None:
                self._due.discard(keys)
        if keys is not None:
            keys.drop()
            return
        record = CheckpointStore(self.store, name)
        found = record.load()
        if found is None:
            return
        for ledger_id in [s.ledger_id for s in found.segments] + list(found.pending):
            self.forget_segment(ledger_id)
            with contextlib.suppress(MagnetarError):
                self.ledgers.delete(ledger_id)
        record.delete()

    # --- segments ---------------------------------------------------------------------------
    def open_segment(self, ledger_id: int) -> Segment:
        """A segment's index, read from its ledger's last entry; its blocks are read on demand."""
        handle = self.ledgers.open(ledger_id, recovery=False)
        index = SegmentIndex.decode(handle.read_entry(handle.last_add_confirmed))
        with self._block_lock:
            self._handles[ledger_id] = handle
        return Segment(ledger_id, index, lambda number: self._block(ledger_id, number))

    def _block(self, ledger_id: int, number: int) -> list[Row]:
        cache_key = (ledger_id, number)
        with self._block_lock:
            rows = self._blocks.get(cache_key)
            if rows is not None:
                self._blocks.move_to_end(cache_key)
                self.block_hits += 1
                return rows
            handle = self._handles[ledger_id]
        rows = decode_block(handle.read_entry(number))
        with self._block_lock:
            self.block_misses += 1
            if cache_key not in self._blocks:
                self._blocks[cache_key] = rows
                self._block_bytes += len(rows) * ROW_FOOTPRINT_BYTES
                while self._block_bytes > self._block_bytes_max and len(self._blocks) > 1:
                    _, evicted = self._blocks.popitem(last=False)
                    self._block_bytes -= len(evicted) * ROW_FOOTPRINT_BYTES
        return rows

    def forget_segment(self, ledger_id: int) -> None:
        """Drop a segment's handle and cached blocks (it was compacted away or deleted)."""
        with self._block_lock:
            self._handles.pop(ledger_id, None)
            for cache_key in [k for k in self._blocks if k[0] == ledger_id]:
                self._block_bytes -= len(self._blocks.pop(cache_key)) * ROW_FOOTPRINT_BYTES

    # --- the checkpoint thread --------------------------------------------------------------
    def wake(self, keys: PartitionKeys) -> None:
        """``keys`` has a checkpoint due now (its tail is full)."""
        with self._wake:
            self._due.add(keys)
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._due and not self._stopping:
                    self._wake.wait(KEY_INDEX_CHECK_INTERVAL_S)
                if self._stopping:
                    return
                due, self._due = self._due, set()
                partitions = list(self._partitions.values())
            now_s = self._clock()
            for keys in partitions:
                if keys in due or keys.checkpoint_due(now_s):
                    self._checkpoint(keys)

    def _checkpoint(self, keys: PartitionKeys) -> None:
        try:
            keys.checkpoint()
        except Exception:  # the rows stay in the tail and are written at the next checkpoint
            log.exception("the key index checkpoint of %s failed; it is tried again", keys.ml.display_name)

    def flush(self) -> None:
        """A checkpoint of every partition, now."""
        with self._lock:
            partitions = list(self._partitions.values())
        for keys in partitions:
            keys.checkpoint()

    def cleanup(self) -> None:
        """Let partitions whose entries retention trimmed drop those rows (``PartitionKeys.cleanup``)."""
        with self._lock:
            partitions = list(self._partitions.values())
        for keys in partitions:
            try:
                keys.cleanup()
            except MagnetarError as exc:
                log.warning("compacting the key index of %s failed: %s", keys.ml.display_name, exc)

    def statistics(self) -> KeyIndexStats:
        with self._lock:
            partitions = list(self._partitions.values())
        return KeyIndexStats(len(partitions), sum(k.pending_rows() for k in partitions), self.rows_indexed,
                             self.checkpoints, sum(k.segments() for k in partitions), self.entries_replayed,
                             self.mismatches, self.rows_cleaned, self.compactions, self.block_hits,
                             self.block_misses, self.dcb_rows_read, self.dcb_entries_read)

    def close(self) -> None:
        """Stop the thread and write a last checkpoint of every partition."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()
        with self._lock:
            names = list(self._partitions)
        for name in names:
            self.forget(name)
