"""Waking an asyncio event loop from the broker's threads, once per burst.

Role: the broker completes publishes, dispatches deliveries and confirms entries on its own
threads; the API's sessions wait on the event loop. Invariant: however many notifications a
burst brings, the loop is woken once (one ``call_soon_threadsafe``: a pipe write and a loop
iteration), and a notification raised on the loop's own thread sets the event directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class LoopWakeup:
    """Wakes the event loop from other threads at most once per burst: the broker completes
    publishes and dispatches on its own threads, and one ``call_soon_threadsafe`` (a pipe write
    and a loop iteration) per message would cost more than the message."""

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event | None = None) -> None:
        self._loop = loop
        self.event = event or asyncio.Event()
        self._lock = threading.Lock()
        self._scheduled = False
        self._loop_thread = threading.get_ident()  # made on the loop's thread

    def notify(self, *_: object) -> None:
        if threading.get_ident() == self._loop_thread:  # already on the loop: no pipe, no hop
            self.event.set()
            return
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        with self._lock:
            self._scheduled = False
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()
        self.event.clear()
