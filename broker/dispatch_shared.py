"""Shared subscriptions: round-robin among the consumers with permits, an entry at a time.

Role: the dispatcher (``broker/dispatcher.py``) of Shared subscriptions, Pulsar's
``PersistentDispatcherMultipleConsumers``. The consumer whose turn it is gets as much of an
entry as its permits and limits allow, the next one the rest; a departing consumer's
unacknowledged messages go to the others (redelivered). Routing decodes an entry's delivery
time only (delayed delivery), never its messages. Key_Shared
(``broker/dispatch_key_shared.py``) spreads messages without a key the same way.

Invariant: the turn walks only the consumers with permits, which the subscription keeps as
permits change (``with_permits``, in the order they are served next): the consumer served goes
to the end of the turn, so a decision costs the same however many consumers have none.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.consumer import Consumer
from broker.dispatch_reads import WaitingEntry
from broker.dispatcher import Dispatcher, Hand


class SharedDispatcher(Dispatcher):
    def __init__(self, with_permits: dict[Consumer, None], hand: Hand) -> None:
        """``with_permits``: the subscription's open consumers with permits, in the order they
        are served next (followed, not copied; reordered here as they are served)."""
        super().__init__(hand)
        self._with_permits = with_permits

    def can_dispatch(self) -> bool:
        return any(c._can_take() for c in self._with_permits)

    def next_in_turn(self) -> Consumer | None:
        """Round-robin among the consumers with permits: the first that can take, which then
        goes to the end of the turn."""
        with_permits = self._with_permits
        consumer = next((c for c in with_permits if c._can_take()), None)
        if consumer is not None:
            del with_permits[consumer]
            with_permits[consumer] = None
        return consumer

    def dispatch(self, waiting: WaitingEntry, offsets: Sequence[int], now: float,
                 notify: dict[Consumer, None]) -> WaitingEntry | None:
        consumer = self.next_in_turn()
        if consumer is None:
            waiting.offsets = offsets
            return waiting
        self._hand(consumer, waiting, offsets, now, notify)
        return None
