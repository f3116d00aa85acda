"""The WebSocket edge's asyncio adapter: upgraded connections, their handshakes, and their sessions.

Role: the web listener stays HTTP, its server without a WebSocket protocol of its own. Its
guarded HTTP protocol (``api/connection_guard.py``) recognises a connection's first request
when it is a WebSocket upgrade on ``/ws/`` and hands the transport, with the bytes it holds, to
``WebSocketServer.take_over``: from then on a ``WebSocketConnection`` (a plain
``asyncio.Protocol``, as ``api/pulsar/server.py`` is for the binary protocol) owns it. It feeds
what it reads to its ``WebSocketWire`` (``protocol.py``, websockets' sans-I/O protocol behind a
fast text-frame reader), answers the handshake, and hands the frames to its session
(``session.py``); everything it sends goes through its ``FrameWriter`` (``writer.py``).

A handshake is admitted here, in the order Pulsar's is: the route (``routes.py``: its path and
query parameters, 400 for a bad one, 404 for a path the API does not have), the caller
(``Authorizer``: a token from ``Authorization`` or ``?token=``, the verified client certificate
on a TLS listener; 401), the role's share of requests and sessions (``RoleSlots``,
``connections_per_role_max``; 429), the permissions (403), the session's broker objects (the
broker's refusal: 404, 409, 429, or 307 to the owner on a cluster broker that does not serve
the topic); then 101. Every refusal is one HTTP answer with the error's status and JSON body
``{code, message}`` (``refuse``), so nothing is half-open. An admitted session is registered
with what it was admitted for (``api/sessions.py``) and ends with 1008 if its caller loses a
permission, with 1012 if its topic moves to another broker.

Invariants:
- Frames in take one route: the text frames of one socket read go to the session's
  ``on_frames`` in one call, in order; those it leaves wait here, are offered again first once
  it calls ``ready``, and reading pauses once ``WS_RECEIVE_QUEUE_FRAMES_MAX`` frames or
  ``WS_RECEIVE_QUEUE_BYTES_MAX`` bytes wait (resuming once none does), so a client that floods
  frames is held back by TCP. Frames out take one route: the connection's ``FrameWriter``.
- A session failure (an exception out of the session) closes the connection with 1011 and its
  reason, logged once with its traceback: this is the one place a failure after the upgrade
  becomes a close code. Frame-level refusals are the session's frames (``send-error``,
  ``error:<n>``).
- Closing: a close the server starts (a session's end, a revocation, shutdown) leaves after every
  frame sent before it and waits ``WS_CLOSE_TIMEOUT_S`` for the peer's; a close the peer starts is
  echoed and the connection closed, after the session took the text frames read before it (acks
  sent just before a close count; frames it had left waiting are dropped, so a producer's
  messages held back by its bound are never published and get no receipt), even when the
  session closes on those frames; a connection the wire failed (1002, 1007, 1009) is
  half-closed and read until the peer closes (or the timeout passes), so the close frame is not
  overtaken by a reset. A session ends (``Session.end``) once, when its connection starts
  closing or is lost, whichever is first; its role slot and registry entry go with it.
- Keep-alive: every ``WS_PING_INTERVAL_S`` each open connection is sent a ping; one that has not
  answered the previous ping by then is closed with 1011 ("keepalive ping timeout").
- Every connection is released from the listener's connection guard exactly once, when lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import os
import urllib.parse
from collections.abc import Callable
from typing import Any, cast

from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.protocol import SEND_EOF

from api.auth import Action, Authorizer
from api.errors import error_body, error_bytes, redirect_headers
from api.limits import (
    CLOSE_REASON_BYTES_MAX,
    WS_CLOSE_TIMEOUT_S,
    WS_PING_INTERVAL_S,
    WS_RECEIVE_QUEUE_BYTES_MAX,
    WS_RECEIVE_QUEUE_FRAMES_MAX,
    EdgeLimits,
)
from api.log_redaction import redact
from api.request_guard import RoleSlots
from api.sessions import Admission, SessionRegistry
from api.tls import TlsPeer, tls_peer_of
from api.ws.frames import short
from api.ws.params import QueryParams
from api.ws.protocol import HandshakeRefused, WebSocketWire
from api.ws.routes import Handshake, WebSocketRoute, websocket_routes
from api.ws.session import Session
from api.ws.writer import FrameWriter
from broker import BrokerService, InvalidRequest, MagnetarError, NotFound, TopicName, TopicNotOwned

log = logging.getLogger(__name__)

_HANDSHAKE, _OPEN, _CLOSING, _CLOSED = range(4)


class WebSocketServer:
    """The edge of one web service: its route table, open connections, sessions and keep-alive."""

    def __init__(self, service: BrokerService, authorizer: Authorizer, limits: EdgeLimits, slots: RoleSlots) -> None:
        self.authorizer = authorizer
        self.limits = limits
        self.slots = slots
        self.routes: list[WebSocketRoute] = websocket_routes(service, limits)
        self.sessions = SessionRegistry(authorizer)
        service.add_policy_listener(self.sessions.revalidate)
        service.add_unload_listener(self.sessions.topics_unloaded)
        self._connections: set[WebSocketConnection] = set()
        self._keepalive: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the keep-alive pings (on the loop that serves the connections)."""
        self._keepalive = asyncio.create_task(self._keepalive_loop())

    async def close(self) -> None:
        """Close every connection (1012, service restart) and end its session at once."""
        if self._keepalive is not None:
            self._keepalive.cancel()
        for connection in list(self._connections):
            connection.shutdown()

    def take_over(self, transport: asyncio.BaseTransport, release: Callable[[], None]) -> WebSocketConnection:
        """The protocol of a connection whose upgrade request the HTTP protocol recognised;
        ``release`` frees its place in the listener's connection guard once it is lost."""
        connection = WebSocketConnection(self, cast(asyncio.Transport, transport), release)
        self._connections.add(connection)
        return connection

    def forget(self, connection: WebSocketConnection) -> None:
        self._connections.discard(connection)

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(WS_PING_INTERVAL_S)
            for connection in list(self._connections):
                connection.keepalive()

    def admit(self, connection: WebSocketConnection, request: Request) -> Callable[[], None]:
        """Admit the handshake ``request`` and start its session (see the module docstring);
        what ends the session's admission. Raises the refusal."""
        path, _, query = request.path.partition("?")
        route, params = self._route(urllib.parse.unquote(path))
        query_params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        opening = route.open(Handshake(params, QueryParams(query_params), connection.peer))
        principal = self.authorizer.authenticate_request(_Head(request.headers, query_params), connection.tls_peer)
        role = self.slots.role_of(principal)
        if role is not None:
            self.slots.take(role)
        try:
            checks = [(action, topic) for action in (opening.action, *opening.also) for topic in opening.topics]
            if opening.dead_letter_topic is not None:
                checks.append((Action.PRODUCE, TopicName.parse(opening.dead_letter_topic)))
            for needed, topic in checks:
                self.authorizer.require(principal, needed, topic)
            connection.session = opening.start(connection)
        except BaseException:
            if role is not None:
                self.slots.give_back(role)
            raise
        session_id = self.sessions.opened(Admission(principal, tuple(checks)), connection, connection.loop)

        def ended() -> None:
            self.sessions.ended(session_id)
            if role is not None:
                self.slots.give_back(role)

        return ended

    def _route(self, path: str) -> tuple[WebSocketRoute, dict[str, str]]:
        for route in self.routes:
            params = route.match(path)
            if params is not None:
                return route, params
        raise NotFound(f"no WebSocket endpoint at {path}")


class _Head:
    """A handshake as the authentication providers read it (``RequestHead``)."""

    def __init__(self, headers: Headers, query_params: dict[str, str]) -> None:
        self.headers = headers
        self.query_params = query_params


class WebSocketConnection(asyncio.Protocol):
    """One upgraded connection: the wire, the session, the writer (see the module docstring)."""

    def __init__(self, server: WebSocketServer, transport: asyncio.Transport, release: Callable[[], None]) -> None:
        self._server = server
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self.writer = FrameWriter(transport, self.loop)
        limits = server.limits
        self._wire = WebSocketWire(limits.ws_frame_bytes_max, limits.header_bytes_max)
        self._release: Callable[[], None] | None = release
        self.tls_peer: TlsPeer | None = tls_peer_of(transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
        self._state = _HANDSHAKE
        self.session: Session | None = None
        self._session_ended: Callable[[], None] | None = None
        self._held: list[str] = []
        self._held_bytes = 0
        self._offer_scheduled = False
        self._reading_paused = False
        self._close_timer: asyncio.TimerHandle | None = None
        self._ping: bytes | None = None

    # --- asyncio.Protocol ------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._state == _HANDSHAKE:
            self._handshake(data)
            return
        wire = self._wire
        texts = wire.receive(data)
        if texts and self._state == _OPEN:  # before the control frames: a close read with them comes after them
            self._deliver(texts)
        if wire.has_output:
            self._send_control(wire.output())
        if wire.pongs:
            if self._ping in wire.pongs:
                self._ping = None
            wire.pongs.clear()

    def eof_received(self) -> bool | None:
        return None  # the peer is done: the transport closes, and the session ends

    def connection_lost(self, exc: Exception | None) -> None:
        self._state = _CLOSED
        if self._close_timer is not None:
            self._close_timer.cancel()
        self.writer.stop()
        self._end_session()
        self._server.forget(self)
        if self._release is not None:
            self._release()
            self._release = None

    def pause_writing(self) -> None:
        self.writer.pause()

    def resume_writing(self) -> None:
        self.writer.resume()

    # --- the opening handshake -------------------------------------------------------------------
    def _handshake(self, data: bytes) -> None:
        wire = self._wire
        try:
            request = wire.receive_head(data)
        except HandshakeRefused as exc:
            self._refuse("?", 400, _json(error_body(InvalidRequest.code, str(exc))))
            return
        if request is None:
            return
        path, _, query = request.path.partition("?")
        wire.label = f"{path} from {self.peer or '?'}"  # the path only: a ?token= stays out of the log
        response = wire.accept(request)
        if response.status_code != 101:  # not a WebSocket handshake websockets can answer
            message = bytes(response.body or b"").decode(errors="replace").strip()
            self._refuse(request.path, response.status_code, _json(error_body("invalid_handshake", message)))
            return
        try:
            ended = self._server.admit(self, request)
        except MagnetarError as exc:
            headers = redirect_headers(exc, path, query, websocket=True) if isinstance(exc, TopicNotOwned) else None
            self._refuse(request.path, exc.http_status, error_bytes(exc), headers)
            return
        except Exception:
            log.exception("opening WebSocket session %s failed", self._wire.label)
            self._refuse(request.path, 500, _json(error_body("internal_error", "the session could not be opened")))
            return
        self._accept(request.path, response, ended)

    def _refuse(self, target: str, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        """Answer the upgrade with an HTTP error and close (as Pulsar does when it cannot open a session)."""
        log.info('%s - "WebSocket %s" %d', self.peer or "?", redact(target), status)
        self._state = _CLOSING
        self.transport.write(self._wire.respond(self._wire.refusal(status, _phrase(status), body, headers)))
        self.transport.close()

    def _accept(self, target: str, response: Response, ended: Callable[[], None]) -> None:
        log.info('%s - "WebSocket %s" [accepted]', self.peer or "?", redact(target))
        self._session_ended = ended
        self._state = _OPEN
        self.transport.write(self._wire.respond(response))
        session = self.session
        assert session is not None
        try:
            session.start()
        except Exception as exc:
            self.fail(exc)
            return
        self.data_received(b"")  # frames the client sent before the answer, if any

    # --- frames in -------------------------------------------------------------------------------
    def _deliver(self, texts: list[str]) -> None:
        if self._held:  # earlier frames wait: these go behind them
            self._hold(texts)
            return
        session = self.session
        assert session is not None
        try:
            taken = session.on_frames(texts)
        except Exception as exc:
            self.fail(exc)
            return
        if taken < len(texts):
            self._hold(texts[taken:])

    def _hold(self, texts: list[str]) -> None:
        self._held += texts
        self._held_bytes += sum(map(len, texts))
        if len(self._held) >= WS_RECEIVE_QUEUE_FRAMES_MAX or self._held_bytes >= WS_RECEIVE_QUEUE_BYTES_MAX:
            self._pause_reading()

    def ready(self) -> None:
        """The session can take frames again: offer it those it left, on the loop's next turn."""
        if not self._offer_scheduled and self._state == _OPEN:  # also from inside on_frames: before it left any
            self._offer_scheduled = True
            self.loop.call_soon(self._offer)

    def _offer(self) -> None:
        self._offer_scheduled = False
        held, self._held, self._held_bytes = self._held, [], 0
        if not held or self._state != _OPEN:
            return
        self._deliver(held)
        if not self._held:
            self._resume_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    # --- closing ---------------------------------------------------------------------------------
    def close(self, code: int, reason: str) -> None:
        """Close after the frames already sent, and wait for the peer's close (the session ends now)."""
        if self._state != _OPEN:
            return
        if not self._wire.open and self._wire.has_output:  # the peer's close (or its fault) came with the
            self._send_control(self._wire.output())       # frames the session is taking: answer that instead
            return
        parts = self._wire.close(code, reason.encode()[:CLOSE_REASON_BYTES_MAX].decode(errors="ignore"))
        self._closing()
        self.writer.send_bytes(parts)
        self.writer.flush()
        self.writer.stop()
        self._resume_reading()  # the peer's close frame is read, the rest dropped
        self._close_timer = self.loop.call_later(WS_CLOSE_TIMEOUT_S, self.transport.close)

    def fail(self, error: BaseException) -> None:
        """The session failed: 1011 with the failure's code and message (logged with its traceback)."""
        log.error("WebSocket session %s failed", self._wire.label, exc_info=error)
        self.close(1011, short(f"{getattr(error, 'code', 'internal_error')}: {error}"))

    def shutdown(self) -> None:
        """The broker is stopping: 1012 (service restart), the connection closed now."""
        if self._state == _OPEN:
            self.close(1012, "the broker is shutting down")
        self._end_session()
        self.transport.close()

    def _send_control(self, parts: list[bytes]) -> None:
        """What the wire answered (pongs, a close frame): in turn with the frames; when it ends the
        connection (``SEND_EOF``), close at once after the peer's close, or half-close and drain
        after a failure of the peer's."""
        self.writer.send_bytes(parts)
        if not parts or parts[-1] != SEND_EOF:
            return
        self._closing()
        self.writer.flush()
        self.writer.stop()
        if self._wire.close_received:
            self.transport.close()
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._resume_reading()
        if self._close_timer is None:
            self._close_timer = self.loop.call_later(WS_CLOSE_TIMEOUT_S, self.transport.close)

    def _closing(self) -> None:
        if self._state == _OPEN:
            self._state = _CLOSING
            self._held, self._held_bytes = [], 0
            self._end_session()

    def _end_session(self) -> None:
        session, self.session = self.session, None
        ended, self._session_ended = self._session_ended, None
        if session is not None:
            try:
                session.end()
            except Exception:
                log.exception("ending WebSocket session %s failed", self._wire.label)
        if ended is not None:
            ended()

    def keepalive(self) -> None:
        """A ping; when the previous one is still unanswered, 1011 instead."""
        if self._state != _OPEN:
            return
        if self._ping is not None:
            log.info("WebSocket %s closed with 1011: keepalive ping timeout", self._wire.label)
            self._send_control(self._wire.fail(1011, "keepalive ping timeout"))
            return
        self._ping = os.urandom(4)
        self.writer.send_bytes(self._wire.ping(self._ping))


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _phrase(status: int) -> str:
    with contextlib.suppress(ValueError):
        return http.HTTPStatus(status).phrase
    return ""
