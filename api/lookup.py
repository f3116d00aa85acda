"""Topic lookup, brokers and namespace bundles: where topics are served in a cluster.

Role: Pulsar's lookup REST endpoint and the bundle administration over the broker's face:

- ``GET /lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}`` (and ``…/non-persistent/…``):
  the broker serving the topic
  (``brokerUrl`` for the binary protocol, ``httpUrl``, ``nativeUrl``; Magnetar adds
  ``brokerId`` and ``bundle``). The first lookup of a topic assigns its bundle to the
  least-loaded live broker. A standalone broker answers with the address it was reached at.
- ``GET /admin/v2/brokers`` and ``/admin/v2/brokers/{cluster}``: the live brokers' ids;
  ``GET /admin/v2/broker-stats/load-reports``: their load reports.
- ``GET /admin/v2/namespaces/{tenant}/{ns}/bundles``: the boundaries; ``.../bundles/owners``:
  each bundle's owner (a Magnetar extension).
- ``PUT /admin/v2/namespaces/{tenant}/{ns}/{bundle}/unload[?destinationBroker=]`` and
  ``PUT .../{bundle}/split``: carried out by the bundle's owner (another broker answers 307 to
  it, as for topic calls).

Authorization: a lookup needs the produce or consume permission on the topic (as Pulsar's);
listing brokers and load reports needs a superuser; bundle calls need the tenant's admin.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from api.admin_namespaces import namespace_name
from api.auth import Authorizer, Caller
from api.limits import BROKER_ID_CHARS_MAX
from api.rest_lookup import local_urls
from broker import BrokerService, TopicName


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(tags=["cluster"])

    @routes.get("/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}",
                summary="The broker serving a topic (assigns its bundle on first lookup)")
    def lookup(tenant: str, namespace: str, topic: str, caller: Caller, request: Request) -> dict[str, Any]:
        return _lookup(TopicName.of(tenant, namespace, topic), caller, request)

    @routes.get("/lookup/v2/topic/non-persistent/{tenant}/{namespace}/{topic}",
                summary="The broker serving a non-persistent topic (assigns its bundle on first lookup)")
    def lookup_non_persistent(tenant: str, namespace: str, topic: str, caller: Caller,
                              request: Request) -> dict[str, Any]:
        return _lookup(TopicName.of(tenant, namespace, topic, "non-persistent"), caller, request)

    def _lookup(name: TopicName, caller: Caller, request: Request) -> dict[str, Any]:
        authorizer.require_lookup(caller, name)
        found = service.namespaces.lookup(name)
        if found.local:  # this broker's own listeners, as the host the request came to sees them
            return {**local_urls(request), "brokerId": found.owner.broker_id, "bundle": found.bundle}
        http_url = found.owner.web_service_url or str(request.base_url).rstrip("/")
        return {"brokerUrl": found.owner.pulsar_service_url, "brokerUrlTls": found.owner.pulsar_service_url_tls,
                "httpUrl": http_url, "httpUrlTls": "", "nativeUrl": found.owner.pulsar_service_url,
                "brokerId": found.owner.broker_id, "bundle": found.bundle}

    @routes.get("/admin/v2/brokers", summary="The live brokers of the cluster")
    def brokers(caller: Caller) -> list[str]:
        authorizer.require_superuser(caller)
        return [str(report["brokerId"]) for report in service.namespaces.brokers()]

    @routes.get("/admin/v2/brokers/{cluster}", summary="The live brokers of a cluster (Pulsar's path)")
    def brokers_of_cluster(cluster: str, caller: Caller) -> list[str]:
        return brokers(caller)

    @routes.get("/admin/v2/broker-stats/load-reports", summary="Every live broker's load report")
    def load_reports(caller: Caller) -> list[dict[str, Any]]:
        authorizer.require_superuser(caller)
        return service.namespaces.brokers()

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/bundles", summary="The namespace's bundle boundaries")
    def bundles(tenant: str, namespace: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.namespaces.bundles(namespace_name(tenant, namespace))

    @routes.get("/admin/v2/namespaces/{tenant}/{namespace}/bundles/owners",
                summary="Each bundle of the namespace and the broker that owns it (null: unowned)")
    def bundle_owners(tenant: str, namespace: str, caller: Caller) -> dict[str, str | None]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.namespaces.bundle_owners(namespace_name(tenant, namespace))

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/unload", status_code=204,
                summary="Stop serving a bundle here; its topics move to another broker")
    def unload(tenant: str, namespace: str, bundle: str, caller: Caller,
               destination: Annotated[str | None, Query(alias="destinationBroker",
                                                        max_length=BROKER_ID_CHARS_MAX)] = None) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.namespaces.unload_bundle(namespace_name(tenant, namespace), bundle, destination)

    @routes.put("/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/split",
                summary="Divide a bundle in two at the middle of its hash range")
    def split(tenant: str, namespace: str, bundle: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return {"bundles": service.namespaces.split_bundle(namespace_name(tenant, namespace), bundle)}

    return routes
