"""The broker's prefix of a stored entry: ``[0x0e02 u16][size u32][BrokerEntryMetadata]``.

Role: the managed ledger stamps every entry with its publish time at the broker and its
``index``, the offset of the entry's LAST message (Pulsar's convention). The prefix is outside
the checksum (Pulsar adds it after the producer checksummed the entry) and is validated
structurally instead; a prefix lacking either field is ``CorruptEntry``.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.entry_format.model import BrokerEntryMetadata
from broker.entry_format.wire import (
    BROKER_HEADER,
    CHECKSUM_HEADER,
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CRC32C,
    U16,
    U32,
    UINT64_MAX,
    Buffer,
    check_uint64,
    encode_varint,
    read_varint,
    skip_field,
)
from broker.errors import CorruptEntry

try:
    from broker.entry_format._common_entry import broker_prefix as _native_broker_prefix
except ImportError:  # built without a C compiler (see setup.py): the Python parser reads every prefix
    NATIVE_BROKER_PREFIX = False
else:
    NATIVE_BROKER_PREFIX = True
"""Whether the usual prefix is read by ``_common_entry.c``."""

_CHECKSUM_MAGIC = U16.pack(MAGIC_CRC32C)
_PREFIX_MAGIC = U16.pack(MAGIC_BROKER_ENTRY_METADATA)
_U32_FROM = U32.unpack_from


def broker_prefix(broker_timestamp_ms: int, index: int) -> bytes:
    """The 0x0e02 prefix: ``BrokerEntryMetadata`` (written by hand, as protobuf would)."""
    check_uint64("broker_timestamp_ms", broker_timestamp_ms)
    check_uint64("index", index)
    body = b"\x08" + encode_varint(broker_timestamp_ms) + b"\x10" + encode_varint(index)
    return BROKER_HEADER.pack(MAGIC_BROKER_ENTRY_METADATA, len(body)) + body

def _usual_prefix(data: Buffer) -> tuple[int, int, int] | None:
    """(broker timestamp, index, end) of the usual prefix read natively; None: not built, not
    ``bytes``, or another shape (the Python parser reads it, or says how it is malformed)."""
    return _native_broker_prefix(data) if NATIVE_BROKER_PREFIX and type(data) is bytes else None


def prefix_fields(data: Buffer) -> tuple[int, int]:
    """(broker timestamp in ms, index) of a stored entry's prefix, which every entry the managed
    ledger stored has (``CorruptEntry`` when it is missing or malformed): the read path's, which
    makes no ``BrokerEntryMetadata``."""
    fields = _usual_prefix(data)
    if fields is not None:
        return fields[0], fields[1]
    meta = split_prefix(data)[0]
    if meta is None:
        raise CorruptEntry("a stored entry has no broker entry metadata")
    return meta.broker_timestamp_ms, meta.index


def split_prefix(data: Buffer) -> tuple[BrokerEntryMetadata | None, int]:
    """Parse the optional 0x0e02 prefix; returns it and the offset of the 0x0e01 part."""
    fields = _usual_prefix(data)
    if fields is not None:
        return BrokerEntryMetadata(fields[0], fields[1]), fields[2]
    if type(data) is bytes and data[:2] == _PREFIX_MAGIC and data[6:7] == b"\x08":  # the usual shape
        end = 6 + _U32_FROM(data, 2)[0]
        try:
            timestamp, pos = read_varint(data, 7)
            if data[pos] == 0x10:
                index, pos = read_varint(data, pos + 1)
                if pos == end <= len(data):
                    return BrokerEntryMetadata(timestamp, index), end
        except (IndexError, CorruptEntry):
            pass  # malformed: the general parser says how
    return _split_prefix_general(data)


def _split_prefix_general(data: Buffer) -> tuple[BrokerEntryMetadata | None, int]:
    if len(data) < 2 or U16.unpack_from(data, 0)[0] != MAGIC_BROKER_ENTRY_METADATA:
        return None, 0
    if len(data) < BROKER_HEADER.size:
        raise CorruptEntry("truncated broker entry metadata header")
    size = U32.unpack_from(data, 2)[0]
    start = BROKER_HEADER.size
    if start + size > len(data):
        raise CorruptEntry(f"broker entry metadata of {size} bytes runs past the {len(data)}-byte entry")
    timestamp, index = _parse_broker_entry_metadata(bytes(data[start : start + size]))
    if timestamp is None or index is None:
        raise CorruptEntry("broker entry metadata must carry both broker_timestamp and index")
    return BrokerEntryMetadata(timestamp, index), start + size

def _parse_broker_entry_metadata(buf: bytes) -> tuple[int | None, int | None]:
    """(broker_timestamp, index) of a serialized ``BrokerEntryMetadata``; unknown fields skipped."""
    timestamp: int | None = None
    index: int | None = None
    pos = 0
    try:
        while pos < len(buf):
            tag, pos = read_varint(buf, pos)
            if tag == 0x08:
                timestamp, pos = read_varint(buf, pos)
            elif tag == 0x10:
                index, pos = read_varint(buf, pos)
            else:
                pos = skip_field(buf, pos, tag & 7)
    except IndexError:
        raise CorruptEntry("truncated broker entry metadata") from None
    if pos != len(buf):
        raise CorruptEntry("malformed broker entry metadata")
    return timestamp, index

def peek_broker_entry_metadata(data: Buffer) -> BrokerEntryMetadata | None:
    """Only the 0x0e02 prefix (None when absent); the rest of the entry is not looked at."""
    return split_prefix(data)[0]

def strip_broker_entry_metadata(data: Buffer) -> bytes:
    """The entry without its 0x0e02 prefix (what a client that lacks the feature receives)."""
    start = split_prefix(data)[1]
    return bytes(data[start:])

def with_broker_entry_metadata(data: Buffer, broker_timestamp_ms: int, index: int) -> bytes:
    """Prefix an encoded entry with broker metadata, replacing any prefix it already has.

    ``index`` is the offset of the entry's LAST message. The rest of the entry is not
    re-encoded; only its checksum magic is checked (``CorruptEntry`` when missing).
    """
    if isinstance(data, bytes) and len(data) >= CHECKSUM_HEADER.size and U16.unpack_from(data)[0] == MAGIC_CRC32C:
        return broker_prefix(broker_timestamp_ms, index) + data  # no prefix yet: the usual case
    start = split_prefix(data)[1]
    if len(data) - start < CHECKSUM_HEADER.size or U16.unpack_from(data, start)[0] != MAGIC_CRC32C:
        raise CorruptEntry("not an encoded entry: the 0x0e01 checksum magic is missing")
    return broker_prefix(broker_timestamp_ms, index) + bytes(data[start:])




def with_broker_entry_metadata_each(entries: Sequence[bytes], broker_timestamp_ms: int,
                                    indexes: Sequence[int]) -> list[bytes]:
    """:func:`with_broker_entry_metadata` of several entries stamped at one broker time (entry
    ``i`` gets ``indexes[i]``): the same bytes, with the time's part of the prefix written once."""
    check_uint64("broker_timestamp_ms", broker_timestamp_ms)
    stamp = b"\x08" + encode_varint(broker_timestamp_ms) + b"\x10"
    pack_header = BROKER_HEADER.pack
    out: list[bytes] = []
    for data, index in zip(entries, indexes, strict=True):
        if type(data) is not bytes or data[:2] != _CHECKSUM_MAGIC or type(index) is not int \
                or not 0 <= index <= UINT64_MAX or len(data) < CHECKSUM_HEADER.size:
            out.append(with_broker_entry_metadata(data, broker_timestamp_ms, index))
            continue
        body = stamp + encode_varint(index)
        out.append(pack_header(MAGIC_BROKER_ENTRY_METADATA, len(body)) + body + data)
    return out
