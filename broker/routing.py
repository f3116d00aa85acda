"""Partitioned topics and multi-topic consumption.

``PartitionRouter`` picks a producer's partition as Pulsar's clients do: a keyed message goes
to ``murmur3_32(key) % partitions`` (so a key always lands on the same partition), an unkeyed
one round-robin (``RoundRobinPartition``) or always to one partition chosen once
(``SinglePartition``).

``MultiConsumer`` presents the consumers of several topic partitions (a partitioned topic, a
topic list, or every topic of a namespace matching a pattern) as one: it polls them in turn
and routes acks back by topic. A pattern consumer picks up topics created later through
:meth:`MultiConsumer.add` (the broker service calls it when a matching topic appears).
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable

import mmh3

from broker.consumer import Consumer
from broker.delivery import EntryRun
from broker.errors import InvalidRequest
from broker.message_id import MessageId


class PartitionRouter:
    def __init__(self, partitions: int, mode: str = "RoundRobinPartition") -> None:
        if partitions < 1:
            raise InvalidRequest("a partitioned topic has at least one partition")
        if mode not in ("RoundRobinPartition", "SinglePartition"):
            raise InvalidRequest(f"unknown messageRoutingMode {mode!r}")
        self.partitions = partitions
        self.mode = mode
        self._next = itertools.count(random.randrange(partitions))
        self._single = random.randrange(partitions)

    @staticmethod
    def key_partition(key: str, partitions: int) -> int:
        return (mmh3.hash(key.encode(), 0, signed=True) & 0x7FFFFFFF) % partitions

    def partition_for(self, key: str | None) -> int:
        if key is not None:
            return self.key_partition(key, self.partitions)
        if self.mode == "SinglePartition":
            return self._single
        return next(self._next) % self.partitions


class MultiConsumer:
    """One consumer over many topics: the runs it hands out carry their topic; acks go back to it."""

    def __init__(self) -> None:
        self._consumers: dict[str, Consumer] = {}
        self._order: list[str] = []
        self._turn = 0
        self._lock = threading.Lock()
        self.listener: Callable[[], None] | None = None
        self._closed = False
        self._close_hooks: list[Callable[[], None]] = []

    def on_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` once this consumer is closed (a pattern consumer stops following topics)."""
        with self._lock:
            if not self._closed:
                self._close_hooks.append(hook)
                return
        hook()

    def add(self, topic: str, consumer: Consumer) -> None:
        """Take ``consumer`` of ``topic`` in; once closed (or for a topic already held) the
        consumer is closed instead, so no broker consumer outlives its handle."""
        with self._lock:
            if not self._closed and topic not in self._consumers:
                self._consumers[topic] = consumer
                self._order.append(topic)
                consumer.listener = self._notify
                return
            held = self._consumers.get(topic)
        if consumer is not held:
            consumer.close()

    def _notify(self) -> None:
        if self.listener is not None:
            self.listener()

    def topics(self) -> list[str]:
        return list(self._order)

    def flow(self, permits: int) -> None:
        """Spread ``permits`` over the topics (each gets at least one while any remain)."""
        with self._lock:
            consumers = [self._consumers[t] for t in self._order]
        if not consumers:
            return
        share, extra = divmod(permits, len(consumers))
        for index, consumer in enumerate(consumers):
            consumer.flow(share + (1 if index < extra else 0))

    def poll(self) -> EntryRun | None:
        with self._lock:
            order = list(self._order)
            start = self._turn
        for step in range(len(order)):
            topic = order[(start + step) % len(order)]
            run = self._consumers[topic].poll()
            if run is not None:
                self._turn = (start + step + 1) % len(order)
                return run
        return None

    def poll_all(self) -> list[EntryRun]:
        """Everything waiting, topic by topic from the next one's turn on (each topic's runs in
        their order)."""
        with self._lock:
            order = list(self._order)
            start = self._turn
            if order:
                self._turn = (start + 1) % len(order)
        taken: list[EntryRun] = []
        for step in range(len(order)):
            taken.extend(self._consumers[order[(start + step) % len(order)]].poll_all())
        return taken

    def locate(self, message_id: MessageId) -> tuple[str, int]:
        """The (partition topic, offset) of a message of this consumer's topics, by its id."""
        with self._lock:
            consumers = [(t, self._consumers[t]) for t in self._order]
        for topic, consumer in consumers:
            partition = consumer.subscription.partition
            if partition == message_id.partition or (partition < 0 and message_id.partition < 0):
                return topic, consumer.locate(message_id)
        raise InvalidRequest(f"message id {message_id} does not belong to this consumer's topics")

    def end_of_topic(self) -> bool:
        """Every topic is terminated and acknowledged to its end."""
        with self._lock:
            consumers = list(self._consumers.values())
        return all(c.subscription.end_of_topic() for c in consumers)

    def consumer_for(self, topic: str) -> Consumer:
        consumer = self._consumers.get(topic)
        if consumer is None:
            raise InvalidRequest(f"this consumer does not read {topic}")
        return consumer

    @property
    def unloaded(self) -> bool:
        """Every underlying consumer was closed because its topic moved to another broker."""
        with self._lock:
            consumers = list(self._consumers.values())
        return bool(consumers) and all(c.unloaded for c in consumers)

    @property
    def closed(self) -> bool:
        """Closed by this handle, or every underlying consumer was closed by the broker (e.g. a
        forced subscription delete)."""
        with self._lock:
            consumers = list(self._consumers.values())
            closed = self._closed
        return closed or (bool(consumers) and all(c.closed for c in consumers))

    def replenish(self, window: int) -> None:
        """Push-mode flow control: keep each topic partition's consumer at its share of
        ``window`` messages granted or unacknowledged. A share is refilled once half of it is
        used (as Pulsar's clients refill their receiver queue at half: one flow, and one
        dispatch, per half share instead of per ack), or at once when it has no permit left, so
        a consumer never waits on credit; shares are independent, so permits a caught-up
        partition holds never starve a partition with a backlog."""
        with self._lock:
            consumers = list(self._consumers.values())
        if not consumers:
            return
        share = max(1, window // len(consumers))
        for consumer in consumers:
            missing = share - (consumer.permits + len(consumer.unacked))
            if missing > 0 and (missing >= share // 2 or consumer.permits == 0):
                consumer.flow(missing)

    def available_permits(self) -> int:
        """Permits granted and not yet used, over all topics."""
        with self._lock:
            consumers = list(self._consumers.values())
        return sum(c.permits for c in consumers)

    def held_messages(self) -> int:
        """Messages granted or delivered and not yet acknowledged, over all topics (flow credit in use)."""
        with self._lock:
            consumers = list(self._consumers.values())
        return sum(c.permits + len(c.unacked) for c in consumers)

    def ack(self, topic: str, offsets: list[int]) -> None:
        self.consumer_for(topic).ack(offsets)

    def nack(self, topic: str, offsets: list[int]) -> None:
        self.consumer_for(topic).nack(offsets)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            consumers = list(self._consumers.values())
            self._consumers.clear()
            self._order.clear()
            hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            hook()
        for consumer in consumers:
            consumer.close()
