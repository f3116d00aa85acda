"""Every HTTP request: who is calling, before anything else is read.

Role: an ASGI middleware in front of the routes. It authenticates the caller from the headers
(``api/auth.py``) once per request and leaves the outcome in the scope for the routes, then
applies the bounds of ``api/limits.py`` that need to know the caller:

- a request body is read only up to ``body_bytes_max`` for a known caller and up to
  ``unauthenticated_body_bytes_max`` (0 by default) for an unknown one with authentication on:
  a 200 MB body without a token is answered 401 from its headers, never read; a declared
  length over the bound is answered 413 before reading, an undeclared one as soon as it passes
  the bound; the body must arrive within ``body_timeout_ms`` (408);
- in-flight HTTP requests plus open WebSocket sessions per role are bounded by
  ``connections_per_role_max`` (429 ``too_many_connections``): ``RoleSlots``, which the
  WebSocket edge (``api/ws/server.py``) takes a slot of for each session it opens.

A refused request's answer must reach the client: closing a connection whose peer is still
sending makes the kernel reset it, and a reset can destroy the answer before the client reads
it. So a refused body of at most ``REFUSED_BODY_DRAIN_BYTES_MAX`` declared bytes is read and
dropped before the answer (within ``body_timeout_ms``); a larger one is answered at once, as
other servers do.

Invariants: the routes see a body only when it is complete and within its bound; a refused
request reaches no route; a role's slot is released when its request or session ends, however
it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import ANONYMOUS_ROLE, Authorizer, Principal, caller_outcome_key
from api.errors import PayloadTooLarge, RequestTimeout, TooManyConnections, error_bytes
from api.limits import REFUSED_BODY_DRAIN_BYTES_MAX, EdgeLimits
from broker import MagnetarError, Unauthorized


class RoleSlots:
    """In-flight HTTP requests plus open WebSocket sessions of each role, at most
    ``connections_per_role_max`` (with authentication on, for authenticated roles: ``role_of``).
    Used on the web service's event loop; a role holding nothing has no entry."""

    def __init__(self, authorizer: Authorizer, per_role_max: int) -> None:
        self._authorizer = authorizer
        self._per_role_max = per_role_max
        self._held: dict[str, int] = {}

    def role_of(self, outcome: Principal | MagnetarError) -> str | None:
        """The role whose slot a caller takes (None: not counted)."""
        if not self._authorizer.enabled or not isinstance(outcome, Principal) or outcome.role == ANONYMOUS_ROLE:
            return None
        return outcome.role

    def take(self, role: str) -> None:
        """One more for ``role``; ``TooManyConnections`` when it holds its whole share."""
        held = self._held.get(role, 0)
        if held >= self._per_role_max:
            raise TooManyConnections(f"role {role!r} already has {self._per_role_max} requests and sessions open")
        self._held[role] = held + 1

    def give_back(self, role: str) -> None:
        held = self._held.get(role, 0) - 1
        if held > 0:
            self._held[role] = held
        else:
            self._held.pop(role, None)

    def statistics(self) -> dict[str, int]:
        """In-flight requests and sessions per role."""
        return dict(self._held)


class RequestGuard:
    def __init__(self, app: ASGIApp, authorizer: Authorizer, limits: EdgeLimits, slots: RoleSlots) -> None:
        self.app = app
        self._authorizer = authorizer
        self._limits = limits
        self._slots = slots

    def statistics(self) -> dict[str, int]:
        """In-flight requests and sessions per role."""
        return self._slots.statistics()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outcome: Principal | MagnetarError
        try:
            outcome = self._authorizer.authenticate_headers(HTTPConnection(scope))
        except Unauthorized as exc:
            outcome = exc
        scope[caller_outcome_key()] = outcome
        role = self._slots.role_of(outcome)
        if role is not None:
            try:
                self._slots.take(role)
            except TooManyConnections as refusal:
                await _respond(send, refusal)
                return
        try:
            if _has_body(scope):
                await self._with_body(scope, receive, send, outcome)
            else:
                await self.app(scope, receive, send)
        finally:
            if role is not None:
                self._slots.give_back(role)

    async def _with_body(self, scope: Scope, receive: Receive, send: Send,
                         outcome: Principal | MagnetarError) -> None:
        known = isinstance(outcome, Principal)
        limit = self._limits.body_bytes_max if known else self._limits.unauthenticated_body_bytes_max
        declared = _content_length(scope)
        if (declared is not None and declared > limit) or (declared is None and limit == 0):
            if declared is not None and declared <= REFUSED_BODY_DRAIN_BYTES_MAX:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._limits.body_timeout_s):
                        await _drain_body(receive, REFUSED_BODY_DRAIN_BYTES_MAX)
            await _respond(send, outcome if isinstance(outcome, MagnetarError) else
                           PayloadTooLarge(f"the request body of {declared} bytes exceeds {limit} bytes"))
            return
        try:
            async with asyncio.timeout(self._limits.body_timeout_s):
                body = await _read_body(receive, limit)
        except TimeoutError:
            await _respond(send, RequestTimeout(f"the request body did not arrive within "
                                                f"{self._limits.body_timeout_ms} ms"))
            return
        if body is None:
            await _respond(send, outcome if isinstance(outcome, MagnetarError) else
                           PayloadTooLarge(f"the request body exceeds {limit} bytes"))
            return
        await self.app(scope, _replay(body, receive), send)


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it passes ``limit`` bytes (the rest is never read)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left
            return b"".join(parts)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _drain_body(receive: Receive, limit: int) -> None:
    """Read and drop the body (at most ``limit`` bytes of it)."""
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, when it comes

    return replayed


async def _respond(send: Send, error: MagnetarError) -> None:
    body = error_bytes(error)
    headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    start: dict[str, Any] = {"type": "http.response.start", "status": error.http_status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
