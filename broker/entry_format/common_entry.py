"""The common stored entry, read fast: the entries the broker writes, checked without protobuf.

Role: dispatchers, readers and the range read's columns see mostly the broker's own entries (a
broker prefix, a batch, no compression, only the ``MessageMetadata`` fields Magnetar's producers
set). ``decode_messages``, ``common_batch_payload`` and ``common_client_entry`` read such an
entry by hand (or through ``_common_entry.c`` when it was built) and hand anything else to
``decode.py``.

Invariants: the fast path verifies what ``decode_entry`` verifies (the checksum, the metadata's
structure, the broker index), so for every entry the result and the errors are
``decode_entry``'s; the native reader returns exactly what the Python one does (property-tested
against it).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import crc32c

from broker.entry_format.batch import decode_batch
from broker.entry_format.broker_metadata import split_prefix
from broker.entry_format.decode import decode_entry, parse_metadata
from broker.entry_format.model import DecodedMessage, EncryptionContext
from broker.entry_format.wire import CHECKSUM_HEADER, MAGIC_CRC32C, U32, UINT64_MOD, Buffer, read_varint
from broker.errors import CorruptEntry

_PREFIX_MAGIC = b"\x0e\x02"
_INT32_MAX = (1 << 31) - 1
_INT64_SIGN = 1 << 63


def decode_messages(data: Buffer) -> tuple[list[DecodedMessage], int | None]:
    """``decode_entry(data)``'s messages and ``deliver_at_time_ms``: what dispatchers and readers
    need of an entry, read faster for the entries the broker writes (a broker prefix, a batch,
    no compression, only the ``MessageMetadata`` fields Magnetar's producers set). Anything else,
    and anything :func:`decode_entry` would refuse, goes to :func:`decode_entry`, so the result
    and the errors are always its."""
    fast = _fast_messages(data) if type(data) is bytes else None
    if fast is not None:
        return fast
    decoded = decode_entry(data)
    return decoded.messages, decoded.deliver_at_time_ms


def decode_delivered(data: Buffer) -> tuple[list[DecodedMessage], EncryptionContext | None]:
    """``decode_entry(data)``'s messages and its encryption context (None: not encrypted), for
    the edges that hand out messages; as fast as :func:`decode_messages` for the broker's own."""
    fast = _fast_messages(data) if type(data) is bytes else None
    if fast is not None:
        return fast[0], None
    decoded = decode_entry(data)
    return decoded.messages, decoded.encryption


def _fast_messages(data: bytes) -> tuple[list[DecodedMessage], int | None] | None:
    """The messages of a common entry, or None for :func:`decode_entry` to decode (or refuse)."""
    batch = common_batch(data)
    if batch is None:
        return None
    payload_start, count, first_offset, sequence_id, deliver_at, lone = batch
    if lone is not None:  # not a batch: the metadata's fields are the message's
        key, event_time, ordering_key, key_b64 = lone
        return [DecodedMessage(-1, first_offset, data[payload_start:], key, {}, event_time, sequence_id,
                               ordering_key, key_b64, False, False, False)], deliver_at
    try:
        return decode_batch(data[payload_start:], count, first_offset, sequence_id), deliver_at
    except CorruptEntry:
        return None  # decode_entry refuses it, in its own words


def delivery_time(data: Buffer) -> int | None:
    """An entry's ``deliver_at_time`` (None: none), from its ``MessageMetadata`` alone: what
    dispatch needs of an entry it does not split (the common entry read as :func:`decode_messages`
    reads it, any other's metadata parsed; ``CorruptEntry`` for a malformed one)."""
    batch = common_batch(data) if type(data) is bytes else None
    if batch is not None:
        return batch[4]
    start = split_prefix(data)[1]
    if len(data) - start < CHECKSUM_HEADER.size:
        raise CorruptEntry(f"entry of {len(data)} bytes is too short")
    _, _, metadata_size = CHECKSUM_HEADER.unpack_from(data, start)
    metadata_start = start + CHECKSUM_HEADER.size
    metadata = parse_metadata(bytes(data[metadata_start : metadata_start + metadata_size]))
    return metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None


def common_batch_payload(data: Buffer) -> tuple[memoryview, int] | None:
    """The verified batch payload and message count of an entry :func:`decode_messages` reads on
    its fast path, or None: then ``decode_entry_payload`` verifies it (or refuses it). The
    payload is not split here (the range read's native columns split it)."""
    batch = common_batch(data) if type(data) is bytes else None
    return None if batch is None or batch[5] is not None else (memoryview(data)[batch[0] :], batch[1])


try:
    from broker.entry_format._common_entry import common_batch as _native_common_batch
    from broker.entry_format._common_entry import common_metadata as _native_common_metadata
except ImportError:  # built without a C compiler (see setup.py)
    NATIVE_COMMON_ENTRY = False
else:
    NATIVE_COMMON_ENTRY = True
"""Whether common entries are checked by ``_common_entry.c`` rather than in Python."""

_LoneFields = tuple[str | None, int | None, bytes | None, bool]
"""A non-batched entry's message fields kept in its ``MessageMetadata``: partition key, event
time, ordering key, whether the key is base64 of binary."""
_CommonEntry = tuple[int, int, int, int, int | None, _LoneFields | None]


def common_batch(data: bytes) -> _CommonEntry | None:
    """(payload start, message count, first offset, sequence id, delivery time, and for an entry
    that is not a batch its message's fields) of a verified common entry (see
    :func:`decode_messages`), or None, also for a malformed one (then ``decode_entry`` says
    how). Read by ``_common_entry.c`` when it was built, which returns exactly what
    :func:`_python_common_batch` does (property-tested against it)."""
    if NATIVE_COMMON_ENTRY and type(data) is bytes:
        return _native_common_batch(data)
    return _python_common_batch(data)


def _python_common_batch(data: bytes) -> _CommonEntry | None:
    if data[:2] != _PREFIX_MAGIC:
        return None
    try:
        return _parse_common_batch(data)
    except (IndexError, ValueError, CorruptEntry, struct.error):
        return None


def _parse_common_batch(data: bytes) -> _CommonEntry | None:
    read = read_varint
    end = 6 + U32.unpack_from(data, 2)[0]
    pos, timestamp, index = 6, None, None
    while pos < end:
        tag = data[pos]
        if tag == 0x08:
            timestamp, pos = read(data, pos + 1)
        elif tag == 0x10:
            index, pos = read(data, pos + 1)
        else:
            return None
    if pos != end or timestamp is None or index is None:
        return None
    parsed = _python_parse_common_metadata(data, end)
    if parsed is None or index - parsed[1] + 1 < 0:
        return None
    payload_start, count, sequence_id, deliver_at, lone, _producer = parsed
    return payload_start, count, index - count + 1, sequence_id, deliver_at, lone


_CommonMetadata = tuple[int, int, int, int | None, _LoneFields | None, str]


def _parse_common_metadata(data: bytes, start: int) -> _CommonMetadata | None:
    """(payload start, message count, sequence id, delivery time, a lone message's fields,
    producer name) of the verified checksum and ``MessageMetadata`` at ``start`` of a common
    entry, or None (see :func:`common_batch`); ``_common_entry.c`` reads it when it was built."""
    if NATIVE_COMMON_ENTRY and type(data) is bytes:
        return _native_common_metadata(data, start)
    return _python_parse_common_metadata(data, start)


def _python_parse_common_metadata(data: bytes, start: int) -> _CommonMetadata | None:
    read = read_varint
    magic, stored_checksum, metadata_size = CHECKSUM_HEADER.unpack_from(data, start)
    if magic != MAGIC_CRC32C or crc32c.crc32c(memoryview(data)[start + 6 :]) != stored_checksum:
        return None
    pos = start + CHECKSUM_HEADER.size
    payload_start = pos + metadata_size
    if payload_start > len(data):
        return None
    producer = sequence_id = publish_time = count = deliver_at = key = event_time = ordering_key = None
    key_b64 = False
    while pos < payload_start:
        tag = data[pos]
        if tag in (0x0A, 0x32):  # producer_name, partition_key: strings, UTF-8 as protobuf checks
            length, pos = read(data, pos + 1)
            text = data[pos : pos + length].decode()
            pos += length
            if tag == 0x0A:
                producer = text
            else:
                key = text
        elif tag == 0x10:
            sequence_id, pos = read(data, pos + 1)
        elif tag == 0x18:
            publish_time, pos = read(data, pos + 1)
        elif tag == 0x58:
            count, pos = read(data, pos + 1)
        elif tag == 0x40:
            code, pos = read(data, pos + 1)
            if code:
                return None  # compressed: decode_entry decompresses
        elif tag == 0x48:  # uncompressed_size
            pos = read(data, pos + 1)[1]
        elif tag == 0x60:  # event_time
            event_time, pos = read(data, pos + 1)
        elif tag in (0x82, 0x92):  # schema_version (16), ordering_key (18): bytes
            if data[pos + 1] != 0x01:
                return None
            length, pos = read(data, pos + 2)
            if tag == 0x92:
                ordering_key = data[pos : pos + length]
            pos += length
        elif tag in (0x88, 0xC0):  # partition_key_b64_encoded (17), highest_sequence_id (24)
            if data[pos + 1] != 0x01:
                return None
            value, pos = read(data, pos + 2)
            if tag == 0x88:
                key_b64 = value != 0
        elif tag == 0x98:  # deliver_at_time (19), int64
            if data[pos + 1] != 0x01:
                return None
            deliver_at, pos = read(data, pos + 2)
            if deliver_at >= _INT64_SIGN:
                deliver_at -= UINT64_MOD
        else:
            return None  # properties, encryption, chunks, transactions, markers, replication: decode_entry
    lone: _LoneFields | None = None
    if count is None:  # not a batch: one message, described by the metadata itself
        count, lone = 1, (key, event_time, ordering_key, key_b64)
    if pos != payload_start or producer is None or sequence_id is None or publish_time is None \
            or not 0 < count <= _INT32_MAX:
        return None
    return payload_start, count, sequence_id, deliver_at, lone, producer


def common_client_entry(data: Buffer) -> tuple[str, tuple[str | None, ...]] | None:
    """(producer name, each message's partition key) of a client's entry (no broker prefix) of
    the common kind :func:`decode_messages` reads on its fast path, verified as
    :func:`decode_entry` verifies it; None for any other entry: ask ``decode_entry_payload``."""
    if type(data) is not bytes:
        return None
    try:
        parsed = _parse_common_metadata(data, 0)  # a broker prefix fails its magic check
        if parsed is None:
            return None
        payload_start, count, sequence_id, _deliver_at, lone, producer = parsed
        if lone is not None:
            return producer, (lone[0],)
        return producer, tuple([m.key for m in decode_batch(data[payload_start:], count, None, sequence_id)])
    except (IndexError, ValueError, CorruptEntry, struct.error):
        return None


common_batch_of_bytes: Callable[[bytes], _CommonEntry | None] = (
    _native_common_batch if NATIVE_COMMON_ENTRY else _python_common_batch)
""":func:`common_batch` for a caller that holds a ``bytes`` object: the native check when it was
built, without a dispatch on each call."""
