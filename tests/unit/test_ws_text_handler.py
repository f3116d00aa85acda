"""Client frames applied on the protocol's callback never overtake frames still in the queue.

Consumer and reader sessions apply acknowledgements straight from the socket read that brought
them (``TEXT_HANDLER_EXTENSION``), and through the receive queue and ``command_loop`` otherwise.
The protocol hands a read's frames to the handler only while its queue is empty (tested in
``test_ws_protocol.py``); ``command_loop`` refuses them while it still applies frames it took from
the queue, tested here over a small stand-in for Starlette's ``WebSocket`` (its scope and
``receive``), since the order is decided there and not in the socket.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, cast

from fastapi import WebSocket

from api.ws.protocol import QUEUED_FRAMES_EXTENSION, TEXT_HANDLER_EXTENSION, FrameWriter
from api.ws.session import command_loop


class _Session:
    """What ``command_loop`` uses of Starlette's ``WebSocket``: the scope's extensions and
    ``receive``; frames reach it through ``arrive`` as a socket read would bring them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.handler: Callable[[list[str]], int] | None = None
        self.scope = {"extensions": {QUEUED_FRAMES_EXTENSION: self._take, TEXT_HANDLER_EXTENSION: self._install}}

    def _install(self, handler: Callable[[list[str]], int] | None) -> None:
        self.handler = handler

    def _take(self, frames_max: int) -> list[str]:
        texts: list[str] = []
        while not self.queue.empty() and len(texts) < frames_max:
            texts.append(self.queue.get_nowait()["text"])
        return texts

    def arrive(self, *texts: str) -> None:
        rest = list(texts)
        if self.handler is not None and self.queue.empty():
            rest = rest[self.handler(rest):]
        for text in rest:
            self.queue.put_nowait({"type": "websocket.receive", "text": text})

    async def receive(self) -> dict[str, Any]:
        return await self.queue.get()


class _Writer:
    def __init__(self) -> None:
        self.frames: list[str] = []

    def send(self, frames: list[str]) -> None:
        self.frames.extend(frames)


def test_command_loop_applies_frames_in_arrival_order_whichever_way_they_come() -> None:
    async def scenario() -> None:
        session, writer = _Session(), _Writer()
        applied: list[str] = []
        release = asyncio.Event()

        def apply(frame: dict[str, Any]) -> bool:
            if frame.get("type") == "slow":
                return False  # needs the task: it waits
            applied.append(frame["messageId"])
            return True

        async def handle(frame: dict[str, Any]) -> bool:
            if frame.get("type") == "slow":
                await release.wait()
                applied.append("slow")
                return False
            apply(frame)
            return False

        loop_task = asyncio.create_task(command_loop(cast(WebSocket, session), handle, cast(FrameWriter, writer),
                                                     apply))
        await asyncio.sleep(0)  # the loop installs its handler and waits for a frame
        assert session.handler is not None

        session.arrive('{"messageId":"a"}', '{"messageId":"b"}')  # applied at once
        assert applied == ["a", "b"] and session.queue.empty()

        session.arrive('{"messageId":"c"}', '{"type":"slow"}', '{"messageId":"d"}')
        assert applied == ["a", "b", "c"]  # the slow frame and what follows go to the loop
        for _ in range(3):
            await asyncio.sleep(0)
        assert session.queue.empty()  # the loop took them and waits inside the slow frame

        session.arrive('{"messageId":"e"}')  # the loop still has "d" in hand: "e" waits
        assert applied == ["a", "b", "c"]

        release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert applied == ["a", "b", "c", "slow", "d", "e"]

        session.arrive("not json", '{"messageId":"f"}')  # a bad frame is answered, the rest applied
        assert applied[-1] == "f"
        assert [json.loads(frame)["result"] for frame in writer.frames] == ["error:3"]

        session.queue.put_nowait({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(loop_task, 5)
        assert session.handler is None  # uninstalled when the session's loop ends

    asyncio.run(scenario())
