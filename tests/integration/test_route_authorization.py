"""Every route of the app demands the permission it should: walked, not listed by hand.

The test walks ``app.routes`` (HTTP, through every included router) and the WebSocket edge's
route table (``app.state.websocket_server.routes``, ``api/ws/routes.py``) and looks
each one up in ``GUARDS``, the one place that says who may call what. A route missing from
``GUARDS`` fails the test, so a new route cannot ship without a decision. Each guarded route is
then called three times against a real server with authentication on: without a token (401),
with a role that lacks the permission (403) and with one that has it (anything but 401/403:
the call may still fail on its merits, e.g. 404 for a missing topic).

Roles: ``admin`` is a superuser; ``acme-admin`` administers tenant ``acme``; ``producer`` and
``consumer`` hold those grants on ``acme/apps``; ``nobody`` holds nothing.

The walk runs once per listener kind (``LISTENERS``): plain HTTP, and HTTPS/WSS alone (plain off),
as a broker with ``webServicePort=`` empty serves it.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import BaseRoute, Mount

from api.auth import AuthConfig
from api.tls import TlsConfig
from broker.service import BrokerService
from consumers.cli.tokens import create_token
from tests.integration.server import running_app
from tests.integration.ws_client import open_ws, refused_status, ws_base
from tests.tls_material import make_material

SECRET = b"route-walk-secret-route-walk-secret"
PUBLIC, SUPERUSER, TENANT_ADMIN, PRODUCE, CONSUME = "public", "superuser", "tenant-admin", "produce", "consume"
LOOKUP = "produce-or-consume"
BOTH = "produce-and-consume"
ALLOWED = {SUPERUSER: "admin", TENANT_ADMIN: "acme-admin", PRODUCE: "producer", CONSUME: "consumer", LOOKUP: "consumer",
           BOTH: "acme-admin"}
DENIED = {SUPERUSER: "acme-admin", TENANT_ADMIN: "producer", PRODUCE: "consumer", CONSUME: "producer", LOOKUP: "nobody",
          BOTH: "producer"}

T = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
S = T + "/subscription/{subscription}"
NT = "/admin/v2/non-persistent/{tenant}/{namespace}/{topic}"
N = "/admin/v2/namespaces/{tenant}/{namespace}"
P = "/topics/persistent/{tenant}/{namespace}/{topic}"
SC = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"
NAMESPACE_QUOTA_PATHS = ("maxProducersPerTopic", "maxConsumersPerTopic", "maxSubscriptionsPerTopic",
                         "maxTopicsPerNamespace", "publishRate", "dispatchRate")
TOPIC_QUOTA_PATHS = ("maxProducers", "maxConsumers", "maxSubscriptionsPerTopic", "publishRate", "dispatchRate")
GUARDS: dict[tuple[str, str], str] = {
    ("GET", "/docs"): PUBLIC, ("GET", "/docs/oauth2-redirect"): PUBLIC, ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/redoc"): PUBLIC, ("GET", "/docs/assets/{path:path}"): PUBLIC,  # the docs' scripts and styles
    ("GET", "/healthz"): PUBLIC, ("GET", "/metrics"): PUBLIC,
    ("GET", "/console"): PUBLIC, ("GET", "/console/{name:path}"): PUBLIC,  # static files; its calls are guarded
    ("GET", "/admin/v2/broker-stats/overview"): SUPERUSER,
    ("GET", "/admin/v2/broker-stats/namespaces/{tenant}/{namespace}/topics"): TENANT_ADMIN,
    ("GET", P + "/offsetOf"): CONSUME,
    ("POST", P): PRODUCE, ("POST", P + "/partitions/{partition}"): PRODUCE,
    ("GET", P + "/messages"): CONSUME, ("GET", P + "/partitions/{partition}/messages"): CONSUME,
    ("GET", P + "/offsets"): CONSUME,
    ("GET", P + "/keys/{key:path}/messages"): CONSUME, ("GET", P + "/keys/{key:path}"): CONSUME,
    ("POST", P + "/dcb/read"): CONSUME, ("POST", P + "/dcb/append"): PRODUCE,
    **{("POST", P + prefix + "/subscription/{subscription}/" + action): CONSUME
       for prefix in ("", "/partitions/{partition}") for action in ("pull", "ack", "negativeAcknowledge")},
    ("GET", "/admin/v2/tenants"): SUPERUSER, ("GET", "/admin/v2/tenants/{tenant}"): TENANT_ADMIN,
    **{(m, "/admin/v2/tenants/{tenant}"): SUPERUSER for m in ("PUT", "POST", "DELETE")},
    ("GET", "/admin/v2/namespaces/{tenant}"): TENANT_ADMIN,
    **{(m, N): TENANT_ADMIN for m in ("GET", "PUT", "DELETE")},
    **{(m, N + "/" + policy): TENANT_ADMIN for m in ("GET", "POST", "DELETE")
       for policy in ("retention", "messageTTL", "deduplication", "persistence", *NAMESPACE_QUOTA_PATHS)},
    **{(m, T + "/" + policy): TENANT_ADMIN for m in ("GET", "POST", "DELETE") for policy in TOPIC_QUOTA_PATHS},
    **{(m, N + "/encryptionRequired"): TENANT_ADMIN for m in ("GET", "POST")},
    # tiered storage: namespace offload policies, a topic's offload policies, the offload itself (as Pulsar)
    **{(m, N + "/" + policy): TENANT_ADMIN for m in ("GET", "PUT", "DELETE")
       for policy in ("offloadThreshold", "offloadThresholdInSeconds", "offloadDeletionLagMs")},
    **{(m, T + "/offloadPolicies"): TENANT_ADMIN for m in ("GET", "POST", "DELETE")},
    **{(m, T + "/offload"): TENANT_ADMIN for m in ("GET", "PUT")},
    ("GET", N + "/permissions"): TENANT_ADMIN,
    **{(m, N + "/permissions/{role}"): TENANT_ADMIN for m in ("POST", "DELETE")},
    ("GET", "/admin/v2/persistent/{tenant}/{namespace}"): TENANT_ADMIN,
    ("GET", "/admin/v2/persistent/{tenant}/{namespace}/partitioned"): TENANT_ADMIN,
    **{(m, T): TENANT_ADMIN for m in ("PUT", "DELETE")},
    **{(m, T + "/partitions"): TENANT_ADMIN for m in ("PUT", "POST", "DELETE")},
    ("GET", T + "/partitions"): LOOKUP,  # read by clients before they produce or consume, as in Pulsar
    **{("GET", T + "/" + what): TENANT_ADMIN
       for what in ("stats", "partitioned-stats", "internalStats", "subscriptions", "examinemessage",
                    "lastMessageId")},
    ("POST", T + "/terminate"): TENANT_ADMIN, ("GET", T + "/compaction"): TENANT_ADMIN,
    ("PUT", T + "/unload"): TENANT_ADMIN,
    ("PUT", T + "/compaction"): TENANT_ADMIN,
    **{(m, S): TENANT_ADMIN for m in ("PUT", "DELETE")},
    **{("POST", S + "/" + action): TENANT_ADMIN
       for action in ("resetcursor/{timestamp}", "resetcursor", "skip/{numMessages}", "skip_all",
                      "expireMessages/{expireTimeInSeconds}")},
    ("POST", T + "/all_subscription/expireMessages/{expireTimeInSeconds}"): TENANT_ADMIN,
    ("GET", S + "/position/{messagePosition}"): TENANT_ADMIN,
    **{("GET", SC + what): LOOKUP for what in ("/schema", "/schema/{version}", "/schemas")},
    **{(m, SC + what): TENANT_ADMIN for m, what in (("POST", "/schema"), ("DELETE", "/schema"),
                                                    ("POST", "/compatibility"))},
    **{(m, N + "/schemaCompatibilityStrategy"): TENANT_ADMIN for m in ("GET", "PUT")},
    **{(m, T + "/schemaCompatibilityStrategy"): TENANT_ADMIN for m in ("GET", "PUT", "DELETE")},
    **{(m, N + "/" + flag): TENANT_ADMIN for m in ("GET", "POST")
       for flag in ("isAllowAutoUpdateSchema", "schemaValidationEnforced")},
    # non-persistent topics (api/admin_non_persistent.py)
    ("GET", "/admin/v2/non-persistent/{tenant}/{namespace}"): TENANT_ADMIN,
    ("GET", "/admin/v2/non-persistent/{tenant}/{namespace}/partitioned"): TENANT_ADMIN,
    **{(m, NT + what): TENANT_ADMIN for m, what in (("GET", "/stats"), ("GET", "/partitioned-stats"),
                                                     ("GET", "/subscriptions"), ("DELETE", ""),
                                                     ("PUT", "/partitions"), ("POST", "/partitions"),
                                                     ("DELETE", "/partitions"))},
    ("GET", NT + "/partitions"): LOOKUP,
    ("GET", "/admin/v2/clusters"): SUPERUSER,
    **{(m, "/admin/v2/clusters/{cluster}"): SUPERUSER for m in ("GET", "PUT", "POST")},
    # WebSocket endpoints: a plain GET only explains that they need an upgrade (426)
    **{("GET", path): PUBLIC for path in (
        "/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}",
        "/ws/v2/consumer/persistent/{tenant}/{namespace}/{topic}/{subscription}",
        "/ws/v3/consumer/{subscription}", "/ws/v2/reader/persistent/{tenant}/{namespace}/{topic}",
        "/ws/v2/producer/non-persistent/{tenant}/{namespace}/{topic}",
        "/ws/v2/consumer/non-persistent/{tenant}/{namespace}/{topic}/{subscription}",
        "/ws/v2/dcb/persistent/{tenant}/{namespace}/{topic}")},
    ("WEBSOCKET", "/ws/v2/dcb/persistent/{tenant}/{namespace}/{topic}"): BOTH,
    ("WEBSOCKET", "/ws/v2/producer/non-persistent/{tenant}/{namespace}/{topic}"): PRODUCE,
    ("WEBSOCKET", "/ws/v2/consumer/non-persistent/{tenant}/{namespace}/{topic}/{subscription}"): CONSUME,
    ("WEBSOCKET", "/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}"): PRODUCE,
    ("WEBSOCKET", "/ws/v2/consumer/persistent/{tenant}/{namespace}/{topic}/{subscription}"): CONSUME,
    ("WEBSOCKET", "/ws/v3/consumer/{subscription}"): CONSUME,
    ("WEBSOCKET", "/ws/v2/reader/persistent/{tenant}/{namespace}/{topic}"): CONSUME,
    # where topics are served (api/lookup.py): a lookup is Pulsar's, allowed to producers and consumers
    ("GET", "/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}"): LOOKUP,
    ("GET", "/lookup/v2/topic/non-persistent/{tenant}/{namespace}/{topic}"): LOOKUP,
    ("GET", "/admin/v2/brokers"): SUPERUSER, ("GET", "/admin/v2/brokers/{cluster}"): SUPERUSER,
    ("GET", "/admin/v2/bookies/all"): SUPERUSER,
    ("GET", "/admin/v2/broker-stats/load-reports"): SUPERUSER,
    ("GET", N + "/bundles"): TENANT_ADMIN, ("GET", N + "/bundles/owners"): TENANT_ADMIN,
    ("PUT", N + "/{bundle}/unload"): TENANT_ADMIN, ("PUT", N + "/{bundle}/split"): TENANT_ADMIN,
}
VALUES = {"name:path": "index.html", "path:path": "swagger-ui.css", "key:path": "account-1", "tenant": "acme",
          "namespace": "apps", "topic": "events", "subscription": "sub", "partition": "0", "role": "someone",
          "timestamp": "0", "numMessages": "1", "expireTimeInSeconds": "1", "messagePosition": "1",
          "bundle": "0x00000000_0xffffffff", "cluster": "standalone", "version": "0"}
QUERY = {"offset": "0", "topics": "persistent://acme/apps/events", "messageId": "earliest",
         "initialPosition": "earliest"}
BODIES: dict[tuple[str, str], Any] = {
    ("POST", P): {"messages": [{"payload": "x"}]},
    ("POST", P + "/partitions/{partition}"): {"messages": [{"payload": "x"}]},
    ("PUT", "/admin/v2/tenants/{tenant}"): {"adminRoles": []},
    **{(m, "/admin/v2/clusters/{cluster}"): {"serviceUrl": "http://localhost:8080"} for m in ("PUT", "POST")},
    ("POST", "/admin/v2/tenants/{tenant}"): {"adminRoles": []},
    ("POST", N + "/retention"): {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1},
    ("POST", N + "/messageTTL"): 60, ("POST", N + "/deduplication"): True,
    ("POST", N + "/encryptionRequired"): False,
    **{("PUT", N + "/" + policy): 1000 for policy in ("offloadThreshold", "offloadThresholdInSeconds",
                                                      "offloadDeletionLagMs")},
    ("POST", T + "/offloadPolicies"): {"managedLedgerOffloadThresholdInBytes": 1000},
    ("PUT", T + "/offload"): {"ledgerId": 1, "entryId": 0},
    ("POST", N + "/persistence"): {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1},
    ("POST", N + "/permissions/{role}"): ["consume"], ("PUT", T + "/partitions"): 2, ("POST", T + "/partitions"): 2,
    ("PUT", NT + "/partitions"): 2, ("POST", NT + "/partitions"): 2,
    ("POST", S + "/resetcursor"): {"ledgerId": 1, "entryId": 0},
    **{("POST", SC + what): {"type": "STRING", "schema": ""} for what in ("/schema", "/compatibility")},
    ("PUT", N + "/schemaCompatibilityStrategy"): "FULL", ("PUT", T + "/schemaCompatibilityStrategy"): "FULL",
    ("POST", N + "/isAllowAutoUpdateSchema"): True, ("POST", N + "/schemaValidationEnforced"): True,
    **{("POST", level + "/" + policy): {"publishThrottlingRateInMsg": 100} if policy == "publishRate" else
       {"dispatchThrottlingRateInMsg": 100} if policy == "dispatchRate" else 100
       for level, policies in ((N, NAMESPACE_QUOTA_PATHS), (T, TOPIC_QUOTA_PATHS)) for policy in policies},
    **{("POST", P + prefix + "/subscription/{subscription}/" + action): {"offsets": [0]}
       for prefix in ("", "/partitions/{partition}") for action in ("ack", "negativeAcknowledge")},
}


def served_routes(app: FastAPI) -> Iterator[tuple[str, str]]:
    """Every (method, path) the app serves: its HTTP routes and, as method WEBSOCKET, the
    handshake paths of its WebSocket edge."""
    yield from walk(app.routes)
    yield from (("WEBSOCKET", route.path) for route in app.state.websocket_server.routes)


def walk(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Every (method, path) of ``routes``, through included routers and their prefixes
    (Starlette WebSocket routes as method WEBSOCKET, a mounted static directory as one GET route)."""
    for route in routes:
        included = getattr(route, "include_context", None)
        if included is not None:
            yield from walk(included.included_router.routes, prefix + included.prefix)
            continue
        if isinstance(route, Mount):  # static files: everything under its path
            yield "GET", f"{prefix}{route.path}/{{path:path}}"
            continue
        path: str = prefix + route.path  # type: ignore[attr-defined]
        methods = getattr(route, "methods", None)
        if methods is None:
            yield "WEBSOCKET", path
        else:
            yield from ((method, path) for method in sorted(methods) if method != "HEAD")


LISTENERS = ["http", "https"]


@dataclass(frozen=True)
class Served:
    url: str
    app: FastAPI
    service: BrokerService
    ssl_context: ssl.SSLContext | None
    """How a client trusts an ``https://`` server (None for ``http://``)."""


@pytest.fixture(scope="module", params=LISTENERS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    auth = AuthConfig(enabled=True, secret_key=SECRET, superuser_roles=frozenset({"admin"}))
    directory = tmp_path_factory.mktemp("routes")
    tls, context = _tls(directory) if request.param == "https" else (None, None)
    with running_app(str(directory / "data"), auth=auth, tls=tls) as (url, app, service):
        yield Served(url, app, service, context)


def _tls(directory: Path) -> tuple[TlsConfig, ssl.SSLContext]:
    material = make_material(directory / "certs")
    return TlsConfig(str(material.server.cert), str(material.server.key)), material.context()


@pytest.fixture(autouse=True)
def roles(served: Served) -> None:
    """Tenant, namespace and grants as the roles need them (a destructive call before may have
    deleted them)."""
    service = served.service
    if "acme" not in service.namespaces.tenants():
        service.namespaces.create_tenant("acme", {"adminRoles": ["acme-admin"]})
    service.namespaces.update_tenant("acme", {"adminRoles": ["acme-admin"]})
    if "acme/apps" not in service.namespaces.namespaces("acme"):
        service.namespaces.create_namespace("acme/apps")
    service.namespaces.set_policy("acme/apps", "auth_policies",
                                  {"namespace_auth": {"producer": ["produce"], "consumer": ["consume"]}})


def headers(role: str | None) -> dict[str, str]:
    return {} if role is None else {"Authorization": f"Bearer {create_token(role, secret_key=SECRET)}"}


def concrete(path: str) -> str:
    return re.sub(r"\{([\w:]+)\}", lambda m: VALUES[m.group(1)], path)


def test_every_route_has_a_guard(served: Served) -> None:
    routes = set(served_routes(served.app))
    unguarded = sorted(routes - set(GUARDS))
    assert not unguarded, f"routes without an authorization decision in GUARDS: {unguarded}"
    assert not sorted(set(GUARDS) - routes), "GUARDS names routes the app no longer has"


def call(served: Served, method: str, path: str, role: str | None) -> int:
    body = BODIES.get((method, path))
    with httpx.Client(base_url=served.url, timeout=30, verify=served.ssl_context or True) as http:
        answer = http.request(method, concrete(path), params=QUERY, headers=headers(role),
                              json=body if role is not None else None)
    return answer.status_code


def ws_status(served: Served, path: str, role: str | None) -> int:
    target = f"{ws_base(served.url)}{concrete(path)}?" + "&".join(f"{k}={v}" for k, v in QUERY.items())
    try:
        status, _ = refused_status(target, served.ssl_context, **headers(role))
    except AssertionError:  # the upgrade was accepted
        return 101
    return status


@pytest.mark.parametrize(("method", "path"), sorted(GUARDS))
def test_the_route_demands_its_permission(served: Served, method: str, path: str) -> None:
    guard = GUARDS[(method, path)]

    def status(role: str | None) -> int:
        return ws_status(served, path, role) if method == "WEBSOCKET" else call(served, method, path, role)

    if guard == PUBLIC:
        assert status(None) not in (401, 403)
        return
    assert status(None) == 401, "no token"
    assert status("nobody") == 403, "a role with no grant"
    assert status(DENIED[guard]) == 403, f"{DENIED[guard]} lacks {guard}"
    if guard == BOTH:
        assert status("consumer") == 403, f"consumer lacks {guard}"
    assert status(ALLOWED[guard]) not in (401, 403), f"{ALLOWED[guard]} has {guard}"


def test_an_accepted_websocket_really_opens(served: Served) -> None:
    with open_ws(f"{ws_base(served.url)}/ws/v2/reader/persistent/acme/apps/events?messageId=earliest",
                 served.ssl_context, **headers("consumer")):
        pass


def test_a_lookup_is_allowed_to_producers_and_consumers_alike(served: Served) -> None:
    path = "/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}"
    assert call(served, "GET", path, "producer") == 200
    assert call(served, "GET", path, "consumer") == 200
