"""Metadata: versioned values at hierarchical paths, and the sessions of a cluster's processes.

Role: every piece of broker state that must survive a restart (tenants, policies, managed
ledgers' ledger lists, cursors, ledger metadata) is written through a ``MetadataStore``, Pulsar's
``metadata-store`` interface. Inside:

- ``store.py``: the interface and its contract (paths, versions, compare-and-set, transactions,
  watches), ``Stat``, the ops and notifications, and ``VersionedStore``, the contract on four
  storage primitives that every backend shares;
- ``rocksdb.py``: ``RocksDBMetadataStore``, the embedded default of ``magnetar standalone``;
- ``memory.py``: ``InMemoryMetadataStore``, its twin for tests and simulations;
- ``zookeeper.py``: ``ZooKeeperMetadataStore``, what a cluster's brokers share (``zk:…``);
- ``coordination.py``: what lives only as long as a process's ZooKeeper session (the bookies
  registered under ``/ledgers/available``, locks between re-replication workers), Pulsar's
  ``coordination-service``.

This package's front door re-exports the interface and the two embedded backends. The last two
modules load kazoo, so only cluster processes import them (``broker/cluster.py``);
``magnetar standalone`` never does.
"""

from broker.metadata.memory import InMemoryMetadataStore
from broker.metadata.rocksdb import RocksDBMetadataStore
from broker.metadata.store import (
    CREATE_ONLY,
    DeleteOp,
    MetadataStore,
    MetadataStoreStats,
    Notification,
    NotificationType,
    Op,
    PutOp,
    Stat,
    Watch,
)

__all__ = [
    "CREATE_ONLY",
    "DeleteOp",
    "InMemoryMetadataStore",
    "MetadataStore",
    "MetadataStoreStats",
    "Notification",
    "NotificationType",
    "Op",
    "PutOp",
    "RocksDBMetadataStore",
    "Stat",
    "Watch",
]
