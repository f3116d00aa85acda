"""A batch entry's payload: ``[size u32][SingleMessageMetadata][message bytes]`` per message.

Role: ``encode.py`` writes every entry in the batch format (one message or many);
``decode.py`` and ``common_entry.py`` split it on read. ``SingleMessageMetadata`` is written
and parsed by hand, in field-number order, exactly as protobuf would serialize it; the split is
the hot loop of every read, done by the optional native decoder (``_batch_decoder.c``) where it
can vouch for the result, else here.

Invariant: a batch must be consumed exactly: ``count`` messages and no trailing byte, else
``CorruptEntry``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from broker.entry_format import wire
from broker.entry_format.model import DecodedMessage, Message
from broker.entry_format.wire import (
    INT64_MAX,
    U32,
    encode_key_value,
    encode_varint,
    length_delimited,
    parse_key_value,
    skip_field,
)
from broker.errors import CorruptEntry


def encode_single_metadata(message: Message, sequence_id: int) -> bytes:
    """``SingleMessageMetadata`` bytes, identical to what protobuf would serialize.

    Fields appear in field-number order. As in Pulsar, ``partition_key_b64_encoded`` is written
    (even when false) whenever a key is, and ``sequence_id`` is always written.
    """
    parts: list[bytes] = []
    for key, value in message.properties.items():
        parts.append(length_delimited(b"\x0a", encode_key_value(key, value)))
    if message.key is not None:
        parts.append(length_delimited(b"\x12", message.key.encode()))
    parts.append(b"\x18" + encode_varint(len(message.payload)))
    if message.compacted_out:
        parts.append(b"\x20\x01")
    if message.event_time_ms is not None:
        parts.append(b"\x28" + encode_varint(message.event_time_ms))
    if message.key is not None:
        parts.append(b"\x30\x01" if message.key_b64_encoded else b"\x30\x00")
    if message.ordering_key is not None:
        parts.append(length_delimited(b"\x3a", message.ordering_key))
    parts.append(b"\x40" + encode_varint(sequence_id))
    if message.null_value:
        parts.append(b"\x48\x01")
    if message.null_key:
        parts.append(b"\x50\x01")
    return b"".join(parts)

def encode_batch(messages: Sequence[Message], sequence_ids: list[int]) -> bytes:
    pack_u32 = U32.pack
    parts: list[bytes] = []
    for message, message_sequence_id in zip(messages, sequence_ids, strict=True):
        single = encode_single_metadata(message, message_sequence_id)
        parts.append(pack_u32(len(single)))
        parts.append(single)
        parts.append(message.payload)
    return b"".join(parts)

_python_encode_batch = encode_batch

try:
    from broker.entry_format._batch_encoder import encode_batch as _native_encode_batch
    from broker.entry_format._batch_encoder import set_message_type as _set_message_type
except ImportError:  # built without a C compiler: the Python encoder above
    NATIVE_BATCH_ENCODER = False
else:
    _set_message_type(Message, Message._field_defaults["properties"])
    NATIVE_BATCH_ENCODER = True
"""Whether batch payloads are written by the native encoder (``_batch_encoder.c``)."""


def encode_checked_batch(messages: Sequence[Message], sequence_ids: list[int]) -> bytes | None:
    """The batch payload of ``messages``, natively, when every message is one encode.py's checks
    accept as it is (then the bytes are :func:`encode_batch`'s); None when the checks and the
    Python encoder must decide (see ``_batch_encoder.c``)."""
    if not NATIVE_BATCH_ENCODER:
        return None
    return _native_encode_batch(messages, sequence_ids)


try:
    from broker.entry_format._batch_decoder import decode_batch as _native_decode_batch
    from broker.entry_format._batch_decoder import set_message_type as _set_decoded_type
except ImportError:  # built without a C compiler: the Python decoder below
    NATIVE_BATCH_DECODER = False
else:
    _set_decoded_type(DecodedMessage)
    NATIVE_BATCH_DECODER = True
"""Whether batch payloads are split by the native decoder (``_batch_decoder.c``), which hands
anything it cannot vouch for to the Python decoder, so the result is always the Python one's."""


def decode_batch(buf: bytes, count: int, first_offset: int | None, base_sequence_id: int) -> list[DecodedMessage]:
    """Split an uncompressed batch payload into ``count`` messages; it must be consumed exactly."""
    if count <= 0 or count * 6 > len(buf):
        raise CorruptEntry(f"batch of {len(buf)} bytes cannot hold {count} messages")
    if NATIVE_BATCH_DECODER:
        native = _native_decode_batch(buf, count, first_offset, base_sequence_id)
        if native is not None:
            return native
    try:
        messages = _decode_batch_items(buf, count, first_offset, base_sequence_id)
    except (IndexError, ValueError, struct.error) as exc:
        raise CorruptEntry(f"malformed batch payload: {exc}") from None
    return messages

def _decode_batch_items(
    buf: bytes, count: int, first_offset: int | None, base_sequence_id: int
) -> list[DecodedMessage]:
    # The hot loop of every read: fields are dispatched on the whole tag byte in the order
    # they are most common, and one- or two-byte varints are read inline.
    unpack_u32 = U32.unpack_from
    read_varint = wire.read_varint  # a local name: the hot loop looks it up once
    make = tuple.__new__
    cls = DecodedMessage
    total = len(buf)
    messages: list[DecodedMessage] = []
    append = messages.append
    pos = 0
    offset = -1 if first_offset is None else first_offset
    for index in range(count):
        (meta_size,) = unpack_u32(buf, pos)
        pos += 4
        end = pos + meta_size
        if end > total:
            raise CorruptEntry(f"SingleMessageMetadata of message {index} runs past the batch")
        payload_size = -1
        key: str | None = None
        properties: dict[str, str] = {}
        event_time: int | None = None
        sequence_id: int | None = None
        ordering_key: bytes | None = None
        key_b64 = null_value = null_key = compacted_out = False
        while pos < end:
            tag = buf[pos]
            if tag == 0x18:  # payload_size
                byte = buf[pos + 1]
                if byte < 0x80:
                    payload_size = byte
                    pos += 2
                else:
                    payload_size, pos = read_varint(buf, pos + 1)
            elif tag == 0x40:  # sequence_id
                byte = buf[pos + 1]
                if byte < 0x80:
                    sequence_id = byte
                    pos += 2
                elif buf[pos + 2] < 0x80:
                    sequence_id = (byte & 0x7F) | (buf[pos + 2] << 7)
                    pos += 3
                else:
                    sequence_id, pos = read_varint(buf, pos + 1)
            elif tag == 0x28:  # event_time: epoch milliseconds (2^35..2^42) are 6-byte varints
                if pos + 7 <= total:
                    b0, b1, b2, b3, b4, b5 = buf[pos + 1 : pos + 7]
                    if b5 < 0x80 and (b0 & b1 & b2 & b3 & b4) >= 0x80:
                        event_time = (
                            (b0 & 0x7F)
                            | (b1 & 0x7F) << 7
                            | (b2 & 0x7F) << 14
                            | (b3 & 0x7F) << 21
                            | (b4 & 0x7F) << 28
                            | b5 << 35
                        )
                        pos += 7
                        continue
                event_time, pos = read_varint(buf, pos + 1)
            elif tag in {0x12, 0x0A, 0x3A}:  # partition_key, property, ordering_key
                length = buf[pos + 1]
                if length < 0x80:
                    pos += 2
                else:
                    length, pos = read_varint(buf, pos + 1)
                stop = pos + length
                if stop > end:
                    raise CorruptEntry(f"field of message {index} runs past its SingleMessageMetadata")
                if tag == 0x12:
                    key = buf[pos:stop].decode()
                elif tag == 0x0A:
                    # A KeyValue as protobuf writes it for short strings: 0a len key 12 len value.
                    split = pos + 2 + buf[pos + 1]
                    if (
                        buf[pos] == 0x0A
                        and buf[pos + 1] < 0x80
                        and split + 2 <= stop
                        and buf[split] == 0x12
                        and split + 2 + buf[split + 1] == stop
                    ):
                        properties[buf[pos + 2 : split].decode()] = buf[split + 2 : stop].decode()
                    else:
                        name, text = parse_key_value(buf, pos, stop)
                        properties[name] = text
                else:
                    ordering_key = buf[pos:stop]
                pos = stop
            elif tag in {0x30, 0x20, 0x48, 0x50}:  # the bools
                flag = buf[pos + 1]
                if flag < 0x80:
                    pos += 2
                else:
                    flag, pos = read_varint(buf, pos + 1)
                if tag == 0x30:
                    key_b64 = flag != 0
                elif tag == 0x20:
                    compacted_out = flag != 0
                elif tag == 0x48:
                    null_value = flag != 0
                else:
                    null_key = flag != 0
            else:  # a field we do not know (or a multi-byte tag): skip it
                tag, pos = read_varint(buf, pos)
                pos = skip_field(buf, pos, tag & 7)
        if pos != end:
            raise CorruptEntry(f"SingleMessageMetadata of message {index} overruns its declared size")
        if payload_size < 0 or payload_size > INT64_MAX:
            raise CorruptEntry(f"message {index} of the batch has no valid payload_size")
        stop = pos + payload_size
        if stop > total:
            raise CorruptEntry(f"payload of message {index} runs past the batch")
        append(
            make(
                cls,
                (
                    index,
                    None if offset < 0 else offset + index,
                    buf[pos:stop],
                    key,
                    properties,
                    event_time,
                    base_sequence_id + index if sequence_id is None else sequence_id,
                    ordering_key,
                    key_b64,
                    null_value,
                    null_key,
                    compacted_out,
                ),
            )
        )
        pos = stop
    if pos != total:
        raise CorruptEntry(f"batch payload has {total - pos} trailing bytes after {count} messages")
    return messages
