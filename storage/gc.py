"""Entry-log garbage collection and compaction: how deleting ledgers gives disk back.

Role: entry logs are append-only and hold many ledgers. For every sealed log (not the one
being written) the collector knows how many bytes each ledger occupies (computed once by
scanning the log, which never changes afterwards). Bytes of deleted ledgers are dead.

- A log with no live bytes is deleted.
- A log whose live ratio is under the compaction threshold (minor 0.2, major 0.8 by default) is
  compacted: every live record, one the index still points at, is copied to the current log;
  the log is synced, the index batch is written atomically, then the old log is deleted.

Invariants: GC runs one at a time; its candidates are the logs already sealed when the run
starts (read under the flush lock, so a log that a concurrent rotation is creating is never a
candidate); compaction and removal hold the flush lock, so they never interleave with a flush
or a ledger deletion. A crash at any step loses nothing: before the index batch the copies are unreferenced
garbage; after it the old log holds only dead records and is collected on the next run.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rocksdict import Rdict, WriteBatch

from storage.entry_location_index import EntryLocationIndex, write_durably
from storage.entry_log import RECORD_HEADER_SIZE, EntryLogger
from storage.fileio import FileIO


@dataclass(frozen=True)
class GcResult:
    logs_removed: int
    logs_compacted: int
    entries_moved: int
    bytes_reclaimed: int


@dataclass(frozen=True)
class GcStats:
    runs: int
    logs_removed: int
    logs_compacted: int
    entries_moved: int
    bytes_reclaimed: int


class LogUsageIndex:
    """Bytes per ledger of each sealed entry log, kept in the index RocksDB (key ``b"U"`` +
    log id) so a restart does not rescan every log (BookKeeper's entry-log metadata map)."""

    PREFIX = b"U"

    def __init__(self, db: Rdict) -> None:
        self._db = db

    def _key(self, log_id: int) -> bytes:
        return self.PREFIX + struct.pack(">Q", log_id)

    def get(self, log_id: int) -> dict[int, int] | None:
        raw = self._db.get(self._key(log_id))
        return None if raw is None else {int(k): int(v) for k, v in json.loads(raw).items()}

    def put(self, log_id: int, usage: dict[int, int]) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(self._key(log_id), json.dumps(usage).encode())
        write_durably(self._db, batch)

    def delete(self, log_id: int) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.delete(self._key(log_id))
        write_durably(self._db, batch)


class GarbageCollector:
    def __init__(self, entry_logger: EntryLogger, index: EntryLocationIndex, fileio: FileIO, *,
                 ledger_exists: Callable[[int], bool], flush_lock: threading.Lock, usage_index: LogUsageIndex) -> None:
        self._usage_index = usage_index
        self._logs = entry_logger
        self._index = index
        self._fileio = fileio
        self._ledger_exists = ledger_exists
        self._flush_lock = flush_lock
        self._usage: dict[int, dict[int, int]] = {}
        self._run_lock = threading.Lock()
        self._runs = 0
        self._removed = 0
        self._compacted = 0
        self._moved = 0
        self._reclaimed = 0

    def usage(self, log_id: int) -> dict[int, int]:
        """Bytes per ledger in a sealed log: known from appends, else persisted, else scanned
        once (sealed logs never change)."""
        cached = self._usage.get(log_id)
        if cached is not None:
            return cached
        cached = self._logs.sealed_usage.pop(log_id, None) or self._usage_index.get(log_id)
        if cached is None:
            cached = {}
            for record in self._logs.scan(log_id):
                cached[record.ledger_id] = cached.get(record.ledger_id, 0) + RECORD_HEADER_SIZE + record.size_bytes
        self._usage_index.put(log_id, cached)
        self._usage[log_id] = cached
        return cached

    def persist_current_usage(self) -> None:
        """On a clean close: the current log is sealed from now on; keep its usage."""
        log_id, usage = self._logs.current_usage()
        if log_id:
            self._usage_index.put(log_id, usage)

    def run(self, compaction_threshold: float) -> GcResult:
        with self._run_lock:
            return self._run(compaction_threshold)

    def _run(self, compaction_threshold: float) -> GcResult:
        removed = compacted = moved = reclaimed = 0
        with self._flush_lock:
            sealed = self._logs.sealed_log_ids()
        for log_id in sealed:
            usage = self.usage(log_id)
            total = sum(usage.values())
            live = sum(size for ledger, size in usage.items() if self._ledger_exists(ledger))
            size_on_disk = self._fileio.file_size(self._logs.path(log_id))
            if live == 0:
                with self._flush_lock:
                    self._logs.remove_log(log_id)
                removed += 1
            elif total and live / total < compaction_threshold:
                moved += self._compact(log_id)
                compacted += 1
            else:
                continue
            self._usage.pop(log_id, None)
            self._usage_index.delete(log_id)
            reclaimed += size_on_disk
        self._runs += 1
        self._removed += removed
        self._compacted += compacted
        self._moved += moved
        self._reclaimed += reclaimed
        return GcResult(removed, compacted, moved, reclaimed)

    def _compact(self, log_id: int) -> int:
        with self._flush_lock:
            moved: list[tuple[int, int, int]] = []
            for record in self._logs.scan(log_id):
                ledger, entry = record.ledger_id, record.entry_id
                if not self._ledger_exists(ledger) or self._index.get(ledger, entry) != record.location:
                    continue
                data, _ = self._logs.read(record.location, ledger, entry)
                moved.append((ledger, entry, self._logs.add(ledger, entry, data)))
            self._logs.flush()
            self._fileio.failpoint("gc: after copy, before index update")
            self._index.put_batch(moved)
            self._fileio.failpoint("gc: after index update, before log removal")
            self._logs.remove_log(log_id)
        return len(moved)

    def statistics(self) -> GcStats:
        return GcStats(self._runs, self._removed, self._compacted, self._moved, self._reclaimed)
