"""The WebSocket protocol pauses socket reads by queue depth: never per frame, always at the bound;
a session's text handler takes a read's frames only while nothing waits in the queue.

A recording transport stands in for the socket (the protocol's own code is what is tested);
the real protocol runs under every WebSocket integration test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from api.ws.protocol import WS_RECEIVE_QUEUE_FRAMES_MAX, MagnetarWebSocketProtocol


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.pauses = 0
        self.resumes = 0

    def pause_reading(self) -> None:
        self.pauses += 1

    def resume_reading(self) -> None:
        self.resumes += 1

    def is_closing(self) -> bool:
        return False


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """Never called: the test feeds the protocol frames directly."""


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


def _protocol(loop: asyncio.AbstractEventLoop, transport: RecordingTransport) -> MagnetarWebSocketProtocol:
    config = uvicorn.Config(_app, ws=MagnetarWebSocketProtocol, log_config=None)
    config.load()
    protocol = MagnetarWebSocketProtocol(config, ServerState(), {}, _loop=loop)
    protocol.transport = transport
    protocol.curr_msg_data_type = "text"
    return protocol


def _receive_frame(protocol: MagnetarWebSocketProtocol, text: str) -> None:
    protocol.frames = [text.encode()]
    protocol.send_receive_event_to_app()


def test_reading_pauses_at_the_queue_bound_and_resumes_once_drained(loop: asyncio.AbstractEventLoop) -> None:
    transport = RecordingTransport()
    protocol = _protocol(loop, transport)
    for index in range(WS_RECEIVE_QUEUE_FRAMES_MAX - 1):
        _receive_frame(protocol, f"frame {index}")
    assert transport.pauses == 0 and not protocol.read_paused
    _receive_frame(protocol, "the frame that fills the queue")
    assert transport.pauses == 1 and protocol.read_paused
    _receive_frame(protocol, "already buffered by the socket")
    assert transport.pauses == 1  # paused once, not again
    received = [loop.run_until_complete(protocol.receive()) for _ in range(WS_RECEIVE_QUEUE_FRAMES_MAX + 1)]
    assert [event["text"] for event in received[:2]] == ["frame 0", "frame 1"]
    assert received[-1]["text"] == "already buffered by the socket"
    assert transport.resumes == 1 and not protocol.read_paused
    _receive_frame(protocol, "after the resume")
    assert transport.pauses == 1 and protocol.queue.qsize() == 1


def _queued(protocol: MagnetarWebSocketProtocol) -> list[str]:
    return [event["text"] for event in protocol.queue._queue]  # type: ignore[attr-defined]


def test_the_handler_takes_a_read_only_while_the_queue_is_empty(loop: asyncio.AbstractEventLoop) -> None:
    protocol = _protocol(loop, RecordingTransport())
    applied: list[str] = []

    def handler(texts: list[str]) -> int:
        for index, text in enumerate(texts):
            if text.startswith("wait"):
                return index  # a frame the session must apply on its task
            applied.append(text)
        return len(texts)

    protocol.install_text_handler(handler)
    protocol._deliver(["ack 1", "ack 2"])  # the fast frame path's hand-over of one socket read
    assert applied == ["ack 1", "ack 2"] and protocol.queue.empty()

    protocol._deliver(["ack 3", "wait", "ack 4"])
    assert applied == ["ack 1", "ack 2", "ack 3"]
    assert _queued(protocol) == ["wait", "ack 4"]

    protocol._deliver(["ack 5"])  # the queue is not empty: behind it, not to the handler
    assert applied == ["ack 1", "ack 2", "ack 3"]
    assert _queued(protocol) == ["wait", "ack 4", "ack 5"]

    for _ in range(3):
        protocol.queue.get_nowait()
    protocol._deliver(["ack 6"])
    assert applied[-1] == "ack 6" and protocol.queue.empty()

    protocol.install_text_handler(None)
    protocol._deliver(["ack 7"])
    assert applied[-1] == "ack 6" and _queued(protocol) == ["ack 7"]
