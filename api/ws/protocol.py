"""uvicorn's WebSocket protocol, tuned for a frame per message, and the sessions' frame writer.

Role: uvicorn's sans-I/O WebSocket protocol stops reading the socket after every frame it
queues for the application and starts again once the application took it: two ``epoll_ctl``
system calls per received frame. A Pulsar WebSocket client sends a frame per message and per
acknowledgement, so that was a measurable share of the event loop's time per message. Sending
goes through an awaited ASGI ``send`` per frame, one socket write each; the protocol here also
offers the application a synchronous write of several frames at once (the ASGI scope's
``extensions`` carry it), which :class:`FrameWriter` uses whenever the peer keeps up.

Invariants:
- The receive queue stays bounded. Reading pauses once ``WS_RECEIVE_QUEUE_FRAMES_MAX`` frames
  wait for the application and resumes when the application has drained the queue (the base
  class's resume rule, unchanged), so a client that floods frames is still held back by TCP.
- A session's frames leave in the order it handed them over, whichever way they go: directly
  while the transport accepts writes, through awaited sends once it has paused writing (the
  peer reads slower than the session writes), never both at once.
- What waits for a slow peer is bounded: ``FrameWriter.room()`` holds a session back while
  ``backlog_frames_max`` frames wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence

from starlette.websockets import WebSocket
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.http11 import Request

from api.connection_guard import release_connection

log = logging.getLogger(__name__)

WS_RECEIVE_QUEUE_FRAMES_MAX = 256
"""Received frames queued for the application before the socket stops being read."""

QUEUED_FRAMES_EXTENSION = "magnetar.websocket.queued_frames"
"""ASGI scope extension: ``take(frames_max) -> list[str]`` hands over, without waiting, the text
frames already received and queued for the application, in order, up to ``frames_max``; it stops
at anything else (a binary frame, a disconnect), which the next ``receive`` returns."""

DIRECT_WRITE_EXTENSION = "magnetar.websocket.write_frames"
"""ASGI scope extension: ``write(frames) -> bool`` writes text frames now, or returns False
(nothing written) when the connection cannot take them without waiting."""


class MagnetarWebSocketProtocol(WebSocketsSansIOProtocol):
    """Pauses reading only when ``WS_RECEIVE_QUEUE_FRAMES_MAX`` frames are queued; offers the
    application a direct multi-frame write."""

    def connection_lost(self, exc: Exception | None) -> None:
        release_connection(self.transport)  # the listener's slot, taken when it was still HTTP
        super().connection_lost(exc)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the upgrade was accepted: the application task starts next
            scope["extensions"][DIRECT_WRITE_EXTENSION] = self.write_frames_now
            scope["extensions"][QUEUED_FRAMES_EXTENSION] = self.take_queued_frames

    def take_queued_frames(self, frames_max: int) -> list[str]:
        """The queued text frames, up to ``frames_max`` (see ``QUEUED_FRAMES_EXTENSION``); reading
        resumes, as after ``receive``, once the queue is empty."""
        queue = self.queue
        waiting = queue._queue  # type: ignore[attr-defined]  # asyncio.Queue's deque: peeked, never changed here
        texts: list[str] = []
        while waiting and len(texts) < frames_max:
            event = waiting[0]
            text = event.get("text") if event["type"] == "websocket.receive" else None
            if text is None:
                break
            queue.get_nowait()
            texts.append(text)
        if self.read_paused and queue.empty():
            self.read_paused = False
            self.transport.resume_reading()
        return texts

    def write_frames_now(self, frames: Sequence[str]) -> bool:
        """All of ``frames`` in one socket write, if the connection is open and the transport is
        not paused for writing; otherwise write nothing and return False."""
        if not self.writable.is_set() or self.disconnected or self.close_sent or not self.handshake_complete \
                or self.initial_response is not None or self.transport.is_closing():
            return False
        try:
            for text in frames:
                self.conn.send_text(text.encode())
        except InvalidState:
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def send_receive_event_to_app(self) -> None:
        paused = self.read_paused
        self.read_paused = True  # the base class pauses after every frame unless already paused
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = paused
        if not self.read_paused and self.queue.qsize() >= WS_RECEIVE_QUEUE_FRAMES_MAX:
            self.read_paused = True
            self.transport.pause_reading()


class FrameWriter:
    """A session's outgoing text frames, in order, written without a task switch per frame.

    ``send`` is synchronous (call it on the event loop): frames go straight to the socket, a
    burst in one write, while the peer keeps up. Once the transport pauses writing (or the server
    offers no direct write), frames queue and a drain task sends them with awaited ASGI sends;
    ``room()`` waits while ``backlog_frames_max`` frames are queued, ``flush()`` until none is.
    ``on_drained`` is called whenever a backlog has been written out.
    """

    def __init__(self, websocket: WebSocket, backlog_frames_max: int,
                 on_drained: Callable[[], None] | None = None) -> None:
        self._ws = websocket
        extensions = websocket.scope.get("extensions") or {}
        self._write_now: Callable[[Sequence[str]], bool] | None = extensions.get(DIRECT_WRITE_EXTENSION)
        self._backlog: deque[str] = deque()
        self._backlog_frames_max = max(1, backlog_frames_max)
        self._below_max = asyncio.Event()
        self._below_max.set()
        self._on_drained = on_drained
        self._drainer: asyncio.Task[None] | None = None
        self._broken = False

    @property
    def backlogged(self) -> bool:
        """Frames are waiting for the peer (or for the drain task)."""
        return bool(self._backlog)

    def send(self, frames: Sequence[str]) -> None:
        if not frames or self._broken:
            return
        if not self._backlog and self._write_now is not None and self._write_now(frames):
            return
        self._backlog.extend(frames)
        if len(self._backlog) >= self._backlog_frames_max:
            self._below_max.clear()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def room(self) -> None:
        """Wait until fewer than ``backlog_frames_max`` frames are queued."""
        await self._below_max.wait()

    async def flush(self) -> None:
        """Wait until every frame handed over so far was written (or the peer is gone)."""
        while self._drainer is not None and not self._drainer.done():
            await asyncio.wait([self._drainer])

    async def _drain(self) -> None:
        try:
            while self._backlog:
                await self._ws.send_text(self._backlog[0])  # waits while writing is paused
                self._backlog.popleft()
                if self._backlog and self._write_now is not None and self._write_now(list(self._backlog)):
                    self._backlog.clear()
                if len(self._backlog) < self._backlog_frames_max:
                    self._below_max.set()
        except Exception as exc:  # the peer is gone: nothing queued can be written any more
            self._broken = True
            self._backlog.clear()
            self._below_max.set()
            log.debug("WebSocket frames dropped: %s", exc)
            return
        if self._on_drained is not None:
            try:
                self._on_drained()
            except Exception:
                log.exception("a WebSocket session failed to go on after its backlog was written")
