"""What an I/O failure means: transient, disk full, or a broken disk.

Role: one place decides how the storage reacts to an ``OSError`` (or a RocksDB error, which
rocksdict raises as a plain ``Exception`` carrying RocksDB's status text):

- **transient**: the process ran out of a resource that comes back by itself (file
  descriptors, kernel memory). Nothing was written, so the operation is retried later; the
  storage stays writable. A client flood that exhausts file descriptors must never turn the
  storage read-only.
- **disk full** (``ENOSPC``, ``EDQUOT``): a write failed; the storage turns read-only and says
  the disk is full (``StorageFull``), so an operator knows what to fix.
- anything else on the write path: the storage turns read-only (``StorageIOError``); after a
  failed write or fsync the kernel may have dropped dirty pages, so retrying could report
  success for lost data.

``OnceLog`` logs a recurring condition once when it starts and once when it clears, instead of
once per attempt (a retry loop must not flood the log).

Invariant: ``is_transient`` is true only for failures that happen before any byte is written
(opening a file, allocating memory); a failed write or sync is never transient.
"""

from __future__ import annotations

import errno
import logging
import threading

from storage.errors import StorageBusy, StorageError, StorageFull, StorageIOError

TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN,
                              errno.EINTR})
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_ROCKSDB_TRANSIENT = ("Too many open files", "Cannot allocate memory", "Resource temporarily unavailable")
_ROCKSDB_DISK_FULL = ("No space left on device", "Disk quota exceeded")


def is_transient(error: BaseException) -> bool:
    """A resource ran out before anything was written: retry later, stay writable."""
    if isinstance(error, OSError):
        return error.errno in TRANSIENT_ERRNOS
    return _is_rocksdb_error(error) and any(text in str(error) for text in _ROCKSDB_TRANSIENT)


def is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return error.errno in DISK_FULL_ERRNOS
    return _is_rocksdb_error(error) and any(text in str(error) for text in _ROCKSDB_DISK_FULL)


def _is_rocksdb_error(error: BaseException) -> bool:
    """rocksdict reports RocksDB's status as a plain ``Exception`` whose text starts with the
    status kind (``IO error: …``)."""
    return type(error) is Exception


def describe(error: BaseException) -> str:
    """``EMFILE (Too many open files): <path>`` for an OSError, the text otherwise."""
    if isinstance(error, OSError) and error.errno is not None:
        name = errno.errorcode.get(error.errno, str(error.errno))
        where = f": {error.filename}" if error.filename else ""
        return f"{name} ({error.strerror}){where}"
    return str(error) or type(error).__name__


def as_storage_error(error: BaseException, what: str) -> StorageError:
    """``error`` (an ``OSError`` or a RocksDB error) as the storage error it means, for code
    that writes outside ``LedgerStorage`` (the broker's RocksDB metadata store): ``StorageBusy``
    when transient, ``StorageFull`` when the disk is full, else ``StorageIOError``."""
    if isinstance(error, StorageError):
        return error
    if is_transient(error):
        return StorageBusy(f"{what} failed for now ({describe(error)}); retry")
    if is_disk_full(error):
        return StorageFull(f"the disk is full: {what} failed ({describe(error)})")
    return StorageIOError(f"{what} failed: {describe(error)}")


class OnceLog:
    """Logs a condition when it starts and when it clears, never per occurrence."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._logger = logger
        self._what = what
        self._lock = threading.Lock()
        self._active = False
        self.occurrences = 0

    def failed(self, error: BaseException) -> None:
        with self._lock:
            self.occurrences += 1
            first, self._active = not self._active, True
        if first:
            self._logger.warning("%s failed (%s); retrying, storage stays writable", self._what, describe(error))

    def succeeded(self) -> None:
        with self._lock:
            cleared, self._active = self._active, False
        if cleared:
            self._logger.warning("%s works again", self._what)

    @property
    def active(self) -> bool:
        return self._active
