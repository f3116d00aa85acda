"""The storage's read-only mode: entered on the first write or sync that failed for good.

Role: a bookie whose disk failed a write stops taking writes and goes on serving reads
(BookKeeper's read-only bookie). ``ReadOnlyState`` remembers the first cause, turns each later
write into the error that says why (``StorageFull`` when the disk is full, else
``StorageReadOnly``), and tells a failure that is transient (``io_errors.is_transient``: nothing
was written, retry) from one that is not.

Invariants: the state never goes back to writable in a running process (a restart does); the
first cause is kept and logged once; entering it wakes every thread waiting on the write cache
(its condition), so a write waiting for room fails at once instead of at its deadline.
"""

from __future__ import annotations

import logging
import threading

from storage.errors import StorageBusy, StorageError, StorageFull, StorageIOError, StorageReadOnly
from storage.io_errors import OnceLog, describe, is_disk_full, is_transient

log = logging.getLogger(__name__)


class ReadOnlyState:
    """Whether (and why) the storage refuses writes."""

    def __init__(self, cache_cv: threading.Condition, busy: OnceLog) -> None:
        self._cache_cv = cache_cv
        """The write cache's condition, notified on entering read-only."""
        self._busy = busy
        """Logs transient failures of storage calls once."""
        self.cause: BaseException | None = None

    @property
    def active(self) -> bool:
        return self.cause is not None

    def error(self) -> StorageReadOnly:
        """The refusal of a write while read-only, saying why."""
        cause = self.cause
        if cause is not None and is_disk_full(cause):
            return StorageFull(f"storage is read-only: the disk is full ({describe(cause)}); free space and restart")
        return StorageReadOnly(f"storage is read-only after an I/O error ({describe(cause) if cause else '?'}); "
                               "restart to write again")

    def check(self) -> None:
        """Raise :meth:`error` while read-only."""
        if self.cause is not None:
            raise self.error()

    @property
    def reason(self) -> str | None:
        """Why the storage refuses writes (None while writable)."""
        cause = self.cause
        if cause is None:
            return None
        return f"{'disk full: ' if is_disk_full(cause) else ''}{describe(cause)}"

    def write_failed(self, cause: BaseException, what: str) -> StorageError:
        """The error a failed write becomes: ``StorageBusy`` when it was transient (nothing was
        written; the storage stays writable), else read-only from now on."""
        if is_transient(cause):
            self._busy.failed(cause)
            return StorageBusy(f"{what} failed for now ({describe(cause)}); retry")
        return self.enter(cause, what)

    def enter(self, cause: BaseException, what: str) -> StorageIOError:
        """Turn read-only because ``what`` failed with ``cause``; the error to raise for it."""
        with self._cache_cv:
            first = self.cause is None
            if first:
                self.cause = cause
            self._cache_cv.notify_all()
        if first:
            log.error("storage is now read-only (reads go on; restart to write again): %s failed: %s%s",
                      what, describe(cause), " — the disk is full" if is_disk_full(cause) else "")
        if isinstance(cause, StorageIOError):
            return cause
        if is_disk_full(cause):
            return StorageFull(f"the disk is full ({what} failed: {describe(cause)}); storage is read-only")
        return StorageIOError(f"storage I/O failed ({what}: {describe(cause)}), now read-only")
