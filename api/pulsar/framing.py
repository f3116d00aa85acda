"""Pulsar's binary framing, sans I/O: bytes in, commands out; commands in, bytes out.

Role: the lowest layer of the binary front end. A frame is ``[total u32][command size u32]
[BaseCommand]`` (big-endian), optionally followed by a payload, which for SEND and MESSAGE is a
whole entry in Pulsar's format (``[0x0e01 u16][crc32c u32][metadata size u32][MessageMetadata]
[messages]``). :class:`FrameDecoder` cuts a byte stream into :class:`Frame`\\ s; the
``*_frame`` functions build outgoing frames. Nothing here touches a socket or an event loop:
the tests feed plain byte strings.

Invariants:
- A frame larger than ``frame_bytes_max`` is refused from its header alone, before its bytes
  are buffered, so a client can never make the decoder hold more than one frame's bound (the
  server keeps that bound small until a connection's handshake completed).
- Linear: each received byte is copied at most twice (into the partial frame it belongs to,
  and once more when it came after a frame completed in the same buffer), never once per read;
  a frame dripped a byte at a time costs what it costs when it arrives at once.
- Malformed input (a command size that does not fit its frame, a command protobuf cannot parse,
  a command without its ``type``, an unknown type) raises :class:`ProtocolViolation`; the caller
  closes the connection. The decoder is then unusable, by design: a byte stream whose framing
  was lost cannot be resynchronised.
- A payload is a view into the received bytes, not a copy; checksums are the session's business
  (a bad checksum is answered, not a reason to drop the connection).
- SEND, FLOW and ACK in their common shape are read by hand (``hot_commands.py``: ``Frame.hot``),
  without protobuf; that reader accepts only what protobuf parses to the same values with every
  required field present, and leaves anything else to protobuf, so the two rules above hold
  whichever path read a command. ``Frame.command`` is protobuf's view, parsed on first use for
  a hand-read frame.
"""

from __future__ import annotations

import struct

from google.protobuf.message import DecodeError

from api.limits import COMMAND_BYTES_MAX
from api.pulsar.hot_commands import ACK, FLOW, SEND, AckCommand, FlowCommand, HotCommand, SendCommand, parse_hot
from api.pulsar.proto import pulsar_api_pb2 as pb

FRAME_HEADER = struct.Struct(">II")
SIZE = struct.Struct(">I")
FRAME_HEADER_BYTES = FRAME_HEADER.size

KNOWN_TYPES = frozenset(pb.BaseCommand.Type.values())
HOT_KINDS: dict[type, int] = {SendCommand: SEND, FlowCommand: FLOW, AckCommand: ACK}


class ProtocolViolation(Exception):
    """The peer broke the framing or the command grammar; the connection must be closed."""


class Frame:
    """One command and its payload. The hot commands (SEND, FLOW, ACK in their common shape) are
    read by hand (``hot_commands.py``) into ``hot``; ``command`` is protobuf's view, parsed
    on first use for those (it reads the same values, see ``hot_commands.py``)."""

    __slots__ = ("_command", "_raw", "hot", "kind", "payload")

    def __init__(self, kind: int, command: pb.BaseCommand | None, hot: HotCommand | None, raw: bytes,
                 payload: memoryview | None) -> None:
        self.kind = kind
        """The command's ``BaseCommand.Type``."""
        self.hot = hot
        self.payload = payload
        """Everything after the command (an entry for SEND), None when the frame has none."""
        self._raw = raw
        self._command = command

    @property
    def command(self) -> pb.BaseCommand:
        command = self._command
        if command is None:
            command = self._command = pb.BaseCommand()
            command.ParseFromString(self._raw)
        return command


class FrameDecoder:
    """Cuts a byte stream into frames; ``feed`` as bytes arrive.

    Linear in the bytes received: frames that arrive whole within one read are cut from that
    read without a copy; the bytes of a frame that arrives in pieces are appended to one
    buffer (amortised, as a ``bytearray`` grows) and handed out once its announced length has
    arrived, without being copied again. ``bytes_copied`` counts what the decoder copied, for
    the tests that hold it to this."""

    def __init__(self, frame_bytes_max: int) -> None:
        self.frame_bytes_max = frame_bytes_max
        """The bound on a frame's announced size; the owner may change it between reads (the
        server lifts it once a connection's handshake completed)."""
        self._partial = bytearray()
        """The start of a frame (and nothing after it) whose bytes have not all arrived."""
        self.frames_decoded = 0
        self.bytes_received = 0
        self.bytes_copied = 0

    @property
    def buffered_bytes(self) -> int:
        return len(self._partial)

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by ``data`` (possibly none); ``ProtocolViolation`` on bad input."""
        self.bytes_received += len(data)
        if self._partial:
            self._partial += data
            self.bytes_copied += len(data)
            if len(self._partial) < self._bytes_wanted():
                return []
            view = memoryview(self._partial).toreadonly()  # payloads keep it; it is never resized
            self._partial = bytearray()
        else:
            view = memoryview(data)
        frames, position = self._cut(view)
        if position < len(view):
            self._partial = bytearray(view[position:])
            self.bytes_copied += len(view) - position
        self.frames_decoded += len(frames)
        return frames

    def release(self) -> None:
        """Drop a partial frame (the connection closed): its memory goes at once."""
        self._partial = bytearray()

    def _bytes_wanted(self) -> int:
        """How many bytes the partial frame needs before anything can be cut from it: its size
        header, then the whole frame (checked against the bound as soon as the header is in)."""
        if len(self._partial) < SIZE.size:
            return SIZE.size
        return SIZE.size + self._checked_total(SIZE.unpack_from(self._partial, 0)[0])

    def _checked_total(self, total: int) -> int:
        if total > self.frame_bytes_max:
            raise ProtocolViolation(f"frame of {total} bytes exceeds the {self.frame_bytes_max}-byte bound")
        if total < SIZE.size:
            raise ProtocolViolation(f"frame of {total} bytes cannot hold its command size")
        return total

    def _cut(self, view: memoryview) -> tuple[list[Frame], int]:
        """The whole frames at the start of ``view`` and where the rest begins."""
        frames: list[Frame] = []
        position = 0
        end = len(view)
        while end - position >= SIZE.size:
            total = self._checked_total(SIZE.unpack_from(view, position)[0])
            if end - position - SIZE.size < total:
                break
            frames.append(_frame_of(view[position + SIZE.size: position + SIZE.size + total]))
            position += SIZE.size + total
        return frames, position


def _frame_of(body: memoryview) -> Frame:
    command_size = SIZE.unpack_from(body, 0)[0]
    if command_size > len(body) - SIZE.size or command_size > COMMAND_BYTES_MAX:
        raise ProtocolViolation(f"command of {command_size} bytes does not fit its {len(body)}-byte frame")
    raw = bytes(body[SIZE.size: SIZE.size + command_size])
    rest = body[SIZE.size + command_size:]
    payload = rest if len(rest) else None
    hot = parse_hot(raw)
    if hot is not None:
        return Frame(HOT_KINDS[type(hot)], None, hot, raw, payload)
    command = pb.BaseCommand()
    try:
        command.ParseFromString(raw)
    except (DecodeError, ValueError) as exc:
        raise ProtocolViolation(f"unparsable command: {exc}") from None
    if not command.HasField("type") or command.type not in KNOWN_TYPES:
        raise ProtocolViolation("command without a known type")
    return Frame(command.type, command, None, raw, payload)


def command_frame(command: pb.BaseCommand) -> bytes:
    """A frame holding ``command`` alone."""
    body: bytes = command.SerializeToString()
    return FRAME_HEADER.pack(SIZE.size + len(body), len(body)) + body

