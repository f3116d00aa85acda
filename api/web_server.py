"""The web service's listeners: plain HTTP/WS and HTTPS/WSS, one uvicorn server for the app.

Role: ``magnetar standalone``, ``magnetar broker`` and the test servers serve the app (REST,
WebSocket, admin, console, metrics) through ``WebServer``: uvicorn's server, whose listeners are
the ``WebListener`` list instead of one host and port, each plain (``webServicePort``) or with
TLS (``webServicePortTls``, the context of ``api/tls.py``). One server means one lifespan (the
broker starts before any listener accepts and closes after every listener stopped), one
signal handler and one graceful shutdown for all of them. Every listener uses the same guarded
HTTP protocol (``server_options``), which hands WebSocket upgrades to the app's WebSocket edge
(``api/ws/server.py``); on a TLS connection with a verified client certificate, the HTTP
protocol hands it to the application in each request's scope (``api/connection_guard.py``) and
the WebSocket edge reads it from the connection.

Invariants: no listener accepts before the application's lifespan started; a listener that
cannot bind stops the start-up (after the lifespan shut down), as uvicorn does with its own;
``started`` and ``urls`` (the listeners' URLs) are set once every listener listens.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE

from api.app import server_options
from api.config import StandaloneConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WebListener:
    host: str
    port: int
    """0: any free port (``WebServer.urls`` tells which)."""
    ssl_context: ssl.SSLContext | None = None
    """None: plain HTTP and WS; else HTTPS and WSS."""

    @property
    def scheme(self) -> str:
        return "http" if self.ssl_context is None else "https"


class WebServer(uvicorn.Server):
    """uvicorn's server on several listeners (``config``'s own host and port are not used)."""

    def __init__(self, config: uvicorn.Config, listeners: Sequence[WebListener]) -> None:
        if not listeners:
            raise ValueError("a web server needs at least one listener")
        super().__init__(config)
        self.listeners = list(listeners)
        self.urls: list[str] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # the lifespan only: the listeners are ours
        if not self.started:
            return
        self.started = False  # until every listener listens
        loop = asyncio.get_running_loop()
        for listener in self.listeners:
            try:
                server = await self._listen(loop, listener)
            except OSError as exc:
                await self._abandon_startup(f"cannot listen on {listener.host}:{listener.port}: {exc}")
                return
            self.servers.append(server)
            assert server.sockets
            host, port = server.sockets[0].getsockname()[:2]
            self.urls.append(f"{listener.scheme}://{_url_host(host)}:{port}")
        self.started = True
        console = self.urls[0].replace("://0.0.0.0:", "://localhost:").replace("://[::]:", "://localhost:")
        log.info("Magnetar's web service listening on %s (console: %s/console)", ", ".join(self.urls), console)
        authorizer = getattr(getattr(self.config.app, "state", None), "authorizer", None)
        if authorizer is not None:
            auth = authorizer.config
            log.info("authentication is %s%s", f"on ({', '.join(auth.providers)})" if auth.enabled else "off",
                     f"; anonymous clients act as {auth.anonymous_role!r}" if auth.enabled and auth.anonymous_role
                     else "")

    async def _listen(self, loop: asyncio.AbstractEventLoop, listener: WebListener) -> asyncio.Server:
        return await loop.create_server(self._new_connection, listener.host, listener.port, ssl=listener.ssl_context,
                                        backlog=self.config.backlog)

    def _new_connection(self) -> asyncio.Protocol:
        """A connection's protocol, made as uvicorn makes it for its own listeners."""
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state)
        return protocol

    async def _abandon_startup(self, reason: str) -> None:
        log.error(reason)
        for server in self.servers:
            server.close()
        await self.lifespan.shutdown()
        sys.exit(STARTUP_FAILURE)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def web_server(app: FastAPI, listeners: Sequence[WebListener], *, log_level: str = "info") -> WebServer:
    """A server for ``app`` on ``listeners``, with the app's protocols (``server_options``)."""
    return WebServer(uvicorn.Config(app, log_level=log_level, **server_options(app)), listeners)


def configured_listeners(config: StandaloneConfig) -> list[WebListener]:
    """The listeners ``webServicePort`` and ``webServicePortTls`` turn on."""
    listeners = []
    if config.port:
        listeners.append(WebListener(config.host, config.port))
    if config.tls_port:
        listeners.append(WebListener(config.host, config.tls_port, config.tls.server_context()))
    return listeners


def serve(app: FastAPI, config: StandaloneConfig, log_level: str) -> None:
    """Run ``app`` on the configured listeners until SIGTERM or Ctrl-C (a graceful shutdown)."""
    web_server(app, configured_listeners(config), log_level=log_level).run()
