"""The embedded bookie: journal, write cache, entry logs, RocksDB index, read cache and GC.

Public surface (pinned; the broker and the checks use only this)::

    from storage import LedgerStorage, StorageConfig
    st = LedgerStorage.open(path, StorageConfig(...))    # recovers on open
    fut = st.add_entry(ledger_id, entry_id, data)       # Future, done once durable
    data = st.get_entry(ledger_id, entry_id)            # entry_id=-1: last add confirmed
    BookieServer(st, host, port)                        # the same storage over TCP (``magnetar bookie``)

and the bookie protocol's codec (``storage/bookie_protocol.py``) for clients of such a server.

``storage`` imports nothing from ``broker`` or ``api``.
"""

from storage.bookie_protocol import (
    FrameDecoder,
    Kind,
    ProtocolError,
    Response,
    decode_response,
    encode_add,
    encode_ledger_op,
    encode_read,
    encode_read_range,
)
from storage.bookie_server import BookieServer, BookieServerStats
from storage.config import StorageConfig
from storage.errors import (
    CorruptEntry,
    InvalidArgument,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    StorageClosed,
    StorageError,
    StorageIOError,
    StorageReadOnly,
    WriteCacheFull,
)
from storage.ledger_storage import LAST_ADD_CONFIRMED, ConsistencyReport, LedgerStorage, StorageStats

__all__ = [
    "LAST_ADD_CONFIRMED",
    "BookieServer",
    "BookieServerStats",
    "FrameDecoder",
    "Kind",
    "ProtocolError",
    "Response",
    "decode_response",
    "encode_add",
    "encode_ledger_op",
    "encode_read",
    "encode_read_range",
    "ConsistencyReport",
    "CorruptEntry",
    "InvalidArgument",
    "LedgerFenced",
    "LedgerStorage",
    "NoSuchEntry",
    "NoSuchLedger",
    "StorageClosed",
    "StorageConfig",
    "StorageError",
    "StorageIOError",
    "StorageReadOnly",
    "StorageStats",
    "WriteCacheFull",
]
