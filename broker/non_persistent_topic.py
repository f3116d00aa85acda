"""Non-persistent topics (``non-persistent://``): at-most-once, in memory, nothing stored.

Role: Pulsar's ``NonPersistentTopic``. A publish (:meth:`NonPersistentTopic.append`, the same
call a producer makes on a ``PersistentTopic``, so ``broker/producer.py`` and every transport's
producer serve both) numbers each entry and offers it at once to each subscription
(``broker/non_persistent_subscription.py``), which hands it to one connected consumer with room or
drops it; the receipt follows immediately, whatever the consumers did. Message ids have ledger id
0, as Pulsar's non-persistent receipts do, and an entry id that counts the topic's entries since
it was loaded (Pulsar answers ``0:0`` to every send; distinct ids keep a client's receipts and
acknowledgements apart). Deduplication, conditional appends, seeks, backlogs and
acknowledgements do not apply (Pulsar's non-persistent topics have none either).

``NonPersistentTopics`` (``service.topics.non_persistent``) holds the live ones: a topic exists
while it has a producer or a subscription, and a subscription while it has a consumer; a
partitioned non-persistent topic is its partition count in the metadata store, like a persistent
one (``broker/topic_resources.py``, under its own domain). A topic lives by the quotas its
namespace's and its own policies give it when it goes live (producers, consumers,
subscriptions, publish rate); policy changes reach it when it next goes live.

Invariants: nothing is kept per message beyond what consumers' outboxes hold (each bounded by
``consumer_pending_bytes_max``); the publisher never waits for a consumer; entries reach each
subscription in publish order (offered under the topic's lock); a broker restart leaves no
non-persistent topic, subscription or message behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from broker.consumer import Consumer, ConsumerConfig
from broker.delivery import EntryRun
from broker.entry_builder import PreparedEntry
from broker.errors import MagnetarError, NotAllowed, NotFound
from broker.key_index.derived import DcbCondition
from broker.message_fields import ExpectedVersion
from broker.message_id import Position
from broker.non_persistent_subscription import NonPersistentSubscription, Offered, Rate
from broker.quotas import TopicLimits, TopicQuotas
from broker.subscription_type import SubscriptionType
from broker.topic import PublishResult
from broker.topic_name import TopicName
from broker.topic_resources import TopicResources
from storage import new_future

NON_PERSISTENT = "non-persistent"
LEDGER_ID = 0
"""The ledger id of every non-persistent message id (Pulsar's)."""


class NonPersistentTopic:
    def __init__(self, name: TopicName, *, on_idle: Callable[[NonPersistentTopic], None],
                 limits: TopicLimits | None = None, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.quotas = TopicQuotas(name.full_name, clock)
        if limits is not None:
            self.quotas.apply(limits)
        self._on_idle = on_idle
        self._clock = clock
        self._lock = threading.RLock()
        """Held while entries are offered (publish order); a consumer's listener, called under it,
        may close its consumer and so come back here."""
        self._subscriptions: dict[str, NonPersistentSubscription] = {}
        self._publishers: dict[str, int] = {}
        """Producer name -> how many producers of that name are open."""
        self._entries = 0
        self._messages = 0
        self.msg_in = Rate()
        self.bytes_in = Rate()

    @property
    def partition(self) -> int:
        return self.name.partition_index

    # --- publishing ----------------------------------------------------------------------
    def append(self, entries: Sequence[PreparedEntry], *, producer_name: str, expected_offset: int | None = None,
               expected_key_versions: Mapping[str, ExpectedVersion] | None = None,
               dcb_condition: DcbCondition | None = None) -> Future[list[PublishResult | MagnetarError]]:
        """Offer each entry to the subscriptions now; the Future is already done."""
        if expected_offset is not None or expected_key_versions is not None or dcb_condition is not None:
            raise NotAllowed(f"{self.name} is non-persistent: conditional appends need a persistent topic")
        outcomes: list[PublishResult | MagnetarError] = []
        with self._lock:
            publish_ms = int(self._clock() * 1000)
            subscriptions = list(self._subscriptions.values())
            for entry in entries:
                try:
                    data = entry.encoded(producer_name, entry.sequence_id or 0, publish_ms)
                except MagnetarError as exc:
                    outcomes.append(exc)
                    continue
                outcomes.append(self._publish(entry, data, publish_ms, subscriptions))
        result: Future[list[PublishResult | MagnetarError]] = new_future()
        result.set_result(outcomes)
        return result

    def _publish(self, entry: PreparedEntry, data: bytes, publish_ms: int,
                 subscriptions: list[NonPersistentSubscription]) -> PublishResult:
        """(Under the lock.) Number one entry and offer it to every subscription."""
        entry_id, first, count = self._entries, self._messages, entry.message_count
        self._entries += 1
        self._messages += count
        self.msg_in.add(count)
        self.bytes_in.add(len(data))
        if self.quotas.publish is not None:  # publishRate: the producer's transport pauses its reads
            self.quotas.published(count, len(data))
        run = EntryRun(self.name.full_name, LEDGER_ID, entry_id, self.partition, data, first, count,
                       range(first, first + count), 0, publish_ms)
        offered = Offered(run, entry.keys[0] if entry.keys else None)
        for subscription in subscriptions:
            subscription.offer(offered)
        return PublishResult(Position(LEDGER_ID, entry_id), self.partition, first, count, publish_ms)

    def last_sequence_id(self, producer: str) -> int:
        """-1: a non-persistent topic keeps no sequence ids (no deduplication)."""
        return -1

    def producer_opened(self, name: str) -> None:
        with self._lock:
            self._publishers[name] = self._publishers.get(name, 0) + 1

    def producer_closed(self, name: str) -> None:
        with self._lock:
            left = self._publishers.get(name, 0) - 1
            if left > 0:
                self._publishers[name] = left
            else:
                self._publishers.pop(name, None)
        self._check_idle()

    # --- subscribing -----------------------------------------------------------------------
    def subscribe(self, name: str, sub_type: SubscriptionType, config: ConsumerConfig, *,
                  outbox_bytes_max: int) -> Consumer:
        with self._lock:
            subscription = self._subscriptions.get(name)
            if subscription is None:
                self.quotas.check_subscription_room(len(self._subscriptions))
                subscription = NonPersistentSubscription(self.name.full_name, self.partition, name, sub_type,
                                                         outbox_bytes_max=outbox_bytes_max, quotas=self.quotas,
                                                         on_empty=self._subscription_empty)
            consumer = subscription.add_consumer(config, sub_type)
            self._subscriptions[name] = subscription
            return consumer

    def _subscription_empty(self, subscription: NonPersistentSubscription) -> None:
        with self._lock:
            if self._subscriptions.get(subscription.name) is subscription and not subscription.consumers:
                del self._subscriptions[subscription.name]
        self._check_idle()

    def subscriptions(self) -> list[NonPersistentSubscription]:
        with self._lock:
            return list(self._subscriptions.values())

    def idle(self) -> bool:
        with self._lock:
            return not self._subscriptions and not self._publishers

    def _check_idle(self) -> None:
        if self.idle():
            self._on_idle(self)

    # --- statistics --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Pulsar's ``NonPersistentTopicStats`` shape."""
        subscriptions = {s.name: _subscription_stats(s) for s in self.subscriptions()}
        with self._lock:
            publishers = [{"producerName": name, "msgRateIn": 0.0, "msgThroughputIn": 0.0}
                          for name in self._publishers]
        return {"msgRateIn": self.msg_in.per_second(), "msgThroughputIn": self.bytes_in.per_second(),
                "msgInCounter": self.msg_in.total, "bytesInCounter": self.bytes_in.total,
                "msgRateOut": sum(s["msgRateOut"] for s in subscriptions.values()),
                "msgOutCounter": sum(s["msgOutCounter"] for s in subscriptions.values()),
                "msgDropRate": sum(s["msgDropRate"] for s in subscriptions.values()),
                "storageSize": 0, "backlogSize": 0, "publishers": publishers,
                "subscriptions": subscriptions, "replication": {}, "deduplicationStatus": "Disabled"}


def _subscription_stats(subscription: NonPersistentSubscription) -> dict[str, Any]:
    stats = subscription.statistics()
    return {"type": stats.type, "msgRateOut": stats.msg_rate_out, "msgOutCounter": stats.msg_out_counter,
            "bytesOutCounter": stats.bytes_out_counter, "msgDropRate": subscription.drops.per_second(),
            "msgDropCounter": subscription.drops.total, "msgBacklog": 0, "isDurable": False,
            "consumers": [{"consumerName": c.name, "availablePermits": c.available_permits,
                           "msgOutCounter": c.msg_out_counter, "bytesOutCounter": c.bytes_out_counter}
                          for c in stats.consumers]}


class NonPersistentTopics:
    """The live non-persistent topics of this broker (``service.topics.non_persistent``)."""

    def __init__(self, resources: TopicResources, limits_of: Callable[[TopicName], TopicLimits],
                 clock: Callable[[], float] = time.time) -> None:
        """``limits_of``: a topic's quotas (``maxProducers``, ``maxConsumers``,
        ``maxSubscriptionsPerTopic``) from its namespace's and its own policies, when it goes live."""
        self._resources = resources
        self._limits_of = limits_of
        self._clock = clock
        self._lock = threading.Lock()
        self._topics: dict[TopicName, NonPersistentTopic] = {}

    def topic(self, name: TopicName) -> NonPersistentTopic:
        """The live topic ``name``, made live now if it is not."""
        with self._lock:
            topic = self._topics.get(name)
        if topic is not None:
            return topic
        limits = self._limits_of(name)  # NotFound for an unknown namespace
        with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                topic = self._topics[name] = NonPersistentTopic(name, on_idle=self._forget, limits=limits,
                                                                clock=self._clock)
            return topic

    def live(self, name: TopicName) -> NonPersistentTopic | None:
        with self._lock:
            return self._topics.get(name)

    def get(self, name: TopicName) -> NonPersistentTopic:
        topic = self.live(name)
        if topic is None:
            raise NotFound(f"topic {name} not found: a non-persistent topic lives while it has a producer or "
                           "a subscription")
        return topic

    def _forget(self, topic: NonPersistentTopic) -> None:
        with self._lock:
            if self._topics.get(topic.name) is topic and topic.idle():
                del self._topics[topic.name]

    def partitions(self, name: TopicName) -> int:
        return self._resources.partitions(name)

    def names(self, namespace: str) -> list[str]:
        """The namespace's live non-persistent topics and partitions (full names, sorted)."""
        with self._lock:
            return sorted(n.full_name for n in self._topics if n.namespace_name == namespace)

    def subscribe(self, name: TopicName, subscription: str, sub_type: SubscriptionType, config: ConsumerConfig, *,
                  outbox_bytes_max: int) -> Consumer:
        topic = self.topic(name)
        try:
            return topic.subscribe(subscription, sub_type, config, outbox_bytes_max=outbox_bytes_max)
        except MagnetarError:
            self._forget(topic)  # a refused first consumer leaves no topic behind
            raise

    def close(self) -> None:
        with self._lock:
            self._topics.clear()
