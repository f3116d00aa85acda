"""Pulsar's entry format and message ids (broker/entry_format.py, broker/message_id.py).

Checks: round trips for every compression and batch size; our bytes equal an entry assembled
independently from the protobuf classes in Pulsar's layout (magic, CRC32C over size+metadata+
payload, batch items); entries in Pulsar's non-batched form decode; corruption of any kind is
reported as ``CorruptEntry`` and never as garbage or another exception; the broker-entry-
metadata prefix (index = offset of the LAST message); Pulsar's message id forms.
"""

from __future__ import annotations

import base64
import contextlib
import struct
import zlib
from typing import Any

import cramjam
import crc32c
import lz4.block
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.entry_format import (
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CRC32C,
    BrokerEntryMetadata,
    Compression,
    DecodedMessage,
    Message,
    as_unbatched,
    common_client_entry,
    decode_entry,
    decode_messages,
    encode_entry,
    encode_single_entry,
    message_count,
    peek_broker_entry_metadata,
    strip_broker_entry_metadata,
    with_broker_entry_metadata,
    with_broker_entry_metadata_each,
)
from broker.errors import CorruptEntry, InvalidRequest
from broker.message_id import MessageId, Position
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


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(Compression))
def test_round_trip_for_every_compression(compression: Compression) -> None:
    messages = sample_messages()
    data = encode(messages, compression=compression)
    entry = decode_entry(data)
    assert entry.compression is compression
    assert entry.producer_name == "producer-1" and entry.publish_time_ms == PUBLISH_MS
    assert entry.sequence_id == 10 and entry.highest_sequence_id == 16
    assert entry.is_batched and entry.num_messages == len(messages)
    assert entry.index is None and entry.broker_timestamp_ms is None and entry.first_offset is None
    for i, (decoded, message) in enumerate(zip(entry.messages, messages, strict=True)):
        assert_matches(decoded, message, i, SAMPLE_SEQUENCE_IDS[i])
        assert decoded.offset is None
    # Pulsar writes uncompressed_size only for compressed entries.
    assert entry.metadata.HasField("uncompressed_size") == (compression is not Compression.NONE)
    assert entry.metadata.HasField("compression") == (compression is not Compression.NONE)


@pytest.mark.parametrize("count", [1, 1000])
@pytest.mark.parametrize("compression", [Compression.NONE, Compression.LZ4, Compression.ZSTD])
def test_batches_of_one_and_a_thousand(count: int, compression: Compression) -> None:
    messages = [
        Message(
            f"payload-{i}".encode() * (i % 7),
            key=f"key-{i % 13}",
            event_time_ms=PUBLISH_MS + i,
            properties={"n": str(i)} if i % 3 == 0 else {},
        )
        for i in range(count)
    ]
    data = encode(messages, compression=compression, broker_timestamp_ms=PUBLISH_MS + 1, index=5000 + count - 1)
    entry = decode_entry(data)
    assert len(entry.messages) == count and message_count(data) == count
    assert entry.first_offset == 5000 and entry.index == 5000 + count - 1
    for i, decoded in enumerate(entry.messages):
        assert_matches(decoded, messages[i], i, 10 + i)
        assert decoded.offset == 5000 + i


def test_entry_level_keys_only_when_the_whole_batch_shares_them() -> None:
    same = decode_entry(encode([Message(b"a", key="k", ordering_key=b"o")] * 3))
    assert same.partition_key == "k" and same.ordering_key == b"o"
    assert same.metadata.partition_key_b64_encoded is False
    mixed = decode_entry(encode([Message(b"a", key="k"), Message(b"b", key="j"), Message(b"c")]))
    assert mixed.partition_key is None and mixed.ordering_key is None


def test_optional_entry_fields_round_trip() -> None:
    entry = decode_entry(encode([Message(b"x")], deliver_at_time_ms=PUBLISH_MS + 60_000, schema_version=b"\x00\x01"))
    assert entry.deliver_at_time_ms == PUBLISH_MS + 60_000 and entry.schema_version == b"\x00\x01"
    plain = decode_entry(encode([Message(b"x")]))
    assert plain.deliver_at_time_ms is None and plain.schema_version is None and plain.event_time_ms is None


# -- byte-for-byte compatibility ------------------------------------------------------------------


def test_encoded_bytes_equal_an_independently_assembled_pulsar_entry() -> None:
    messages = sample_messages()
    sequence_ids = SAMPLE_SEQUENCE_IDS
    payload = batch_payload(
        [(reference_single_metadata(m, s), m.payload) for m, s in zip(messages, sequence_ids, strict=True)]
    )
    metadata = pb.MessageMetadata(
        producer_name="producer-1",
        sequence_id=10,
        publish_time=PUBLISH_MS,
        num_messages_in_batch=len(messages),
        highest_sequence_id=16,
    )
    assert encode(messages) == crc_entry(metadata.SerializeToString(), payload)


def test_compressed_payloads_use_pulsars_stream_formats() -> None:
    messages = [Message(b"abc" * 200, key="k")]
    raw = decode_entry(encode(messages)).metadata
    assert not raw.HasField("uncompressed_size")
    uncompressed = batch_payload([(reference_single_metadata(messages[0], 10), messages[0].payload)])
    for compression in (Compression.LZ4, Compression.ZLIB, Compression.ZSTD, Compression.SNAPPY):
        data = encode(messages, compression=compression)
        (metadata_size,) = struct.unpack_from(">I", data, 6)
        metadata = pb.MessageMetadata.FromString(data[10 : 10 + metadata_size])
        compressed = data[10 + metadata_size :]
        assert metadata.uncompressed_size == len(uncompressed)
        if compression is Compression.LZ4:  # a raw LZ4 block: no frame, no size prefix
            assert lz4.block.decompress(compressed, uncompressed_size=len(uncompressed)) == uncompressed
        elif compression is Compression.ZLIB:  # a zlib stream drained with SYNC_FLUSH, as Deflater does
            assert compressed[:2] == b"\x78\x9c" and compressed.endswith(b"\x00\x00\xff\xff")
            assert zlib.decompressobj().decompress(compressed) == uncompressed
        elif compression is Compression.ZSTD:  # a zstd frame
            assert compressed[:4] == b"\x28\xb5\x2f\xfd"
            assert zstandard.ZstdDecompressor().decompress(compressed) == uncompressed
        else:  # raw snappy (length preamble, no stream framing)
            assert bytes(cramjam.snappy.decompress_raw(compressed)) == uncompressed


def test_zlib_entries_finished_with_a_final_block_decode_too() -> None:
    message = Message(b"z" * 100)
    uncompressed = batch_payload([(reference_single_metadata(message, 10), message.payload)])
    metadata = pb.MessageMetadata(
        producer_name="p",
        sequence_id=10,
        publish_time=1,
        num_messages_in_batch=1,
        compression=pb.ZLIB,
        uncompressed_size=len(uncompressed),
    )
    entry = decode_entry(crc_entry(metadata.SerializeToString(), zlib.compress(uncompressed)))
    assert entry.messages[0].payload == b"z" * 100


def test_non_batched_pulsar_entry_is_one_message_with_batch_index_minus_one() -> None:
    metadata = pb.MessageMetadata(
        producer_name="java-client",
        sequence_id=7,
        publish_time=PUBLISH_MS,
        partition_key="k",
        event_time=123,
        ordering_key=b"ok",
        compression=pb.LZ4,
        uncompressed_size=11,
    )
    metadata.properties.add(key="p", value="v")
    data = crc_entry(metadata.SerializeToString(), lz4.block.compress(b"hello world", store_size=False))
    entry = decode_entry(with_broker_entry_metadata(data, PUBLISH_MS + 2, 41))
    assert not entry.is_batched and entry.num_messages == 1 and message_count(data) == 1
    (message,) = entry.messages
    assert message == DecodedMessage(
        batch_index=-1,
        offset=41,
        payload=b"hello world",
        key="k",
        properties={"p": "v"},
        event_time_ms=123,
        sequence_id=7,
        ordering_key=b"ok",
        key_b64_encoded=False,
        null_value=False,
        null_key=False,
        compacted_out=False,
    )
    assert entry.event_time_ms == 123 and entry.highest_sequence_id is None


def test_unknown_fields_in_single_message_metadata_are_skipped() -> None:
    message = Message(b"payload", key="k", event_time_ms=PUBLISH_MS)
    smm = reference_single_metadata(message, 3)
    # field 15 varint, field 16 (two-byte tag) bytes, field 11 fixed64, field 12 fixed32
    unknown = b"\x78\x96\x01" + b"\x82\x01\x03abc" + b"\x59" + b"\x00" * 8 + b"\x65" + b"\x00" * 4
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=1, num_messages_in_batch=1)
    data = crc_entry(metadata.SerializeToString(), batch_payload([(unknown + smm, message.payload)]))
    assert_matches(decode_entry(data).messages[0], message, 0, 3)


# -- corruption ----------------------------------------------------------------------------------


def test_every_flipped_byte_after_the_magic_is_detected() -> None:
    data = encode(sample_messages(), compression=Compression.LZ4)
    for position in range(2, len(data)):
        corrupted = bytearray(data)
        corrupted[position] ^= 0x40
        with pytest.raises(CorruptEntry):
            decode_entry(bytes(corrupted))


def test_every_truncation_is_detected() -> None:
    data = encode(sample_messages(), broker_timestamp_ms=1, index=10)
    for length in range(len(data)):
        with pytest.raises(CorruptEntry):
            decode_entry(data[:length])


def test_checksum_mismatch_message_names_both_values() -> None:
    data = bytearray(encode([Message(b"x")]))
    data[-1] ^= 1
    with pytest.raises(CorruptEntry, match="checksum mismatch"):
        decode_entry(bytes(data))


def test_entries_without_the_checksum_magic_are_refused() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1).SerializeToString()
    with pytest.raises(CorruptEntry, match="0x0e01"):
        decode_entry(struct.pack(">I", len(metadata)) + metadata + b"payload")


def test_wrong_uncompressed_size_is_corrupt_even_with_a_valid_checksum() -> None:
    message = Message(b"q" * 50)
    uncompressed = batch_payload([(reference_single_metadata(message, 1), message.payload)])
    for compression, compressed in [
        (pb.LZ4, lz4.block.compress(uncompressed, store_size=False)),
        (pb.ZSTD, zstandard.ZstdCompressor().compress(uncompressed)),
        (pb.SNAPPY, bytes(cramjam.snappy.compress_raw(uncompressed))),
        (pb.ZLIB, zlib.compress(uncompressed)),
    ]:
        for declared in (len(uncompressed) - 1, len(uncompressed) + 1, 1 << 30):
            metadata = pb.MessageMetadata(
                producer_name="p",
                sequence_id=1,
                publish_time=1,
                num_messages_in_batch=1,
                compression=compression,
                uncompressed_size=declared,
            )
            with pytest.raises(CorruptEntry):
                decode_entry(crc_entry(metadata.SerializeToString(), compressed))


def test_batch_structure_errors_are_corrupt_even_with_a_valid_checksum() -> None:
    message = Message(b"abc")
    good = batch_payload([(reference_single_metadata(message, 1), message.payload)])
    no_size = pb.SingleMessageMetadata(sequence_id=1).SerializePartialToString()
    cases = {
        "count too high": (2, good),
        "trailing bytes": (1, good + b"\x00"),
        "payload_size past the end": (1, batch_payload([(reference_single_metadata(Message(b"x" * 9), 1), b"x")])),
        "missing payload_size": (1, batch_payload([(no_size, b"")])),
        "zero messages": (0, good),
    }
    for name, (count, payload) in cases.items():
        metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=count)
        with pytest.raises(CorruptEntry):
            decode_entry(crc_entry(metadata.SerializeToString(), payload))
            pytest.fail(name)


def test_missing_required_metadata_fields_are_corrupt() -> None:
    partial = pb.MessageMetadata(producer_name="p", publish_time=1).SerializePartialToString()
    with pytest.raises(CorruptEntry, match="sequence_id"):
        decode_entry(crc_entry(partial, b""))


def test_encrypted_entries_are_refused_not_misread() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=1)
    metadata.encryption_keys.add(key="k", value=b"secret")
    with pytest.raises(InvalidRequest, match="encrypted"):
        decode_entry(crc_entry(metadata.SerializeToString(), b"\x8f" * 40))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(list(Compression)),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), min_size=1, max_size=8),
)
def test_corrupted_content_with_a_recomputed_checksum_is_either_decoded_or_corrupt(
    compression: Compression, edits: list[tuple[int, int]]
) -> None:
    data = bytearray(encode(sample_messages(), compression=compression))
    for position, value in edits:
        data[6 + position % (len(data) - 6)] = value
    size = struct.unpack_from(">I", data, 6)[0]
    metadata, payload = bytes(data[10 : 10 + size]), bytes(data[10 + size :])
    forged = crc_entry(metadata, payload) if 10 + size <= len(data) else bytes(data)
    with contextlib.suppress(CorruptEntry, InvalidRequest):
        decode_entry(forged)


# -- broker entry metadata -----------------------------------------------------------------------


def test_broker_entry_metadata_prefix_layout_and_peek() -> None:
    body = encode([Message(b"a"), Message(b"b"), Message(b"c")])
    data = encode([Message(b"a"), Message(b"b"), Message(b"c")], broker_timestamp_ms=PUBLISH_MS + 9, index=102)
    prefix = pb.BrokerEntryMetadata(broker_timestamp=PUBLISH_MS + 9, index=102).SerializeToString()
    assert data == struct.pack(">HI", 0x0E02, len(prefix)) + prefix + body
    assert (MAGIC_BROKER_ENTRY_METADATA, MAGIC_CRC32C) == (0x0E02, 0x0E01)
    assert peek_broker_entry_metadata(data) == BrokerEntryMetadata(PUBLISH_MS + 9, 102)
    assert peek_broker_entry_metadata(body) is None
    entry = decode_entry(data)
    assert (entry.broker_timestamp_ms, entry.index, entry.first_offset) == (PUBLISH_MS + 9, 102, 100)
    assert [m.offset for m in entry.messages] == [100, 101, 102]


def test_with_broker_entry_metadata_prepends_or_replaces_without_reencoding() -> None:
    body = encode(sample_messages(), compression=Compression.ZSTD)
    stamped = with_broker_entry_metadata(body, 5, 44)
    assert stamped.endswith(body) and peek_broker_entry_metadata(stamped) == BrokerEntryMetadata(5, 44)
    restamped = with_broker_entry_metadata(memoryview(stamped), 6, 45)
    assert restamped.endswith(body) and peek_broker_entry_metadata(restamped) == BrokerEntryMetadata(6, 45)
    assert len(restamped) == len(stamped)
    assert strip_broker_entry_metadata(stamped) == body and strip_broker_entry_metadata(body) == body
    unstamped = decode_entry(body).messages
    first_offset = 44 - len(unstamped) + 1
    expected = [m._replace(offset=first_offset + m.batch_index) for m in unstamped]
    assert decode_entry(bytearray(stamped)).messages == expected
    with pytest.raises(CorruptEntry, match="0x0e01"):
        with_broker_entry_metadata(b"\x00\x01garbage-garbage", 1, 2)


def test_broker_index_smaller_than_the_message_count_is_corrupt() -> None:
    data = encode([Message(b"a"), Message(b"b")], broker_timestamp_ms=1, index=0)
    with pytest.raises(CorruptEntry, match="too small"):
        decode_entry(data)


def test_malformed_broker_prefix_is_corrupt() -> None:
    body = encode([Message(b"a")])
    with pytest.raises(CorruptEntry):
        peek_broker_entry_metadata(struct.pack(">HI", 0x0E02, 1000) + body)
    with pytest.raises(CorruptEntry):
        peek_broker_entry_metadata(struct.pack(">HI", 0x0E02, 2) + b"\xff\xff" + body)
    only_time = pb.BrokerEntryMetadata(broker_timestamp=5).SerializeToString()
    with pytest.raises(CorruptEntry, match="both"):
        decode_entry(struct.pack(">HI", 0x0E02, len(only_time)) + only_time + body)


# -- encoding arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "kwargs"),
    [
        ([], {}),
        ([Message(b"x", null_value=True)], {}),
        ([Message("text")], {}),  # type: ignore[arg-type]
        ([Message(b"x", properties={"k": 1})], {}),  # type: ignore[dict-item]
        ([Message(b"x", key="\ud800")], {}),
        ([Message(b"x", key_b64_encoded=True)], {}),
        ([Message(b"x", sequence_id=-1)], {}),
        ([Message(b"x", sequence_id=11)], {}),  # the entry's sequence_id (10) is its first message's
        ([Message(b"x", event_time_ms=1 << 64)], {}),
        ([Message(b"x", event_time_ms=1 << 63)], {}),  # a Java long in Pulsar, an Arrow timestamp on reads
        ([Message(b"x")], {"sequence_id": -1}),
        ([Message(b"x")], {"sequence_id": UINT64_MAX}),  # the second message would overflow
        ([Message(b"x")], {"publish_time_ms": -5}),
        ([Message(b"x")], {"compression": 1}),
        ([Message(b"x")], {"index": -1, "broker_timestamp_ms": 5}),
        ([Message(b"x")], {"broker_timestamp_ms": True, "index": 0}),
        ([Message(b"x")], {"broker_timestamp_ms": 5}),  # index missing
        ([Message(b"x")], {"producer_name": None}),
        ([b"raw bytes"], {}),
    ],
)
def test_bad_arguments_are_invalid_requests(messages: list[Message], kwargs: dict[str, object]) -> None:
    if kwargs.get("sequence_id") == UINT64_MAX:
        messages = [*messages, Message(b"y")]
    with pytest.raises(InvalidRequest):
        encode(messages, **kwargs)


def test_compression_names_parse_case_insensitively() -> None:
    assert Compression.parse("lz4") is Compression.LZ4 and Compression.parse(" Zstd ") is Compression.ZSTD
    with pytest.raises(InvalidRequest, match="SNAPPY"):
        Compression.parse("brotli")


# -- property-based round trip -------------------------------------------------------------------

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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(messages_strategy, min_size=1, max_size=20),
    compression=st.sampled_from(list(Compression)),
    sequence_id=st.integers(min_value=0, max_value=UINT64_MAX - 20),
    broker=st.none()
    | st.tuples(st.integers(min_value=0, max_value=UINT64_MAX), st.integers(min_value=19, max_value=1 << 62)),
)
def test_round_trip_property(
    messages: list[Message], compression: Compression, sequence_id: int, broker: tuple[int, int] | None
) -> None:
    timestamp, index = broker if broker is not None else (None, None)
    sequence_id = sequence_id if messages[0].sequence_id is None else messages[0].sequence_id
    kwargs = {"compression": compression, "sequence_id": sequence_id, "broker_timestamp_ms": timestamp, "index": index}
    if any(m.sequence_id is None and sequence_id + i > UINT64_MAX for i, m in enumerate(messages)):
        with pytest.raises(InvalidRequest, match="overflow"):
            encode(messages, **kwargs)
        return
    data = encode(messages, **kwargs)
    entry = decode_entry(data)
    assert entry.sequence_id == sequence_id and entry.compression is compression
    assert (entry.broker_timestamp_ms, entry.index) == (timestamp, index)
    for i, (decoded, message) in enumerate(zip(entry.messages, messages, strict=True)):
        expected_sequence_id = sequence_id + i if message.sequence_id is None else message.sequence_id
        assert_matches(decoded, message, i, expected_sequence_id)
        assert decoded.offset == (None if index is None else index - len(messages) + 1 + i)
        # our hand-written SingleMessageMetadata is exactly what protobuf writes
    expected_payload = batch_payload(
        [
            (reference_single_metadata(m, sequence_id + i if m.sequence_id is None else m.sequence_id), m.payload)
            for i, m in enumerate(messages)
        ]
    )
    if compression is Compression.NONE:
        assert data.endswith(expected_payload)


def reference_metadata(messages: list[Message], sequence_id: int, publish_time_ms: int, compression: Compression,
                       uncompressed_size: int, deliver_at_time_ms: int | None,
                       schema_version: bytes | None) -> bytes:
    """``MessageMetadata`` as protobuf serializes it, for the hand-written encoder to match."""
    sequence_ids = [sequence_id + i if m.sequence_id is None else m.sequence_id for i, m in enumerate(messages)]
    metadata = pb.MessageMetadata(producer_name="producer-\u00e9", sequence_id=sequence_ids[0],
                                  publish_time=publish_time_ms)
    keys = {m.key for m in messages}
    if len(keys) == 1 and messages[0].key is not None:
        metadata.partition_key = messages[0].key
        metadata.partition_key_b64_encoded = messages[0].key_b64_encoded
    ordering_keys = {m.ordering_key for m in messages}
    if len(ordering_keys) == 1 and messages[0].ordering_key is not None:
        metadata.ordering_key = messages[0].ordering_key
    if compression is not Compression.NONE:
        metadata.compression = pb.CompressionType.Value(compression.name)
        metadata.uncompressed_size = uncompressed_size
    metadata.num_messages_in_batch = len(messages)
    if deliver_at_time_ms is not None:
        metadata.deliver_at_time = deliver_at_time_ms
    metadata.highest_sequence_id = sequence_ids[-1]
    if schema_version is not None:
        metadata.schema_version = schema_version
    serialized: bytes = metadata.SerializeToString()
    return serialized


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(messages_strategy, min_size=1, max_size=6),
    compression=st.sampled_from(list(Compression)),
    sequence_id=st.integers(min_value=0, max_value=UINT64_MAX - 6),
    publish_time_ms=st.integers(min_value=0, max_value=UINT64_MAX),
    deliver_at_time_ms=st.none() | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    schema_version=st.none() | st.binary(max_size=8),
    broker=st.none() | st.tuples(st.integers(min_value=0, max_value=UINT64_MAX),
                                 st.integers(min_value=5, max_value=UINT64_MAX)),
)
def test_hand_written_entry_metadata_is_protobufs(
    messages: list[Message], compression: Compression, sequence_id: int, publish_time_ms: int,
    deliver_at_time_ms: int | None, schema_version: bytes | None, broker: tuple[int, int] | None,
) -> None:
    messages = [m._replace(sequence_id=None) for m in messages]
    timestamp, index = broker if broker is not None else (None, None)
    data = encode_entry(messages, producer_name="producer-\u00e9", sequence_id=sequence_id,
                        publish_time_ms=publish_time_ms, compression=compression,
                        deliver_at_time_ms=deliver_at_time_ms, schema_version=schema_version,
                        broker_timestamp_ms=timestamp, index=index)
    start = 0
    if broker is not None:
        prefix = pb.BrokerEntryMetadata(broker_timestamp=timestamp, index=index).SerializeToString()
        assert data[:6] == struct.pack(">HI", 0x0E02, len(prefix)) and data[6:6 + len(prefix)] == prefix
        start = 6 + len(prefix)
    size = struct.unpack_from(">I", data, start + 6)[0]
    metadata = data[start + 10:start + 10 + size]
    uncompressed = pb.MessageMetadata.FromString(metadata).uncompressed_size
    assert metadata == reference_metadata(messages, sequence_id, publish_time_ms, compression, uncompressed,
                                          deliver_at_time_ms, schema_version)


# -- message ids ---------------------------------------------------------------------------------


def test_websocket_message_id_example_matches_pulsar_byte_for_byte() -> None:
    assert MessageId(0, 3).to_base64() == "CAAQAw=="
    assert MessageId(0, 3).to_bytes() == b"\x08\x00\x10\x03"
    assert MessageId.from_base64("CAAQAw==") == MessageId(0, 3, -1, -1)
    # newer Java clients also write batch_size=0 for non-batched ids; the id is the same
    assert MessageId.parse("CAAQAzAA") == MessageId(0, 3)
    assert MessageId(0, 3).to_base64(batch_size=0) == "CAAQAzAA"


def test_message_id_binary_forms_round_trip() -> None:
    for message_id in [MessageId(5, 7, 2, 9), MessageId(5, 7, 0, 0), MessageId(-1, -1), MessageId((1 << 63) - 1, 0)]:
        assert MessageId.from_base64(message_id.to_base64()) == message_id
        assert MessageId.parse(message_id.to_base64()) == message_id
    expected = pb.MessageIdData(ledgerId=5, entryId=7, partition=2, batch_index=9).SerializeToString()
    assert MessageId(5, 7, 2, 9).to_bytes() == expected
    # URL-safe alphabet and missing padding are accepted
    raw = MessageId(123456789, 987654321, 3).to_bytes()
    assert MessageId.parse(base64.urlsafe_b64encode(raw).decode().rstrip("=")) == MessageId(123456789, 987654321, 3)


@settings(max_examples=300, deadline=None)
@given(st.integers(-1, (1 << 63) - 1), st.integers(-1, (1 << 63) - 1), st.integers(-1, (1 << 31) - 1),
       st.integers(-1, (1 << 31) - 1), st.one_of(st.none(), st.integers(-1, (1 << 31) - 1)))
def test_hand_written_message_id_bytes_are_protobufs(ledger_id: int, entry_id: int, partition: int,
                                                     batch_index: int, batch_size: int | None) -> None:
    reference = pb.MessageIdData(ledgerId=ledger_id % (1 << 64), entryId=entry_id % (1 << 64))
    if partition >= 0:
        reference.partition = partition
    if batch_index >= 0:
        reference.batch_index = batch_index
    if batch_size is not None:
        reference.batch_size = batch_size
    message_id = MessageId(ledger_id, entry_id, partition, batch_index)
    assert message_id.to_bytes(batch_size=batch_size) == reference.SerializeToString()
    assert MessageId.from_bytes(message_id.to_bytes(batch_size=batch_size)) == message_id


def test_message_id_text_forms() -> None:
    assert MessageId(12, 34, 5).to_rest() == "12:34:5"
    assert MessageId(12, 34).to_rest() == "12:34:-1"
    assert MessageId.parse("12:34") == MessageId(12, 34)
    assert MessageId.parse("12:34:5") == MessageId(12, 34, 5)
    assert MessageId.parse("12:34:5:6") == MessageId(12, 34, 5, 6)
    assert MessageId.parse(str(MessageId(12, 34, 5, 6))) == MessageId(12, 34, 5, 6)
    assert MessageId(12, 34, 1, 2).position == Position(12, 34)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1",
        "a:b",
        "1:2:3:4:5",
        "1:",
        "1:2:x",
        "1:-2",
        "1:2:-2",
        "1:2:3:2147483648",
        "1:99999999999999999999",
        "%%%",
        "CA==",
        "EAM=",
        "CAAQAxj+//////////8B",
        "1.5:2",
        "\u0661:2",
    ],
)
def test_invalid_message_ids_are_invalid_requests(text: str) -> None:
    with pytest.raises(InvalidRequest):
        MessageId.parse(text)


def test_message_id_rejects_non_strings_and_bad_fields() -> None:
    with pytest.raises(InvalidRequest):
        MessageId.parse(42)
    with pytest.raises(InvalidRequest):
        MessageId(1, 2, partition=-5)
    with pytest.raises(InvalidRequest):
        MessageId(True, 2)


def test_message_id_and_position_ordering() -> None:
    ids = [
        MessageId(2, 0),
        MessageId(1, 5, batch_index=1),
        MessageId(1, 5),
        MessageId(1, 5, batch_index=0),
        MessageId(1, 4, batch_index=7),
    ]
    assert sorted(ids) == [
        MessageId(1, 4, batch_index=7),
        MessageId(1, 5),
        MessageId(1, 5, batch_index=0),
        MessageId(1, 5, batch_index=1),
        MessageId(2, 0),
    ]
    assert MessageId(1, 5) < MessageId(1, 5, batch_index=0) <= MessageId(1, 5, batch_index=0)
    assert MessageId(3, 1) > MessageId(2, 9) and MessageId(3, 1) >= MessageId(3, 1)
    positions = [Position(2, 0), Position(1, 9), Position(1, -1)]
    assert sorted(positions) == [Position(1, -1), Position(1, 9), Position(2, 0)]
    assert Position(1, 2) <= Position(1, 2) < Position(1, 3) and Position(4, 0) > Position(3, 9) >= Position(3, 9)
    assert str(Position(3, -1)) == "3:-1"
    with pytest.raises(InvalidRequest):
        Position(-2, 0)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.LZ4])
def test_a_lone_message_in_the_batch_format_has_pulsars_unbatched_form(compression: Compression) -> None:
    """``as_unbatched``: the same message and entry fields, without the batch (so Pulsar's
    clients give it no batch index), uncompressed; None for entries it does not apply to."""
    message = Message(b"payload", "k", {"a": "1", "b": "2"}, 1_700_000_000_123, 41, b"ok", False)
    stored = with_broker_entry_metadata(
        encode_entry([message], producer_name="p", sequence_id=41, publish_time_ms=1_700_000_000_456,
                     compression=compression, schema_version=b"\x00" * 8), 1_700_000_000_789, 7)
    converted = as_unbatched(stored)
    assert converted is not None and converted[:2] == struct.pack(">H", MAGIC_CRC32C)  # no broker prefix
    decoded = decode_entry(converted)
    assert not decoded.metadata.HasField("num_messages_in_batch") and decoded.compression is Compression.NONE
    (alone,) = decoded.messages
    assert alone.batch_index == -1
    assert (alone.payload, alone.key, alone.properties, alone.event_time_ms, alone.sequence_id, alone.ordering_key) \
        == (b"payload", "k", {"a": "1", "b": "2"}, 1_700_000_000_123, 41, b"ok")
    assert (decoded.metadata.producer_name, decoded.metadata.publish_time, decoded.metadata.schema_version) == (
        "p", 1_700_000_000_456, b"\x00" * 8)
    assert as_unbatched(converted) is None  # already unbatched
    two = encode_entry([Message(b"1"), Message(b"2")], producer_name="p", sequence_id=0, publish_time_ms=1)
    assert as_unbatched(two) is None


plain_messages = st.builds(
    lambda key_b64_encoded, **fields: Message(key_b64_encoded=key_b64_encoded and fields["key"] is not None, **fields),
    payload=st.binary(max_size=300),
    key=st.none() | st.text(max_size=40),
    properties=st.dictionaries(st.text(max_size=40), st.text(max_size=200), max_size=4),
    event_time_ms=st.none() | st.integers(min_value=0, max_value=(1 << 63) - 1),
    key_b64_encoded=st.booleans(),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=plain_messages | messages_strategy, sequence_id=st.integers(min_value=0, max_value=UINT64_MAX),
       publish_time_ms=st.integers(min_value=0, max_value=UINT64_MAX), producer=st.text(max_size=30),
       own_sequence_id=st.booleans())
def test_the_single_message_encoder_writes_encode_entrys_bytes(message: Message, sequence_id: int, publish_time_ms: int,
                                                               producer: str, own_sequence_id: bool) -> None:
    """``encode_single_entry`` is a faster ``encode_entry`` of one message: the same bytes for
    every message, the same refusal for every argument ``encode_entry`` refuses."""
    if own_sequence_id:
        message = message._replace(sequence_id=sequence_id)
    kwargs = {"producer_name": producer, "sequence_id": sequence_id, "publish_time_ms": publish_time_ms}
    try:
        expected = encode_entry((message,), **kwargs)  # type: ignore[arg-type]
    except InvalidRequest as exc:
        with pytest.raises(InvalidRequest) as refused:
            encode_single_entry(message, **kwargs)  # type: ignore[arg-type]
        assert str(refused.value) == str(exc)
        return
    assert encode_single_entry(message, **kwargs) == expected  # type: ignore[arg-type]
    from broker.entry_format import batch

    with pytest.MonkeyPatch.context() as patch:  # and without the native batch encoder
        patch.setattr(batch, "NATIVE_BATCH_ENCODER", False)
        assert encode_single_entry(message, **kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [
    {"message": Message(b"x", key="\ud800")},  # a lone surrogate cannot be UTF-8
    {"message": Message(b"x", properties={"k": "\udfff"})},
    {"message": Message("text")},  # type: ignore[arg-type]
    {"message": Message(b"x", event_time_ms=1 << 63)},
    {"message": Message(b"x"), "sequence_id": -1},
    {"message": Message(b"x"), "producer_name": "\ud800"},
    {"message": Message(b"x", sequence_id=5)},  # its own sequence id differs from the entry's
])
def test_the_single_message_encoder_refuses_what_encode_entry_refuses(bad: dict[str, object]) -> None:
    kwargs: dict[str, object] = {"producer_name": "p", "sequence_id": 3, "publish_time_ms": 1} | bad
    message = kwargs.pop("message")
    with pytest.raises(InvalidRequest) as expected:
        encode_entry((message,), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as refused:
        encode_single_entry(message, **kwargs)  # type: ignore[arg-type]
    assert str(refused.value) == str(expected.value)


@settings(max_examples=500, deadline=None)
@given(value=st.integers(min_value=-(1 << 70), max_value=1 << 70))
def test_the_native_varint_writes_the_python_encoders_bytes(value: int) -> None:
    """Both encoders give the same bytes for every int, and refuse the same ones alike."""
    from broker.entry_format import wire

    assert wire.NATIVE_VARINT, "the native varint encoder was not built (setup.py needs a C compiler)"
    try:
        expected: bytes | type[BaseException] = wire._python_encode_varint(value)
    except ValueError:
        expected = ValueError
    if expected is ValueError:
        with pytest.raises(ValueError):
            wire.encode_varint(value)
    else:
        assert wire.encode_varint(value) == expected


@settings(max_examples=200, deadline=None)
@given(timestamp=st.integers(min_value=0, max_value=UINT64_MAX),
       indexes=st.lists(st.integers(min_value=0, max_value=UINT64_MAX), min_size=1, max_size=5),
       prefixed=st.lists(st.booleans(), min_size=5, max_size=5))
def test_stamping_entries_together_writes_what_stamping_each_writes(timestamp: int, indexes: list[int],
                                                                    prefixed: list[bool]) -> None:
    entries = [encode([Message(b"m%d" % i)], sequence_id=i) for i in range(len(indexes))]
    entries = [with_broker_entry_metadata(e, 7, 7) if p else e for e, p in zip(entries, prefixed, strict=False)]
    assert with_broker_entry_metadata_each(entries, timestamp, indexes) == [
        with_broker_entry_metadata(e, timestamp, i) for e, i in zip(entries, indexes, strict=True)]


@settings(max_examples=1000, deadline=None)
@given(buf=st.binary(max_size=24) | st.integers(min_value=0, max_value=(1 << 70)).map(
           lambda v: __import__("broker.entry_format.wire", fromlist=["x"])._python_encode_varint(v) + b"\x01"),
       pos=st.integers(min_value=-3, max_value=26), as_bytearray=st.booleans())
def test_the_native_varint_reader_reads_what_the_python_reader_reads(buf: bytes, pos: int, as_bytearray: bool) -> None:
    """The same value and next position for every buffer and position, the same error otherwise
    (running past the end, longer than 10 bytes, wider than 64 bits)."""
    from broker.entry_format import wire

    assert wire.NATIVE_VARINT
    data: bytes | bytearray = bytearray(buf) if as_bytearray else buf
    try:
        expected: object = wire._python_read_varint(data, pos)  # type: ignore[arg-type]
    except (IndexError, CorruptEntry) as exc:
        with pytest.raises(type(exc)) as raised:
            wire.read_varint(data, pos)  # type: ignore[arg-type]
        assert str(raised.value) == str(exc)
        return
    assert wire.read_varint(data, pos) == expected  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(messages_strategy, min_size=1, max_size=6), compression=st.sampled_from(list(Compression)),
       sequence_id=st.integers(min_value=0, max_value=1 << 40), index_room=st.integers(min_value=-2, max_value=1 << 40),
       deliver_at=st.none() | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
       schema_version=st.none() | st.binary(max_size=4), prefixed=st.booleans(), lone=st.booleans(),
       corrupt=st.none() | st.tuples(st.integers(min_value=0, max_value=400), st.integers(min_value=1, max_value=255)))
def test_decoding_messages_reads_what_decode_entry_reads(messages: list[Message], compression: Compression,
                                                         sequence_id: int, index_room: int, deliver_at: int | None,
                                                         schema_version: bytes | None, prefixed: bool, lone: bool,
                                                         corrupt: tuple[int, int] | None) -> None:
    """``decode_messages`` gives ``decode_entry``'s messages and delivery time for every entry,
    batched or (``lone``: one message sent without batching, as Pulsar's clients write it) not,
    and refuses every entry ``decode_entry`` refuses with the same error (corrupted ones too)."""
    sequence_id = sequence_id if messages[0].sequence_id is None else messages[0].sequence_id
    if any(m.sequence_id is None and sequence_id + i > UINT64_MAX for i, m in enumerate(messages)):
        return
    index = max(0, len(messages) - 1 + index_room)
    data = encode_entry(messages, producer_name="p", sequence_id=sequence_id, publish_time_ms=5,
                        compression=compression, deliver_at_time_ms=deliver_at, schema_version=schema_version,
                        broker_timestamp_ms=9 if prefixed else None, index=index if prefixed else None)
    if lone and len(messages) == 1:
        unbatched = as_unbatched(data)
        assert unbatched is not None
        data = with_broker_entry_metadata(unbatched, 9, index) if prefixed else unbatched
    if corrupt is not None:
        position, flip = corrupt
        corrupted = bytearray(data)
        corrupted[position % len(corrupted)] ^= flip
        data = bytes(corrupted)
    client = common_client_entry(data)
    if client is not None:  # a client's entry checked without the general parser: never one it refuses
        decoded = decode_entry(data)
        assert client == (decoded.metadata.producer_name, tuple(m.key for m in decoded.messages))
    try:
        expected = decode_entry(data)
    except (CorruptEntry, InvalidRequest) as exc:
        with pytest.raises(type(exc)) as raised:
            decode_messages(data)
        assert str(raised.value) == str(exc)
        return
    assert decode_messages(data) == (expected.messages, expected.deliver_at_time_ms)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.binary(max_size=64), key=st.none() | texts, key_b64=st.booleans(),
       event_time=st.none() | st.integers(min_value=0, max_value=(1 << 63) - 1),
       ordering_key=st.none() | st.binary(max_size=6), sequence_id=st.integers(min_value=0, max_value=UINT64_MAX),
       deliver_at=st.none() | st.integers(min_value=0, max_value=(1 << 63) - 1),
       index=st.integers(min_value=0, max_value=1 << 40))
def test_a_message_sent_without_batching_is_read_on_the_fast_path(payload: bytes, key: str | None, key_b64: bool,
                                                                   event_time: int | None, ordering_key: bytes | None,
                                                                   sequence_id: int, deliver_at: int | None,
                                                                   index: int) -> None:
    """A stored message that Pulsar's clients sent without batching, with the fields they set
    (no properties), is read without the general parser, into exactly what it reads."""
    from broker.entry_format import common_entry

    message = Message(payload, key=key, key_b64_encoded=key_b64 and key is not None, event_time_ms=event_time,
                      ordering_key=ordering_key)
    unbatched = as_unbatched(encode([message], sequence_id=sequence_id, deliver_at_time_ms=deliver_at))
    assert unbatched is not None
    data = with_broker_entry_metadata(unbatched, 9, index)
    assert common_entry._common_batch(data) is not None
    assert common_client_entry(unbatched) == ("producer-1", (key,))
    expected = decode_entry(data)
    assert decode_messages(data) == (expected.messages, expected.deliver_at_time_ms)


@settings(max_examples=500, deadline=None)
@given(timestamp=st.integers(min_value=0, max_value=UINT64_MAX), index=st.integers(min_value=0, max_value=UINT64_MAX),
       corrupt=st.none() | st.tuples(st.integers(min_value=0, max_value=30), st.integers(min_value=1, max_value=255)),
       cut=st.integers(min_value=0, max_value=40))
def test_the_prefix_fast_path_reads_what_the_general_parser_reads(timestamp: int, index: int,
                                                                  corrupt: tuple[int, int] | None, cut: int) -> None:
    from broker.entry_format import broker_metadata

    data = bytearray(broker_metadata.broker_prefix(timestamp, index) + b"\x0e\x01rest of the entry")
    if corrupt is not None:
        data[corrupt[0] % len(data)] ^= corrupt[1]
    raw = bytes(data[: len(data) - cut % 8])
    try:
        expected = broker_metadata._split_prefix_general(raw)
    except CorruptEntry as exc:
        with pytest.raises(CorruptEntry) as raised:
            broker_metadata.split_prefix(raw)
        assert str(raised.value) == str(exc)
        return
    assert broker_metadata.split_prefix(raw) == expected


odd_messages = st.builds(
    Message,
    payload=st.binary(max_size=50) | st.text(max_size=5) | st.just(bytearray(b"ba")),
    key=st.none() | st.text(max_size=8) | st.just("\ud800") | st.just(b"k"),
    properties=st.dictionaries(st.text(max_size=6) | st.just("\udfff"), st.text(max_size=6) | st.just(7), max_size=3)
    | st.just({}),
    event_time_ms=st.none() | st.integers(min_value=-2, max_value=(1 << 64)) | st.just(True),
    sequence_id=st.none() | st.integers(min_value=-1, max_value=(1 << 64) + 1),
    ordering_key=st.none() | st.binary(max_size=4) | st.just("ok"),
    key_b64_encoded=st.booleans() | st.just(1),
    null_value=st.booleans(),
    null_key=st.booleans() | st.just(0),
    compacted_out=st.booleans(),
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(messages_strategy | odd_messages, min_size=1, max_size=5),
       sequence_id=st.integers(min_value=-1, max_value=UINT64_MAX) | st.just("3"),
       compression=st.sampled_from(list(Compression)))
def test_the_native_batch_encoder_writes_and_refuses_what_the_python_encoder_does(
        messages: list[Message], sequence_id: int, compression: Compression) -> None:
    """encode_entry gives the same bytes, or the same refusal, with the native batch encoder and
    without it, for well-formed and odd messages alike."""
    from broker.entry_format import batch

    assert batch.NATIVE_BATCH_ENCODER, "the native batch encoder was not built (setup.py needs a C compiler)"

    def encoded() -> bytes | str:
        try:
            return encode_entry(messages, producer_name="p", sequence_id=sequence_id, publish_time_ms=1,
                                compression=compression)
        except InvalidRequest as exc:
            return f"refused: {exc}"

    native = encoded()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch, "NATIVE_BATCH_ENCODER", False)
        python = encoded()
    assert native == python


def _python_split(buf: bytes, count: int, first_offset: int | None, base: int) -> list[DecodedMessage] | str:
    from broker.entry_format import batch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch, "NATIVE_BATCH_DECODER", False)
        try:
            return batch.decode_batch(buf, count, first_offset, base)
        except CorruptEntry as exc:
            return f"refused: {exc}"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(messages_strategy, min_size=1, max_size=6),
       sequence_ids=st.lists(st.none() | st.integers(min_value=0, max_value=UINT64_MAX), min_size=6, max_size=6),
       first_offset=st.none() | st.integers(min_value=-3, max_value=1 << 62),
       base=st.integers(min_value=-2, max_value=UINT64_MAX + 5), count_shift=st.integers(min_value=-1, max_value=1),
       damage=st.none() | st.tuples(st.integers(min_value=0, max_value=2000), st.integers(min_value=1, max_value=255))
       | st.integers(min_value=1, max_value=40))
def test_the_native_batch_decoder_splits_what_the_python_decoder_splits(
        messages: list[Message], sequence_ids: list[int | None], first_offset: int | None, base: int,
        count_shift: int, damage: tuple[int, int] | int | None) -> None:
    """Whatever the native decoder returns is exactly the Python decoder's list (a batch's
    messages with every field); everything else (a damaged, cut or miscounted batch, fields
    it does not read) it leaves to the Python decoder, which then returns or refuses as ever.
    A clean batch of the messages Magnetar's edges and Pulsar's clients write is read natively."""
    from broker.entry_format import batch
    from broker.entry_format.batch import encode_single_metadata
    from broker.entry_format.wire import U32

    assert batch.NATIVE_BATCH_DECODER, "the native batch decoder was not built (setup.py needs a C compiler)"
    from broker.entry_format._batch_decoder import decode_batch as native_decode_batch
    parts = []
    for message, sequence_id in zip(messages, sequence_ids, strict=False):
        single = encode_single_metadata(message, 0 if sequence_id is None else sequence_id)
        if sequence_id is None and single.endswith(b"\x40\x00"):  # drop the field: numbered from the base
            single = single[:-2]
        parts += [U32.pack(len(single)), single, message.payload]
    buf = b"".join(parts)
    count = len(messages) + count_shift
    if isinstance(damage, tuple):
        damaged = bytearray(buf)
        damaged[damage[0] % len(damaged)] ^= damage[1]
        buf = bytes(damaged)
    elif isinstance(damage, int):
        buf = buf[: max(0, len(buf) - damage)]
    expected = _python_split(buf, count, first_offset, base)
    native = native_decode_batch(buf, count, first_offset, base)
    if native is not None:
        assert native == expected
        assert all(type(m) is DecodedMessage for m in native)
    clean = damage is None and count_shift == 0 and (first_offset is None or first_offset >= 0)
    if clean and all(len(k.encode()) < 0x80 and len(v.encode()) < 0x80 for m in messages
                     for k, v in m.properties.items()):
        assert native is not None, "a clean batch was left to the Python decoder"


def test_the_native_batch_decoder_leaves_a_repeated_key_to_the_python_decoder() -> None:
    """A message whose key appears twice, the first not UTF-8: the Python decoder refuses it
    (it decodes every occurrence), so the native one must not answer for it."""
    from broker.entry_format import batch
    from broker.entry_format.wire import U32

    assert batch.NATIVE_BATCH_DECODER, "the native batch decoder was not built (setup.py needs a C compiler)"
    from broker.entry_format._batch_decoder import decode_batch as native_decode_batch

    metadata = b"\x12\x01\xff\x12\x01a\x18\x01"
    buf = U32.pack(len(metadata)) + metadata + b"x"
    assert native_decode_batch(buf, 1, 0, 0) is None
    with pytest.raises(CorruptEntry):
        batch.decode_batch(buf, 1, 0, 0)
    valid = b"\x12\x01b\x12\x01a\x18\x01"  # both UTF-8: the last key wins, whoever decodes
    buf = U32.pack(len(valid)) + valid + b"x"
    assert batch.decode_batch(buf, 1, 0, 0)[0].key == "a"


def _with_fixed_checksum(data: bytearray) -> bytearray:
    """``data`` with its 0x0e01 checksum recomputed (when its headers are still readable), so a
    change inside the metadata reaches the field parser instead of failing the checksum."""
    if len(data) >= 6 and data[:2] == b"\x0e\x02":
        start = 6 + struct.unpack_from(">I", data, 2)[0]
        if start + 10 <= len(data) and data[start:start + 2] == b"\x0e\x01":
            struct.pack_into(">I", data, start + 2, crc32c.crc32c(bytes(data[start + 6:])))
    return data


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(st.none() | texts, min_size=1, max_size=3), batched=st.booleans(),
       properties=st.booleans(), compressed=st.booleans(), key_b64=st.booleans(),
       event_time=st.none() | st.integers(min_value=0, max_value=UINT64_MAX),
       ordering_key=st.none() | st.binary(max_size=4),
       deliver_at=st.none() | st.integers(min_value=0, max_value=(1 << 63) - 1),
       sequence_id=st.integers(min_value=0, max_value=UINT64_MAX - 3),
       index=st.integers(min_value=0, max_value=UINT64_MAX),
       edits=st.lists(st.tuples(st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=255)),
                      max_size=3),
       cut=st.none() | st.integers(min_value=0, max_value=400), fix_checksum=st.booleans(),
       client_form=st.booleans())
def test_the_native_common_entry_check_returns_what_the_python_check_returns(
        keys: list[str | None], batched: bool, properties: bool, compressed: bool, key_b64: bool,
        event_time: int | None, ordering_key: bytes | None, deliver_at: int | None, sequence_id: int, index: int,
        edits: list[tuple[int, int]], cut: int | None, fix_checksum: bool, client_form: bool) -> None:
    """``_common_entry.c`` against ``_python_common_batch`` and ``_python_parse_common_metadata`` on
    the entries the broker stores (batched or as Pulsar's clients send one message, with and
    without the fields that leave an entry to the general decoder), stored or as a client sends
    them (no broker prefix), and on those entries changed byte by byte and cut short, with the
    checksum recomputed or not: the same tuple, or None for both."""
    from broker.entry_format import common_entry

    assert common_entry.NATIVE_COMMON_ENTRY, "the native common-entry check was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import common_batch as native_common_batch
    from broker.entry_format._common_entry import common_metadata as native_common_metadata

    messages = [Message(b"payload-%d" % i, key=key, properties={"p": "v"} if properties else {},
                        key_b64_encoded=key_b64 and key is not None, event_time_ms=event_time,
                        ordering_key=ordering_key) for i, key in enumerate(keys)]
    if event_time is not None and event_time >= 1 << 63:
        messages = [m._replace(event_time_ms=None) for m in messages]
    entry = encode(messages, sequence_id=sequence_id, deliver_at_time_ms=deliver_at,
                   compression=Compression.ZLIB if compressed else Compression.NONE)
    if not batched and len(messages) == 1:
        entry = as_unbatched(entry) or entry
    data = bytearray(entry if client_form else with_broker_entry_metadata(entry, 9, index))
    for position, value in edits:
        data[position % len(data)] = value
    if cut is not None:
        del data[cut:]
    if fix_checksum:
        data = _with_fixed_checksum(data)
    stored = bytes(data)
    assert native_common_batch(stored) == common_entry._python_common_batch(stored)
    metadata_at = 0 if client_form or len(stored) < 6 else 6 + struct.unpack_from(">I", stored, 2)[0]
    assert native_common_metadata(stored, metadata_at) == _python_metadata_or_none(stored, metadata_at)


def _python_metadata_or_none(data: bytes, start: int) -> object:
    """``_python_parse_common_metadata``, with what it raises for a malformed entry as None (what
    its callers make of it)."""
    from broker.entry_format import common_entry

    try:
        return common_entry._python_parse_common_metadata(data, start)
    except (IndexError, ValueError, CorruptEntry, struct.error):
        return None


@settings(max_examples=1000, deadline=None)
@given(body=st.binary(max_size=80), fix_checksum=st.booleans())
def test_the_native_common_entry_check_refuses_what_the_python_check_refuses(body: bytes, fix_checksum: bool) -> None:
    """Arbitrary bytes after a broker prefix's magic: both checks agree on each."""
    from broker.entry_format import common_entry

    assert common_entry.NATIVE_COMMON_ENTRY, "the native common-entry check was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import common_batch as native_common_batch
    from broker.entry_format._common_entry import common_metadata as native_common_metadata

    data = bytes(_with_fixed_checksum(bytearray(b"\x0e\x02" + body))) if fix_checksum else b"\x0e\x02" + body
    assert native_common_batch(data) == common_entry._python_common_batch(data)
    client = bytearray(b"\x0e\x01" + body)
    if fix_checksum and len(client) >= 10:
        struct.pack_into(">I", client, 2, crc32c.crc32c(bytes(client[6:])))
    assert native_common_metadata(bytes(client), 0) == _python_metadata_or_none(bytes(client), 0)


@pytest.mark.parametrize(("fields", "index"), [
    ({"deliver_at_time": -5}, 9),  # int64 below zero: ten bytes on the wire, read back signed
    ({"deliver_at_time": (1 << 62) + 7}, 9),
    ({"num_messages_in_batch": -1}, UINT64_MAX),  # a count past int32 (as its varint says)
    ({"num_messages_in_batch": 3}, 1),  # more messages than the index allows
    ({"event_time": UINT64_MAX, "partition_key": "k", "ordering_key": b"o", "partition_key_b64_encoded": True}, 9),
    ({"schema_version": b"\x00\x01", "highest_sequence_id": 12}, 9),
])
def test_the_native_common_entry_check_agrees_on_hand_made_metadata(fields: dict[str, Any], index: int) -> None:
    """Metadata no encoder here writes, made with protobuf itself: both checks agree, field by field."""
    from broker.entry_format import common_entry

    assert common_entry.NATIVE_COMMON_ENTRY, "the native common-entry check was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import common_batch as native_common_batch
    from broker.entry_format._common_entry import common_metadata as native_common_metadata

    metadata = pb.MessageMetadata(producer_name="p", sequence_id=4, publish_time=PUBLISH_MS, **fields)
    body = metadata.SerializeToString()
    rest = struct.pack(">I", len(body)) + body + b"payload"
    entry = struct.pack(">HI", MAGIC_CRC32C, crc32c.crc32c(rest)) + rest
    data = with_broker_entry_metadata(entry, 9, index)
    expected = common_entry._python_common_batch(data)
    assert native_common_batch(data) == expected
    assert native_common_metadata(entry, 0) == _python_metadata_or_none(entry, 0)
    if fields.get("deliver_at_time") == -5:
        assert expected is not None and expected[4] == -5


@pytest.mark.parametrize("last_byte", [0x00, 0x01, 0x02, 0x7F, 0x81])
def test_the_native_readers_take_a_ten_byte_varint_as_the_python_reader_does(last_byte: int) -> None:
    """A sequence id written in ten bytes: up to 2^64 - 1 it is read, wider (or longer) it is
    refused, by the native check (``_wire.h``) exactly as by wire.py's reader."""
    from broker.entry_format import common_entry

    assert common_entry.NATIVE_COMMON_ENTRY, "the native common-entry check was not built (setup.py needs a C compiler)"
    from broker.entry_format._common_entry import common_metadata as native_common_metadata

    body = b"\x0a\x01p" + b"\x10" + b"\xff" * 9 + bytes([last_byte]) + b"\x18\x01"
    rest = struct.pack(">I", len(body)) + body + b"payload"
    entry = struct.pack(">HI", MAGIC_CRC32C, crc32c.crc32c(rest)) + rest
    expected = _python_metadata_or_none(entry, 0)
    assert native_common_metadata(entry, 0) == expected
    assert (expected is not None) == (last_byte <= 0x01)
