"""Oversized WebSocket frames against a real uvicorn server: an answer or a reasoned close, never a drop.

Checks: a message over the broker's 5 MiB bound in a frame within the frame bound
(``webSocketMaxTextFrameSize``, 8 MiB) is answered with ``send-error`` and the session goes on;
a frame over the frame bound, sent whole or only declared in a frame header (2^62 bytes), is
answered with a close frame carrying 1009 and its reason, logged once at warning, and the
server keeps serving; the bound is a ``standalone.conf`` key.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from api.config import StandaloneConfig
from api.limits import MIB, EdgeLimits
from broker.service import BrokerService
from tests.integration.server import running_server, stored
from tests.integration.ws_client import open_ws, produce, recv_frame, send_frame, ws_base

PRODUCER_PATH = "/ws/v2/producer/persistent/public/default/big"
FRAME_BYTES_MAX = EdgeLimits().ws_frame_bytes_max
MESSAGE_BYTES_MAX = 5 * MIB
SOCKET_TIMEOUT_S = 30.0
PROTOCOL_LOGGER = "api.ws.protocol"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, BrokerService]]:
    with running_server(str(tmp_path / "data")) as (url, service):
        service.namespaces.set_policy("public/default", "retention_policies",
                                      {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
        yield ws_base(url), service


def frame_text(payload_bytes: int) -> str:
    return json.dumps({"payload": base64.b64encode(b"x" * payload_bytes).decode(), "context": "big"})


def oversize_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == PROTOCOL_LOGGER and r.levelno == logging.WARNING]


def test_a_message_over_the_size_bound_in_a_frame_within_the_frame_bound_gets_send_error(
        server: tuple[str, BrokerService]) -> None:
    url, service = server
    text = frame_text(MESSAGE_BYTES_MAX + 512 * 1024)
    assert len(text) < FRAME_BYTES_MAX
    with open_ws(f"{url}{PRODUCER_PATH}") as ws:
        ws.send(text)
        refused = recv_frame(ws)
        assert refused["result"] == "send-error:8" and refused["errorCode"] == "message_too_large"
        assert "exceeds 5242880 bytes" in refused["errorMsg"] and refused["context"] == "big"
        assert [r["result"] for r in produce(ws, ["after"])] == ["ok"]  # the session goes on
    assert stored(service, "big") == [b"after"]


def test_a_frame_over_the_frame_bound_is_closed_with_1009_and_its_reason_logged_once(
        server: tuple[str, BrokerService], caplog: pytest.LogCaptureFixture) -> None:
    url, service = server
    text = frame_text(6 * MIB)
    assert len(text) > FRAME_BYTES_MAX
    with caplog.at_level(logging.WARNING, logger=PROTOCOL_LOGGER), open_ws(f"{url}{PRODUCER_PATH}") as ws:
        with pytest.raises(ConnectionClosedError) as closed:
            ws.send(text)
            ws.recv(timeout=SOCKET_TIMEOUT_S)
        received = closed.value.rcvd
        assert received is not None and received.code == 1009
        assert f"exceeds limit of {FRAME_BYTES_MAX} bytes" in received.reason
    warnings = oversize_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert PRODUCER_PATH in warnings[0] and "1009" in warnings[0] and "webSocketMaxTextFrameSize" in warnings[0]
    with open_ws(f"{url}{PRODUCER_PATH}") as ws:  # the server goes on serving
        send_frame(ws, {"payload": base64.b64encode(b"small").decode()})
        assert recv_frame(ws)["result"] == "ok"
    assert stored(service, "big") == [b"small"]


def _handshake(url: str) -> tuple[socket.socket, ClientProtocol]:
    """A raw TCP connection upgraded to WebSocket with websockets' sans-I/O client."""
    uri = parse_uri(url)
    client = ClientProtocol(uri, max_size=None)
    sock = socket.create_connection((uri.host, uri.port), timeout=SOCKET_TIMEOUT_S)
    client.send_request(client.connect())
    sock.sendall(b"".join(client.data_to_send()))
    while not any(isinstance(event, Response) for event in client.events_received()):
        client.receive_data(sock.recv(65536))
    assert client.handshake_exc is None
    return sock, client


def _close_received(sock: socket.socket, client: ClientProtocol) -> Close:
    """Read until the server's close frame arrives (or the connection ends without one)."""
    while True:
        for event in client.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                return Close.parse(event.data)
        data = sock.recv(65536)
        if not data:
            raise AssertionError("the server closed the connection without a close frame")
        client.receive_data(data)


def test_a_frame_header_declaring_any_size_is_closed_without_reading_the_payload(
        server: tuple[str, BrokerService], caplog: pytest.LogCaptureFixture) -> None:
    url, _ = server
    declared_bytes = 2**62
    with caplog.at_level(logging.WARNING, logger=PROTOCOL_LOGGER):
        sock, client = _handshake(f"{url}{PRODUCER_PATH}")
        with sock:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, declared_bytes) + b"\x00\x00\x00\x00"  # FIN text, masked
            sock.sendall(header + b"x" * (4 * MIB))  # a start of the payload, more than the socket buffers hold
            close = _close_received(sock, client)
    assert close.code == 1009 and f"frame with {declared_bytes} bytes exceeds limit" in close.reason
    assert len(oversize_warnings(caplog)) == 1


def test_the_frame_bound_is_a_standalone_conf_key() -> None:
    config = StandaloneConfig.load(None, {"webSocketMaxTextFrameSize": str(16 * MIB)})
    assert config.limits.ws_frame_bytes_max == 16 * MIB
