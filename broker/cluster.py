"""The cluster's front door: what a cluster broker stands on, and what ``magnetar bookie`` runs.

Role: what ``magnetar bookie`` and ``magnetar broker`` (``api/cli_cluster.py``) build on, and
nothing else of the broker's cluster code: ``ClusterStorage`` (below), its configuration
(``ClusterConfig`` and the settings of its parts: ``BookieNetworkConfig``,
``AutoRecoveryConfig``, ``OwnershipConfig``), its statistics, and ``run_bookie`` /
``BookieProcessConfig``, the bookie process, re-exported from ``storage`` (a bookie depends on
nothing above storage).

``magnetar broker --metadata-store zk:…`` builds its ``BrokerService`` with a
``ClusterStorage``. Where ``magnetar standalone`` opens an embedded bookie and a RocksDB
metadata store, this opens one kazoo session (``storage``'s ``connect``, shared by the ZooKeeper
metadata store, the coordination recipes and the ledger id counter: ``broker/metadata/``), a
``RemoteBookieClient`` over the bookies registered there, and the re-replication worker
(``broker/bookkeeper/``). The broker itself holds no data: everything it knows is in ZooKeeper
and on the bookies, which is what lets more brokers share them.

With an ``OwnershipConfig`` (every ``magnetar broker``) it also owns namespace bundles
(``broker/namespace/ownership.py``): the broker service asks it, before loading a topic, whether
the topic is served here, and hands it the callbacks that drop topics when a bundle goes away.

Invariants: only cluster processes import this module (it loads kazoo); ``magnetar standalone``
never does. Closed in the reverse order of opening; after :meth:`ClusterStorage.close` no thread
of it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.bookkeeper.autorecovery import AutoRecoveryConfig, AutoRecoveryStats, ReplicationWorker
from broker.bookkeeper.bookie_network import BookieConnectionStats, BookieNetworkConfig
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.bookkeeper.remote_bookie import RemoteBookieClient
from broker.metadata.coordination import Coordination, CoordinationStats, ZooKeeperCoordination
from broker.metadata.store import MetadataStore
from broker.metadata.zookeeper import ZooKeeperMetadataStore
from broker.namespace.load_manager import LocalLoad
from broker.namespace.lookup import BrokerAddress, LookupResult
from broker.namespace.ownership import OwnershipConfig, OwnershipManager, OwnershipStats
from broker.topic_name import TopicName
from storage import SESSION_TIMEOUT_S, BookieProcessConfig, connect, run_bookie

__all__ = [
    "AutoRecoveryConfig",
    "BookieNetworkConfig",
    "BookieProcessConfig",
    "ClusterConfig",
    "ClusterStats",
    "ClusterStorage",
    "OwnershipConfig",
    "OwnershipStats",
    "run_bookie",
]


@dataclass(frozen=True)
class ClusterConfig:
    metadata_store: str
    """``zk:HOST:PORT[,HOST:PORT...][/chroot]``."""
    network: BookieNetworkConfig = field(default_factory=BookieNetworkConfig)
    autorecovery: AutoRecoveryConfig | None = field(default_factory=AutoRecoveryConfig)
    """None: this broker runs no re-replication worker."""
    session_timeout_s: float = SESSION_TIMEOUT_S
    identifier: str = ""
    ownership: OwnershipConfig | None = None
    """None: no bundle ownership (a lone broker serving every topic, as before brokers shared bookies)."""


@dataclass(frozen=True)
class ClusterStats:
    bookies_available: int
    coordination: CoordinationStats
    autorecovery: AutoRecoveryStats | None
    connections: tuple[BookieConnectionStats, ...]
    """One per bookie this broker has talked to: requests, responses, timeouts, failures."""
    ownership: OwnershipStats | None = None


class ClusterStorage:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._store: ZooKeeperMetadataStore | None = None
        self._coordination: Coordination | None = None
        self._client: RemoteBookieClient | None = None
        self._worker: ReplicationWorker | None = None
        self._ownership: OwnershipManager | None = None
        self._clock: Callable[[], float] = time.time

    def open(self, clock: Callable[[], float] = time.time) -> tuple[MetadataStore, LedgerManager]:
        """Connect; the metadata store and a ledger manager over the registered bookies."""
        self._clock = clock
        zk = connect(self.config.metadata_store, session_timeout_s=self.config.session_timeout_s)
        self._store = ZooKeeperMetadataStore(zk, clock)
        self._coordination = ZooKeeperCoordination(zk, identifier=self.config.identifier)
        self._client = RemoteBookieClient(self._coordination, self.config.network)
        manager = LedgerManager(self._store, self._client, clock, id_generator=self._store.ledger_id_generator())
        if self.config.autorecovery is not None:
            self._worker = ReplicationWorker(self._store, manager, self._coordination, self.config.autorecovery, clock)
            self._worker.start()
        return self._store, manager

    @property
    def coordination(self) -> Coordination:
        assert self._coordination is not None, "cluster storage is not open"
        return self._coordination

    @property
    def worker(self) -> ReplicationWorker | None:
        return self._worker

    # --- ownership ------------------------------------------------------------------------
    def start_serving(self, unload: Callable[[Callable[[TopicName], bool], bool], object],
                      load: Callable[[], tuple[int, float, float]]) -> None:
        """Join the brokers (load report) and start owning bundles. ``unload(contains,
        graceful)`` drops the loaded topics of a bundle that goes away; ``load()`` gives
        (topics, messages/s in, messages/s out) for the load report."""
        if self.config.ownership is None or self._store is None:
            return
        ownership = OwnershipManager(self._store.client, self._store, self.config.ownership, self._clock)
        ownership.on_bundle_lost(lambda bundle, graceful: unload(bundle.contains_topic, graceful))
        ownership.use_load_source(lambda: LocalLoad(*load()))
        ownership.start()
        self._ownership = ownership

    @property
    def ownership(self) -> OwnershipManager | None:
        return self._ownership

    def stop_serving(self) -> None:
        """No new lookups or load reports (before the broker closes its topics)."""
        if self._ownership is not None:
            self._ownership.stop()

    def release_bundles(self) -> None:
        """Give every bundle back and leave the broker list (after the topics are closed)."""
        if self._ownership is not None:
            self._ownership.close()
            self._ownership = None

    def check_served_here(self, name: TopicName) -> None:
        if self._ownership is not None:
            self._ownership.check_served_here(name)

    def owns(self, name: TopicName) -> bool:
        return self._ownership is None or self._ownership.owns(name)

    def owner_of(self, name: TopicName) -> str | None:
        if self._ownership is None:
            return self.config.identifier or None
        owner = self._ownership.owner_of(name)
        return None if owner is None else owner.broker_id

    def lookup(self, name: TopicName) -> LookupResult:
        """Where ``name`` is served (taking its bundle when it is assigned here): the answer of
        every transport's lookup (HTTP 307 and ``/lookup/v2/topic/...``, the binary protocol's
        LOOKUP)."""
        if self._ownership is None:
            address = BrokerAddress(self.config.identifier, f"http://{self.config.identifier}")
            return LookupResult(name.full_name, "", address, True)
        return self._ownership.lookup(name)

    def bookies_available(self) -> int:
        return len(self.coordination.available_bookies())

    def statistics(self) -> ClusterStats:
        connections = () if self._client is None else tuple(c.statistics() for c in self._client.network.connections())
        return ClusterStats(self.bookies_available(), self.coordination.statistics(),
                            None if self._worker is None else self._worker.statistics(), connections,
                            None if self._ownership is None else self._ownership.statistics())

    def close(self) -> None:
        """Stop the worker and the bookie connections, then end the ZooKeeper session (the
        metadata store is closed by its owner first)."""
        self.release_bundles()
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._coordination is not None:
            self._coordination.close()
            self._coordination = None
        if self._store is not None:
            self._store.client.stop()
            self._store.client.close()
            self._store = None
