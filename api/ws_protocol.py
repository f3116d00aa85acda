"""uvicorn's WebSocket protocol with read flow control by queue depth instead of per frame.

Role: uvicorn's sans-I/O WebSocket protocol stops reading the socket after every frame it
queues for the application and starts again once the application took it: two ``epoll_ctl``
system calls per received frame. A Pulsar WebSocket client sends a frame per message and per
acknowledgement, so that was a measurable share of the event loop's time per message.

Invariant: the receive queue stays bounded. Reading pauses once ``WS_RECEIVE_QUEUE_FRAMES_MAX``
frames wait for the application and resumes when the application has drained the queue (the
base class's resume rule, unchanged), so a client that floods frames is still held back by TCP.
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

WS_RECEIVE_QUEUE_FRAMES_MAX = 256
"""Received frames queued for the application before the socket stops being read."""


class MagnetarWebSocketProtocol(WebSocketsSansIOProtocol):
    """Pauses reading only when ``WS_RECEIVE_QUEUE_FRAMES_MAX`` frames are queued."""

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
