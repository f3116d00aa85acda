"""One keep-alive HTTP/1.1 connection of the standard library's ``http.client``, for the
consumers' blocking calls: the Spark connector's range reads and the blocking client's HTTP
calls (``consumers/client/_http_call.py``).

Role: a blocking caller does not need an event loop to make a call. ``http.client`` sends a
request and reads its answer's whole body with a few calls from the caller's own thread, where
httpx's asyncio client, driven from a loop thread, costs about three times the CPU a call
(a recorder's insert: 1,297 against 409 µs of client CPU) and receives a large body (megabytes
of Arrow) in 64 KiB pieces through its HTTP/1.1 parser, about five times the CPU per row.

Invariants: calls on one connection never overlap (a lock makes them wait for each other);
every call has a timeout; a connection the broker closed while it was idle (its socket readable
before a request: the broker's FIN) is replaced before the request is sent; a call that still
finds the reused connection closed with no answer is sent again on a new connection only when
it changes nothing (a GET): a write is never repeated here, it fails (the broker may have done
it). A failure to connect is ``ConnectFailed``, so a caller can tell "not received" apart.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass


class ConnectFailed(OSError):
    """No connection could be made (refused, unreachable): the request was not sent."""


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


def split_base(base_url: str) -> tuple[bool, str, int | None, str]:
    """``(https, host, port, path)`` of an ``http://`` or ``https://`` base URL."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{base_url!r} must be http://host:port or https://host:port")
    return parts.scheme == "https", parts.hostname, parts.port, parts.path.rstrip("/")


class KeepAliveConnection:
    """One keep-alive connection to ``base_url`` (see the module docstring); ``ssl_context`` is
    called once, when the first ``https://`` connection is opened."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float,
                 ssl_context: Callable[[], ssl.SSLContext]) -> None:
        self._https, self.host, self._port, self.base_path = split_base(base_url)
        self._headers = headers
        self._timeout_s = timeout_s
        self._ssl_context = ssl_context
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def exchange(self, method: str, target: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> HttpAnswer:
        """The answer to ``method target`` (``target``: the path under the base URL, with its
        query). Raises ``ConnectFailed``, ``TimeoutError``, another ``OSError`` or
        ``http.client.HTTPException``; the connection is dropped after any of them."""
        sent_headers = {**self._headers, **headers} if headers else self._headers
        with self._lock:
            try:
                return self._exchange(method, f"{self.base_path}{target}", body, sent_headers)
            except BaseException:
                self._drop()
                raise

    def _exchange(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> HttpAnswer:
        connection = self._connection
        if connection is not None and connection.sock is not None and _closed_by_peer(connection.sock):
            self._drop()
        reused = self._connection is not None and self._connection.sock is not None
        try:
            return self._send(method, target, body, headers)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if not reused or method != "GET":
                raise
            self._drop()  # the broker closed the idle connection as the read went out: a new one, once
            return self._send(method, target, body, headers)

    def _send(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> HttpAnswer:
        connection = self._connect()
        connection.request(method, target, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        if response.will_close:
            self._drop()
        return HttpAnswer(response.status, response.reason, response.getheaders(), data)

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            if self._https:
                self._connection = http.client.HTTPSConnection(self.host, self._port, timeout=self._timeout_s,
                                                               context=self._ssl_context())
            else:
                self._connection = http.client.HTTPConnection(self.host, self._port, timeout=self._timeout_s)
        if self._connection.sock is None:
            try:
                self._connection.connect()
            except TimeoutError:
                raise
            except OSError as exc:  # refused, unreachable, or a TLS handshake refused
                raise ConnectFailed(exc.errno, f"{self.host}:{self._port}: {exc}") from exc
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether an idle connection's socket is readable: the broker closed it (an idle HTTP/1.1
    connection has nothing else to read)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
