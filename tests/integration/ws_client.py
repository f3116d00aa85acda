"""A WebSocket client written the way Pulsar's WebSocket documentation shows it.

JSON frames, base64 payloads, acknowledgement by ``messageId``. Nothing here knows Magnetar's
internals, so the tests that use it prove a Pulsar user's script works unchanged.
"""

from __future__ import annotations

import base64
import json
import ssl
from typing import Any

from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

RECV_TIMEOUT_S = 10.0
QUIET_TIMEOUT_S = 0.5


def ws_base(http_url: str) -> str:
    """``ws://`` for an ``http://`` URL, ``wss://`` for an ``https://`` one."""
    return "ws" + http_url.removeprefix("http")


def open_ws(url: str, ssl_context: ssl.SSLContext | None = None, /, **headers: str) -> ClientConnection:
    """A session on ``url`` (``wss://`` ones trusting ``ssl_context``), with ``headers``."""
    return connect(url, additional_headers=headers or None, open_timeout=RECV_TIMEOUT_S, max_size=16 * 1024 * 1024,
                   ssl=ssl_context if url.startswith("wss://") else None)


def send_frame(ws: ClientConnection, frame: dict[str, Any]) -> None:
    ws.send(json.dumps(frame))


def recv_frame(ws: ClientConnection, timeout_s: float = RECV_TIMEOUT_S) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(ws.recv(timeout=timeout_s))
    return frame


def recv_nothing(ws: ClientConnection, timeout_s: float = QUIET_TIMEOUT_S) -> bool:
    """True when no frame arrives within ``timeout_s`` (used only to check that nothing comes)."""
    try:
        ws.recv(timeout=timeout_s)
    except TimeoutError:
        return True
    return False


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def produce(ws: ClientConnection, payloads: list[bytes | str], **fields: Any) -> list[dict[str, Any]]:
    """Send every payload (pipelined) and return the results in order."""
    for index, payload in enumerate(payloads):
        send_frame(ws, {"payload": b64(payload), "context": str(index), **fields})
    return [recv_frame(ws) for _ in payloads]


def receive(ws: ClientConnection, count: int, *, ack: bool = True) -> list[dict[str, Any]]:
    messages = []
    for _ in range(count):
        message = recv_frame(ws)
        messages.append(message)
        if ack:
            send_frame(ws, {"messageId": message["messageId"]})
    return messages


def refused_status(url: str, ssl_context: ssl.SSLContext | None = None, /,
                   **headers: str) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body with which the server refuses a WebSocket upgrade."""
    try:
        with open_ws(url, ssl_context, **headers):
            pass
    except InvalidStatus as exc:
        body: dict[str, Any] = json.loads(bytes(exc.response.body or b"{}") or b"{}")
        return exc.response.status_code, body
    raise AssertionError(f"the upgrade to {url} was accepted")
