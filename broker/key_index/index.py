"""The broker's key index: one RocksDB, one indexer thread, a ``PartitionKeys`` per open partition.

Role: the service opens one ``KeyIndex`` (``{data_dir}/key-index``); each topic partition it
loads gets its ``PartitionKeys`` (``partition.py``), recovered before it is handed out. A
background thread writes confirmed reservations of the partitions woken since its last round to
RocksDB, off the publish path; maintenance syncs the write-ahead log (``sync``) before trimming
relies on it, and deletes the rows retention trimmed (``cleanup``).

Invariants: at most one thread indexes (``_run``; ``close`` indexes what is left itself, after
it stopped); a partition forgotten or dropped is indexed no more; a sync happens only when some
watermark moved since the last one; a failed RocksDB write leaves the rows in the tail, tried
again after ``INDEXER_IDLE_WAIT_S``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rocksdict import Rdict

from broker.key_index.partition import IndexCounters, PartitionKeys
from broker.key_index.rows import drop_partition, partition_id
from broker.limits import INDEXER_IDLE_WAIT_S
from storage import open_rdict

if TYPE_CHECKING:
    from broker.managed_ledger import ManagedLedger
    from broker.managed_ledger_reads import Entry

log = logging.getLogger(__name__)


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
        self._counters = IndexCounters()
        self._thread = threading.Thread(target=self._run, name="magnetar-key-index", daemon=True)
        self._thread.start()

    def partition(self, name: str, ml: ManagedLedger, entries_from: Callable[[int], Iterator[Entry]]) -> PartitionKeys:
        """The streams of partition ``name`` (its managed ledger ``ml``), recovered: the entries
        after the index's watermark are indexed before this returns."""
        with self._lock:
            pid = partition_id(self.db, name)
        keys = PartitionKeys(self.db, pid, name, ml, self._counters, self.wake)
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
            drop_partition(self.db, name)

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
            self._counters.syncs += 1
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
        c = self._counters
        return KeyIndexStats(len(partitions), sum(k.pending_rows() for k in partitions), c.rows_indexed,
                             c.batches_written, c.entries_rebuilt, c.mismatches, c.rows_cleaned, c.syncs)

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

