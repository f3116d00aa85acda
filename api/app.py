"""The HTTP application: FastAPI routes over a ``BrokerService``.

Role: the edge of the broker. Routes translate HTTP to broker calls and back; they never touch
``storage`` directly. The application's lifespan starts the broker service and closes it on
shutdown (uvicorn turns SIGTERM into a graceful shutdown, so a SIGTERM flushes and checkpoints).

In front of the routes, ``api/request_guard.py`` authenticates each request once and bounds
bodies and per-role concurrency; ``server_options`` gives uvicorn the guarded HTTP protocol of
``api/connection_guard.py`` (connection count, header and idle timeouts) for this app's
``EdgeLimits``, and no WebSocket protocol of its own: that guarded protocol hands WebSocket
upgrades to the app's WebSocket edge (``api/ws/server.py``, ``app.state.websocket_server``),
whose keep-alive runs from the lifespan and whose sessions are closed before the broker. Every
Magnetar server (``magnetar standalone``, ``magnetar broker`` and the test servers) runs with
``server_options(app)``, on the listeners of ``api/web_server.py``.

``/docs`` (Swagger UI) and ``/redoc`` render without any network: their scripts, styles and icon
come from the ``fastapi-offline`` package, served by the broker at ``DOCS_ASSETS_PATH``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from fastapi_offline import FastAPIOffline

from api import console, log_redaction
from api.admin import router as admin_router
from api.admin_broker import router as broker_stats_router
from api.auth import AuthConfig, Authorizer
from api.connection_guard import (
    ConnectionGuard,
    effective_connections_max,
    guarded_http_protocol,
    quiet_accept_errors,
)
from api.errors import install_error_handlers
from api.limits import EdgeLimits
from api.lookup import router as lookup_router
from api.loop_stalls import LoopStallMonitor, stall_hook_router, test_hooks_enabled
from api.metrics import router as metrics_router
from api.pulsar import PulsarServer, PulsarSettings
from api.request_guard import RequestGuard, RoleSlots
from api.rest_consume import router as consume_router
from api.rest_dcb import router as dcb_router
from api.rest_locate import router as locate_router
from api.rest_lookup import router as clusters_router
from api.rest_produce import router as produce_router
from api.rest_read import router as read_router
from api.rest_streams import router as streams_router
from api.wakeup import loop_executor
from api.ws import WebSocketServer
from api.ws import router as ws_router
from broker import BrokerService

DOCS_ASSETS_PATH = "/docs/assets"
"""Where the API documentation pages' scripts, styles and icon are served (public, no data)."""
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}
"""No online validator badge: the page asks nothing of any host but this broker."""
NO_OPENTELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's own OpenTelemetry hooks off: the broker's telemetry is ``/metrics`` (Prometheus).
Left on, FastAPI asks the OpenTelemetry providers (environment variables among them) whether
to trace, on every request: 6% of a REST produce's event-loop CPU."""

def server_options(app: FastAPI) -> dict[str, Any]:
    """uvicorn settings for serving ``app``: the guarded HTTP protocol under the app's
    connection guard, handing WebSocket upgrades to the app's WebSocket edge (uvicorn itself
    serves no WebSocket)."""
    limits: EdgeLimits = app.state.limits
    websockets: WebSocketServer = app.state.websocket_server
    return {
        "http": guarded_http_protocol(_http_protocol_base(), app.state.connection_guard, websockets.take_over),
        "timeout_keep_alive": limits.idle_timeout_s,
        "h11_max_incomplete_event_size": limits.header_bytes_max,  # the guard bounds httptools' heads
        "ws": "none",
    }


def _http_protocol_base() -> type[Any]:
    """uvicorn's own choice of HTTP protocol ("auto"): httptools when installed, else h11."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol
        return H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    return HttpToolsProtocol


def create_app(service: BrokerService, *, auth: AuthConfig | None = None,
               limits: EdgeLimits | None = None, pulsar: PulsarSettings | None = None) -> FastAPI:
    """The application; with ``pulsar`` settings its lifespan also runs Pulsar's binary protocol
    listeners (``api/pulsar/``) on the same event loop, started after the broker and closed
    before it (``app.state.pulsar_server`` once running)."""
    limits = limits or EdgeLimits()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        quiet_accept_errors(asyncio.get_running_loop())
        service.start()
        stalls.start(asyncio.get_running_loop())  # the loop's stalls and the gc's pauses, until shutdown
        # Deliveries are sent from this loop: dispatching here saves a thread hop per entry, and
        # a burst of confirmations wakes the loop once for dispatch and publish results alike.
        service.use_dispatch_executor(loop_executor(asyncio.get_running_loop()))
        # Idle journal: this loop writes and syncs its own publishes (no hand-over and back).
        service.write_journal_on_this_thread(asyncio.get_running_loop().call_soon)
        binary: PulsarServer | None = None
        await ws_server.start()
        try:
            if pulsar is not None and (pulsar.port or pulsar.tls_enabled):
                binary = PulsarServer(service, authorizer, pulsar)
                await binary.start()
                app.state.pulsar_server = binary
            yield
        finally:
            await ws_server.close()
            if binary is not None:
                await binary.close()
            service.write_journal_on_this_thread(None)
            service.use_dispatch_executor(None)
            service.close()
            stalls.stop()

    log_redaction.install()
    app = FastAPIOffline(title="Magnetar", version="0.1.0", lifespan=lifespan, static_url=DOCS_ASSETS_PATH,
                         swagger_ui_parameters=SWAGGER_UI_PARAMETERS, telemetry=NO_OPENTELEMETRY)
    app.state.service = service
    app.state.limits = limits
    stalls = LoopStallMonitor()
    app.state.loop_stalls = stalls
    guard = ConnectionGuard(effective_connections_max(limits.connections_max), limits.header_timeout_s,
                            limits.header_bytes_max)
    app.state.connection_guard = guard
    authorizer = Authorizer(auth or AuthConfig(), service)
    app.state.authorizer = authorizer
    slots = RoleSlots(authorizer, limits.connections_per_role_max)
    ws_server = WebSocketServer(service, authorizer, limits, slots)
    app.state.websocket_server = ws_server
    app.add_middleware(RequestGuard, authorizer=authorizer, limits=limits, slots=slots)
    install_error_handlers(app)
    # The data plane first: a request's route is found by trying the routes in this order, and
    # the admin API's hundreds of routes (none under /topics or /ws) would be tried before it.
    app.include_router(produce_router(service, authorizer))
    app.include_router(consume_router(service, authorizer, limits))
    app.include_router(read_router(service, authorizer, limits))
    app.include_router(streams_router(service, authorizer, limits))
    app.include_router(dcb_router(service, authorizer, limits))
    app.include_router(ws_router(ws_server.routes))
    app.include_router(admin_router(service, authorizer))
    app.include_router(metrics_router(service, authorizer, stalls))
    app.include_router(broker_stats_router(service, authorizer, stalls))
    if test_hooks_enabled():
        app.include_router(stall_hook_router(authorizer))
    app.include_router(locate_router(service, authorizer))
    app.include_router(lookup_router(service, authorizer))
    app.include_router(clusters_router(service, authorizer))
    app.include_router(console.router())

    @app.get("/healthz", summary="Liveness and storage health")
    def healthz() -> JSONResponse:
        health = service.health()
        body: dict[str, Any] = dataclasses.asdict(health)
        return JSONResponse(body, status_code=200 if health.status == "ok" else 503)

    return app
