"""Clusters, and this broker's own service URLs: where Pulsar's clients and tools find it.

Role: :func:`local_urls` gives Pulsar's ``LookupData`` fields (``brokerUrl``, ``brokerUrlTls``,
``httpUrl``, ``httpUrlTls``, ``nativeUrl``) for this broker, naming its listeners as the host the
request came to sees them (the web URL is the one the request came in by: over HTTPS it is also
``httpUrlTls``); the lookup endpoint (``api/lookup.py``) answers with them for a topic
this broker serves. ``/admin/v2/clusters`` lists the one cluster, ``standalone``, and
``/admin/v2/clusters/standalone`` gives its URLs, as Pulsar's standalone does: the ones an
administrator stored (``PUT`` creates them once, then 409 as in Pulsar; ``POST`` replaces them),
else this broker's own as the request sees them. A broker of one cluster creates no other (412).

Authorization: clusters are for superusers, as in Pulsar.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from api.auth import Authorizer, Caller
from api.limits import URL_CHARS_MAX
from broker import BrokerService, NotFound, PreconditionFailed

CLUSTER = "standalone"


def _url() -> Any:
    return Field(default=None, max_length=URL_CHARS_MAX)


class ClusterData(BaseModel):
    """Pulsar's ``ClusterData``: the URLs a cluster is reached at (the rest of a body is ignored)."""

    model_config = ConfigDict(extra="ignore")
    serviceUrl: StrictStr | None = _url()  # noqa: N815
    serviceUrlTls: StrictStr | None = _url()  # noqa: N815
    brokerServiceUrl: StrictStr | None = _url()  # noqa: N815
    brokerServiceUrlTls: StrictStr | None = _url()  # noqa: N815


def _this_cluster(cluster: str) -> str:
    if cluster != CLUSTER:
        raise PreconditionFailed(f"this broker serves one cluster, {CLUSTER!r}, not {cluster!r}")
    return cluster


def local_urls(request: Request, listener_name: str = "") -> dict[str, Any]:
    """This broker's URLs: its binary-protocol listeners as ``PulsarServer.listener_for`` names
    them to a client that reached this broker at the request's host and names the advertised
    listener ``listener_name`` ('': none) (binary LOOKUP answers Connect with the same URLs)."""
    host = request.url.hostname or "127.0.0.1"
    http_url = f"{request.url.scheme}://{request.url.netloc}"
    binary = getattr(request.app.state, "pulsar_server", None)
    listener = None if binary is None else binary.listener_for(host, listener_name)
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
        own = {"serviceUrl": urls["httpUrl"], "serviceUrlTls": urls["httpUrlTls"],
               "brokerServiceUrl": urls["brokerUrl"], "brokerServiceUrlTls": urls["brokerUrlTls"]}
        return own | (service.namespaces.cluster_data(cluster) or {})

    @routes.put("/admin/v2/clusters/{cluster}", status_code=204, summary="Create the cluster's data (once)")
    def create_cluster(cluster: str, data: Annotated[ClusterData, Body()], caller: Caller) -> None:
        authorizer.require_superuser(caller)
        stored = data.model_dump(exclude_none=True)
        service.namespaces.put_cluster_data(_this_cluster(cluster), stored, create=True)

    @routes.post("/admin/v2/clusters/{cluster}", status_code=204, summary="Replace the cluster's data")
    def update_cluster(cluster: str, data: Annotated[ClusterData, Body()], caller: Caller) -> None:
        authorizer.require_superuser(caller)
        stored = data.model_dump(exclude_none=True)
        service.namespaces.put_cluster_data(_this_cluster(cluster), stored, create=False)

    return routes
