"""Pulsar's entry format (broker/entry_format/): encode, decode, the broker-entry-metadata prefix.

Checks: round trips for every compression and batch size; our bytes equal an entry assembled
independently from the protobuf classes in Pulsar's layout (magic, CRC32C over size+metadata+
payload, batch items); entries in Pulsar's non-batched form decode; corruption of any kind is
reported as ``CorruptEntry`` and never as garbage or another exception; the broker-entry-
metadata prefix (index = offset of the LAST message). The fast paths are checked against this
general path in ``test_entry_format_fast_paths.py``, the C modules against the Python code in
``test_entry_format_native.py``; message ids in ``test_message_id.py``.
"""

from __future__ import annotations

import contextlib
import struct
import zlib

import cramjam
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
    decode_entry,
    encode_entry,
    message_count,
    peek_broker_entry_metadata,
    strip_broker_entry_metadata,
    with_broker_entry_metadata,
    with_broker_entry_metadata_each,
)
from broker.errors import CorruptEntry, InvalidRequest
from broker.proto import pulsar_entry_pb2 as pb
from tests.unit.entry_format_support import (
    PUBLISH_MS,
    SAMPLE_SEQUENCE_IDS,
    UINT64_MAX,
    assert_matches,
    batch_payload,
    crc_entry,
    encode,
    messages_strategy,
    reference_single_metadata,
    sample_messages,
)

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


def encrypted_entry(count: int | None, payload: bytes = b"\x8f" * 40) -> bytes:
    """An end-to-end encrypted entry as Pulsar's client writes it (``count``: a batch's size,
    None: one message), compressed with LZ4 before it was encrypted, under a broker prefix."""
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=7, publish_time=1, partition_key="clear",
                                  event_time=5, compression=pb.LZ4, uncompressed_size=99,
                                  encryption_param=b"iv", encryption_algo="RSA")
    if count is not None:
        metadata.num_messages_in_batch = count
    key = metadata.encryption_keys.add(key="rsa", value=b"data key")
    key.metadata.add(key="version", value="1")
    metadata.properties.add(key="p", value="v")
    return with_broker_entry_metadata(crc_entry(metadata.SerializeToString(), payload), 1, 12)


def test_an_encrypted_entry_is_opaque_and_keeps_its_clear_metadata() -> None:
    """Neither decompressed nor split (the payload is ciphertext); one message per message of
    the entry, the first holding the stored bytes and carrying the others."""
    decoded = decode_entry(encrypted_entry(3))
    assert [m.offset for m in decoded.messages] == [10, 11, 12]
    assert [m.batch_index for m in decoded.messages] == [0, 1, 2]
    assert [m.payload for m in decoded.messages] == [b"\x8f" * 40, b"", b""]
    assert [m.compacted_out for m in decoded.messages] == [False, True, True]
    assert {m.key for m in decoded.messages} == {"clear"} and decoded.messages[2].properties == {"p": "v"}
    assert [m.sequence_id for m in decoded.messages] == [7, 8, 9] and decoded.messages[0].event_time_ms == 5
    context = decoded.encryption
    assert context is not None and context.batch_size == 3 and context.compression is Compression.LZ4
    assert context.as_json() == {"keys": {"rsa": {"keyValue": "ZGF0YSBrZXk=", "metadata": {"version": "1"}}},
                                 "param": "aXY=", "algorithm": "RSA", "compressionType": "LZ4",
                                 "uncompressedMessageSize": 99, "batchSize": 3}
    lone = decode_entry(encrypted_entry(None))
    assert [(m.batch_index, m.offset, m.payload) for m in lone.messages] == [(-1, 12, b"\x8f" * 40)]
    assert lone.encryption is not None and "batchSize" not in lone.encryption.as_json()


def test_an_encrypted_entry_still_has_its_checksum_checked() -> None:
    data = bytearray(encrypted_entry(2))
    data[-1] ^= 1
    with pytest.raises(CorruptEntry, match="checksum"):
        decode_entry(bytes(data))


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
