"""Futures for the add path: the ``concurrent.futures.Future`` contract at a fraction of its cost.

Role: every published entry passes through several futures (storage add, ledger add, managed
ledger add, publish). A plain ``Future`` builds a ``threading.Condition`` (Python code around a
lock) and notifies it on every ``set_result``; a :class:`LightFuture` guards its state with one
C-level ``threading.Lock`` and builds an ``Event`` only when a thread actually blocks in
``result()`` or ``exception()``. :meth:`LightFuture.try_finish` completes a future whose owner
may have cancelled it (a journal group's adds) without raising.

Invariants:
- Callbacks, ``result(timeout)``, ``exception(timeout)``, cancellation and
  ``concurrent.futures.wait`` / ``as_completed`` behave as with ``Future`` (those two take the
  future's ``_condition`` as a context manager and register waiters, which the lock supports).
- A future's state moves once, from pending (or cancelled) to done; its result or exception is
  set before, under the lock, so a finished future is read without taking it.
- Done-callbacks run outside the lock, once each, in the thread that completes the future (or
  at once in the thread that adds one to a finished future).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING, RUNNING
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class LightFuture(Future[T]):
    def __init__(self) -> None:  # replaces Future's: no Condition
        self._condition = threading.Lock()  # type: ignore[assignment]  # named as Future's for wait()
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks: list[Callable[[Future[T]], object]] = []
        self._done_event: threading.Event | None = None

    def done(self) -> bool:
        return self._state in _DONE

    def result(self, timeout: float | None = None) -> T:
        self._wait_finished(timeout)
        if self._exception is not None:
            try:
                raise self._exception
            finally:
                del self  # the traceback holds this frame: no cycle back to the future (as Future does)
        return self._result  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait_finished(timeout)
        return self._exception

    def _wait_finished(self, timeout: float | None) -> None:
        """Return once finished; raise ``TimeoutError`` after ``timeout``, ``CancelledError``
        when cancelled instead."""
        if self._state == FINISHED:
            return
        with self._condition:
            if self._state not in _DONE:
                if self._done_event is None:
                    self._done_event = threading.Event()
                event: threading.Event | None = self._done_event
            else:
                event = None
        if event is not None and not event.wait(timeout):
            raise TimeoutError()
        if self._state != FINISHED:
            raise CancelledError()

    def set_result(self, result: T) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._finish(None, exception)

    def _finish(self, result: Any, exception: BaseException | None) -> None:
        if not self.try_finish(result, exception):  # raised outside the lock: repr() takes it
            raise InvalidStateError(f"{self._state}: {self!r}")

    def try_finish(self, result: Any, exception: BaseException | None) -> bool:
        """Complete with ``result`` (``exception`` None) or ``exception``; False, and nothing
        done, when the future is already done (cancelled by its owner)."""
        with self._condition:
            if self._state in _DONE:
                return False
            self._result, self._exception = result, exception
            self._state = FINISHED
            for waiter in self._waiters:
                if exception is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            event = self._done_event
        if event is not None:
            event.set()
        self._invoke_callbacks()  # type: ignore[attr-defined]  # Future's own helper
        return True

    def cancel(self) -> bool:
        with self._condition:
            if self._state in (RUNNING, FINISHED):
                return False
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                return True
            self._state = CANCELLED
            event = self._done_event
        if event is not None:
            event.set()
        self._invoke_callbacks()  # type: ignore[attr-defined]
        return True

    def set_running_or_notify_cancel(self) -> bool:
        with self._condition:
            if self._state == CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
                return False
            if self._state == PENDING:
                self._state = RUNNING
                return True
            raise RuntimeError(f"Future in unexpected state: {self._state}")


def new_future() -> LightFuture[Any]:
    """A ``Future`` completed with ``set_result`` / ``set_exception``, without a Condition."""
    return LightFuture()

