"""Encode messages into one stored entry and decode it back: the checked, checksummed whole.

Role: ``encode_entry`` validates its arguments, writes the batch (``batch.py``), the entry's
``MessageMetadata`` (by hand, as protobuf would), compresses (``compression.py``), checksums
(CRC32C over metadata size, metadata and payload) and optionally prefixes broker metadata
(``broker_metadata.py``). ``decode_entry_payload`` verifies an entry (prefix, checksum,
metadata, encryption, decompression, index) without splitting it; ``decode_entry`` splits it
too. See the package docstring for the layout and the decisions behind it.

Failures: malformed or checksum-failing bytes raise ``CorruptEntry`` (never garbage); bad
arguments to the encoder raise ``InvalidRequest``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c
from google.protobuf.message import DecodeError

from broker.entry_format.batch import decode_batch, encode_batch, encode_checked_batch
from broker.entry_format.broker_metadata import broker_prefix, split_prefix
from broker.entry_format.compression import COMPRESSIONS, MAX_UNCOMPRESSED_SIZE_BYTES, Compression, compress, decompress
from broker.entry_format.model import DecodedEntry, DecodedMessage, EntryPayload, Message
from broker.entry_format.wire import (
    CHECKSUM_HEADER,
    INT64_MAX,
    INT64_MIN,
    MAGIC_CRC32C,
    U16,
    U32,
    UINT64_MAX,
    UINT64_MOD,
    Buffer,
    check_uint64,
    encode_key_value,
    encode_varint,
    length_delimited,
    read_varint,
    skip_field,
)
from broker.errors import CorruptEntry, InvalidRequest
from broker.proto import pulsar_entry_pb2 as pb

_CHECKSUM_MAGIC = U16.pack(MAGIC_CRC32C)


def _check_message(position: int, message: Message) -> None:
    where = f"message {position}"
    if not isinstance(message, Message):
        raise InvalidRequest(f"{where} must be a Message, got {type(message).__name__}")
    if not isinstance(message.payload, bytes):
        raise InvalidRequest(f"{where}: payload must be bytes, got {type(message.payload).__name__}")
    if message.null_value and message.payload:
        raise InvalidRequest(f"{where}: a null value must have an empty payload")
    if message.key is not None and not isinstance(message.key, str):
        raise InvalidRequest(f"{where}: key must be a string")
    if message.key_b64_encoded and message.key is None:
        raise InvalidRequest(f"{where}: key_b64_encoded needs a key")
    if message.ordering_key is not None and not isinstance(message.ordering_key, bytes):
        raise InvalidRequest(f"{where}: ordering_key must be bytes")
    for name, value in message.properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidRequest(f"{where}: property keys and values must be strings")
    # a Java long in Pulsar's clients, and an Arrow timestamp on reads: never past 2**63 - 1
    check_uint64(f"{where}: event_time_ms", message.event_time_ms, INT64_MAX)
    check_uint64(f"{where}: sequence_id", message.sequence_id)

def _check_encode_arguments(
    messages: Sequence[Message],
    *,
    producer_name: str,
    sequence_id: int,
    publish_time_ms: int,
    compression: Compression,
    deliver_at_time_ms: int | None,
    schema_version: bytes | None,
    messages_checked: bool = False,
) -> None:
    """``InvalidRequest`` for the first bad argument; ``messages_checked``: each message already
    passed :func:`_check_message`'s rules (the native batch encoder's checks)."""
    if not messages:
        raise InvalidRequest("an entry needs at least one message")
    if not isinstance(producer_name, str):
        raise InvalidRequest("producer_name must be a string")
    try:
        producer_name.encode()
    except UnicodeEncodeError:
        raise InvalidRequest("producer_name must be valid Unicode (no lone surrogates)") from None
    check_uint64("sequence_id", sequence_id)
    check_uint64("publish_time_ms", publish_time_ms)
    if not isinstance(compression, Compression):
        raise InvalidRequest(f"compression must be a Compression, got {compression!r}")
    if deliver_at_time_ms is not None and (
        not isinstance(deliver_at_time_ms, int) or not INT64_MIN <= deliver_at_time_ms <= INT64_MAX
    ):
        raise InvalidRequest(f"deliver_at_time_ms must be a 64-bit integer, got {deliver_at_time_ms!r}")
    if schema_version is not None and not isinstance(schema_version, bytes):
        raise InvalidRequest("schema_version must be bytes")
    if not messages_checked:
        for position, message in enumerate(messages):
            _check_message(position, message)
    first = messages[0].sequence_id
    if first is not None and first != sequence_id:
        raise InvalidRequest(f"the entry's sequence_id {sequence_id} must be its first message's ({first})")

def _common_value(values: list[str | None] | list[bytes | None]) -> str | bytes | None:
    first = values[0]
    return first if all(v == first for v in values) else None

def _encode_metadata(
    messages: Sequence[Message],
    sequence_ids: list[int],
    *,
    producer_name: str,
    publish_time_ms: int,
    compression: Compression,
    uncompressed_size: int,
    deliver_at_time_ms: int | None,
    schema_version: bytes | None,
) -> bytes:
    """The entry's ``MessageMetadata`` bytes, identical to what protobuf would serialize (fields
    in number order). The partition key (with ``partition_key_b64_encoded``) and the ordering
    key are written when every message has the same one."""
    parts = [length_delimited(b"\x0a", producer_name.encode()), b"\x10", encode_varint(sequence_ids[0]),
             b"\x18", encode_varint(publish_time_ms)]
    key = messages[0].key if len(messages) == 1 else _common_value([m.key for m in messages])
    if isinstance(key, str):
        parts.append(length_delimited(b"\x32", key.encode()))
    if compression is not Compression.NONE:
        parts += (b"\x40", encode_varint(int(compression)), b"\x48", encode_varint(uncompressed_size))
    parts += (b"\x58", encode_varint(len(messages)))
    if schema_version is not None:
        parts.append(length_delimited(b"\x82\x01", schema_version))
    if isinstance(key, str):
        parts.append(b"\x88\x01\x01" if messages[0].key_b64_encoded else b"\x88\x01\x00")
    ordering_key = messages[0].ordering_key if len(messages) == 1 else _common_value([m.ordering_key for m in messages])
    if isinstance(ordering_key, bytes):
        parts.append(length_delimited(b"\x92\x01", ordering_key))
    if deliver_at_time_ms is not None:
        parts += (b"\x98\x01", encode_varint(deliver_at_time_ms % UINT64_MOD))
    parts += (b"\xc0\x01", encode_varint(sequence_ids[-1]))
    return b"".join(parts)

def encode_entry(
    messages: Sequence[Message],
    *,
    producer_name: str,
    sequence_id: int,
    publish_time_ms: int,
    compression: Compression = Compression.NONE,
    broker_timestamp_ms: int | None = None,
    index: int | None = None,
    deliver_at_time_ms: int | None = None,
    schema_version: bytes | None = None,
) -> bytes:
    """Encode ``messages`` as one batched entry in Pulsar's stored format.

    ``sequence_id`` is the entry's sequence id, which is its first message's (a first message
    with a different one is refused); messages without their own get ``sequence_id +
    batch_index``, and the entry's ``highest_sequence_id`` is the last message's. ``index`` is
    Pulsar's broker index: the offset of the LAST message. The broker-metadata prefix is
    written when ``broker_timestamp_ms`` and ``index`` are given (both or neither). Raises
    ``InvalidRequest`` for bad arguments.
    """
    checks = {"producer_name": producer_name, "sequence_id": sequence_id, "publish_time_ms": publish_time_ms,
              "compression": compression, "deliver_at_time_ms": deliver_at_time_ms,
              "schema_version": schema_version}
    batch = _natively_checked_batch(messages, sequence_id)
    if batch is not None:  # every message passed the native encoder's checks, which are _check_message's
        sequence_ids, batch_bytes = batch
        _check_encode_arguments(messages, **checks, messages_checked=True)  # type: ignore[arg-type]
    else:
        _check_encode_arguments(messages, **checks)  # type: ignore[arg-type]
        sequence_ids = [sequence_id + i if m.sequence_id is None else m.sequence_id for i, m in enumerate(messages)]
        if max(sequence_ids) > UINT64_MAX:
            raise InvalidRequest(f"sequence ids from {sequence_id} on overflow 64 bits within this entry")
        try:
            batch_bytes = encode_batch(messages, sequence_ids)
        except UnicodeEncodeError:
            raise InvalidRequest("keys and properties must be valid Unicode (no lone surrogates)") from None
    if len(batch_bytes) > MAX_UNCOMPRESSED_SIZE_BYTES:
        raise InvalidRequest(f"batch of {len(batch_bytes)} bytes is over {MAX_UNCOMPRESSED_SIZE_BYTES} bytes")
    metadata = _encode_metadata(
        messages,
        sequence_ids,
        producer_name=producer_name,
        publish_time_ms=publish_time_ms,
        compression=compression,
        uncompressed_size=len(batch_bytes),
        deliver_at_time_ms=deliver_at_time_ms,
        schema_version=schema_version,
    )
    body = _checksummed(metadata, compress(compression, batch_bytes))
    if broker_timestamp_ms is None and index is None:
        return body
    if broker_timestamp_ms is None or index is None:
        raise InvalidRequest("broker_timestamp_ms and index are given together or not at all")
    return broker_prefix(broker_timestamp_ms, index) + body

def as_unbatched(data: Buffer) -> bytes | None:
    """A stored entry holding one message in the batch format, as Pulsar stores a message sent
    without batching (the message's fields in the ``MessageMetadata`` itself, no
    ``num_messages_in_batch``, the payload uncompressed), from the ``0x0e01`` magic on, without
    the broker prefix; None for any other entry (several messages, or not batched already).

    Pulsar's clients number the message of a one-message batch with batch index 0 and an
    unbatched message with none; Magnetar writes even a lone message as a batch, so a binary
    consumer is given this form, whose id (no batch index) is the one every other edge gives.
    Raises ``CorruptEntry`` for a malformed entry."""
    batch = _common_batch(data) if isinstance(data, bytes) else None
    if batch is None:
        return _general_unbatched(data)
    payload_start, count, first_offset, sequence_id, _, lone = batch  # the entry the broker writes
    if lone is not None or count != 1:
        return None
    assert isinstance(data, bytes)
    try:
        message = decode_batch(data[payload_start:], 1, first_offset, sequence_id)[0]
    except CorruptEntry:
        return _general_unbatched(data)  # refused by the decoder, in its own words
    return _common_unbatched(data, payload_start, message)


_KEPT_UNBATCHED_TAGS = {1: b"\x0a", 2: b"\x10", 3: b"\x18", 16: b"\x82\x01", 19: b"\x98\x01",
                        24: b"\xc0\x01"}
"""The fields of a common entry's ``MessageMetadata`` an unbatched message keeps as they are
(producer name, sequence id unless the message has its own, publish time, schema version,
delivery time, highest sequence id), by number; the others are the batch's (count,
compression, sizes) or the message's own."""


def _common_unbatched(data: bytes, payload_start: int, message: DecodedMessage) -> bytes:
    """:func:`as_unbatched` of a common one-message batch (``_common_batch`` verified it), the
    metadata written field by field in protobuf's order, as ``SerializeToString`` writes it."""
    kept: dict[int, bytes] = {}
    pos = 6 + U32.unpack_from(data, 2)[0] + CHECKSUM_HEADER.size
    while pos < payload_start:
        tag, value_start = read_varint(data, pos)
        number = tag >> 3
        pos = skip_field(data, value_start, tag & 7)
        if number in _KEPT_UNBATCHED_TAGS:
            kept[number] = data[value_start:pos]
    parts = [b"\x0a", kept[1], b"\x10",
             kept[2] if message.sequence_id is None else encode_varint(message.sequence_id), b"\x18", kept[3]]
    for key, value in message.properties.items():
        parts.append(length_delimited(b"\x22", encode_key_value(key, value)))
    if message.key is not None:
        parts.append(length_delimited(b"\x32", message.key.encode()))
    if message.event_time_ms is not None:
        parts += (b"\x60", encode_varint(message.event_time_ms))
    if 16 in kept:
        parts += (b"\x82\x01", kept[16])
    if message.key is not None:
        parts.append(b"\x88\x01\x01" if message.key_b64_encoded else b"\x88\x01\x00")
    if message.ordering_key is not None:
        parts.append(length_delimited(b"\x92\x01", message.ordering_key))
    for number in (19, 24):
        if number in kept:
            parts += (_KEPT_UNBATCHED_TAGS[number], kept[number])
    if message.null_value:
        parts.append(b"\xc8\x01\x01")
    if message.null_key:
        parts.append(b"\xf0\x01\x01")
    return _checksummed(b"".join(parts), message.payload)


def _general_unbatched(data: Buffer) -> bytes | None:
    decoded = decode_entry(data)
    if not decoded.metadata.HasField("num_messages_in_batch") or len(decoded.messages) != 1:
        return None
    message = decoded.messages[0]
    metadata = pb.MessageMetadata()
    metadata.CopyFrom(decoded.metadata)
    for name in ("num_messages_in_batch", "compression", "uncompressed_size", "partition_key",
                 "partition_key_b64_encoded", "ordering_key", "event_time", "null_value", "null_partition_key"):
        metadata.ClearField(name)
    del metadata.properties[:]
    if message.sequence_id is not None:
        metadata.sequence_id = message.sequence_id
    if message.key is not None:
        metadata.partition_key = message.key
        metadata.partition_key_b64_encoded = message.key_b64_encoded
    for key, value in message.properties.items():
        metadata.properties.add(key=key, value=value)
    if message.event_time_ms is not None:
        metadata.event_time = message.event_time_ms
    if message.ordering_key is not None:
        metadata.ordering_key = message.ordering_key
    if message.null_value:
        metadata.null_value = True
    if message.null_key:
        metadata.null_partition_key = True
    return _checksummed(metadata.SerializeToString(), message.payload)


def encode_single_entry(message: Message, *, producer_name: str, sequence_id: int, publish_time_ms: int) -> bytes:
    """``encode_entry((message,), …)`` without compression, delivery time or schema version:
    the same bytes, written in one pass for the common message (payload, key, properties, event
    time). Anything else, including every argument ``encode_entry`` refuses, goes to
    ``encode_entry``, which refuses it the same way."""
    payload, key, _, event_time_ms, own_sequence_id = message[:5]
    if (type(payload) is not bytes or message[5] is not None or message[7] or message[8] or message[9]
            or (key is not None and type(key) is not str) or type(sequence_id) is not int
            or not 0 <= sequence_id <= UINT64_MAX or type(publish_time_ms) is not int
            or not 0 <= publish_time_ms <= UINT64_MAX or type(producer_name) is not str
            or (own_sequence_id is not None and own_sequence_id != sequence_id)
            or (event_time_ms is not None and (type(event_time_ms) is not int or not 0 <= event_time_ms <= INT64_MAX))):
        return _encode_general(message, producer_name, sequence_id, publish_time_ms)
    varint = encode_varint
    batch = encode_checked_batch((message,), [sequence_id])  # [size][SingleMessageMetadata][payload]
    try:
        if batch is None:
            batch = _python_single_batch(message, sequence_id)
        key_field = b""
        if key is not None:
            key_bytes = key.encode()
            key_field = varint(len(key_bytes)) + key_bytes
        producer = producer_name.encode()
    except (UnicodeEncodeError, _NotPlain):
        return _encode_general(message, producer_name, sequence_id, publish_time_ms)
    sequence = varint(sequence_id)
    metadata = b"\x0a" + varint(len(producer)) + producer + b"\x10" + sequence + b"\x18" + varint(publish_time_ms)
    if key is not None:
        metadata += b"\x32" + key_field + b"\x58\x01" + (b"\x88\x01\x01" if message[6] else b"\x88\x01\x00")
    else:
        metadata += b"\x58\x01"
    metadata += b"\xc0\x01" + sequence
    if len(batch) > MAX_UNCOMPRESSED_SIZE_BYTES:
        return _encode_general(message, producer_name, sequence_id, publish_time_ms)
    head = U32.pack(len(metadata)) + metadata
    checksum = crc32c.crc32c(batch, crc32c.crc32c(head))
    return _CHECKSUM_MAGIC + U32.pack(checksum) + head + batch


class _NotPlain(Exception):
    """A message the one-pass encoder leaves to ``encode_entry``."""


def _python_single_batch(message: Message, sequence_id: int) -> bytes:
    """``encode_batch([message], [sequence_id])`` for a message already checked by
    :func:`encode_single_entry`, without the native encoder; ``_NotPlain`` for properties that
    are not all str."""
    payload, key, properties, event_time_ms = message[:4]
    varint = encode_varint
    single = b""
    if properties:
        for name, value in properties.items():
            if type(name) is not str or type(value) is not str:
                raise _NotPlain
            pair = encode_key_value(name, value)
            single += b"\x0a" + varint(len(pair)) + pair
    if key is not None:
        key_bytes = key.encode()
        single += b"\x12" + varint(len(key_bytes)) + key_bytes
    single += b"\x18" + varint(len(payload))
    if event_time_ms is not None:
        single += b"\x28" + varint(event_time_ms)
    if key is not None:
        single += b"\x30\x01" if message[6] else b"\x30\x00"
    single += b"\x40" + varint(sequence_id)
    return U32.pack(len(single)) + single + payload


def _encode_general(message: Message, producer_name: str, sequence_id: int, publish_time_ms: int) -> bytes:
    return encode_entry((message,), producer_name=producer_name, sequence_id=sequence_id,
                        publish_time_ms=publish_time_ms)


def _natively_checked_batch(messages: Sequence[Message], sequence_id: int) -> tuple[list[int], bytes] | None:
    """The sequence ids and batch payload of ``messages`` from the native encoder, when it takes
    every one of them as it is (see ``_batch_encoder.c``); None otherwise."""
    if type(sequence_id) is not int or not messages:
        return None
    try:
        sequence_ids = [sequence_id + i if m.sequence_id is None else m.sequence_id for i, m in enumerate(messages)]
    except AttributeError:  # not Messages: the checks say so
        return None
    batch = encode_checked_batch(messages, sequence_ids)
    return None if batch is None else (sequence_ids, batch)


def _checksummed(metadata: bytes, payload: bytes) -> bytes:
    size = U32.pack(len(metadata))
    checksum = crc32c.crc32c(payload, crc32c.crc32c(size + metadata))
    return b"".join((U16.pack(MAGIC_CRC32C), U32.pack(checksum), size, metadata, payload))

def message_count(data: Buffer) -> int:
    """Number of messages in an encoded entry, from its ``MessageMetadata`` alone.

    Cheap (no checksum verification, no decompression); use :func:`decode_entry` to verify.
    Raises ``CorruptEntry`` when the entry's structure is malformed.
    """
    start = split_prefix(data)[1]
    if len(data) - start < CHECKSUM_HEADER.size:
        raise CorruptEntry(f"entry of {len(data)} bytes is too short")
    magic, _, metadata_size = CHECKSUM_HEADER.unpack_from(data, start)
    if magic != MAGIC_CRC32C:
        raise CorruptEntry(f"entry does not start with the checksum magic 0x0e01 (found {magic:#06x})")
    metadata_start = start + CHECKSUM_HEADER.size
    if metadata_start + metadata_size > len(data):
        raise CorruptEntry(f"MessageMetadata of {metadata_size} bytes runs past the {len(data)}-byte entry")
    metadata = parse_metadata(bytes(data[metadata_start : metadata_start + metadata_size]))
    count: int = metadata.num_messages_in_batch
    if count <= 0:
        raise CorruptEntry(f"entry declares {count} messages")
    return count

def parse_metadata(raw: bytes) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata()
    try:
        metadata.ParseFromString(raw)
    except (DecodeError, ValueError) as exc:
        raise CorruptEntry(f"malformed MessageMetadata: {exc}") from None
    if not metadata.IsInitialized():
        missing = ", ".join(metadata.FindInitializationErrors())
        raise CorruptEntry(f"MessageMetadata lacks required fields: {missing}")
    return metadata

def _verified_metadata_and_payload(data: bytes, start: int) -> tuple[pb.MessageMetadata, memoryview]:
    if len(data) - start < CHECKSUM_HEADER.size:
        raise CorruptEntry(f"entry of {len(data)} bytes is too short")
    magic, stored_checksum, metadata_size = CHECKSUM_HEADER.unpack_from(data, start)
    if magic != MAGIC_CRC32C:
        raise CorruptEntry(f"entry does not start with the checksum magic 0x0e01 (found {magic:#06x})")
    view = memoryview(data)
    checksum = crc32c.crc32c(view[start + 6 :])
    if checksum != stored_checksum:
        raise CorruptEntry(f"entry checksum mismatch: stored {stored_checksum:#010x}, computed {checksum:#010x}")
    metadata_start = start + CHECKSUM_HEADER.size
    payload_start = metadata_start + metadata_size
    if payload_start > len(data):
        raise CorruptEntry(f"MessageMetadata of {metadata_size} bytes runs past the {len(data)}-byte entry")
    metadata = parse_metadata(data[metadata_start:payload_start])
    return metadata, view[payload_start:]

def _single_message(metadata: pb.MessageMetadata, payload: bytes, offset: int | None) -> DecodedMessage:
    has = metadata.HasField
    return DecodedMessage(
        batch_index=-1,
        offset=offset,
        payload=payload,
        key=metadata.partition_key if has("partition_key") else None,
        properties={kv.key: kv.value for kv in metadata.properties},
        event_time_ms=metadata.event_time if has("event_time") else None,
        sequence_id=metadata.sequence_id,
        ordering_key=metadata.ordering_key if has("ordering_key") else None,
        key_b64_encoded=metadata.partition_key_b64_encoded,
        null_value=metadata.null_value,
        null_key=metadata.null_partition_key,
        compacted_out=False,
    )

def _first_offset(index: int, count: int) -> int:
    first = index - count + 1
    if first < 0:
        raise CorruptEntry(f"broker index {index} is too small for an entry of {count} messages")
    return first

def decode_entry_payload(data: Buffer) -> EntryPayload:
    """Verify one stored entry and decompress its payload, without splitting it into messages.

    Everything :func:`decode_entry` checks before it splits the batch is checked here
    (prefix, checksum, ``MessageMetadata``, encryption, decompression, broker index), so a
    reader that splits the payload itself (the native range-read columns) is as strict.
    Raises ``CorruptEntry`` for anything malformed, ``InvalidRequest`` for an encrypted entry.
    """
    raw = data if isinstance(data, bytes) else bytes(data)
    broker, start = split_prefix(raw)
    metadata, compressed = _verified_metadata_and_payload(raw, start)
    if metadata.encryption_keys:
        raise InvalidRequest("entry is end-to-end encrypted; the broker cannot read its messages")
    code = metadata.compression
    if not 0 <= code < len(COMPRESSIONS):
        raise CorruptEntry(f"unknown compression type {code}")
    compression = COMPRESSIONS[code]
    payload: bytes | memoryview
    if compression is Compression.NONE:
        payload = compressed
    else:
        payload = decompress(compression, compressed, metadata.uncompressed_size)
    is_batched = metadata.HasField("num_messages_in_batch")
    count = metadata.num_messages_in_batch if is_batched else 1
    first_offset = None if broker is None else _first_offset(broker.index, count)
    return EntryPayload(broker, metadata, compression, payload, is_batched, count, first_offset)

def decode_entry(data: Buffer) -> DecodedEntry:
    """Verify and decode one stored entry. Raises ``CorruptEntry`` for anything malformed."""
    return split_entry_payload(decode_entry_payload(data))

def split_entry_payload(entry: EntryPayload) -> DecodedEntry:
    """The messages of an entry :func:`decode_entry_payload` verified (``CorruptEntry`` when its
    batch is malformed)."""
    payload = entry.payload if isinstance(entry.payload, bytes) else entry.payload.tobytes()
    if entry.is_batched:
        messages = decode_batch(payload, entry.num_messages, entry.first_offset, entry.metadata.sequence_id)
    else:
        messages = [_single_message(entry.metadata, payload, entry.first_offset)]
    return DecodedEntry(entry.broker_metadata, entry.metadata, entry.compression, len(payload), messages)


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


def _fast_messages(data: bytes) -> tuple[list[DecodedMessage], int | None] | None:
    """The messages of a common entry, or None for :func:`decode_entry` to decode (or refuse)."""
    batch = _common_batch(data)
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
    batch = _common_batch(data) if type(data) is bytes else None
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
    batch = _common_batch(data) if type(data) is bytes else None
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


def _common_batch(data: bytes) -> _CommonEntry | None:
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
    entry, or None (see :func:`_common_batch`); ``_common_entry.c`` reads it when it was built."""
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
