"""GroupFuture keeps the concurrent.futures.Future contract while sharing one Condition.

Checks: result/exception/done, timeouts, callbacks (also added after completion), cancellation
before completion, concurrent.futures.wait over group futures, and that a wake-up for one future
is not taken as another's completion.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, CancelledError, wait

import pytest

from storage.futures import GroupFuture, complete_group


def test_results_errors_callbacks_and_cancellation() -> None:
    condition = threading.Condition()
    ok: GroupFuture[int] = GroupFuture(condition)
    failed: GroupFuture[int] = GroupFuture(condition)
    cancelled: GroupFuture[int] = GroupFuture(condition)
    seen: list[int] = []
    ok.add_done_callback(lambda f: seen.append(f.result()))
    assert not ok.done()
    with pytest.raises(TimeoutError):
        ok.result(timeout=0.01)
    assert cancelled.cancel()
    complete_group(condition, [(ok, 7, None), (failed, None, ValueError("boom")), (cancelled, 9, None)])
    assert ok.done() and ok.result() == 7 and seen == [7]
    assert isinstance(failed.exception(), ValueError)
    with pytest.raises(ValueError):
        failed.result()
    with pytest.raises(CancelledError):
        cancelled.result()
    late: list[int] = []
    ok.add_done_callback(lambda f: late.append(f.result()))
    assert late == [7]


def test_waiters_wake_only_for_their_own_future() -> None:
    condition = threading.Condition()
    first: GroupFuture[str] = GroupFuture(condition)
    second: GroupFuture[str] = GroupFuture(condition)
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(second.result(timeout=10)))
    waiter.start()
    complete_group(condition, [(first, "one", None)])  # wakes the waiter, which must keep waiting
    waiter.join(0.05)
    assert waiter.is_alive() and got == []
    complete_group(condition, [(second, "two", None)])
    waiter.join(10)
    assert got == ["two"]
    done, pending = wait([first, second], timeout=1, return_when=FIRST_COMPLETED)
    assert done == {first, second} and not pending
