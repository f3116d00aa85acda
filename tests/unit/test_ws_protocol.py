"""The WebSocket wire, sans I/O: plain byte strings in, text frames and answers out.

websockets' own sans-I/O client builds what a real client sends (masked frames, the handshake)
and reads what the wire answers, so each check is the protocol's, not a mock's. The real wire
runs under every WebSocket integration test too.
"""

from __future__ import annotations

import logging
import random
import struct

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import SEND_EOF
from websockets.uri import parse_uri

from api.ws.protocol import NOT_TEXT, HandshakeRefused, WebSocketWire, text_frames

FRAME_BYTES_MAX = 256 * 1024
HEAD_BYTES_MAX = 8 * 1024
PATH = "/ws/v2/producer/persistent/public/default/t"


def opened() -> tuple[WebSocketWire, ClientProtocol]:
    """A wire past its handshake, and the client at the other end."""
    wire = WebSocketWire(FRAME_BYTES_MAX, HEAD_BYTES_MAX)
    client = ClientProtocol(parse_uri(f"ws://broker{PATH}?token=secret"), max_size=None)
    client.send_request(client.connect())
    request = wire.receive_head(b"".join(client.data_to_send()))
    assert request is not None and request.path == f"{PATH}?token=secret"
    response = wire.accept(request)
    assert response.status_code == 101
    client.receive_data(wire.respond(response))
    assert isinstance(client.events_received()[0], Response) and wire.open
    return wire, client


def masked(client: ClientProtocol, *frames: Frame) -> bytes:
    for frame in frames:
        client.send_frame(frame)
    return b"".join(client.data_to_send())


def answered(client: ClientProtocol, output: list[bytes]) -> list[Frame]:
    """The frames the client reads from the wire's output."""
    client.receive_data(b"".join(output))
    return [event for event in client.events_received() if isinstance(event, Frame)]


def feed_in_cuts(wire: WebSocketWire, data: bytes, rng: random.Random) -> list[str]:
    texts: list[str] = []
    pos = 0
    while pos < len(data):
        size = rng.choice([1, 2, 3, 5, 7, 11, 64, 500, 4096, 70_000])
        texts += wire.receive(data[pos : pos + size])
        pos += size
    return texts


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_text_frames_cut_anywhere_come_out_whole_and_in_order(seed: int) -> None:
    wire, client = opened()
    rng = random.Random(seed)
    sent = [("x" * rng.choice([0, 1, 125, 126, 4000, 65535, 65536, 100_000])) + f"#{i}" for i in range(60)]
    texts = feed_in_cuts(wire, masked(client, *(Frame(Opcode.TEXT, t.encode()) for t in sent)), rng)
    assert texts == sent
    assert not wire.has_output


def test_a_ping_among_them_is_answered_in_turn_and_the_frames_go_on() -> None:
    wire, client = opened()
    data = masked(client, Frame(Opcode.TEXT, b"one"), Frame(Opcode.PING, b"are you there"), Frame(Opcode.TEXT, b"two"))
    assert wire.receive(data) == ["one", "two"]
    (pong,) = answered(client, wire.output())
    assert pong.opcode is Opcode.PONG and pong.data == b"are you there"


def test_binary_and_fragmented_messages_read_as_websockets_reads_them() -> None:
    wire, client = opened()
    data = masked(client, Frame(Opcode.BINARY, b'{"binary":1}'), Frame(Opcode.BINARY, b"\xff\xfe"),
                  Frame(Opcode.TEXT, b'{"frag', fin=False), Frame(Opcode.CONT, b'ment":2}'),
                  Frame(Opcode.TEXT, b"after the fragment"))
    assert feed_in_cuts(wire, data, random.Random(7)) == ['{"binary":1}', NOT_TEXT, '{"fragment":2}',
                                                         "after the fragment"]


def test_a_frame_over_the_bound_is_closed_with_1009_without_reading_its_payload(
        caplog: pytest.LogCaptureFixture) -> None:
    wire, client = opened()
    wire.label = f"{PATH} from 127.0.0.1:5"
    declared = 2**62
    header = struct.pack("!BBQ", 0x81, 0x80 | 127, declared) + b"\x00\x00\x00\x00"
    with caplog.at_level(logging.WARNING, logger="api.ws.protocol"):
        assert wire.receive(masked(client, Frame(Opcode.TEXT, b"before")) + header + b"x" * 1000) == ["before"]
        output = wire.output()
        assert output[-1] == SEND_EOF and wire.failed  # half-close, then drop what follows
        (close,) = answered(client, output)
        reason = Close.parse(close.data)
        assert reason.code == 1009
        assert f"frame with {declared} bytes exceeds limit of {FRAME_BYTES_MAX}" in reason.reason
        assert wire.receive(b"x" * 100_000) == [] and not wire.has_output  # dropped, not buffered
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and PATH in warnings[0] and "webSocketMaxTextFrameSize" in warnings[0]
    assert "secret" not in warnings[0]


def test_text_that_is_not_utf8_closes_with_1007() -> None:
    wire, client = opened()
    texts = wire.receive(masked(client, Frame(Opcode.TEXT, b"fine"), Frame(Opcode.TEXT, b"\xff\xfe bad"),
                                Frame(Opcode.TEXT, b"never read")))
    assert texts == ["fine"]
    (close,) = answered(client, wire.output())
    assert Close.parse(close.data).code == 1007 and wire.failed


def test_reserved_bits_hand_over_to_websockets_which_closes_with_1002() -> None:
    wire, client = opened()
    good = masked(client, Frame(Opcode.TEXT, b"a"), Frame(Opcode.TEXT, b"b"))
    payload = b"reserved"
    mask = b"\x01\x02\x03\x04"
    odd = bytes((0xC1, 0x80 | len(payload))) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert wire.receive(good + odd) == ["a", "b"]
    (close,) = answered(client, wire.output())
    assert Close.parse(close.data).code == 1002


def test_a_close_the_server_starts_ends_when_the_peer_echoes_it() -> None:
    wire, client = opened()
    (close,) = answered(client, wire.close(1000, "unsubscribed"))
    assert Close.parse(close.data) == Close(1000, "unsubscribed") and not wire.open
    echo = b"".join(client.data_to_send())
    assert wire.receive(masked(client, Frame(Opcode.TEXT, b"late")) + echo) == []  # after close: no text
    assert wire.output()[-1] == SEND_EOF and wire.close_received and not wire.failed


def test_a_close_the_peer_starts_is_echoed() -> None:
    wire, client = opened()
    client.send_close(1000, "bye")
    assert wire.receive(b"".join(client.data_to_send())) == []
    output = wire.output()
    (echo,) = answered(client, output)
    assert echo.opcode is Opcode.CLOSE and output[-1] == SEND_EOF and wire.close_received


@pytest.mark.parametrize("fast", [True, False], ids=["fast reader", "after a fragmented message"])
def test_text_frames_before_the_peers_close_in_one_read_come_out(fast: bool) -> None:
    """Acks a client sends just before its close, read together with it, are the session's:
    whether the wire reads whole frames itself or (after a fragmented message) through websockets."""
    wire, client = opened()
    if not fast:
        assert wire.receive(masked(client, Frame(Opcode.TEXT, b"fr", fin=False), Frame(Opcode.CONT, b"ag"))) == \
            ["frag"]
    acks = masked(client, Frame(Opcode.TEXT, b"ack0"), Frame(Opcode.TEXT, b"ack1"))
    client.send_close(1000, "bye")
    assert wire.receive(acks + b"".join(client.data_to_send())) == ["ack0", "ack1"]
    (echo,) = answered(client, wire.output())
    assert echo.opcode is Opcode.CLOSE and wire.close_received


def test_server_text_frames_read_back_whole() -> None:
    _, client = opened()
    texts = ["", "a" * 125, "b" * 126, "c" * 65535, "d" * 65536, "ünïcode"]
    parts: list[bytes] = []
    assert text_frames(texts, parts) == sum(len(t.encode()) for t in texts)
    assert [bytes(f.data).decode() for f in answered(client, parts)] == texts


def test_a_head_that_does_not_end_within_its_bound_is_refused() -> None:
    wire = WebSocketWire(FRAME_BYTES_MAX, HEAD_BYTES_MAX)
    assert wire.receive_head(b"GET /ws/v2/x HTTP/1.1\r\n") is None  # not ended yet: held
    with pytest.raises(HandshakeRefused):
        wire.receive_head(b"X-Long: " + b"y" * HEAD_BYTES_MAX)
