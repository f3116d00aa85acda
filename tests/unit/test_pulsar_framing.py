"""The binary protocol's frame decoder, fed plain byte strings.

Checks: however a stream is cut into reads (a byte at a time, at random points, all at once) the
decoder yields the same frames; its copying is linear in the bytes received (a 1 MiB frame fed
a byte at a time is copied about once, not once per read); a frame over the bound is refused
from its header, even when the header itself arrives in pieces; the bound may change between
reads (the server lifts it once the handshake completed); a released decoder holds nothing.
"""

from __future__ import annotations

import random
import struct

import pytest

from api.pulsar.framing import FrameDecoder, ProtocolViolation, command_frame
from api.pulsar.proto import pulsar_api_pb2 as pb

T = pb.BaseCommand.Type
MIB = 1024 * 1024


def ping_with_payload(payload_bytes: int) -> bytes:
    """A PING frame carrying ``payload_bytes`` after its command (framing does not judge payloads)."""
    command = pb.BaseCommand(type=T.PING)
    command.ping.SetInParent()
    body: bytes = command.SerializeToString()
    payload = bytes(range(256)) * (payload_bytes // 256) + bytes(payload_bytes % 256)
    return struct.pack(">II", 4 + len(body) + payload_bytes, len(body)) + body + payload


def ping() -> bytes:
    command = pb.BaseCommand(type=T.PING)
    command.ping.SetInParent()
    frame: bytes = command_frame(command)
    return frame


def decoded(decoder: FrameDecoder, stream: bytes, cuts: list[int]) -> list[tuple[int, bytes | None]]:
    """The (kind, payload) of every frame ``decoder`` cuts from ``stream`` fed in pieces at ``cuts``."""
    frames = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        frames.extend(decoder.feed(stream[start:end]))
    return [(frame.kind, None if frame.payload is None else bytes(frame.payload)) for frame in frames]


def test_a_large_frame_fed_a_byte_at_a_time_is_copied_about_once() -> None:
    frame = ping_with_payload(MIB)
    decoder = FrameDecoder(2 * MIB)
    frames = []
    for index in range(len(frame)):
        frames.extend(decoder.feed(frame[index:index + 1]))
    assert [(f.kind, bytes(f.payload or b"")) for f in frames] == [(T.PING, frame[-MIB:])]
    assert decoder.bytes_received == len(frame)
    assert decoder.bytes_copied <= 2 * len(frame), f"{decoder.bytes_copied} bytes copied for a {len(frame)}-byte frame"
    assert decoder.buffered_bytes == 0


def test_copying_stays_linear_whatever_the_cuts() -> None:
    stream = b"".join([ping(), ping_with_payload(300_000), ping(), ping_with_payload(70_000), ping()] * 3)
    whole = decoded(FrameDecoder(MIB), stream, [])
    rng = random.Random(7)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randrange(1, 2000)))
        decoder = FrameDecoder(MIB)
        assert decoded(decoder, stream, cuts) == whole
        assert decoder.bytes_copied <= 2 * len(stream)
    assert len(whole) == 15


def test_frames_within_one_read_are_not_copied() -> None:
    decoder = FrameDecoder(MIB)
    stream = b"".join([ping(), ping_with_payload(100_000), ping()])
    assert len(decoder.feed(stream)) == 3
    assert decoder.bytes_copied == 0


@pytest.mark.parametrize("pieces", [[4], [1, 1, 1, 1], [2, 2], [3, 1]])
def test_a_frame_over_the_bound_is_refused_from_its_header_in_any_pieces(pieces: list[int]) -> None:
    decoder = FrameDecoder(64 * 1024)
    header = struct.pack(">I", 5 * MIB)
    with pytest.raises(ProtocolViolation, match="exceeds the 65536-byte bound"):
        position = 0
        for size in pieces:
            decoder.feed(header[position:position + size])
            position += size
    assert decoder.buffered_bytes <= 4  # the header at most, none of the frame


def test_the_bound_may_be_lifted_between_reads() -> None:
    small, large = ping(), ping_with_payload(200_000)
    decoder = FrameDecoder(1024)
    assert len(decoder.feed(small)) == 1
    decoder.frame_bytes_max = MIB
    assert len(decoder.feed(large[:1000])) == 0
    assert len(decoder.feed(large[1000:])) == 1


def test_release_drops_a_partial_frame() -> None:
    decoder = FrameDecoder(MIB)
    decoder.feed(ping_with_payload(500_000)[:400_000])
    assert decoder.buffered_bytes == 400_000
    decoder.release()
    assert decoder.buffered_bytes == 0
