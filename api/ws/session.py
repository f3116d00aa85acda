"""What a WebSocket session is, what it sees of its connection, and what every session kind shares.

Role: a session (``producer.py``, ``consumer.py``, ``reader.py``, ``dcb.py``) is a plain object
that maps a connection's frames onto broker objects and back; it knows no socket, no event-loop
protocol and no web framework. ``server.py`` drives it through ``Session``: ``start`` once the
upgrade is accepted, ``on_frames`` with the text frames of each socket read, ``end`` once the
connection closes. The session sees its connection as a ``SessionIO``: a ``FrameWriter`` for
every frame it sends (one route out), ``ready`` to be offered the frames it left, ``close`` with
a code and reason.

Invariants:
- Frames in take one route: ``on_frames`` gets every text frame of one socket read, in order,
  and answers how many it took; the ones it left wait in the connection (reading pauses once
  ``WS_RECEIVE_QUEUE_FRAMES_MAX`` frames or ``WS_RECEIVE_QUEUE_BYTES_MAX`` bytes wait) and are
  offered again, first, after the session calls ``ready``. So a session that must wait (a
  producer at ``maxPendingMessages``, over its topic's publish rate, or refused by a full
  publish buffer) holds the client back by TCP, and frames are never reordered.
- Consumers and readers answer a frame they cannot apply with ``{"result": "error:<n>",
  "errorMsg"}`` and go on; a failure of the session itself closes the connection with 1011 and its
  reason (``server.py``, the one place that maps it).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from api.limits import PERMITS_PER_FRAME_MAX
from api.ws.frames import JSON_DESERIALIZE_ERROR, UNKNOWN_ERROR, FrameError, frame_text, short
from api.ws.writer import FrameWriter
from broker import MagnetarError


class SessionIO(Protocol):
    """What a session sees of its connection."""

    writer: FrameWriter
    """Every frame the session sends, in order."""
    loop: asyncio.AbstractEventLoop

    def ready(self) -> None:
        """The session can take frames again: offer it those it left (soon, on the loop)."""

    def close(self, code: int, reason: str) -> None:
        """Close after the frames already sent (the session ends)."""


class Session(Protocol):
    def start(self) -> None:
        """The upgrade was accepted: begin (deliveries, reads)."""

    def on_frames(self, texts: list[str]) -> int:
        """Apply the frames of one read, in order; how many were taken (the rest are offered
        again after ``SessionIO.ready``)."""

    def end(self) -> None:
        """The connection is closing or gone: release the broker objects (called once)."""


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
