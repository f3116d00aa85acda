"""Add futures that are completed a journal group at a time.

Role: ``add_entry`` returns a ``concurrent.futures.Future``. A plain Future builds its own
Condition and notifies on every ``set_result``; at one future per entry that is a large share
of the add path's cost. A ``GroupFuture`` is a real ``Future`` (callbacks,
``concurrent.futures.wait``, ``result(timeout)``, cancellation behave as usual) that shares one
Condition per storage: :func:`complete_group` finishes every future of a group commit under
that Condition and wakes waiters once.

Invariant: waiting is a predicate loop on the future's own state, so a wake-up meant for
another future of the same storage is never mistaken for this one's completion.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class GroupFuture(Future[T]):
    def __init__(self, condition: threading.Condition) -> None:  # shares, instead of building, a Condition
        self._condition = condition
        self._state = "PENDING"
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks: list[Callable[[Future[T]], object]] = []

    def _wait_done(self, timeout: float | None) -> None:
        with self._condition:
            if self._state not in _DONE and not self._condition.wait_for(lambda: self._state in _DONE, timeout):
                raise TimeoutError()

    # A finished future is read without the shared lock: its state moves once, from pending to
    # FINISHED, and its result or exception is set before that (under the lock).
    def done(self) -> bool:
        return self._state in _DONE

    def result(self, timeout: float | None = None) -> T:
        if self._state == FINISHED:
            if self._exception is not None:
                raise self._exception
            return self._result  # type: ignore[return-value]
        self._wait_done(timeout)
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        self._wait_done(timeout)
        return super().exception(0)


_SHARED_CONDITION = threading.Condition(threading.RLock())


def new_future() -> GroupFuture[Any]:
    """A ``Future`` for a result completed on its own (``set_result`` / ``set_exception``), that
    shares one process-wide Condition instead of building a Condition and a lock per future:
    the broker creates several per published entry."""
    return GroupFuture(_SHARED_CONDITION)


Outcome = tuple["GroupFuture[Any]", Any, BaseException | None]


def complete_group(condition: threading.Condition, outcomes: list[Outcome]) -> None:
    """Finish ``(future, result, error)`` triples under ``condition``; notify waiters once;
    then run each future's done-callbacks (outside the lock, as ``Future`` does)."""
    finished: list[GroupFuture[Any]] = []
    with condition:
        for future, result, error in outcomes:
            if future._state in _DONE:
                continue  # cancelled by its owner
            if error is None:
                future._result = result
                for waiter in future._waiters:
                    waiter.add_result(future)
            else:
                future._exception = error
                for waiter in future._waiters:
                    waiter.add_exception(future)
            future._state = FINISHED
            finished.append(future)
        condition.notify_all()
    for future in finished:
        future._invoke_callbacks()  # type: ignore[attr-defined]  # Future's own helper
