"""FrameWriter: frames leave in order, directly while the connection takes them, through a
backlog bounded in frames and in bytes while it does not.

A recording WebSocket stands in for Starlette's (the writer's own logic is what is tested); the
real protocol's direct write runs under every WebSocket integration test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

from starlette.websockets import WebSocket

from api.ws.protocol import DIRECT_WRITE_EXTENSION, FrameWriter


class RecordingSocket:
    """Direct writes succeed while ``open``; awaited sends wait until ``open`` again."""

    def __init__(self, direct: bool = True) -> None:
        self.wire: list[str] = []
        self.direct_writes = 0
        self.open = asyncio.Event()
        self.open.set()
        self.scope: dict[str, Any] = {"extensions": {DIRECT_WRITE_EXTENSION: self._write_now} if direct else {}}
        self.gone = False

    def _write_now(self, frames: Sequence[str]) -> bool:
        if not self.open.is_set():
            return False
        self.direct_writes += 1
        self.wire += frames
        return True

    async def send_text(self, text: str) -> None:
        await self.open.wait()
        if self.gone:
            raise RuntimeError("the peer left")
        self.wire.append(text)


def _writer(socket: RecordingSocket, limit: int, on_drained: Any = None) -> FrameWriter:
    return FrameWriter(cast(WebSocket, socket), limit, on_drained=on_drained)


def test_a_burst_goes_out_in_one_direct_write() -> None:
    async def scenario() -> None:
        socket = RecordingSocket()
        writer = _writer(socket, 4)
        writer.send(["a", "b", "c"])
        writer.send([])
        assert socket.wire == ["a", "b", "c"] and socket.direct_writes == 1 and not writer.backlogged
    asyncio.run(scenario())


def test_paused_writes_queue_in_order_and_the_bound_holds_the_session_back() -> None:
    async def scenario() -> None:
        socket = RecordingSocket()
        drained: list[int] = []
        writer = _writer(socket, 3, on_drained=lambda: drained.append(len(socket.wire)))
        writer.send(["1"])
        socket.open.clear()  # the transport paused writing: the peer reads slowly
        writer.send(["2", "3"])
        room = asyncio.create_task(writer.room())
        await asyncio.sleep(0)
        assert room.done()  # two queued, under the bound of three
        writer.send(["4"])
        assert writer.backlogged
        room = asyncio.create_task(writer.room())
        await asyncio.sleep(0.01)
        assert not room.done()  # three queued: the session must wait
        socket.open.set()
        writer.send(["5"])  # behind the backlog, not before it
        await writer.flush()
        await asyncio.wait_for(room, 1)
        assert socket.wire == ["1", "2", "3", "4", "5"]
        assert drained == [5] and not writer.backlogged
    asyncio.run(scenario())


def test_without_a_direct_write_frames_still_go_out_in_order() -> None:
    async def scenario() -> None:
        socket = RecordingSocket(direct=False)
        writer = _writer(socket, 10)
        writer.send(["x", "y"])
        writer.send(["z"])
        await writer.flush()
        assert socket.wire == ["x", "y", "z"] and socket.direct_writes == 0
    asyncio.run(scenario())


def test_a_departed_peer_drops_the_backlog_and_releases_waiters() -> None:
    async def scenario() -> None:
        socket = RecordingSocket()
        writer = _writer(socket, 1)
        socket.open.clear()
        writer.send(["lost", "also lost"])
        socket.gone = True
        socket.open.set()
        await writer.flush()
        await asyncio.wait_for(writer.room(), 1)
        writer.send(["after"])  # ignored: nobody is there
        await writer.flush()
        assert socket.wire == [] and not writer.backlogged
    asyncio.run(scenario())


def test_a_few_large_frames_hold_the_session_back_by_their_bytes() -> None:
    async def scenario() -> None:
        socket = RecordingSocket()
        writer = FrameWriter(cast(WebSocket, socket), 1000, backlog_bytes_max=100)
        socket.open.clear()
        writer.send(["x" * 60])
        room = asyncio.create_task(writer.room())
        await asyncio.sleep(0)
        assert room.done()  # 60 characters queued, under the bound of 100
        writer.send(["y" * 60])
        room = asyncio.create_task(writer.room())
        await asyncio.sleep(0.01)
        assert not room.done()  # two frames, far under 1,000 frames, but 120 characters
        socket.open.set()
        await writer.flush()
        await asyncio.wait_for(room, 1)
        assert socket.wire == ["x" * 60, "y" * 60]
    asyncio.run(scenario())
