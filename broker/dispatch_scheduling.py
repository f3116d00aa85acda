"""Where dispatch work runs: the broker's dispatch thread, or the API's event loop.

Role: subscriptions ask for a dispatch when something changed (a publish, an ack, new permits)
through :meth:`DispatchScheduler.schedule`. The work runs on one dispatch thread, unless the API
handed over an executor for its event loop (:meth:`use_executor`): that is where deliveries are
sent, so a confirmed entry reaches a consumer after one thread hop (journal to loop) instead of
two (journal to dispatch thread to loop), and a burst of confirmations wakes the loop once.

Work can also be asked for later (:meth:`schedule_after`: a dispatch throttled by its topic's
dispatch rate); one timer thread holds those requests in a heap and schedules each when due.

Invariants: a callable is queued at most once at a time (a burst of publishes asks for one
dispatch, not one per entry); work scheduled after :meth:`close` is dropped; a broker error in
dispatch is logged, never propagated into the scheduler.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from broker.errors import MagnetarError

log = logging.getLogger(__name__)

Executor = Callable[[Callable[[], None]], object]
"""Thread-safe and non-blocking: it queues the callable for its loop."""


class DispatchScheduler:
    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._executor: Executor | None = None
        self._scheduled: set[int] = set()
        self._lock = threading.Lock()
        self._later: list[tuple[float, int, int, Callable[[], None]]] = []  # heap (due, seq, key, work)
        self._later_keys: set[int] = set()
        self._sequence = itertools.count()
        self._timer_wake = threading.Condition(self._lock)
        self._timer: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="magnetar-dispatch")
        self._closed = False
        self._timer = threading.Thread(target=self._run_timer, name="magnetar-dispatch-timer", daemon=True)
        self._timer.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._later.clear()
            self._later_keys.clear()
            self._timer_wake.notify()
        if self._timer is not None:
            self._timer.join()
            self._timer = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def schedule_after(self, delay_s: float, work: Callable[[], None]) -> None:
        """:meth:`schedule` ``work`` in ``delay_s`` seconds; a callable already waiting keeps its
        earlier time (one throttled subscription waits once, whatever asks meanwhile)."""
        key = _key_of(work)
        with self._lock:
            if self._closed or key in self._later_keys:
                return
            self._later_keys.add(key)
            heapq.heappush(self._later, (time.monotonic() + delay_s, next(self._sequence), key, work))
            self._timer_wake.notify()

    def _run_timer(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (not self._later or self._later[0][0] > time.monotonic()):
                    self._timer_wake.wait(self._later[0][0] - time.monotonic() if self._later else None)
                if self._closed:
                    return
                _, _, key, work = heapq.heappop(self._later)
                self._later_keys.discard(key)
            self.schedule(work)

    def use_executor(self, executor: Executor | None) -> None:
        """Run dispatch work with ``executor`` instead of the dispatch thread (None: back to it)."""
        self._executor = executor

    def schedule(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the executor in use, at most once queued per callable (a bound method
        counts as its object)."""
        pool = self._pool
        if pool is None:
            return
        key = _key_of(work)
        with self._lock:
            if key in self._scheduled:
                return
            self._scheduled.add(key)

        def run() -> None:
            with self._lock:
                self._scheduled.discard(key)
            try:
                work()
            except MagnetarError:
                log.exception("dispatch failed")

        executor = self._executor
        with contextlib.suppress(RuntimeError):  # shutting down
            if executor is not None:
                executor(run)
            else:
                pool.submit(run)


def _key_of(work: Callable[[], None]) -> int:
    """Who asks for ``work``: a bound method counts as its object."""
    return id(work.__self__) if hasattr(work, "__self__") else id(work)
