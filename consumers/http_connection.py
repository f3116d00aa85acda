"""One keep-alive HTTP/1.1 connection, for the consumers' blocking calls: the Spark connector's
range reads and the blocking client's HTTP calls (``consumers/client/_http_call.py``).

Role: a blocking caller does not need an event loop to make a call. A request goes out in one
``sendall``; the answer is parsed by ``httptools`` (the C parser uvicorn serves the broker's HTTP
with) as it arrives, in reads of up to ``RECEIVE_BYTES`` (over TLS, of one record each). Against
httpx's asyncio client driven from a loop thread this costs a recorder's insert a fraction of the
client CPU (1,297 µs with httpx; 409 with the standard library's ``http.client``, a third of
which went to its header parsing by the ``email`` package), and a large answer (megabytes of
Arrow) goes through a parser written in C, not httpx's in Python.

Invariants: calls on one connection never overlap (a lock makes them wait for each other);
every connect, read and write has a timeout (the name lookup before a connect is the system's,
as with ``http.client``); a connection the broker closed while it was idle (its socket
readable before a request: the broker's FIN) is replaced before the request is sent; a call that
still finds the reused connection closed before any byte of an answer is sent again on a new
connection only when it changes nothing (a GET): a write is never repeated here, it fails (the
broker may have done it). A failure to connect is ``ConnectFailed``, so a caller can tell "not
received" apart; an answer cut short is ``ConnectionLost``; one that is not HTTP is
``ProtocolError`` (an interim 1xx answer and an upgrade among them: the client asks for
neither). An answer with neither a length nor chunks ends when the broker closes the
connection. A connection is kept only while both sides say keep-alive.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import httptools

RECEIVE_BYTES = 1 << 20
"""Bytes one read of an answer's body without a length (chunks, or up to the close) asks the
socket for."""
HEAD_RECEIVE_BYTES = 64 * 1024
"""Bytes one read asks for until an answer's head is parsed: a small answer whole, a large one's
head and its first bytes (``sock.recv`` allocates what it asks for before it reads)."""
BODY_PREALLOCATED_BYTES_MAX = 64 * 1024 * 1024
"""The largest body read straight into one buffer of its declared length; a longer one is read
through the parser as it arrives (its length is the broker's word, not yet its bytes)."""


class ConnectFailed(OSError):
    """No connection could be made (refused, unreachable, TLS refused): the request was not sent."""


class ConnectionLost(ConnectionResetError):
    """The broker closed the connection before the whole answer arrived (``nothing_received``:
    before any byte of it)."""

    def __init__(self, message: str, *, nothing_received: bool) -> None:
        super().__init__(message)
        self.nothing_received = nothing_received


class ProtocolError(OSError):
    """The answer is not HTTP/1.1 this client can read."""


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def split_base(base_url: str) -> tuple[bool, str, int | None, str, str]:
    """``(https, host, port, path, host header)`` of an ``http://`` or ``https://`` base URL
    (the header keeps an IPv6 literal's brackets: ``[::1]:8080``)."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{base_url!r} must be http://host:port or https://host:port")
    return parts.scheme == "https", parts.hostname, parts.port, parts.path.rstrip("/"), parts.netloc.rpartition("@")[2]


class _Answer:
    """``httptools``' callbacks for one answer."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []
        self.head_done = False
        self.keep_alive = False
        self.delimited = False
        """The answer says where its body ends (a length, or chunks); else the connection's close does."""
        self.length: int | None = None
        """The body's length when one ``Content-Length`` alone gives it (None: chunks, or none)."""
        self.done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:  # a chunked answer's trailers are not headers
            lowered = name.lower()
            if lowered in (b"content-length", b"transfer-encoding"):
                length_given = lowered == b"content-length" and not self.delimited and value.strip().isdigit()
                self.length = int(value) if length_given else None
                self.delimited = True
            self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # known from the head (asked later, it is reset)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class KeepAliveConnection:
    """One keep-alive connection to ``base_url`` (see the module docstring); ``ssl_context`` is
    called when an ``https://`` connection is opened."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float,
                 ssl_context: Callable[[], ssl.SSLContext]) -> None:
        https, self.host, port, self.base_path, host_header = split_base(base_url)
        self._https = https
        self._port = port if port is not None else (443 if https else 80)
        self._headers = {"host": host_header, **{name.lower(): value for name, value in headers.items()}}
        self._head = _head_lines(self._headers)
        self._timeout_s = timeout_s
        self._ssl_context = ssl_context
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def exchange(self, method: str, target: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> HttpAnswer:
        """The answer to ``method target`` (``target``: the path under the base URL, with its
        query). Raises ``ConnectFailed``, ``TimeoutError``, ``ConnectionLost``,
        ``ProtocolError`` or another ``OSError``; the connection is dropped after any of them."""
        request = self._request(method, f"{self.base_path}{target}", body, headers)
        with self._lock:
            try:
                return self._exchange(method, request)
            except BaseException:
                self._drop()
                raise

    def _request(self, method: str, target: str, body: bytes | None, headers: dict[str, str] | None) -> bytes:
        lines = self._head if not headers else _head_lines(
            {**self._headers, **{name.lower(): value for name, value in headers.items()
                                 if name.lower() != "content-length"}})  # a call's own win; the length is ours
        head = [f"{method} {target} HTTP/1.1\r\n", lines]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"content-length: {0 if body is None else len(body)}\r\n")
        head.append("\r\n")
        data = "".join(head).encode("latin-1")
        return data + body if body else data

    def _exchange(self, method: str, request: bytes) -> HttpAnswer:
        self._drop_if_closed_by_peer()
        reused = self._sock is not None
        try:
            return self._send(method, request)
        except (ConnectionResetError, BrokenPipeError) as exc:  # ConnectionLost among them
            answered = isinstance(exc, ConnectionLost) and not exc.nothing_received
            if not reused or method != "GET" or answered:
                raise
            self._drop()  # the broker closed the idle connection as the read went out: a new one, once
            return self._send(method, request)

    def send(self, method: str, target: str, headers: dict[str, str] | None = None) -> None:
        """The first half of a call without a body, for a caller that owns this connection: the
        request goes out now and :meth:`receive` reads its answer later (between the two, the
        broker works on it while the caller does something else). Raises as :meth:`exchange`
        does; the connection is dropped after any error."""
        request = self._request(method, f"{self.base_path}{target}", None, headers)
        try:
            self._drop_if_closed_by_peer()
            self._connect().sendall(request)
        except BaseException:
            self._drop()
            raise

    def receive(self, method: str) -> HttpAnswer:
        """The answer to the request :meth:`send` sent (a reused connection the broker closed
        meanwhile is ``ConnectionLost``: nothing is sent again here)."""
        if self._sock is None:
            raise ConnectionLost("no request is waiting for its answer", nothing_received=True)
        try:
            return self._receive(method, self._sock)
        except BaseException:
            self._drop()
            raise

    def _send(self, method: str, request: bytes) -> HttpAnswer:
        sock = self._connect()
        sock.sendall(request)
        return self._receive(method, sock)

    def _receive(self, method: str, sock: socket.socket) -> HttpAnswer:
        answer = _Answer()
        parser = answer.parser
        received = False
        while not answer.done:
            data = sock.recv(RECEIVE_BYTES if answer.head_done else HEAD_RECEIVE_BYTES)
            if not data:
                if answer.head_done and not answer.delimited:  # a body that ends with the connection
                    self._drop()
                    break
                raise ConnectionLost("the broker closed the connection before the whole answer",
                                     nothing_received=not received)
            received = True
            try:
                parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                raise ProtocolError(f"{self.host}:{self._port}: {exc!r}") from exc
            if answer.head_done and parser.get_status_code() < 200:
                raise ProtocolError(f"{self.host}:{self._port}: an interim answer "
                                    f"{parser.get_status_code()} to a request that asked for none")
            if method == "HEAD" and answer.head_done:
                self._drop()  # no body follows; the parser would wait for one
                break
            if answer.head_done and not answer.done and answer.length is not None and \
                    answer.length <= BODY_PREALLOCATED_BYTES_MAX:
                answer.chunks = [_rest_of_body(sock, answer.chunks, answer.length)]
                answer.done = True
                if isinstance(sock, ssl.SSLSocket) and sock.pending():  # bytes past the body, read and
                    self._drop()  # decrypted already, which no poll sees: the connection is not reused
        status = parser.get_status_code()
        if not answer.keep_alive or not (answer.delimited or status in (204, 304)):
            self._drop()
        body = answer.chunks[0] if len(answer.chunks) == 1 else b"".join(answer.chunks)
        return HttpAnswer(status, answer.headers, body)

    def _connect(self) -> socket.socket:
        if self._sock is None:
            try:
                sock = socket.create_connection((self.host, self._port), timeout=self._timeout_s)
            except TimeoutError:
                raise
            except OSError as exc:
                raise ConnectFailed(exc.errno, f"{self.host}:{self._port}: {exc}") from exc
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._https:
                    sock = self._ssl_context().wrap_socket(sock, server_hostname=self.host)
            except TimeoutError:
                sock.close()
                raise
            except OSError as exc:  # a TLS handshake refused
                sock.close()
                raise ConnectFailed(exc.errno, f"{self.host}:{self._port}: {exc}") from exc
            self._sock = sock
        return self._sock

    def _drop_if_closed_by_peer(self) -> None:
        """Before a request: a kept connection the broker closed while it was idle is replaced."""
        if self._sock is not None and _closed_by_peer(self._sock):
            self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _rest_of_body(sock: socket.socket, received: list[bytes], length: int) -> bytes:
    """A body of ``length`` bytes, of which ``received`` came with the head: the rest read
    straight into one buffer (the parser would copy each read's bytes into a chunk of its own,
    and the chunks be joined: for a range read's megabytes of Arrow, six times the client CPU
    of these reads)."""
    body = bytearray(length)
    view = memoryview(body)
    got = 0
    for chunk in received:
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    while got < length:
        count = sock.recv_into(view[got:])
        if not count:
            raise ConnectionLost("the broker closed the connection before the whole answer", nothing_received=False)
        got += count
    view.release()
    return bytes(body)


def _head_lines(headers: dict[str, str]) -> str:
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether an idle connection's socket is readable: the broker closed it (an idle HTTP/1.1
    connection has nothing else to read)."""
    poller = select.poll()  # not select(): a process may hold descriptors past FD_SETSIZE
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True
