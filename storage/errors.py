"""Typed errors of the embedded bookie, and the root of Magnetar's one error hierarchy.

Every failure that leaves ``storage/`` is one of these classes. Policy lives on the class:
``code`` is a stable machine-readable name, ``retriable`` says whether the same call may
succeed later, and ``http_status`` is the status the API edge maps it to (the mapping is done
once, in ``api/``; storage never speaks HTTP itself). ``MagnetarError`` is the root that the
broker's errors (``broker/errors.py``) extend too, since storage may not import the broker.
"""

from __future__ import annotations


class MagnetarError(Exception):
    """Root of every error Magnetar raises on purpose."""

    code = "internal_error"
    retriable = False
    http_status = 500


class StorageError(MagnetarError):
    """Root of every storage error."""

    code = "storage_error"
    retriable = False
    http_status = 500


class NoSuchLedger(StorageError):
    code = "no_such_ledger"
    http_status = 404


class NoSuchEntry(StorageError):
    code = "no_such_entry"
    http_status = 404


class LedgerFenced(StorageError):
    """The ledger was fenced (opened for recovery); plain adds are refused."""

    code = "ledger_fenced"
    http_status = 409


class CorruptEntry(StorageError):
    """A stored record failed its size or CRC check; its bytes are never returned."""

    code = "corrupt_entry"
    http_status = 500


class StorageReadOnly(StorageError):
    """Writes are refused: an I/O error put the storage in read-only mode, or it was opened so."""

    code = "storage_read_only"
    http_status = 503


class StorageIOError(StorageReadOnly):
    """A write or fsync failed. The add is not acknowledged and the storage turns read-only."""

    code = "storage_io_error"


class StorageFull(StorageIOError):
    """A write failed because the disk is full: the storage is read-only (reads go on) until it
    is restarted with space; everything acknowledged before is kept."""

    code = "storage_full"


class StorageBusy(StorageError):
    """A resource ran out for a moment (file descriptors, memory) before anything was written;
    the storage stays writable and the same call may succeed shortly."""

    code = "storage_busy"
    retriable = True
    http_status = 503


class WriteCacheFull(StorageError):
    """Back-pressure: the write cache stayed full for longer than the configured wait."""

    code = "write_cache_full"
    retriable = True
    http_status = 503


class StorageClosed(StorageError):
    """The storage was closed by its owner."""

    code = "storage_closed"
    http_status = 503


class InvalidArgument(StorageError):
    code = "invalid_argument"
    http_status = 400


class MetadataStoreUnavailable(StorageError):
    """ZooKeeper (where bookies register and a cluster's brokers keep their metadata) could not
    be reached, or the session was lost during a call; the same call may succeed once it is back."""

    code = "metadata_store_unavailable"
    retriable = True
    http_status = 503
