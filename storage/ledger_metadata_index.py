"""Ledger metadata index: per ledger ``exists, fenced, last_add_confirmed``, in RocksDB.

Role: the bookie's record of which ledgers exist and whether they are fenced. A ledger's row
is created (synced) on its first add, before that add is journaled, so journal replay can tell
a deleted ledger's records (skipped) from a live one's. Fencing is made durable by a journal
record; the row catches up at the next flush. Deletion removes the row together with the
ledger's locations in one atomic, synced batch.

Key ``b"M"`` + big-endian ledger u64; value ``[version u8][fenced u8][last_add_confirmed i64]``.
Ledger ids are never reused after deletion (the broker allocates them monotonically).

A fenced ledger leaves a tombstone when it is deleted (key ``b"T"`` + ledger u64, no value),
staged in the same batch: its old writer may still hold it open (a new owner recovered it,
found it empty and deleted it), and a plain add must stay refused as fenced rather than make
the ledger anew, acknowledged where no ledger list names it. Only fenced ledgers leave one,
so there are as many as recoveries that ended in a deletion.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rocksdict import Rdict, WriteBatch

from storage.entry_location_index import iterate_prefix, write_durably

PREFIX = b"M"
TOMBSTONE_PREFIX = b"T"
_KEY = struct.Struct(">cQ")
_VALUE = struct.Struct(">BBq")
_VERSION = 1


@dataclass
class LedgerMeta:
    fenced: bool = False
    last_add_confirmed: int = -1


class LedgerMetadataIndex:
    def __init__(self, db: Rdict) -> None:
        self._db = db

    def load_all(self) -> dict[int, LedgerMeta]:
        result: dict[int, LedgerMeta] = {}
        for key, value in iterate_prefix(self._db, PREFIX):
            _, fenced, lac = _VALUE.unpack(value)
            result[_KEY.unpack(key)[1]] = LedgerMeta(bool(fenced), lac)
        return result

    def put(self, ledger_id: int, meta: LedgerMeta) -> None:
        self.put_many({ledger_id: meta})

    def put_many(self, rows: dict[int, LedgerMeta]) -> None:
        if not rows:
            return
        batch = WriteBatch(raw_mode=True)
        for ledger_id, meta in rows.items():
            batch.put(_KEY.pack(PREFIX, ledger_id), self._encode(meta))
        write_durably(self._db, batch)

    @staticmethod
    def _encode(meta: LedgerMeta) -> bytes:
        return _VALUE.pack(_VERSION, int(meta.fenced), meta.last_add_confirmed)

    def load_tombstones(self) -> set[int]:
        """The fenced ledgers deleted since: their adds stay refused."""
        return {_KEY.unpack(key)[1] for key, _ in iterate_prefix(self._db, TOMBSTONE_PREFIX)}

    @staticmethod
    def stage_delete(batch: WriteBatch, ledger_id: int, *, fenced: bool) -> None:
        """Stage the row's deletion (with a tombstone when the ledger was fenced)."""
        batch.delete(_KEY.pack(PREFIX, ledger_id))
        if fenced:
            batch.put(_KEY.pack(TOMBSTONE_PREFIX, ledger_id), b"")

    def write(self, batch: WriteBatch) -> None:
        write_durably(self._db, batch)
