"""Topic lookup, brokers and namespace bundles: where topics are served in a cluster.

Role: Pulsar's lookup REST endpoint and the bundle administration over the broker's face:

- ``GET /lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}`` (and ``…/non-persistent/…``):
  the broker serving the topic
  (``brokerUrl`` for the binary protocol, ``httpUrl``, ``nativeUrl``; Magnetar adds
  ``brokerId`` and ``bundle``). The first lookup of a topic assigns its bundle to the
  least-loaded live broker. A standalone broker answers with the address it was reached at.
  ``?listenerName=`` (or the ``X-Pulsar-ListenerName`` header) names an advertised listener:
  the answer is that listener's URLs; 503 ("the broker do not have NAME listener") when the
  broker answered has none of that name (``api/pulsar/listeners.py``).
- ``GET /admin/v2/brokers`` and ``/admin/v2/brokers/{cluster}``: the live brokers' ids (a
  standalone broker lists itself, as the ``host:port`` its web service was reached at, as
  Pulsar's standalone does); ``GET /admin/v2/broker-stats/load-reports``: their load reports.
- ``GET /admin/v2/bookies/all``: the bookies (Pulsar's ``BookiesClusterInfo``,
  ``{"bookies": [{"bookieId"}]}``): in a cluster the bookies registered in ZooKeeper; a
  standalone broker's one bookie is embedded and has no address, so it is listed as
  ``embedded``.
- ``GET /admin/v2/namespaces/{tenant}/{ns}/bundles``: the boundaries; ``.../bundles/owners``:
  each bundle's owner (a Magnetar extension).
- ``PUT /admin/v2/namespaces/{tenant}/{ns}/{bundle}/unload[?destinationBroker=]`` and
  ``PUT .../{bundle}/split``: carried out by the bundle's owner (another broker answers 307 to
  it, as for topic calls).

Authorization: a lookup needs the produce or consume permission on the topic (as Pulsar's);
listing brokers, bookies and load reports needs a superuser; bundle calls need the tenant's admin.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from api.admin_namespaces import namespace_name
from api.auth import Authorizer, Caller
from api.limits import BROKER_ID_CHARS_MAX, LISTENER_NAME_CHARS_MAX
from api.pulsar.listeners import named_listener
from api.rest_lookup import local_urls
from broker import BrokerService, TopicName

LISTENER_NAME_HEADER = "X-Pulsar-ListenerName"
"""The header naming an advertised listener when the ``listenerName`` parameter does not (Pulsar's)."""


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(tags=["cluster"])

    @routes.get("/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}",
                summary="The broker serving a topic (assigns its bundle on first lookup)")
    def lookup(tenant: str, namespace: str, topic: str, caller: Caller, request: Request,
               listener_name: Annotated[str, Query(alias="listenerName",
                                                   max_length=LISTENER_NAME_CHARS_MAX)] = "") -> dict[str, Any]:
        return _lookup(TopicName.of(tenant, namespace, topic), caller, request, listener_name)

    @routes.get("/lookup/v2/topic/non-persistent/{tenant}/{namespace}/{topic}",
                summary="The broker serving a non-persistent topic (assigns its bundle on first lookup)")
    def lookup_non_persistent(tenant: str, namespace: str, topic: str, caller: Caller, request: Request,
                              listener_name: Annotated[str, Query(alias="listenerName",
                                                                  max_length=LISTENER_NAME_CHARS_MAX)] = ""
                              ) -> dict[str, Any]:
        return _lookup(TopicName.of(tenant, namespace, topic, "non-persistent"), caller, request, listener_name)

    def _lookup(name: TopicName, caller: Caller, request: Request, listener_name: str) -> dict[str, Any]:
        authorizer.require_lookup(caller, name)
        listener = listener_name or request.headers.get(LISTENER_NAME_HEADER, "")[:LISTENER_NAME_CHARS_MAX]
        found = service.namespaces.lookup(name)
        if found.local:  # this broker's own listeners, as the host the request came to sees them
            return {**local_urls(request, listener), "brokerId": found.owner.broker_id, "bundle": found.bundle}
        http_url = found.owner.web_service_url or str(request.base_url).rstrip("/")
        named = named_listener(found.owner, listener) if listener else None
        plain = named.service_url if named else found.owner.pulsar_service_url
        secure = named.service_url_tls if named else found.owner.pulsar_service_url_tls
        return {"brokerUrl": plain, "brokerUrlTls": secure, "httpUrl": http_url,
                "httpUrlTls": http_url if http_url.startswith("https:") else None,
                "nativeUrl": plain, "brokerId": found.owner.broker_id, "bundle": found.bundle}

    @routes.get("/admin/v2/brokers", summary="The live brokers of the cluster")
    def brokers(caller: Caller, request: Request) -> list[str]:
        authorizer.require_superuser(caller)
        if service.cluster is None:
            return [request.url.netloc]
        return [str(report["brokerId"]) for report in service.namespaces.brokers()]

    @routes.get("/admin/v2/brokers/{cluster}", summary="The live brokers of a cluster (Pulsar's path)")
    def brokers_of_cluster(cluster: str, caller: Caller, request: Request) -> list[str]:
        return brokers(caller, request)

    @routes.get("/admin/v2/bookies/all", summary="The bookies of the cluster (embedded: standalone's own)")
    def bookies(caller: Caller) -> dict[str, list[dict[str, str]]]:
        authorizer.require_superuser(caller)
        ids = ["embedded"] if service.cluster is None else sorted(service.cluster.coordination.available_bookies())
        return {"bookies": [{"bookieId": bookie_id} for bookie_id in ids]}

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
