"""One WebSocket session (producer, consumer or reader) of the asyncio client.

Role: open the connection (with the ``Authorization: Bearer`` header; ``wss://`` with the
client's TLS context), turn a refused upgrade
into ``ConnectError`` carrying the broker's ``{code, message}``, run one task that reads every
frame and hands it to the owner's ``on_frame``, and remember why the session ended.

Invariants: ``on_frame`` runs on the event loop, one frame at a time, in arrival order; while it
waits (a full receive queue) no further frame is read, so TCP pushes back on the broker. When the
frame loop ends, for whatever reason, ``on_end`` runs exactly once with a ``ConnectionClosed``
that says whether we closed it (``by_client``) or it broke (cause chained); every later call
raises that error. ``close()`` is bounded by ``CLOSE_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed as WsConnectionClosed
from websockets.exceptions import InvalidHandshake, InvalidStatus

from consumers.client.errors import ClientError, ConnectError, ConnectionClosed

WS_FRAME_BYTES_MAX = 16 * 1024 * 1024  # a 5 MiB message is ~7 MiB of base64 JSON
OPEN_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
REFUSAL_TEXT_MAX = 500
RECONNECT_CLOSE_CODES = frozenset({1001, 1006, 1011, 1012, 1013})
"""Close codes after which a session may be opened again: going away, a broken connection,
an internal error or missed keepalive, a service restart (the topic moved), try again later.
A policy refusal (1008), a normal closure or a deleted topic are final."""
PING_INTERVAL_S = 5.0
PING_TIMEOUT_S = 10.0
"""Keepalive: a broker that answers no ping for this long (stopped, partitioned) is given up,
so a session on it can reconnect to the topic's next owner."""


def ws_url(service_url: str, path: str, query: dict[str, Any]) -> str:
    """``ws(s)://host/path?query`` from an ``http(s)://`` service URL; None values are left out."""
    base = service_url.rstrip("/")
    if base.startswith("http"):
        base = "ws" + base[len("http"):]
    params = {k: _query_value(v) for k, v in query.items() if v is not None}
    return f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def open_connection(url: str, token: str | None, ssl_context: ssl.SSLContext | None = None) -> ClientConnection:
    """A session on ``url``; a ``wss://`` one is reached with ``ssl_context`` (``consumers/tls.py``)."""
    try:
        return await connect(url, additional_headers=auth_headers(token) or None, max_size=WS_FRAME_BYTES_MAX,
                             open_timeout=OPEN_TIMEOUT_S, close_timeout=CLOSE_TIMEOUT_S, compression=None,
                             ping_interval=PING_INTERVAL_S, ping_timeout=PING_TIMEOUT_S,
                             ssl=ssl_context if url.startswith("wss://") else None)
    except InvalidStatus as exc:
        raise _refusal(exc) from None
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise ConnectError(0, "unreachable", f"{_without_query(url)}: {exc or type(exc).__name__}") from exc


def _without_query(url: str) -> str:
    return url.split("?", 1)[0]


def _refusal(exc: InvalidStatus) -> ConnectError:
    status = exc.response.status_code
    body = bytes(exc.response.body or b"")
    try:
        parsed = json.loads(body)
        return ConnectError(status, str(parsed["code"]), str(parsed["message"]))
    except (ValueError, KeyError, TypeError):
        return ConnectError(status, f"http_{status}", body.decode(errors="replace")[:REFUSAL_TEXT_MAX])


FrameHandler = Callable[[Any], Awaitable[None]]
EndHandler = Callable[[ConnectionClosed], None]
Connector = Callable[[], Awaitable[ClientConnection]]
"""Opens the session again (a lookup first); raises ``ClientError`` when it gives up."""


class Reconnection:
    """What a producer, consumer or reader made with a ``connector`` needs to open its session
    again after losing it: whether to (:meth:`wanted`), a ``ready`` event that callers wait on
    while it happens (bounded by the connector's own time), and the count of reconnections."""

    def __init__(self, connector: Connector | None) -> None:
        self._connector = connector
        self.ready = asyncio.Event()
        self.ready.set()
        self.task: asyncio.Task[None] | None = None
        self.closing = False
        self.count = 0

    def wanted(self, error: ConnectionClosed, session: Session) -> bool:
        return self._connector is not None and not error.by_client and not self.closing and session.may_reconnect

    def start(self, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.ready.clear()
        self.task = asyncio.get_running_loop().create_task(run())

    async def connect(self, lost: ConnectionClosed, give_up: EndHandler) -> ClientConnection | None:
        """A new connection; None once the connector gave up (``give_up(lost)`` has run)."""
        assert self._connector is not None
        try:
            ws = await self._connector()
        except ClientError as exc:
            lost.__cause__ = exc
            self.task = None
            give_up(lost)
            self.ready.set()
            return None
        self.count += 1
        return ws

    def finished(self) -> None:
        self.task = None
        self.ready.set()

    def close(self) -> None:
        self.closing = True
        if self.task is not None:
            self.task.cancel()


class Session:
    """One connection and the task reading its frames; the producer, consumer and reader own one."""

    def __init__(self, ws: ClientConnection, description: str, on_frame: FrameHandler, on_end: EndHandler) -> None:
        self._ws = ws
        self._description = description
        self._on_frame = on_frame
        self._on_end = on_end
        self._ended: ConnectionClosed | None = None
        self._closing = False
        self._close_expected = False
        self._reader = asyncio.get_running_loop().create_task(self._read_frames())

    @property
    def closed(self) -> bool:
        return self._ended is not None or self._closing

    @property
    def may_reconnect(self) -> bool:
        """The session ended in a way a new one may fix (``RECONNECT_CLOSE_CODES``)."""
        code = self._ws.close_code
        return code is None or code in RECONNECT_CLOSE_CODES

    def check_open(self) -> None:
        if self._ended is not None:
            raise self._ended
        if self._closing:
            raise ConnectionClosed(f"{self._description} is closed", by_client=True)

    async def send_json(self, frame: dict[str, Any]) -> None:
        self.check_open()
        try:
            await self._ws.send(json.dumps(frame, separators=(",", ":")))
        except WsConnectionClosed as exc:
            raise self._end(exc) from exc

    def expect_close(self, expected: bool) -> None:
        """The broker is about to end the session at our request (``unsubscribe``)."""
        self._close_expected = expected

    async def wait_ended(self, timeout_s: float) -> bool:
        """Wait (bounded) for the broker to end the session; True once it has."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), timeout_s)
        return self._reader.done()

    async def close(self) -> None:
        self._closing = True
        with contextlib.suppress(WsConnectionClosed, OSError, TimeoutError):
            await asyncio.wait_for(self._ws.close(), CLOSE_TIMEOUT_S)
        if not await self.wait_ended(CLOSE_TIMEOUT_S):
            self._reader.cancel()
        self._end(None)

    async def _read_frames(self) -> None:
        cause: BaseException | None = None
        try:
            async for raw in self._ws:
                await self._on_frame(json.loads(raw))
        except WsConnectionClosed as exc:
            cause = exc
        except Exception as exc:  # a frame that is not JSON, or one we cannot handle: the session is unusable
            cause = exc
        finally:
            self._end(cause)

    def _close_text(self) -> str:
        detail = f" {self._ws.close_reason}" if self._ws.close_reason else ""
        return f": closed by the broker (code {self._ws.close_code}{detail})"

    def _end(self, cause: BaseException | None) -> ConnectionClosed:
        if self._ended is None:
            if self._closing or self._close_expected:
                self._ended = ConnectionClosed(f"{self._description} is closed", by_client=True)
            else:
                reason = f": {cause}" if cause is not None else self._close_text()
                self._ended = ConnectionClosed(f"{self._description} lost its connection{reason}", by_client=False)
                self._ended.__cause__ = cause
            self._on_end(self._ended)
        return self._ended
