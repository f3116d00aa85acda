"""A WebSocket connection between its socket and its session: frames in by one route, in order,
reading paused by the frames a session leaves, never per frame; a session failure closes 1011.

The connection (``api/ws/server.py``) runs as it does in the broker, on a recording transport,
with websockets' sans-I/O client writing the bytes a real client sends; a small session stands
in for the broker's (which session kind applies a frame is tested by the integration tests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, cast

from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from api.limits import WS_RECEIVE_QUEUE_FRAMES_MAX, EdgeLimits
from api.ws.frames import FrameError, parse_frame
from api.ws.server import WebSocketConnection, WebSocketServer
from api.ws.session import SessionIO, error_frame


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.pauses = 0
        self.resumes = 0
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.written.append(b"".join(list_of_data))

    def pause_reading(self) -> None:
        self.pauses += 1

    def resume_reading(self) -> None:
        self.resumes += 1

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5000) if name == "peername" else default


class OrderedSession:
    """Applies frames in order; a ``{"type": "slow"}`` frame leaves itself and what follows
    until ``release``; a bad frame is answered as consumers and readers answer it."""

    def __init__(self, io: SessionIO) -> None:
        self.io = io
        self.applied: list[str] = []
        self.slow_released = False
        self.takes = True
        self.ended = 0
        self.fail_on: str | None = None

    def start(self) -> None:
        pass

    def end(self) -> None:
        self.ended += 1

    def on_frames(self, texts: list[str]) -> int:
        if not self.takes:
            return 0
        for index, text in enumerate(texts):
            try:
                frame = parse_frame(text)
            except FrameError as exc:
                self.io.writer.send([error_frame(exc)])
                continue
            if frame.get("type") == "slow" and not self.slow_released:
                return index  # must wait: this frame and the rest are offered again
            if self.fail_on is not None and frame.get("messageId") == self.fail_on:
                raise RuntimeError("the session broke")
            self.applied.append(frame.get("messageId", frame.get("type", "?")))
        return len(texts)

    def release(self) -> None:
        self.slow_released = True
        self.io.ready()


class StubServer:
    """What a connection asks of its server: limits, admission (here: always, with ``session``)."""

    def __init__(self) -> None:
        self.limits = EdgeLimits()
        self.session: OrderedSession | None = None
        self.ended = 0

    def admit(self, connection: WebSocketConnection, _request: object) -> Callable[[], None]:
        self.session = OrderedSession(connection)
        connection.session = self.session
        return self._ended

    def _ended(self) -> None:
        self.ended += 1

    def forget(self, _connection: object) -> None:
        pass


def connected() -> tuple[WebSocketConnection, RecordingTransport, ClientProtocol, OrderedSession, StubServer]:
    server, transport = StubServer(), RecordingTransport()
    connection = WebSocketConnection(cast(WebSocketServer, server), transport, lambda: None)
    client = ClientProtocol(parse_uri("ws://broker/ws/v2/reader/persistent/public/default/t"), max_size=None)
    client.send_request(client.connect())
    connection.data_received(b"".join(client.data_to_send()))
    client.receive_data(transport.written.pop(0))
    assert isinstance(client.events_received()[0], Response)
    assert server.session is not None
    return connection, transport, client, server.session, server


def frames(client: ClientProtocol, *texts: str) -> bytes:
    for text in texts:
        client.send_text(text.encode())
    return b"".join(client.data_to_send())


def ack(name: str) -> str:
    return json.dumps({"messageId": name})


async def turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_reading_pauses_at_the_queue_bound_and_resumes_once_drained() -> None:
    async def scenario() -> None:
        connection, transport, client, session, _ = connected()
        session.takes = False  # the session cannot take frames now (a producer at its bound, say)
        for index in range(WS_RECEIVE_QUEUE_FRAMES_MAX - 1):
            connection.data_received(frames(client, ack(f"m{index}")))
        assert transport.pauses == 0  # frames wait, the socket is still read
        connection.data_received(frames(client, ack("the frame that fills the queue")))
        assert transport.pauses == 1
        connection.data_received(frames(client, ack("already buffered by the socket")))
        assert transport.pauses == 1  # paused once, not again
        session.takes = True
        connection.ready()
        await turn()
        assert session.applied[:2] == ["m0", "m1"] and len(session.applied) == WS_RECEIVE_QUEUE_FRAMES_MAX + 1
        assert session.applied[-1] == "already buffered by the socket"
        assert transport.resumes == 1
        connection.data_received(frames(client, ack("after the resume")))
        assert session.applied[-1] == "after the resume" and transport.pauses == 1  # straight through
    asyncio.run(scenario())


def test_frames_reach_the_session_in_arrival_order_whatever_it_leaves() -> None:
    async def scenario() -> None:
        connection, transport, client, session, _ = connected()
        connection.data_received(frames(client, ack("a"), ack("b")))  # one read: one call
        assert session.applied == ["a", "b"]

        connection.data_received(frames(client, ack("c"), '{"type":"slow"}', ack("d")))
        assert session.applied == ["a", "b", "c"]  # the slow frame and what follows wait
        connection.data_received(frames(client, ack("e")))
        await turn()
        assert session.applied == ["a", "b", "c"]  # behind the waiting frames, not before them

        session.release()
        await turn()
        assert session.applied == ["a", "b", "c", "slow", "d", "e"]

        connection.data_received(frames(client, "not json", ack("f")))  # a bad frame is answered, the rest applied
        assert session.applied[-1] == "f"
        await turn()
        client.receive_data(b"".join(transport.written))
        answers = [json.loads(bytes(e.data)) for e in client.events_received() if isinstance(e, Frame)]
        assert [a["result"] for a in answers] == ["error:3"]
    asyncio.run(scenario())


def test_a_session_that_fails_is_closed_with_1011_and_ended_once() -> None:
    async def scenario() -> None:
        connection, transport, client, session, server = connected()
        session.fail_on = "boom"
        connection.data_received(frames(client, ack("ok"), ack("boom"), ack("never")))
        assert session.applied == ["ok"]
        client.receive_data(b"".join(transport.written))
        (close,) = [e for e in client.events_received() if isinstance(e, Frame) and e.opcode is Opcode.CLOSE]
        reason = Close.parse(close.data)
        assert reason.code == 1011 and "the session broke" in reason.reason
        connection.data_received(Frame(Opcode.TEXT, ack("after the close").encode()).serialize(mask=True))
        assert session.applied == ["ok"] and session.ended == 1 and server.ended == 1
        connection.connection_lost(None)
        assert session.ended == 1 and server.ended == 1  # once, however it ends
    asyncio.run(scenario())


def test_an_unanswered_ping_closes_the_connection_with_1011() -> None:
    async def scenario() -> None:
        connection, transport, client, session, _ = connected()
        connection.keepalive()
        await turn()
        client.receive_data(b"".join(transport.written))
        transport.written.clear()
        (ping,) = [e for e in client.events_received() if isinstance(e, Frame)]
        assert ping.opcode is Opcode.PING
        connection.data_received(b"".join(client.data_to_send()))  # the client's pong
        connection.keepalive()  # answered in time: the next ping
        await turn()
        assert session.ended == 0
        connection.keepalive()  # that one was not answered
        client.receive_data(b"".join(transport.written))
        kinds = [e.opcode for e in client.events_received() if isinstance(e, Frame)]
        assert kinds == [Opcode.PING, Opcode.CLOSE]
        assert client.close_rcvd == Close(1011, "keepalive ping timeout") and session.ended == 1
    asyncio.run(scenario())
