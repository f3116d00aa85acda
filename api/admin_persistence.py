"""Admin v2, a namespace's persistence policy: ``/admin/v2/namespaces/{tenant}/{namespace}/persistence``.

Role: Pulsar's ``PersistencePolicies`` over ``NamespaceService.persistence``: ``GET`` answers the policy (JSON
``null`` when the namespace uses the broker's default), ``POST`` sets it, ``DELETE`` returns to
the default. The broker checks the quorums (``broker/namespace/persistence.py``): ``E >= Qw >= Qa >= 1`` and
no more bookies than are available, else 400. Topics of the namespace create their next ledgers
with the new quorums (the current ledgers keep theirs).

Authorization: tenant administrators, checked before any broker call.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from api.admin_namespaces import namespace_name
from api.auth import Authorizer, Caller
from broker import BrokerService, PersistencePolicy


class PersistencePolicies(BaseModel):
    """Pulsar's ``PersistencePolicies``."""

    model_config = ConfigDict(extra="forbid")
    bookkeeperEnsemble: StrictInt = Field(ge=1)  # noqa: N815
    bookkeeperWriteQuorum: StrictInt = Field(ge=1)  # noqa: N815
    bookkeeperAckQuorum: StrictInt = Field(ge=1)  # noqa: N815
    managedLedgerMaxMarkDeleteRate: StrictFloat | StrictInt = Field(default=0.0, ge=0)  # noqa: N815


def persistence_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(prefix="/namespaces")

    @routes.get("/{tenant}/{namespace}/persistence", summary="Get the persistence policy (null: the default)")
    def get_persistence(tenant: str, namespace: str, caller: Caller) -> dict[str, Any] | None:
        authorizer.require_tenant_admin(caller, tenant)
        policy = service.namespaces.persistence(namespace_name(tenant, namespace))
        return None if policy is None else policy.to_json()

    @routes.post("/{tenant}/{namespace}/persistence", status_code=204,
                 summary="Set the ensemble, write quorum and ack quorum of the namespace's new ledgers")
    def set_persistence(tenant: str, namespace: str, body: Annotated[PersistencePolicies, Body()],
                        caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        policy = PersistencePolicy(body.bookkeeperEnsemble, body.bookkeeperWriteQuorum, body.bookkeeperAckQuorum,
                                   float(body.managedLedgerMaxMarkDeleteRate))
        service.namespaces.set_persistence(namespace_name(tenant, namespace), policy)

    @routes.delete("/{tenant}/{namespace}/persistence", status_code=204,
                   summary="Remove the persistence policy (the broker's default quorums apply)")
    def remove_persistence(tenant: str, namespace: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.set_persistence(namespace_name(tenant, namespace), None)

    return routes
