"""LedgerStorage: the front door of the embedded bookie (BookKeeper's DbLedgerStorage).

Write path::

    add_entries ─▶ WriteCache.put (active buffer; full → back-pressure)
                ─▶ Journal.append ─▶ group commit: one writev + one fdatasync ─▶ Future done
    background: active buffer over its threshold, or every flush_interval_ms
              ─▶ swap buffers ─▶ sorted entries to EntryLogger ─▶ fsync ─▶ index batch (synced)
              ─▶ checkpoint: persist the LogMark taken at the swap ─▶ delete older journal files

Read path: active write cache ─▶ buffer being flushed ─▶ read cache ─▶ location index ─▶ entry
log, filling the read cache with the entries that follow in the same log (read-ahead) when the
read continues the ledger's last one (or is its first): a reader that jumps about a ledger (the
reads of one key's stream) reads only its entry, and goes back to read-ahead on its next
sequential miss.

Layout under the data directory: ``journal/`` (journal files and ``lastMark``),
``entrylogs/`` (entry logs), ``index/`` (RocksDB: locations and ledger metadata). The journal
may live elsewhere (``journal_dir``: its own disk, as BookKeeper recommends, so its fsyncs
never queue behind entry-log writes).

Invariants:
- A Future from :meth:`add_entries` completes only after its entries' journal records are synced;
  after a crash at any instant every acknowledged entry reads back byte-for-byte.
- The checkpoint mark is taken at the buffer swap, so every record before it is in the flushed
  buffer; the mark is persisted only after that buffer is in synced entry logs and index.
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
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rocksdict import WriteBatch

from storage.config import StorageConfig
from storage.entry_location_index import EntryLocationIndex, IndexStats, in_slices, open_rdict
from storage.entry_log import EntryLogger, EntryLogStats, LogMissing
from storage.errors import (
    CorruptEntry,
    InvalidArgument,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    StorageBusy,
    StorageClosed,
    StorageError,
    StorageFull,
    StorageIOError,
    StorageReadOnly,
    WriteCacheFull,
)
from storage.fileio import FileIO
from storage.futures import LightFuture, new_future
from storage.gc import GarbageCollector, GcResult, GcStats, LogUsageIndex
from storage.io_errors import OnceLog, describe, is_disk_full, is_transient
from storage.journal import (
    CALLER_BACKSTOP_MS,
    RECORD_ADD_ENTRY,
    RECORD_FENCE,
    Journal,
    JournalRecord,
    JournalStats,
    LogMark,
    encode_header,
)
from storage.ledger_metadata_index import LedgerMeta, LedgerMetadataIndex
from storage.read_cache import ReadCache, ReadCacheStats
from storage.write_cache import PUT_OK, PUT_SEALED, WriteCache, WriteCacheStats

LAST_ADD_CONFIRMED = -1
READ_POSITIONS_MAX = 4096
"""Ledgers whose last entry-log read is remembered to tell sequential reads from jumps."""
ENTRY_ID_MAX = 2**63 - 1
FLUSH_RETRY_MS = 100
"""How soon a flush that failed transiently is tried again."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadPathStats:
    write_cache_hits: int
    flushing_cache_hits: int
    read_cache_hits: int
    entry_log_reads: int
    random_reads: int
    """Entry-log reads without read-ahead (not where the ledger's last read ended)."""


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
        self._active = WriteCache(config.write_cache_bytes_max)
        self._flushing = WriteCache(config.write_cache_bytes_max)
        self._cache_cv = threading.Condition()
        self._flush_bytes = config.write_cache_flush_bytes
        self._flush_lock = threading.Lock()
        self._meta_lock = threading.Lock()
        self._ledgers: dict[int, LedgerMeta] = {}
        self._dirty_ledgers: set[int] = set()
        self._gc = GarbageCollector(self._logs, self._index, fileio, ledger_exists=self._ledgers.__contains__,
                                    flush_lock=self._flush_lock, usage_index=LogUsageIndex(self._db))
        self._read_only_cause: BaseException | None = None
        self._unflushed: tuple[LogMark, dict[int, LedgerMeta]] | None = None
        self._flush_trouble = OnceLog(log, "flushing the write cache")
        self._gc_trouble = OnceLog(log, "entry-log garbage collection")
        self._busy = OnceLog(log, "a storage call")
        self._closed = False
        self._stop = threading.Event()
        self._flush_wanted = threading.Event()
        self._threads: list[threading.Thread] = []
        self._entries_added = 0
        self._flushes = 0
        self._checkpoints = 0
        self._last_mark = LogMark(0, 0)
        self._replayed = 0
        self._hits = [0, 0, 0, 0, 0]  # write cache, being flushed, read cache, entry log, of which random
        self._read_positions: OrderedDict[int, int] = OrderedDict()
        """Ledger → the entry after its last entry-log read and read-ahead (LRU, bounded)."""
        self._read_positions_lock = threading.Lock()

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
        for ledger_id, meta in self._ledgers.items():
            meta.last_add_confirmed = max(meta.last_add_confirmed, self._index.last_entry_id(ledger_id))
        self._last_mark = self._journal.read_mark()
        for record in self._journal.replay(self._last_mark):
            self._replay_record(record)
        self._journal.start()
        if self._replayed:
            self._flush(checkpoint=True)

    def _replay_record(self, record: JournalRecord) -> None:
        meta = self._ledgers.get(record.ledger_id)
        if meta is None:
            return  # the ledger was deleted after this record was written
        if record.record_type == RECORD_ADD_ENTRY:
            while self._active.put(record.ledger_id, record.entry_id, record.payload) != PUT_OK:
                self._flush(checkpoint=False)
            meta.last_add_confirmed = max(meta.last_add_confirmed, record.entry_id)
        elif record.record_type == RECORD_FENCE:
            meta.fenced = True
            self._dirty_ledgers.add(record.ledger_id)
        self._replayed += 1

    def _start_background(self) -> None:
        for target, name in ((self._flusher_loop, "magnetar-flush"), (self._gc_loop, "magnetar-gc")):
            thread = threading.Thread(target=target, name=name, daemon=True)
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
        self._flush_wanted.set()
        for thread in self._threads:
            thread.join()
        self._journal.close()
        if self._read_only_cause is None:
            with contextlib.suppress(StorageError):  # read-only now; the journal holds every ack
                self._flush(checkpoint=True)
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
        if self._read_only_cause is not None:
            raise self._read_only_error()

    def _ledger_for_write(self, ledger_id: int) -> LedgerMeta:
        existing = self._ledgers.get(ledger_id)
        if existing is not None:
            return existing
        with self._meta_lock:
            meta = self._ledgers.get(ledger_id)
            if meta is None:
                meta = LedgerMeta()
                try:
                    self._meta_index.put(ledger_id, meta)
                except Exception as exc:  # rocksdict raises plain Exception on I/O errors
                    raise self._write_failed(exc, f"recording new ledger {ledger_id} in the index") from exc
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
        if self._closed or self._read_only_cause is not None:
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
        put = self._put_in_cache
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
                self._active.remove(ledger_id, entry_id)
                self._flushing.remove(ledger_id, entry_id)
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

    def _put_in_cache(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        active = self._active
        outcome = active.put(ledger_id, entry_id, data)  # fast path: only the buffer's own lock
        if outcome == PUT_OK:
            if active.size_seen_bytes >= self._flush_bytes and not self._flush_wanted.is_set():
                self._flush_wanted.set()
            return
        deadline = time.monotonic() + self.config.write_cache_full_wait_ms / 1000.0
        with self._cache_cv:
            while True:
                active = self._active
                outcome = active.put(ledger_id, entry_id, data)
                if outcome == PUT_OK:
                    return
                if outcome == PUT_SEALED:
                    continue  # swapped meanwhile: retry on the new active buffer
                self._flush_wanted.set()
                now = time.monotonic()
                if now >= deadline:
                    raise WriteCacheFull(f"write cache full for {self.config.write_cache_full_wait_ms} ms")
                self._cache_cv.wait(deadline - now)
                self._check_writable()

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
        failure = self._enter_read_only(error, "journal write")  # before removal: an ongoing flush then aborts
        for token in tokens:
            if type(token) is tuple:
                _, ledger_id, _, future, entry_ids = token
                for removed in entry_ids:
                    self._active.remove(ledger_id, removed)
                    self._flushing.remove(ledger_id, removed)
                future.try_finish(None, failure)
            else:
                token.try_finish(None, failure)

    def fence(self, ledger_id: int) -> Future[None]:
        """Fence a ledger (recovery): later plain adds fail with ``LedgerFenced``. The Future
        resolves once the fence is durable."""
        self._check_writable()
        meta = self._ledger_for_write(ledger_id)
        meta.fenced = True
        with self._cache_cv:
            self._dirty_ledgers.add(ledger_id)
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
                if ledger_id not in self._ledgers:
                    raise NoSuchLedger(f"ledger {ledger_id} does not exist")
                batch = WriteBatch(raw_mode=True)
                LedgerMetadataIndex.stage_delete(batch, ledger_id)
                EntryLocationIndex.stage_delete_ledger(batch, ledger_id)
                try:
                    self._meta_index.write(batch)
                except Exception as exc:
                    raise self._write_failed(exc, f"deleting ledger {ledger_id} from the index") from exc
                del self._ledgers[ledger_id]
                self._dirty_ledgers.discard(ledger_id)
                self._active.delete_ledger(ledger_id)
                self._flushing.delete_ledger(ledger_id)
            self._read_cache.delete_ledger(ledger_id)

    def _read_only_error(self) -> StorageReadOnly:
        """The refusal of a write while read-only, saying why."""
        cause = self._read_only_cause
        if cause is not None and is_disk_full(cause):
            return StorageFull(f"storage is read-only: the disk is full ({describe(cause)}); free space and restart")
        return StorageReadOnly(f"storage is read-only after an I/O error ({describe(cause) if cause else '?'}); "
                               "restart to write again")

    @property
    def read_only_reason(self) -> str | None:
        """Why the storage refuses writes (None while writable)."""
        cause = self._read_only_cause
        if cause is None:
            return None
        return f"{'disk full: ' if is_disk_full(cause) else ''}{describe(cause)}"

    def _write_failed(self, cause: BaseException, what: str) -> StorageError:
        """The error a failed write becomes: ``StorageBusy`` when it was transient (nothing was
        written; the storage stays writable), else read-only from now on."""
        if is_transient(cause):
            self._busy.failed(cause)
            return StorageBusy(f"{what} failed for now ({describe(cause)}); retry")
        return self._enter_read_only(cause, what)

    def _enter_read_only(self, cause: BaseException, what: str) -> StorageIOError:
        with self._cache_cv:
            first = self._read_only_cause is None
            if first:
                self._read_only_cause = cause
            self._cache_cv.notify_all()
        if first:
            log.error("storage is now read-only (reads go on; restart to write again): %s failed: %s%s",
                      what, describe(cause), " — the disk is full" if is_disk_full(cause) else "")
        if isinstance(cause, StorageIOError):
            return cause
        if is_disk_full(cause):
            return StorageFull(f"the disk is full ({what} failed: {describe(cause)}); storage is read-only")
        return StorageIOError(f"storage I/O failed ({what}: {describe(cause)}), now read-only")

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
        data = self._cached(ledger_id, entry_id)
        return data if data is not None else self._read_from_log(ledger_id, entry_id)

    def _cached(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry from the write cache, the buffer being flushed or the read cache (counted)."""
        data = self._active.get(ledger_id, entry_id)
        if data is not None:
            self._hits[0] += 1
            return data
        data = self._flushing.get(ledger_id, entry_id)
        if data is not None:
            self._hits[1] += 1
            return data
        data = self._read_cache.get(ledger_id, entry_id)
        if data is not None:
            self._hits[2] += 1
        return data

    def get_entries(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """Entries ``first..last`` of a ledger in order, each as :meth:`get_entry` returns it
        (``NoSuchEntry`` for one that is missing). An entry-log read's read-ahead serves the
        following entries of the range at once, not through the read cache (counted as read-cache
        hits, which they would have been); what it read past ``last_entry_id`` goes to the cache."""
        self._meta(ledger_id)
        found: list[bytes] = []
        entry_id = first_entry_id
        while entry_id <= last_entry_id:
            data = self._cached(ledger_id, entry_id)
            if data is not None:
                found.append(data)
                entry_id += 1
                continue
            data, ahead = self._read_log_run(ledger_id, entry_id)
            found.append(data)
            entry_id += 1
            used = 0
            for ahead_entry, ahead_data in ahead:
                if ahead_entry != entry_id or entry_id > last_entry_id:
                    break
                found.append(ahead_data)
                entry_id += 1
                used += 1
            self._hits[2] += used
            self._read_cache.count_hits(used)
            for ahead_entry, ahead_data in ahead[used:]:
                self._read_cache.put(ledger_id, ahead_entry, ahead_data)
        return found

    def _read_from_log(self, ledger_id: int, entry_id: int) -> bytes:
        data, ahead = self._read_log_run(ledger_id, entry_id)
        for ahead_entry, ahead_data in ahead:
            self._read_cache.put(ledger_id, ahead_entry, ahead_data)
        return data

    def _read_log_run(self, ledger_id: int, entry_id: int) -> tuple[bytes, list[tuple[int, bytes]]]:
        """The entry from its entry log, with the entries of the ledger that follow it there
        (read ahead when the read continues where the ledger's last one ended)."""
        for _ in range(3):  # GC may move the entry between the lookup and the read
            location = self._index.get(ledger_id, entry_id)
            if location == 0:
                break
            sequential = self._continues_last_read(ledger_id, entry_id)
            try:
                data, ahead = self._logs.read(location, ledger_id, entry_id,
                                              read_ahead_entries=sequential * self.config.read_ahead_entries_max,
                                              read_ahead_bytes=sequential * self.config.read_ahead_bytes_max)
            except LogMissing:
                continue
            except OSError as exc:
                if is_transient(exc):
                    self._busy.failed(exc)
                    raise StorageBusy(f"entry {ledger_id}:{entry_id} cannot be read now ({describe(exc)}); "
                                      "retry") from exc
                raise CorruptEntry(f"entry {ledger_id}:{entry_id} unreadable: {exc}") from exc
            self._hits[3] += 1
            self._hits[4] += not sequential
            self._remember_read(ledger_id, entry_id + 1 + len(ahead))
            return data, ahead
        raise NoSuchEntry(f"entry {ledger_id}:{entry_id} does not exist")

    def _continues_last_read(self, ledger_id: int, entry_id: int) -> bool:
        """Whether a log read of ``entry_id`` should read ahead: the ledger's first remembered
        read, or the entry right after where its last read (and read-ahead) ended."""
        with self._read_positions_lock:
            expected = self._read_positions.get(ledger_id)
        return expected is None or expected == entry_id

    def _remember_read(self, ledger_id: int, next_entry_id: int) -> None:
        with self._read_positions_lock:
            self._read_positions[ledger_id] = next_entry_id
            self._read_positions.move_to_end(ledger_id)
            while len(self._read_positions) > READ_POSITIONS_MAX:
                self._read_positions.popitem(last=False)

    # --- flush, checkpoint, GC --------------------------------------------------------------
    def flush(self) -> None:
        """Move everything in the write cache to synced entry logs and index."""
        self._flush(checkpoint=False)

    def checkpoint(self) -> LogMark:
        """Flush, then persist the journal mark and delete journal files wholly before it."""
        self._flush(checkpoint=True)
        return self._last_mark

    def _flush(self, *, checkpoint: bool) -> None:
        """Swap the buffers and write the sealed one out. A sealed buffer whose write failed
        transiently stays sealed (``_unflushed``) and is written first, before any new swap,
        so no entry leaves the caches before it is in the entry logs and the index."""
        with self._flush_lock:
            if self._read_only_cause is not None:
                raise self._read_only_error()
            if self._unflushed is not None:
                self._complete_flush(*self._unflushed)
            with self._cache_cv:
                mark = self._journal.last_written_mark()
                sealed = self._active
                sealed.seal()
                self._flushing = sealed  # readers look at active, then flushing: set this first
                self._active = WriteCache(self.config.write_cache_bytes_max)
                dirty = {lid: self._ledgers[lid] for lid in self._dirty_ledgers if lid in self._ledgers}
                self._dirty_ledgers.clear()
            self._unflushed = (mark, dirty)
            self._complete_flush(mark, dirty)
            if checkpoint and mark > self._last_mark:
                self._write_checkpoint(mark)

    def _complete_flush(self, mark: LogMark, dirty: dict[int, LedgerMeta]) -> None:
        """Write the sealed buffer to synced entry logs and index. Records of an attempt that
        failed are unreferenced garbage in the log, which GC reclaims."""
        try:
            self._write_flushing(dirty)
        except StorageError:
            raise
        except Exception as exc:  # OSError, or rocksdict's I/O errors (plain Exceptions)
            self._logs.abandon_pending()
            if is_transient(exc):
                self._flush_trouble.failed(exc)
                raise StorageBusy(f"flushing the write cache failed for now ({describe(exc)})") from exc
            raise self._enter_read_only(exc, "flushing the write cache to the entry logs and index") from exc
        self._flush_trouble.succeeded()
        with self._cache_cv:
            self._flushing = WriteCache(self.config.write_cache_bytes_max)
            self._unflushed = None
            self._cache_cv.notify_all()
        self._flushes += 1

    def _write_checkpoint(self, mark: LogMark) -> None:
        try:
            self._journal.write_mark(mark)
            self._journal.trim_before(mark)
        except OSError as exc:
            if is_transient(exc):  # the data is flushed; the next flush checkpoints again
                self._flush_trouble.failed(exc)
                return
            raise self._enter_read_only(exc, "writing the journal checkpoint") from exc
        self._last_mark = mark
        self._checkpoints += 1

    def _write_flushing(self, dirty: dict[int, LedgerMeta]) -> None:
        live = self._ledgers
        locations: list[tuple[int, int, int]] = []
        for piece in in_slices(e for e in self._flushing.sorted_entries() if e[0] in live):
            locations += self._logs.add_many(piece)
        self._fileio.failpoint("flush: after entry log append, before sync")
        self._logs.flush()
        self._fileio.failpoint("flush: after entry log sync, before index write")
        if self._read_only_cause is not None:  # a failed add may be in this buffer: index nothing
            raise self._read_only_error()
        self._index.put_batch(locations)
        self._meta_index.put_many(dirty)
        self._fileio.failpoint("flush: after index write, before checkpoint")

    def collect_garbage(self, compaction_threshold: float | None = None) -> GcResult:
        """Delete entry logs without live data and compact those under the threshold
        (default: the major compaction threshold)."""
        if self._read_only_cause is not None:
            raise self._read_only_error()
        threshold = self.config.major_compaction_threshold if compaction_threshold is None else compaction_threshold
        try:
            return self._gc.run(threshold)
        except Exception as exc:
            raise self._write_failed(exc, "entry-log garbage collection") from exc

    def _flusher_loop(self) -> None:
        interval_s = self.config.flush_interval_ms / 1000.0
        wait_s = interval_s
        while not self._stop.is_set():
            self._flush_wanted.wait(wait_s)
            self._flush_wanted.clear()
            wait_s = interval_s
            if self._stop.is_set() or self._read_only_cause is not None:
                continue
            if len(self._active) or self._dirty_ledgers or self._unflushed is not None:
                try:
                    self._flush(checkpoint=True)
                except StorageBusy:  # logged once; the sealed buffer waits for the retry
                    wait_s = min(interval_s, FLUSH_RETRY_MS / 1000.0)
                except StorageError:  # read-only now (logged); adds report the cause
                    pass

    def _gc_loop(self) -> None:
        interval_s = self.config.gc_interval_ms / 1000.0
        last_minor = last_major = time.monotonic()
        while not self._stop.wait(interval_s):
            if self._read_only_cause is not None:
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
                    self._enter_read_only(exc, "entry-log garbage collection")
            else:
                self._gc_trouble.succeeded()

    # --- introspection -----------------------------------------------------------------
    @property
    def read_only(self) -> bool:
        return self._read_only_cause is not None

    def statistics(self) -> StorageStats:
        return StorageStats(
            ledgers=len(self._ledgers),
            entries_added=self._entries_added,
            read_only=self.read_only,
            flushes=self._flushes,
            checkpoints=self._checkpoints,
            last_checkpoint=(self._last_mark.file_id, self._last_mark.offset),
            replayed_records=self._replayed,
            journal=self._journal.statistics(),
            write_cache=self._active.statistics(),
            write_cache_being_flushed=self._flushing.statistics(),
            read_cache=self._read_cache.statistics(),
            read_path=ReadPathStats(*self._hits),
            entry_logs=self._logs.statistics(),
            index=self._index.statistics(),
            gc=self._gc.statistics(),
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
