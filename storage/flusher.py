"""The write caches and their flush to entry logs and index, and the checkpoint after it.

Role: the half of the bookie between the journal and the entry logs (BookKeeper's
DbLedgerStorage write cache and its ``SyncThread``). Every add puts its entry in the *active*
write cache before its journal record is written; a full cache pushes back (the add waits, then
fails with ``WriteCacheFull``). In the background (the active buffer over its flush threshold,
or every ``flush_interval_ms``) the buffers are swapped, the sealed one is written to the entry
logs sorted by ledger and entry, the logs are synced, the locations and dirty ledger metadata go
to the index in one synced batch, and the checkpoint persists the journal mark taken at the swap
and deletes the journal files wholly before it::

    swap buffers ─▶ sorted entries to EntryLogger ─▶ fsync ─▶ index batch (synced)
                 ─▶ checkpoint: persist the LogMark taken at the swap ─▶ delete older journal files

Invariants:
- The checkpoint mark is taken at the buffer swap, so every record before it is in the flushed
  buffer; the mark is persisted only after that buffer is in synced entry logs and index.
- No entry leaves the caches before it is in the entry logs and the index: a sealed buffer
  whose write failed transiently stays sealed and is written first, before any new swap
  (retried after ``FLUSH_RETRY_MS``); any other failure turns the storage read-only.
- Readers look at the active buffer, then the one being flushed: the swap publishes the sealed
  buffer as being flushed before it installs a new active one.
- ``flush_latency`` times every successful write of a sealed buffer (entry logs, their sync,
  the index batch), so a stall of the broker's event loop can be put beside the flush that ran.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from storage.config import StorageConfig
from storage.entry_location_index import EntryLocationIndex, in_slices
from storage.entry_log import EntryLogger
from storage.errors import StorageBusy, StorageError, WriteCacheFull
from storage.fileio import FileIO
from storage.histogram import LatencyHistogram
from storage.io_errors import OnceLog, describe, is_transient
from storage.journal import Journal, LogMark
from storage.ledger_metadata_index import LedgerMeta, LedgerMetadataIndex
from storage.limits import FLUSH_RETRY_MS
from storage.read_only import ReadOnlyState
from storage.write_cache import PUT_OK, PUT_SEALED, WriteCache

FLUSH_BUCKETS_US = (1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 5_000_000)
"""Bucket bounds of the flush latency histogram."""

log = logging.getLogger(__name__)


class Flusher:
    """The active write cache, the one being flushed, and their flush; every method is safe to
    call from any thread."""

    def __init__(self, config: StorageConfig, fileio: FileIO, journal: Journal, logs: EntryLogger,
                 index: EntryLocationIndex, meta_index: LedgerMetadataIndex, ledgers: dict[int, LedgerMeta],
                 read_only: ReadOnlyState, *, cache_cv: threading.Condition, flush_lock: threading.Lock,
                 check_writable: Callable[[], None]) -> None:
        self.config = config
        self._fileio = fileio
        self._journal = journal
        self._logs = logs
        self._index = index
        self._meta_index = meta_index
        self._ledgers = ledgers
        """The storage's live ledgers (shared): a flush writes only their entries."""
        self._read_only = read_only
        self._cache_cv = cache_cv
        """Guards the swap; notified when a flushed buffer frees room."""
        self._flush_lock = flush_lock
        """One flush at a time (GC and ledger deletion take it too)."""
        self._check_writable = check_writable
        """Raises while the storage is closed or read-only (checked by an add waiting for room)."""
        self.active = WriteCache(config.write_cache_bytes_max)
        self.flushing = WriteCache(config.write_cache_bytes_max)
        self._flush_bytes = config.write_cache_flush_bytes
        self._dirty_ledgers: set[int] = set()
        self._unflushed: tuple[LogMark, dict[int, LedgerMeta]] | None = None
        self._flush_trouble = OnceLog(log, "flushing the write cache")
        self._flush_wanted = threading.Event()
        self.flushes = 0
        self.checkpoints = 0
        self.flush_latency = LatencyHistogram(FLUSH_BUCKETS_US)
        """How long writing a sealed buffer took: entries to the entry logs, their sync, the index batch."""
        self.last_mark = LogMark(0, 0)

    # --- the caches ------------------------------------------------------------------------
    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Put an entry in the active cache; while it is full, wait (at most
        ``write_cache_full_wait_ms``, then ``WriteCacheFull``) for a flush to free room."""
        active = self.active
        outcome = active.put(ledger_id, entry_id, data)  # fast path: only the buffer's own lock
        if outcome == PUT_OK:
            if active.size_seen_bytes >= self._flush_bytes and not self._flush_wanted.is_set():
                self._flush_wanted.set()
            return
        deadline = time.monotonic() + self.config.write_cache_full_wait_ms / 1000.0
        with self._cache_cv:
            while True:
                active = self.active
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

    def remove(self, ledger_id: int, entry_id: int) -> None:
        """Take an entry out of both caches (its add failed: it never was)."""
        self.active.remove(ledger_id, entry_id)
        self.flushing.remove(ledger_id, entry_id)

    def mark_dirty(self, ledger_id: int) -> None:
        """The ledger's metadata changed: the next flush writes it."""
        with self._cache_cv:
            self._dirty_ledgers.add(ledger_id)

    def forget_ledger(self, ledger_id: int) -> None:
        """The ledger is deleted: drop its entries and metadata change (call with the cache's
        condition held)."""
        self._dirty_ledgers.discard(ledger_id)
        self.active.delete_ledger(ledger_id)
        self.flushing.delete_ledger(ledger_id)

    # --- flush and checkpoint ---------------------------------------------------------------
    def flush(self, *, checkpoint: bool) -> None:
        """Swap the buffers and write the sealed one out. A sealed buffer whose write failed
        transiently stays sealed (``_unflushed``) and is written first, before any new swap,
        so no entry leaves the caches before it is in the entry logs and the index."""
        with self._flush_lock:
            self._read_only.check()
            if self._unflushed is not None:
                self._complete_flush(*self._unflushed)
            with self._cache_cv:
                mark = self._journal.last_written_mark()
                sealed = self.active
                sealed.seal()
                self.flushing = sealed  # readers look at active, then flushing: set this first
                self.active = WriteCache(self.config.write_cache_bytes_max)
                dirty = {lid: self._ledgers[lid] for lid in self._dirty_ledgers if lid in self._ledgers}
                self._dirty_ledgers.clear()
            self._unflushed = (mark, dirty)
            self._complete_flush(mark, dirty)
            if checkpoint and mark > self.last_mark:
                self._write_checkpoint(mark)

    def _complete_flush(self, mark: LogMark, dirty: dict[int, LedgerMeta]) -> None:
        """Write the sealed buffer to synced entry logs and index. Records of an attempt that
        failed are unreferenced garbage in the log, which GC reclaims."""
        try:
            started_s = time.perf_counter()
            self._write_flushing(dirty)
            self.flush_latency.record(time.perf_counter() - started_s)
        except StorageError:
            raise
        except Exception as exc:  # OSError, or rocksdict's I/O errors (plain Exceptions)
            self._logs.abandon_pending()
            if is_transient(exc):
                self._flush_trouble.failed(exc)
                raise StorageBusy(f"flushing the write cache failed for now ({describe(exc)})") from exc
            raise self._read_only.enter(exc, "flushing the write cache to the entry logs and index") from exc
        self._flush_trouble.succeeded()
        with self._cache_cv:
            self.flushing = WriteCache(self.config.write_cache_bytes_max)
            self._unflushed = None
            self._cache_cv.notify_all()
        self.flushes += 1

    def _write_checkpoint(self, mark: LogMark) -> None:
        try:
            self._journal.write_mark(mark)
            self._journal.trim_before(mark)
        except OSError as exc:
            if is_transient(exc):  # the data is flushed; the next flush checkpoints again
                self._flush_trouble.failed(exc)
                return
            raise self._read_only.enter(exc, "writing the journal checkpoint") from exc
        self.last_mark = mark
        self.checkpoints += 1

    def _write_flushing(self, dirty: dict[int, LedgerMeta]) -> None:
        live = self._ledgers
        locations: list[tuple[int, int, int]] = []
        for piece in in_slices(e for e in self.flushing.sorted_entries() if e[0] in live):
            locations += self._logs.add_many(piece)
        self._fileio.failpoint("flush: after entry log append, before sync")
        self._logs.flush()
        self._fileio.failpoint("flush: after entry log sync, before index write")
        self._read_only.check()  # a failed add may be in this buffer: index nothing
        self._index.put_batch(locations)
        self._meta_index.put_many(dirty)
        self._fileio.failpoint("flush: after index write, before checkpoint")

    # --- the flush thread -------------------------------------------------------------------
    def wake(self) -> None:
        """Flush now rather than at the next interval (also wakes the thread to see a stop)."""
        self._flush_wanted.set()

    def run(self, stop: threading.Event) -> None:
        """Flush and checkpoint every ``flush_interval_ms``, or at once when woken, until ``stop``."""
        interval_s = self.config.flush_interval_ms / 1000.0
        wait_s = interval_s
        while not stop.is_set():
            self._flush_wanted.wait(wait_s)
            self._flush_wanted.clear()
            wait_s = interval_s
            if stop.is_set() or self._read_only.active:
                continue
            if len(self.active) or self._dirty_ledgers or self._unflushed is not None:
                try:
                    self.flush(checkpoint=True)
                except StorageBusy:  # logged once; the sealed buffer waits for the retry
                    wait_s = min(interval_s, FLUSH_RETRY_MS / 1000.0)
                except StorageError:  # read-only now (logged); adds report the cause
                    pass
