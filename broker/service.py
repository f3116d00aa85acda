"""BrokerService: the broker process's root object.

Role: ``magnetar standalone`` builds one ``BrokerService`` over a data directory. It owns the
embedded bookie (``storage``), the metadata store (RocksDB), the ledger manager, the shared
entry cache and the managed-ledger factory, and serves topics to the API layer (``api`` never
touches ``storage``). Everything it knows lives in the metadata store or in ledgers:

- tenants at ``/admin/tenants/{tenant}``, namespace policies (retention, TTL, dedup) at
  ``/admin/policies/{tenant}/{namespace}``, partitioned-topic metadata at
  ``/admin/partitioned-topics/{tenant}/{namespace}/persistent/{topic}``;
- topics are managed ledgers at ``/managed-ledgers/{tenant}/{namespace}/persistent/{topic}``.

A maintenance pass (every ``maintenance_interval_ms``, or on demand) applies message TTLs to
cursors, trims consumed ledgers as retention allows, and ages out the entry cache.

With ``cluster`` (``magnetar broker``) there is no embedded bookie: the metadata store is
ZooKeeper and ledgers go to the remote bookies registered there (``broker/cluster.py``).

Invariant: between :meth:`start` and :meth:`close` the storage is open; after :meth:`close`
every acknowledged entry is in synced entry logs and the journal is checkpointed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.bookie import BookieClient, LocalBookie
from broker.compaction import CompactionStatus, Compactor
from broker.cursor import CursorManager, ManagedCursor
from broker.entry_cache import EntryCache
from broker.entry_format import Message
from broker.errors import (
    AlreadyExists,
    CompactionInProgress,
    ConsumerBusy,
    InvalidRequest,
    MagnetarError,
    NotAllowed,
    NotEmpty,
    NotFound,
    PreconditionFailed,
)
from broker.ledger import LedgerManager
from broker.managed_ledger import ManagedLedgerConfig, ManagedLedgerFactory
from broker.metadata import MetadataStore, RocksDBMetadataStore
from broker.persistence import quorum_for
from broker.reader import Reader, StartPosition
from broker.routing import MultiConsumer, PartitionRouter
from broker.subscription import Consumer, ConsumerConfig, Delivery, Subscription, SubscriptionType
from broker.topic import PersistentTopic, PublishResult
from broker.topic_name import TopicName
from storage import LedgerStorage, StorageConfig
from storage.fileio import FileIO

if TYPE_CHECKING:  # a cluster broker's storage pulls in kazoo; the embedded broker never loads it
    from broker.cluster import ClusterStorage

log = logging.getLogger(__name__)

TENANTS = "/admin/tenants"
POLICIES = "/admin/policies"
PARTITIONED = "/admin/partitioned-topics"
ML_ROOT = "/managed-ledgers"
PARTITIONS_MAX = 1024
CURSOR_MOVE_WAIT_S_MAX = 60.0
PUBLISH_WAIT_S_MAX = 60.0
PARTITION_COUNTS_CACHED_MAX = 100_000


@dataclass(frozen=True)
class BrokerConfig:
    storage: StorageConfig = field(default_factory=StorageConfig.production)
    managed_ledger: ManagedLedgerConfig = field(default_factory=ManagedLedgerConfig)
    entry_cache_bytes_max: int = 64 * 1024 * 1024
    entry_cache_age_ms_max: int = 1000
    auto_create_topics: bool = True
    dedup_enabled: bool = True
    maintenance_interval_ms: int = 1000

    @classmethod
    def test_min(cls) -> BrokerConfig:
        return cls(storage=StorageConfig.test_min(), managed_ledger=ManagedLedgerConfig.test_min(),
                   entry_cache_bytes_max=1 << 20, maintenance_interval_ms=200)


@dataclass(frozen=True)
class Health:
    status: str
    storage_read_only: bool
    ledgers: int
    journal_fsyncs: int


def default_policies() -> dict[str, Any]:
    return {"retention_policies": {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
            "message_ttl_in_seconds": 0, "deduplicationEnabled": None, "auth_policies": {}}


class BrokerService:
    def __init__(self, data_dir: str, config: BrokerConfig | None = None,
                 clock: Callable[[], float] = time.time, *, fileio: FileIO | None = None,
                 journal_dir: str | None = None, cluster: ClusterStorage | None = None) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.config = config or BrokerConfig()
        self.clock = clock
        self._fileio = fileio
        self._journal_dir = journal_dir
        self.cluster = cluster
        self._storage: LedgerStorage | None = None
        self._store: MetadataStore | None = None
        self._topics: dict[TopicName, PersistentTopic] = {}
        self._compactors: dict[TopicName, Compactor] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._maintenance: threading.Thread | None = None
        self._subscriptions: dict[tuple[TopicName, str], Subscription] = {}
        self._patterns: list[tuple[str, re.Pattern[str], MultiConsumer, Callable[[TopicName], Consumer]]] = []
        self._routers: dict[tuple[TopicName, str], PartitionRouter] = {}
        self._partition_counts: dict[TopicName, int] = {}
        self._dispatch_pool: ThreadPoolExecutor | None = None
        self._compaction_pool: ThreadPoolExecutor | None = None
        self._compactions: dict[TopicName, Future[None]] = {}
        self._scheduled: set[int] = set()
        self._scheduled_lock = threading.Lock()
        self._dispatch_executor: Callable[[Callable[[], None]], object] | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self.cluster is not None:
            self._store, self.ledgers = self.cluster.open(self.clock)
        else:
            os.makedirs(self.data_dir, exist_ok=True)
            self._storage = LedgerStorage.open(os.path.join(self.data_dir, "bookie"), self.config.storage,
                                               fileio=self._fileio, journal_dir=self._journal_dir)
            self._store = RocksDBMetadataStore(os.path.join(self.data_dir, "metadata"), clock=self.clock)
            self.ledgers = LedgerManager(self._store, BookieClient([LocalBookie("local", self._storage)]), self.clock)
        self.cache = EntryCache(self.config.entry_cache_bytes_max, entry_age_ms_max=self.config.entry_cache_age_ms_max)
        self.factory = ManagedLedgerFactory(self._store, self.ledgers, self.cache, self.clock)
        if not self.store.exists(f"{TENANTS}/public"):
            self.create_tenant("public", {})
        if not self.store.exists(f"{POLICIES}/public/default"):
            self.create_namespace("public/default")
        self._dispatch_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="magnetar-dispatch")
        self._compaction_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="magnetar-compaction")
        self._stop.clear()
        self._maintenance = threading.Thread(target=self._maintenance_loop, name="magnetar-maintenance", daemon=True)
        self._maintenance.start()

    @property
    def storage(self) -> LedgerStorage:
        if self._storage is None:
            raise RuntimeError("broker service is not started")
        return self._storage

    @property
    def store(self) -> MetadataStore:
        if self._store is None:
            raise RuntimeError("broker service is not started")
        return self._store

    def close(self) -> None:
        self._stop.set()
        if self._maintenance is not None:
            self._maintenance.join()
            self._maintenance = None
        if self._dispatch_pool is not None:
            self._dispatch_pool.shutdown(wait=True)
            self._dispatch_pool = None
        if self._compaction_pool is not None:
            self._compaction_pool.shutdown(wait=True, cancel_futures=True)
            self._compaction_pool = None
        with self._lock:
            for subscription in self._subscriptions.values():
                subscription.detach()
            self._subscriptions.clear()
            for topic in self._topics.values():
                with contextlib.suppress(MagnetarError):
                    topic.close()
            self._topics.clear()
        if self._store is not None:
            self._store.close()
            self._store = None
        if self.cluster is not None:
            self.cluster.close()
        if self._storage is not None:
            self._storage.close()
            self._storage = None

    def health(self) -> Health:
        if self.cluster is not None:
            bookies = self.cluster.bookies_available()
            return Health("ok" if bookies else "degraded", False, 0, 0)
        stats = self.storage.statistics()
        status = "degraded" if stats.read_only else "ok"
        return Health(status, stats.read_only, stats.ledgers, stats.journal.fsync_count)

    # --- tenants and namespaces ---------------------------------------------------------
    def create_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        TopicName.of(tenant, "ns", "t")  # validates the name
        body = {"adminRoles": list(info.get("adminRoles", [])),
                "allowedClusters": list(info.get("allowedClusters", ["standalone"]))}
        if self.store.exists(f"{TENANTS}/{tenant}"):
            raise AlreadyExists(f"tenant {tenant} already exists")
        self.store.put_json(f"{TENANTS}/{tenant}", body, -1)

    def tenants(self) -> list[str]:
        return self.store.children(TENANTS)

    def tenant_info(self, tenant: str) -> dict[str, Any]:
        found = self.store.get_json(f"{TENANTS}/{tenant}")
        if found is None:
            raise NotFound(f"tenant {tenant} does not exist")
        return found[0]

    def delete_tenant(self, tenant: str) -> None:
        self.tenant_info(tenant)
        if self.store.children(f"{POLICIES}/{tenant}"):
            raise NotEmpty(f"tenant {tenant} still has namespaces")
        self.store.delete(f"{TENANTS}/{tenant}")

    def update_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        """Replace the tenant's ``adminRoles`` and ``allowedClusters`` (compare-and-set)."""
        found = self.store.get_json(f"{TENANTS}/{tenant}")
        if found is None:
            raise NotFound(f"tenant {tenant} does not exist")
        current, version = found
        body = {"adminRoles": list(info.get("adminRoles", current.get("adminRoles", []))),
                "allowedClusters": list(info.get("allowedClusters", current.get("allowedClusters", ["standalone"])))}
        self.store.put_json(f"{TENANTS}/{tenant}", body, version)

    def _split_namespace(self, namespace: str) -> tuple[str, str]:
        parts = namespace.split("/")
        if len(parts) != 2:
            raise InvalidRequest(f"invalid namespace {namespace!r}: expected tenant/namespace")
        TopicName.of(parts[0], parts[1], "t")
        return parts[0], parts[1]

    def create_namespace(self, namespace: str, policies: dict[str, Any] | None = None) -> None:
        tenant, _ = self._split_namespace(namespace)
        self.tenant_info(tenant)
        if self.store.exists(f"{POLICIES}/{namespace}"):
            raise AlreadyExists(f"namespace {namespace} already exists")
        self.store.put_json(f"{POLICIES}/{namespace}", {**default_policies(), **(policies or {})}, -1)

    def namespaces(self, tenant: str) -> list[str]:
        self.tenant_info(tenant)
        return [f"{tenant}/{ns}" for ns in self.store.children(f"{POLICIES}/{tenant}")]

    def policies(self, namespace: str) -> dict[str, Any]:
        self._split_namespace(namespace)
        found = self.store.get_json(f"{POLICIES}/{namespace}")
        if found is None:
            raise NotFound(f"namespace {namespace} does not exist")
        return found[0]

    def set_policy(self, namespace: str, key: str, value: Any) -> None:
        found = self.store.get_json(f"{POLICIES}/{namespace}")
        if found is None:
            raise NotFound(f"namespace {namespace} does not exist")
        policies, version = found
        policies[key] = value
        self.store.put_json(f"{POLICIES}/{namespace}", policies, version)
        with self._lock:  # open topics of the namespace follow the new retention and TTL at once
            for name, topic in self._topics.items():
                if name.namespace_name == namespace:
                    topic.ml.config = self._ml_config(name)

    def delete_namespace(self, namespace: str) -> None:
        self.policies(namespace)
        if self.topics(namespace) or self.partitioned_topics(namespace):
            raise NotEmpty(f"namespace {namespace} still has topics")
        self.store.delete(f"{POLICIES}/{namespace}")

    def _ml_config(self, name: TopicName) -> ManagedLedgerConfig:
        policies = self.policies(name.namespace_name)
        retention = policies.get("retention_policies") or {}
        minutes, mb = int(retention.get("retentionTimeInMinutes", 0)), int(retention.get("retentionSizeInMB", 0))
        return dataclasses.replace(
            self.config.managed_ledger,
            retention_time_ms=-1 if minutes < 0 else minutes * 60_000,
            retention_size_bytes=-1 if mb < 0 else mb * 1024 * 1024,
            message_ttl_ms=int(policies.get("message_ttl_in_seconds") or 0) * 1000,
            quorum=quorum_for(policies, self.config.managed_ledger.quorum))

    def bookies_available(self) -> int:
        """Bookies new ledgers can use: the registered ones in a cluster, else the embedded one."""
        return 1 if self.cluster is None else self.cluster.bookies_available()

    # --- topics --------------------------------------------------------------------------
    def topic(self, name: str | TopicName, *, create: bool | None = None) -> PersistentTopic:
        """The topic (or partition) ``name``; created on first use when auto-creation is on."""
        topic_name = name if isinstance(name, TopicName) else TopicName.parse(name)
        with self._lock:
            topic = self._topics.get(topic_name)
            if topic is not None:
                return topic
            allowed = self.config.auto_create_topics if create is None else create
            if not self.factory.exists(topic_name.managed_ledger_name):
                self._check_creatable(topic_name, allowed)
            ml = self.factory.open(topic_name.managed_ledger_name, self._ml_config(topic_name))
            cursors = CursorManager(ml, self.ledgers, self.store)
            dedup = self.policies(topic_name.namespace_name).get("deduplicationEnabled")
            topic = PersistentTopic(topic_name, ml, cursors, self.store,
                                    dedup_enabled=self.config.dedup_enabled if dedup is None else bool(dedup),
                                    clock=self.clock)
            self._topics[topic_name] = topic
            self._offer_to_patterns(topic_name)
            return topic

    def _check_creatable(self, name: TopicName, allowed: bool) -> None:
        self.policies(name.namespace_name)  # NotFound for an unknown namespace
        if not allowed:
            raise NotFound(f"topic {name} does not exist")
        partitions = self.partitions(name.base)
        if name.partition_index < 0 and partitions > 0:
            raise NotAllowed(f"{name} is a partitioned topic; use its -partition-N topics")
        if name.partition_index >= 0 and partitions and name.partition_index >= partitions:
            raise NotFound(f"{name}: partition {name.partition_index} of {partitions} does not exist")

    def topic_exists(self, name: TopicName) -> bool:
        return self.factory.exists(name.managed_ledger_name)

    def create_topic(self, name: TopicName) -> PersistentTopic:
        if self.topic_exists(name) or self.partitions(name) > 0:
            raise AlreadyExists(f"topic {name} already exists")
        return self.topic(name, create=True)

    def topics(self, namespace: str) -> list[str]:
        tenant, ns = self._split_namespace(namespace)
        return [TopicName(tenant, ns, local).full_name
                for local in self.store.children(f"{ML_ROOT}/{tenant}/{ns}/persistent")]

    def delete_topic(self, name: TopicName, *, force: bool = False) -> None:
        topic = self.topic(name, create=False)
        if not force and topic.cursors.names():
            raise NotAllowed(f"topic {name} has subscriptions {topic.cursors.names()}; use force")
        with self._lock:
            self._topics.pop(name, None)
            self._compactors.pop(name, None)
        topic.ml.delete()
        self.factory.forget(name.managed_ledger_name)

    def create_partitioned_topic(self, name: TopicName, partitions: int) -> None:
        if not 1 <= partitions <= PARTITIONS_MAX:
            raise InvalidRequest(f"partitions must be in 1..{PARTITIONS_MAX}, not {partitions}")
        if name.partition_index >= 0:
            raise InvalidRequest(f"{name} is a partition name")
        self.policies(name.namespace_name)
        if self.partitions(name) > 0 or self.topic_exists(name):
            raise AlreadyExists(f"topic {name} already exists")
        self._write_partitions(name, partitions, -1)

    def update_partitioned_topic(self, name: TopicName, partitions: int) -> None:
        current = self.partitions(name)
        if current == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        if partitions <= current or partitions > PARTITIONS_MAX:
            raise InvalidRequest(f"partitions can only grow: {current} -> {partitions}")
        self._write_partitions(name, partitions)

    def partitions(self, name: TopicName) -> int:
        """Number of partitions of a partitioned topic, 0 if ``name`` is not one (cached: every
        publish routes through here, and every change goes through :meth:`_write_partitions`)."""
        base = name.base
        cached = self._partition_counts.get(base)
        if cached is not None:
            return cached
        with self._lock:
            found = self.store.get_json(self._partitioned_path(base))
            count = int(found[0]["partitions"]) if found is not None else 0
            if len(self._partition_counts) >= PARTITION_COUNTS_CACHED_MAX:
                self._partition_counts.clear()
            self._partition_counts[base] = count
            return count

    def _write_partitions(self, name: TopicName, partitions: int | None, version: int | None = None) -> None:
        with self._lock:
            if partitions is None:
                self.store.delete(self._partitioned_path(name))
            else:
                self.store.put_json(self._partitioned_path(name), {"partitions": partitions}, version)
            self._partition_counts.pop(name.base, None)

    def partitioned_topics(self, namespace: str) -> list[str]:
        tenant, ns = self._split_namespace(namespace)
        return [TopicName(tenant, ns, local).full_name
                for local in self.store.children(f"{PARTITIONED}/{tenant}/{ns}/persistent")]

    def delete_partitioned_topic(self, name: TopicName, *, force: bool = False) -> None:
        count = self.partitions(name)
        if count == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        for index in range(count):
            partition = name.partition(index)
            if self.topic_exists(partition):
                self.delete_topic(partition, force=force)
        self._write_partitions(name, None)

    @staticmethod
    def _partitioned_path(name: TopicName) -> str:
        return f"{PARTITIONED}/{name.tenant}/{name.namespace}/persistent/{name.local_name}"

    def compactor(self, name: TopicName) -> Compactor:
        topic = self.topic(name, create=False)
        with self._lock:
            compactor = self._compactors.get(name)
            if compactor is None:
                compactor = Compactor(topic, self.ledgers, self.store, self.clock)
                self._compactors[name] = compactor
            return compactor

    def trigger_compaction(self, name: TopicName) -> None:
        """Compact ``name`` in the background (one compaction per topic at a time)."""
        compactor = self.compactor(name)
        pool = self._compaction_pool
        if pool is None:
            raise RuntimeError("broker service is not started")
        with self._lock:
            running = self._compactions.get(name)
            if running is not None and not running.done():
                raise CompactionInProgress(f"compaction of {name} is already in progress")
            self._compactions[name] = pool.submit(self._compact, compactor)

    @staticmethod
    def _compact(compactor: Compactor) -> None:
        try:
            compactor.compact()
        except MagnetarError:  # kept as the compactor's ERROR status and lastError
            log.exception("compaction failed")

    def compaction_status(self, name: TopicName) -> CompactionStatus:
        """The compactor's status; RUNNING also while a triggered compaction waits to start."""
        status = self.compactor(name).status()
        with self._lock:
            queued = self._compactions.get(name)
        if queued is not None and not queued.done() and status.status != "RUNNING":
            return dataclasses.replace(status, status="RUNNING")
        return status

    def open_topics(self) -> list[PersistentTopic]:
        with self._lock:
            return list(self._topics.values())

    # --- subscriptions, readers, routing ------------------------------------------------------
    def use_dispatch_executor(self, executor: Callable[[Callable[[], None]], object] | None) -> None:
        """Run dispatch work with ``executor`` (thread-safe, non-blocking: it queues the callable)
        instead of the dispatch thread; ``None`` goes back to the dispatch thread.

        The API hands a queue onto its event loop here (one wake-up per burst): the loop is where
        deliveries are sent, so a confirmed entry reaches a consumer after one thread hop (journal to loop)
        instead of two (journal to dispatch thread to loop). Consumer flow and acks already
        dispatch on the loop, so this adds no new kind of work there."""
        self._dispatch_executor = executor

    def _schedule(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the dispatch executor (the dispatch thread unless one was given), at
        most once queued per callable."""
        pool = self._dispatch_pool
        if pool is None:
            return
        key = id(work.__self__) if hasattr(work, "__self__") else id(work)
        with self._scheduled_lock:
            if key in self._scheduled:
                return
            self._scheduled.add(key)

        def run() -> None:
            with self._scheduled_lock:
                self._scheduled.discard(key)
            try:
                work()
            except MagnetarError:
                log.exception("dispatch failed")

        executor = self._dispatch_executor
        with contextlib.suppress(RuntimeError):  # shutting down
            if executor is not None:
                executor(run)
            else:
                pool.submit(run)

    def subscription(self, topic_name: TopicName, name: str, sub_type: SubscriptionType, *,
                     initial: str | int = "latest", durable: bool = True) -> Subscription:
        topic = self.topic(topic_name)
        with self._lock:
            key = (topic_name, name)
            existing = self._subscriptions.get(key)
            if existing is not None:
                if existing.type is not sub_type and existing.consumers:
                    raise ConsumerBusy(f"subscription {name} is {existing.type.value}, not {sub_type.value}")
                existing.type = sub_type
                return existing
            cursor = topic.cursors.open(name, initial=initial, durable=durable)
            created = Subscription(topic_name.full_name, topic_name.partition_index, cursor, sub_type,
                                   clock=self.clock, dead_letter=self._dead_letter, schedule=self._schedule)
            self._subscriptions[key] = created
            return created

    def subscribe(self, topic: str | TopicName, name: str, sub_type: SubscriptionType, config: ConsumerConfig, *,
                  initial: str | int = "latest", durable: bool = True) -> Consumer:
        topic_name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        return self.subscription(topic_name, name, sub_type, initial=initial, durable=durable).add_consumer(config)

    def subscribe_many(self, topics: list[str], name: str, sub_type: SubscriptionType, config: ConsumerConfig, *,
                       initial: str | int = "latest", durable: bool = True) -> MultiConsumer:
        """One consumer over several topics; a partitioned topic contributes all its partitions."""
        multi = MultiConsumer()
        for topic in topics:
            for partition in self.expand_partitions(TopicName.parse(topic)):
                multi.add(partition.full_name, self.subscribe(partition, name, sub_type, config,
                                                              initial=initial, durable=durable))
        return multi

    def subscribe_pattern(self, namespace: str, pattern: str, name: str, sub_type: SubscriptionType,
                          config: ConsumerConfig, *, initial: str | int = "latest") -> MultiConsumer:
        """Every topic of ``namespace`` whose full name matches ``pattern``, now and later."""
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise InvalidRequest(f"invalid topicsPattern {pattern!r}: {exc}") from exc
        multi = MultiConsumer()

        def join(topic_name: TopicName) -> Consumer:
            return self.subscribe(topic_name, name, sub_type, config, initial=initial)

        with self._lock:
            self._patterns.append((namespace, regex, multi, join))
        for full_name in self.topics(namespace):
            self._offer_to_patterns(TopicName.parse(full_name))
        return multi

    def _offer_to_patterns(self, topic_name: TopicName) -> None:
        for namespace, regex, multi, join in list(self._patterns):
            if topic_name.namespace_name == namespace and regex.fullmatch(topic_name.full_name) \
                    and topic_name.full_name not in multi.topics():
                multi.add(topic_name.full_name, join(topic_name))

    def expand_partitions(self, name: TopicName) -> list[TopicName]:
        count = self.partitions(name)
        return [name.partition(i) for i in range(count)] if count and name.partition_index < 0 else [name]

    def unsubscribe(self, topic_name: TopicName, name: str) -> None:
        topic = self.topic(topic_name, create=False)
        with self._lock:
            subscription = self._subscriptions.get((topic_name, name))
            if subscription is not None and subscription.consumers:
                raise ConsumerBusy(f"subscription {name} has active consumers")
            if subscription is not None:
                subscription.detach()
                del self._subscriptions[(topic_name, name)]
        topic.cursors.delete(name)

    def delete_subscription(self, topic_name: TopicName, name: str, *, force: bool = False) -> None:
        """Delete subscription ``name``: refused (``PreconditionFailed``) while consumers are
        connected, unless ``force``, which disconnects them first (their listeners are told)."""
        self.topic(topic_name, create=False)
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
        topic = self.topic(topic_name, create=False)
        cursor = topic.cursors.get(name)
        if cursor is None:
            raise NotFound(f"subscription {name} of {topic_name} does not exist")
        with self._lock:
            subscription = self._subscriptions.get((topic_name, name))
            if subscription is None:  # under the lock: no subscription can start meanwhile
                future = move(cursor)
        if subscription is not None:
            future = subscription.reposition(lambda: move(cursor))
        if future is not None:
            future.result(timeout=CURSOR_MOVE_WAIT_S_MAX)

    def subscriptions_of(self, topic_name: TopicName) -> list[Subscription]:
        with self._lock:
            return [s for (t, _), s in self._subscriptions.items() if t == topic_name]

    def reader(self, topic: str | TopicName, start: StartPosition, *, compacted: bool = False) -> Reader:
        topic_name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        compactor = self.compactor(topic_name) if compacted else None
        return Reader(self.topic(topic_name), start, compactor=compactor)

    def publish(self, topic: str | TopicName, messages: list[Message], *, producer_name: str,
                sequence_id: int | None = None, routing_mode: str = "RoundRobinPartition",
                **options: Any) -> PublishResult:
        """Publish to a topic, routing by key (or round-robin) when it is partitioned; wait for
        the result."""
        return self.publish_async(topic, messages, producer_name=producer_name, sequence_id=sequence_id,
                                  routing_mode=routing_mode, **options).result(timeout=PUBLISH_WAIT_S_MAX)

    def publish_async(self, topic: str | TopicName, messages: list[Message], *, producer_name: str,
                      sequence_id: int | None = None, routing_mode: str = "RoundRobinPartition",
                      **options: Any) -> Future[PublishResult]:
        """Like :meth:`publish`, but the result is a future completed once the entry is durable."""
        return self.topic(self.route(topic, messages[0].key if messages else None, routing_mode)).publish(
            messages, producer_name=producer_name, sequence_id=sequence_id, **options)

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

    def _dead_letter(self, target: str, delivery: Delivery, subscription: str) -> None:
        """Publish to the DLQ exactly once: each dead-lettered message has its own producer
        identity (source topic, subscription, offset) with sequence id 0, so a replay after a
        crash between this publish and the source ack is deduplicated."""
        message = delivery.message
        properties = {**message.properties, "REAL_TOPIC": delivery.topic,
                      "ORIGIN_MESSAGE_ID": delivery.message_id.to_rest()}
        self.topic(target).publish([Message(payload=message.payload, key=message.key, properties=properties,
                                            event_time_ms=message.event_time_ms)],
                                   producer_name=f"DLQ:{delivery.topic}:{subscription}:{delivery.offset}",
                                   sequence_id=0).result(timeout=60)

    # --- maintenance ---------------------------------------------------------------------
    def run_maintenance(self) -> None:
        """Expire messages past their TTL, trim consumed ledgers, age out the entry cache,
        apply ack timeouts, release due redeliveries and update the publish rates."""
        with self._lock:
            subscriptions = list(self._subscriptions.values())
        for subscription in subscriptions:
            subscription.tick()
        for topic in self.open_topics():
            expired = topic.ml.expired_offset()
            if expired is not None:
                for name in topic.cursors.names():
                    cursor = topic.cursors.get(name)
                    if cursor is not None:
                        cursor.expire_before(expired)
            topic.ml.trim()
            topic.tick()
        self.cache.evict_expired()

    def _maintenance_loop(self) -> None:
        while not self._stop.wait(self.config.maintenance_interval_ms / 1000.0):
            try:
                self.run_maintenance()
            except MagnetarError:
                log.exception("maintenance pass failed")
