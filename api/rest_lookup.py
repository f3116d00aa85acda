"""HTTP lookup and clusters: where Pulsar's clients and tools find this broker.

Role: ``GET /lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}`` answers Pulsar's
``LookupData`` (``brokerUrl``, ``brokerUrlTls``, ``httpUrl``, ``nativeUrl``), naming this
broker's binary-protocol listeners as the host the request came to sees them (an HTTP lookup
client, such as an admin tool or a client configured with an ``http://`` service URL, then
connects there). ``/admin/v2/clusters`` lists the one cluster, ``standalone``, and
``/admin/v2/clusters/standalone`` gives its URLs, as Pulsar's standalone does.

Authorization: a lookup needs the right to produce or consume on the topic; clusters are for
superusers, as in Pulsar.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.auth import Action, Authorizer, Caller
from broker import BrokerService, Forbidden, NotFound, TopicName

CLUSTER = "standalone"


def _urls(request: Request, topic: TopicName | None = None) -> dict[str, Any]:
    """This broker's URLs, or with ``topic`` its owner's (the binary front end's ``owner_of``,
    which binary LOOKUP asks too)."""
    host = request.url.hostname or "127.0.0.1"
    http_url = f"{request.url.scheme}://{request.url.netloc}"
    binary = getattr(request.app.state, "pulsar_server", None)
    listener = None if binary is None else binary.listener_for(host) if topic is None else binary.owner_of(topic, host)
    plain = listener.service_url if listener is not None else None
    tls = listener.service_url_tls if listener is not None else None
    return {"brokerUrl": plain, "brokerUrlTls": tls, "httpUrl": http_url, "httpUrlTls": None, "nativeUrl": plain}


def lookup_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter()

    @routes.get("/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}", summary="Which broker serves a topic")
    def lookup(tenant: str, namespace: str, topic: str, request: Request, caller: Caller) -> dict[str, Any]:
        name = TopicName.parse(f"persistent://{tenant}/{namespace}/{topic}")
        try:
            authorizer.require(caller, Action.PRODUCE, name)
        except Forbidden:
            authorizer.require(caller, Action.CONSUME, name)
        service.policies(name.namespace_name)  # NotFound for an unknown namespace
        return _urls(request, name)

    @routes.get("/admin/v2/clusters", summary="The clusters (standalone: one)")
    def clusters(caller: Caller) -> list[str]:
        authorizer.require_superuser(caller)
        return [CLUSTER]

    @routes.get("/admin/v2/clusters/{cluster}", summary="A cluster's service URLs")
    def cluster(cluster: str, request: Request, caller: Caller) -> dict[str, Any]:
        authorizer.require_superuser(caller)
        if cluster != CLUSTER:
            raise NotFound(f"cluster {cluster} does not exist")
        urls = _urls(request)
        return {"serviceUrl": urls["httpUrl"], "serviceUrlTls": None, "brokerServiceUrl": urls["brokerUrl"],
                "brokerServiceUrlTls": urls["brokerUrlTls"]}

    return routes
