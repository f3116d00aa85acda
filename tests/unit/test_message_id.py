"""Pulsar's message ids (broker/message_id.py): the WebSocket and binary forms, byte for byte.

Checks: the base64 form of Pulsar's WebSocket API and the binary ``MessageIdData`` round trip
and equal protobuf's own serialization; the text forms parse; bad ids are ``InvalidRequest``;
ids and positions order as Pulsar orders them.
"""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import InvalidRequest
from broker.message_id import MessageId, Position
from broker.proto import pulsar_entry_pb2 as pb


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
