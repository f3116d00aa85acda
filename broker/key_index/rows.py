"""The key index's rows in RocksDB: the layout, and one partition's reads and writes of it.

Role: the durable half of the key index. One RocksDB per broker (``{data_dir}/key-index``) holds,
per topic partition, each key's head, every version's message and entry, each indexed entry's
keyed messages, and the partition's watermarks (integers big-endian)::

    "C"                                   → next partition id u32
    "T" name                              → partition id u32
    "S" id                                → [indexed-to offset u64][cleaned-below offset u64]
    "H" id key                            → [version u64][offset u64]        the key's head
    "V" id [len u16] key [version u64]    → [offset u64][ledger u64][entry u64]
    "E" id [first offset u64]             → the entry's (batch index, version, key) triples

``PartitionRows`` reads and writes one partition's rows and keeps its ``S`` row in memory: the
*watermark* (every keyed message below this offset is indexed) and *cleaned below* (the rows of
entries below this offset were deleted after retention trimmed them).

Invariants: the rows of a batch and the new watermark are written in one ``WriteBatch``, so the
index is always a consistent prefix of the partition; cleanup deletes ``V`` and ``E`` rows but
never a key's ``H`` row (versions are never renumbered); a batch holds at most
``INDEX_BATCH_ROWS_MAX`` rows.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from rocksdict import Rdict, WriteBatch

from broker.limits import INDEX_BATCH_ROWS_MAX
from broker.message_id import Position
from storage import iterate_prefix

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_HEAD = struct.Struct(">QQ")
_ROW = struct.Struct(">QQQ")
_STATE = struct.Struct(">QQ")
_TRIPLE = struct.Struct(">IQH")
_NEXT_ID = b"C"

Head = tuple[int, int]
"""A key's (version, offset)."""

EntryRows = tuple[int, Position, list[tuple[int, int, str]]]
"""One entry's rows: its first offset, its position, and (batch index, version, key) of each of
its keyed messages."""


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One version of a stream: the message's offset and the entry holding it."""

    version: int
    offset: int
    position: Position


def _key_bytes(key: str) -> bytes:
    return key.encode(errors="surrogatepass")


class PartitionRows:
    """The rows of one topic partition (``pid``) and its ``S`` row."""

    def __init__(self, db: Rdict, pid: int) -> None:
        self._db = db
        self._pid = _U32.pack(pid)
        self.watermark, self.cleaned_below = self._load_state()

    # --- keys of RocksDB ------------------------------------------------------------------
    def _state_key(self) -> bytes:
        return b"S" + self._pid

    def _head_key(self, key: str) -> bytes:
        return b"H" + self._pid + _key_bytes(key)

    def _row_prefix(self, key: str) -> bytes:
        raw = _key_bytes(key)
        return b"V" + self._pid + _U16.pack(len(raw)) + raw

    def _entry_key(self, first_offset: int) -> bytes:
        return b"E" + self._pid + _U64.pack(first_offset)

    def _load_state(self) -> tuple[int, int]:
        raw = self._db.get(self._state_key())
        return (0, 0) if raw is None else _STATE.unpack(raw)

    # --- reading ----------------------------------------------------------------------------
    def head(self, key: str) -> Head | None:
        """The key's head as RocksDB has it (None: no indexed version)."""
        raw = self._db.get(self._head_key(key))
        return None if raw is None else _HEAD.unpack(raw)

    def entry_versions(self, first_offset: int) -> dict[int, int] | None:
        """{batch index: version} of the indexed entry starting at ``first_offset`` (None: no
        record of it)."""
        raw = self._db.get(self._entry_key(first_offset))
        return None if raw is None else {index: version for index, version, _ in _unpack_triples(raw)}

    def rows(self, key: str, first_version: int, upper: int, last_version: int) -> list[StreamRow]:
        """The indexed rows of versions ``first_version..last_version`` below ``upper``, ascending."""
        rows: list[StreamRow] = []
        prefix = self._row_prefix(key)
        for raw_key, value in iterate_prefix(self._db, prefix, prefix + _U64.pack(first_version)):
            version = _U64.unpack_from(raw_key, len(prefix))[0]
            if version >= upper or version > last_version:
                break
            offset, ledger_id, entry_id = _ROW.unpack(value)
            rows.append(StreamRow(version, offset, Position(ledger_id, entry_id)))
        return rows

    def first_row_at_or_after(self, key: str, offset: int) -> StreamRow | None:
        """The first indexed row of ``key`` whose offset is ``>= offset``."""
        prefix = self._row_prefix(key)
        for raw_key, value in iterate_prefix(self._db, prefix):
            row_offset, ledger_id, entry_id = _ROW.unpack(value)
            if row_offset >= offset:
                return StreamRow(_U64.unpack_from(raw_key, len(prefix))[0], row_offset, Position(ledger_id, entry_id))
        return None

    # --- writing ----------------------------------------------------------------------------
    def write(self, entries: Iterable[EntryRows], watermark: int) -> int:
        """One batch: the rows of ``entries``, their ``E`` rows, the heads they move, and the
        watermark moved up to ``watermark``; the rows written."""
        batch = WriteBatch(raw_mode=True)
        heads: dict[str, Head] = {}
        rows = 0
        for first_offset, position, triples in entries:
            for index, version, key in triples:
                offset = first_offset + index
                batch.put(self._row_prefix(key) + _U64.pack(version), _ROW.pack(offset, position.ledger_id,
                                                                                position.entry_id))
                heads[key] = (version, offset)
            batch.put(self._entry_key(first_offset), _pack_triples(triples))
            rows += len(triples)
        for key, head in heads.items():
            batch.put(self._head_key(key), _HEAD.pack(*head))
        self.watermark = max(self.watermark, watermark)
        batch.put(self._state_key(), _STATE.pack(self.watermark, self.cleaned_below))
        self._db.write(batch)
        return rows

    def set_watermark(self, watermark: int) -> None:
        """Move the watermark (nothing is pending below ``watermark``)."""
        self.watermark = watermark
        self._db.put(self._state_key(), _STATE.pack(self.watermark, self.cleaned_below))

    def clean_below(self, first: int) -> int:
        """Delete the rows of the entries below offset ``first`` (retention trimmed them); heads
        stay. The rows deleted."""
        prefix = b"E" + self._pid
        batch = WriteBatch(raw_mode=True)
        deleted = in_batch = 0
        for raw_key, value in iterate_prefix(self._db, prefix, prefix + _U64.pack(self.cleaned_below)):
            if _U64.unpack_from(raw_key, len(prefix))[0] >= first:
                break
            for _, version, key in _unpack_triples(value):
                batch.delete(self._row_prefix(key) + _U64.pack(version))
                in_batch += 1
            batch.delete(raw_key)
            if in_batch >= INDEX_BATCH_ROWS_MAX:
                self._db.write(batch)
                batch, deleted, in_batch = WriteBatch(raw_mode=True), deleted + in_batch, 0
        self.cleaned_below = first
        batch.put(self._state_key(), _STATE.pack(self.watermark, self.cleaned_below))
        self._db.write(batch)
        return deleted + in_batch

    def delete_all(self) -> None:
        """Delete every row of the partition (its index belonged to a deleted topic)."""
        delete_partition_rows(self._db, self._pid)
        self.watermark = self.cleaned_below = 0

    def sync(self) -> None:
        """Sync RocksDB's write-ahead log (the interpreter lock released)."""
        self._db.flush_wal(True)


def partition_id(db: Rdict, name: str) -> int:
    """The id of partition ``name``, given it now when it has none (the caller serializes calls)."""
    raw = db.get(b"T" + name.encode())
    if raw is not None:
        return int(_U32.unpack(raw)[0])
    pid = int(_U32.unpack(db.get(_NEXT_ID) or _U32.pack(1))[0])
    batch = WriteBatch(raw_mode=True)
    batch.put(b"T" + name.encode(), _U32.pack(pid))
    batch.put(_NEXT_ID, _U32.pack(pid + 1))
    db.write(batch)
    return pid


def drop_partition(db: Rdict, name: str) -> None:
    """Delete partition ``name``'s rows and its id."""
    raw = db.get(b"T" + name.encode())
    if raw is None:
        return
    delete_partition_rows(db, raw)
    db.delete(b"T" + name.encode())


def delete_partition_rows(db: Rdict, pid: bytes) -> None:
    upper = _U32.pack(_U32.unpack(pid)[0] + 1)
    batch = WriteBatch(raw_mode=True)
    for kind in (b"S", b"H", b"V", b"E"):
        batch.delete_range(kind + pid, kind + upper)
    db.write(batch)


def _pack_triples(triples: Sequence[tuple[int, int, str]]) -> bytes:
    parts = []
    for index, version, key in triples:
        raw = _key_bytes(key)
        parts.append(_TRIPLE.pack(index, version, len(raw)))
        parts.append(raw)
    return b"".join(parts)


def _unpack_triples(raw: bytes) -> Iterator[tuple[int, int, str]]:
    at = 0
    while at < len(raw):
        index, version, size = _TRIPLE.unpack_from(raw, at)
        at += _TRIPLE.size
        yield index, version, raw[at:at + size].decode(errors="surrogatepass")
        at += size
