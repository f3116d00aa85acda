"""The blocking client's HTTP calls (``consumers/client/_http_call.py`` over
``consumers/http_connection.py``) against real HTTP servers on 127.0.0.1.

A connection the server closed while it was idle is replaced before the next call is sent, so a
write on it is received once and answered; a write whose answer is lost is never sent again (it
fails as unreachable; the server saw it once), while a read is sent again once on a new
connection; a call that timed out is made again; a listed broker that refuses connections is
passed over for the next; a 307 is followed with the same method and body; the idle
connections kept are bounded and closed by ``close()``, after which a call is refused; chunked
and large answers are read whole, an answer saying ``connection: close`` closes the
connection, and an answer that is not HTTP fails the call.
"""

from __future__ import annotations

import http.server
import json
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from consumers import http_connection
from consumers.client._http_call import IDLE_CONNECTIONS_MAX, BlockingHttp
from consumers.client.errors import HttpError
from consumers.http_connection import BODY_PREALLOCATED_BYTES_MAX
from tests.standalone import free_port

Handler = Callable[[http.server.BaseHTTPRequestHandler, bytes], None]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handle: Handler) -> None:
        self.handle_call = handle
        self.calls: list[tuple[str, str, bytes]] = []
        self.connections = 0
        self.closed = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.closed.set()  # the connection's socket is closed now, not only its handler done


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1


    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.calls.append((self.command, self.path, body))
        self.server.handle_call(self, body)

    def do_GET(self) -> None:
        self._any()

    def do_POST(self) -> None:
        self._any()

    def answer(self, status: int = 200, body: bytes = b"{}", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextmanager
def serving(handle: Handler) -> Iterator[_Server]:
    server = _Server(handle)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def blocking(url: str) -> BlockingHttp:
    return BlockingHttp(url.split(","), None, 10.0, 1.0, lambda: pytest.fail("no TLS here"))


def test_a_connection_the_server_closed_while_idle_is_replaced_before_a_write_is_sent() -> None:
    """The server answers as keep-alive, then closes the connection: the next POST goes on a new
    connection, is received once and answered (before: it went out on the closed one and failed
    with the answer lost)."""
    def handle(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        request.answer(body=b'{"n": 1}')
        request.close_connection = True  # closed without saying so: the client still holds it

    with serving(handle) as server:
        client = blocking(_url(server))
        try:
            assert client.request("GET", "/first").json() == {"n": 1}
            assert server.closed.wait(10)
            (idle,) = [c for connections in client._idle.values() for c in connections]
            assert idle._sock is not None
            assert select.select([idle._sock], [], [], 10)[0], "the server's close did not reach the client"
            assert client.request("POST", "/write", json_body={"a": 1}).json() == {"n": 1}
        finally:
            client.close()
        assert server.calls == [("GET", "/first", b""), ("POST", "/write", b'{"a": 1}')]
        assert server.connections == 2


def test_a_write_whose_answer_is_lost_is_not_sent_again_but_a_read_is_once() -> None:
    dropped: set[str] = set()

    def handle(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        if request.path.startswith("/drop") and request.path not in dropped:
            dropped.add(request.path)
            request.close_connection = True  # read, then closed with no answer
            return
        request.answer()

    with serving(handle) as server:
        client = blocking(_url(server))
        try:
            client.request("GET", "/warm")  # the calls below go on a reused connection
            with pytest.raises(HttpError) as lost:
                client.request("POST", "/drop-write", json_body={"a": 1})
            assert lost.value.status == 0 and lost.value.code == "unreachable"
            client.request("GET", "/warm")
            assert client.request("GET", "/drop-read").status_code == 200
        finally:
            client.close()
        paths = [path for _, path, _ in server.calls]
        assert paths.count("/drop-write") == 1, paths
        assert paths.count("/drop-read") == 2, paths


def test_a_refusing_listed_broker_is_passed_over_and_a_307_is_followed_with_method_and_body() -> None:
    def owner(request: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        assert isinstance(request, _Handler)
        request.answer(body=json.dumps({"path": request.path, "body": body.decode()}).encode())

    with serving(owner) as target:
        def redirecting(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
            assert isinstance(request, _Handler)
            request.answer(307, b"", {"location": f"{_url(target)}/owner?x=1"})

        with serving(redirecting) as first:
            client = blocking(f"http://127.0.0.1:{free_port()},{_url(first)}")
            try:
                answer = client.request("POST", "/topic", json_body={"m": 2}, params={"p": 3}).json()
            finally:
                client.close()
            assert answer == {"path": "/owner?x=1", "body": '{"m": 2}'}
            assert first.calls == [("POST", "/topic?p=3", b'{"m": 2}')]


def test_a_call_answered_with_an_error_raises_the_brokers_code_and_message() -> None:
    def refusing(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        request.answer(409, b'{"code": "key_version_mismatch", "message": "moved", "currentKeyVersions": {"k": 2}}')

    with serving(refusing) as server:
        client = blocking(_url(server))
        try:
            with pytest.raises(HttpError) as refused:
                client.request("POST", "/topic", json_body={})
        finally:
            client.close()
        assert (refused.value.status, refused.value.code, refused.value.message) == (409, "key_version_mismatch",
                                                                                      "moved")
        assert refused.value.details == {"currentKeyVersions": {"k": 2}}


def test_idle_connections_are_bounded_and_closed_by_close() -> None:
    gate = threading.Barrier(IDLE_CONNECTIONS_MAX + 4)

    def held(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        if request.path == "/together":
            gate.wait(10)  # every call is in flight at once: each has a connection of its own
        request.answer()

    with serving(held) as server:
        client = blocking(_url(server))
        with ThreadPoolExecutor(IDLE_CONNECTIONS_MAX + 4) as pool:
            list(pool.map(lambda _: client.request("GET", "/together"), range(IDLE_CONNECTIONS_MAX + 4)))
        assert server.connections == IDLE_CONNECTIONS_MAX + 4
        for _ in range(IDLE_CONNECTIONS_MAX + 4):
            client.request("GET", "/again")
        assert server.connections == IDLE_CONNECTIONS_MAX + 4, "an idle connection was not taken again"
        idle = [c for connections in client._idle.values() for c in connections]
        assert len(idle) == IDLE_CONNECTIONS_MAX
        client.close()
        assert all(c._sock is None for c in idle)
        with pytest.raises(RuntimeError, match="closed"):
            client.request("GET", "/again")


def test_answers_chunked_large_or_closing_are_read_whole_and_a_non_http_answer_is_an_error() -> None:
    big = bytes(range(256)) * (5 * 4096 + 7)  # 5 MiB and more, over several reads

    def varied(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        if request.path == "/chunked":
            request.send_response(200)
            request.send_header("transfer-encoding", "chunked")
            request.end_headers()
            for piece in (b'{"a": ', b'"chunked"', b"}"):
                request.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            request.wfile.write(b"0\r\n\r\n")
        elif request.path == "/big":
            request.answer(body=big, headers={"x-size": str(len(big))})
        elif request.path == "/closing":
            request.answer(headers={"connection": "close"})
            request.close_connection = True
        else:
            request.wfile.write(b"SPAM\r\n\r\n")
            request.close_connection = True

    with serving(varied) as server:
        client = blocking(_url(server))
        try:
            assert client.request("GET", "/chunked").json() == {"a": "chunked"}
            answer = client.request("GET", "/big")
            assert answer.content == big and answer.headers["x-size"] == str(len(big))
            assert server.connections == 1
            client.request("GET", "/closing")
            idle = [c for connections in client._idle.values() for c in connections]
            assert [c._sock for c in idle] == [None]  # "connection: close" heeded, not found out later
            client.request("GET", "/chunked")
            assert server.connections == 2
            with pytest.raises(HttpError) as garbled:
                client.request("GET", "/garbled")
            assert garbled.value.status == 0 and garbled.value.code == "unreachable"
        finally:
            client.close()


def test_a_calls_own_header_replaces_the_clients_and_is_sent_once() -> None:
    """An Arrow read's ``accept`` replaces the client's ``*/*`` (before: both went out, and the
    broker answered the first, JSON, to a reader of Arrow)."""
    def echo(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        request.answer(body=json.dumps(request.headers.get_all("accept")).encode())

    with serving(echo) as server:
        client = blocking(_url(server))
        try:
            assert client.request("GET", "/x").json() == ["*/*"]
            assert client.request("GET", "/x", headers={"Accept": "application/vnd.apache.arrow.stream"}).json() == [
                "application/vnd.apache.arrow.stream"]
        finally:
            client.close()


def test_a_write_that_timed_out_is_made_again_and_its_second_answer_returned() -> None:
    """No answer within the timeout: the write is made again after a wait, as the asyncio client
    makes it (the recorders' writes carry a producer name and sequence id, so the broker answers
    a resend with the first attempt's results); the second answer is the call's."""
    release = threading.Event()

    def slow_first(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        if len(request.server.calls) == 1:
            release.wait(30)  # the first answer comes after the client gave up on it
        request.answer(body=json.dumps({"attempt": len(request.server.calls)}).encode())

    with serving(slow_first) as server:
        client = BlockingHttp([_url(server)], None, 0.5, 30.0, lambda: pytest.fail("no TLS here"))
        try:
            assert client.request("POST", "/write", json_body={"a": 1}).json() == {"attempt": 2}
        finally:
            release.set()
            client.close()
        assert [path for _, path, _ in server.calls] == ["/write", "/write"]


def test_odd_answers_are_read_as_http_says() -> None:
    """A body ending with the connection (no length, no chunks) is the answer, not a lost one; a
    header byte outside ASCII does not fail the call; an interim 100 the client never asked for is
    refused as not HTTP it can read."""
    def odd(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        if request.path == "/until-close":
            request.send_response(200)
            request.end_headers()
            request.wfile.write(b'{"to": "the end"}')
            request.close_connection = True
        elif request.path == "/latin":
            request.send_response(200)
            request.send_header("x-name", "café")  # sent as latin-1: one byte past ASCII
            request.send_header("content-length", "2")
            request.end_headers()
            request.wfile.write(b"{}")
        else:
            request.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.answer()

    with serving(odd) as server:
        client = blocking(_url(server))
        try:
            assert client.request("GET", "/until-close").json() == {"to": "the end"}
            latin = client.request("GET", "/latin")
            assert latin.json() == {} and latin.headers["x-name"] == "café"
            with pytest.raises(HttpError) as interim:
                client.request("GET", "/interim")
            assert interim.value.code == "unreachable" and "interim" in interim.value.message
        finally:
            client.close()


def test_headers_name_an_ipv6_broker_with_brackets_and_a_callers_headers_merge_without_case() -> None:
    def echo(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        assert isinstance(request, _Handler)
        request.answer(body=json.dumps({"host": request.headers.get_all("host"),
                                        "type": request.headers.get_all("content-type"),
                                        "length": request.headers.get_all("content-length")}).encode())

    class _Server6(_Server):
        address_family = socket.AF_INET6

        def __init__(self, handle: Handler) -> None:
            self.handle_call = handle
            self.calls = []
            self.connections = 0
            self.closed = threading.Event()
            http.server.ThreadingHTTPServer.__init__(self, ("::1", 0), _Handler)

    server = _Server6(echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        client = blocking(f"http://[::1]:{port}")
        try:
            answer = client.request("POST", "/x", json_body={"a": 1},
                                    headers={"Content-Type": "application/merge-patch+json", "Content-Length": "99"})
        finally:
            client.close()
        assert answer.json() == {"host": [f"[::1]:{port}"], "type": ["application/merge-patch+json"],
                                 "length": ["8"]}
    finally:
        server.shutdown()
        server.server_close()


def test_keep_alive_holds_in_a_process_with_descriptors_past_fd_setsize() -> None:
    """The idle check works for a socket numbered past 1024 (before: ``select`` refused it, the
    connection was taken for closed, and every call opened a new one)."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with serving(lambda request, _body: request.answer()) as server:  # type: ignore[attr-defined]
            client = blocking(_url(server))
            try:
                for _ in range(3):
                    client.request("GET", "/x")
            finally:
                client.close()
            assert server.connections == 1
    finally:
        for fd in held:
            os.close(fd)


@pytest.mark.parametrize("preallocated_max", [BODY_PREALLOCATED_BYTES_MAX, 1000])
def test_a_body_of_a_given_length_is_read_whole_into_one_buffer_or_through_the_parser(
        preallocated_max: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body whose one ``Content-Length`` gives its length is read straight into a buffer of
    that length (up to ``BODY_PREALLOCATED_BYTES_MAX``; past it, through the parser as it
    arrives): the same bytes, in pieces written slowly or at once, the connection kept for the
    next answer; cut short by the server, it is ``ConnectionLost``, not a short body."""
    monkeypatch.setattr(http_connection, "BODY_PREALLOCATED_BYTES_MAX", preallocated_max)
    big = os.urandom(3 * 65536 + 11)
    read_into_one_buffer = []
    rest_of_body = http_connection._rest_of_body

    def counted(sock: socket.socket, received: list[bytes], length: int) -> bytes:
        read_into_one_buffer.append(length)
        return rest_of_body(sock, received, length)

    monkeypatch.setattr(http_connection, "_rest_of_body", counted)

    def pieces(request: http.server.BaseHTTPRequestHandler, _body: bytes) -> None:
        if request.path == "/cut":
            request.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + big[:70000])
            request.wfile.flush()
            request.close_connection = True
            return
        request.send_response(200)
        request.send_header("content-length", str(len(big)))
        request.end_headers()
        if request.path == "/slow":
            for start in range(0, len(big), 50000):
                request.wfile.write(big[start:start + 50000])
                request.wfile.flush()
        else:
            request.wfile.write(big)

    with serving(pieces) as server:
        connection = http_connection.KeepAliveConnection(_url(server), {}, 10.0, lambda: pytest.fail("no TLS here"))
        try:
            for path in ("/slow", "/at-once", "/slow"):
                answer = connection.exchange("GET", path)
                assert answer.status == 200 and answer.body == big and type(answer.body) is bytes
            assert server.connections == 1
            with pytest.raises(http_connection.ConnectionLost) as lost:
                connection.exchange("GET", "/cut")
            assert not lost.value.nothing_received
            assert read_into_one_buffer == ([len(big)] * 3 + [100000] if preallocated_max > len(big) else [])
        finally:
            connection.close()
