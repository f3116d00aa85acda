"""The topic registry: the topics this broker has loaded, and how a topic comes to be.

Role: ``BrokerService.topics`` (Pulsar's ``BrokerService.getTopic`` and the topics map behind
it). It loads a topic on first use (its managed ledger, cursors, deduplication state, key
index partition and quotas), creating it when auto-creation allows; creates, lists and deletes
topics and partitioned topics (their metadata in ``broker/topic_resources.py``); routes a
message to its partition; opens producers; and stops serving topics whose bundle went away
(``unload``). Non-persistent topics are never loaded here: ``non_persistent`` holds the live
ones (``broker/non_persistent_topic.py``), and ``producer`` opens producers on them too.
Whether a topic may be loaded here at all is the namespace service's answer
(``broker/namespace/service.py``); so are the policies an open topic lives by, which it
follows as they change.

Who follows it: parts that keep state per topic register here (``on_loaded``, ``on_deleted``,
``on_unloaded``: subscriptions, topic-list watchers and patterns, compactors), and transports
hear of unloaded topics through the listeners list ``BrokerService.add_unload_listener`` fills,
after those parts have let go of them.

Invariants: one ``PersistentTopic`` per name at a time, loaded under the registry's lock (a
topic is announced to followers once it is in the map); a topic a cluster broker does not own
is never loaded (``TopicNotOwned``/``ServiceUnitNotReady``); a new topic or partitioned topic
fits the namespace's ``maxTopicsPerNamespace``; an operation on a partitioned topic's base name
that only its partitions support is refused (``NotAllowed``); an unloaded topic's key index
partition goes with it (after a last checkpoint when the unload is graceful).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.cursor import CursorManager
from broker.entry_format import Compression
from broker.errors import (
    AlreadyExists,
    EncryptionRequired,
    InvalidRequest,
    MagnetarError,
    NotAllowed,
    NotFound,
    ServiceUnitNotReady,
    TopicTerminated,
)
from broker.key_index import KeyIndex
from broker.limits import PARTITIONS_MAX
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.managed_ledger_factory import ManagedLedgerFactory
from broker.namespace.persistence import quorum_for
from broker.namespace.policies import OFFLOAD_POLICY_FIELDS
from broker.namespace.service import NamespaceService
from broker.non_persistent_topic import NonPersistentTopics
from broker.producer import Producer
from broker.quotas import QuotaDefaults, TopicLimits, TopicQuotas, check_topics_room, resolve_limits, topics_max
from broker.routing import PartitionRouter
from broker.topic import PersistentTopic
from broker.topic_name import TopicName
from broker.topic_resources import TopicResources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicDefaults:
    """What a topic lives by where its namespace and its own policies say nothing."""

    managed_ledger: ManagedLedgerConfig = dataclasses.field(default_factory=ManagedLedgerConfig)
    quotas: QuotaDefaults = dataclasses.field(default_factory=QuotaDefaults)
    auto_create: bool = True
    dedup_enabled: bool = True


@dataclass(frozen=True)
class TopicRegistryStats:
    topics_loaded: int
    partition_counts_cached: int


class TopicRegistry:
    def __init__(self, defaults: TopicDefaults, factory: ManagedLedgerFactory, key_index: KeyIndex,
                 resources: TopicResources, namespaces: NamespaceService, clock: Callable[[], float], *,
                 unload_listeners: list[Callable[[list[TopicName]], None]] | None = None) -> None:
        """``unload_listeners``: told of unloaded topics after the followers (may grow later)."""
        self._defaults = defaults
        self._factory = factory
        self._key_index = key_index
        self._resources = resources
        self._namespaces = namespaces
        self._clock = clock
        self._lock = threading.RLock()
        self._topics: dict[TopicName, PersistentTopic] = {}
        self._routers: dict[tuple[TopicName, str], PartitionRouter] = {}
        self._encryption_required: dict[str, bool] = {}
        """Each namespace's ``encryption_required`` once read (one per namespace in use)."""
        self._loaded_followers: list[Callable[[TopicName], None]] = []
        self._deleted_followers: list[Callable[[TopicName], None]] = []
        self._unloaded_followers: list[Callable[[list[TopicName]], None]] = []
        self._unload_listeners = unload_listeners if unload_listeners is not None else []
        self.non_persistent = NonPersistentTopics(resources, self._limits_of, clock)
        """The live non-persistent topics (``broker/non_persistent_topic.py``): never loaded here."""
        namespaces.follow(self._namespace_changed, self._topic_policy_changed)

    # --- followers ---------------------------------------------------------------------------
    def on_loaded(self, follower: Callable[[TopicName], None]) -> None:
        """Call ``follower(name)`` when a topic is loaded (under the registry's lock)."""
        self._loaded_followers.append(follower)

    def on_deleted(self, follower: Callable[[TopicName], None]) -> None:
        """Call ``follower(name)`` once a topic (or partition) is deleted."""
        self._deleted_followers.append(follower)

    def on_unloaded(self, follower: Callable[[list[TopicName]], None]) -> None:
        """Call ``follower(names)`` when topics stop being served here, before the listeners."""
        self._unloaded_followers.append(follower)

    # --- loading -----------------------------------------------------------------------------
    def topic(self, name: str | TopicName, *, create: bool | None = None) -> PersistentTopic:
        """The topic (or partition) ``name``; created on first use when auto-creation is on."""
        topic_name = name if isinstance(name, TopicName) else TopicName.parse(name)
        topic = self._topics.get(topic_name)
        if topic is not None:
            return topic
        if not topic_name.persistent:
            raise NotAllowed(f"{topic_name} is non-persistent: it has no stored messages to read, seek or administer")
        self._namespaces.check_served_here(topic_name)  # TopicNotOwned names the owner; may take the bundle
        with self._lock:
            topic = self._topics.get(topic_name)
            if topic is not None:
                return topic
            if not self._namespaces.owns(topic_name):
                raise ServiceUnitNotReady(f"the bundle of {topic_name} changed owners; retry")
            if not self._resources.exists(topic_name):
                self._check_creatable(topic_name, self._defaults.auto_create if create is None else create,
                                      auto=create is None)
            topic = self._load(topic_name)
            self._topics[topic_name] = topic
            for follower in list(self._loaded_followers):
                follower(topic_name)
            return topic

    def _load(self, name: TopicName) -> PersistentTopic:
        factory = self._factory
        ml = factory.open(name.managed_ledger_name, self._ml_config(name))
        cursors = CursorManager(ml, factory.ledgers, factory.store)
        dedup = self._namespaces.policies(name.namespace_name).get("deduplicationEnabled")
        topic = PersistentTopic(name, ml, cursors, factory.store,
                                dedup_enabled=self._defaults.dedup_enabled if dedup is None else bool(dedup),
                                clock=self._clock)
        topic.quotas.apply(self._limits_of(name))
        streams = topic.streams = self._key_index.partition(name.managed_ledger_name, ml, topic.entries_from)
        # trimming also keeps what the key index has not made durable yet
        ml.cursor_positions = lambda: [*cursors.durable_mark_delete_offsets(), streams.durable_watermark]
        return topic

    def _check_creatable(self, name: TopicName, allowed: bool, *, auto: bool = False) -> None:
        """``auto``: the topic would be made by its first use, were auto-creation on."""
        self._namespaces.policies(name.namespace_name)  # NotFound for an unknown namespace
        if not allowed:
            hint = ""
            if auto:
                hint = (f"; allowAutoTopicCreation is off: create it first (admin v2: PUT /admin/v2/persistent/"
                        f"{name.namespace_name}/{name.local_name}; CLI: magnetar admin topics create {name})")
            raise NotFound(f"topic {name} does not exist{hint}")
        partitions = self.partitions(name.base)
        if name.partition_index < 0 and partitions > 0:
            raise NotAllowed(f"{name} is a partitioned topic; use its -partition-N topics")
        if name.partition_index >= 0 and partitions and name.partition_index >= partitions:
            raise NotFound(f"{name}: partition {name.partition_index} of {partitions} does not exist")
        if not partitions:  # a partition of a partitioned topic was counted with its topic
            self._check_topics_room(name, 1)

    def _check_topics_room(self, name: TopicName, adding: int) -> None:
        namespace = name.namespace_name
        limit = topics_max(self._defaults.quotas, self._namespaces.policies(namespace))
        if limit > 0:
            check_topics_room(namespace, limit, self._resources.count_in(namespace), adding)

    def stored(self, name: TopicName, *, asked: TopicName | None = None) -> PersistentTopic | None:
        """The existing topic ``name`` for a read, None for a partition nobody wrote to yet;
        ``NotFound`` (naming ``asked``, the topic the reader named, by default ``name``)
        otherwise: a read creates nothing."""
        if self.exists(name):
            return self.topic(name, create=False)
        if 0 <= name.partition_index < self.partitions(name.base):
            return None
        raise NotFound(f"topic {asked or name} does not exist")

    def loaded(self) -> list[PersistentTopic]:
        """Every topic (partition) loaded now."""
        with self._lock:
            return list(self._topics.values())

    # --- policies the open topics follow ------------------------------------------------------
    def _ml_config(self, name: TopicName) -> ManagedLedgerConfig:
        policies = self._namespaces.policies(name.namespace_name)
        retention = policies.get("retention_policies") or self._namespaces.default_retention()
        minutes, mb = int(retention.get("retentionTimeInMinutes", 0)), int(retention.get("retentionSizeInMB", 0))
        base = self._defaults.managed_ledger
        return dataclasses.replace(
            base, retention_time_ms=-1 if minutes < 0 else minutes * 60_000,
            retention_size_bytes=-1 if mb < 0 else mb * 1024 * 1024,
            message_ttl_ms=int(policies.get("message_ttl_in_seconds") or 0) * 1000,
            quorum=quorum_for(policies, base.quorum),
            **{**_offload_policies(policies), **_topic_offload_policies(self._namespaces.topic_policies(name))})

    def _limits_of(self, name: TopicName) -> TopicLimits:
        return resolve_limits(self._defaults.quotas, self._namespaces.policies(name.namespace_name),
                              self._namespaces.topic_policies(name))

    def _namespace_changed(self, namespace: str) -> None:
        """Open topics of the namespace follow its new retention, TTL, quotas and rates at once."""
        with self._lock:
            self._encryption_required.pop(namespace, None)
            for name, topic in self._topics.items():
                if name.namespace_name == namespace:
                    topic.ml.config = self._ml_config(name)
                    topic.quotas.apply(self._limits_of(name), topic.publish_rates())

    def _topic_policy_changed(self, base: TopicName) -> None:
        with self._lock:
            for name, topic in self._topics.items():
                if name.base == base:
                    topic.ml.config = self._ml_config(name)
                    topic.quotas.apply(self._limits_of(name), topic.publish_rates())

    # --- topics and partitioned topics --------------------------------------------------------
    def exists(self, name: TopicName) -> bool:
        return self._resources.exists(name)

    def names(self, namespace: str) -> list[str]:
        """The namespace's topics and written partitions (full names)."""
        return self._resources.names(namespace)

    def partitioned_names(self, namespace: str, domain: str = "persistent") -> list[str]:
        return self._resources.partitioned_names(namespace, domain)

    def partitions(self, name: TopicName) -> int:
        """Number of partitions of a partitioned topic, 0 if ``name`` is not one (cached)."""
        return self._resources.partitions(name)

    def expand_partitions(self, name: TopicName) -> list[TopicName]:
        return self._resources.expand_partitions(name)

    def create(self, name: TopicName) -> PersistentTopic:
        if self.exists(name) or self.partitions(name) > 0:
            raise AlreadyExists(f"topic {name} already exists")
        return self.topic(name, create=True)

    def delete(self, name: TopicName, *, force: bool = False) -> None:
        topic = self.topic(name, create=False)
        if not force and topic.cursors.names():
            raise NotAllowed(f"topic {name} has subscriptions {topic.cursors.names()}; use force")
        with self._lock:
            self._topics.pop(name, None)
        self._key_index.drop(name.managed_ledger_name)  # reads the record the managed ledger's deletion removes
        topic.ml.delete()
        self._factory.forget(name.managed_ledger_name)
        if name.partition_index < 0:
            self._namespaces.delete_topic_policies(name)
        for follower in list(self._deleted_followers):
            follower(name)

    def create_partitioned(self, name: TopicName, partitions: int) -> None:
        if not 1 <= partitions <= PARTITIONS_MAX:
            raise InvalidRequest(f"partitions must be in 1..{PARTITIONS_MAX}, not {partitions}")
        if name.partition_index >= 0:
            raise InvalidRequest(f"{name} is a partition name")
        self._namespaces.policies(name.namespace_name)
        if self.partitions(name) > 0 or self.exists(name):
            raise AlreadyExists(f"topic {name} already exists")
        self._check_topics_room(name, partitions)
        self._resources.write_partitions(name, partitions, -1)

    def update_partitioned(self, name: TopicName, partitions: int) -> None:
        current = self.partitions(name)
        if current == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        if partitions <= current or partitions > PARTITIONS_MAX:
            raise InvalidRequest(f"partitions can only grow: {current} -> {partitions}")
        self._check_topics_room(name, partitions - current)
        self._resources.write_partitions(name, partitions)

    def delete_partitioned(self, name: TopicName, *, force: bool = False) -> None:
        count = self.partitions(name)
        if count == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        for index in range(count):
            partition = name.partition(index)
            if self.exists(partition):
                self.delete(partition, force=force)
        self._resources.delete_partitions(name)
        self._namespaces.delete_topic_policies(name)

    # --- producing -------------------------------------------------------------------------------
    def route(self, topic: str | TopicName, key: str | None, routing_mode: str = "RoundRobinPartition") -> TopicName:
        """The partition a message with ``key`` goes to (the topic itself when not partitioned)."""
        topic_name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        partitions = self.partitions(topic_name) if topic_name.partition_index < 0 else 0
        if not partitions:
            return topic_name
        router = self._routers.get((topic_name, routing_mode))
        if router is None or router.partitions != partitions:
            router = self._routers[(topic_name, routing_mode)] = PartitionRouter(partitions, routing_mode)
        return topic_name.partition(router.partition_for(key))

    def producer(self, topic: str | TopicName, name: str, *, routing_mode: str = "RoundRobinPartition",
                 compression: Compression = Compression.NONE, initial_sequence_id: int | None = None,
                 encrypted: bool = False) -> Producer:
        """A producer on ``topic`` (partitioned or not; auto-created on first use when allowed):
        the topic or every partition is made to exist now, so a refusal comes before any send
        (``TopicTerminated`` for a terminated one, as in Pulsar: a client whose send failed
        reconnects its producer, and must then learn the topic's end, not send again;
        ``EncryptionRequired`` unless ``encrypted`` in a namespace whose ``encryption_required``
        is on, as Pulsar refuses it). It holds a producer slot of each (``ProducerBusy`` beyond a
        partition's limit) until the transport closes it (``Producer.close``)."""
        topic_name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        if not encrypted and self.encryption_required(topic_name):
            raise EncryptionRequired(f"Encryption is required in {topic_name}")
        if not topic_name.persistent:
            return self._non_persistent_producer(topic_name, name, routing_mode, compression)
        slots: list[TopicQuotas] = []
        try:
            for partition in self.expand_partitions(topic_name):
                served = self.topic(partition)
                if served.ml.terminated:
                    raise TopicTerminated(f"topic {partition} is terminated: it takes no more messages")
                quotas = served.quotas
                quotas.add_producer()  # ProducerBusy at the topic's maxProducers
                slots.append(quotas)
        except BaseException:
            for quotas in slots:
                quotas.remove_producer()
            raise
        return Producer(self, topic_name, name, routing_mode=routing_mode, compression=compression,
                        initial_sequence_id=initial_sequence_id, slots=slots)

    def _non_persistent_producer(self, topic_name: TopicName, name: str, routing_mode: str,
                                 compression: Compression) -> Producer:
        """A producer of a non-persistent topic: each partition is live while it is open."""
        self._namespaces.check_served_here(topic_name)
        topics = [self.non_persistent.topic(p) for p in self.expand_partitions(topic_name)]
        slots: list[TopicQuotas] = []
        try:
            for topic in topics:
                topic.quotas.add_producer()  # ProducerBusy at the topic's maxProducers
                slots.append(topic.quotas)
                topic.producer_opened(name)
        except BaseException:
            for quotas, topic in zip(slots, topics, strict=False):
                quotas.remove_producer()
                topic.producer_closed(name)
            raise

        def closed() -> None:
            for topic in topics:
                topic.producer_closed(name)

        return Producer(self.non_persistent, topic_name, name, routing_mode=routing_mode, compression=compression,
                        slots=slots, on_close=closed)

    def encryption_required(self, name: TopicName) -> bool:
        """Whether the namespace of ``name`` takes only end-to-end encrypted messages: read once
        per namespace and kept until its policies change (``_namespace_changed``), so a producer
        does not wait on the metadata store."""
        namespace = name.namespace_name
        with self._lock:
            known = self._encryption_required.get(namespace)
        if known is None:
            known = bool(self._namespaces.policies(namespace).get("encryption_required"))
            with self._lock:
                self._encryption_required[namespace] = known
        return known

    # --- unloading and closing ------------------------------------------------------------------
    def unload(self, contains: Callable[[TopicName], bool], graceful: bool) -> list[TopicName]:
        """Stop serving every loaded topic ``contains`` accepts: the followers let go of them
        (consumers are disconnected), the listeners are told, and, when ``graceful``, the
        topics closed (cursors and ledgers persisted); otherwise they are abandoned without a
        write (the next owner fences their ledgers)."""
        with self._lock:
            names = [name for name in self._topics if contains(name)]
            topics = [self._topics.pop(name) for name in names]
            for name in names:
                self._factory.forget(name.managed_ledger_name)  # reloaded fresh if the bundle comes back
        if names:
            for follower in list(self._unloaded_followers):
                follower(names)
            for listener in list(self._unload_listeners):
                try:
                    listener(names)
                except Exception:
                    log.exception("an unload listener failed")
        for topic in topics:
            if graceful:
                try:
                    topic.close()
                except MagnetarError:
                    log.exception("closing unloaded topic %s failed; its next owner recovers it", topic.name)
            else:
                topic.ml.abandon()
            # The key index lets go of the partition with its topic (else it stays in memory and
            # checkpointed here): unloaded gracefully, what is confirmed goes into a last
            # checkpoint while the bundle is still held, so its next owner reads only what follows.
            self._key_index.forget(topic.name.managed_ledger_name, last_checkpoint=graceful)
        if names:
            log.info("stopped serving %d topics (%s)", len(names), "unloaded" if graceful else "session lost")
        return names

    def local_load(self) -> tuple[int, float, float]:
        """(topics, messages/s in, messages/s out) for this broker's load report."""
        topics = self.loaded()
        rate_in = sum(topic.publish_rates()[0] for topic in topics)
        return len(topics), rate_in, 0.0

    def close(self) -> None:
        """Close every loaded topic (cursors and ledgers persisted)."""
        with self._lock:
            for topic in self._topics.values():
                with contextlib.suppress(MagnetarError):
                    topic.close()
            self._topics.clear()

    def statistics(self) -> TopicRegistryStats:
        with self._lock:
            loaded = len(self._topics)
        return TopicRegistryStats(loaded, self._resources.statistics().partition_counts_cached)


def _offload_policies(policies: dict[str, Any]) -> dict[str, int]:
    """The namespace's offload policies where it sets them (Pulsar's ``offload_threshold``,
    ``offload_threshold_in_seconds``, ``offload_deletion_lag_ms``); the broker's otherwise."""
    fields = {"offload_threshold": "offload_threshold_bytes",
              "offload_threshold_in_seconds": "offload_threshold_seconds",
              "offload_deletion_lag_ms": "offload_deletion_lag_ms"}
    return {name: int(policies[key]) for key, name in fields.items() if policies.get(key) is not None}


def _topic_offload_policies(policies: dict[str, Any]) -> dict[str, int]:
    """The topic's own ``offloadPolicies`` fields, which win over its namespace's."""
    own = policies.get("offloadPolicies") or {}
    return {OFFLOAD_POLICY_FIELDS[key][0]: int(value) for key, value in own.items() if key in OFFLOAD_POLICY_FIELDS}
