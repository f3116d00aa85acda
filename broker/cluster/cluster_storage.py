"""What a cluster broker stands on: ZooKeeper for metadata and membership, remote bookies for data.

Role: ``magnetar broker --metadata-store zk:…`` builds its ``BrokerService`` with a
``ClusterStorage``. Where ``magnetar standalone`` opens an embedded bookie and a RocksDB
metadata store, this opens one kazoo session (shared by the ZooKeeper metadata store, the
coordination recipes and the ledger id counter), a ``RemoteBookieClient`` over the bookies
registered there, and the re-replication worker. The broker itself holds no data: everything
it knows is in ZooKeeper and on the bookies, which is what lets more brokers share them.

Invariant: closed in the reverse order of opening; after :meth:`close` no thread of it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.cluster.autorecovery import AutoRecoveryConfig, AutoRecoveryStats, ReplicationWorker
from broker.cluster.bookie_network import BookieConnectionStats, BookieNetworkConfig
from broker.cluster.coordination import Coordination, CoordinationStats, ZooKeeperCoordination
from broker.cluster.remote_bookie import RemoteBookieClient
from broker.cluster.zk_metadata import ZooKeeperMetadataStore, connect
from broker.ledger import LedgerManager
from broker.metadata import MetadataStore


@dataclass(frozen=True)
class ClusterConfig:
    metadata_store: str
    """``zk:HOST:PORT[,HOST:PORT...][/chroot]``."""
    network: BookieNetworkConfig = field(default_factory=BookieNetworkConfig)
    autorecovery: AutoRecoveryConfig | None = field(default_factory=AutoRecoveryConfig)
    """None: this broker runs no re-replication worker."""
    session_timeout_s: float = 10.0
    identifier: str = ""


@dataclass(frozen=True)
class ClusterStats:
    bookies_available: int
    coordination: CoordinationStats
    autorecovery: AutoRecoveryStats | None
    connections: tuple[BookieConnectionStats, ...]
    """One per bookie this broker has talked to: requests, responses, timeouts, failures."""


class ClusterStorage:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._store: ZooKeeperMetadataStore | None = None
        self._coordination: Coordination | None = None
        self._client: RemoteBookieClient | None = None
        self._worker: ReplicationWorker | None = None

    def open(self, clock: Callable[[], float] = time.time) -> tuple[MetadataStore, LedgerManager]:
        """Connect; the metadata store and a ledger manager over the registered bookies."""
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

    def bookies_available(self) -> int:
        return len(self.coordination.available_bookies())

    def statistics(self) -> ClusterStats:
        connections = () if self._client is None else tuple(c.statistics() for c in self._client.network.connections())
        return ClusterStats(self.bookies_available(), self.coordination.statistics(),
                            None if self._worker is None else self._worker.statistics(), connections)

    def close(self) -> None:
        """Stop the worker and the bookie connections, then end the ZooKeeper session (the
        metadata store is closed by its owner first)."""
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
