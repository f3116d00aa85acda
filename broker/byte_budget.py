"""Broker-wide byte budgets: what dispatch holds between storage and a connection, and what
producers have handed to the managed ledgers and not yet seen stored.

Role: ``BrokerService`` keeps two. Reads in flight (Pulsar's
``managedLedgerMaxReadsInFlightSizeInMB``): every subscription and reader adds the bytes it read
and decoded and has not yet handed to a connection, and takes them off once a connection took
them; a read starts only while the budget :meth:`~ByteBudget.admits`, and a refused reader
leaves a wake-up (:meth:`~ByteBudget.wait`) that runs once the budget admits again. The publish
buffer (``maxMessagePublishBufferSizeInMB``): every managed-ledger append adds its bytes until
it is stored; while the budget refuses, transports stop reading their producers' connections
(TCP holds the clients back) and resume once it has fallen to half, as Pulsar's broker does.
A holder keeps its account with a budget in a ``BudgetShare``: what it last told the budget it
holds, and whether it left a wake-up.

Invariants: ``used_bytes`` is what holders added and have not taken off. The budget refuses
from the moment ``used_bytes`` reaches ``bytes_max`` until it has fallen below the resume mark
(``bytes_max`` for reads, half of it for publishes); one holder may pass the bound with the
step that reaches it (a read is never split, and an entry larger than the budget still goes out
alone). Each wake-up runs once, outside the lock, on the thread whose release made room; a
failing wake-up is logged and the others still run. ``bytes_max`` 0 turns the bound off (the
count is still kept, for statistics). ``added_within`` says whether a holder added bytes in the
last so many seconds: for the publish buffer, whether this broker is taking publishes (what an
offload yields to, ``broker/offload/blob_offloader.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ByteBudgetStats:
    used_bytes: int
    bytes_max: int
    """0: no bound."""
    peak_bytes: int
    """The most ``used_bytes`` has been since the broker started."""
    waits: int
    """Times a holder was refused and left a wake-up (a read waited, a connection paused)."""
    waiting: int
    """Wake-ups left now."""


class ByteBudget:
    def __init__(self, bytes_max: int, *, resume_fraction: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if bytes_max < 0 or not 0.0 < resume_fraction <= 1.0:
            raise ValueError("a byte budget needs bytes_max >= 0 and a resume fraction in (0, 1]")
        self.bytes_max = bytes_max
        self._resume_bytes = int(bytes_max * resume_fraction)
        self._lock = threading.Lock()
        self.used_bytes = 0
        self._peak = 0
        self._waits = 0
        self._refusing = False
        self._waiters: list[Callable[[], None]] = []
        self._clock = clock
        self._added_at_s: float | None = None

    def added_within(self, seconds: float) -> bool:
        """Whether a holder added bytes in the last ``seconds``."""
        added_at_s = self._added_at_s
        return added_at_s is not None and self._clock() - added_at_s < seconds

    def admits(self) -> bool:
        """Whether a holder may take more now."""
        if self.bytes_max <= 0:
            return True
        with self._lock:
            return not self._refuses_locked()

    def _refuses_locked(self) -> bool:
        if self._refusing:
            self._refusing = self.used_bytes >= self._resume_bytes
        elif self.used_bytes >= self.bytes_max:
            self._refusing = True
        return self._refusing

    def adjust(self, delta: int) -> None:
        """Add ``delta`` bytes (negative: let go of them); a release that makes the budget admit
        again runs every wake-up left."""
        if not delta:
            return
        waiters: list[Callable[[], None]] = []
        with self._lock:
            if delta > 0:
                self._added_at_s = self._clock()
            self.used_bytes += delta
            self._peak = max(self._peak, self.used_bytes)
            if delta < 0 and self._waiters and (self.bytes_max <= 0 or not self._refuses_locked()):
                waiters, self._waiters = self._waiters, []
        for wake in waiters:
            try:
                wake()
            except Exception:
                log.exception("a wake-up after a byte budget made room failed")

    def wait(self, wake: Callable[[], None]) -> bool:
        """Leave ``wake`` to run once the budget admits again; False (``wake`` not kept) when it
        admits already, so a release between a refusal and this call is never missed."""
        if self.bytes_max <= 0:
            return False
        with self._lock:
            if not self._refuses_locked():
                return False
            self._waiters.append(wake)
            self._waits += 1
            return True

    def statistics(self) -> ByteBudgetStats:
        with self._lock:
            return ByteBudgetStats(self.used_bytes, self.bytes_max, self._peak, self._waits, len(self._waiters))


class BudgetShare:
    """One holder's account with a budget (None: unbounded): what it was last told the holder
    holds, and whether a wake-up is left for the holder. The holder works out what it holds
    under its own lock (:meth:`delta`) and tells the budget outside it (:meth:`tell`), as a
    release may run other holders' wake-ups."""

    def __init__(self, budget: ByteBudget | None, wake: Callable[[], None]) -> None:
        self._budget = budget
        self._wake = wake
        self._told = 0
        self._waiting = False

    def delta(self, held: int) -> int:
        """(Under the holder's lock.) How much more (or less) the holder, now holding ``held``
        bytes, holds than the budget was last told, now taken as told."""
        if self._budget is None:
            return 0
        delta, self._told = held - self._told, held
        return delta

    def tell(self, delta: int) -> None:
        """(Outside the holder's lock.)"""
        if delta and self._budget is not None:
            self._budget.adjust(delta)

    def must_wait(self) -> bool:
        """Whether a read has to wait for the budget (a wake-up is left then, once)."""
        budget = self._budget
        if budget is None or self._waiting:
            return self._waiting
        if budget.admits():
            return False
        self._waiting = True  # before the wake-up is left: it may run at once
        if budget.wait(self._freed):
            return True
        self._waiting = False
        return False

    def _freed(self) -> None:
        self._waiting = False
        self._wake()
