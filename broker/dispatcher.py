"""A dispatcher: how a subscription of one type picks the consumers of each entry.

Role: a ``Subscription`` (``broker/subscription.py``) reads entries and keeps what consumers hold;
which consumer gets which messages of an entry is its dispatcher's, one per subscription type,
as Pulsar keeps a dispatcher class per type:

- ``broker/dispatch_single_active.py``: Exclusive and Failover (one active consumer; Pulsar's
  ``PersistentDispatcherSingleActiveConsumer``);
- ``broker/dispatch_shared.py``: Shared (round-robin; ``PersistentDispatcherMultipleConsumers``);
- ``broker/dispatch_key_shared.py``: Key_Shared (a hash ring of sticky keys;
  ``PersistentStickyKeyDispatcherMultipleConsumers``).

The subscription makes a new dispatcher when its type changes, which it does only while no
consumer is connected (as Pulsar's subscription does), so a dispatcher never sees another
type's consumers. A dispatcher hands what it chose through the subscription's ``hand`` (as
much of the offsets as the consumer takes now; the rest waits at the head), which does the
bookkeeping. Everything here runs under the subscription's lock.

Invariant: a dispatcher keeps what its decisions need as the consumers change (the active
consumer, the turn of those with permits, the ring), so no decision rebuilds it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from broker.consumer import Consumer
from broker.dispatch_reads import WaitingEntry

Hand = Callable[[Consumer, WaitingEntry, Sequence[int], float, dict[Consumer, None]], None]
"""The subscription's ``_hand(consumer, waiting, offsets, now, notify)``: give ``consumer`` as
much of ``offsets`` of ``waiting`` as it takes now (the rest waits again at the head) and note
it in ``notify`` (the consumers to tell that runs wait)."""


class Dispatcher(ABC):
    def __init__(self, hand: Hand) -> None:
        self._hand = hand

    def admit(self) -> None:  # noqa: B027 (most types admit every consumer)
        """Before a consumer joins: raise ``ConsumerBusy`` when the type allows no more."""

    def joined(self, consumer: Consumer) -> Consumer | None:
        """``consumer`` joined (it is among the subscription's consumers now); the consumer that
        lost its activity to it, if any, whose unacknowledged messages go to the new one."""
        return None

    def left(self, consumer: Consumer) -> None:  # noqa: B027 (nothing to forget on most types)
        """``consumer`` left (closed, out of the subscription's consumers, its permits gone)."""

    def active(self) -> Consumer | None:
        """The consumer everything goes to (Exclusive and Failover), None on the other types."""
        return None

    @abstractmethod
    def can_dispatch(self) -> bool:
        """Whether a consumer can take a message now."""

    @abstractmethod
    def dispatch(self, waiting: WaitingEntry, offsets: Sequence[int], now: float,
                 notify: dict[Consumer, None]) -> WaitingEntry | None:
        """Hand ``offsets`` of ``waiting`` (all undelivered) to the consumers that take them;
        what no consumer can take now is returned, to wait."""
