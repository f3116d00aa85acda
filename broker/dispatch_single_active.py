"""Exclusive and Failover subscriptions: one active consumer gets every message.

Role: the dispatcher (``broker/dispatcher.py``) of Exclusive and Failover subscriptions, Pulsar's
``PersistentDispatcherSingleActiveConsumer``:

- **Exclusive**: one consumer; a second is refused with ``ConsumerBusy``.
- **Failover**: the active consumer is the first by (priority level, name); when a consumer
  joins that ranks before the active one, it becomes active and the old active consumer's
  unacknowledged messages are redelivered to it. When the active consumer leaves, the next
  by rank takes over (what the old one held is redelivered, as for every departure).

Each entry goes to the active consumer whole, or as much of it as the consumer takes now; the
rest waits at the head for it. Nothing of an entry is decoded for routing.

Invariant: the active consumer is worked out once per change of the consumers (dispatch asks
for it per entry), so a decision costs the same however many consumers wait in line.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.consumer import Consumer
from broker.dispatch_reads import WaitingEntry
from broker.dispatcher import Dispatcher, Hand
from broker.errors import ConsumerBusy


def _failover_rank(consumer: Consumer) -> tuple[int, str, int]:
    """A Failover subscription's active consumer is the first by this."""
    return consumer.config.priority_level, consumer.name, consumer.id


class SingleActiveConsumerDispatcher(Dispatcher):
    def __init__(self, subscription: str, consumers: dict[Consumer, None], hand: Hand, *, failover: bool) -> None:
        """``consumers``: the subscription's, in the order they joined (followed, not copied)."""
        super().__init__(hand)
        self._subscription = subscription
        self._consumers = consumers
        self._failover = failover
        self._active_cached: tuple[Consumer | None] | None = None
        """The active consumer, until the consumers change."""

    def admit(self) -> None:
        if not self._failover and self._consumers:
            raise ConsumerBusy(f"subscription {self._subscription} is Exclusive and already has a consumer")

    def joined(self, consumer: Consumer) -> Consumer | None:
        if not self._failover:
            self._active_cached = None
            return None
        previous_active = self.active()
        active = consumer if previous_active is None else min(previous_active, consumer, key=_failover_rank)
        self._active_cached = (active,)
        return previous_active if previous_active not in (None, active) else None

    def left(self, consumer: Consumer) -> None:
        if self._active_cached is not None and self._active_cached[0] is consumer:
            self._active_cached = None

    def active(self) -> Consumer | None:
        cached = self._active_cached
        if cached is not None:
            return cached[0]
        live = [c for c in self._consumers if not c.closed]
        if not live:
            active = None
        elif self._failover:
            active = min(live, key=_failover_rank)
        else:
            active = live[0]
        self._active_cached = (active,)
        return active

    def can_dispatch(self) -> bool:
        active = self.active()
        return active is not None and active._can_take()

    def dispatch(self, waiting: WaitingEntry, offsets: Sequence[int], now: float,
                 notify: dict[Consumer, None]) -> WaitingEntry | None:
        consumer = self.active()
        if consumer is None:
            waiting.offsets = offsets
            return waiting
        self._hand(consumer, waiting, offsets, now, notify)
        return None
