"""Connections whose handshake has not completed: how much they may hold, and for how long.

Role: the binary front end's guard before authentication; the asyncio adapter (``server.py``)
reports to it. A connection is *pending* from the moment it is accepted until its session is
CONNECTED (CONNECT answered, its token checked when authentication is on). While pending:

- its decoder refuses a frame larger than ``handshake_frame_bytes_max`` from the frame's header
  (a CONNECT with a token fits many times over), not only one above the maximum message size;
- the bytes that all pending connections hold in partial frames add up to at most
  ``handshake_buffer_bytes_max``: a connection whose partial frame would take the sum past it is
  closed (a CONNECT that arrives whole in one read is never held, so clients that authenticate
  are not turned away while others fill the budget);
- a connection still pending ``handshake_timeout_ms`` after it was accepted is closed, whatever
  it sent meanwhile (PING and PONG are allowed before CONNECT, but do not buy time). Pulsar's
  broker closes such a connection after its keep-alive interval; Magnetar's bound is its own.

Invariants: a connection is pending at most once, from ``open`` to ``finish`` (handshake done
or connection lost, whichever comes first; ``finish`` is idempotent); ``held_bytes`` is the sum
of what the pending connections hold, never above ``buffer_bytes_max``; a finished
connection's timer is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Pending:
    held_bytes: int
    timer: asyncio.TimerHandle


class PendingHandshakes:
    def __init__(self, buffer_bytes_max: int, timeout_s: float) -> None:
        self.buffer_bytes_max = buffer_bytes_max
        self.timeout_s = timeout_s
        self._pending: dict[object, _Pending] = {}
        self.held_bytes = 0
        self.over_budget = 0
        """Connections closed because their partial frame did not fit the budget."""
        self.timed_out = 0

    def __len__(self) -> int:
        return len(self._pending)

    def open(self, connection: object, loop: asyncio.AbstractEventLoop, close: Callable[[], None]) -> None:
        """``connection`` was accepted: ``close`` is called unless it finishes within the timeout."""

        def expired() -> None:
            if self._pending.get(connection) is pending:
                self.timed_out += 1
                self.finish(connection)
                close()

        pending = _Pending(0, loop.call_later(self.timeout_s, expired))
        self._pending[connection] = pending

    def hold(self, connection: object, buffered_bytes: int) -> bool:
        """``connection`` now holds ``buffered_bytes`` in a partial frame; False when that does
        not fit the budget (its share is then released: the caller closes it)."""
        pending = self._pending.get(connection)
        if pending is None:
            return True
        held = self.held_bytes - pending.held_bytes + buffered_bytes
        if held > self.buffer_bytes_max:
            self.over_budget += 1
            self.finish(connection)
            return False
        self.held_bytes = held
        pending.held_bytes = buffered_bytes
        return True

    def finish(self, connection: object) -> None:
        """The handshake completed, or the connection is gone: nothing of it is pending now."""
        pending = self._pending.pop(connection, None)
        if pending is not None:
            self.held_bytes -= pending.held_bytes
            pending.timer.cancel()
