"""The embedded bookie: journal, write cache, entry logs, RocksDB index, read cache and GC.

Public surface (pinned; the broker and the checks use only this)::

    from storage import LedgerStorage, StorageConfig
    st = LedgerStorage.open(path, StorageConfig(...))    # recovers on open
    fut = st.add_entry(ledger_id, entry_id, data)       # Future, done once durable
    data = st.get_entry(ledger_id, entry_id)            # entry_id=-1: last add confirmed

``storage`` imports nothing from ``broker`` or ``api``.
"""

from storage.config import StorageConfig
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
from storage.io_errors import as_storage_error
from storage.ledger_storage import LAST_ADD_CONFIRMED, ConsistencyReport, LedgerStorage, StorageStats

__all__ = [
    "LAST_ADD_CONFIRMED",
    "ConsistencyReport",
    "CorruptEntry",
    "InvalidArgument",
    "LedgerFenced",
    "LedgerStorage",
    "NoSuchEntry",
    "NoSuchLedger",
    "StorageBusy",
    "StorageClosed",
    "StorageConfig",
    "StorageError",
    "StorageFull",
    "StorageIOError",
    "StorageReadOnly",
    "StorageStats",
    "WriteCacheFull",
    "as_storage_error",
]
