"""A raw binary-protocol connection for tests: hand-built frames in, decoded commands out.

Built on the front end's own sans-I/O codec (``api/pulsar/framing.py``) and proto module, so a
test can send exactly the bytes it means (valid, truncated, corrupted) and read what the broker
answers, with bounded waits.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time

import crc32c

from api.pulsar.framing import FrameDecoder, command_frame
from api.pulsar.proto import pulsar_api_pb2 as pb

T = pb.BaseCommand.Type
READ_TIMEOUT_S = 10.0
FRAME_BYTES_MAX = 6 * 1024 * 1024


def command(kind: int, **bodies: object) -> pb.BaseCommand:
    """``command(T.PRODUCER, producer={...})``: a BaseCommand with its body from a dict."""
    built = pb.BaseCommand(type=kind)  # type: ignore[arg-type]
    for field, values in bodies.items():
        body = getattr(built, field)
        body.SetInParent()
        for name, value in values.items():  # type: ignore[attr-defined]
            if isinstance(value, dict):
                getattr(body, name).SetInParent()
                for inner, inner_value in value.items():
                    setattr(getattr(body, name), inner, inner_value)
            else:
                setattr(body, name, value)
    return built


def entry(payload: bytes, *, producer: str = "raw", sequence_id: int = 0, corrupt_checksum: bool = False) -> bytes:
    """A client's one-message entry: ``0x0e01``, CRC32C, metadata, payload."""
    metadata = (b"\x0a" + bytes([len(producer)]) + producer.encode() + b"\x10" + _varint(sequence_id)
                + b"\x18" + _varint(int(time.time() * 1000)))
    size = struct.pack(">I", len(metadata))
    checksum = crc32c.crc32c(size + metadata + payload) ^ (1 if corrupt_checksum else 0)
    return struct.pack(">HI", 0x0E01, checksum) + size + metadata + payload


def send_frame(producer_id: int, sequence_id: int, data: bytes) -> bytes:
    body: bytes = command(T.SEND, send={"producer_id": producer_id, "sequence_id": sequence_id}).SerializeToString()
    return struct.pack(">II", 4 + len(body) + len(data), len(body)) + body + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class RawConnection:
    def __init__(self, port: int, host: str = "127.0.0.1", *, ssl_context: ssl.SSLContext | None = None,
                 receive_buffer_bytes: int | None = None) -> None:
        """A connection to ``host:port``; over TLS (``pulsar+ssl://``) with ``ssl_context``.
        ``receive_buffer_bytes`` sets the socket's receive buffer before it connects (a small
        one makes a client that stops reading hold the broker back at once)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer_bytes is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        sock.settimeout(READ_TIMEOUT_S)
        sock.connect((host, port))
        self.sock = sock if ssl_context is None else ssl_context.wrap_socket(sock, server_hostname=host)
        self.decoder = FrameDecoder(FRAME_BYTES_MAX)
        self.pending: list[pb.BaseCommand] = []
        self.closed_by_peer = False

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_command(self, built: pb.BaseCommand) -> None:
        self.send(command_frame(built))

    def connect(self, protocol_version: int = 19, token: str | None = None, *,
                method: str | None = None) -> pb.BaseCommand:
        """CONNECT (with ``token``, or naming only the authentication ``method``, as ``tls``)."""
        body: dict[str, object] = {"client_version": "raw-test", "protocol_version": protocol_version}
        if token is not None:
            body.update(auth_method_name="token", auth_data=token.encode())
        elif method is not None:
            body.update(auth_method_name=method)
        self.send_command(command(T.CONNECT, connect=body))
        return self.expect(T.CONNECTED, T.ERROR)

    def next(self, timeout_s: float = READ_TIMEOUT_S) -> pb.BaseCommand | None:
        """The next command, None once the broker closed the connection (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no command from the broker in time")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed_by_peer = True
                return None
            self.pending.extend(frame.command for frame in self.decoder.feed(data))
        return self.pending.pop(0)

    def expect(self, *kinds: int) -> pb.BaseCommand:
        """The next command that is not a PING (answered), which must be one of ``kinds``."""
        while True:
            got = self.next()
            assert got is not None, f"the broker closed the connection instead of sending {kinds}"
            if got.type == T.PING:
                self.send_command(command(T.PONG, pong={}))
                continue
            assert got.type in kinds, f"expected {[T.Name(k) for k in kinds]}, got {T.Name(got.type)}"
            return got

    def closes(self, timeout_s: float = READ_TIMEOUT_S) -> bool:
        """True when the broker closes the connection (whatever it answered first)."""
        try:
            while self.next(timeout_s) is not None:
                pass
        except TimeoutError:
            return False
        return True
