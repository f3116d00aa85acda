"""A subscription of a non-persistent topic: hands each message to a consumer connected now, or drops it.

Role: Pulsar's ``NonPersistentSubscription`` and its dispatchers. A non-persistent topic
(``broker/non_persistent_topic.py``) stores nothing: on each publish it offers the entry to each
of its subscriptions (:meth:`NonPersistentSubscription.offer`), which picks one consumer by its
type — the active one of an Exclusive or Failover subscription (Failover: the first by priority
level and name, as Pulsar's), the next in turn among those with room on a Shared one, the owner
of the entry's key hash on a Key_Shared one (the hash ring and Murmur3 key hash of
``broker/dispatch_key_shared.py``) — and puts the entry in that consumer's outbox, or, when that
consumer has no permits or its outbox is full (``consumer_pending_bytes_max``), drops it and
counts the drop (``msgDropRate`` in the stats). Consumers are the shared ``broker/consumer.py``
``Consumer``: transports flow, poll and close them as they do on persistent topics; this class is
their ``ConsumerSubscription``.

Invariants: nothing is kept but what sits in consumers' outboxes (bounded in bytes each); an
acknowledgement, a negative acknowledgement and a redelivery request change nothing (nothing is
stored to redeliver, as in Pulsar); the publisher never waits for a consumer; a subscription ends
when its last consumer leaves (``on_empty``); consumer state changes only under ``_lock``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.consumer import Consumer, ConsumerConfig, run_footprint
from broker.cursor import ManagedCursor
from broker.delivery import Delivery, EntryRun
from broker.dispatch_key_shared import key_hash, ring_points
from broker.errors import ConsumerBusy, NotAllowed
from broker.quotas import TopicQuotas
from broker.subscription_stats import SubscriptionStats
from broker.subscription_type import SubscriptionType
from broker.unacked import UnackedTally

RATE_PERIOD_S = 10.0
"""The period a rate (``msgDropRate``, ``msgRateIn``) is measured over: the last whole one, or the
current one so far when it is the first."""


class Rate:
    """Events per second over the last :data:`RATE_PERIOD_S`, and their total."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._current = 0
        self._previous: float | None = None
        self.total = 0

    def add(self, count: int) -> None:
        self._roll()
        self._current += count
        self.total += count

    def per_second(self) -> float:
        self._roll()
        if self._previous is not None:
            return self._previous
        return self._current / max(self._clock() - self._start, 1.0)

    def _roll(self) -> None:
        now = self._clock()
        elapsed = now - self._start
        if elapsed < RATE_PERIOD_S:
            return
        self._previous = self._current / RATE_PERIOD_S if elapsed < 2 * RATE_PERIOD_S else 0.0
        self._start, self._current = now, 0


@dataclass(frozen=True)
class Offered:
    """One published entry as a non-persistent topic offers it to its subscriptions."""

    run: EntryRun
    key: str | None


class NonPersistentSubscription:
    """Dispatch to the consumers connected now (a ``ConsumerSubscription`` for ``Consumer``)."""

    def __init__(self, topic: str, partition: int, name: str, sub_type: SubscriptionType, *,
                 outbox_bytes_max: int, quotas: TopicQuotas,
                 on_empty: Callable[[NonPersistentSubscription], None]) -> None:
        """``quotas``: the topic's, whose consumer slots (``maxConsumers``) its consumers take."""
        self.topic = topic
        self.name = name
        self.type = sub_type
        self._partition = partition
        self._outbox_bytes_max = outbox_bytes_max
        self._on_empty = on_empty
        self._quotas = quotas
        self._lock = threading.RLock()
        self._consumers: dict[Consumer, None] = {}
        self._ring: list[tuple[int, Consumer]] = []
        self._turn = 0
        self._outbox_bytes_total = 0
        self.unacked_tally = UnackedTally()
        self.drops = Rate()
        self.msg_out = Rate()

    # --- ConsumerSubscription --------------------------------------------------------------
    @property
    def partition(self) -> int:
        return self._partition

    @property
    def cursor(self) -> ManagedCursor:
        raise NotAllowed(f"{self.topic} is non-persistent: it has no cursor")

    @property
    def consumers(self) -> Mapping[Consumer, None]:
        return self._consumers

    def dispatch(self) -> None:
        """Nothing is stored to read: entries arrive through :meth:`offer`."""

    def active_consumer(self) -> Consumer | None:
        with self._lock:
            ordered = sorted(self._consumers, key=lambda c: (c.config.priority_level, c.name))
            return ordered[0] if ordered else None

    def end_of_topic(self) -> bool:
        return False

    def backlog_messages(self) -> int:
        return 0

    def remove_consumer(self, consumer: Consumer) -> None:
        with self._lock:
            if consumer not in self._consumers:
                return
            del self._consumers[consumer]
            self._quotas.remove_consumer()
            if self.type is SubscriptionType.KEY_SHARED:
                self._ring = [point for point in self._ring if point[1] is not consumer]
            consumer.closed = True
            consumer.permits = 0
            consumer.outbox.clear()
            consumer.outbox_bytes = 0
            empty = not self._consumers
        if empty:
            self._on_empty(self)

    def _permits_changed(self, consumer: Consumer, old: int, new: int) -> None:
        """Who has permits is found by asking each consumer as entries arrive."""

    def _flow(self, consumer: Consumer, permits: int) -> None:
        with self._lock:
            if not consumer.closed:
                consumer.permits = consumer.permits + permits

    def _taken(self, was_full: bool) -> None:
        """Nothing waits for room: an entry without room was dropped."""

    def _holds(self, consumer: Consumer, delivery: Delivery) -> bool:
        return True

    def _ack(self, consumer: Consumer, offsets: list[int]) -> None:
        """Nothing is stored to acknowledge."""

    def _ack_cumulative(self, consumer: Consumer, offset: int) -> None:
        """Nothing is stored to acknowledge."""

    def _nack(self, consumer: Consumer, offsets: list[int]) -> None:
        """Nothing is stored to redeliver."""

    def _withdraw(self, consumer: Consumer) -> None:
        with self._lock:
            consumer.permits = 0
            consumer.outbox.clear()
            consumer.outbox_bytes = 0

    # --- consumers ---------------------------------------------------------------------------
    def add_consumer(self, config: ConsumerConfig, sub_type: SubscriptionType) -> Consumer:
        """A new consumer (``ConsumerBusy``: another type, or a second on an Exclusive one)."""
        with self._lock:
            if self._consumers and sub_type is not self.type:
                raise ConsumerBusy(f"subscription {self.name} is {self.type.value}, not {sub_type.value}")
            if self._consumers and sub_type is SubscriptionType.EXCLUSIVE:
                raise ConsumerBusy(f"exclusive subscription {self.name} of {self.topic} already has a consumer")
            self._quotas.add_consumer()  # ConsumerBusy at the topic's maxConsumers
            self.type = sub_type
            consumer = Consumer(self, config, self._outbox_bytes_max)
            self._consumers[consumer] = None
            if sub_type is SubscriptionType.KEY_SHARED:
                for point in ring_points(consumer):
                    bisect.insort_right(self._ring, (point, consumer), key=lambda pair: pair[0])
            return consumer

    # --- dispatch ----------------------------------------------------------------------------
    def offer(self, offered: Offered) -> None:
        """Hand one published entry to the consumer whose turn it is, if it has room; else drop it."""
        run = offered.run
        with self._lock:
            consumer = self._choose(offered.key)
            if consumer is None or not self._has_room(consumer):
                self.drops.add(len(run.offsets))
                return
            consumer.outbox.append(run)
            consumer.outbox_bytes = consumer.outbox_bytes + run_footprint(run)
            consumer.permits = consumer.permits - len(run.offsets)
            consumer.msg_out += len(run.offsets)
            consumer.bytes_out += len(run.data)
            self.msg_out.add(len(run.offsets))
            listener = consumer.listener
        if listener is not None:
            listener()

    def _has_room(self, consumer: Consumer) -> bool:
        return not consumer.closed and consumer.permits > 0 and consumer.outbox_bytes < self._outbox_bytes_max

    def _choose(self, key: str | None) -> Consumer | None:
        """(Under the lock.) The consumer this entry is for, by the subscription's type."""
        if not self._consumers:
            return None
        if self.type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            return self.active_consumer()
        if self.type is SubscriptionType.KEY_SHARED and key is not None and self._ring:
            hashed = key_hash(key)
            return self._ring[bisect.bisect_left(self._ring, hashed, key=lambda pair: pair[0]) % len(self._ring)][1]
        consumers = list(self._consumers)
        for step in range(len(consumers)):  # Shared (and keyless Key_Shared): the next with room
            candidate = consumers[(self._turn + step) % len(consumers)]
            if self._has_room(candidate):
                self._turn = (self._turn + step + 1) % len(consumers)
                return candidate
        return None

    # --- statistics --------------------------------------------------------------------------
    def statistics(self) -> SubscriptionStats:
        with self._lock:
            consumers = tuple(c.statistics() for c in self._consumers)
            out = sum(c.msg_out for c in self._consumers)
            out_bytes = sum(c.bytes_out for c in self._consumers)
        return SubscriptionStats(self.name, self.type.value, False, 0, 0, 0, out, out_bytes, 0, 0,
                                 self.msg_out.per_second(), 0.0, 0.0, -1, -1, consumers)
