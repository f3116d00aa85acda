"""What one WebSocket connection sends: one route out, one write per turn of the loop, bounded for a slow peer.

Role: everything a connection sends goes through its ``FrameWriter``, in the order it was handed
over: a session's text frames (``send``) and the wire's control frames (``send_bytes``: pongs,
pings, close frames). What one turn of the event loop hands over leaves in one write (one
buffer, one system call) at the end of that turn, so a burst of results or deliveries costs one
write, and a close leaves after every frame handed over before it (``flush``).

Invariants:
- Frames leave in the order they were handed over, and nothing leaves after ``stop`` (the
  connection is closing or gone; what waits is dropped).
- What waits for a slow peer is bounded: while the transport has paused writing (the peer reads
  slower than the connection writes) frames wait here, and ``has_room`` is False while
  ``frames_max`` frames or ``bytes_max`` (``WS_BACKLOG_BYTES_MAX``) bytes of frames wait. A
  session sends more only while it has room (a producer, a reader) or while nothing waits for
  the peer (``backlogged``: a consumer); ``when_room`` callbacks run once room is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from api.limits import WS_BACKLOG_BYTES_MAX
from api.ws.protocol import text_frames


class FrameWriter:
    """The frames of one connection, written once per turn of the loop (see the module docstring)."""

    __slots__ = ("_bytes", "_frames", "_loop", "_parts", "_paused", "_scheduled", "_stopped", "_transport",
                 "_waiters", "bytes_max", "frames_max")

    def __init__(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop, *, frames_max: int = 1000,
                 bytes_max: int = WS_BACKLOG_BYTES_MAX) -> None:
        self._transport = transport
        self._loop = loop
        self.frames_max = frames_max
        """Frames that may wait before ``has_room`` is False (each session kind sets its own)."""
        self.bytes_max = bytes_max
        self._parts: list[bytes] = []
        self._frames = 0
        self._bytes = 0
        self._scheduled = False
        self._paused = False
        self._stopped = False
        self._waiters: list[Callable[[], None]] = []

    def send(self, texts: Sequence[str]) -> None:
        """Text frames, written at the end of this turn of the loop (or once the peer has read)."""
        if not texts or self._stopped:
            return
        self._bytes += text_frames(texts, self._parts)
        self._frames += len(texts)
        if not self._scheduled and not self._paused:
            self._scheduled = True
            self._loop.call_soon(self._write)

    def send_bytes(self, data: Sequence[bytes]) -> None:
        """Frames already encoded (the wire's control frames), in turn with the text frames."""
        if self._stopped:
            return
        self._parts += [part for part in data if part]
        if not self._scheduled and not self._paused:
            self._scheduled = True
            self._loop.call_soon(self._write)

    def _write(self) -> None:
        self._scheduled = False
        if not self._paused:
            self.flush()

    def flush(self) -> None:
        """Write everything handed over, now (before a close frame's transport closes)."""
        if self._parts and not self._stopped:
            parts, self._parts = self._parts, []
            self._frames = self._bytes = 0
            self._transport.write(b"".join(parts))  # one buffer: one TLS record, not one per header
        if self._waiters and self.has_room:
            self._wake()

    @property
    def backlogged(self) -> bool:
        """Frames wait for the peer to read (the transport paused writing)."""
        return self._paused and self._frames > 0

    @property
    def has_room(self) -> bool:
        """Fewer than ``frames_max`` frames and ``bytes_max`` bytes wait."""
        return self._frames < self.frames_max and self._bytes < self.bytes_max

    def when_room(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once (on the loop) when frames no longer wait over the bound."""
        if callback not in self._waiters:
            self._waiters.append(callback)

    def pause(self) -> None:
        """The transport's buffer is full: frames wait here until ``resume``."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        if not self._scheduled:
            self.flush()

    def stop(self) -> None:
        """Write nothing more; drop what waits and forget the waiters."""
        self._stopped = True
        self._parts = []
        self._frames = self._bytes = 0
        self._waiters = []

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()
