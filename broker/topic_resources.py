"""Which topics exist: what the metadata store says about topics, loaded or not.

Role: Pulsar's ``TopicResources`` and ``PartitionedTopicResources``. A topic (or a partition
somebody wrote to) exists when its managed ledger does, at
``/managed-ledgers/{tenant}/{namespace}/persistent/{topic}``; a partitioned topic is its
metadata at ``/admin/partitioned-topics/{tenant}/{namespace}/{domain}/{topic}``
(``{"partitions": n}``; the domain ``persistent`` or ``non-persistent``). The topic registry
(``broker/topic_registry.py``) loads topics over this; the namespace service
(``broker/namespace/service.py``) asks it whether a namespace still holds topics and whether a
topic exists before storing its policies.

Invariants: every partition count goes through :meth:`write_partitions` or
:meth:`delete_partitions`, which drop the cached count, so :meth:`partitions` (asked on every
publish) answers from memory and is never stale on this broker; at most
``PARTITION_COUNTS_CACHED_MAX`` counts are cached.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from broker.limits import PARTITION_COUNTS_CACHED_MAX
from broker.managed_ledger import ML_ROOT
from broker.metadata.store import MetadataStore
from broker.topic_name import TopicName, check_namespace

PARTITIONED = "/admin/partitioned-topics"


@dataclass(frozen=True)
class TopicResourcesStats:
    partition_counts_cached: int
    """Topics whose partition count (0 for a topic that is not partitioned) is in memory."""


class TopicResources:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._partition_counts: dict[TopicName, int] = {}

    def exists(self, name: TopicName) -> bool:
        """Whether the topic (or partition) ``name`` has a managed ledger."""
        return self._store.exists(f"{ML_ROOT}/{name.managed_ledger_name}")

    def names(self, namespace: str) -> list[str]:
        """The full names of the namespace's topics and written partitions."""
        tenant, ns = check_namespace(namespace)
        return [TopicName(tenant, ns, local).full_name
                for local in self._store.children(f"{ML_ROOT}/{tenant}/{ns}/persistent")]

    def partitioned_names(self, namespace: str, domain: str = "persistent") -> list[str]:
        """The full names of the namespace's partitioned topics of ``domain``."""
        tenant, ns = check_namespace(namespace)
        return [TopicName(tenant, ns, local, domain).full_name
                for local in self._store.children(f"{PARTITIONED}/{tenant}/{ns}/{domain}")]

    def partitions(self, name: TopicName) -> int:
        """Number of partitions of a partitioned topic, 0 if ``name`` is not one (cached: every
        publish routes through here, and every change goes through :meth:`write_partitions`)."""
        base = name.base
        cached = self._partition_counts.get(base)
        if cached is not None:
            return cached
        with self._lock:
            found = self._store.get_json(_partitioned_path(base))
            count = int(found[0]["partitions"]) if found is not None else 0
            if len(self._partition_counts) >= PARTITION_COUNTS_CACHED_MAX:
                self._partition_counts.clear()
            self._partition_counts[base] = count
            return count

    def expand_partitions(self, name: TopicName) -> list[TopicName]:
        """A partitioned topic's partitions; any other name (a partition too) is itself."""
        count = self.partitions(name)
        return [name.partition(i) for i in range(count)] if count and name.partition_index < 0 else [name]

    def write_partitions(self, name: TopicName, partitions: int, version: int | None = None) -> None:
        """Store the partition count (compare-and-set against ``version``: -1, a new topic)."""
        with self._lock:
            self._store.put_json(_partitioned_path(name), {"partitions": partitions}, version)
            self._partition_counts.pop(name.base, None)

    def delete_partitions(self, name: TopicName) -> None:
        with self._lock:
            self._store.delete(_partitioned_path(name))
            self._partition_counts.pop(name.base, None)

    def count_in(self, namespace: str) -> int:
        """Topics in ``namespace`` as ``maxTopicsPerNamespace`` counts them: a partitioned topic
        counts its partitions, any other topic one."""
        partitioned = [TopicName.parse(t) for t in self.partitioned_names(namespace)]
        bases = {t.local_name for t in partitioned}
        plain = sum(1 for t in self.names(namespace) if TopicName.parse(t).base.local_name not in bases)
        return plain + sum(self.partitions(t) for t in partitioned)

    def statistics(self) -> TopicResourcesStats:
        return TopicResourcesStats(len(self._partition_counts))


def _partitioned_path(name: TopicName) -> str:
    return f"{PARTITIONED}/{name.tenant}/{name.namespace}/{name.domain}/{name.local_name}"
