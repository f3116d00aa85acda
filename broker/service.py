"""BrokerService: the broker process's root object, which builds the broker's parts.

Role: ``magnetar standalone`` builds one over a data directory. :meth:`start` opens what all
stands on (the embedded bookie, ``storage``; the RocksDB metadata store; the ledger manager,
entry cache and managed-ledger factory, with the offloader when ``managedLedgerOffloadDriver`` names
one (``broker/offload/``); the key index, kept in ledgers beside its topics) and builds
the parts transports use, each over only what it needs: ``namespaces`` (tenants, namespaces,
policies, who serves what: ``broker/namespace/service.py``), ``topics`` (the topic registry:
``broker/topic_registry.py``), ``subscriptions`` (subscribe, readers, cursor moves, topic-list
watchers: ``broker/subscriptions.py``), ``streams`` (range and event-stream reads:
``broker/streams.py``), ``compactions``, ``admin`` (``broker/topic_admin.py``), ``schemas``
(``broker/schema_registry.py``), ``maintenance`` (``broker/maintenance.py``) and
``producer_access`` (access modes and each topic's durable epoch: ``broker/producer_access.py``). With
``cluster`` (``magnetar broker``) there is no embedded bookie: the metadata store is ZooKeeper
and ledgers go to the remote bookies registered there (``broker/cluster.py``).

Invariant: between :meth:`start` and :meth:`close` the storage is open; after :meth:`close`
every acknowledged entry is in synced entry logs and the journal is checkpointed. The parts
exist from :meth:`start` on; listeners added before it hear of everything after it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.bookkeeper.bookie import BookieClient, LocalBookie
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.byte_budget import ByteBudget, ByteBudgetStats
from broker.compaction import Compactions, CompactionsStats
from broker.config import BrokerConfig
from broker.dispatch_scheduling import DispatchScheduler, Executor
from broker.entry_cache import EntryCache, EntryCacheStats
from broker.errors import MagnetarError
from broker.key_index import KeyIndex, KeyIndexStats
from broker.limits import OFFLOAD_PUBLISHING_WINDOW_S
from broker.maintenance import Maintenance
from broker.managed_ledger_factory import ManagedLedgerFactory
from broker.metadata.rocksdb import RocksDBMetadataStore
from broker.metadata.store import MetadataStore, MetadataStoreStats
from broker.namespace.service import NamespaceService
from broker.offload import OffloadSettings, create_offloader
from broker.offload.offloader import LedgerOffloader
from broker.offload.orphans import OrphanedCopies
from broker.producer_access import TOPIC_EPOCH_PROPERTY, ProducerAccess
from broker.rate_history import RateHistory, RateSample
from broker.schema_registry import SchemaDefaults, SchemaRegistry
from broker.streams import EventStreams
from broker.subscription import SubscriptionLimits
from broker.subscription_census import SubscriptionCensus, SubscriptionCount
from broker.subscriptions import Subscriptions, SubscriptionsStats
from broker.topic_admin import TopicAdmin
from broker.topic_name import TopicName
from broker.topic_registry import TopicDefaults, TopicRegistry, TopicRegistryStats
from broker.topic_resources import TopicResources
from broker.topic_stats import TopicStats, topic_stats
from storage import FileIO, LedgerStorage, StorageStats

if TYPE_CHECKING:  # a cluster broker's storage pulls in kazoo; the embedded broker never loads it
    from broker.cluster import ClusterStats, ClusterStorage

__all__ = ["BrokerConfig", "BrokerService", "BrokerStats", "Health"]


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
    topic_registry: TopicRegistryStats | None = None
    subscriptions: SubscriptionsStats | None = None
    compactions: CompactionsStats | None = None
    rate_history: tuple[RateSample, ...] = ()
    """The broker-wide rates of the last minutes, oldest first (``broker/rate_history.py``)."""
    subscription_count: SubscriptionCount | None = None
    """Every topic's subscriptions, loaded or not (``broker/subscription_census.py``)."""
    offloader: dict[str, Any] | None = None
    """The offloader's counts (``LedgerOffloader.statistics``); None without ``managedLedgerOffloadDriver``."""


@dataclass(frozen=True)
class Health:
    status: str
    storage_read_only: bool
    ledgers: int
    journal_fsyncs: int
    storage_read_only_reason: str | None = None
    """Why the storage refuses writes (a full disk is named as such); None while writable."""


@dataclass(frozen=True)
class _Parts:
    store: MetadataStore
    cache: EntryCache
    factory: ManagedLedgerFactory
    key_index: KeyIndex
    namespaces: NamespaceService
    topics: TopicRegistry
    compactions: Compactions
    subscriptions: Subscriptions
    streams: EventStreams
    admin: TopicAdmin
    schemas: SchemaRegistry
    maintenance: Maintenance
    census: SubscriptionCensus
    orphans: OrphanedCopies


class BrokerService:
    def __init__(self, data_dir: str | None, config: BrokerConfig | None = None,
                 clock: Callable[[], float] = time.time, *, fileio: FileIO | None = None,
                 journal_dir: str | None = None, cluster: ClusterStorage | None = None) -> None:
        if data_dir is None and cluster is None:
            raise ValueError("a standalone broker needs a data directory")
        self.data_dir = None if data_dir is None else os.path.abspath(data_dir)
        """The embedded bookie's and the metadata store's directory (standalone); a broker of a
        cluster keeps nothing on a local disk (None)."""
        self.config = config or BrokerConfig()
        self.clock = clock
        self.rate_history = RateHistory(clock)
        self._fileio = fileio
        self._journal_dir = journal_dir
        self.cluster = cluster
        self._storage: LedgerStorage | None = None
        self._parts: _Parts | None = None
        self._dispatch = DispatchScheduler()
        self._policy_listeners: list[Callable[[], None]] = []
        self._unload_listeners: list[Callable[[list[TopicName]], None]] = []
        self.reads_in_flight = ByteBudget(self.config.reads_in_flight_bytes_max)
        """What dispatch holds between storage and the connections (``broker/byte_budget.py``)."""
        self.publish_buffer = ByteBudget(self.config.publish_buffer_bytes_max, resume_fraction=0.5)
        """What producers sent and the managed ledgers have not stored yet: a transport stops
        reading its producers while it refuses (``admits()`` False), and resumes on its wake-up."""
        self.producer_access = ProducerAccess(self._topic_epoch, self._store_topic_epoch)
        """Who produces where with which access mode; the topics' epochs, stored with each topic."""

    def start(self) -> None:
        if self.cluster is not None:
            store, ledgers = self.cluster.open(self.clock)
        else:
            assert self.data_dir is not None
            os.makedirs(self.data_dir, exist_ok=True)
            self._storage = LedgerStorage.open(os.path.join(self.data_dir, "bookie"), self.config.storage,
                                               fileio=self._fileio, journal_dir=self._journal_dir)
            store = RocksDBMetadataStore(os.path.join(self.data_dir, "metadata"), clock=self.clock)
            ledgers = LedgerManager(store, BookieClient([LocalBookie("local", self._storage)]), self.clock)
        parts = self._parts = self._build(store, ledgers)
        parts.namespaces.create_default_namespace()
        self._dispatch.start()
        parts.maintenance.start()
        if self.cluster is not None:
            self.cluster.start_serving(parts.topics.unload, parts.topics.local_load)

    def _build(self, store: MetadataStore, ledgers: LedgerManager) -> _Parts:
        config, clock = self.config, self.clock
        cache = EntryCache(config.entry_cache_bytes_max, entry_age_ms_max=config.entry_cache_age_ms_max)
        factory = ManagedLedgerFactory(store, ledgers, cache, clock, publish_buffer=self.publish_buffer,
                                       offloader=_offloader(config, self.publish_buffer))
        key_index = KeyIndex(ledgers, store)
        resources = TopicResources(store)
        namespaces = NamespaceService(store, resources, cluster=self.cluster, listeners=self._policy_listeners,
                                      default_retention_time_minutes=config.default_retention_time_minutes,
                                      default_retention_size_mb=config.default_retention_size_mb)
        defaults = TopicDefaults(config.managed_ledger, config.quotas, config.auto_create_topics, config.dedup_enabled)
        topics = TopicRegistry(defaults, factory, key_index, resources, namespaces, clock,
                               unload_listeners=self._unload_listeners)
        compactions = Compactions(lambda name: topics.topic(name, create=False), ledgers, store, clock)
        topics.on_deleted(lambda name: compactions.forget([name]))
        topics.on_unloaded(compactions.forget)
        limits = SubscriptionLimits(read_bytes_max=config.dispatch_read_bytes_max,
                                    consumer_pending_bytes_max=config.consumer_pending_bytes_max)
        subscriptions = Subscriptions(topics, compactions, self._dispatch, self.reads_in_flight, limits, clock)
        census = SubscriptionCensus(store, clock)
        orphans = OrphanedCopies(store, lambda: factory.offloader, clock)
        topics.on_unloaded(lambda _names: census.recount())
        topics.on_deleted(lambda _name: census.recount())
        return _Parts(store, cache, factory, key_index, namespaces, topics, compactions, subscriptions,
                      EventStreams(topics), TopicAdmin(topics, subscriptions, compactions, namespaces.policies, clock),
                      SchemaRegistry(store, namespaces.policies, clock, topic_policies=namespaces.topic_policies,
                                     defaults=SchemaDefaults(config.schema_compatibility_strategy,
                                                             config.allow_auto_update_schema,
                                                             config.schema_validation_enforced)),
                      Maintenance(config.maintenance_interval_ms, subscriptions.tick, topics.loaded, key_index, cache,
                                  lambda: self._after_maintenance_pass(topics, subscriptions, census, orphans)),
                      census, orphans)

    def _after_maintenance_pass(self, topics: TopicRegistry, subscriptions: Subscriptions,
                                census: SubscriptionCensus, orphans: OrphanedCopies) -> None:
        self.rate_history.maybe_sample(lambda: _loaded_topic_stats(topics, subscriptions))
        census.maybe_count()
        orphans.maybe_sweep()

    def offloader(self) -> LedgerOffloader | None:
        """The object store closed ledgers are offloaded to (None: no ``managedLedgerOffloadDriver``)."""
        return self._started().factory.offloader

    def _topic_epoch(self, topic: str) -> int:
        if not TopicName.parse(topic).persistent:
            return 0  # a non-persistent topic keeps nothing, its epoch neither (as Pulsar's)
        return int(self.topics.topic(topic, create=False).ml.property_value(TOPIC_EPOCH_PROPERTY) or 0)

    def _store_topic_epoch(self, topic: str, epoch: int) -> None:
        if TopicName.parse(topic).persistent:
            self.topics.topic(topic, create=False).ml.set_property(TOPIC_EPOCH_PROPERTY, str(epoch))

    def _started(self) -> _Parts:
        if self._parts is None:
            raise RuntimeError("broker service is not started")
        return self._parts

    @property
    def namespaces(self) -> NamespaceService:
        return self._started().namespaces

    @property
    def topics(self) -> TopicRegistry:
        return self._started().topics

    @property
    def subscriptions(self) -> Subscriptions:
        return self._started().subscriptions

    @property
    def streams(self) -> EventStreams:
        return self._started().streams

    @property
    def compactions(self) -> Compactions:
        return self._started().compactions

    @property
    def admin(self) -> TopicAdmin:
        """Topic administration, statistics and acknowledgements by id (``broker/topic_admin.py``)."""
        return self._started().admin

    @property
    def schemas(self) -> SchemaRegistry:
        """Topics' schema versions and compatibility checks (``broker/schema_registry.py``)."""
        return self._started().schemas

    @property
    def maintenance(self) -> Maintenance:
        return self._started().maintenance

    @property
    def store(self) -> MetadataStore:
        return self._started().store

    @property
    def key_index(self) -> KeyIndex:
        return self._started().key_index

    @property
    def cache(self) -> EntryCache:
        return self._started().cache

    @property
    def storage(self) -> LedgerStorage:
        if self._storage is None:
            raise RuntimeError("broker service is not started")
        return self._storage

    def add_policy_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change of tenants or namespace policies (permissions
        above all), on the thread that made it: open sessions re-check their permissions."""
        self._policy_listeners.append(listener)

    def add_unload_listener(self, listener: Callable[[list[TopicName]], None]) -> None:
        """Call ``listener(names)`` when topics stop being served here (their bundle was unloaded,
        split, or lost with the ZooKeeper session): transports end the sessions on them, and
        their clients look the topics up again."""
        self._unload_listeners.append(listener)

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

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop_serving()  # gives the bundles back once their topics are closed below
        parts, self._parts = self._parts, None
        if parts is not None:
            parts.maintenance.close()
        self._dispatch.close()
        if parts is not None:
            parts.compactions.close()
            parts.subscriptions.close()
            parts.topics.close()
        if self.cluster is not None:
            self.cluster.release_bundles()
        if parts is not None:
            parts.key_index.close()
            parts.store.close()
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

    def statistics(self) -> BrokerStats:
        parts = self._started()
        topics = _loaded_topic_stats(parts.topics, parts.subscriptions)
        return BrokerStats(
            None if self.cluster is not None else self.storage.statistics(), parts.cache.statistics(),
            parts.store.statistics(), tuple(topics), None if self.cluster is None else self.cluster.statistics(),
            parts.key_index.statistics(), parts.maintenance.statistics().passes, parts.factory.appends_fenced,
            self.reads_in_flight.statistics(), self.publish_buffer.statistics(), parts.topics.statistics(),
            parts.subscriptions.statistics(), parts.compactions.statistics(), self.rate_history.samples(),
            parts.census.total({TopicName.parse(t.topic).managed_ledger_name: len(t.subscriptions) for t in topics}),
            None if parts.factory.offloader is None else
            {**parts.factory.offloader.statistics(), "orphaned_copies_deleted": parts.orphans.statistics().deleted})


def _loaded_topic_stats(topics: TopicRegistry, subscriptions: Subscriptions) -> list[TopicStats]:
    """Every loaded topic's statistics (one closed or deleted meanwhile is left out). Takes the
    parts themselves, not the service: the maintenance pass that samples the rates may run while
    the service closes."""
    found = []
    for topic in topics.loaded():
        with contextlib.suppress(MagnetarError):
            found.append(topic_stats(topic, subscriptions.of(topic.name)))
    return found


def check_offload_settings(settings: Mapping[str, str]) -> None:
    """Refuse unusable offload keys before anything starts: ``OffloadConfigError``, one line
    naming the key (an unknown driver, a missing bucket or ``fileSystemURI``, a bound out of range)."""
    if settings.get("managedLedgerOffloadDriver", "").strip():
        OffloadSettings.from_config(settings)


def _offloader(config: BrokerConfig, publish_buffer: ByteBudget) -> LedgerOffloader | None:
    """The configured object store (``managedLedgerOffloadDriver``; None when none is), built by
    ``broker/offload/``'s ``create_offloader`` from the driver's keys as given; its offloads yield
    to publishing while the publish buffer took bytes within ``OFFLOAD_PUBLISHING_WINDOW_S``."""
    if not config.offload_driver:
        return None
    return create_offloader(OffloadSettings.from_config(config.offload_settings),
                            publishing=lambda: publish_buffer.added_within(OFFLOAD_PUBLISHING_WINDOW_S))
