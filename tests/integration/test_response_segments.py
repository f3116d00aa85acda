"""A REST answer leaves the broker in one write: its head and its body in one TCP segment.

uvicorn writes a response's head and body in two calls; ``api/connection_guard.py``
(``CoalescedWrites``) holds the first until the second, so a client waits for one segment, not
two, for each small answer. Counted from the client's side of a real ``magnetar standalone``
connection, with the kernel's own per-connection counter (``TCP_INFO``'s ``tcpi_segs_in``)."""

from __future__ import annotations

import http.client
import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standalone import standalone_process

TCP_INFO_SEGS_IN_OFFSET = 140  # struct tcp_info (linux/tcp.h): u32 tcpi_segs_in after tcpi_segs_out
TCP_INFO_BYTES = 144
REQUESTS = 40
SEGMENTS_SLACK = 5
"""Segments beyond one an answer that the connection may see anyway (a window update, a
delayed acknowledgement of a request)."""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_process(Path(tmp_path_factory.mktemp("segments")) / "data") as (service_url, _):
        yield service_url


def segments_in(connection: http.client.HTTPConnection) -> int:
    assert connection.sock is not None
    info = connection.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_BYTES)
    value: int = struct.unpack_from("I", info, TCP_INFO_SEGS_IN_OFFSET)[0]
    return value


@pytest.mark.parametrize("path", ["/healthz", "/admin/v2/tenants"])
def test_each_answer_is_one_segment(url: str, path: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("GET", path)
    first = connection.getresponse()
    assert first.status == 200
    first.read()
    before = segments_in(connection)
    for _ in range(REQUESTS):
        connection.request("GET", path)
        response = connection.getresponse()
        assert response.status == 200
        json.loads(response.read())
    received = segments_in(connection) - before
    connection.close()
    assert received <= REQUESTS + SEGMENTS_SLACK, f"{received} segments for {REQUESTS} answers"
