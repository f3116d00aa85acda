"""LedgerStorage: the front door of the embedded bookie (BookKeeper's DbLedgerStorage).

Write path::

    add_entries ─▶ WriteCache.put (active buffer; full → back-pressure)        flusher.py
                ─▶ Journal.append ─▶ group commit: one writev + one fdatasync ─▶ Future done
    background: active buffer over its threshold, or every flush_interval_ms
              ─▶ swap buffers ─▶ sorted entries to EntryLogger ─▶ fsync ─▶ index batch (synced)
              ─▶ checkpoint: persist the LogMark taken at the swap ─▶ delete older journal files

Read path (``entry_reader.py``): active write cache ─▶ buffer being flushed ─▶ read cache ─▶
location index ─▶ entry log, with read-ahead when a read continues the ledger's last one.

Role: this module opens and recovers the storage (replaying the journal after the last
checkpoint), checks and records each add, fence and deletion, completes adds once the journal
has them, and answers reads, statistics and consistency checks; the write caches and their
flush and checkpoint are ``flusher.py``, the read path ``entry_reader.py``, the read-only mode
``read_only.py``, garbage collection ``gc.py``.

Layout under the data directory: ``journal/`` (journal files and ``lastMark``),
``entrylogs/`` (entry logs), ``index/`` (RocksDB: locations and ledger metadata). The journal
may live elsewhere (``journal_dir``: its own disk, as BookKeeper recommends, so its fsyncs
never queue behind entry-log writes).

Invariants:
- A Future from :meth:`add_entries` completes only after its entries' journal records are synced;
  after a crash at any instant every acknowledged entry reads back byte-for-byte.
- A write or sync error turns the storage read-only: pending and later adds fail with
  ``StorageIOError`` (``StorageFull`` when the disk is full) or ``StorageReadOnly``; reads keep
  working; nothing unsynced is acknowledged; the log says which operation failed and why.
- A transient failure (out of file descriptors or memory, before anything was written; see
  ``io_errors.py``) never turns it read-only: a flush keeps its sealed buffer and retries it,
  GC retries on its next run, a call answers ``StorageBusy``; each is logged once.
- Entries above a ledger's last add confirmed may be visible while in flight (BookKeeper's
  semantics); readers that need durability read at most up to the LAC.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rocksdict import WriteBatch

from storage.config import StorageConfig
from storage.entry_location_index import EntryLocationIndex, IndexStats, open_rdict
from storage.entry_log import EntryLogger, EntryLogStats, LogMissing
from storage.entry_reader import EntryReader, ReadPathStats
from storage.errors import (
    CorruptEntry,
    InvalidArgument,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    StorageClosed,
    StorageError,
)
from storage.fileio import FileIO
from storage.flusher import Flusher
from storage.futures import LightFuture, new_future
from storage.gc import GarbageCollector, GcResult, GcStats, LogUsageIndex
from storage.histogram import LatencySnapshot
from storage.io_errors import OnceLog, is_transient
from storage.journal import RECORD_ADD_ENTRY, RECORD_FENCE, Journal, JournalRecord, JournalStats, LogMark, encode_header
from storage.ledger_metadata_index import LedgerMeta, LedgerMetadataIndex
from storage.limits import CALLER_BACKSTOP_MS
from storage.read_cache import ReadCache, ReadCacheStats
from storage.read_only import ReadOnlyState
from storage.write_cache import PUT_OK, WriteCacheStats

LAST_ADD_CONFIRMED = -1
ENTRY_ID_MAX = 2**63 - 1

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StorageStats:
    ledgers: int
    entries_added: int
    read_only: bool
    flushes: int
    checkpoints: int
    last_checkpoint: tuple[int, int]
    replayed_records: int
    journal: JournalStats
    write_cache: WriteCacheStats
    write_cache_being_flushed: WriteCacheStats
    read_cache: ReadCacheStats
    read_path: ReadPathStats
    entry_logs: EntryLogStats
    index: IndexStats
    gc: GcStats
    flush_latency: LatencySnapshot
    """Durations of the write cache's flushes (entry logs, their sync, the index batch)."""


@dataclass(frozen=True)
class ConsistencyReport:
    entries_checked: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


class LedgerStorage:
    """Use :meth:`open`; every method is safe to call from any thread."""

    def __init__(self, path: str, config: StorageConfig, fileio: FileIO, journal_dir: str | None = None) -> None:
        self.path = path
        self.journal_dir = journal_dir or f"{path}/journal"
        self.config = config
        self._fileio = fileio
        for directory in (self.journal_dir, f"{path}/entrylogs", f"{path}/index"):
            fileio.make_dirs(directory)
        self._db = open_rdict(f"{path}/index")
        self._index = EntryLocationIndex(self._db)
        self._meta_index = LedgerMetadataIndex(self._db)
        self._logs = EntryLogger(f"{path}/entrylogs", fileio, size_bytes_max=config.entry_log_size_bytes_max,
                                 write_buffer_bytes=config.entry_log_write_buffer_bytes,
                                 open_read_files_max=config.open_read_files_max)
        self._journal = Journal(self.journal_dir, fileio, self._journal_done, sync=config.journal_sync,
                                group_wait_ms=config.journal_group_wait_ms,
                                preallocate_bytes=config.journal_preallocate_bytes,
                                group_bytes_max=config.journal_group_bytes_max,
                                file_bytes_max=config.journal_file_bytes_max)
        self._read_cache = ReadCache(config.read_cache_bytes_max)
        self._cache_cv = threading.Condition()
        self._flush_lock = threading.Lock()
        self._meta_lock = threading.Lock()
        self._ledgers: dict[int, LedgerMeta] = {}
        self._fenced_deleted: set[int] = set()
        """Fenced ledgers deleted since (tombstones in the index): adds to them stay refused."""
        self._busy = OnceLog(log, "a storage call")
        self._read_only = ReadOnlyState(self._cache_cv, self._busy)
        self._flusher = Flusher(config, fileio, self._journal, self._logs, self._index, self._meta_index,
                                self._ledgers, self._read_only, cache_cv=self._cache_cv, flush_lock=self._flush_lock,
                                check_writable=self._check_writable)
        self._reader = EntryReader(config, self._flusher, self._read_cache, self._index, self._logs, self._busy)
        self._gc = GarbageCollector(self._logs, self._index, fileio, ledger_exists=self._ledgers.__contains__,
                                    flush_lock=self._flush_lock, usage_index=LogUsageIndex(self._db))
        self._gc_trouble = OnceLog(log, "entry-log garbage collection")
        self._closed = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._entries_added = 0
        self._replayed = 0

    # --- lifecycle ---------------------------------------------------------------------
    @classmethod
    def open(cls, path: str, config: StorageConfig | None = None, *, fileio: FileIO | None = None,
             journal_dir: str | None = None) -> LedgerStorage:
        """Open (creating if needed) and recover: replay the journal after the last mark.
        ``journal_dir`` puts the journal outside ``path`` (default ``path/journal``)."""
        storage = cls(path, config or StorageConfig.production(), fileio or FileIO(), journal_dir)
        try:
            storage._recover()
        except BaseException:
            storage._close_files()
            raise
        storage._start_background()
        return storage

    def _recover(self) -> None:
        self._ledgers.update(self._meta_index.load_all())
        self._fenced_deleted.update(self._meta_index.load_tombstones())
        for ledger_id, meta in self._ledgers.items():
            meta.last_add_confirmed = max(meta.last_add_confirmed, self._index.last_entry_id(ledger_id))
        self._flusher.last_mark = self._journal.read_mark()
        for record in self._journal.replay(self._flusher.last_mark):
            self._replay_record(record)
        self._journal.start()
        if self._replayed:
            self._flusher.flush(checkpoint=True)

    def _replay_record(self, record: JournalRecord) -> None:
        meta = self._ledgers.get(record.ledger_id)
        if meta is None:
            return  # the ledger was deleted after this record was written
        if record.record_type == RECORD_ADD_ENTRY:
            while self._flusher.active.put(record.ledger_id, record.entry_id, record.payload) != PUT_OK:
                self._flusher.flush(checkpoint=False)
            meta.last_add_confirmed = max(meta.last_add_confirmed, record.entry_id)
        elif record.record_type == RECORD_FENCE:
            meta.fenced = True
            self._flusher.mark_dirty(record.ledger_id)
        self._replayed += 1

    def _start_background(self) -> None:
        for target, name in ((self._flusher.run, "magnetar-flush"), (self._gc_loop, "magnetar-gc")):
            thread = threading.Thread(target=target, args=(self._stop,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Finish in-flight adds, flush and checkpoint (unless read-only), release files."""
        with self._cache_cv:
            if self._closed:
                return
            self._closed = True
            self._cache_cv.notify_all()
        self._stop.set()
        self._flusher.wake()
        for thread in self._threads:
            thread.join()
        self._journal.close()
        if not self._read_only.active:
            with contextlib.suppress(StorageError):  # read-only now; the journal holds every ack
                self._flusher.flush(checkpoint=True)
                self._gc.persist_current_usage()
        self._close_files()

    def _close_files(self) -> None:
        self._journal.close()
        self._logs.close()
        self._db.close()

    def __enter__(self) -> LedgerStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- writes ------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self._closed:
            raise StorageClosed("storage is closed")
        self._read_only.check()

    def _ledger_for_write(self, ledger_id: int) -> LedgerMeta:
        existing = self._ledgers.get(ledger_id)
        if existing is not None:
            return existing
        if ledger_id in self._fenced_deleted:
            raise LedgerFenced(f"ledger {ledger_id} was fenced, then deleted")
        with self._meta_lock:
            meta = self._ledgers.get(ledger_id)
            if meta is None:
                meta = LedgerMeta()
                try:
                    self._meta_index.put(ledger_id, meta)
                except Exception as exc:  # rocksdict raises plain Exception on I/O errors
                    raise self._read_only.write_failed(exc, f"recording new ledger {ledger_id} in the index") from exc
                self._ledgers[ledger_id] = meta
            return meta

    def add_entries(self, ledger_id: int, entry_ids: Sequence[int], datas: Sequence[bytes], *,
                    recovery: bool = False) -> Future[int]:
        """Store entries of one ledger (``entry_ids`` strictly increasing, one per data: a run
        such as ``range(first, last + 1)``, the entries of a striped ledger that land on this
        bookie, or one entry); the Future resolves to the last entry id once every one of them
        is durable (or fails for all of them).

        Raises at once (no Future, nothing stored) for a closed or read-only storage, bad ids, a
        fenced ledger (unless ``recovery``), or a write cache that stays full (``WriteCacheFull``).
        """
        count = len(datas)
        if not count or len(entry_ids) != count:
            raise InvalidArgument(f"add_entries needs one entry id per entry, at least one: "
                                  f"{len(entry_ids)} ids for {count} entries")
        if self._closed or self._read_only.active:
            self._check_writable()
        first_entry_id, last_entry_id = entry_ids[0], entry_ids[-1]
        if not (0 <= ledger_id <= ENTRY_ID_MAX and first_entry_id >= 0 and last_entry_id <= ENTRY_ID_MAX):
            raise InvalidArgument(
                f"ledger and entry ids must be in [0, 2^63): {ledger_id}:{first_entry_id}..{last_entry_id}")
        if count > 1 and type(entry_ids) is not range and any(a >= b for a, b in itertools.pairwise(entry_ids)):
            raise InvalidArgument(f"entry ids of one add must be strictly increasing: {list(entry_ids)[:16]}")
        meta = self._ledgers.get(ledger_id) or self._ledger_for_write(ledger_id)
        if meta.fenced and not recovery:
            raise LedgerFenced(f"ledger {ledger_id} is fenced")
        buffers: list[bytes] = []
        put = self._flusher.put
        stored = 0
        try:
            for entry_id, given in zip(entry_ids, datas, strict=True):
                data = given if type(given) is bytes else bytes(given)
                put(ledger_id, entry_id, data)
                stored += 1
                buffers.append(encode_header(RECORD_ADD_ENTRY, ledger_id, entry_id, data))
                buffers.append(data)
        except BaseException:  # a write cache that stays full: nothing of this call is kept
            for entry_id in entry_ids[:stored]:
                self._flusher.remove(ledger_id, entry_id)
            raise
        future: LightFuture[int] = new_future()
        self._journal.append(buffers, (meta, ledger_id, last_entry_id, future, entry_ids))
        return future

    def write_journal_on_caller_thread(self, schedule: Callable[[Callable[[], None]], object] | None, *,
                                       backstop_ms: float = CALLER_BACKSTOP_MS) -> None:
        """Adds made on the calling thread (an event loop's) while the journal is idle are written
        and synced by that thread, in a call ``schedule`` runs later (``loop.call_soon``); see
        ``Journal.write_on_caller_thread``. ``None`` turns it off."""
        self._journal.write_on_caller_thread(schedule, backstop_ms=backstop_ms)


    def _journal_done(self, tokens: list[Any], error: BaseException | None) -> None:
        """Whoever wrote the group (the journal's writer thread, or an event loop that wrote an
        idle journal itself), once per group: tokens are ``(meta, ledger, last entry, future,
        entry ids)`` for adds (the entries of one :meth:`add_entries`) and a bare future
        for fences; all of them are completed here, in order (a future its owner cancelled is
        skipped)."""
        if error is None:
            added = 0
            for token in tokens:
                if type(token) is tuple:
                    meta, _, entry_id, future, entry_ids = token
                    meta.last_add_confirmed = max(meta.last_add_confirmed, entry_id)
                    future.try_finish(entry_id, None)
                    added += len(entry_ids)
                else:
                    token.try_finish(None, None)
            self._entries_added += added
            return
        failure = self._read_only.enter(error, "journal write")  # before removal: an ongoing flush then aborts
        for token in tokens:
            if type(token) is tuple:
                _, ledger_id, _, future, entry_ids = token
                for removed in entry_ids:
                    self._flusher.remove(ledger_id, removed)
                future.try_finish(None, failure)
            else:
                token.try_finish(None, failure)

    def fence(self, ledger_id: int) -> Future[None]:
        """Fence a ledger (recovery): later plain adds fail with ``LedgerFenced``. The Future
        resolves once the fence is durable."""
        self._check_writable()
        if ledger_id in self._fenced_deleted:  # fenced for good
            done: LightFuture[None] = new_future()
            done.try_finish(None, None)
            return done
        meta = self._ledger_for_write(ledger_id)
        meta.fenced = True
        self._flusher.mark_dirty(ledger_id)
        future: LightFuture[None] = new_future()
        self._journal.append((encode_header(RECORD_FENCE, ledger_id, 0, b""),), future)
        return future

    def is_fenced(self, ledger_id: int) -> bool:
        return self._meta(ledger_id).fenced

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's metadata and index atomically; GC later reclaims its bytes."""
        self._check_writable()
        with self._flush_lock:
            with self._meta_lock, self._cache_cv:
                meta = self._ledgers.get(ledger_id)
                if meta is None:
                    raise NoSuchLedger(f"ledger {ledger_id} does not exist")
                batch = WriteBatch(raw_mode=True)
                LedgerMetadataIndex.stage_delete(batch, ledger_id, fenced=meta.fenced)
                EntryLocationIndex.stage_delete_ledger(batch, ledger_id)
                try:
                    self._meta_index.write(batch)
                except Exception as exc:
                    raise self._read_only.write_failed(exc, f"deleting ledger {ledger_id} from the index") from exc
                del self._ledgers[ledger_id]
                if meta.fenced:
                    self._fenced_deleted.add(ledger_id)
                self._flusher.forget_ledger(ledger_id)
            self._read_cache.delete_ledger(ledger_id)

    @property
    def read_only_reason(self) -> str | None:
        """Why the storage refuses writes (None while writable)."""
        return self._read_only.reason

    # --- reads -------------------------------------------------------------------------
    def _meta(self, ledger_id: int) -> LedgerMeta:
        if self._closed:
            raise StorageClosed("storage is closed")
        meta = self._ledgers.get(ledger_id)
        if meta is None:
            raise NoSuchLedger(f"ledger {ledger_id} does not exist")
        return meta

    def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def ledgers(self) -> list[int]:
        return sorted(self._ledgers)

    def get_last_add_confirmed(self, ledger_id: int) -> int:
        """The highest durable entry id of the ledger, or -1 when it has none."""
        return self._meta(ledger_id).last_add_confirmed

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's bytes; ``entry_id == -1`` reads the last add confirmed."""
        meta = self._meta(ledger_id)
        if entry_id == LAST_ADD_CONFIRMED:
            entry_id = meta.last_add_confirmed
            if entry_id < 0:
                raise NoSuchEntry(f"ledger {ledger_id} has no confirmed entry")
        return self._reader.get_entry(ledger_id, entry_id)

    def get_entries(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """Entries ``first..last`` of a ledger in order, each as :meth:`get_entry` returns it
        (``NoSuchEntry`` for one that is missing), read-ahead serving the range at once."""
        self._meta(ledger_id)
        return self._reader.get_entries(ledger_id, first_entry_id, last_entry_id)

    # --- flush, checkpoint, GC --------------------------------------------------------------
    def flush(self) -> None:
        """Move everything in the write cache to synced entry logs and index."""
        self._flusher.flush(checkpoint=False)

    def checkpoint(self) -> LogMark:
        """Flush, then persist the journal mark and delete journal files wholly before it."""
        self._flusher.flush(checkpoint=True)
        return self._flusher.last_mark

    def collect_garbage(self, compaction_threshold: float | None = None) -> GcResult:
        """Delete entry logs without live data and compact those under the threshold
        (default: the major compaction threshold)."""
        self._read_only.check()
        threshold = self.config.major_compaction_threshold if compaction_threshold is None else compaction_threshold
        try:
            return self._gc.run(threshold)
        except Exception as exc:
            raise self._read_only.write_failed(exc, "entry-log garbage collection") from exc

    def _gc_loop(self, stop: threading.Event) -> None:
        interval_s = self.config.gc_interval_ms / 1000.0
        last_minor = last_major = time.monotonic()
        while not stop.wait(interval_s):
            if self._read_only.active:
                continue
            now = time.monotonic()
            threshold = 0.0
            if now - last_major >= self.config.major_compaction_interval_ms / 1000.0:
                threshold, last_major, last_minor = self.config.major_compaction_threshold, now, now
            elif now - last_minor >= self.config.minor_compaction_interval_ms / 1000.0:
                threshold, last_minor = self.config.minor_compaction_threshold, now
            try:
                self._gc.run(threshold)
            except StorageError:
                pass
            except Exception as exc:  # OSError, or rocksdict's I/O errors
                if is_transient(exc):
                    self._gc_trouble.failed(exc)  # logged once; the next run tries again
                else:
                    self._read_only.enter(exc, "entry-log garbage collection")
            else:
                self._gc_trouble.succeeded()

    # --- introspection -----------------------------------------------------------------
    @property
    def read_only(self) -> bool:
        return self._read_only.active

    def statistics(self) -> StorageStats:
        return StorageStats(
            ledgers=len(self._ledgers),
            entries_added=self._entries_added,
            read_only=self.read_only,
            flushes=self._flusher.flushes,
            checkpoints=self._flusher.checkpoints,
            last_checkpoint=(self._flusher.last_mark.file_id, self._flusher.last_mark.offset),
            replayed_records=self._replayed,
            journal=self._journal.statistics(),
            write_cache=self._flusher.active.statistics(),
            write_cache_being_flushed=self._flusher.flushing.statistics(),
            read_cache=self._read_cache.statistics(),
            read_path=self._reader.statistics(),
            entry_logs=self._logs.statistics(),
            index=self._index.statistics(),
            gc=self._gc.statistics(),
            flush_latency=self._flusher.flush_latency.snapshot(),
        )

    def check_consistency(self) -> ConsistencyReport:
        """Every index entry must belong to a live ledger and point at a readable, CRC-valid
        record; no ledger's LAC may be below an indexed entry that it acknowledged."""
        problems: list[str] = []
        checked = 0
        with self._flush_lock:
            for ledger_id, entry_id, location in self._index.items():
                checked += 1
                if ledger_id not in self._ledgers:
                    problems.append(f"index holds {ledger_id}:{entry_id} of a deleted ledger")
                    continue
                try:
                    self._logs.read(location, ledger_id, entry_id)
                except (CorruptEntry, LogMissing, OSError) as exc:
                    problems.append(f"{ledger_id}:{entry_id} at {location:#x}: {exc!r}")
        return ConsistencyReport(checked, tuple(problems))
