"""The embedded bookie: journal, write cache, entry logs, RocksDB index, read cache and GC.

Public surface (pinned; the broker and the checks use only this module, never a submodule;
``tests/unit/test_layering.py`` enforces it)::

    from storage import LedgerStorage, StorageConfig
    st = LedgerStorage.open(path, StorageConfig(...))    # recovers on open
    fut = st.add_entries(ledger_id, [entry_id], [data])  # Future, done once all are durable
    data = st.get_entry(ledger_id, entry_id)            # entry_id=-1: last add confirmed
    BookieServer(st, host, port)                        # the same storage over TCP (``magnetar bookie``)

and the bookie protocol's codec (``storage/bookie_protocol.py``) for clients of such a server.

Besides the bookie itself it exports what the broker builds on: the error hierarchy's root and
storage errors, the light ``Future`` the add path completes (``new_future``), the file-system
boundary (``FileIO`` and its fault-injecting twin, for tests), the RocksDB helpers the broker's
metadata store and key index share (``open_rdict``, ``write_durably``, ``iterate_prefix``) and
the mapping of raw I/O errors onto storage errors (``as_storage_error``), and the fixed-bucket
latency histogram its statistics use (``LatencyHistogram``, ``LatencySnapshot``), which the
server's own timings (the event loop's stalls) share.

The bookie as a process of a cluster: ``run_bookie(BookieProcessConfig(...))`` (``magnetar
bookie``, ``storage/bookie_process.py``) and its registration in ZooKeeper
(``storage/registration.py``: ``connect`` for a ``zk:HOST:PORT[/chroot]`` spec,
``BookieRegistration`` under ``AVAILABLE_PATH``), which a cluster broker's coordination and
metadata store use too. These load kazoo, so they are imported on first use: a process that
never reaches ZooKeeper (``magnetar standalone``) never loads it.

``storage`` imports nothing from ``broker`` or ``api``.
"""

import importlib
from typing import TYPE_CHECKING

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
from storage.entry_location_index import iterate_prefix, open_rdict, write_durably
from storage.errors import (
    CorruptEntry,
    InvalidArgument,
    LedgerFenced,
    MagnetarError,
    MetadataStoreUnavailable,
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
from storage.fileio import FaultyFileIO, FileIO
from storage.futures import LightFuture, new_future
from storage.histogram import LatencyHistogram, LatencySnapshot
from storage.io_errors import as_storage_error
from storage.ledger_storage import LAST_ADD_CONFIRMED, ConsistencyReport, LedgerStorage, StorageStats
from storage.limits import SESSION_TIMEOUT_S

_ON_FIRST_USE = {
    "BookieProcessConfig": "storage.bookie_process",
    "run_bookie": "storage.bookie_process",
    "AVAILABLE_PATH": "storage.registration",
    "BookieRegistration": "storage.registration",
    "ZooKeeperSpec": "storage.registration",
    "connect": "storage.registration",
}
"""The ZooKeeper side of a bookie: names whose modules load kazoo, imported when first asked for."""

if TYPE_CHECKING:
    from storage.bookie_process import BookieProcessConfig, run_bookie
    from storage.registration import AVAILABLE_PATH, BookieRegistration, ZooKeeperSpec, connect
else:

    def __getattr__(name: str) -> object:
        if name not in _ON_FIRST_USE:
            raise AttributeError(f"module 'storage' has no attribute {name!r}")
        value = getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
        globals()[name] = value
        return value


__all__ = [
    "AVAILABLE_PATH",
    "LAST_ADD_CONFIRMED",
    "SESSION_TIMEOUT_S",
    "BookieProcessConfig",
    "BookieRegistration",
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
    "FaultyFileIO",
    "FileIO",
    "InvalidArgument",
    "LedgerFenced",
    "LatencyHistogram",
    "LatencySnapshot",
    "LedgerStorage",
    "LightFuture",
    "MagnetarError",
    "MetadataStoreUnavailable",
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
    "ZooKeeperSpec",
    "as_storage_error",
    "connect",
    "iterate_prefix",
    "new_future",
    "open_rdict",
    "run_bookie",
    "write_durably",
]
