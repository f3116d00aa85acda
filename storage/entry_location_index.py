"""Entry location index: (ledger, entry) → entry-log location, in RocksDB (rocksdict).

Role: a flush writes one batch of locations after the entry log it points into is durable;
reads that miss every cache look the location up here. Keys are ``b"L"`` + big-endian
``ledger u64 | entry u64`` so one ledger's entries are contiguous and ordered, which gives the
last entry of a ledger by one reverse seek and deletes a ledger with one range delete.
Values are a big-endian u64 location; 0 would mean "absent" and is never stored.

The index shares one RocksDB instance with the ledger metadata index (its own key prefix), so
deleting a ledger removes its metadata row and its locations in one atomic batch.

Invariants: every batch is applied atomically and synced (WAL fsync) before the call returns,
so the checkpoint that follows may trim the journal.
"""

from __future__ import annotations

import itertools
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from storage.limits import SLICE_ITEMS, SLICE_PAUSE_S

PREFIX = b"L"
_KEY = struct.Struct(">cQQ")
_VALUE = struct.Struct(">Q")
U64_MAX = 2**64 - 1
_SST_BYTES = "rocksdb.total-sst-files-size"
_MEMTABLE_BYTES = "rocksdb.cur-size-all-mem-tables"

T = TypeVar("T")


def in_slices(items: Iterable[T]) -> Iterator[list[T]]:
    """``items`` in lists of at most ``SLICE_ITEMS``, with a ``SLICE_PAUSE_S`` pause between
    two lists."""
    remaining = iter(items)
    piece = list(itertools.islice(remaining, SLICE_ITEMS))
    while piece:
        yield piece
        piece = list(itertools.islice(remaining, SLICE_ITEMS))
        if piece:
            time.sleep(SLICE_PAUSE_S)


def open_rdict(path: str) -> Rdict:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return Rdict(path, options)


_UNSYNCED = WriteOptions()


def write_durably(db: Rdict, batch: WriteBatch) -> None:
    """Write ``batch`` and have it durable on return, without stalling the process.

    rocksdict holds the interpreter lock for the whole of a ``write``, so a write with
    ``sync=True`` stopped every thread of the broker for an fdatasync (0.4 to 9 ms measured on
    this disk, once a second at least: a tail-latency spike for every message in flight).
    ``flush_wal(True)`` syncs the write-ahead log with the lock released. The durability is the
    same: the batch is one WAL record, synced before this returns (with whatever other threads
    wrote before it)."""
    db.write(batch, _UNSYNCED)
    db.flush_wal(True)


def iterate_prefix(db: Rdict, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
    """The rows whose keys begin with ``prefix``, in key order, from ``start`` (default: the first) on."""
    it = db.iter()
    try:
        it.seek(prefix if start is None else start)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            yield key, it.value()
            it.next()
    finally:
        del it


@dataclass(frozen=True)
class IndexStats:
    batches_written: int
    locations_written: int
    lookups: int
    sst_bytes: int
    """Bytes of the RocksDB instance's table files (locations and ledger metadata share it)."""
    memtable_bytes: int
    """Bytes of its memtables, not yet in table files."""


class EntryLocationIndex:
    def __init__(self, db: Rdict) -> None:
        self._db = db
        self._batches = 0
        self._written = 0
        self._lookups = 0

    def get(self, ledger_id: int, entry_id: int) -> int:
        """The location of an entry, or 0 if the index does not hold it."""
        self._lookups += 1
        raw = self._db.get(_KEY.pack(PREFIX, ledger_id, entry_id))
        return 0 if raw is None else int(_VALUE.unpack(raw)[0])

    def put_batch(self, locations: list[tuple[int, int, int]]) -> None:
        """Store ``(ledger, entry, location)`` triples; durable (WAL synced) when this returns.

        Written in batches of at most ``SLICE_ITEMS`` (:func:`in_slices`), then the WAL synced once
        without the interpreter lock (see :func:`write_durably`): RocksDB holds the lock while
        it writes, so one big batch would stall every other thread of the broker for its whole
        duration. Not atomic, and need not be: the entry log is synced before the
        index is written, so any prefix of these triples points at readable records, and until
        the checkpoint after this call the journal still holds every entry."""
        for chunk in in_slices(locations):
            batch = WriteBatch(raw_mode=True)
            for ledger_id, entry_id, location in chunk:
                batch.put(_KEY.pack(PREFIX, ledger_id, entry_id), _VALUE.pack(location))
            self._db.write(batch, _UNSYNCED)
            self._batches += 1
            self._written += len(chunk)
        if locations:
            self._db.flush_wal(True)  # the lock-free sync of ``write_durably``, once for all chunks

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest indexed entry id of a ledger (one reverse seek), or -1."""
        it = self._db.iter()
        try:
            it.seek_for_prev(_KEY.pack(PREFIX, ledger_id, U64_MAX))
            if not it.valid():
                return -1
            key = it.key()
            if len(key) != _KEY.size or not key.startswith(PREFIX):  # another index's row sorts before
                return -1
            _, ledger, entry = _KEY.unpack(key)
            return int(entry) if ledger == ledger_id else -1
        finally:
            del it

    @staticmethod
    def stage_delete_ledger(batch: WriteBatch, ledger_id: int) -> None:
        batch.delete_range(_KEY.pack(PREFIX, ledger_id, 0), _KEY.pack(PREFIX, ledger_id + 1, 0))

    def items(self) -> Iterator[tuple[int, int, int]]:
        """Every (ledger, entry, location), in key order (consistency checks, tests)."""
        for key, value in iterate_prefix(self._db, PREFIX):
            _, ledger, entry = _KEY.unpack(key)
            yield ledger, entry, _VALUE.unpack(value)[0]

    def statistics(self) -> IndexStats:
        sst_bytes = self._db.property_int_value(_SST_BYTES) or 0
        memtable_bytes = self._db.property_int_value(_MEMTABLE_BYTES) or 0
        return IndexStats(self._batches, self._written, self._lookups, sst_bytes, memtable_bytes)
