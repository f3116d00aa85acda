"""Running work on an asyncio event loop from the broker's threads, one loop wake-up per burst.

Role: the broker completes publishes and confirms entries on its own threads (the journal's,
mostly); the API's sessions wait on the event loop, and the broker's dispatch work runs there
too (see ``BrokerService.use_dispatch_executor``). Every hand-over from another thread costs a
``call_soon_threadsafe``: a pipe write, a loop wake-up and a pipe read.

Invariants: :class:`LoopExecutor` is one per loop (:func:`loop_executor`); however many calls a
burst brings, and from however many sources (dispatch, publish completions, deliveries), the
loop is woken once and runs them in submission order. A :class:`LoopSignal` runs its callback
on the loop at most once per burst of notifications (deferred with ``call_soon`` when notified on
the loop itself, so it never re-enters its caller). A :class:`LoopWakeup` notified on the loop's
own thread sets its event directly, with no hand-over at all. :func:`budget_room` waits on the
loop for a broker byte budget that any thread releases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable

from broker import ByteBudget

log = logging.getLogger(__name__)

_EXECUTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopExecutor] = weakref.WeakKeyDictionary()
_EXECUTORS_LOCK = threading.Lock()


class LoopExecutor:
    """Queues callables for one event loop from any thread; a burst costs one wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: deque[Callable[[], object]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._loop_thread: int | None = threading.get_ident() if _running_loop() is loop else None

    def __call__(self, call: Callable[[], object]) -> None:
        with self._lock:
            self._calls.append(call)
            if self._scheduled:
                return
            self._scheduled = True
        on_loop = threading.get_ident() == self._loop_thread
        with contextlib.suppress(RuntimeError):  # the loop is closing
            (self._loop.call_soon if on_loop else self._loop.call_soon_threadsafe)(self._run)

    def _run(self) -> None:
        self._loop_thread = threading.get_ident()
        with self._lock:
            self._scheduled = False
            calls = list(self._calls)
            self._calls.clear()
        for call in calls:
            try:
                call()
            except Exception:
                log.exception("a call handed to the event loop failed")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def loop_executor(loop: asyncio.AbstractEventLoop) -> LoopExecutor:
    """The :class:`LoopExecutor` of ``loop`` (made on first use)."""
    with _EXECUTORS_LOCK:
        executor = _EXECUTORS.get(loop)
        if executor is None:
            executor = _EXECUTORS[loop] = LoopExecutor(loop)
        return executor


class LoopSignal:
    """Runs ``callback`` on the loop after ``notify`` from any thread, at most once queued: a
    burst of notifications costs one call (and, from another thread, one share of a wake-up).
    Notified on the loop's own thread it is deferred (``call_soon``), so ``notify`` never
    re-enters the code that called it, unless ``direct_on_loop``: then it runs at once, for a
    callback that its notifiers may safely run inside them and that should not wait a turn of
    the loop (sending a consumer's deliveries from the dispatch that made them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], object], *,
                 direct_on_loop: bool = False) -> None:
        self._direct_on_loop = direct_on_loop
        self._loop = loop
        self._executor = loop_executor(loop)
        self._callback = callback
        self._lock = threading.Lock()
        self._scheduled = False
        self._loop_thread = threading.get_ident()  # made on the loop's thread

    def notify(self, *_: object) -> None:
        on_loop = threading.get_ident() == self._loop_thread
        if on_loop and self._direct_on_loop:
            self._callback()
            return
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        if on_loop:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon(self._fire)
        else:
            self._executor(self._fire)

    def _fire(self) -> None:
        with self._lock:
            self._scheduled = False
        self._callback()


class LoopWakeup(LoopSignal):
    """An ``asyncio.Event`` that any thread may set, at most one queued wake-up at a time;
    notified on the loop's own thread it sets the event directly, with no hand-over at all."""

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event | None = None) -> None:
        self.event = event or asyncio.Event()
        super().__init__(loop, self.event.set, direct_on_loop=True)

    async def wait(self) -> None:
        await self.event.wait()
        self.event.clear()


async def budget_room(budget: ByteBudget) -> None:
    """Return once ``budget`` admits (at once while it does). A producer session that awaits this
    before it reads its next frame leaves its connection unread meanwhile, so TCP holds the
    client back while the broker's publish buffer is full (``maxMessagePublishBufferSizeInMB``)."""
    while not budget.admits():
        wakeup = LoopWakeup(asyncio.get_running_loop())
        if budget.wait(wakeup.notify):
            await wakeup.wait()
