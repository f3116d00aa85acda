"""The bookie wire protocol, sans-I/O: frames from plain byte strings and back.

Checks: every request and response kind round-trips; a stream cut into arbitrary pieces decodes
to the same frames; malformed frames raise ``ProtocolError``; storage errors keep their class
across the wire.
"""

from __future__ import annotations

import random

import pytest

from storage.bookie_protocol import (
    FrameDecoder,
    Kind,
    ProtocolError,
    Status,
    decode_request,
    decode_response,
    encode_add,
    encode_error,
    encode_ledger_op,
    encode_ok,
    encode_range,
    encode_read,
    encode_read_range,
    error_of,
)
from storage.errors import (
    InvalidArgument,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    StorageError,
    StorageIOError,
    WriteCacheFull,
)
from storage.limits import FRAME_BYTES_MAX


def one_frame(parts: list[bytes] | bytes) -> memoryview:
    data = parts if isinstance(parts, bytes) else b"".join(parts)
    frames = FrameDecoder().feed(data)
    assert len(frames) == 1
    return frames[0]


def test_requests_round_trip() -> None:
    add = decode_request(one_frame(encode_add(7, 3, [(42, [b"head", b"payload"])], recovery=True)))
    assert (add.kind, add.request_id, add.ledger_id, add.entry_id, add.recovery, add.entry_ids, add.datas) == \
        (Kind.ADD, 7, 3, 42, True, (42,), (b"headpayload",))
    many = decode_request(one_frame(encode_add(11, 3, [(4, [b"h", b"four"]), (6, [b"six"]), (7, [b""])])))
    assert (many.kind, many.request_id, many.ledger_id, many.entry_ids, many.datas, many.recovery) == \
        (Kind.ADD, 11, 3, (4, 6, 7), (b"hfour", b"six", b""), False)
    read = decode_request(one_frame(encode_read(8, 3, -1)))
    assert (read.kind, read.ledger_id, read.entry_id) == (Kind.READ, 3, -1)
    ranged = decode_request(one_frame(encode_read_range(9, 3, 10, 20, entries_max=5, bytes_max=1000)))
    assert (ranged.entry_id, ranged.last_entry_id, ranged.entries_max, ranged.bytes_max) == (10, 20, 5, 1000)
    for kind in (Kind.FENCE, Kind.DELETE):
        op = decode_request(one_frame(encode_ledger_op(kind, 10, 99)))
        assert (op.kind, op.request_id, op.ledger_id) == (kind, 10, 99)


def test_responses_round_trip() -> None:
    added = decode_response(one_frame(encode_ok(Kind.ADD, 1, entry_id=5)))
    assert (added.kind, added.status, added.entry_id, added.error()) == (Kind.ADD, Status.OK, 5, None)
    read = decode_response(one_frame(encode_ok(Kind.READ, 2, entry_id=6, data=b"bytes")))
    assert (read.entry_id, read.data) == (6, b"bytes")
    empty = decode_response(one_frame(encode_ok(Kind.READ, 2, entry_id=6, data=b"")))
    assert empty.data == b""
    ranged = decode_response(one_frame(encode_range(3, [(1, b"a"), (3, b""), (4, b"ccc")])))
    assert ranged.entries == ((1, b"a"), (3, b""), (4, b"ccc"))
    assert decode_response(one_frame(encode_range(4, []))).entries == ()
    assert decode_response(one_frame(encode_ok(Kind.FENCE, 5))).status is Status.OK


@pytest.mark.parametrize("error", [NoSuchLedger("l"), NoSuchEntry("e"), LedgerFenced("f"), StorageIOError("io"),
                                   WriteCacheFull("w"), InvalidArgument("i")])
def test_errors_keep_their_class(error: StorageError) -> None:
    response = decode_response(one_frame(encode_error(Kind.ADD, 1, error)))
    raised = response.error()
    assert type(raised) is type(error) and str(raised) == str(error)
    assert isinstance(error_of(Status.ERROR, "x"), StorageError)


def test_a_stream_cut_anywhere_decodes_the_same() -> None:
    rng = random.Random(20)
    frames = [b"".join(encode_add(i, 1, [(i, [bytes(rng.randrange(256) for _ in range(rng.randrange(300)))])]))
              for i in range(50)]
    stream = b"".join(frames)
    decoder = FrameDecoder()
    got: list[bytes] = []
    offset = 0
    while offset < len(stream):
        step = rng.randrange(1, 64)
        got.extend(bytes(f) for f in decoder.feed(stream[offset : offset + step]))
        offset += step
    assert got == [f[4:] for f in frames]
    assert decoder.buffered_bytes == 0


def test_malformed_frames_are_refused() -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed((FRAME_BYTES_MAX + 1).to_bytes(4, "big") + b"\x01")
    with pytest.raises(ProtocolError):
        FrameDecoder().feed((3).to_bytes(4, "big") + b"abc")  # shorter than a header
    with pytest.raises(ProtocolError):
        decode_request(memoryview(bytes([77]) + (1).to_bytes(8, "big")))  # unknown kind
    with pytest.raises(ProtocolError):
        decode_request(one_frame(encode_read(1, 2, 3))[:-1])  # truncated body
    with pytest.raises(ProtocolError):
        decode_response(one_frame(encode_read(1, 2, 3)))  # a request where a response belongs
    truncated_range = bytes(one_frame(encode_range(1, [(1, b"abcd")])))[:-2]
    with pytest.raises(ProtocolError):
        decode_response(memoryview(truncated_range))
    with pytest.raises(InvalidArgument):
        encode_add(1, 1, [(1, [b"x"]), (2, [b"x" * FRAME_BYTES_MAX])])


@pytest.mark.parametrize("entries, cut, why", [
    ([(5, [b"a"]), (5, [b"b"])], 0, "ids not increasing"),
    ([(6, [b"a"]), (5, [b"b"])], 0, "ids decreasing"),
    ([(1, [b"abcd"])], 2, "an entry runs past the frame"),
    ([], 0, "no entries"),
])
def test_malformed_group_adds_are_refused(entries: list[tuple[int, list[bytes]]], cut: int, why: str) -> None:
    frame = bytes(one_frame(encode_add(1, 2, entries)))
    with pytest.raises(ProtocolError):
        decode_request(memoryview(frame[: len(frame) - cut]))


def test_a_group_add_with_bytes_after_its_entries_is_refused() -> None:
    frame = bytes(one_frame(encode_add(1, 2, [(1, [b"abc"])])))
    with pytest.raises(ProtocolError):
        decode_request(memoryview(frame + b"zz"))
    with pytest.raises(InvalidArgument):
        encode_add(1, 1, [(1, [b"x" * FRAME_BYTES_MAX])])
