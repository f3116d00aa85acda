"""Running a WebSocket session: accept, supervise its tasks, apply its commands, close.

Role: what every session kind shares. ``serve`` accepts the upgrade and runs a session to its
end, closing the socket if it is still open; ``supervise`` runs a session's receive loop beside
its worker tasks and turns a failed worker into a close with 1011 and its reason (never a silent,
stalled session); ``command_loop`` applies consumer and reader frames one by one, answering a
bad frame with ``{"result": "error:<n>", "errorMsg"}`` and going on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from api.ws.frames import (
    JSON_DESERIALIZE_ERROR,
    UNKNOWN_ERROR,
    FrameError,
    frame_text,
    parse_frame,
    receive_text,
    short,
)
from api.ws.protocol import QUEUED_FRAMES_EXTENSION, TEXT_HANDLER_EXTENSION, FrameWriter
from broker import MagnetarError

log = logging.getLogger(__name__)

PERMITS_PER_FRAME_MAX = 100_000
COMMAND_FRAMES_PER_TURN_MAX = 1000
"""Client frames (acknowledgements mostly) a consumer or reader session applies in one turn: those
already received when it takes the first."""


async def command_loop(websocket: WebSocket, handle: Callable[[dict[str, Any]], Awaitable[bool]],
                        writer: FrameWriter, handle_now: Callable[[dict[str, Any]], bool] | None = None) -> None:
    """Consumer and reader sessions: apply each client frame with ``handle`` (True ends the
    session); a bad frame is answered with ``{"result": "error:<n>", "errorMsg"}`` (after the
    frames already on their way) and the session goes on.

    With ``handle_now`` (and a server that offers ``TEXT_HANDLER_EXTENSION``), frames that arrive
    while this loop has nothing in hand are applied at once on the protocol's callback, without
    the receive queue, a task switch and ASGI's ``receive`` per socket read: ``handle_now``
    returns False for a frame that needs ``handle`` (one that awaits), which then takes that
    frame and every later one, in order. An error other than a refusal leaves the frame to
    ``handle`` too, where it ends the session as it always did."""
    extensions = websocket.scope.get("extensions") or {}
    take_queued: Callable[[int], list[str]] | None = extensions.get(QUEUED_FRAMES_EXTENSION)
    install: Callable[[Callable[[list[str]], int] | None], None] | None = \
        extensions.get(TEXT_HANDLER_EXTENSION) if handle_now is not None else None
    in_hand = False

    def apply_now(texts: list[str]) -> int:
        if in_hand or handle_now is None:
            return 0  # frames taken from the queue are still being applied: these wait their turn
        for index, one in enumerate(texts):
            try:
                if not handle_now(parse_frame(one)):
                    return index
            except (FrameError, MagnetarError) as exc:
                writer.send([error_frame(exc)])
            except Exception:  # applied again by ``handle``, where it ends the session
                return index
        return len(texts)

    if install is not None:
        install(apply_now)
    try:
        while (text := await receive_text(websocket)) is not None:
            in_hand = True
            texts = [text]
            if take_queued is not None:
                texts += take_queued(COMMAND_FRAMES_PER_TURN_MAX)  # the frames that arrived with it
            for one in texts:
                try:
                    if await handle(parse_frame(one)):
                        return
                except (FrameError, MagnetarError) as exc:
                    writer.send([error_frame(exc)])
            in_hand = False
    finally:
        if install is not None:
            install(None)


def error_frame(exc: FrameError | MagnetarError) -> str:
    """A consumer's or reader's answer to a frame it cannot apply."""
    if isinstance(exc, FrameError):
        return frame_text({"result": f"error:{exc.result_code}", "errorMsg": short(str(exc))})
    return frame_text({"result": f"error:{UNKNOWN_ERROR}", "errorCode": exc.code, "errorMsg": short(str(exc))})


def permits_of(frame: dict[str, Any]) -> int:
    permits = frame.get("permitMessages")
    if isinstance(permits, bool) or not isinstance(permits, int) or not 0 < permits <= PERMITS_PER_FRAME_MAX:
        raise FrameError(JSON_DESERIALIZE_ERROR, f"permitMessages must be an integer in 1..{PERMITS_PER_FRAME_MAX}")
    return permits



async def supervise(websocket: WebSocket, receive: Coroutine[Any, Any, None],
                     workers: list[asyncio.Task[None]]) -> bool:
    """Run a session's receive loop beside its worker tasks. True when the client left (or the
    session ended normally); a worker that fails closes the socket with 1011 and its reason
    instead of leaving the client waiting on a stalled session."""
    receiver = asyncio.create_task(receive)
    done, _ = await asyncio.wait([receiver, *workers], return_when=asyncio.FIRST_COMPLETED)
    if receiver in done:
        receiver.result()
        return True
    receiver.cancel()
    failed = next(task for task in done)
    error = failed.exception()
    if error is None or isinstance(error, WebSocketDisconnect):
        return False
    log.error("WebSocket session failed", exc_info=error)
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await websocket.close(1011, short(f"{getattr(error, 'code', 'internal_error')}: {error}")[:120])
    return False


async def serve(websocket: WebSocket, run: Callable[[], Awaitable[None]],
                 on_refused: Callable[[], None] | None = None) -> None:
    try:
        await websocket.accept()
    except (WebSocketDisconnect, RuntimeError):
        if on_refused is not None:
            on_refused()
        return
    try:
        await run()
    except WebSocketDisconnect:
        pass
    finally:
        if websocket.application_state is not WebSocketState.DISCONNECTED and \
                websocket.client_state is not WebSocketState.DISCONNECTED:
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await websocket.close()
