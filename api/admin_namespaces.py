"""Admin v2, tenants and namespaces: ``/admin/v2/tenants`` and ``/admin/v2/namespaces``.

Role: Pulsar's tenant and namespace administration over ``BrokerService``. Tenants carry
``{adminRoles, allowedClusters}``; a namespace's policies are one document in the metadata
store (``retention_policies``, ``message_ttl_in_seconds``, ``deduplicationEnabled``,
``auth_policies.namespace_auth``, ``replication_clusters``, ``encryption_required``: a ``PUT``
keeps these from its body, as Pulsar's does), changed one key at a time through
``NamespaceService.set_policy`` (compare-and-set, so a concurrent change fails with 409 instead of
being lost). Paths, parameter names and JSON shapes are Pulsar's.

Authorization: listing, creating, updating and deleting tenants needs a superuser (a tenant
admin must not widen its own ``adminRoles``); everything inside a tenant needs an admin of that
tenant. The check runs before any broker call. Names are validated before use (400); policy
values are checked by the broker against their documented bounds (``broker/namespace/policies.py``: 400
with a message stating the bound), so every transport meets the same rule.

Quotas and rate limits, namespace and topic policies too, have their routes in
``api/admin_quotas.py``. The offload policies (``offloadThreshold`` in bytes,
``offloadThresholdInSeconds``, ``offloadDeletionLagMs``: ``PUT``/``GET``/``DELETE``, as Pulsar's)
are here too. Policy changes apply at once to open topics for retention, TTL and offload; ``deduplicationEnabled`` is
read when a topic is loaded, so it applies to topics loaded after the change.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from api.auth import Authorizer, Caller
from api.limits import ROLES_PER_LIST_MAX
from broker import (
    BUNDLES_MAX,
    MESSAGE_TTL_SECONDS_MAX,
    RETENTION_SIZE_MB_MAX,
    RETENTION_TIME_MINUTES_MAX,
    BrokerService,
    InvalidRequest,
    PreconditionFailed,
    check_namespace,
)

CLUSTERS = frozenset({"standalone"})
"""The clusters a tenant may be allowed on: standalone runs one, named as in Pulsar."""


class TenantInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")
    adminRoles: list[StrictStr] = Field(default_factory=list, max_length=ROLES_PER_LIST_MAX)  # noqa: N815
    allowedClusters: list[StrictStr] = Field(default_factory=lambda: ["standalone"],  # noqa: N815
                                             max_length=ROLES_PER_LIST_MAX)


TTL_DESCRIPTION = f"seconds, 0..{MESSAGE_TTL_SECONDS_MAX} (0: none)"


class RetentionPolicies(BaseModel):
    """Pulsar's ``RetentionPolicies``: -1 means unlimited, 0 means keep nothing consumed."""

    model_config = ConfigDict(extra="ignore")
    retentionTimeInMinutes: StrictInt = Field(  # noqa: N815
        description=f"-1 (unlimited) or 0..{RETENTION_TIME_MINUTES_MAX} minutes")
    retentionSizeInMB: StrictInt = Field(  # noqa: N815
        description=f"-1 (unlimited) or 0..{RETENTION_SIZE_MB_MAX} MB")


class BundlesData(BaseModel):
    """Pulsar's ``BundlesData`` at creation: how many equal hash ranges (cluster brokers own them)."""

    model_config = ConfigDict(extra="ignore")
    numBundles: StrictInt = Field(ge=1, le=BUNDLES_MAX)  # noqa: N815


class NamespacePolicies(BaseModel):
    """The subset of Pulsar's ``Policies`` a namespace can be created with (the rest of a body
    ``pulsar-admin`` sends is ignored)."""

    model_config = ConfigDict(extra="ignore")
    bundles: BundlesData | None = None
    retention_policies: RetentionPolicies | None = None
    message_ttl_in_seconds: StrictInt | None = Field(default=None, description=TTL_DESCRIPTION)
    deduplicationEnabled: StrictBool | None = None  # noqa: N815
    auth_policies: dict[str, Any] | None = Field(
        default=None, description="namespace_auth: {role: [produce, consume]} (checked by the broker)")
    replication_clusters: list[StrictStr] | None = Field(default=None, max_length=ROLES_PER_LIST_MAX)
    encryption_required: StrictBool | None = None


def _checked_namespace_policies(policies: NamespacePolicies | None) -> dict[str, Any]:
    given = policies.model_dump(exclude_none=True) if policies is not None else {}
    unknown = sorted(set(given.get("replication_clusters", [])) - CLUSTERS)
    if unknown:
        raise PreconditionFailed(f"clusters {unknown} do not exist; this broker's cluster is 'standalone'")
    return given


def namespace_name(tenant: str, namespace: str) -> str:
    """``tenant/namespace`` after validating both names (``InvalidRequest`` otherwise)."""
    check_namespace(f"{tenant}/{namespace}")
    return f"{tenant}/{namespace}"


def _tenant_name(tenant: str) -> str:
    check_namespace(f"{tenant}/ns")
    return tenant


def _checked_tenant_info(info: TenantInfo) -> dict[str, Any]:
    unknown = sorted(set(info.allowedClusters) - CLUSTERS)
    if unknown:
        raise PreconditionFailed(f"clusters {unknown} do not exist; this broker's cluster is 'standalone'")
    if any(not role for role in info.adminRoles):
        raise InvalidRequest("adminRoles must not contain empty role names")
    return info.model_dump()


def tenants_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter()

    @routes.get("/tenants", summary="List tenants")
    def list_tenants(caller: Caller) -> list[str]:
        authorizer.require_superuser(caller)
        return service.namespaces.tenants()

    @routes.get("/tenants/{tenant}", summary="Get a tenant's admin roles and allowed clusters")
    def get_tenant(tenant: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.namespaces.tenant_info(_tenant_name(tenant))

    @routes.put("/tenants/{tenant}", status_code=204, summary="Create a tenant")
    def create_tenant(tenant: str, caller: Caller, info: Annotated[TenantInfo | None, Body()] = None) -> None:
        authorizer.require_superuser(caller)
        service.namespaces.create_tenant(_tenant_name(tenant), _checked_tenant_info(info or TenantInfo()))

    @routes.post("/tenants/{tenant}", status_code=204, summary="Update a tenant's admin roles and clusters")
    def update_tenant(tenant: str, info: Annotated[TenantInfo, Body()], caller: Caller) -> None:
        authorizer.require_superuser(caller)
        service.namespaces.update_tenant(_tenant_name(tenant), _checked_tenant_info(info))

    @routes.delete("/tenants/{tenant}", status_code=204, summary="Delete a tenant without namespaces")
    def delete_tenant(tenant: str, caller: Caller) -> None:
        authorizer.require_superuser(caller)
        service.namespaces.delete_tenant(_tenant_name(tenant))

    return routes


def namespaces_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(prefix="/namespaces")

    @routes.get("/{tenant}", summary="List a tenant's namespaces")
    def list_namespaces(tenant: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.namespaces.namespaces(_tenant_name(tenant))

    @routes.put("/{tenant}/{namespace}", status_code=204, summary="Create a namespace")
    def create_namespace(tenant: str, namespace: str, caller: Caller,
                         policies: Annotated[NamespacePolicies | None, Body()] = None) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.create_namespace(namespace_name(tenant, namespace), _checked_namespace_policies(policies))

    @routes.get("/{tenant}/{namespace}", summary="Get a namespace's policies")
    def get_policies(tenant: str, namespace: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.namespaces.policies(namespace_name(tenant, namespace))

    @routes.delete("/{tenant}/{namespace}", status_code=204, summary="Delete a namespace without topics")
    def delete_namespace(tenant: str, namespace: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.delete_namespace(namespace_name(tenant, namespace))

    _retention_routes(routes, service, authorizer)
    _ttl_and_dedup_routes(routes, service, authorizer)
    _offload_routes(routes, service, authorizer)
    _permission_routes(routes, service, authorizer)
    return routes


def _retention_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/retention",
                summary="Get the retention policy (the broker's default when the namespace has none)")
    def get_retention(tenant: str, namespace: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        retention: dict[str, Any] = service.namespaces.policies(namespace_name(tenant, namespace)).get(
            "retention_policies") or service.namespaces.default_retention()
        return retention

    @routes.post("/{tenant}/{namespace}/retention", status_code=204, summary="Set the retention policy")
    def set_retention(tenant: str, namespace: str, retention: Annotated[RetentionPolicies, Body()],
                      caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), "retention_policies", retention.model_dump())

    @routes.delete("/{tenant}/{namespace}/retention", status_code=204,
                   summary="Remove the retention policy (the broker's default applies again)")
    def remove_retention(tenant: str, namespace: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), "retention_policies", None)


def _ttl_and_dedup_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/messageTTL", summary="Get the message TTL in seconds (null: none)")
    def get_ttl(tenant: str, namespace: str, caller: Caller) -> int | None:
        authorizer.require_tenant_admin(caller, tenant)
        ttl: int | None = service.namespaces.policies(namespace_name(tenant, namespace)).get("message_ttl_in_seconds")
        return ttl

    @routes.post("/{tenant}/{namespace}/messageTTL", status_code=204, summary="Set the message TTL in seconds")
    def set_ttl(tenant: str, namespace: str, ttl_s: Annotated[StrictInt, Body(description=TTL_DESCRIPTION)],
                caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), "message_ttl_in_seconds", ttl_s)

    @routes.delete("/{tenant}/{namespace}/messageTTL", status_code=204, summary="Remove the message TTL")
    def remove_ttl(tenant: str, namespace: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), "message_ttl_in_seconds", None)

    @routes.get("/{tenant}/{namespace}/deduplication",
                summary="Get whether producer deduplication is on (null: the broker default)")
    def get_dedup(tenant: str, namespace: str, caller: Caller) -> bool | None:
        authorizer.require_tenant_admin(caller, tenant)
        policies = service.namespaces.policies(namespace_name(tenant, namespace))
        enabled: bool | None = policies.get("deduplicationEnabled")
        return enabled

    @routes.post("/{tenant}/{namespace}/deduplication", status_code=204,
                 summary="Turn producer deduplication on or off (for topics loaded from now on)")
    def set_dedup(tenant: str, namespace: str, enabled: Annotated[StrictBool, Body()], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), "deduplicationEnabled", enabled)

    @routes.delete("/{tenant}/{namespace}/deduplication", status_code=204,
                   summary="Use the broker's deduplication default")
    def remove_dedup(tenant: str, namespace: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), "deduplicationEnabled", None)

    @routes.get("/{tenant}/{namespace}/encryptionRequired",
                summary="Whether the namespace takes only end-to-end encrypted messages")
    def get_encryption_required(tenant: str, namespace: str, caller: Caller) -> bool:
        authorizer.require_tenant_admin(caller, tenant)
        return bool(service.namespaces.policies(namespace_name(tenant, namespace)).get("encryption_required"))

    @routes.post("/{tenant}/{namespace}/encryptionRequired", status_code=204,
                 summary="Take only end-to-end encrypted messages, or any (producers opened from now on)")
    def set_encryption_required(tenant: str, namespace: str, required: Annotated[StrictBool, Body()],
                                caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), "encryption_required", required)


def _permission_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    def auth_policies(namespace: str) -> dict[str, Any]:
        policies: dict[str, Any] = service.namespaces.policies(namespace).get("auth_policies") or {}
        return policies

    @routes.get("/{tenant}/{namespace}/permissions", summary="Get the roles' granted actions")
    def get_permissions(tenant: str, namespace: str, caller: Caller) -> dict[str, list[str]]:
        authorizer.require_tenant_admin(caller, tenant)
        grants: dict[str, list[str]] = auth_policies(namespace_name(tenant, namespace)).get("namespace_auth", {})
        return grants

    @routes.post("/{tenant}/{namespace}/permissions/{role}", status_code=204,
                 summary="Grant a role actions (produce, consume) on the namespace")
    def grant(tenant: str, namespace: str, role: str, actions: Annotated[list[StrictStr], Body(max_length=8)],
              caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name = namespace_name(tenant, namespace)
        policies = auth_policies(name)
        grants = dict(policies.get("namespace_auth", {}))
        grants[role] = actions
        service.namespaces.set_policy(name, "auth_policies", {**policies, "namespace_auth": grants})

    @routes.delete("/{tenant}/{namespace}/permissions/{role}", status_code=204,
                   summary="Revoke every action of a role on the namespace")
    def revoke(tenant: str, namespace: str, role: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name = namespace_name(tenant, namespace)
        policies = auth_policies(name)
        grants = {r: a for r, a in policies.get("namespace_auth", {}).items() if r != role}
        service.namespaces.set_policy(name, "auth_policies", {**policies, "namespace_auth": grants})


OFFLOAD_POLICIES = (("offloadThreshold", "offload_threshold", "bytes kept on the bookies; -1 off, 0 all"),
                    ("offloadThresholdInSeconds", "offload_threshold_in_seconds", "seconds; -1 off"),
                    ("offloadDeletionLagMs", "offload_deletion_lag_ms", "milliseconds"))
"""Pulsar's namespace offload routes: path, policy key, what the value counts."""


def _offload_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    for path, key, unit in OFFLOAD_POLICIES:
        _offload_policy_routes(routes, service, authorizer, path, key, unit)


def _offload_policy_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer, path: str, key: str,
                           unit: str) -> None:
    @routes.get(f"/{{tenant}}/{{namespace}}/{path}", summary=f"Get {path} ({unit}; null: the broker's)")
    def get_policy(tenant: str, namespace: str, caller: Caller) -> int | None:
        authorizer.require_tenant_admin(caller, tenant)
        value: int | None = service.namespaces.policies(namespace_name(tenant, namespace)).get(key)
        return value

    @routes.put(f"/{{tenant}}/{{namespace}}/{path}", status_code=204, summary=f"Set {path} ({unit})")
    def set_policy(tenant: str, namespace: str, value: Annotated[StrictInt, Body()], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), key, value)

    @routes.delete(f"/{{tenant}}/{{namespace}}/{path}", status_code=204,
                   summary=f"Remove {path} (the broker's setting applies again)")
    def remove_policy(tenant: str, namespace: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_policy(namespace_name(tenant, namespace), key, None)

    get_policy.__name__, set_policy.__name__, remove_policy.__name__ = f"get_{key}", f"set_{key}", f"remove_{key}"
