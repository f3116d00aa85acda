"""What the entry-format tests share: an encoder with defaults, sample messages, Pulsar's layout
assembled independently from the protobuf classes, and the message strategies of the property
tests (``test_entry_format*.py``).
"""

from __future__ import annotations

import struct

import crc32c
from hypothesis import strategies as st

from broker.entry_format import DecodedMessage, Message, encode_entry
from broker.proto import pulsar_entry_pb2 as pb

UINT64_MAX = (1 << 64) - 1
PUBLISH_MS = 1_700_000_000_123


def encode(messages: list[Message], **kwargs: object) -> bytes:
    args: dict[str, object] = {"producer_name": "producer-1", "sequence_id": 10, "publish_time_ms": PUBLISH_MS}
    args.update(kwargs)
    return encode_entry(messages, **args)  # type: ignore[arg-type]


def sample_messages() -> list[Message]:
    return [
        Message(b"hello", key="user-1", properties={"a": "1", "b": ""}, event_time_ms=PUBLISH_MS - 5),
        Message(b""),
        Message(b"\x00" * 300, key="", ordering_key=b"\x01\x02", sequence_id=99),
        Message(b"", null_value=True, key="k", key_b64_encoded=True, null_key=True, compacted_out=True),
        Message(b"tail", event_time_ms=0, properties={"\u00e9t\u00e9": "\U0001f600", "long": "v" * 200}),
        # multi-byte lengths and varints everywhere: key, ordering key, sequence id, event time
        Message(b"p" * 20_000, key="k" * 150, ordering_key=b"o" * 130, sequence_id=1 << 40, event_time_ms=1 << 50),
        Message(b"last"),
    ]


SAMPLE_SEQUENCE_IDS = [10, 11, 99, 13, 14, 1 << 40, 16]


def assert_matches(decoded: DecodedMessage, message: Message, batch_index: int, sequence_id: int) -> None:
    assert decoded.batch_index == batch_index
    assert decoded.payload == message.payload
    assert decoded.key == message.key
    assert decoded.properties == dict(message.properties)
    assert decoded.event_time_ms == message.event_time_ms
    assert decoded.sequence_id == sequence_id
    assert decoded.ordering_key == message.ordering_key
    assert decoded.key_b64_encoded == message.key_b64_encoded
    assert decoded.null_value == message.null_value
    assert decoded.null_key == message.null_key
    assert decoded.compacted_out == message.compacted_out


def crc_entry(metadata: bytes, payload: bytes) -> bytes:
    """An entry assembled the way Pulsar's serializeMetadataAndPayload lays it out."""
    size = struct.pack(">I", len(metadata))
    return struct.pack(">HI", 0x0E01, crc32c.crc32c(size + metadata + payload)) + size + metadata + payload


def reference_single_metadata(message: Message, sequence_id: int) -> bytes:
    """SingleMessageMetadata built with the protobuf runtime, the way Pulsar's client fills it."""
    smm = pb.SingleMessageMetadata(payload_size=len(message.payload), sequence_id=sequence_id)
    for name, value in message.properties.items():
        smm.properties.add(key=name, value=value)
    if message.key is not None:
        smm.partition_key = message.key
        smm.partition_key_b64_encoded = message.key_b64_encoded
    if message.ordering_key is not None:
        smm.ordering_key = message.ordering_key
    if message.event_time_ms is not None:
        smm.event_time = message.event_time_ms
    if message.null_value:
        smm.null_value = True
    if message.null_key:
        smm.null_partition_key = True
    if message.compacted_out:
        smm.compacted_out = True
    serialized: bytes = smm.SerializeToString()
    return serialized


def batch_payload(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(struct.pack(">I", len(meta)) + meta + payload for meta, payload in items)


texts = st.text(max_size=12)


messages_strategy = st.builds(
    lambda key_b64_encoded, **fields: Message(key_b64_encoded=key_b64_encoded and fields["key"] is not None, **fields),
    payload=st.binary(max_size=200),
    key=st.none() | texts,
    properties=st.dictionaries(texts, texts, max_size=4),
    event_time_ms=st.none() | st.integers(min_value=0, max_value=(1 << 63) - 1),
    sequence_id=st.none() | st.integers(min_value=0, max_value=UINT64_MAX),
    ordering_key=st.none() | st.binary(max_size=10),
    key_b64_encoded=st.booleans(),
    null_key=st.booleans(),
    compacted_out=st.booleans(),
)
