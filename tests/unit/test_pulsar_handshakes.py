"""The budget and the timeout of connections whose handshake has not completed
(``api/pulsar/handshakes.py``), on a loop whose clock the test moves.

Checks: what pending connections hold adds up and a connection that would take the sum past the
budget is refused (and releases its share); finishing releases a connection's share and its
timer, and may be repeated; a connection still pending at the timeout is closed, a finished one
never is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from api.pulsar.handshakes import PendingHandshakes


class Timer:
    def __init__(self, at_s: float, callback: Callable[[], None]) -> None:
        self.at_s = at_s
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualLoop:
    """``call_later`` on a clock that moves only when told."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.timers: list[Timer] = []

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self.now_s + delay_s, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now_s += seconds
        due = [t for t in self.timers if t.at_s <= self.now_s and not t.cancelled]
        self.timers = [t for t in self.timers if t not in due]
        for timer in due:
            timer.callback()


def pending(budget_bytes: int = 1000, timeout_s: float = 10.0) -> tuple[PendingHandshakes, ManualLoop, list[str]]:
    return PendingHandshakes(budget_bytes, timeout_s), ManualLoop(), []


def opened(handshakes: PendingHandshakes, loop: ManualLoop, closed: list[str], name: str) -> str:
    handshakes.open(name, cast(Any, loop), lambda: closed.append(name))
    return name


def test_what_pending_connections_hold_adds_up_to_the_budget() -> None:
    handshakes, loop, closed = pending(budget_bytes=1000)
    a, b, c = (opened(handshakes, loop, closed, name) for name in "abc")
    assert handshakes.hold(a, 400) and handshakes.hold(b, 400)
    assert handshakes.held_bytes == 800
    assert not handshakes.hold(c, 300)  # would make 1100
    assert handshakes.held_bytes == 800 and handshakes.over_budget == 1 and len(handshakes) == 2
    assert handshakes.hold(a, 100)  # a's share shrinks when its partial frame does
    assert handshakes.hold(b, 900)
    assert handshakes.held_bytes == 1000


def test_finishing_releases_the_share_and_the_timer_once() -> None:
    handshakes, loop, closed = pending()
    a = opened(handshakes, loop, closed, "a")
    handshakes.hold(a, 600)
    handshakes.finish(a)
    handshakes.finish(a)
    assert handshakes.held_bytes == 0 and len(handshakes) == 0
    assert handshakes.hold(a, 10_000)  # no longer pending: not counted
    loop.advance(60)
    assert closed == [] and handshakes.timed_out == 0


def test_a_connection_still_pending_at_the_timeout_is_closed() -> None:
    handshakes, loop, closed = pending(timeout_s=10.0)
    slow = opened(handshakes, loop, closed, "slow")
    quick = opened(handshakes, loop, closed, "quick")
    handshakes.hold(slow, 500)
    loop.advance(5)
    handshakes.finish(quick)
    loop.advance(4.9)
    assert closed == []
    loop.advance(0.2)
    assert closed == ["slow"]
    assert handshakes.timed_out == 1 and handshakes.held_bytes == 0 and len(handshakes) == 0
