"""Key index segments: sorted, immutable runs of stream rows stored in a ledger.

Role: the durable half of the key index (``broker/key_index/``). A checkpoint writes the rows
that became durable since the last one, sorted by (key, version), to a new ledger of the same
storage as the topic (the embedded bookie standalone, the bookies in a cluster): the index is
stored with the topic it derives from, so any broker that opens the topic reads it. A segment
is an SSTable on a ledger::

    entry 0..n-1   data blocks   [b"KIB1"][rows u32] ([key size u16][key][version u64]
                                 [offset u64][ledger u64][entry u64])*      sorted by (key, version)
    entry n        the index     [b"KII1"][blocks u32] ([key size u16][key][version u64]
                                 [offset u64][rows u32])* [bloom bytes u32][bloom][hashes u8]
                                 [rows u64][keys u32]                       one per data block

A lookup reads the index once (kept in memory with the segment), skips a segment whose Bloom
filter says the key is absent, bisects the blocks by (key, version) and reads only the blocks
that can hold the key's rows (decoded blocks are cached, bounded in bytes, by the caller). A
key's offsets rise with its versions, so the blocks are bisected by (key, offset) too, for the
rows after an offset (``rows_from_offset``: a DCB read or condition).

Invariants: rows of one segment are unique and sorted by (key bytes, version); a block holds
at least one row; the index names every block in entry order; the Bloom filter has no false
negatives. Decoding checks every size against its entry, so a damaged entry raises
``CorruptEntry`` rather than returning wrong rows.
"""

from __future__ import annotations

import bisect
import heapq
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import mmh3

from broker.errors import CorruptEntry
from broker.limits import SEGMENT_BLOCK_BYTES_MAX
from broker.message_id import Position

BLOOM_BITS_PER_KEY = 10
BLOOM_HASHES = 7
"""About 1% false positives at 10 bits a key."""
_BLOCK_MAGIC = b"KIB1"
_INDEX_MAGIC = b"KII1"
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_ROW = struct.Struct(">QQQQ")  # version, offset, ledger, entry
_BLOCK_HEAD = struct.Struct(">QQI")  # first version, first offset, rows
_TOTALS = struct.Struct(">QI")  # rows, keys
_AFTER_EVERY_VERSION = 1 << 64


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One version of a stream: the message's offset and the entry holding it."""

    version: int
    offset: int
    position: Position


Row = tuple[bytes, int, int, int, int]
"""(key bytes, version, offset, ledger id, entry id), the order rows sort in."""


def key_bytes(key: str | bytes) -> bytes:
    """A stream's name as rows store it: a key's UTF-8, or a derived stream's own bytes."""
    return key if isinstance(key, bytes) else key.encode(errors="surrogatepass")


def row_of(raw: Row) -> StreamRow:
    return StreamRow(raw[1], raw[2], Position(raw[3], raw[4]))


# --- the Bloom filter -------------------------------------------------------------------------
class BloomFilter:
    """A fixed Bloom filter over key bytes (double hashing of Murmur3's 128-bit hash)."""

    __slots__ = ("bits", "hashes", "size_bits")

    def __init__(self, bits: bytearray, hashes: int) -> None:
        self.bits = bits
        self.hashes = hashes
        self.size_bits = len(bits) * 8

    @classmethod
    def sized_for(cls, keys: int) -> BloomFilter:
        return cls(bytearray(max(8, (keys * BLOOM_BITS_PER_KEY + 7) // 8)), BLOOM_HASHES)

    def _positions(self, h1: int, h2: int) -> Iterator[int]:
        size = self.size_bits
        for i in range(self.hashes):
            yield (h1 + i * h2) % size

    def add_hashes(self, h1: int, h2: int) -> None:
        bits = self.bits
        for position in self._positions(h1, h2):
            bits[position >> 3] |= 1 << (position & 7)

    def add(self, key: bytes) -> None:
        self.add_hashes(*mmh3.hash64(key, 0x5EED, signed=False))

    def may_hold(self, key: bytes) -> bool:
        bits = self.bits
        return all(bits[position >> 3] & (1 << (position & 7))
                   for position in self._positions(*mmh3.hash64(key, 0x5EED, signed=False)))


# --- writing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockRef:
    """One data block as the index names it: its first row's key, version and offset."""

    key: bytes
    version: int
    offset: int
    rows: int


class SegmentWriter:
    """Encodes rows (added in (key, version) order) into data blocks as they fill, then the
    index: a segment is written while it is encoded, never held whole."""

    def __init__(self) -> None:
        self._refs: list[BlockRef] = []
        self._hashes: list[tuple[int, int]] = []
        """Each distinct key's two hashes (the Bloom filter is sized once the keys are known)."""
        self._parts: list[bytes] = []
        self._size = self._count = 0
        self._first: Row | None = None
        self._previous: tuple[bytes, int] | None = None
        self._ready: list[bytes] = []
        self.rows = 0

    def add(self, row: Row) -> None:
        key = row[0]
        if self._previous is not None and (key, row[1]) <= self._previous:
            raise ValueError("segment rows must be added in (key, version) order, each once")
        if self._previous is None or key != self._previous[0]:
            self._hashes.append(mmh3.hash64(key, 0x5EED, signed=False))
        self._previous = (key, row[1])
        if self._first is None:
            self._first = row
        self._parts.append(_U16.pack(len(key)) + key + _ROW.pack(row[1], row[2], row[3], row[4]))
        self._size += 2 + len(key) + _ROW.size
        self._count += 1
        self.rows += 1
        if self._size >= SEGMENT_BLOCK_BYTES_MAX:
            self._cut()

    def _cut(self) -> None:
        first = self._first
        assert first is not None
        self._ready.append(_BLOCK_MAGIC + _U32.pack(self._count) + b"".join(self._parts))
        self._refs.append(BlockRef(first[0], first[1], first[2], self._count))
        self._parts, self._size, self._count, self._first = [], 0, 0, None

    def take_blocks(self) -> list[bytes]:
        """The data blocks completed since the last call, to be appended in order."""
        ready, self._ready = self._ready, []
        return ready

    @property
    def keys(self) -> int:
        return len(self._hashes)

    def finish(self) -> list[bytes]:
        """The last data blocks and the index entry (a segment holds at least one row)."""
        if self._first is not None:
            self._cut()
        if not self._refs:
            raise ValueError("a segment holds at least one row")
        bloom = BloomFilter.sized_for(len(self._hashes))
        for hashes in self._hashes:
            bloom.add_hashes(*hashes)
        index = [_INDEX_MAGIC, _U32.pack(len(self._refs))]
        for ref in self._refs:
            index.append(_U16.pack(len(ref.key)) + ref.key + _BLOCK_HEAD.pack(ref.version, ref.offset, ref.rows))
        index.append(_U32.pack(len(bloom.bits)) + bytes(bloom.bits) + bytes([bloom.hashes]))
        index.append(_TOTALS.pack(self.rows, len(self._hashes)))
        return [*self.take_blocks(), b"".join(index)]


# --- reading ----------------------------------------------------------------------------------
def decode_block(data: bytes) -> list[Row]:
    """The rows of a data block (``CorruptEntry`` if it is not one)."""
    if data[:4] != _BLOCK_MAGIC or len(data) < 8:
        raise CorruptEntry("not a key index block")
    (count,) = _U32.unpack_from(data, 4)
    rows: list[Row] = []
    at = 8
    unpack_row = _ROW.unpack_from
    try:
        for _ in range(count):
            (size,) = _U16.unpack_from(data, at)
            key = data[at + 2: at + 2 + size]
            if len(key) != size:
                raise CorruptEntry("a key index row runs past its block")
            at += 2 + size
            version, offset, ledger_id, entry_id = unpack_row(data, at)
            at += _ROW.size
            rows.append((key, version, offset, ledger_id, entry_id))
    except struct.error as exc:
        raise CorruptEntry("a key index block is cut short") from exc
    if at != len(data):
        raise CorruptEntry("a key index block has bytes after its rows")
    return rows


@dataclass(frozen=True)
class SegmentIndex:
    blocks: tuple[BlockRef, ...]
    bloom: BloomFilter
    rows: int
    keys: int

    @classmethod
    def decode(cls, data: bytes) -> SegmentIndex:
        if data[:4] != _INDEX_MAGIC:
            raise CorruptEntry("not a key index segment's index")
        try:
            (count,) = _U32.unpack_from(data, 4)
            at = 8
            refs = []
            for _ in range(count):
                (size,) = _U16.unpack_from(data, at)
                key = data[at + 2: at + 2 + size]
                at += 2 + size
                version, offset, rows = _BLOCK_HEAD.unpack_from(data, at)
                at += _BLOCK_HEAD.size
                refs.append(BlockRef(key, version, offset, rows))
            (bloom_size,) = _U32.unpack_from(data, at)
            bits = bytearray(data[at + 4: at + 4 + bloom_size])
            hashes = data[at + 4 + bloom_size]
            at += 5 + bloom_size
            total, keys = _TOTALS.unpack_from(data, at)
            at += _TOTALS.size
        except (struct.error, IndexError) as exc:
            raise CorruptEntry("a key index segment's index is cut short") from exc
        if at != len(data) or len(bits) != bloom_size or not refs or hashes < 1:
            raise CorruptEntry("a key index segment's index does not hold together")
        return cls(tuple(refs), BloomFilter(bits, hashes), total, keys)


BlockReader = Callable[[int], list[Row]]
"""Reads (and decodes) data block ``n`` of a segment: the caller's, so it can cache blocks."""


class Segment:
    """One segment's index in memory, answering lookups through ``read_block``."""

    def __init__(self, ledger_id: int, index: SegmentIndex, read_block: BlockReader) -> None:
        self.ledger_id = ledger_id
        self.index = index
        self._read_block = read_block
        self._firsts = [(ref.key, ref.version) for ref in index.blocks]
        self._first_offsets = [(ref.key, ref.offset) for ref in index.blocks]
        """(key, offset) of each block's first row: sorted too, as a key's offsets rise with its versions."""

    def _blocks_of(self, key: bytes, first_version: int) -> Iterator[list[Row]]:
        """The blocks that may hold rows of ``key`` at or after ``first_version``, in order."""
        if not self.index.bloom.may_hold(key):
            return
        start = max(bisect.bisect_right(self._firsts, (key, first_version)) - 1, 0)
        for number in range(start, len(self._firsts)):
            if self._firsts[number][0] > key:
                return
            yield self._read_block(number)

    def rows(self, key: bytes, first_version: int, last_version: int) -> list[Row]:
        """The rows of ``key`` with versions in ``first_version..last_version``, ascending."""
        found: list[Row] = []
        for block in self._blocks_of(key, first_version):
            start = bisect.bisect_left(block, (key, first_version))
            for row in block[start:]:
                if row[0] != key or row[1] > last_version:
                    return found
                found.append(row)
        return found

    def rows_from_offset(self, key: bytes, offset: int, max_rows: int) -> list[Row]:
        """Up to ``max_rows`` rows of ``key`` whose offsets are ``>= offset``, ascending: the
        blocks are bisected by (key, offset), so rows before ``offset`` are never read."""
        found: list[Row] = []
        if not self.index.bloom.may_hold(key):
            return found
        firsts = self._first_offsets
        start = max(bisect.bisect_right(firsts, (key, offset)) - 1, 0)
        for number in range(start, len(firsts)):
            if firsts[number][0] > key:
                break
            block = self._read_block(number)
            for row in block[bisect.bisect_left(block, (key, offset), key=_key_and_offset):]:
                if row[0] != key:
                    return found
                found.append(row)
                if len(found) >= max_rows:
                    return found
        return found

    def last_row(self, key: bytes) -> Row | None:
        """The row of ``key``'s highest version here, or None. It is in the last block that
        starts at or before the key's end (rows of one key are contiguous)."""
        if not self.index.bloom.may_hold(key):
            return None
        number = bisect.bisect_right(self._firsts, (key, _AFTER_EVERY_VERSION)) - 1
        if number < 0:
            return None
        block = self._read_block(number)
        end = bisect.bisect_right(block, (key, _AFTER_EVERY_VERSION))
        return block[end - 1] if end and block[end - 1][0] == key else None

    def all_rows(self) -> Iterator[Row]:
        """Every row, in order (compaction reads segments whole)."""
        for number in range(len(self._firsts)):
            yield from self._read_block(number)


def _key_and_offset(row: Row) -> tuple[bytes, int]:
    return row[0], row[2]


def merge_rows(segments: Sequence[Iterable[Row]]) -> Iterator[Row]:
    """The rows of several segments in (key, version) order (segments never share a row)."""
    return heapq.merge(*segments)
