"""Protobuf's wire format, by hand, for the pieces written or read once per message or entry.

Role: the varints, length-delimited fields and key-value pairs that ``batch.py``,
``broker_metadata.py``, ``encode.py``, ``decode.py`` and ``common_entry.py`` write and parse
without protobuf objects (the runtime is used only for the once-per-entry ``MessageMetadata``
parse); property tests compare every hand-written encoding byte for byte with protobuf's own.
Also the format's fixed framing: the two magics and the big-endian headers.

Invariant: a parser never reads past its buffer silently: truncation raises ``IndexError``
(callers turn it into ``CorruptEntry``), a varint wider than 64 bits raises ``CorruptEntry``.
"""

from __future__ import annotations

import struct

from broker.errors import CorruptEntry, InvalidRequest

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02

U16 = struct.Struct(">H")

U32 = struct.Struct(">I")

CHECKSUM_HEADER = struct.Struct(">HII")  # magic, crc32c, metadata size

BROKER_HEADER = struct.Struct(">HI")  # magic, size

UINT64_MAX = (1 << 64) - 1

UINT64_MOD = 1 << 64

INT64_MIN = -(1 << 63)

INT64_MAX = (1 << 63) - 1

Buffer = bytes | bytearray | memoryview

def encode_varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(tag: bytes, data: bytes) -> bytes:
    return tag + encode_varint(len(data)) + data

def encode_key_value(key: str, value: str) -> bytes:
    return length_delimited(b"\x0a", key.encode()) + length_delimited(b"\x12", value.encode())

def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Read a varint at ``pos``; returns (value, next position). IndexError past the end."""
    byte = buf[pos]
    pos += 1
    if byte < 0x80:
        return byte, pos
    value = byte & 0x7F
    shift = 7
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value > UINT64_MAX:
                raise CorruptEntry("varint wider than 64 bits")
            return value, pos
        shift += 7
        if shift > 63:
            raise CorruptEntry("varint longer than 10 bytes")

_python_encode_varint = encode_varint
_python_read_varint = read_varint

try:
    from broker.entry_format._varint import encode_varint as _native_encode_varint
    from broker.entry_format._varint import read_varint as _native_read_varint
    from broker.entry_format._varint import set_fallback as _set_fallback
    from broker.entry_format._varint import set_read_fallback as _set_read_fallback
except ImportError:  # built without a C compiler: the Python encoder and reader above
    NATIVE_VARINT = False
else:
    _set_fallback(_python_encode_varint)
    _set_read_fallback(_python_read_varint)
    encode_varint = _native_encode_varint  # type: ignore[assignment]  # the same bytes for every int (_varint.c)
    read_varint = _native_read_varint  # type: ignore[assignment]  # the same results and errors (_varint.c)
    NATIVE_VARINT = True
"""Whether varints are written and read natively (``_varint.c``)."""

def skip_field(buf: bytes, pos: int, wire_type: int) -> int:
    if wire_type == 0:
        return read_varint(buf, pos)[1]
    if wire_type == 1:
        return pos + 8
    if wire_type == 2:
        length, pos = read_varint(buf, pos)
        return pos + length
    if wire_type == 5:
        return pos + 4
    raise CorruptEntry(f"unsupported protobuf wire type {wire_type}")

def parse_key_value(buf: bytes, pos: int, end: int) -> tuple[str, str]:
    key: str | None = None
    value: str | None = None
    while pos < end:
        tag, pos = read_varint(buf, pos)
        if tag in {0x0A, 0x12}:
            length, pos = read_varint(buf, pos)
            text = buf[pos : pos + length].decode()
            pos += length
            if tag == 0x0A:
                key = text
            else:
                value = text
        else:
            pos = skip_field(buf, pos, tag & 7)
    if pos != end or key is None or value is None:
        raise CorruptEntry("malformed property (KeyValue) in SingleMessageMetadata")
    return key, value

def check_uint64(name: str, value: int | None, maximum: int = UINT64_MAX) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise InvalidRequest(f"{name} must be between 0 and {maximum}, got {value}")
