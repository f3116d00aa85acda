"""ByteBudget: refuses from its bound until it has fallen to its resume mark, wakes each waiter
once, outside its lock, never misses a release between a refusal and a wait, and says whether
bytes were added lately (the publish signal an offload yields to)."""

from __future__ import annotations

import threading

import pytest

from broker.byte_budget import ByteBudget


def test_it_admits_below_the_bound_and_refuses_from_it_until_below_the_resume_mark() -> None:
    budget = ByteBudget(100, resume_fraction=0.5)
    budget.adjust(99)
    assert budget.admits()
    budget.adjust(30)  # one step may pass the bound
    assert not budget.admits()
    budget.adjust(-60)  # 69: below the bound, not yet below half of it
    assert not budget.admits()
    budget.adjust(-20)  # 49
    assert budget.admits()
    stats = budget.statistics()
    assert (stats.used_bytes, stats.bytes_max, stats.peak_bytes) == (49, 100, 129)


def test_a_waiter_runs_once_when_a_release_makes_room_and_not_before() -> None:
    budget = ByteBudget(10)
    budget.adjust(10)
    woken: list[int] = []
    assert not budget.admits()
    assert budget.wait(lambda: woken.append(1))
    budget.adjust(-1)  # 9 < 10: room again
    budget.adjust(-9)
    assert woken == [1]
    stats = budget.statistics()
    assert (stats.waits, stats.waiting) == (1, 0)


def test_a_wait_after_the_release_it_waited_for_is_refused_so_nothing_is_missed() -> None:
    budget = ByteBudget(10)
    budget.adjust(10)
    assert not budget.admits()
    budget.adjust(-10)  # released between the refusal and the wait
    assert not budget.wait(lambda: pytest.fail("a refused wait must not keep its wake-up"))


def test_waiters_run_outside_the_lock_and_a_failing_one_does_not_stop_the_others() -> None:
    budget = ByteBudget(10)
    budget.adjust(10)
    seen: list[str] = []

    def reentrant() -> None:
        budget.adjust(1)  # would deadlock if wake-ups ran under the budget's lock
        seen.append("reentrant")

    def failing() -> None:
        raise RuntimeError("a waiter's own failure")

    for wake in (failing, reentrant):
        assert budget.wait(wake)
    done = threading.Event()

    def release() -> None:
        budget.adjust(-5)
        done.set()

    worker = threading.Thread(target=release)
    worker.start()
    assert done.wait(5)
    worker.join()
    assert seen == ["reentrant"] and budget.used_bytes == 6


def test_a_zero_budget_is_no_bound_but_still_counts() -> None:
    budget = ByteBudget(0)
    budget.adjust(1 << 40)
    assert budget.admits()
    assert not budget.wait(lambda: None)
    assert budget.statistics().used_bytes == 1 << 40


def test_the_publish_buffer_says_whether_bytes_were_added_lately() -> None:
    now_s = [100.0]
    budget = ByteBudget(1000, clock=lambda: now_s[0])
    assert not budget.added_within(1.0)
    budget.adjust(100)
    assert budget.added_within(1.0)
    budget.adjust(-100)  # stored: a release is not a publish
    now_s[0] += 0.5
    assert budget.added_within(1.0)
    now_s[0] += 0.6
    assert not budget.added_within(1.0)
