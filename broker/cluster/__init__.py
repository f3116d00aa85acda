"""Beyond one machine: the broker's face for a cluster of bookies and brokers over ZooKeeper.

Role: what ``magnetar bookie`` and ``magnetar broker`` (``api/cli_cluster.py``) build on, and
nothing else of this package: ``ClusterStorage`` (a broker's ZooKeeper session, metadata store,
remote bookies and re-replication worker, handed to ``BrokerService(cluster=…)``), its
configuration, and ``run_bookie``, the bookie process. Inside: ``zk_metadata.py`` (the metadata
store over kazoo), ``coordination.py`` (bookie registration, leases, the ledger id counter, and
their in-memory twin), ``bookie_network.py`` and ``remote_bookie.py`` (the bookie protocol's
client), ``autorecovery.py`` (re-replication of under-replicated ledgers), ``bundles.py`` and
``ownership.py`` (namespace bundles, their ownership by brokers, lookups and load reports),
``cluster_storage.py`` and ``bookie_process.py``.

Invariant: only cluster processes import this package (it loads kazoo); ``magnetar standalone``
never does.
"""

from broker.cluster.autorecovery import AutoRecoveryConfig
from broker.cluster.bookie_network import BookieNetworkConfig
from broker.cluster.bookie_process import BookieProcessConfig, run_bookie
from broker.cluster.cluster_storage import ClusterConfig, ClusterStats, ClusterStorage
from broker.cluster.ownership import OwnershipConfig, OwnershipStats

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
