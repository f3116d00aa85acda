"""A subscription's select is made again while its broker cannot be reached, and not after it stops."""

from __future__ import annotations

import threading

import pytest
from eventsourcing.persistence import OperationalError

from consumers.eventsourcing.subscription import pull_resuming


def test_a_select_that_meets_a_broker_being_restarted_is_made_again_until_it_succeeds() -> None:
    outcomes: list[Exception | None] = [OperationalError("down"), OperationalError("down"), None]
    calls: list[int] = []

    def pull() -> None:
        calls.append(1)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    pull_resuming(pull, lambda: False, threading.Event())
    assert len(calls) == 3


def test_a_stopped_subscription_does_not_select_again() -> None:
    def pull() -> None:
        raise OperationalError("down")

    with pytest.raises(OperationalError):
        pull_resuming(pull, lambda: True, threading.Event())


def test_other_errors_are_not_retried() -> None:
    calls: list[int] = []

    def pull() -> None:
        calls.append(1)
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        pull_resuming(pull, lambda: False, threading.Event())
    assert calls == [1]
