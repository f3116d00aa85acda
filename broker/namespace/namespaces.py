"""Tenants and namespace policies, kept in the metadata store.

Role: the administrative state above topics. Tenants live at ``/admin/tenants/{tenant}``
(``adminRoles``, ``allowedClusters``), namespace policies at ``/admin/policies/{tenant}/{ns}``
(retention, message TTL, deduplication, permissions, quotas and rate limits), both as JSON written with
compare-and-set. ``NamespaceService`` (``broker/namespace/service.py``) exposes these operations
on the broker's face; topics read their namespace's policies when they open and follow changes
at once.

The tenant and namespace the broker makes at start (``public``, ``public/default``, as Pulsar's
standalone does) are *unclaimed* until an administrator writes them: a marker node
(``/admin/unclaimed-tenants/{tenant}``, ``/admin/unclaimed-policies/{tenant}/{ns}``) says so. A
``PUT`` that creates an unclaimed one succeeds and replaces it with what its body asks (Pulsar's
standalone with authentication on makes none, and the setups written for it create them
themselves); any change claims it. A claimed or administrator-made one is ``AlreadyExists``.

Invariants: every name is checked by ``broker/topic_name.py`` before it reaches a metadata path,
every policy value by ``broker/namespace/policies.py`` (its bound, or 400) before it is stored; a change
is written whole (compare-and-set) and then announced (``on_change``: open topics follow new
retention, TTL, quotas and rates, open sessions re-check their permissions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.errors import AlreadyExists, NotEmpty, NotFound
from broker.metadata.store import MetadataStore
from broker.namespace.policies import checked_policies, checked_policy
from broker.topic_name import check_name, check_namespace

TENANTS = "/admin/tenants"
POLICIES = "/admin/policies"
CLUSTERS = "/admin/clusters"
UNCLAIMED_TENANTS = "/admin/unclaimed-tenants"
UNCLAIMED_POLICIES = "/admin/unclaimed-policies"


def tenant_missing(tenant: str) -> NotFound:
    """The refusal of a tenant that does not exist, saying how to create it."""
    return NotFound(f"tenant {tenant} does not exist; create it first (admin v2: PUT /admin/v2/tenants/{tenant}; "
                    f"CLI: magnetar admin tenants create {tenant})")


def namespace_missing(namespace: str) -> NotFound:
    """The refusal of a namespace that does not exist, saying how to create it."""
    return NotFound(f"namespace {namespace} does not exist; create it first (admin v2: PUT "
                    f"/admin/v2/namespaces/{namespace}; CLI: magnetar admin namespaces create {namespace})")


def default_policies() -> dict[str, Any]:
    """A new namespace's policies: no retention policy of its own (the broker's default
    retention applies, ``BrokerConfig.default_retention_*``), no TTL, the broker's dedup."""
    return {"retention_policies": None,
            "message_ttl_in_seconds": 0, "deduplicationEnabled": None, "auth_policies": {}}


class Namespaces:
    def __init__(self, store: MetadataStore, on_change: Callable[[str | None], None]) -> None:
        """``on_change(namespace)`` runs after a namespace's policies changed (None: a tenant's)."""
        self._store = store
        self._changed = on_change

    def _claim(self, marker: str) -> bool:
        """Whether ``marker`` said its node was the broker's own, unclaimed; it no longer does."""
        if not self._store.exists(marker):
            return False
        try:
            self._store.delete(marker)
        except NotFound:  # claimed meanwhile
            return False
        return True

    # --- clusters ------------------------------------------------------------------------
    def cluster_data(self, cluster: str) -> dict[str, Any] | None:
        """What an administrator stored of ``cluster`` (its service URLs); None: nothing yet."""
        found = self._store.get_json(f"{CLUSTERS}/{check_name('cluster', cluster)}")
        return None if found is None else found[0]

    def put_cluster_data(self, cluster: str, data: dict[str, Any], *, create: bool) -> None:
        """Store ``cluster``'s data: ``create`` only when none is stored (else ``AlreadyExists``)."""
        path = f"{CLUSTERS}/{check_name('cluster', cluster)}"
        found = self._store.get_json(path)
        if create and found is not None:
            raise AlreadyExists(f"cluster {cluster} already exists")
        self._store.put_json(path, data, -1 if found is None else found[1])

    # --- tenants -------------------------------------------------------------------------
    def create_tenant(self, tenant: str, info: dict[str, Any], *, unclaimed: bool = False) -> None:
        """A new tenant (``unclaimed``: the broker's own, which the first ``create_tenant`` replaces)."""
        check_name("tenant", tenant)
        body = {"adminRoles": list(info.get("adminRoles", [])),
                "allowedClusters": list(info.get("allowedClusters", ["standalone"]))}
        found = self._store.get_json(f"{TENANTS}/{tenant}")
        if found is not None and not self._claim(f"{UNCLAIMED_TENANTS}/{tenant}"):
            raise AlreadyExists(f"tenant {tenant} already exists")
        self._store.put_json(f"{TENANTS}/{tenant}", body, -1 if found is None else found[1])
        if unclaimed:
            self._store.put_json(f"{UNCLAIMED_TENANTS}/{tenant}", {})
        if found is not None:
            self._changed(None)

    def tenants(self) -> list[str]:
        return self._store.children(TENANTS)

    def tenant_info(self, tenant: str) -> dict[str, Any]:
        found = self._store.get_json(f"{TENANTS}/{check_name('tenant', tenant)}")
        if found is None:
            raise tenant_missing(tenant)
        return found[0]

    def delete_tenant(self, tenant: str) -> None:
        self.tenant_info(tenant)
        if self._store.children(f"{POLICIES}/{tenant}"):
            raise NotEmpty(f"tenant {tenant} still has namespaces")
        self._store.delete(f"{TENANTS}/{tenant}")
        self._claim(f"{UNCLAIMED_TENANTS}/{tenant}")
        self._changed(None)

    def update_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        """Replace the tenant's ``adminRoles`` and ``allowedClusters`` (compare-and-set)."""
        found = self._store.get_json(f"{TENANTS}/{check_name('tenant', tenant)}")
        if found is None:
            raise tenant_missing(tenant)
        current, version = found
        self._claim(f"{UNCLAIMED_TENANTS}/{tenant}")
        body = {"adminRoles": list(info.get("adminRoles", current.get("adminRoles", []))),
                "allowedClusters": list(info.get("allowedClusters", current.get("allowedClusters", ["standalone"])))}
        self._store.put_json(f"{TENANTS}/{tenant}", body, version)
        self._changed(None)

    # --- namespaces ----------------------------------------------------------------------
    def create_namespace(self, namespace: str, policies: dict[str, Any] | None = None, *,
                         unclaimed: bool = False) -> None:
        """A new namespace with ``policies`` (``unclaimed``: the broker's own, which the first
        ``create_namespace`` replaces)."""
        tenant, _ = check_namespace(namespace)
        self.tenant_info(tenant)
        given = checked_policies(policies or {})
        found = self._store.get_json(f"{POLICIES}/{namespace}")
        if found is not None and not self._claim(f"{UNCLAIMED_POLICIES}/{namespace}"):
            raise AlreadyExists(f"namespace {namespace} already exists")
        self._store.put_json(f"{POLICIES}/{namespace}", {**default_policies(), **given},
                             -1 if found is None else found[1])
        if unclaimed:
            self._store.put_json(f"{UNCLAIMED_POLICIES}/{namespace}", {})
        if found is not None:
            self._changed(namespace)

    def namespaces(self, tenant: str) -> list[str]:
        self.tenant_info(tenant)
        return [f"{tenant}/{ns}" for ns in self._store.children(f"{POLICIES}/{tenant}")]

    def policies(self, namespace: str) -> dict[str, Any]:
        check_namespace(namespace)
        found = self._store.get_json(f"{POLICIES}/{namespace}")
        if found is None:
            raise namespace_missing(namespace)
        return found[0]

    def set_policy(self, namespace: str, key: str, value: Any) -> None:
        check_namespace(namespace)
        value = checked_policy(key, value)
        found = self._store.get_json(f"{POLICIES}/{namespace}")
        if found is None:
            raise namespace_missing(namespace)
        policies, version = found
        policies[key] = value
        self._claim(f"{UNCLAIMED_POLICIES}/{namespace}")
        self._store.put_json(f"{POLICIES}/{namespace}", policies, version)
        self._changed(namespace)

    def delete_namespace(self, namespace: str, has_topics: Callable[[str], bool]) -> None:
        self.policies(namespace)
        if has_topics(namespace):
            raise NotEmpty(f"namespace {namespace} still has topics")
        self._store.delete(f"{POLICIES}/{namespace}")
        self._claim(f"{UNCLAIMED_POLICIES}/{namespace}")
        self._changed(namespace)
