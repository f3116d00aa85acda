"""The entry format's fast paths read and write exactly what its general path does.

Checks: ``as_unbatched`` gives a lone message Pulsar's unbatched form; ``encode_single_entry``
writes ``encode_entry``'s bytes and refuses what it refuses; ``decode_messages`` and
``common_client_entry`` read what ``decode_entry`` reads (or refuse it in its words), a message
sent without batching included; the broker prefix's fast split is the general parser's.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.entry_format import (
    MAGIC_CRC32C,
    Compression,
    Message,
    as_unbatched,
    common_client_entry,
    common_entry,
    decode_entry,
    decode_messages,
    delivery_time,
    encode_entry,
    encode_single_entry,
    with_broker_entry_metadata,
)
from broker.entry_format import encode as encoding
from broker.errors import CorruptEntry, InvalidRequest
from tests.unit.entry_format_support import PUBLISH_MS, UINT64_MAX, encode, messages_strategy, texts


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
    assert common_entry.common_batch(data) is not None
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(messages_strategy, min_size=1, max_size=4),
    compression=st.sampled_from(list(Compression)),
    deliver_at_time_ms=st.none() | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    prefixed=st.booleans(),
)
def test_delivery_time_read_from_the_metadata_is_the_decoders(
    messages: list[Message], compression: Compression, deliver_at_time_ms: int | None, prefixed: bool,
) -> None:
    """What dispatch reads of an entry it does not split: the delivery time ``decode_entry``
    gives, for the common entry (read by ``_common_entry.c``) and any other (properties,
    compression: the metadata parsed)."""
    messages = [m._replace(sequence_id=None) for m in messages]
    data = encode(messages, compression=compression, deliver_at_time_ms=deliver_at_time_ms,
                  **({"broker_timestamp_ms": PUBLISH_MS, "index": 100} if prefixed else {}))
    assert delivery_time(data) == decode_entry(data).deliver_at_time_ms == deliver_at_time_ms
    unbatched = as_unbatched(data) if len(messages) == 1 and compression is Compression.NONE else None
    if unbatched is not None:  # a message as a Pulsar client sends it without batching
        assert delivery_time(unbatched) == deliver_at_time_ms


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    message=messages_strategy,
    null_value=st.booleans(),
    sequence_id=st.integers(min_value=0, max_value=UINT64_MAX - 1),
    deliver_at_time_ms=st.none() | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    schema_version=st.none() | st.binary(max_size=8),
)
def test_the_unbatched_form_of_a_common_entry_is_the_general_ones_byte_for_byte(
    message: Message, null_value: bool, sequence_id: int, deliver_at_time_ms: int | None,
    schema_version: bytes | None,
) -> None:
    """``as_unbatched`` writes the metadata of the entry the broker stores by hand (what every
    binary consumer of a message produced over REST or WebSocket gets); it is exactly what the
    general conversion through protobuf writes."""
    if null_value:
        message = message._replace(payload=b"", null_value=True)
    stored = with_broker_entry_metadata(
        encode_entry([message], producer_name="p\u00e9", sequence_id=sequence_id if message.sequence_id is None
                     else message.sequence_id, publish_time_ms=PUBLISH_MS, deliver_at_time_ms=deliver_at_time_ms,
                     schema_version=schema_version), PUBLISH_MS, 7)
    assert common_entry.common_batch(stored) is not None  # the hand-written path is the one taken
    assert as_unbatched(stored) == encoding._general_unbatched(stored)
