"""The namespace service: tenants, namespaces and their policies, and which broker serves what.

Role: ``BrokerService.namespaces``. Pulsar's ``NamespaceService`` (lookup, bundle ownership,
load reports) with the administration behind it (tenants and namespace policies,
``broker/namespace/namespaces.py``; a topic's own policies, ``topic_policies.py``; the
``persistence`` policy, ``persistence.py``). On a cluster broker the ownership questions go to
the cluster's ``OwnershipManager`` (``ownership.py``, reached through ``broker/cluster.py``,
which only cluster processes load); a standalone broker serves every topic itself.

Every change of tenants or policies is announced twice, in this order: to the followers (the
topic registry: open topics take their namespace's new retention, TTL, quotas and rates at
once) and then to the listeners (transports: open sessions re-check their permissions). A
listener's failure is logged and never undoes the change. On a cluster broker a namespace's
policies written by another broker are announced the same way (a watch of ``/admin/policies``
in ZooKeeper), so a policy applies wherever its topics are served, whichever broker was asked.

Invariants: a namespace with topics or partitioned topics is not deleted (``NotEmpty``); a
topic's policies are stored only for a topic that exists; a ``persistence`` policy the
available bookies cannot serve is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.errors import NotAllowed, NotFound
from broker.metadata.store import MetadataStore, Notification
from broker.namespace.lookup import BrokerAddress, LookupResult
from broker.namespace.namespaces import POLICIES, Namespaces
from broker.namespace.persistence import POLICY_KEY as PERSISTENCE_POLICY_KEY
from broker.namespace.persistence import PersistencePolicy, validated
from broker.namespace.topic_policies import TopicPolicies
from broker.topic_name import TopicName
from broker.topic_resources import TopicResources

if TYPE_CHECKING:  # a cluster broker's storage pulls in kazoo; the embedded broker never loads it
    from broker.cluster import ClusterStorage
    from broker.namespace.ownership import OwnershipManager

log = logging.getLogger(__name__)


class NamespaceService:
    def __init__(self, store: MetadataStore, resources: TopicResources, *, cluster: ClusterStorage | None = None,
                 default_retention_time_minutes: int = -1, default_retention_size_mb: int = -1,
                 listeners: list[Callable[[], None]] | None = None) -> None:
        """``listeners``: called after every change (the list may grow after this is built)."""
        self._resources = resources
        self._cluster = cluster
        self._default_retention = {"retentionTimeInMinutes": default_retention_time_minutes,
                                   "retentionSizeInMB": default_retention_size_mb}
        self._listeners = listeners if listeners is not None else []
        self._namespace_followers: list[Callable[[str], None]] = []
        self._topic_followers: list[Callable[[TopicName], None]] = []
        self._namespaces = Namespaces(store, self._namespace_changed)
        self._topic_policies = TopicPolicies(store, self._topic_policy_changed)
        if cluster is not None:  # policies set through another broker apply to the topics open here too
            store.watch(POLICIES, self._policies_changed_elsewhere)

    def follow(self, namespace_changed: Callable[[str], None],
               topic_policy_changed: Callable[[TopicName], None]) -> None:
        """Call these first after a namespace's (or a topic's own) policies changed."""
        self._namespace_followers.append(namespace_changed)
        self._topic_followers.append(topic_policy_changed)

    def _namespace_changed(self, namespace: str | None) -> None:
        if namespace is not None:
            for follower in list(self._namespace_followers):
                follower(namespace)
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("a policy listener failed")

    def _policies_changed_elsewhere(self, notification: Notification) -> None:
        """Another broker wrote a namespace's policies (``/admin/policies/{tenant}/{ns}``): it
        announced the change to its own topics only, so it is announced here as well."""
        parts = notification.path[len(POLICIES) + 1:].split("/")
        if len(parts) == 2:
            self._namespace_changed("/".join(parts))

    def _topic_policy_changed(self, base: TopicName) -> None:
        for follower in list(self._topic_followers):
            follower(base)

    # --- tenants and namespaces ------------------------------------------------------------
    def create_default_namespace(self) -> None:
        """``public/default`` (and its tenant) when missing, as Pulsar's standalone creates it;
        unclaimed, so an administrator's ``PUT`` of either replaces it (``namespaces.py``)."""
        if "public" not in self.tenants():
            self._namespaces.create_tenant("public", {}, unclaimed=True)
        if "public/default" not in self.namespaces("public"):
            self._namespaces.create_namespace("public/default", unclaimed=True)

    def cluster_data(self, cluster: str) -> dict[str, Any] | None:
        return self._namespaces.cluster_data(cluster)

    def put_cluster_data(self, cluster: str, data: dict[str, Any], *, create: bool) -> None:
        self._namespaces.put_cluster_data(cluster, data, create=create)

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
        """The tenant's namespaces as ``tenant/namespace``."""
        return self._namespaces.namespaces(tenant)

    def delete_namespace(self, namespace: str) -> None:
        resources = self._resources
        self._namespaces.delete_namespace(
            namespace, lambda ns: bool(resources.names(ns) or resources.partitioned_names(ns)))

    # --- policies --------------------------------------------------------------------------
    def policies(self, namespace: str) -> dict[str, Any]:
        """The namespace's policies (``NotFound`` for an unknown namespace)."""
        return self._namespaces.policies(namespace)

    def set_policy(self, namespace: str, key: str, value: Any) -> None:
        self._namespaces.set_policy(namespace, key, value)

    def default_retention(self) -> dict[str, int]:
        """The retention of a namespace without a policy of its own, in Pulsar's policy shape."""
        return dict(self._default_retention)

    def persistence(self, namespace: str) -> PersistencePolicy | None:
        """The namespace's persistence policy; None while it uses the broker's default quorums."""
        stored = self.policies(namespace).get(PERSISTENCE_POLICY_KEY)
        return PersistencePolicy.from_json(stored) if stored else None

    def set_persistence(self, namespace: str, policy: PersistencePolicy | None) -> None:
        """Set (None: remove) the quorums of the namespace's next ledgers; a policy the bookies
        available cannot serve is refused (``InvalidRequest``)."""
        value = None if policy is None else validated(policy, self.bookies_available()).to_json()
        self.set_policy(namespace, PERSISTENCE_POLICY_KEY, value)

    def topic_policies(self, name: TopicName) -> dict[str, Any]:
        """The topic's own policies ({} when it sets none; a partition's are its topic's)."""
        return self._topic_policies.policies(name)

    def set_topic_policy(self, name: TopicName, key: str, value: Any) -> None:
        """Set (None: remove) one of the topic's policies; ``NotFound`` for a missing topic."""
        if not self._resources.exists(name) and not self._resources.partitions(name.base):
            raise NotFound(f"topic {name} does not exist")
        self._topic_policies.set_policy(name, key, value)

    def delete_topic_policies(self, name: TopicName) -> None:
        """Forget the topic's own policies (the topic was deleted)."""
        self._topic_policies.delete(name)

    # --- who serves what (cluster brokers) ------------------------------------------------------
    @property
    def clustered(self) -> bool:
        """Whether this is a cluster broker: topics may be served by others, and a lookup may
        need ZooKeeper (transports then look up off their event loops)."""
        return self._cluster is not None

    def bookies_available(self) -> int:
        """Bookies new ledgers can use: the registered ones in a cluster, else the embedded one."""
        return 1 if self._cluster is None else self._cluster.bookies_available()

    def lookup(self, name: TopicName) -> LookupResult:
        """Where ``name`` is served, taking its bundle when it is assigned to this broker (the
        answer of every transport's lookup). Standalone: here, with empty addresses."""
        if self._cluster is None:
            return LookupResult(name.full_name, "", BrokerAddress("", ""), True)
        return self._cluster.lookup(name)

    def check_served_here(self, name: TopicName) -> None:
        """Return when this broker serves ``name`` (always, standalone), taking its bundle when
        it is assigned here; else ``TopicNotOwned`` naming the owner, or ``ServiceUnitNotReady``
        while the bundle is between owners. Transports ask before anything a non-owner must not
        do (register a producer's schema, open a consumer)."""
        if self._cluster is not None:
            self._cluster.check_served_here(name)

    def owns(self, name: TopicName) -> bool:
        """Whether this broker owns the bundle of ``name`` now (always, standalone)."""
        return self._cluster is None or self._cluster.owns(name)

    def owner_of(self, name: TopicName) -> str | None:
        """The broker id serving ``name`` (None: standalone, or not served by any broker now)."""
        return None if self._cluster is None else self._cluster.owner_of(name)

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
        return None if self._cluster is None else self._cluster.ownership

    def _required_ownership(self) -> OwnershipManager:
        ownership = self._ownership()
        if ownership is None:
            raise NotAllowed("bundles are owned by brokers only in a cluster (magnetar broker)")
        return ownership
