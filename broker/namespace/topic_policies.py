"""Topic-level policies, kept in the metadata store: what a topic sets for itself over its namespace.

Role: Pulsar's topic policies (``/admin/v2/persistent/{tenant}/{namespace}/{topic}/maxProducers``
and friends) for the quotas and rate limits of ``broker/quotas.py``: ``maxProducers``,
``maxConsumers``, ``maxSubscriptionsPerTopic``, ``publishRate`` and ``dispatchRate``; and the
``schemaCompatibilityStrategy`` the schema registry checks the topic's new schemas by; and
``offloadPolicies`` (its offload thresholds and deletion lag, ``broker/namespace/policies.py``). One JSON
document per topic at ``/admin/topic-policies/{tenant}/{namespace}/{topic}``, written with
compare-and-set; a partitioned topic's policies are its base name's and apply to every
partition. A value passes the same check as the namespace policy it overrides (400 otherwise);
null removes it, so the namespace's (or the broker's) applies again.

Invariants: a key not in ``TOPIC_POLICY_KEYS`` is refused; a change is written whole and then
announced (``on_change``: open partitions of the topic take their new limits at once); deleting
a topic deletes its policies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.errors import InvalidRequest
from broker.metadata.store import MetadataStore
from broker.namespace.policies import checked_offload_policies
from broker.quotas import checked_dispatch_rate, checked_publish_rate, count_limit
from broker.schema_compatibility import checked_strategy
from broker.topic_name import TopicName

TOPIC_POLICIES = "/admin/topic-policies"
TOPIC_POLICY_KEYS: dict[str, Callable[[Any], Any]] = {
    "maxProducers": count_limit("maxProducers"),
    "maxConsumers": count_limit("maxConsumers"),
    "maxSubscriptionsPerTopic": count_limit("maxSubscriptionsPerTopic"),
    "publishRate": checked_publish_rate,
    "dispatchRate": checked_dispatch_rate,
    "schemaCompatibilityStrategy": checked_strategy,
    "offloadPolicies": checked_offload_policies,
}
"""Each topic policy key and the check its values pass."""


class TopicPolicies:
    def __init__(self, store: MetadataStore, on_change: Callable[[TopicName], None]) -> None:
        """``on_change(base topic)`` runs after a topic's policies changed."""
        self._store = store
        self._changed = on_change

    @staticmethod
    def _path(name: TopicName) -> str:
        base = name.base
        return f"{TOPIC_POLICIES}/{base.tenant}/{base.namespace}/{base.local_name}"

    def policies(self, name: TopicName) -> dict[str, Any]:
        """The topic's own policies ({} when it sets none); a partition reads its topic's."""
        found = self._store.get_json(self._path(name))
        return {} if found is None else found[0]

    def set_policy(self, name: TopicName, key: str, value: Any) -> None:
        check = TOPIC_POLICY_KEYS.get(key)
        if check is None:
            raise InvalidRequest(f"unknown topic policy {key!r}; known: {sorted(TOPIC_POLICY_KEYS)}")
        value = check(value)
        path = self._path(name)
        found = self._store.get_json(path)
        policies, version = found if found is not None else ({}, -1)
        if value is None:
            policies.pop(key, None)
        else:
            policies[key] = value
        if policies:
            self._store.put_json(path, policies, version)
        elif found is not None:
            self._store.delete(path, version)
        self._changed(name.base)

    def delete(self, name: TopicName) -> None:
        """Forget the topic's policies (the topic was deleted)."""
        path = self._path(name)
        if self._store.exists(path):
            self._store.delete(path)
