"""BrokerService: the broker process's root object.

Role: ``magnetar standalone`` builds one ``BrokerService`` over a data directory. It owns the
embedded bookie (``storage``), the metadata store (RocksDB), the ledger manager, the shared
entry cache and the managed-ledger factory, and serves topics to the API layer (``api`` never
touches ``storage``). Everything it knows lives in the metadata store or in ledgers:

- tenants at ``/admin/tenants/{tenant}``, namespace policies (retention, TTL, dedup, quotas) at
  ``/admin/policies/{tenant}/{namespace}``, a topic's own quotas and rates at
  ``/admin/topic-policies/{tenant}/{namespace}/{topic}`` (``broker/namespace/topic_policies.py``; each open
  topic lives by the limits ``broker/quotas.py`` resolves), partitioned-topic metadata at
  ``/admin/partitioned-topics/{tenant}/{namespace}/persistent/{topic}``;
- topics are managed ledgers at ``/managed-ledgers/{tenant}/{namespace}/persistent/{topic}``.

A maintenance pass (every ``maintenance_interval_ms``, or on demand) applies message TTLs to
cursors, syncs the key index, trims consumed ledgers as retention allows (by default nothing
goes: an event store keeps its events, ``default_retention_*``), drops the trimmed entries' key
index rows, and ages out the entry cache.

Event streams: every topic partition has its key index (``broker/key_index.py``, in
``{data_dir}/key-index``), recovered when the topic opens; ``read_stream``, ``stream_info`` and
``stream_reader`` read one key's stream (``broker/event_streams.py``) in the partition the key
routes to.

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
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.bookkeeper.bookie import BookieClient, LocalBookie
from broker.bookkeeper.ledger import LedgerManager
from broker.byte_budget import ByteBudget, ByteBudgetStats
from broker.compaction import CompactionStatus, Compactor
from broker.cursor import CursorManager, ManagedCursor
from broker.delivery import Delivery
from broker.dispatch_scheduling import DispatchScheduler, Executor
from broker.entry_builder import entry_of_messages
from broker.entry_cache import EntryCache, EntryCacheStats
from broker.entry_format import Compression, Message
from broker.errors import (
    AlreadyExists,
    CompactionInProgress,
    ConsumerBusy,
    InvalidRequest,
    MagnetarError,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ServiceUnitNotReady,
)
from broker.event_streams import KeyReader, StreamInfo, StreamRead, read_stream, stream_info
from broker.key_index import KeyIndex, KeyIndexStats
from broker.managed_ledger import ManagedLedgerConfig, ManagedLedgerFactory
from broker.metadata.rocksdb import RocksDBMetadataStore
from broker.metadata.store import MetadataStore, MetadataStoreStats
from broker.namespace.lookup import BrokerAddress, LookupResult
from broker.namespace.namespaces import Namespaces
from broker.namespace.persistence import POLICY_KEY as PERSISTENCE_POLICY_KEY
from broker.namespace.persistence import PersistencePolicy, quorum_for, validated
from broker.namespace.topic_policies import TopicPolicies
from broker.producer import Producer
from broker.quotas import QuotaDefaults, TopicLimits, TopicQuotas, check_topics_room, resolve_limits, topics_max
from broker.range_read import RangeRead, read_range
from broker.reader import Reader, StartPosition
from broker.routing import MultiConsumer, PartitionRouter
from broker.schema_registry import SchemaRegistry
from broker.subscription import Consumer, ConsumerConfig, Subscription, SubscriptionLimits, SubscriptionType
from broker.topic import PersistentTopic
from broker.topic_admin import TopicAdmin
from broker.topic_name import TopicName, check_namespace
from broker.topic_pattern import PATTERN_BYTES_MAX, TopicPattern
from broker.topic_stats import TopicStats, topic_stats
from storage import FileIO, LedgerStorage, StorageConfig, StorageStats

if TYPE_CHECKING:  # a cluster broker's storage pulls in kazoo; the embedded broker never loads it
    from broker.cluster import ClusterStats, ClusterStorage
    from broker.namespace.ownership import OwnershipManager

log = logging.getLogger(__name__)

PARTITIONED = "/admin/partitioned-topics"
ML_ROOT = "/managed-ledgers"
PARTITIONS_MAX = 1024
CURSOR_MOVE_WAIT_S_MAX = 60.0
PARTITION_COUNTS_CACHED_MAX = 100_000
TOPIC_WATCHERS_MAX = 10_000


@dataclass(frozen=True)
class BrokerConfig:
    storage: StorageConfig = field(default_factory=StorageConfig.production)
    managed_ledger: ManagedLedgerConfig = field(default_factory=ManagedLedgerConfig)
    entry_cache_bytes_max: int = 64 * 1024 * 1024
    entry_cache_age_ms_max: int = 1000
    auto_create_topics: bool = True
    dedup_enabled: bool = True
    maintenance_interval_ms: int = 1000
    default_retention_time_minutes: int = -1
    """Retention of a namespace without a policy (Pulsar's ``defaultRetentionTimeInMinutes``;
    -1: forever, 0: consumed ledgers go at once, Pulsar's own default)."""
    default_retention_size_mb: int = -1
    """Likewise for size (``defaultRetentionSizeInMB``; -1: unlimited)."""
    quotas: QuotaDefaults = field(default_factory=QuotaDefaults)
    """Topic quotas and rate limits where neither topic nor namespace sets one (``broker/quotas.py``)."""
    dispatch_read_bytes_max: int = 1024 * 1024
    """Entry bytes one subscription or reader reads at a time (``dispatcherMaxReadSizeBytes``;
    one entry is always read, however large)."""
    consumer_pending_bytes_max: int = 1024 * 1024
    """Footprint of runs of entries waiting for one consumer's connection to take them
    (``dispatcherMaxPendingBytesPerConsumer``): a consumer whose client stops reading holds this
    much, and its connection's own outgoing buffer, and no more."""
    reads_in_flight_bytes_max: int = 256 * 1024 * 1024
    """Broker-wide: bytes read by dispatch (and decoded by readers) and not yet taken by a connection
    (``managedLedgerMaxReadsInFlightSizeInMB``); past it, new reads wait. 0: no bound."""
    publish_buffer_bytes_max: int = 256 * 1024 * 1024
    """Broker-wide: bytes of publishes sent to the managed ledgers and not yet stored
    (``maxMessagePublishBufferSizeInMB``); past it, transports stop reading producers until it
    has fallen to half. 0: no bound."""

    @classmethod
    def test_min(cls) -> BrokerConfig:
        return cls(storage=StorageConfig.test_min(), managed_ledger=ManagedLedgerConfig.test_min(),
                   entry_cache_bytes_max=1 << 20, maintenance_interval_ms=200)


@dataclass(frozen=True)
class BrokerStats:
    """Everything the broker counts, read at once (for metrics and the console's overview)."""

    storage: StorageStats | None
    """The embedded bookie's; None on a cluster broker, which has none."""
    entry_cache: EntryCacheStats
    metadata_store: MetadataStoreStats
    topics: tuple[TopicStats, ...]
    """Every loaded topic (partition); one closed or deleted meanwhile is left out."""
    cluster: ClusterStats | None = None
    """A cluster broker's bookies, connections and re-replication; None standalone."""
    key_index: KeyIndexStats | None = None
    maintenance_passes: int = 0
    """Maintenance passes (TTL, trimming, key index sync) completed since the broker started."""
    appends_fenced: int = 0
    """Appends refused because another broker recovered their topic (fenced its ledger or
    rewrote its ledger list): a cluster broker that lost a topic while still appending to it."""
    reads_in_flight: ByteBudgetStats | None = None
    """The broker-wide reads-in-flight budget (``managedLedgerMaxReadsInFlightSizeInMB``)."""
    publish_buffer: ByteBudgetStats | None = None
    """The broker-wide publish buffer (``maxMessagePublishBufferSizeInMB``)."""


@dataclass(frozen=True)
class Health:
    status: str
    storage_read_only: bool
    ledgers: int
    journal_fsyncs: int
    storage_read_only_reason: str | None = None
    """Why the storage refuses writes (a full disk is named as such); None while writable."""


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
        self._subscriptions_by_topic: dict[TopicName, dict[str, Subscription]] = {}
        self._patterns: list[tuple[TopicPattern, MultiConsumer, Callable[[TopicName], Consumer]]] = []
        self._topic_watchers: dict[str, dict[Callable[[str, bool], None], None]] = {}
        self._topic_watcher_count = 0
        self._routers: dict[tuple[TopicName, str], PartitionRouter] = {}
        self._partition_counts: dict[TopicName, int] = {}
        self._dispatch = DispatchScheduler()
        self._compaction_pool: ThreadPoolExecutor | None = None
        self._compactions: dict[TopicName, Future[None]] = {}
        self._namespaces_of: Namespaces | None = None
        self._topic_policies_of: TopicPolicies | None = None
        self._key_index: KeyIndex | None = None
        self._maintenance_passes = 0
        self._policy_listeners: list[Callable[[], None]] = []
        self._unload_listeners: list[Callable[[list[TopicName]], None]] = []
        self.admin = TopicAdmin(self)
        """Topic administration, statistics and acknowledgements by id (``broker/topic_admin.py``)."""
        self.schemas = SchemaRegistry(self, clock)
        """Topics' schema versions and compatibility checks (``broker/schema_registry.py``)."""
        self.reads_in_flight = ByteBudget(self.config.reads_in_flight_bytes_max)
        """What dispatch holds between storage and the connections (``broker/byte_budget.py``)."""
        self.publish_buffer = ByteBudget(self.config.publish_buffer_bytes_max, resume_fraction=0.5)
        """What producers sent and the managed ledgers have not stored yet: a transport stops
        reading its producers while it refuses (``admits()`` False), and resumes on its wake-up."""
        self._subscription_limits = SubscriptionLimits(read_bytes_max=self.config.dispatch_read_bytes_max,
                                                       consumer_pending_bytes_max=self.config.consumer_pending_bytes_max)

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
        self.factory = ManagedLedgerFactory(self._store, self.ledgers, self.cache, self.clock,
                                            publish_buffer=self.publish_buffer)
        self._key_index = KeyIndex(os.path.join(self.data_dir, "key-index"))
        self._namespaces_of = Namespaces(self._store, self._namespace_changed)
        self._topic_policies_of = TopicPolicies(self._store, self._topic_policy_changed)
        if "public" not in self.tenants():
            self.create_tenant("public", {})
        if "public/default" not in self.namespaces("public"):
            self.create_namespace("public/default")
        self._dispatch.start()
        self._compaction_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="magnetar-compaction")
        self._stop.clear()
        self._maintenance = threading.Thread(target=self._maintenance_loop, name="magnetar-maintenance", daemon=True)
        self._maintenance.start()
        if self.cluster is not None:
            self.cluster.start_serving(self.unload_topics, self._local_load)

    @property
    def storage(self) -> LedgerStorage:
        if self._storage is None:
            raise RuntimeError("broker service is not started")
        return self._storage

    @property
    def _namespaces(self) -> Namespaces:
        if self._namespaces_of is None:
            raise RuntimeError("broker service is not started")
        return self._namespaces_of

    @property
    def key_index(self) -> KeyIndex:
        if self._key_index is None:
            raise RuntimeError("broker service is not started")
        return self._key_index

    @property
    def store(self) -> MetadataStore:
        if self._store is None:
            raise RuntimeError("broker service is not started")
        return self._store

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop_serving()  # gives the bundles back once their topics are closed below
        self._stop.set()
        if self._maintenance is not None:
            self._maintenance.join()
            self._maintenance = None
        self._dispatch.close()
        if self._compaction_pool is not None:
            self._compaction_pool.shutdown(wait=True, cancel_futures=True)
            self._compaction_pool = None
        with self._lock:
            for subscription in self._subscriptions.values():
                subscription.detach()
            self._subscriptions.clear()
            self._subscriptions_by_topic.clear()
            for topic in self._topics.values():
                with contextlib.suppress(MagnetarError):
                    topic.close()
            self._topics.clear()
        if self.cluster is not None:
            self.cluster.release_bundles()
        if self._key_index is not None:
            self._key_index.close()
            self._key_index = None
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
            ownership = self.cluster.ownership
            serving = ownership is None or ownership.serving
            return Health("ok" if bookies and serving else "degraded", False, 0, 0)
        stats = self.storage.statistics()
        status = "degraded" if stats.read_only else "ok"
        return Health(status, stats.read_only, stats.ledgers, stats.journal.fsync_count,
                      self.storage.read_only_reason)

    # --- tenants and namespaces (broker/namespace/namespaces.py) ----------------------------------
    def add_policy_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change of tenants or namespace policies (permissions
        above all), on the thread that made it: open sessions re-check their permissions."""
        self._policy_listeners.append(listener)

    def create_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        self._namespaces.create_tenant(tenant, info)

    def tenants(self) -> list[str]:
        return self._namespaces.tenants()

    def tenant_info(self, tenant: str) -> dict[str, Any]:
        return self._namespaces.tenant_info(tenant)

    def delete_tenant(self, tenant: str) -> None:
        self._namespaces.delete_tenant(tenant)

    def update_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        self._namespaces.update_tenant(tenant, info)

    def create_namespace(self, namespace: str, policies: dict[str, Any] | None = None) -> None:
        self._namespaces.create_namespace(namespace, policies)

    def namespaces(self, tenant: str) -> list[str]:
        return self._namespaces.namespaces(tenant)

    def policies(self, namespace: str) -> dict[str, Any]:
        return self._namespaces.policies(namespace)

    def set_policy(self, namespace: str, key: str, value: Any) -> None:
        self._namespaces.set_policy(namespace, key, value)

    def delete_namespace(self, namespace: str) -> None:
        self._namespaces.delete_namespace(namespace, lambda ns: bool(self.topics(ns) or self.partitioned_topics(ns)))

    def _namespace_changed(self, namespace: str | None) -> None:
        """Open topics of the namespace follow its new retention and TTL at once; the policy
        listeners hear of every change (a listener's failure never undoes it)."""
        if namespace is not None:
            with self._lock:
                for name, topic in self._topics.items():
                    if name.namespace_name == namespace:
                        topic.ml.config = self._ml_config(name)
                        topic.quotas.apply(self._limits_of(name), topic.publish_rates())
        for listener in list(self._policy_listeners):
            try:
                listener()
            except Exception:
                log.exception("a policy listener failed")

    def default_retention(self) -> dict[str, int]:
        """The retention of a namespace without a policy of its own, in Pulsar's policy shape."""
        return {"retentionTimeInMinutes": self.config.default_retention_time_minutes,
                "retentionSizeInMB": self.config.default_retention_size_mb}

    def _ml_config(self, name: TopicName) -> ManagedLedgerConfig:
        policies = self.policies(name.namespace_name)
        retention = policies.get("retention_policies") or self.default_retention()
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

    def persistence(self, namespace: str) -> PersistencePolicy | None:
        """The namespace's persistence policy; None while it uses the broker's default quorums."""
        stored = self.policies(namespace).get(PERSISTENCE_POLICY_KEY)
        return PersistencePolicy.from_json(stored) if stored else None

    def set_persistence(self, namespace: str, policy: PersistencePolicy | None) -> None:
        """Set (None: remove) the quorums of the namespace's next ledgers; a policy the bookies
        available cannot serve is refused (``InvalidRequest``)."""
        value = None if policy is None else validated(policy, self.bookies_available()).to_json()
        self.set_policy(namespace, PERSISTENCE_POLICY_KEY, value)

    # --- quotas and topic policies (broker/quotas.py, broker/namespace/topic_policies.py) ---------
    @property
    def _topic_policies(self) -> TopicPolicies:
        if self._topic_policies_of is None:
            raise RuntimeError("broker service is not started")
        return self._topic_policies_of

    def topic_policies(self, name: TopicName) -> dict[str, Any]:
        """The topic's own policies ({} when it sets none; a partition's are its topic's)."""
        return self._topic_policies.policies(name)

    def set_topic_policy(self, name: TopicName, key: str, value: Any) -> None:
        """Set (None: remove) one of the topic's policies; ``NotFound`` for a missing topic."""
        if not self.topic_exists(name) and not self.partitions(name.base):
            raise NotFound(f"topic {name} does not exist")
        self._topic_policies.set_policy(name, key, value)

    def _topic_policy_changed(self, base: TopicName) -> None:
        with self._lock:
            for name, topic in self._topics.items():
                if name.base == base:
                    topic.quotas.apply(self._limits_of(name), topic.publish_rates())

    def _limits_of(self, name: TopicName) -> TopicLimits:
        return resolve_limits(self.config.quotas, self.policies(name.namespace_name), self.topic_policies(name))

    def _topic_count(self, namespace: str) -> int:
        """Topics in ``namespace`` as ``maxTopicsPerNamespace`` counts them: a partitioned topic
        counts its partitions, any other topic one."""
        partitioned = [TopicName.parse(t) for t in self.partitioned_topics(namespace)]
        bases = {t.local_name for t in partitioned}
        plain = sum(1 for t in self.topics(namespace) if TopicName.parse(t).base.local_name not in bases)
        return plain + sum(self.partitions(t) for t in partitioned)

    def _check_topics_room(self, name: TopicName, adding: int) -> None:
        namespace = name.namespace_name
        limit = topics_max(self.config.quotas, self.policies(namespace))
        if limit > 0:
            check_topics_room(namespace, limit, self._topic_count(namespace), adding)

    def check_subscription_room(self, name: TopicName, subscription: str) -> None:
        """``QuotaExceeded`` when ``subscription`` would be a new one beyond the topic's
        ``maxSubscriptionsPerTopic`` (durable ones and active non-durable ones count)."""
        topic = self.topic(name, create=False)
        if topic.quotas.limits.subscriptions_max <= 0 or topic.cursors.get(subscription) is not None:
            return
        with self._lock:
            names = set(topic.cursors.names()) | set(self._subscriptions_by_topic.get(name, {}))
        if subscription not in names:
            topic.quotas.check_subscription_room(len(names))

    # --- topics --------------------------------------------------------------------------
    def topic(self, name: str | TopicName, *, create: bool | None = None) -> PersistentTopic:
        """The topic (or partition) ``name``; created on first use when auto-creation is on."""
        topic_name = name if isinstance(name, TopicName) else TopicName.parse(name)
        topic = self._topics.get(topic_name)
        if topic is not None:
            return topic
        if self.cluster is not None:
            self.cluster.check_served_here(topic_name)  # TopicNotOwned names the owner; may take the bundle
        with self._lock:
            topic = self._topics.get(topic_name)
            if topic is not None:
                return topic
            if self.cluster is not None and not self.cluster.owns(topic_name):
                raise ServiceUnitNotReady(f"the bundle of {topic_name} changed owners; retry")
            allowed = self.config.auto_create_topics if create is None else create
            if not self.factory.exists(topic_name.managed_ledger_name):
                self._check_creatable(topic_name, allowed)
            ml = self.factory.open(topic_name.managed_ledger_name, self._ml_config(topic_name))
            cursors = CursorManager(ml, self.ledgers, self.store)
            dedup = self.policies(topic_name.namespace_name).get("deduplicationEnabled")
            topic = PersistentTopic(topic_name, ml, cursors, self.store,
                                    dedup_enabled=self.config.dedup_enabled if dedup is None else bool(dedup),
                                    clock=self.clock)
            topic.quotas.apply(self._limits_of(topic_name))
            streams = topic.streams = self.key_index.partition(topic_name.managed_ledger_name, ml, topic.entries_from)
            # trimming also keeps what the key index has not made durable yet
            ml.cursor_positions = lambda: [*cursors.durable_mark_delete_offsets(), streams.durable_watermark]
            self._topics[topic_name] = topic
            self._offer_to_patterns(topic_name)
            self._tell_topic_watchers(topic_name, exists=True)
            return topic

    # --- ownership (cluster brokers) ----------------------------------------------------------
    def add_unload_listener(self, listener: Callable[[list[TopicName]], None]) -> None:
        """Call ``listener(names)`` when topics stop being served here (their bundle was unloaded,
        split, or lost with the ZooKeeper session): transports end the sessions on them, and
        their clients look the topics up again."""
        self._unload_listeners.append(listener)

    def unload_topics(self, contains: Callable[[TopicName], bool], graceful: bool) -> list[TopicName]:
        """Stop serving every loaded topic ``contains`` accepts: their consumers are disconnected
        and, when ``graceful``, the topics closed (cursors and ledgers persisted); otherwise
        they are abandoned without a write (the next owner fences their ledgers)."""
        with self._lock:
            names = [name for name in self._topics if contains(name)]
            topics = [self._topics.pop(name) for name in names]
            subscriptions = []
            for name in names:
                self._compactors.pop(name, None)
                self.factory.forget(name.managed_ledger_name)  # reloaded fresh if the bundle comes back
                for sub_name, subscription in self._subscriptions_by_topic.pop(name, {}).items():
                    self._subscriptions.pop((name, sub_name), None)
                    subscriptions.append(subscription)
        for subscription in subscriptions:
            for consumer in list(subscription.consumers):
                consumer.unloaded = True
                consumer.close()
                if consumer.listener is not None:
                    consumer.listener()
            subscription.detach()
        if names:
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
        if names:
            log.info("stopped serving %d topics (%s)", len(names), "unloaded" if graceful else "session lost")
        return names

    def _local_load(self) -> tuple[int, float, float]:
        """(topics, messages/s in, messages/s out) for this broker's load report."""
        topics = self.open_topics()
        rate_in = sum(topic.publish_rates()[0] for topic in topics)
        return len(topics), rate_in, 0.0

    def owner_of(self, name: TopicName) -> str | None:
        """The broker id serving ``name`` (None: standalone, or not served by any broker now)."""
        return None if self.cluster is None else self.cluster.owner_of(name)

    @property
    def clustered(self) -> bool:
        """Whether this is a cluster broker: topics may be served by others, and a lookup may
        need ZooKeeper (transports then look up off their event loops)."""
        return self.cluster is not None

    def check_served_here(self, name: TopicName) -> None:
        """Return when this broker serves ``name`` (always, standalone), taking its bundle when
        it is assigned here; else ``TopicNotOwned`` naming the owner, or ``ServiceUnitNotReady``
        while the bundle is between owners. Transports ask before anything a non-owner must not
        do (register a producer's schema, open a consumer)."""
        if self.cluster is not None:
            self.cluster.check_served_here(name)

    def lookup(self, name: TopicName) -> LookupResult:
        """Where ``name`` is served, taking its bundle when it is assigned to this broker (the
        answer of every transport's lookup). Standalone: here, with empty addresses."""
        if self.cluster is None:
            return LookupResult(name.full_name, "", BrokerAddress("", ""), True)
        return self.cluster.lookup(name)

    def brokers(self) -> list[dict[str, Any]]:
        """The live brokers' load reports (Pulsar's ``LocalBrokerData`` keys); [] standalone."""
        ownership = self._ownership()
        return [] if ownership is None else [r.to_json() for r in ownership.load_reports()]

    def bundles(self, namespace: str) -> dict[str, Any]:
        """The namespace's bundle boundaries (``{boundaries, numBundles}``)."""
        ownership = self._ownership()
        if ownership is None:
            self.policies(namespace)
            return {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1}
        return ownership.bundles(namespace).to_policy()

    def bundle_owners(self, namespace: str) -> dict[str, str | None]:
        """Each bundle of the namespace and the broker id owning it (None: unowned)."""
        ownership = self._required_ownership()
        return {name: None if owner is None else owner.broker_id
                for name, owner in ownership.bundle_owners(namespace).items()}

    def unload_bundle(self, namespace: str, bundle: str, destination: str | None = None) -> str | None:
        """Stop serving a bundle this broker owns and hand it to ``destination`` or the
        least-loaded other broker; returns that broker's id."""
        target = self._required_ownership().unload(namespace, bundle, destination)
        return None if target is None else target.broker_id

    def split_bundle(self, namespace: str, bundle: str) -> list[str]:
        """Divide a bundle this broker owns in two; returns the new bundles' ranges."""
        return [b.range_name for b in self._required_ownership().split(namespace, bundle)]

    def _ownership(self) -> OwnershipManager | None:
        return None if self.cluster is None else self.cluster.ownership

    def _required_ownership(self) -> OwnershipManager:
        ownership = self._ownership()
        if ownership is None:
            raise NotAllowed("bundles are owned by brokers only in a cluster (magnetar broker)")
        return ownership

    def _check_creatable(self, name: TopicName, allowed: bool) -> None:
        self.policies(name.namespace_name)  # NotFound for an unknown namespace
        if not allowed:
            raise NotFound(f"topic {name} does not exist")
        partitions = self.partitions(name.base)
        if name.partition_index < 0 and partitions > 0:
            raise NotAllowed(f"{name} is a partitioned topic; use its -partition-N topics")
        if name.partition_index >= 0 and partitions and name.partition_index >= partitions:
            raise NotFound(f"{name}: partition {name.partition_index} of {partitions} does not exist")
        if not partitions:  # a partition of a partitioned topic was counted with its topic
            self._check_topics_room(name, 1)

    def topic_exists(self, name: TopicName) -> bool:
        return self.factory.exists(name.managed_ledger_name)

    def create_topic(self, name: TopicName) -> PersistentTopic:
        if self.topic_exists(name) or self.partitions(name) > 0:
            raise AlreadyExists(f"topic {name} already exists")
        return self.topic(name, create=True)

    def topics(self, namespace: str) -> list[str]:
        tenant, ns = check_namespace(namespace)
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
        self.key_index.drop(name.managed_ledger_name)
        self.factory.forget(name.managed_ledger_name)
        if name.partition_index < 0:
            self._topic_policies.delete(name)
        self._tell_topic_watchers(name, exists=False)

    def create_partitioned_topic(self, name: TopicName, partitions: int) -> None:
        if not 1 <= partitions <= PARTITIONS_MAX:
            raise InvalidRequest(f"partitions must be in 1..{PARTITIONS_MAX}, not {partitions}")
        if name.partition_index >= 0:
            raise InvalidRequest(f"{name} is a partition name")
        self.policies(name.namespace_name)
        if self.partitions(name) > 0 or self.topic_exists(name):
            raise AlreadyExists(f"topic {name} already exists")
        self._check_topics_room(name, partitions)
        self._write_partitions(name, partitions, -1)

    def update_partitioned_topic(self, name: TopicName, partitions: int) -> None:
        current = self.partitions(name)
        if current == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        if partitions <= current or partitions > PARTITIONS_MAX:
            raise InvalidRequest(f"partitions can only grow: {current} -> {partitions}")
        self._check_topics_room(name, partitions - current)
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
        tenant, ns = check_namespace(namespace)
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
        self._topic_policies.delete(name)

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
    def use_dispatch_executor(self, executor: Executor | None) -> None:
        """Run dispatch work with ``executor`` (thread-safe, non-blocking: it queues the callable)
        instead of the dispatch thread; ``None`` goes back to it (``broker/dispatch_scheduling.py``)."""
        self._dispatch.use_executor(executor)

    def write_journal_on_this_thread(self, schedule: Callable[[Callable[[], None]], object] | None) -> None:
        """Publishes made on the calling thread (the event loop's) while the embedded bookie's
        journal is idle are made durable by that thread, in a call ``schedule`` (``call_soon``)
        runs after the current work: at low rates this saves the hand-over to the journal thread
        and back. ``None`` turns it off. A cluster broker's bookies are other processes: no-op."""
        if self._storage is not None:
            self._storage.write_journal_on_caller_thread(schedule)

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
            self.check_subscription_room(topic_name, name)
            cursor = topic.cursors.open(name, initial=initial, durable=durable)
            created = Subscription(topic_name.full_name, topic_name.partition_index, cursor, sub_type,
                                   clock=self.clock, limits=self._subscription_limits, dead_letter=self._dead_letter,
                                   schedule=self._dispatch.schedule, budget=self.reads_in_flight,
                                   quotas=topic.quotas, schedule_after=self._dispatch.schedule_after)
            self._subscriptions[key] = created
            self._subscriptions_by_topic.setdefault(topic_name, {})[name] = created
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
        for full_name in self.topics(namespace):
            self._offer_to_patterns(TopicName.parse(full_name))
        return multi

    def _forget_pattern(self, entry: tuple[TopicPattern, MultiConsumer, Callable[[TopicName], Consumer]]) -> None:
        with self._lock:
            if entry in self._patterns:
                self._patterns.remove(entry)

    def watch_topics(self, namespace: str, listener: Callable[[str, bool], None]) -> Callable[[], None]:
        """Call ``listener(full_topic_name, exists)`` when a topic of ``namespace`` is opened by this
        broker (created, or first used since the start: a listener may hear of a topic it already
        listed) or deleted, on the thread that did it, until the returned function is called.
        At most ``TOPIC_WATCHERS_MAX`` listeners in all (``InvalidRequest`` beyond); watching and
        unwatching cost the same however many there are."""
        key = "/".join(check_namespace(namespace))
        with self._lock:
            if self._topic_watcher_count >= TOPIC_WATCHERS_MAX:
                raise InvalidRequest(f"this broker already follows {TOPIC_WATCHERS_MAX} topic lists")
            listeners = self._topic_watchers.setdefault(key, {})
            if listener not in listeners:
                listeners[listener] = None
                self._topic_watcher_count += 1

        def unwatch() -> None:
            with self._lock:
                listeners = self._topic_watchers.get(key, {})
                if listener in listeners:
                    del listeners[listener]
                    self._topic_watcher_count -= 1
                if not listeners:
                    self._topic_watchers.pop(key, None)

        return unwatch

    def _tell_topic_watchers(self, topic_name: TopicName, *, exists: bool) -> None:
        with self._lock:
            listeners = list(self._topic_watchers.get(topic_name.namespace_name, ()))
        for listener in listeners:
            try:
                listener(topic_name.full_name, exists)
            except Exception:
                log.exception("a topic-list listener failed")

    def _offer_to_patterns(self, topic_name: TopicName) -> None:
        with self._lock:
            patterns = list(self._patterns)
        for compiled, multi, join in patterns:
            if compiled.matches(topic_name.namespace_name, topic_name.full_name) \
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
                of_topic = self._subscriptions_by_topic[topic_name]
                del of_topic[name]
                if not of_topic:
                    del self._subscriptions_by_topic[topic_name]
        if subscription is None or subscription.cursor.durable:  # a non-durable cursor is nowhere else
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

    def subscriptions_of(self, topic_name: TopicName) -> list[Subscription]:
        with self._lock:
            return list(self._subscriptions_by_topic.get(topic_name, {}).values())

    def reader(self, topic: str | TopicName, start: StartPosition, *, compacted: bool = False) -> Reader:
        topic_name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        compactor = self.compactor(topic_name) if compacted else None
        return Reader(self.topic(topic_name), start, compactor=compactor, budget=self.reads_in_flight,
                      read_bytes_max=self.config.dispatch_read_bytes_max)

    def producer(self, topic: str | TopicName, name: str, *, routing_mode: str = "RoundRobinPartition",
                 compression: Compression = Compression.NONE, initial_sequence_id: int | None = None) -> Producer:
        """A producer on ``topic`` (partitioned or not; auto-created on first use when allowed):
        the topic or every partition is made to exist now, so a refusal comes before any send.
        It holds a producer slot of each (``ProducerBusy`` beyond a partition's limit) until
        the transport closes it (``Producer.close``)."""
        topic_name = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        slots: list[TopicQuotas] = []
        try:
            for partition in self.expand_partitions(topic_name):
                quotas = self.topic(partition).quotas
                quotas.add_producer()  # ProducerBusy at the topic's maxProducers
                slots.append(quotas)
        except BaseException:
            for quotas in slots:
                quotas.remove_producer()
            raise
        return Producer(self, topic_name, name, routing_mode=routing_mode, compression=compression,
                        initial_sequence_id=initial_sequence_id, slots=slots)

    def read_range(self, name: TopicName, offset: int, max_messages: int, max_bytes: int, *,
                   message_overhead_bytes: int = 0) -> RangeRead:
        """Messages of one partition from ``offset`` on as Arrow columns (``broker/range_read.py``)."""
        if name.partition_index < 0 and self.partitions(name) > 0:
            raise InvalidRequest(f"{name} is a partitioned topic; read one partition: "
                                 f".../{name.local_name}/partitions/{{n}}/messages")
        if self.topic_exists(name):
            topic: PersistentTopic | None = self.topic(name, create=False)
        elif 0 <= name.partition_index < self.partitions(name.base):
            topic = None  # a partition nobody wrote to yet
        else:
            raise NotFound(f"topic {name} does not exist")
        return read_range(topic, name, offset, max_messages, max_bytes, message_overhead_bytes=message_overhead_bytes)

    def statistics(self) -> BrokerStats:
        topics = []
        for topic in self.open_topics():
            with contextlib.suppress(MagnetarError):  # closed or deleted meanwhile: left out
                topics.append(topic_stats(topic, self.subscriptions_of(topic.name)))
        key_index = self.key_index.statistics()
        reads, publishes = self.reads_in_flight.statistics(), self.publish_buffer.statistics()
        if self.cluster is not None:
            return BrokerStats(None, self.cache.statistics(), self.store.statistics(), tuple(topics),
                               self.cluster.statistics(), key_index, self._maintenance_passes,
                               self.factory.appends_fenced, reads, publishes)
        return BrokerStats(self.storage.statistics(), self.cache.statistics(), self.store.statistics(), tuple(topics),
                           key_index=key_index, maintenance_passes=self._maintenance_passes,
                           appends_fenced=self.factory.appends_fenced, reads_in_flight=reads, publish_buffer=publishes)

    # --- event streams (broker/key_index.py, broker/event_streams.py) ----------------------------
    def stream_partition(self, name: TopicName, key: str) -> TopicName:
        """The partition holding the stream of ``key``: the one a keyed message routes to."""
        partitions = self.partitions(name) if name.partition_index < 0 else 0
        return name.partition(PartitionRouter.key_partition(key, partitions)) if partitions else name

    def check_stream_partition(self, target: TopicName, keys: list[str]) -> None:
        """A conditional append (one entry) goes to one partition, which must be where each of
        its keys routes (``InvalidRequest`` otherwise): a key's stream lives in one partition."""
        if target.partition_index < 0:
            return
        partitions = self.partitions(target.base)
        for key in keys:
            home = PartitionRouter.key_partition(key, partitions) if partitions else target.partition_index
            if home != target.partition_index:
                raise InvalidRequest(f"key {key[:64]!r} belongs to partition {home} of {target.base}, not "
                                     f"{target.partition_index}: the keys of a conditional append must share "
                                     "one partition", field="expectedKeyVersions")

    def _stream_topic(self, name: TopicName, key: str) -> tuple[PersistentTopic | None, TopicName]:
        target = self.stream_partition(name, key)
        if self.topic_exists(target):
            return self.topic(target, create=False), target
        if 0 <= target.partition_index < self.partitions(target.base):
            return None, target  # a partition nobody wrote to yet
        raise NotFound(f"topic {name} does not exist")

    def stream_info(self, name: TopicName, key: str) -> StreamInfo:
        """Where the stream of ``key`` in topic ``name`` stands."""
        topic, target = self._stream_topic(name, key)
        return stream_info(topic, target, key)

    def read_stream(self, name: TopicName, key: str, from_version: int | None, max_messages: int, max_bytes: int, *,
                    backward: bool = False, message_overhead_bytes: int = 0) -> StreamRead:
        """Messages of the stream of ``key`` by version, as Arrow columns (``broker/event_streams.py``)."""
        topic, target = self._stream_topic(name, key)
        return read_stream(topic, target, key, from_version, max_messages, max_bytes, backward=backward,
                           message_overhead_bytes=message_overhead_bytes)

    def stream_reader(self, name: TopicName, key: str, from_version: int) -> KeyReader:
        """A live reader of the stream of ``key`` from ``from_version`` on (the topic is created
        when auto-creation allows, as for any reader)."""
        return KeyReader(self.topic(self.stream_partition(name, key)), key, from_version)

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
        entry = entry_of_messages([Message(payload=message.payload, key=message.key, properties=properties,
                                           event_time_ms=message.event_time_ms)], sequence_id=0)
        outcome = self.topic(target).append(
            [entry], producer_name=f"DLQ:{delivery.topic}:{subscription}:{delivery.offset}").result(timeout=60)[0]
        if isinstance(outcome, MagnetarError):
            raise outcome

    # --- maintenance ---------------------------------------------------------------------
    def run_maintenance(self) -> None:
        """Expire messages past their TTL, trim consumed ledgers, age out the entry cache,
        apply ack timeouts, release due redeliveries and update the publish rates."""
        with self._lock:
            subscriptions = list(self._subscriptions.values())
        for subscription in subscriptions:
            subscription.tick()
        key_index = self.key_index
        key_index.sync()  # trimming keeps what the key index has not made durable
        for topic in self.open_topics():
            expired = topic.ml.expired_offset()
            if expired is not None:
                for name in topic.cursors.names():
                    cursor = topic.cursors.get(name)
                    if cursor is not None:
                        cursor.expire_before(expired)
            topic.ml.trim()
            topic.tick()
        key_index.cleanup()
        self.cache.evict_expired()
        self._maintenance_passes += 1

    def _maintenance_loop(self) -> None:
        while not self._stop.wait(self.config.maintenance_interval_ms / 1000.0):
            try:
                self.run_maintenance()
            except MagnetarError:
                log.exception("maintenance pass failed")
