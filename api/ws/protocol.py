"""uvicorn's WebSocket protocol, tuned for a frame per message, and the sessions' frame writer.

Role: uvicorn's sans-I/O WebSocket protocol stops reading the socket after every frame it
queues for the application and starts again once the application took it: two ``epoll_ctl``
system calls per received frame. A Pulsar WebSocket client sends a frame per message and per
acknowledgement, so that was a measurable share of the event loop's time per message. Sending
goes through an awaited ASGI ``send`` per frame, one socket write each; the protocol here also
offers the application a synchronous write of several frames at once (the ASGI scope's
``extensions`` carry it), which :class:`FrameWriter` uses whenever the peer keeps up. On a WSS
connection whose client certificate verified, the extensions also carry that certificate's
``TlsPeer`` (``api/tls.py``), for ``AuthenticationProviderTls``.

Invariants:
- The receive queue stays bounded. Reading pauses once ``WS_RECEIVE_QUEUE_FRAMES_MAX`` frames,
  or ``WS_RECEIVE_QUEUE_BYTES_MAX`` bytes of frames, wait for the application (counted since the
  queue was last empty) and resumes when the application has drained the queue (the base class's
  resume rule, unchanged), so a client that floods frames is still held back by TCP.
- A session's frames leave in the order it handed them over, whichever way they go: directly
  while the transport accepts writes, through awaited sends once it has paused writing (the
  peer reads slower than the session writes), never both at once.
- What waits for a slow peer is bounded: ``FrameWriter.room()`` holds a session back while
  ``backlog_frames_max`` frames or ``WS_BACKLOG_BYTES_MAX`` bytes of frames wait; a session
  sends more only after ``room()`` (a reader) or while nothing waits (a consumer).
- A frame larger than the listener's ``ws_frame_bytes_max`` (``webSocketMaxTextFrameSize``) is
  never read, whatever size its header declares: the connection is closed with 1009 and the
  reason, and logged once at warning. The close frame reaches the peer: the socket is
  half-closed after it and the rest of the peer's data is read and dropped until the peer closes
  (or ``close_timeout`` passes), instead of closing with unread data, which makes the kernel
  answer with a reset that can overtake the close frame. Smaller frames reach the session,
  which answers a message over the broker's size bound with ``send-error``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Callable, Sequence

from starlette.websockets import WebSocket
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState, PayloadTooBig
from websockets.http11 import Request
from websockets.protocol import State

from api.connection_guard import release_connection
from api.tls import TLS_PEER_EXTENSION, tls_peer_of

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C speedups
    from websockets.utils import apply_mask

log = logging.getLogger(__name__)

_U16 = struct.Struct(">H").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_U16_PACK = struct.Struct(">H").pack
_U64_PACK = struct.Struct(">Q").pack
_TEXT_SHORT = [bytes((0x81, size)) for size in range(126)]
"""Unmasked server text frame headers (FIN, opcode 1) by payload size below 126."""
_TEXT_MEDIUM = b"\x81\x7e"
_TEXT_LONG = b"\x81\x7f"

WS_RECEIVE_QUEUE_FRAMES_MAX = 256
"""Received frames queued for the application before the socket stops being read."""
WS_RECEIVE_QUEUE_BYTES_MAX = 4 * 1024 * 1024
"""Bytes of received frames queued for the application before the socket stops being read (a
frame up to ``ws_frame_bytes_max`` is still taken whole)."""

QUEUED_FRAMES_EXTENSION = "magnetar.websocket.queued_frames"
"""ASGI scope extension: ``take(frames_max) -> list[str]`` hands over, without waiting, the text
frames already received and queued for the application, in order, up to ``frames_max``; it stops
at anything else (a binary frame, a disconnect), which the next ``receive`` returns."""

TEXT_HANDLER_EXTENSION = "magnetar.websocket.text_handler"
"""ASGI scope extension: ``install(handler | None)``. While a handler is installed, the text frames
of a socket read that finds the receive queue empty go to ``handler(texts)`` at once, on the event
loop, instead of through the queue and ``receive``; the handler returns how many of them it
applied, in order, and the rest are queued as before (and so is everything after them until the
application has drained the queue), so frames are applied in the order they arrived."""

WS_BACKLOG_BYTES_MAX = 1024 * 1024
"""Characters of text frames a session's ``FrameWriter`` queues for a peer that reads slower
than the session writes before ``room()`` holds the session back (frames are ASCII JSON with
base64 payloads, so characters are bytes)."""

DIRECT_WRITE_EXTENSION = "magnetar.websocket.write_frames"
"""ASGI scope extension: ``write(frames) -> bool`` writes text frames now, or returns False
(nothing written) when the connection cannot take them without waiting."""


class MagnetarWebSocketProtocol(WebSocketsSansIOProtocol):
    """Pauses reading only when ``WS_RECEIVE_QUEUE_FRAMES_MAX`` frames are queued; offers the
    application a direct multi-frame write; reads whole text frames itself.

    The frames a client sends on an open connection are nearly all whole, masked, uncompressed
    text frames (one per message or acknowledgement). Those are split, unmasked (websockets' C
    ``apply_mask``) and queued here, several per read, at a fraction of what the websockets parser
    costs per frame; a consumer or reader session that installed a text handler gets them at
    once instead, while nothing waits in the queue (``TEXT_HANDLER_EXTENSION``). Every other
    whole frame (ping, pong, close, binary) is handed to the websockets connection as it is, at a
    frame boundary, so the connection's parser and state stay exactly as if it had read
    everything. Anything else (a fragment, reserved bits set by a
    negotiated extension, an unmasked frame, a frame over the size bound) hands that frame and
    everything after it to the websockets parser for the rest of the connection, which answers it
    as it always does; text that is not UTF-8 closes the connection with 1007. At most one
    incomplete frame (bounded by the size bound) waits for the rest of its bytes.
    """

    _fast_frames = True
    _partial = b""
    _text_handler: Callable[[list[str]], int] | None = None
    _queued_bytes = 0
    """Bytes of frames queued since the queue was last found empty."""

    closed_oversized = False
    """The peer sent a frame over the bound: closed with 1009, its further data is dropped."""

    def connection_lost(self, exc: Exception | None) -> None:
        release_connection(self.transport)  # the listener's slot, taken when it was still HTTP
        super().connection_lost(exc)

    def handle_parser_exception(self) -> None:
        """An oversized frame: 1009 with its reason, then drop what the peer still sends (the
        parser discards it) until it closes; any other protocol error as uvicorn handles it."""
        if not isinstance(self.conn.parser_exc, PayloadTooBig):
            super().handle_parser_exception()
            return
        if self.closed_oversized:
            return  # a later chunk of the peer's data, already dropped by the parser
        self.closed_oversized = True
        close = self.conn.close_sent
        code, reason = (close.code, close.reason) if close is not None else (1009, str(self.conn.parser_exc))
        path = getattr(self, "scope", {}).get("path", "?")  # the path only: a ?token= stays out of the log
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
        log.warning("WebSocket %s from %s closed with %d: %s (webSocketMaxTextFrameSize)", path, peer, code, reason)
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.close_sent = True
        self.stop_keepalive()
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the upgrade was accepted: the application task starts next
            scope["extensions"][DIRECT_WRITE_EXTENSION] = self.write_frames_now
            scope["extensions"][QUEUED_FRAMES_EXTENSION] = self.take_queued_frames
            scope["extensions"][TEXT_HANDLER_EXTENSION] = self.install_text_handler
            peer = tls_peer_of(self.transport)
            if peer is not None:  # a WSS handshake with a verified client certificate
                scope["extensions"][TLS_PEER_EXTENSION] = peer

    def install_text_handler(self, handler: Callable[[list[str]], int] | None) -> None:
        """See ``TEXT_HANDLER_EXTENSION``; None goes back to queueing every frame."""
        self._text_handler = handler

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

    def data_received(self, data: bytes) -> None:
        if not self._fast_frames:
            super().data_received(data)
            return
        if self._partial:
            data, self._partial = self._partial + data, b""
        if not self._open_for_frames():
            self._fast_frames = self.handshake_complete is False and not self.close_sent
            super().data_received(data)
            return
        self._read_frames(data)

    def _open_for_frames(self) -> bool:
        return self.handshake_complete and not self.close_sent and self.conn.state is State.OPEN \
            and not self.conn.expect_continuation_frame

    def _read_frames(self, buf: bytes) -> None:
        end, pos = len(buf), 0
        limit = self.conn.max_message_size
        texts: list[str] = []
        while end - pos >= 6:
            first, second = buf[pos], buf[pos + 1]
            length, head = second & 0x7F, pos + 2
            if length == 126:
                length, head = _U16(buf, head)[0], head + 2
            elif length == 127:
                if end - head < 8:
                    break
                length, head = _U64(buf, head)[0], head + 8
            if first & 0xF0 != 0x80 or not second & 0x80 or (limit is not None and length > limit):
                self._hand_over(texts, buf[pos:])  # a fragment, RSV bits, unmasked, too large
                return
            start = head + 4
            if end - start < length:
                break
            if first != 0x81:  # a whole frame of another kind: the connection's, at a boundary
                self._deliver(texts)
                texts = []
                super().data_received(buf[pos : start + length])
                pos = start + length
                if not self._open_for_frames():
                    self._hand_over([], buf[pos:])
                    return
                continue
            try:
                texts.append(apply_mask(buf[start : start + length], buf[head:start]).decode())
            except UnicodeDecodeError:
                self._deliver(texts)
                self._close_invalid_text()
                return
            pos = start + length
        if pos < end:
            self._partial = buf[pos:]
        self._deliver(texts)

    def _close_invalid_text(self) -> None:
        """A text frame that is not UTF-8: close with 1007 (RFC 6455 7.4.1), logged once at
        warning without a traceback (a client's mistake, not the broker's)."""
        self._fast_frames = False
        path = getattr(self, "scope", {}).get("path", "?")  # the path only: a ?token= stays out of the log
        log.warning("WebSocket %s from %s closed with 1007: a text frame is not UTF-8", path,
                    f"{self.client[0]}:{self.client[1]}" if self.client else "?")
        self.conn.send_close(1007, "a text frame is not UTF-8")
        self.handle_parser_exception()

    def _hand_over(self, texts: list[str], rest: bytes) -> None:
        """Queue ``texts``, then let the websockets parser read ``rest`` and all that follows."""
        self._deliver(texts)
        self._fast_frames = False
        if rest:
            super().data_received(rest)

    def _deliver(self, texts: list[str]) -> None:
        if not texts or self.close_sent:  # past websocket.close: discarded, as uvicorn does
            return
        handler = self._text_handler
        if handler is not None and self.queue.empty():
            applied = handler(texts)
            if applied >= len(texts):
                return
            texts = texts[applied:]
        if self.queue.empty():
            self._queued_bytes = 0
        put = self.queue.put_nowait
        for text in texts:
            put({"type": "websocket.receive", "text": text})
        self._queued_bytes += sum(map(len, texts))
        self._pause_when_full()

    def _pause_when_full(self) -> None:
        if not self.read_paused and (self.queue.qsize() >= WS_RECEIVE_QUEUE_FRAMES_MAX
                                     or self._queued_bytes >= WS_RECEIVE_QUEUE_BYTES_MAX):
            self.read_paused = True
            self.transport.pause_reading()

    def write_frames_now(self, frames: Sequence[str]) -> bool:
        """All of ``frames`` in one socket write, if the connection is open and the transport is
        not paused for writing; otherwise write nothing and return False."""
        if not self.writable.is_set() or self.disconnected or self.close_sent or not self.handshake_complete \
                or self.initial_response is not None or self.transport.is_closing():
            return False
        if self.conn.state is not State.OPEN or self.conn.extensions:  # compression: websockets writes
            try:
                for text in frames:
                    self.conn.send_text(text.encode())
            except InvalidState:
                return False
            self.transport.write(b"".join(self.conn.data_to_send()))
            return True
        parts = self.conn.data_to_send()  # whatever the connection queued (a pong) goes first
        for text in frames:
            payload = text.encode()
            size = len(payload)
            if size < 126:
                parts.append(_TEXT_SHORT[size])
            elif size < 65536:
                parts.append(_TEXT_MEDIUM + _U16_PACK(size))
            else:
                parts.append(_TEXT_LONG + _U64_PACK(size))
            parts.append(payload)
        self.transport.write(b"".join(parts))
        return True

    def send_receive_event_to_app(self) -> None:
        if self.queue.empty():
            self._queued_bytes = 0
        paused = self.read_paused
        self.read_paused = True  # the base class pauses after every frame unless already paused
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = paused
        queued = self.queue._queue  # type: ignore[attr-defined]  # asyncio.Queue's deque: peeked, never changed here
        if queued:
            last = queued[-1]
            self._queued_bytes += len(last.get("text") or last.get("bytes") or "")
        self._pause_when_full()


class FrameWriter:
    """A session's outgoing text frames, in order, written without a task switch per frame.

    ``send`` is synchronous (call it on the event loop): frames go straight to the socket, a
    burst in one write, while the peer keeps up. Once the transport pauses writing (or the server
    offers no direct write), frames queue and a drain task sends them with awaited ASGI sends;
    ``room()`` waits while ``backlog_frames_max`` frames or ``backlog_bytes_max`` characters are
    queued, ``flush()`` until none is. ``on_drained`` is called whenever a backlog has been
    written out.
    """

    def __init__(self, websocket: WebSocket, backlog_frames_max: int,
                 on_drained: Callable[[], None] | None = None, *,
                 backlog_bytes_max: int = WS_BACKLOG_BYTES_MAX) -> None:
        self._ws = websocket
        extensions = websocket.scope.get("extensions") or {}
        self._write_now: Callable[[Sequence[str]], bool] | None = extensions.get(DIRECT_WRITE_EXTENSION)
        self._backlog: deque[str] = deque()
        self._backlog_bytes = 0
        self._backlog_frames_max = max(1, backlog_frames_max)
        self._backlog_bytes_max = backlog_bytes_max
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
        self._backlog_bytes += sum(map(len, frames))
        if self._over_max():
            self._below_max.clear()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    def _over_max(self) -> bool:
        return len(self._backlog) >= self._backlog_frames_max or self._backlog_bytes >= self._backlog_bytes_max

    async def room(self) -> None:
        """Wait until fewer than ``backlog_frames_max`` frames and ``backlog_bytes_max``
        characters are queued."""
        await self._below_max.wait()

    async def flush(self) -> None:
        """Wait until every frame handed over so far was written (or the peer is gone)."""
        while self._drainer is not None and not self._drainer.done():
            await asyncio.wait([self._drainer])

    async def _drain(self) -> None:
        try:
            while self._backlog:
                await self._ws.send_text(self._backlog[0])  # waits while writing is paused
                self._backlog_bytes -= len(self._backlog.popleft())
                if self._backlog and self._write_now is not None and self._write_now(list(self._backlog)):
                    self._backlog.clear()
                    self._backlog_bytes = 0
                if not self._over_max():
                    self._below_max.set()
        except Exception as exc:  # the peer is gone: nothing queued can be written any more
            self._broken = True
            self._backlog.clear()
            self._backlog_bytes = 0
            self._below_max.set()
            log.debug("WebSocket frames dropped: %s", exc)
            return
        if self._on_drained is not None:
            try:
                self._on_drained()
            except Exception:
                log.exception("a WebSocket session failed to go on after its backlog was written")
