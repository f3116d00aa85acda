"""Clusters, and this broker's own service URLs: where Pulsar's clients and tools find it.

Role: :func:`local_urls` gives Pulsar's ``LookupData`` fields (``brokerUrl``, ``brokerUrlTls``,
``httpUrl``, ``httpUrlTls``, ``nativeUrl``) for this broker, naming its listeners as the host the
request came to sees them (the web URL is the one the request came in by: over HTTPS it is also
``httpUrlTls``); the lookup endpoint (``api/lookup.py``) answers with them for a topic
this broker serves. ``/admin/v2/clusters`` lists the one cluster, ``standalone``, and
``/admin/v2/clusters/standalone`` gives its URLs, as Pulsar's standalone does.

Authorization: clusters are for superusers, as in Pulsar.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.auth import Authorizer, Caller
from broker import BrokerService, NotFound

CLUSTER = "standalone"


def local_urls(request: Request) -> dict[str, Any]:
    """This broker's URLs: its binary-protocol listeners as ``PulsarServer.listener_for`` names
    them to a client that reached this broker at the request's host (binary LOOKUP answers
    Connect with the same URLs)."""
    host = request.url.hostname or "127.0.0.1"
    http_url = f"{request.url.scheme}://{request.url.netloc}"
    binary = getattr(request.app.state, "pulsar_server", None)
    listener = None if binary is None else binary.listener_for(host)
    plain = listener.service_url if listener is not None else None
    tls = listener.service_url_tls if listener is not None else None
    http_url_tls = http_url if request.url.scheme == "https" else None
    return {"brokerUrl": plain, "brokerUrlTls": tls, "httpUrl": http_url, "httpUrlTls": http_url_tls,
            "nativeUrl": plain}


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter()

    @routes.get("/admin/v2/clusters", summary="The clusters (standalone: one)")
    def clusters(caller: Caller) -> list[str]:
        authorizer.require_superuser(caller)
        return [CLUSTER]

    @routes.get("/admin/v2/clusters/{cluster}", summary="A cluster's service URLs")
    def cluster(cluster: str, request: Request, caller: Caller) -> dict[str, Any]:
        authorizer.require_superuser(caller)
        if cluster != CLUSTER:
            raise NotFound(f"cluster {cluster} does not exist")
        urls = local_urls(request)
        return {"serviceUrl": urls["httpUrl"], "serviceUrlTls": urls["httpUrlTls"],
                "brokerServiceUrl": urls["brokerUrl"], "brokerServiceUrlTls": urls["brokerUrlTls"]}

    return routes
