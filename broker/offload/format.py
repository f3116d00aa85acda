"""The offloaded format: the bytes one offload attempt of one ledger leaves in an object store.

Role: encodes a closed ledger's entries into data blocks and an index, and decodes and verifies
them; sans-I/O (bytes in, bytes out), so ``blob_offloader.py`` alone talks to the store. One
attempt (``uuid``) of ledger ``L`` is two objects, written in this order:

Data object ``{L}-{uuid}``: blocks back to back, block ``k`` starting where ``k-1`` ends::

    block  = header entry*
    header = magic u32 (0x4D47424B "MGBK") | version u16 (1) | header length u16 (24)
             | block length u32 (header included) | first entry id i64 | entry count u32
    entry  = entry id i64 | length u32 | bytes[length]

Entries are the ledger's, in order, dense from 0 to the LAC; a block holds at most
``max_block_size_bytes`` bytes, except that an entry larger than that gets a block of its own.

Index object ``{L}-{uuid}-index``, written only after the data object is durable::

    magic u32 (0x4D474958 "MGIX") | version u16 (1) | reserved u16 (0) | metadata length u32
    | metadata (UTF-8 JSON, sorted keys: ledgerId, lastAddConfirmed, lengthBytes, entryCount,
      dataObject, dataObjectLengthBytes, maxBlockSizeBytes, extraMetadata)
    | block count u32 | block* | crc32c u32 (of every byte before it)
    block = first entry id i64 | offset in the data object u64 | length u32 | crc32c u32

All integers are big-endian. Invariants: an index decodes only if its magic, version, lengths
and crc32c agree, and its blocks tile the data object from offset 0 and cover entries 0..LAC
with no gap; a block decodes only if its crc32c is the index's, its header agrees with the
index (first entry id, length) and its entries are consecutive ids that fill it exactly.
Anything else raises ``CorruptOffload`` with the reason; no partial answer is ever returned.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import crc32c

from broker.limits import OFFLOAD_UPLOAD_CHUNK_BYTES

BLOCK_MAGIC = 0x4D47424B
INDEX_MAGIC = 0x4D474958
FORMAT_VERSION = 1

_BLOCK_HEADER = struct.Struct(">IHHIqI")
_ENTRY_HEADER = struct.Struct(">qI")
_INDEX_HEADER = struct.Struct(">IHHI")
_COUNT = struct.Struct(">I")
_BLOCK_INFO = struct.Struct(">qQII")
_CRC = struct.Struct(">I")

BLOCK_HEADER_BYTES = _BLOCK_HEADER.size
ENTRY_HEADER_BYTES = _ENTRY_HEADER.size
_U32_TOP = 2**32 - 1
"""A block's length is a u32: no block (one entry with its headers included) may pass it."""


class CorruptOffload(ValueError):
    """An object of an offloaded copy does not decode; the message says why."""


def data_object_name(ledger_id: int, uuid: str) -> str:
    return f"{ledger_id}-{uuid}"


def index_object_name(ledger_id: int, uuid: str) -> str:
    return f"{ledger_id}-{uuid}-index"


@dataclass(frozen=True)
class BlockInfo:
    """Where one block lives in the data object, and its checksum."""

    first_entry_id: int
    offset: int
    length: int
    crc32c: int


@dataclass(frozen=True)
class OffloadIndex:
    """The index object: the ledger's metadata and its blocks in entry order."""

    ledger_id: int
    last_add_confirmed: int
    length_bytes: int
    data_object: str
    data_object_length_bytes: int
    max_block_size_bytes: int
    blocks: tuple[BlockInfo, ...]
    extra_metadata: dict[str, str] = field(default_factory=dict)

    @property
    def entry_count(self) -> int:
        return self.last_add_confirmed + 1

    def encode(self) -> bytes:
        meta = json.dumps({"ledgerId": self.ledger_id, "lastAddConfirmed": self.last_add_confirmed,
                           "lengthBytes": self.length_bytes, "entryCount": self.entry_count,
                           "dataObject": self.data_object, "dataObjectLengthBytes": self.data_object_length_bytes,
                           "maxBlockSizeBytes": self.max_block_size_bytes, "extraMetadata": self.extra_metadata},
                          sort_keys=True).encode()
        parts = [_INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, 0, len(meta)), meta, _COUNT.pack(len(self.blocks))]
        parts.extend(_BLOCK_INFO.pack(b.first_entry_id, b.offset, b.length, b.crc32c) for b in self.blocks)
        body = b"".join(parts)
        return body + _CRC.pack(crc32c.crc32c(body))

    @classmethod
    def decode(cls, raw: bytes) -> OffloadIndex:
        meta, blocks = _split_index(raw)
        try:
            index = cls(ledger_id=int(meta["ledgerId"]), last_add_confirmed=int(meta["lastAddConfirmed"]),
                        length_bytes=int(meta["lengthBytes"]), data_object=str(meta["dataObject"]),
                        data_object_length_bytes=int(meta["dataObjectLengthBytes"]),
                        max_block_size_bytes=int(meta["maxBlockSizeBytes"]), blocks=blocks,
                        extra_metadata={str(k): str(v) for k, v in dict(meta["extraMetadata"]).items()})
            entry_count = int(meta["entryCount"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptOffload(f"index object metadata lacks or garbles {exc}") from None
        if entry_count != index.entry_count:
            raise CorruptOffload("index entry count disagrees with its last add confirmed")
        index.check_blocks()
        return index

    def block_entry_count(self, block_index: int) -> int:
        """How many entries block ``block_index`` holds (up to the next block's first, or the LAC)."""
        blocks = self.blocks
        end = blocks[block_index + 1].first_entry_id if block_index + 1 < len(blocks) else self.entry_count
        return end - blocks[block_index].first_entry_id

    def check_blocks(self) -> None:
        """The blocks tile the data object from 0 and cover entries 0..LAC in order."""
        offset = 0
        for i, block in enumerate(self.blocks):
            if block.offset != offset or block.length <= BLOCK_HEADER_BYTES or (i == 0 and block.first_entry_id):
                raise CorruptOffload(f"index block at offset {block.offset} does not follow the one before it")
            offset += block.length
        if offset != self.data_object_length_bytes:
            raise CorruptOffload(f"index blocks end at {offset}, the data object is {self.data_object_length_bytes} "
                                 f"bytes")
        ids = [b.first_entry_id for b in self.blocks]
        if ids != sorted(set(ids)) or (ids and ids[-1] > self.last_add_confirmed):
            raise CorruptOffload("index blocks are not in entry order within 0..LAC")
        if (not ids) != (self.last_add_confirmed < 0):
            raise CorruptOffload("index blocks do not cover the ledger's entries")


def _split_index(raw: bytes) -> tuple[dict[str, Any], tuple[BlockInfo, ...]]:
    if len(raw) < _INDEX_HEADER.size + _COUNT.size + _CRC.size:
        raise CorruptOffload(f"index object is truncated ({len(raw)} bytes)")
    body, (crc,) = raw[:-_CRC.size], _CRC.unpack(raw[-_CRC.size:])
    if crc32c.crc32c(body) != crc:
        raise CorruptOffload("index object checksum mismatch")
    magic, version, _, meta_len = _INDEX_HEADER.unpack_from(body, 0)
    if magic != INDEX_MAGIC or version != FORMAT_VERSION:
        raise CorruptOffload(f"index object has magic {magic:#x} version {version}, not an index of version "
                             f"{FORMAT_VERSION}")
    at = _INDEX_HEADER.size + meta_len
    try:
        meta = json.loads(body[_INDEX_HEADER.size:at])
        (count,) = _COUNT.unpack_from(body, at)
    except (ValueError, struct.error) as exc:
        raise CorruptOffload(f"index object metadata does not decode: {exc}") from None
    at += _COUNT.size
    if len(body) != at + count * _BLOCK_INFO.size:
        raise CorruptOffload(f"index object declares {count} blocks but holds {len(body) - at} bytes of them")
    blocks = tuple(BlockInfo(*_BLOCK_INFO.unpack_from(body, at + i * _BLOCK_INFO.size)) for i in range(count))
    if not isinstance(meta, dict):
        raise CorruptOffload("index object metadata is not an object")
    return meta, blocks


@dataclass(frozen=True)
class EncodedBlock:
    """One block of the data object as the pieces it is made of: its header, then its entries
    (each with its header) joined into chunks of about ``OFFLOAD_UPLOAD_CHUNK_BYTES``, an entry
    of that size or more a piece of its own. No copy of a whole block is ever made while the
    interpreter lock is held, and the block costs about its own bytes, not an object per entry."""

    first_entry_id: int
    length: int
    crc32c: int
    pieces: list[bytes]


class _BlockBuilder:
    """One block being built: its entries are joined into chunks as they come."""

    def __init__(self, first_entry_id: int, chunk_bytes: int) -> None:
        self.first_entry_id = first_entry_id
        self.count = 0
        self.length = BLOCK_HEADER_BYTES
        self._chunk_bytes = chunk_bytes
        self._chunks: list[bytes] = []
        self._filling = bytearray()

    def add(self, entry_id: int, payload: bytes) -> None:
        self._filling += _ENTRY_HEADER.pack(entry_id, len(payload))
        if len(payload) >= self._chunk_bytes:  # a large entry is a chunk of its own, never copied
            self._flush()
            self._chunks.append(payload)
        else:
            self._filling += payload
            if len(self._filling) >= self._chunk_bytes:
                self._flush()
        self.length += ENTRY_HEADER_BYTES + len(payload)
        self.count += 1

    def _flush(self) -> None:
        if self._filling:
            self._chunks.append(bytes(self._filling))
            self._filling = bytearray()

    def seal(self) -> EncodedBlock:
        self._flush()
        header = _BLOCK_HEADER.pack(BLOCK_MAGIC, FORMAT_VERSION, BLOCK_HEADER_BYTES, self.length, self.first_entry_id,
                                    self.count)
        pieces, self._chunks = [header, *self._chunks], []
        crc = 0
        for piece in pieces:  # a large piece is checksummed with the interpreter lock released
            crc = crc32c.crc32c(piece, crc)
        return EncodedBlock(self.first_entry_id, self.length, crc, pieces)


def encode_blocks(entries: Iterable[tuple[int, bytes]], max_block_size_bytes: int,
                  chunk_bytes: int = OFFLOAD_UPLOAD_CHUNK_BYTES) -> Iterator[EncodedBlock]:
    """The data object's blocks, each yielded as soon as the next entry would not fit in it: at
    most one block is held at a time (the caller lets go of one before asking for the next)."""
    block: _BlockBuilder | None = None
    for entry_id, payload in entries:
        size = ENTRY_HEADER_BYTES + len(payload)
        if block is not None and block.length + size > max_block_size_bytes:
            yield block.seal()
            block = None
        if block is None:
            block = _BlockBuilder(entry_id, chunk_bytes)
        if block.length + size > _U32_TOP:
            raise CorruptOffload(f"entry {entry_id} of {len(payload)} bytes does not fit a block")
        block.add(entry_id, payload)
    if block is not None:
        yield block.seal()


def decode_block(raw: bytes, info: BlockInfo, entry_count: int) -> list[bytes]:
    """The ``entry_count`` entries of one block (ids ``info.first_entry_id`` on), verified
    against ``info``."""
    if len(raw) != info.length:
        raise CorruptOffload(f"block at offset {info.offset} is truncated: {len(raw)} of {info.length} bytes")
    if crc32c.crc32c(raw) != info.crc32c:
        raise CorruptOffload(f"block at offset {info.offset} checksum mismatch")
    magic, version, header_len, length, first, count = _BLOCK_HEADER.unpack_from(raw, 0)
    if (magic, version, header_len, length, first, count) != (BLOCK_MAGIC, FORMAT_VERSION, BLOCK_HEADER_BYTES,
                                                              info.length, info.first_entry_id, entry_count):
        raise CorruptOffload(f"block at offset {info.offset} has a bad header")
    entries: list[bytes] = []
    at = BLOCK_HEADER_BYTES
    view = memoryview(raw)
    for expected in range(first, first + count):
        if at + ENTRY_HEADER_BYTES > length:
            raise CorruptOffload(f"block at offset {info.offset} ends inside entry {expected}")
        entry_id, size = _ENTRY_HEADER.unpack_from(raw, at)
        at += ENTRY_HEADER_BYTES
        if entry_id != expected or at + size > length:
            raise CorruptOffload(f"block at offset {info.offset} holds entry {entry_id} where {expected} belongs")
        entries.append(bytes(view[at:at + size]))
        at += size
    if at != length:
        raise CorruptOffload(f"block at offset {info.offset} has {length - at} bytes after its last entry")
    return entries
