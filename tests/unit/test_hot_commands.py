"""The hand-written reader and writer of the hot commands agree with protobuf, byte for byte.

Checks (seeded, so a failure reproduces):
- round trip: SEND, FLOW and ACK commands protobuf wrote, with random values (edges included:
  0, 2^31, 2^32 - 1, 2^64 - 1, negative int32s) and random optional fields, are read to exactly
  protobuf's values, and every command of the common shape is read (the fast path is taken);
  commands with fields the reader leaves to protobuf (transactions, properties) are left to it;
- mutation fuzz: those bytes with bytes flipped, inserted, deleted or cut: whatever the reader
  accepts, protobuf parses too, complete, to the same values;
- the frames a decoder cuts carry the same values whichever path read them;
- SEND_RECEIPT frames are protobuf's bytes exactly.
"""

from __future__ import annotations

import random
import struct

from api.pulsar.framing import FrameDecoder, command_frame
from api.pulsar.hot_commands import (
    AckCommand,
    FlowCommand,
    HotCommand,
    SendCommand,
    message_command,
    parse_hot,
    send_receipt_command,
)
from api.pulsar.proto import pulsar_api_pb2 as pb

T = pb.BaseCommand.Type
SEED = 20240605
ROUND_TRIPS = 3000
MUTATIONS = 20000
UINT64_EDGES = (0, 1, 127, 128, 16383, 16384, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 63) - 1,
                1 << 63, (1 << 64) - 1)
INT32_EDGES = (0, 1, -1, 127, 128, (1 << 31) - 1, -(1 << 31), 1000)
INT64_EDGES = (0, 1, -1, (1 << 63) - 1, -(1 << 63), 0x5555)


def uint64(rng: random.Random) -> int:
    return rng.choice(UINT64_EDGES) if rng.random() < 0.4 else rng.getrandbits(rng.choice((7, 14, 21, 35, 64)))


def int32(rng: random.Random) -> int:
    return rng.choice(INT32_EDGES) if rng.random() < 0.5 else rng.randint(-(1 << 31), (1 << 31) - 1)


def message_id(rng: random.Random, target: pb.MessageIdData) -> None:
    target.ledgerId = uint64(rng)
    target.entryId = uint64(rng)
    if rng.random() < 0.3:
        target.partition = int32(rng)
    if rng.random() < 0.5:
        target.batch_index = int32(rng)
    if rng.random() < 0.5:
        target.ack_set.extend(rng.choice(INT64_EDGES) if rng.random() < 0.5 else rng.randint(-(1 << 63), (1 << 63) - 1)
                              for _ in range(rng.randint(0, 3)))
    if rng.random() < 0.2:
        target.batch_size = int32(rng)


def random_command(rng: random.Random, *, unusual: bool) -> pb.BaseCommand:
    """A SEND, FLOW or ACK; ``unusual`` adds a field the reader leaves to protobuf."""
    kind = rng.choice((T.SEND, T.FLOW, T.ACK))
    command = pb.BaseCommand(type=kind)
    if kind == T.SEND:
        send = command.send
        send.producer_id, send.sequence_id = uint64(rng), uint64(rng)
        if rng.random() < 0.7:
            send.num_messages = int32(rng)
        if rng.random() < 0.5:
            send.highest_sequence_id = uint64(rng)
        if rng.random() < 0.2:
            send.is_chunk = rng.random() < 0.5
        if unusual:
            send.txnid_least_bits = uint64(rng)
    elif kind == T.FLOW:
        command.flow.consumer_id = uint64(rng)
        command.flow.messagePermits = rng.choice((0, 1, 1000, (1 << 32) - 1))
        if unusual:
            command.flow.SetInParent()
            command.ping.SetInParent()  # a second body
    else:
        ack = command.ack
        ack.consumer_id = uint64(rng)
        ack.ack_type = rng.choice((pb.CommandAck.Individual, pb.CommandAck.Cumulative))
        for _ in range(rng.randint(0, 4)):
            message_id(rng, ack.message_id.add())
        if rng.random() < 0.5:
            ack.request_id = uint64(rng)
        if unusual:
            ack.properties.add(key="k", value=1)
    return command


def assert_same(hot: HotCommand, command: pb.BaseCommand) -> None:
    """``hot`` holds exactly protobuf's values for ``command``, which is complete."""
    assert command.IsInitialized()
    if isinstance(hot, SendCommand):
        assert command.type == T.SEND and command.HasField("send")
        send = command.send
        assert hot == (send.producer_id, send.sequence_id, send.num_messages, send.highest_sequence_id)
        assert not (send.HasField("txnid_least_bits") or send.HasField("txnid_most_bits")
                    or send.HasField("marker") or send.HasField("message_id"))
    elif isinstance(hot, FlowCommand):
        assert command.type == T.FLOW and command.HasField("flow")
        assert hot == (command.flow.consumer_id, command.flow.messagePermits)
    else:
        assert isinstance(hot, AckCommand)
        assert command.type == T.ACK and command.HasField("ack")
        ack = command.ack
        assert (hot.consumer_id, hot.ack_type) == (ack.consumer_id, ack.ack_type)
        assert hot.request_id == (ack.request_id if ack.HasField("request_id") else None)
        assert [(m.ledgerId, m.entryId, m.batch_index, tuple(m.ack_set)) for m in ack.message_id] == \
            [tuple(m) for m in hot.message_id]
        assert not (ack.properties or ack.HasField("validation_error") or ack.HasField("txnid_least_bits")
                    or ack.HasField("txnid_most_bits"))
        assert not any(m.HasField("first_chunk_message_id") for m in ack.message_id)
    listed = {descriptor.name for descriptor, _ in command.ListFields()}
    assert listed == {"type", {SendCommand: "send", FlowCommand: "flow", AckCommand: "ack"}[type(hot)]}


def protobuf_parse(raw: bytes) -> pb.BaseCommand | None:
    command = pb.BaseCommand()
    try:
        command.ParseFromString(raw)
    except Exception:
        return None
    return command


def test_round_trip_reads_protobufs_values() -> None:
    rng = random.Random(SEED)
    for _ in range(ROUND_TRIPS):
        unusual = rng.random() < 0.2
        command = random_command(rng, unusual=unusual)
        raw = command.SerializeToString()
        hot = parse_hot(raw)
        if unusual:
            assert hot is None, command
        else:
            assert hot is not None, command  # the common shape takes the fast path
            assert_same(hot, command)


def test_mutated_commands_are_read_as_protobuf_reads_them_or_left_to_it() -> None:
    rng = random.Random(SEED + 1)
    taken = 0
    for _ in range(MUTATIONS):
        raw = bytearray(random_command(rng, unusual=rng.random() < 0.1).SerializeToString())
        for _ in range(rng.randint(1, 3)):
            action = rng.randrange(4)
            position = rng.randrange(len(raw) + 1)
            if action == 0 and position < len(raw):
                raw[position] = rng.randrange(256)
            elif action == 1:
                raw.insert(position, rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256))))
            elif action == 2 and position < len(raw):
                del raw[position]
            else:
                del raw[position:]
        data = bytes(raw)
        hot = parse_hot(data)
        if hot is None:
            continue
        taken += 1
        command = protobuf_parse(data)
        assert command is not None, data.hex()  # never accepted what protobuf refuses
        assert_same(hot, command)
    assert taken > MUTATIONS // 40  # the mutations do reach the fast path (about 4% of them do)


def test_decoded_frames_carry_the_same_values_either_way() -> None:
    rng = random.Random(SEED + 2)
    commands = [random_command(rng, unusual=rng.random() < 0.3) for _ in range(200)]
    stream = b"".join(command_frame(command) for command in commands)
    frames = FrameDecoder(1 << 20).feed(stream)
    assert len(frames) == len(commands)
    for frame, command in zip(frames, commands, strict=True):
        assert frame.kind == command.type
        assert frame.command == command  # protobuf's view, parsed on demand for a hot frame
        if frame.hot is not None:
            assert_same(frame.hot, command)


def test_send_receipts_are_protobufs_bytes() -> None:
    rng = random.Random(SEED + 3)
    for _ in range(ROUND_TRIPS):
        producer_id, sequence_id, highest = uint64(rng), uint64(rng), uint64(rng)
        ledger_id = rng.choice((uint64(rng), -1))  # -1: an id Java would print as -1
        entry_id = rng.choice((uint64(rng), -1))
        partition = rng.choice((-1, 0, 7, (1 << 31) - 1))
        command = pb.BaseCommand(type=T.SEND_RECEIPT)
        receipt = command.send_receipt
        receipt.producer_id = producer_id
        receipt.sequence_id = sequence_id
        receipt.highest_sequence_id = highest
        receipt.message_id.ledgerId = ledger_id % (1 << 64)
        receipt.message_id.entryId = entry_id % (1 << 64)
        if partition >= 0:
            receipt.message_id.partition = partition
        assert send_receipt_command(producer_id, sequence_id, highest, ledger_id, entry_id, partition) == \
            command_frame(command)


def test_message_frames_are_protobufs_bytes() -> None:
    """MESSAGE, written by hand for every delivered entry: the frame protobuf's command makes,
    with the entry after it, for ids Java prints as -1, partitions, redeliveries and ack sets."""
    rng = random.Random(SEED + 4)
    for _ in range(ROUND_TRIPS):
        consumer_id = uint64(rng)
        ledger_id = rng.choice((uint64(rng), -1))
        entry_id = rng.choice((uint64(rng), -1))
        partition = rng.choice((-1, 0, 7, (1 << 31) - 1))
        redelivery_count = rng.choice((0, 1, (1 << 32) - 1))
        ack_set = [rng.randrange(-(1 << 63), 1 << 63) for _ in range(rng.choice((0, 1, 3)))]
        payload = memoryview(rng.randbytes(rng.randrange(0, 300)))
        command = pb.BaseCommand(type=T.MESSAGE)
        body = command.message
        body.consumer_id = consumer_id
        body.message_id.ledgerId = ledger_id % (1 << 64)
        body.message_id.entryId = entry_id % (1 << 64)
        if partition >= 0:
            body.message_id.partition = partition
        if redelivery_count:
            body.redelivery_count = redelivery_count
        body.ack_set.extend(ack_set)
        header, data = message_command(consumer_id, ledger_id, entry_id, partition, redelivery_count, ack_set, payload)
        serialized = command.SerializeToString()
        assert header == struct.pack(">II", 4 + len(serialized) + len(payload), len(serialized)) + serialized
        assert data is payload
