"""The few commands of every message, spelled by hand: SEND, FLOW and ACK read, SEND_RECEIPT and MESSAGE written.

Role: protobuf's runtime costs microseconds per command, which at one SEND and one receipt per
message is a large share of a message's cost. ``framing.py`` asks :func:`parse_hot` first; it
reads the common shape of these commands and answers None for anything else (a field it does
not know, a repeated sub-message, a wire type it does not expect, a varint it cannot read),
which protobuf then parses as before. :func:`send_receipt_command` and :func:`message_command`
write the bytes protobuf would write (``commands.send_receipt`` and ``commands.message`` use them).

Invariants (checked against protobuf by ``tests/unit/test_hot_commands.py``, a seeded
round-trip and mutation fuzz):
- whatever :func:`parse_hot` accepts, protobuf parses to the same values, with every required
  field present; it never accepts what protobuf refuses;
- :func:`send_receipt_command` and :func:`message_command` are byte for byte
  ``BaseCommand.SerializeToString()`` (in the frame protobuf's command would make).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from api.pulsar.proto import pulsar_api_pb2 as pb
from broker import message_id_bytes

T = pb.BaseCommand.Type
SEND = int(T.SEND)
FLOW = int(T.FLOW)
ACK = int(T.ACK)
SEND_RECEIPT = int(T.SEND_RECEIPT)
MESSAGE = int(T.MESSAGE)
_UINT64 = (1 << 64) - 1
_UINT32 = (1 << 32) - 1
_VARINT_BYTES_MAX = 10


class SendCommand(NamedTuple):
    """A CommandSend without transaction, marker or message id (what clients send)."""

    producer_id: int
    sequence_id: int
    num_messages: int
    highest_sequence_id: int


class FlowCommand(NamedTuple):
    consumer_id: int
    messagePermits: int  # noqa: N815  # protobuf's field name


class AckedId(NamedTuple):
    """A MessageIdData of an ACK, with protobuf's defaults for what it leaves out."""

    ledgerId: int  # noqa: N815  # protobuf's field names
    entryId: int  # noqa: N815
    batch_index: int
    ack_set: tuple[int, ...]


class AckCommand(NamedTuple):
    """A CommandAck without properties, transaction or validation error."""

    consumer_id: int
    ack_type: int
    message_id: tuple[AckedId, ...]
    request_id: int | None


HotCommand = SendCommand | FlowCommand | AckCommand


class _Unread(Exception):
    """Not a shape this module reads: protobuf parses the command instead."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A varint of at most 10 bytes and 64 bits, read as protobuf reads it."""
    if pos >= end:
        raise _Unread
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = 0
    shift = 0
    limit = min(end, pos + _VARINT_BYTES_MAX)
    while pos < limit:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value > _UINT64:
                raise _Unread  # wider than 64 bits: protobuf decides what it means
            return value, pos
        shift += 7
    raise _Unread


def _int32(value: int) -> int:
    """A varint read into an int32 field: its low 32 bits, signed."""
    value &= _UINT32
    return value - (1 << 32) if value >= 1 << 31 else value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _bounds(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(start, end) of a length-delimited field whose length is at ``pos``."""
    length, pos = _varint(buf, pos, end)
    if pos + length > end:
        raise _Unread
    return pos, pos + length


def parse_hot(buf: bytes) -> HotCommand | None:
    """The SEND, FLOW or ACK that ``buf`` (a whole ``BaseCommand``) holds, or None: then it is
    another command or a shape this module leaves to protobuf."""
    try:
        return _parse(buf)
    except (_Unread, IndexError):
        return None


def _parse(buf: bytes) -> HotCommand | None:
    end = len(buf)
    if end < 4 or buf[0] != 0x08:
        return None
    kind, pos = _varint(buf, 1, end)
    if kind == SEND:
        tag = 0x32  # field 6
    elif kind == FLOW:
        tag = 0x5A  # field 11
    elif kind == ACK:
        tag = 0x52  # field 10
    else:
        return None
    if pos >= end or buf[pos] != tag:
        return None
    start, body_end = _bounds(buf, pos + 1, end)
    if body_end != end:
        return None  # more fields (a second type, a second body): protobuf merges them
    if kind == SEND:
        return _send(buf, start, body_end)
    if kind == FLOW:
        return _flow(buf, start, body_end)
    return _ack(buf, start, body_end)


def _send(buf: bytes, pos: int, end: int) -> SendCommand:
    producer_id = sequence_id = None
    num_messages, highest = 1, 0
    while pos < end:
        tag = buf[pos]
        if tag == 0x08:
            producer_id, pos = _varint(buf, pos + 1, end)
        elif tag == 0x10:
            sequence_id, pos = _varint(buf, pos + 1, end)
        elif tag == 0x18:
            value, pos = _varint(buf, pos + 1, end)
            num_messages = _int32(value)
        elif tag == 0x30:
            highest, pos = _varint(buf, pos + 1, end)
        elif tag == 0x38:  # is_chunk: the entry's metadata says so, the broker reads it there
            pos = _varint(buf, pos + 1, end)[1]
        else:
            raise _Unread  # a transaction, a marker, a message id, anything unknown
    if producer_id is None or sequence_id is None:
        raise _Unread  # protobuf names what is missing
    return SendCommand(producer_id, sequence_id, num_messages, highest)


def _flow(buf: bytes, pos: int, end: int) -> FlowCommand:
    consumer_id = permits = None
    while pos < end:
        tag = buf[pos]
        if tag == 0x08:
            consumer_id, pos = _varint(buf, pos + 1, end)
        elif tag == 0x10:
            value, pos = _varint(buf, pos + 1, end)
            permits = value & _UINT32
        else:
            raise _Unread
    if consumer_id is None or permits is None:
        raise _Unread
    return FlowCommand(consumer_id, permits)


def _ack(buf: bytes, pos: int, end: int) -> AckCommand:
    consumer_id = ack_type = request_id = None
    ids: list[AckedId] = []
    while pos < end:
        tag = buf[pos]
        if tag == 0x08:
            consumer_id, pos = _varint(buf, pos + 1, end)
        elif tag == 0x10:
            ack_type, pos = _varint(buf, pos + 1, end)
            if ack_type > 1:
                raise _Unread  # not an AckType: protobuf keeps it as an unknown field
        elif tag == 0x1A:
            start, pos = _bounds(buf, pos + 1, end)
            ids.append(_acked_id(buf, start, pos))
        elif tag == 0x40:
            request_id, pos = _varint(buf, pos + 1, end)
        else:
            raise _Unread
    if consumer_id is None or ack_type is None:
        raise _Unread
    return AckCommand(consumer_id, ack_type, tuple(ids), request_id)


def _acked_id(buf: bytes, pos: int, end: int) -> AckedId:
    ledger_id = entry_id = None
    batch_index = -1
    ack_set: list[int] = []
    while pos < end:
        tag = buf[pos]
        if tag == 0x08:
            ledger_id, pos = _varint(buf, pos + 1, end)
        elif tag == 0x10:
            entry_id, pos = _varint(buf, pos + 1, end)
        elif tag == 0x20:
            value, pos = _varint(buf, pos + 1, end)
            batch_index = _int32(value)
        elif tag == 0x28:  # ack_set, one word
            value, pos = _varint(buf, pos + 1, end)
            ack_set.append(_int64(value))
        elif tag == 0x2A:  # ack_set, packed
            start, pos = _bounds(buf, pos + 1, end)
            while start < pos:
                value, start = _varint(buf, start, pos)
                ack_set.append(_int64(value))
        elif tag in (0x18, 0x30):  # partition, batch_size: not used by the broker
            pos = _varint(buf, pos + 1, end)[1]
        else:
            raise _Unread  # a first chunk's id, anything unknown
    if ledger_id is None or entry_id is None:
        raise _Unread
    return AckedId(ledger_id, entry_id, batch_index, tuple(ack_set))


# --- writing ---------------------------------------------------------------------------------


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _command_frame(command_type: int, body_tag: int, body: bytearray, payload_bytes: int = 0) -> bytes:
    """A frame's size fields and ``BaseCommand`` (its type, then ``body`` as the field of
    ``body_tag``), as protobuf would write them; ``payload_bytes`` follow it in the frame."""
    command = bytearray((0x08, command_type, body_tag))  # both types are one-byte varints
    _put_varint(command, len(body))
    command += body
    size = len(command)
    return (size + 4 + payload_bytes).to_bytes(4, "big") + size.to_bytes(4, "big") + bytes(command)


def send_receipt_command(producer_id: int, sequence_id: int, highest_sequence_id: int, ledger_id: int,
                         entry_id: int, partition: int) -> bytes:
    """The frame of a SEND_RECEIPT (``partition`` < 0: none), as protobuf would write it."""
    message_id = message_id_bytes(ledger_id, entry_id, partition)
    body = bytearray(b"\x08")
    _put_varint(body, producer_id)
    body.append(0x10)
    _put_varint(body, sequence_id)
    body.append(0x1A)
    _put_varint(body, len(message_id))
    body += message_id
    body.append(0x20)
    _put_varint(body, highest_sequence_id)
    return _command_frame(SEND_RECEIPT, 0x3A, body)  # BaseCommand.send_receipt, field 7


def message_command(consumer_id: int, ledger_id: int, entry_id: int, partition: int, redelivery_count: int,
                    ack_set: Sequence[int], payload: bytes | memoryview) -> tuple[bytes, bytes | memoryview]:
    """A MESSAGE frame (``partition`` < 0: none; ``redelivery_count`` 0 and an empty ``ack_set``
    left out) as protobuf would write it, as two buffers for one ``writelines``: the header and
    command, then ``payload`` (the stored entry from its ``0x0e01`` magic on), not copied."""
    message_id = message_id_bytes(ledger_id, entry_id, partition)
    body = bytearray(b"\x08")
    _put_varint(body, consumer_id)
    body.append(0x12)
    _put_varint(body, len(message_id))
    body += message_id
    if redelivery_count:
        body.append(0x18)
        _put_varint(body, redelivery_count)
    for word in ack_set:
        body.append(0x20)
        _put_varint(body, word & _UINT64)
    return _command_frame(MESSAGE, 0x4A, body, len(payload)), payload  # BaseCommand.message, field 9
