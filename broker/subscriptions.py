"""Subscriptions, readers and topic-list watchers: how transports consume.

Role: ``BrokerService.subscriptions``. It opens a subscription on a topic partition (its
cursor, dispatch on the broker's dispatch scheduler, the reads-in-flight budget) and adds the
transport's consumers to it (``subscribe``; ``subscribe_many`` over several topics, a
partitioned one contributing all its partitions; ``subscribe_pattern`` over the topics of a
namespace whose names match, now and later); unsubscribes and deletes subscriptions; moves
cursors administratively (``move_cursor``: an active subscription repositions its dispatch);
opens readers (``broker/reader.py``); follows the topic list of a namespace for the binary
protocol's watchers (``watch_topics``, Pulsar's ``TopicListService``); and dead-letters what
a subscription gives up on, exactly once. A subscription of a ``non-persistent://`` topic is
the live topic's own (``broker/non_persistent_topic.py``): it ends with its last consumer.

It follows the topic registry (``broker/topic_registry.py``): a topic loaded there is offered
to the patterns and announced to the watchers, a deleted one announced, and the subscriptions
of unloaded topics are dropped (their consumers closed and marked ``unloaded``).

Invariants: one ``Subscription`` per (topic partition, name); a subscription with connected
consumers is not removed (``ConsumerBusy``) unless forced; a new subscription fits the topic's
``maxSubscriptionsPerTopic``; at most ``TOPIC_WATCHERS_MAX`` watchers in all. The registry is
never called under this part's lock (the registry calls in under its own).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from broker.byte_budget import ByteBudget
from broker.compaction import Compactions
from broker.consumer import Consumer, ConsumerConfig
from broker.cursor import ManagedCursor
from broker.delivery import Delivery
from broker.dispatch_scheduling import DispatchScheduler
from broker.entry_builder import entry_of_messages
from broker.entry_format import Message
from broker.errors import ConsumerBusy, InvalidRequest, MagnetarError, NotAllowed, NotFound, PreconditionFailed
from broker.limits import CURSOR_MOVE_WAIT_S_MAX, DEAD_LETTER_WAIT_S_MAX, PATTERN_BYTES_MAX, TOPIC_WATCHERS_MAX
from broker.reader import Reader, StartPosition
from broker.routing import MultiConsumer
from broker.subscription import Subscription, SubscriptionLimits
from broker.subscription_type import SubscriptionType
from broker.topic import PersistentTopic
from broker.topic_name import TopicName, check_namespace
from broker.topic_pattern import TopicPattern
from broker.topic_registry import TopicRegistry

log = logging.getLogger(__name__)


_Pattern = tuple[TopicPattern, MultiConsumer, Callable[[TopicName], Consumer]]


@dataclass(frozen=True)
class SubscriptionsStats:
    subscriptions: int
    """Open subscriptions (durable and non-durable) of loaded topics."""
    patterns: int
    """Pattern consumers following the topics of their namespace."""
    topic_watchers: int
    """Listeners following a namespace's topic list (at most ``TOPIC_WATCHERS_MAX``)."""


class Subscriptions:
    def __init__(self, topics: TopicRegistry, compactions: Compactions, dispatch: DispatchScheduler,
                 budget: ByteBudget, limits: SubscriptionLimits, clock: Callable[[], float]) -> None:
        """``budget``: the broker-wide reads in flight; ``limits``: each subscription's."""
        self._topics = topics
        self._compactions = compactions
        self._dispatch = dispatch
        self._budget = budget
        self._limits = limits
        self._clock = clock
        self._lock = threading.RLock()
        self._subscriptions: dict[tuple[TopicName, str], Subscription] = {}
        self._by_topic: dict[TopicName, dict[str, Subscription]] = {}
        self._patterns: list[_Pattern] = []
        self._watchers: dict[str, dict[Callable[[str, bool], None], None]] = {}
        self._watcher_count = 0
        topics.on_loaded(self._topic_loaded)
        topics.on_deleted(lambda name: self._tell_watchers(name, exists=False))
        topics.on_unloaded(self._drop)

    # --- subscribing -------------------------------------------------------------------------
    def subscription(self, topic_name: TopicName, name: str, sub_type: SubscriptionType, *,
                     initial: str | int = "latest", durable: bool = True) -> Subscription:
        """Subscription ``name`` of one topic partition, opened at ``initial`` if it is new."""
        topic = self._topics.topic(topic_name)
        with self._lock:
            key = (topic_name, name)
            existing = self._subscriptions.get(key)
            if existing is not None:
                if existing.type is not sub_type and existing.consumers:
                    raise ConsumerBusy(f"subscription {name} is {existing.type.value}, not {sub_type.value}")
                existing.type = sub_type
                return existing
            self._check_room(topic, name)
            cursor = topic.cursors.open(name, initial=initial, durable=durable)
            created = Subscription(topic_name.full_name, topic_name.partition_index, cursor, sub_type,
                                   clock=self._clock, limits=self._limits, dead_letter=self._dead_letter,
                                   schedule=self._dispatch.schedule, budget=self._budget,
                                   quotas=topic.quotas, schedule_after=self._dispatch.schedule_after)
            self._subscriptions[key] = created
            self._by_topic.setdefault(topic_name, {})[name] = created
            return created

    def subscribe(self, topic: str | TopicName, name: str, sub_type: SubscriptionType, config: ConsumerConfig, *,
                  initial: str | int = "latest", durable: bool = True, compacted: bool = False) -> Consumer:
        """A consumer of subscription ``name``; ``compacted`` (Exclusive and Failover only, as
        in Pulsar) makes the subscription read the topic's compacted view below its compaction
        horizon, then the topic itself."""
        topic_name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        if not topic_name.persistent:
            if compacted:
                raise NotAllowed("read-compacted subscriptions need a persistent topic")
            return self._topics.non_persistent.subscribe(
                topic_name, name, sub_type, config, outbox_bytes_max=self._limits.consumer_pending_bytes_max)
        if compacted and sub_type not in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            raise NotAllowed("read-compacted subscriptions are Exclusive or Failover")
        subscription = self.subscription(topic_name, name, sub_type, initial=initial, durable=durable)
        if compacted:
            subscription.read_compacted(self._compactions.compactor(topic_name).view)
        return subscription.add_consumer(config)

    def subscribe_many(self, topics: list[str], name: str, sub_type: SubscriptionType, config: ConsumerConfig, *,
                       initial: str | int = "latest", durable: bool = True) -> MultiConsumer:
        """One consumer over several topics; a partitioned topic contributes all its partitions."""
        multi = MultiConsumer()
        for topic in topics:
            for partition in self._topics.expand_partitions(TopicName.parse(topic)):
                multi.add(partition.full_name, self.subscribe(partition, name, sub_type, config,
                                                              initial=initial, durable=durable))
        return multi

    def subscribe_pattern(self, namespace: str, pattern: str, name: str, sub_type: SubscriptionType,
                          config: ConsumerConfig, *, initial: str | int = "latest",
                          pattern_bytes_max: int = PATTERN_BYTES_MAX) -> MultiConsumer:
        """Every topic of ``namespace`` whose full name matches ``pattern``, now and later,
        until the returned consumer is closed (then it follows no new topic)."""
        compiled = TopicPattern(namespace, pattern, bytes_max=pattern_bytes_max)
        multi = MultiConsumer()

        def join(topic_name: TopicName) -> Consumer:
            return self.subscribe(topic_name, name, sub_type, config, initial=initial)

        entry = (compiled, multi, join)
        with self._lock:
            self._patterns.append(entry)
        multi.on_close(lambda: self._forget_pattern(entry))
        for full_name in self._topics.names(namespace):
            self._offer_to_patterns(TopicName.parse(full_name))
        return multi

    def _forget_pattern(self, entry: _Pattern) -> None:
        with self._lock:
            if entry in self._patterns:
                self._patterns.remove(entry)

    def _offer_to_patterns(self, topic_name: TopicName) -> None:
        with self._lock:
            patterns = list(self._patterns)
        for compiled, multi, join in patterns:
            if compiled.matches(topic_name.namespace_name, topic_name.full_name) \
                    and topic_name.full_name not in multi.topics():
                multi.add(topic_name.full_name, join(topic_name))

    def check_room(self, name: TopicName, subscription: str) -> None:
        """``QuotaExceeded`` when ``subscription`` would be a new one beyond the topic's
        ``maxSubscriptionsPerTopic`` (durable ones and active non-durable ones count)."""
        self._check_room(self._topics.topic(name, create=False), subscription)

    def _check_room(self, topic: PersistentTopic, subscription: str) -> None:
        if topic.quotas.limits.subscriptions_max <= 0 or topic.cursors.get(subscription) is not None:
            return
        with self._lock:
            names = set(topic.cursors.names()) | set(self._by_topic.get(topic.name, {}))
        if subscription not in names:
            topic.quotas.check_subscription_room(len(names))

    def reader(self, topic: str | TopicName, start: StartPosition, *, compacted: bool = False) -> Reader:
        topic_name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        compactor = self._compactions.compactor(topic_name) if compacted else None
        return Reader(self._topics.topic(topic_name), start, compactor=compactor, budget=self._budget,
                      read_bytes_max=self._limits.read_bytes_max)

    def of(self, topic_name: TopicName) -> list[Subscription]:
        """The open subscriptions of one topic partition."""
        with self._lock:
            return list(self._by_topic.get(topic_name, {}).values())

    # --- removing and moving ------------------------------------------------------------------
    def unsubscribe(self, topic_name: TopicName, name: str) -> None:
        if not topic_name.persistent:
            return  # a non-persistent subscription ends with its last consumer
        topic = self._topics.topic(topic_name, create=False)
        with self._lock:
            subscription = self._subscriptions.get((topic_name, name))
            if subscription is not None and subscription.consumers:
                raise ConsumerBusy(f"subscription {name} has active consumers")
            if subscription is not None:
                subscription.detach()
                del self._subscriptions[(topic_name, name)]
                of_topic = self._by_topic[topic_name]
                del of_topic[name]
                if not of_topic:
                    del self._by_topic[topic_name]
        if subscription is None or subscription.cursor.durable:  # a non-durable cursor is nowhere else
            topic.cursors.delete(name)

    def delete(self, topic_name: TopicName, name: str, *, force: bool = False) -> None:
        """Delete subscription ``name``: refused (``PreconditionFailed``) while consumers are
        connected, unless ``force``, which disconnects them first (their listeners are told)."""
        self._topics.topic(topic_name, create=False)
        with self._lock:
            subscription = self._subscriptions.get((topic_name, name))
        if subscription is not None and subscription.consumers:
            if not force:
                raise PreconditionFailed(f"subscription {name} of {topic_name} has connected consumers")
            for consumer in list(subscription.consumers):
                consumer.close()
                if consumer.listener is not None:
                    consumer.listener()
        self.unsubscribe(topic_name, name)

    def move_cursor(self, topic_name: TopicName, name: str,
                    move: Callable[[ManagedCursor], Future[None] | None]) -> None:
        """Apply an administrative move (reset, skip, expiry) to the cursor of subscription
        ``name`` and wait until it is persisted. An active subscription applies it through
        :meth:`Subscription.reposition`, so its consumers follow the new position."""
        topic = self._topics.topic(topic_name, create=False)
        with self._lock:
            subscription = self._subscriptions.get((topic_name, name))
        cursor = topic.cursors.get(name) or (subscription.cursor if subscription is not None else None)
        if cursor is None:  # a non-durable cursor (a reader's) lives only in its subscription
            raise NotFound(f"subscription {name} of {topic_name} does not exist")
        with self._lock:
            subscription = self._subscriptions.get((topic_name, name))
            if subscription is None:  # under the lock: no subscription can start meanwhile
                future = move(cursor)
        if subscription is not None:
            future = subscription.reposition(lambda: move(cursor))
        if future is not None:
            future.result(timeout=CURSOR_MOVE_WAIT_S_MAX)

    def _dead_letter(self, target: str, delivery: Delivery, subscription: str) -> None:
        """Publish to the DLQ exactly once: each dead-lettered message has its own producer
        identity (source topic, subscription, offset) with sequence id 0, so a replay after a
        crash between this publish and the source ack is deduplicated."""
        message = delivery.message
        properties = {**message.properties, "REAL_TOPIC": delivery.topic,
                      "ORIGIN_MESSAGE_ID": delivery.message_id.to_rest()}
        entry = entry_of_messages([Message(payload=message.payload, key=message.key, properties=properties,
                                           event_time_ms=message.event_time_ms)], sequence_id=0)
        outcome = self._topics.topic(target).append(
            [entry], producer_name=f"DLQ:{delivery.topic}:{subscription}:{delivery.offset}",
        ).result(timeout=DEAD_LETTER_WAIT_S_MAX)[0]
        if isinstance(outcome, MagnetarError):
            raise outcome

    # --- topic lists ---------------------------------------------------------------------------
    def watch_topics(self, namespace: str, listener: Callable[[str, bool], None]) -> Callable[[], None]:
        """Call ``listener(full_topic_name, exists)`` when a topic of ``namespace`` is opened by this
        broker (created, or first used since the start: a listener may hear of a topic it already
        listed) or deleted, on the thread that did it, until the returned function is called.
        At most ``TOPIC_WATCHERS_MAX`` listeners in all (``InvalidRequest`` beyond); watching and
        unwatching cost the same however many there are."""
        key = "/".join(check_namespace(namespace))
        with self._lock:
            if self._watcher_count >= TOPIC_WATCHERS_MAX:
                raise InvalidRequest(f"this broker already follows {TOPIC_WATCHERS_MAX} topic lists")
            listeners = self._watchers.setdefault(key, {})
            if listener not in listeners:
                listeners[listener] = None
                self._watcher_count += 1

        def unwatch() -> None:
            with self._lock:
                listeners = self._watchers.get(key, {})
                if listener in listeners:
                    del listeners[listener]
                    self._watcher_count -= 1
                if not listeners:
                    self._watchers.pop(key, None)

        return unwatch

    def _tell_watchers(self, topic_name: TopicName, *, exists: bool) -> None:
        with self._lock:
            listeners = list(self._watchers.get(topic_name.namespace_name, ()))
        for listener in listeners:
            try:
                listener(topic_name.full_name, exists)
            except Exception:
                log.exception("a topic-list listener failed")

    def _topic_loaded(self, topic_name: TopicName) -> None:
        self._offer_to_patterns(topic_name)
        self._tell_watchers(topic_name, exists=True)

    # --- maintenance, unloading, closing ------------------------------------------------------
    def tick(self) -> None:
        """Apply ack timeouts, release due redeliveries, update the rates (maintenance)."""
        with self._lock:
            subscriptions = list(self._subscriptions.values())
        for subscription in subscriptions:
            subscription.tick()

    def _drop(self, names: list[TopicName]) -> None:
        """The topics stopped being served here: disconnect their consumers (``unloaded``, so
        clients look the topics up again) and let go of their subscriptions."""
        dropped = []
        with self._lock:
            for name in names:
                for sub_name, subscription in self._by_topic.pop(name, {}).items():
                    self._subscriptions.pop((name, sub_name), None)
                    dropped.append(subscription)
        for subscription in dropped:
            for consumer in list(subscription.consumers):
                consumer.unloaded = True
                consumer.close()
                if consumer.listener is not None:
                    consumer.listener()
            subscription.detach()

    def close(self) -> None:
        """Detach every subscription (before the topics close)."""
        with self._lock:
            for subscription in self._subscriptions.values():
                subscription.detach()
            self._subscriptions.clear()
            self._by_topic.clear()

    def statistics(self) -> SubscriptionsStats:
        with self._lock:
            return SubscriptionsStats(len(self._subscriptions), len(self._patterns), self._watcher_count)
