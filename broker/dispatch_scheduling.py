"""Where dispatch work runs: the broker's dispatch thread, or the API's event loop.

Role: subscriptions ask for a dispatch when something changed (a publish, an ack, new permits)
through :meth:`DispatchScheduler.schedule`. The work runs on one dispatch thread, unless the API
handed over an executor for its event loop (:meth:`use_executor`): that is where deliveries are
sent, so a confirmed entry reaches a consumer after one thread hop (journal to loop) instead of
two (journal to dispatch thread to loop), and a burst of confirmations wakes the loop once.

Invariants: a callable is queued at most once at a time (a burst of publishes asks for one
dispatch, not one per entry); work scheduled after :meth:`close` is dropped; a broker error in
dispatch is logged, never propagated into the scheduler.
"""

from __future__ import annotations

import contextlib
import logging
import threading
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

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="magnetar-dispatch")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def use_executor(self, executor: Executor | None) -> None:
        """Run dispatch work with ``executor`` instead of the dispatch thread (None: back to it)."""
        self._executor = executor

    def schedule(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the executor in use, at most once queued per callable (a bound method
        counts as its object)."""
        pool = self._pool
        if pool is None:
            return
        key = id(work.__self__) if hasattr(work, "__self__") else id(work)
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
