"""WebSocket frames as they arrive on the socket: split anywhere, mixed with control frames.

The broker reads whole text frames itself and hands every other frame to the websockets
parser (api/ws/protocol.py). A raw TCP client here writes frames built by websockets' sans-I/O
client in chunks of seeded random sizes, so the server's reads cut frames at arbitrary bytes, and
checks against a real server:
- every text frame is answered, in order, whatever the cuts; a ping among them gets its pong;
  a binary frame and a fragmented message are read as the websockets parser reads them;
- text that is not UTF-8 closes the connection with 1007, as the websockets parser does;
- ack frames read together with the client's close frame are applied before the session ends;
- a frame the broker does not read itself (reserved bits set) goes to the websockets parser,
  which closes with 1002 after the frames before it were taken (published);
- a session that closes on the frames read together with the client's close (``unsubscribe``)
  still answers that close with a close frame.
"""

from __future__ import annotations

import base64
import json
import random
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from broker.service import BrokerService
from tests.integration.server import running_server, stored

NS = "persistent/public/default"
DEADLINE_S = 30.0
CHUNK_PAUSE_S = 0.0005


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BrokerService]]:
    with running_server(str(tmp_path_factory.mktemp("ws-frames") / "data")) as (url, service):
        # keep everything: nothing subscribes, and test_min rolls ledgers every few entries
        service.namespaces.set_policy("public/default", "retention_policies",
                                      {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
        yield url, service


class RawClient:
    """A TCP socket driven by websockets' sans-I/O client: frames out in chunks we choose."""

    def __init__(self, http_url: str, path: str) -> None:
        host, port = http_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = ClientProtocol(parse_uri(f"ws://{host}:{port}{path}"))
        self._pending: list[object] = []
        self.conn.send_request(self.conn.connect())
        self._flush()
        response = self._next_event()
        assert isinstance(response, Response) and response.status_code == 101, response

    def _flush(self) -> None:
        for data in self.conn.data_to_send():
            if data:
                self.sock.sendall(data)

    def _next_event(self) -> object:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            events = self.conn.events_received()
            if events:
                self._pending = list(events[1:])
                return events[0]
            data = self.sock.recv(65536)
            if not data:
                self.conn.receive_eof()
            else:
                self.conn.receive_data(data)
            self._flush()  # e.g. a close reply
        raise AssertionError("no event from the server in time")

    def event(self) -> object:
        if self._pending:
            return self._pending.pop(0)
        return self._next_event()

    def frame_bytes(self, frames: list[Frame]) -> bytes:
        for frame in frames:
            self.conn.send_frame(frame)
        return b"".join(self.conn.data_to_send())

    def send_in_chunks(self, data: bytes, rng: random.Random) -> None:
        pos = 0
        while pos < len(data):
            size = rng.choice([1, 2, 3, 5, 7, 11, 64, 500, 4096])
            self.sock.sendall(data[pos : pos + size])
            pos += size
            if rng.random() < 0.3:
                time.sleep(CHUNK_PAUSE_S)  # lets the server read what is there: more cut frames

    def close(self) -> None:
        self.sock.close()


def producer_frame(index: int) -> bytes:
    return json.dumps({"payload": base64.b64encode(f"m{index}".encode()).decode(),
                       "context": f"c{index}"}).encode()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_frames_cut_anywhere_are_answered_in_order(server: tuple[str, BrokerService], seed: int) -> None:
    url, service = server
    topic = f"cuts-{seed}"
    client = RawClient(url, f"/ws/v2/producer/{NS}/{topic}")
    try:
        rng = random.Random(seed)
        frames: list[Frame] = []
        expected: list[str] = []
        for i in range(120):
            if i == 40:
                frames.append(Frame(Opcode.PING, b"are you there"))
            if i == 70:  # a binary frame: read as the websockets parser reads it (UTF-8 text)
                frames.append(Frame(Opcode.BINARY, producer_frame(i)))
            else:
                frames.append(Frame(Opcode.TEXT, producer_frame(i)))
            expected.append(f"c{i}")
        big = json.dumps({"payload": base64.b64encode(b"B" * 70_000).decode(), "context": "big"}).encode()
        frames.append(Frame(Opcode.TEXT, big))  # a 64-bit length header
        expected.append("big")
        whole = producer_frame(999)
        frames += [Frame(Opcode.TEXT, whole[:10], fin=False), Frame(Opcode.CONT, whole[10:])]  # fragmented
        expected.append("c999")
        frames.append(Frame(Opcode.TEXT, producer_frame(1000)))  # after the fragment: the parser's
        expected.append("c1000")
        client.send_in_chunks(client.frame_bytes(frames), rng)
        contexts: list[str] = []
        pongs: list[bytes] = []
        while len(contexts) < len(expected):
            event = client.event()
            assert isinstance(event, Frame), event
            if event.opcode is Opcode.PONG:
                pongs.append(bytes(event.data))
                continue
            answer = json.loads(bytes(event.data))
            assert answer["result"] == "ok", answer
            contexts.append(answer["context"])
        assert contexts == expected
        assert pongs == [b"are you there"]
    finally:
        client.close()
    assert stored(service, topic) == [f"m{i}".encode() for i in range(120)] + [b"B" * 70_000, b"m999", b"m1000"]


def test_text_that_is_not_utf8_closes_with_1007(server: tuple[str, BrokerService],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    url, _ = server
    client = RawClient(url, f"/ws/v2/producer/{NS}/not-utf8")
    try:
        data = client.frame_bytes([Frame(Opcode.TEXT, producer_frame(0)), Frame(Opcode.TEXT, b"\xff\xfe bad")])
        client.sock.sendall(data)
        event = client.event()
        if isinstance(event, Frame) and event.opcode is Opcode.TEXT:  # the first frame's answer, if written in time
            assert json.loads(bytes(event.data))["context"] == "c0"
            event = client.event()
        assert isinstance(event, Frame) and event.opcode is Opcode.CLOSE, event
        assert int.from_bytes(event.data[:2], "big") == 1007
    finally:
        client.close()
    assert any("1007" in r.getMessage() and r.levelname == "WARNING" and r.exc_info is None for r in caplog.records)
    assert not any(r.levelname == "ERROR" for r in caplog.records)


def test_a_frame_the_fast_reader_does_not_take_goes_to_the_websockets_parser(
        server: tuple[str, BrokerService]) -> None:
    """Reserved bits without a negotiated extension: after the frames before it are answered,
    the websockets parser closes the connection with 1002 (protocol error), as it always did."""
    url, service = server
    client = RawClient(url, f"/ws/v2/producer/{NS}/reserved-bits")
    try:
        good = client.frame_bytes([Frame(Opcode.TEXT, producer_frame(i)) for i in range(3)])
        mask = b"\x01\x02\x03\x04"
        payload = producer_frame(3)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        client.sock.sendall(good + bytes((0xC1, 0x80 | len(payload))) + mask + masked)
        contexts: list[str] = []
        while True:
            event = client.event()
            assert isinstance(event, Frame), event
            if event.opcode is Opcode.CLOSE:
                assert int.from_bytes(event.data[:2], "big") == 1002
                break
            contexts.append(json.loads(bytes(event.data))["context"])
        assert contexts == [f"c{i}" for i in range(len(contexts))]
    finally:
        client.close()
    # the three frames before the bad one are published, even when read with it (their receipts
    # may not go out: the connection is closing); the bad one never is
    deadline = time.monotonic() + DEADLINE_S
    while len(stored(service, "reserved-bits")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stored(service, "reserved-bits") == [f"m{i}".encode() for i in range(3)]


def test_acks_in_the_same_read_as_the_close_frame_are_applied(server: tuple[str, BrokerService]) -> None:
    """A client that acknowledges its last messages and closes at once often puts the ack frames
    and its close frame in one TCP segment: the acks precede the close, so they count (the CLI's
    ``consume -n`` does exactly this before it exits)."""
    url, _ = server
    topic = "acks-then-close"
    producer = RawClient(url, f"/ws/v2/producer/{NS}/{topic}")
    consumer = RawClient(url, f"/ws/v2/consumer/{NS}/{topic}/sub")
    try:
        producer.sock.sendall(producer.frame_bytes([Frame(Opcode.TEXT, producer_frame(i)) for i in range(3)]))
        ids: list[str] = []
        while len(ids) < 3:
            event = consumer.event()
            assert isinstance(event, Frame) and event.opcode is Opcode.TEXT, event
            ids.append(json.loads(bytes(event.data))["messageId"])
        acks = consumer.frame_bytes([Frame(Opcode.TEXT, json.dumps({"messageId": message_id}).encode())
                                     for message_id in ids])
        consumer.conn.send_close(1000, "done")
        consumer.sock.sendall(acks + b"".join(consumer.conn.data_to_send()))  # one segment: acks, then close
        event = consumer.event()  # the server's close answers ours, after it read the acks before it
        assert isinstance(event, Frame) and event.opcode is Opcode.CLOSE, event
    finally:
        producer.close()
        consumer.close()
    stats = httpx.get(f"{url}/admin/v2/{NS}/{topic}/stats", timeout=DEADLINE_S).json()
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 0


def test_a_session_that_closes_on_the_frames_read_with_the_peers_close_still_answers_it(
        server: tuple[str, BrokerService]) -> None:
    """``unsubscribe`` and the client's close in one TCP segment: the session closes on the
    unsubscribe while the wire has already read the client's close; the client's close is
    answered with a close frame all the same (never a bare TCP close, which a client reports as
    an abnormal closure, 1006), and the subscription is gone."""
    url, _ = server
    topic = "unsubscribe-then-close"
    producer = RawClient(url, f"/ws/v2/producer/{NS}/{topic}")
    consumer = RawClient(url, f"/ws/v2/consumer/{NS}/{topic}/sub")
    try:
        producer.sock.sendall(producer.frame_bytes([Frame(Opcode.TEXT, producer_frame(0))]))
        event = consumer.event()
        assert isinstance(event, Frame) and event.opcode is Opcode.TEXT, event
        unsubscribe = consumer.frame_bytes([Frame(Opcode.TEXT, json.dumps({"type": "unsubscribe"}).encode())])
        consumer.conn.send_close(1000, "done")
        consumer.sock.sendall(unsubscribe + b"".join(consumer.conn.data_to_send()))
        event = consumer.event()
        assert isinstance(event, Frame) and event.opcode is Opcode.CLOSE, event
    finally:
        producer.close()
        consumer.close()
    stats = httpx.get(f"{url}/admin/v2/{NS}/{topic}/stats", timeout=DEADLINE_S).json()
    assert "sub" not in stats["subscriptions"]
