"""LightFuture keeps the concurrent.futures.Future contract without a Condition.

Checks: result/exception/done, timeouts, callbacks (also added after completion), cancellation
before completion, concurrent.futures.wait and as_completed over light futures, blocking waiters
in other threads, and callbacks added while other threads complete futures (each runs once).
"""

from __future__ import annotations

import functools
import gc
import threading
import weakref
from concurrent.futures import FIRST_COMPLETED, CancelledError, InvalidStateError, as_completed, wait

import pytest

from storage.futures import LightFuture, new_future


def test_results_errors_callbacks_and_cancellation() -> None:
    ok: LightFuture[int] = new_future()
    failed: LightFuture[int] = new_future()
    cancelled: LightFuture[int] = new_future()
    seen: list[int] = []
    ok.add_done_callback(lambda f: seen.append(f.result()))
    assert not ok.done()
    with pytest.raises(TimeoutError):
        ok.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        ok.exception(timeout=0.01)
    cancel_seen: list[bool] = []
    cancelled.add_done_callback(lambda f: cancel_seen.append(f.cancelled()))
    assert cancelled.cancel() and cancelled.cancel()
    assert cancel_seen == [True]
    assert ok.try_finish(7, None) and failed.try_finish(None, ValueError("boom"))
    assert not cancelled.try_finish(9, None)  # cancelled by its owner: nothing done
    assert ok.done() and ok.result() == 7 and seen == [7]
    assert not ok.cancel()
    assert isinstance(failed.exception(), ValueError)
    with pytest.raises(ValueError):
        failed.result()
    with pytest.raises(CancelledError):
        cancelled.result()
    with pytest.raises(CancelledError):
        cancelled.exception()
    with pytest.raises(InvalidStateError):
        ok.set_result(8)
    late: list[int] = []
    ok.add_done_callback(lambda f: late.append(f.result()))
    assert late == [7]


def test_blocked_waiters_wake_for_their_own_future_only() -> None:
    first: LightFuture[str] = new_future()
    second: LightFuture[str] = new_future()
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(second.result(timeout=10)))
    waiter.start()
    first.set_result("one")
    waiter.join(0.05)
    assert waiter.is_alive() and got == []
    second.set_result("two")
    waiter.join(10)
    assert got == ["two"]
    done, pending = wait([first, second], timeout=1, return_when=FIRST_COMPLETED)
    assert done == {first, second} and not pending


def test_wait_and_as_completed_see_completions_from_another_thread() -> None:
    futures: list[LightFuture[int]] = [new_future() for _ in range(50)]
    completer = threading.Thread(target=lambda: [f.try_finish(i, None) for i, f in enumerate(futures)])
    pending_wait = threading.Thread(target=lambda: wait(futures, timeout=10))
    pending_wait.start()
    completer.start()
    assert sorted(f.result() for f in as_completed(futures, timeout=10)) == list(range(50))
    pending_wait.join(10)
    assert not pending_wait.is_alive()


def test_each_callback_runs_exactly_once_while_other_threads_complete() -> None:
    rounds = 2000
    futures: list[LightFuture[int]] = [new_future() for _ in range(rounds)]
    calls = [0] * rounds
    lock = threading.Lock()

    def count(index: int) -> None:
        with lock:
            calls[index] += 1

    def add_callbacks() -> None:
        for index, future in enumerate(futures):
            future.add_done_callback(functools.partial(lambda i, _f: count(i), index))

    def complete() -> None:
        for index, future in enumerate(futures):
            future.set_result(index)

    adder = threading.Thread(target=add_callbacks)
    completer = threading.Thread(target=complete)
    adder.start()
    completer.start()
    adder.join(30)
    completer.join(30)
    assert calls == [1] * rounds


def test_a_raised_result_leaves_no_cycle_back_to_the_future() -> None:
    """A failed group fails every future in it: none may wait for the cyclic collector."""
    gc.disable()
    try:
        future: LightFuture[int] = new_future()
        future.set_exception(ValueError("boom"))
        alive = weakref.ref(future)
        with pytest.raises(ValueError):
            future.result()
        del future
        assert alive() is None
    finally:
        gc.enable()
