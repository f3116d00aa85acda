"""What a client that has not authenticated can make the broker hold, against a real
``magnetar standalone`` with token authentication on.

Before CONNECT a connection may buffer only a small frame, the sum over all such connections
is bounded, and a connection that has not completed its handshake in time is closed; the frame
decoder's work is linear in the bytes it receives, so a frame dripped a few bytes at a time
costs no more than one sent at once. Over HTTP, a request's line and headers are bounded
before the caller is known (``httpMaxRequestHeaderSize``): an endless head is answered 431.
RSS is read from the broker's ``/proc/PID/status``; latencies are measured by a second,
authenticated client.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.pulsar.proto import pulsar_api_pb2 as pb
from consumers.cli.tokens import create_token
from tests.integration.pulsar_support import binary_broker
from tests.integration.pulsar_wire import RawConnection, T, command
from tests.standalone import REPO_ROOT

SECRET = b"0123456789abcdef0123456789abcdef"
MIB = 1024 * 1024
FRAME_BYTES = 5 * MIB
"""A frame as large as the broker's biggest message."""
PARTIAL_CONNECTIONS = 300
PARTIAL_RSS_BYTES_MAX = 128 * MIB
"""What 300 connections holding all but the last bytes of a 5 MiB frame may add, in total."""
RSS_AFTER_CLOSE_BYTES_MAX = 64 * MIB
"""What may remain above the baseline once those connections closed."""
HANDSHAKE_TIMEOUT_MS = 1000
HANDSHAKE_BUFFER_BYTES = MIB
"""The budget of partial frames over all connections before their handshake, in this broker."""
HANDSHAKE_FRAME_BYTES = 64 * 1024
"""The default bound on a frame before the handshake."""
PING_ROUNDS = 400
ROUND_TRIP_S_MAX = 0.050
DRIPPERS = 16
DRIP_WARMUP_S = 1.0
DRIP_SECONDS = 6.0
"""Longer than the warm-up and the PING rounds (400 x about 5 ms)."""


class Broker:
    def __init__(self, http_url: str, port: int, pid: int) -> None:
        self.http_url = http_url
        self.port = port
        self.pid = pid

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS line")

    def cpu_s(self) -> float:
        """User plus system CPU time the broker used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    directory = tmp_path_factory.mktemp("preauth")
    secret = directory / "secret.key"
    secret.write_bytes(SECRET)
    config = directory / "standalone.conf"
    config.write_text(f"authenticationEnabled=true\ntokenSecretKey=file://{secret}\nsuperUserRoles=admin\n"
                      f"handshakeTimeoutMillis={HANDSHAKE_TIMEOUT_MS}\nmaxHandshakeBufferBytes={HANDSHAKE_BUFFER_BYTES}\n")
    with binary_broker(directory / "data", "--config", str(config)) as (http_url, pulsar_url, proc):
        yield Broker(http_url, int(pulsar_url.rsplit(":", 1)[1]), proc.pid)


def token(role: str) -> str:
    return create_token(role, secret_key=SECRET)


def frame_start(total_bytes: int) -> bytes:
    """The first bytes of a frame of ``total_bytes`` (its 4-byte size field included), with a
    CONNECT-sized command size."""
    return struct.pack(">II", total_bytes - 4, 64)


def settle_rss(broker: Broker, rounds: int = 10) -> int:
    """The broker's RSS once a few authenticated round trips went through (the loop has run)."""
    with RawConnection(broker.port) as conn:
        assert conn.connect(token=token("admin")).type == T.CONNECTED
        for _ in range(rounds):
            conn.send_command(command(T.PING, ping={}))
            conn.expect(T.PONG)
    time.sleep(0.5)
    return broker.rss_bytes()


def send_partial_frame(port: int) -> socket.socket:
    """A connection that sent all but the last 16 bytes of a 5 MiB frame, before any CONNECT
    (the broker may close it on the way: that is a refusal, and fine)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = bytes(FRAME_BYTES - 8 - 16)
    with contextlib.suppress(OSError):
        sock.sendall(frame_start(FRAME_BYTES) + body)
    return sock


def test_partial_frames_before_connect_hold_little_memory_and_release_it(broker: Broker) -> None:
    baseline = settle_rss(broker)
    sockets = [send_partial_frame(broker.port) for _ in range(PARTIAL_CONNECTIONS)]
    try:
        time.sleep(0.5)
        held = broker.rss_bytes() - baseline
        print(f"{PARTIAL_CONNECTIONS} partial 5 MiB frames before CONNECT: RSS +{held / MIB:.1f} MiB")
        assert held < PARTIAL_RSS_BYTES_MAX, f"+{held / MIB:.0f} MiB"
    finally:
        for sock in sockets:
            sock.close()
    after = settle_rss(broker) - baseline
    print(f"after they closed: RSS +{after / MIB:.1f} MiB over the baseline")
    assert after < RSS_AFTER_CLOSE_BYTES_MAX, f"+{after / MIB:.0f} MiB after the connections closed"


def ping_round_trips_s(port: int, rounds: int) -> list[float]:
    with RawConnection(port) as conn:
        assert conn.connect(token=token("admin")).type == T.CONNECTED
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            conn.send_command(command(T.PING, ping={}))
            conn.expect(T.PONG)
            times.append(time.perf_counter() - started)
            time.sleep(0.005)
        return times


@pytest.mark.parametrize("role", [None, "mallory"], ids=["unauthenticated", "authenticated"])
def test_a_slow_drip_leaves_other_clients_round_trips_short(broker: Broker, role: str | None) -> None:
    """``DRIPPERS`` connections (``dripper.py``, in its own process) each send most of a 5 MiB
    frame and drip the rest a few bytes at a time, without a token or after CONNECT with one;
    an authenticated client's PING round trips meanwhile stay short."""
    arguments = [str(broker.port), str(DRIPPERS), str(DRIP_SECONDS), *([token(role)] if role else [])]
    drip = subprocess.Popen([sys.executable, "-m", "tests.integration.dripper", *arguments], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(DRIP_WARMUP_S)  # the drip is under way (before the fix the decoder's copies grow with it)
        cpu_s, started_s = broker.cpu_s(), time.monotonic()
        times = ping_round_trips_s(broker.port, PING_ROUNDS)
        busy = (broker.cpu_s() - cpu_s) / (time.monotonic() - started_s)
        out, _ = drip.communicate(timeout=DRIP_SECONDS + 30)
    finally:
        if drip.poll() is None:
            drip.kill()
            drip.wait()
    dripped, connections = map(int, out.split())
    times.sort()
    print(f"{DRIPPERS} drippers ({role or 'no token'}): {dripped} bytes dripped over {connections} connections; "
          f"PING round trip p50 {times[len(times) // 2] * 1000:.1f} ms, "
          f"p99 {times[int(len(times) * 0.99)] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms; "
          f"broker at {busy:.0%} of a core")
    assert connections >= DRIPPERS
    if role is not None:
        assert dripped > 10_000, "the drip did not get going"
    assert times[-1] < ROUND_TRIP_S_MAX, f"max round trip {times[-1] * 1000:.0f} ms"


def test_a_frame_over_the_handshake_bound_closes_the_connection_from_its_header(broker: Broker) -> None:
    with RawConnection(broker.port) as conn:
        conn.send(frame_start(4 + HANDSHAKE_FRAME_BYTES + 1))  # its size field: one byte over the bound
        assert conn.closes(timeout_s=HANDSHAKE_TIMEOUT_MS / 1000 / 2)  # well before the handshake timeout


def test_a_connect_with_a_large_credential_fits_the_handshake_bound(broker: Broker) -> None:
    """A 40 KiB credential is read (and refused as a token, not as a frame): the bound leaves
    room for any token or other credential a client sends."""
    with RawConnection(broker.port) as conn:
        conn.send_command(command(T.CONNECT, connect={"client_version": "raw-test", "protocol_version": 19,
                                                       "auth_method_name": "token", "auth_data": b"x" * 40_000}))
        answer = conn.expect(T.ERROR, T.CONNECTED)
        assert answer.type == T.ERROR and answer.error.error == pb.AuthenticationError


def test_partial_frames_before_connect_share_one_budget(broker: Broker) -> None:
    """Connections each holding 60 KiB of a frame before CONNECT: the broker keeps at most the
    budget's worth and closes the others; a client that authenticates meanwhile is served."""
    partial = frame_start(4 + HANDSHAKE_FRAME_BYTES) + bytes(60 * 1024 - 8)
    count = 2 * HANDSHAKE_BUFFER_BYTES // len(partial)
    conns = [RawConnection(broker.port) for _ in range(count)]
    try:
        for conn in conns:
            conn.send(partial)
        with RawConnection(broker.port) as client:
            assert client.connect(token=token("admin")).type == T.CONNECTED
        open_ones = sum(1 for conn in conns if not conn.closes(timeout_s=0.05))
        print(f"{count} connections holding {len(partial)} bytes each: {open_ones} kept open")
        assert 0 < open_ones <= HANDSHAKE_BUFFER_BYTES // len(partial)
    finally:
        for conn in conns:
            conn.sock.close()


def test_a_connection_that_does_not_connect_in_time_is_closed(broker: Broker) -> None:
    """A silent connection, and one that PINGs (allowed before CONNECT) without ever sending
    CONNECT, are both closed at the handshake timeout."""
    timeout_s = HANDSHAKE_TIMEOUT_MS / 1000
    with RawConnection(broker.port) as silent, RawConnection(broker.port) as pinging:
        started = time.monotonic()
        while time.monotonic() - started < 5 * timeout_s:
            try:
                pinging.send_command(command(T.PING, ping={}))
                if pinging.next(timeout_s) is None:
                    break
            except OSError:
                pinging.closed_by_peer = True
                break
            time.sleep(0.1)
        pinging_open_s = time.monotonic() - started
        assert pinging.closed_by_peer, f"a connection that PINGs without CONNECT stayed open for {pinging_open_s:.1f} s"
        assert pinging_open_s >= 0.9 * timeout_s, f"closed after {pinging_open_s:.2f} s, before the timeout"
        assert silent.closes(timeout_s=timeout_s), "a silent connection stayed open"


def test_a_connected_session_outlives_the_handshake_timeout(broker: Broker) -> None:
    with RawConnection(broker.port) as conn:
        assert conn.connect(token=token("admin")).type == T.CONNECTED
        time.sleep(2 * HANDSHAKE_TIMEOUT_MS / 1000)
        conn.send_command(command(T.PING, ping={}))
        assert conn.expect(T.PONG).type == T.PONG


# --- HTTP: what a request may send before its caller is known ---------------------------
HEADER_FLOOD_BYTES = 64 * MIB
HEADER_FLOOD_S_MAX = 8.0
HEADER_FLOOD_RSS_BYTES_MAX = 16 * MIB
HEADER_BYTES_MAX = 8192
"""``httpMaxRequestHeaderSize``'s default, as Pulsar's."""


def flood_head(broker: Broker, start: bytes, unit: bytes) -> tuple[bytes, int]:
    """Send ``start`` and then ``unit`` over and over (up to ``HEADER_FLOOD_BYTES`` or
    ``HEADER_FLOOD_S_MAX``) as a request head that never ends: what the broker answered, and
    its RSS once the flood was sent."""
    port = int(broker.http_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=HEADER_FLOOD_S_MAX) as sock:
        chunk = unit * (MIB // len(unit))
        started = time.monotonic()
        with contextlib.suppress(OSError):  # the broker closed: a refusal
            sock.sendall(start)
            for _ in range(HEADER_FLOOD_BYTES // len(chunk)):
                if time.monotonic() - started > HEADER_FLOOD_S_MAX:
                    break
                sock.sendall(chunk)
        rss = broker.rss_bytes()
        try:
            return sock.recv(4096), rss
        except OSError:
            return b"", rss


@pytest.mark.parametrize(("start", "unit"), [
    (b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\n", b"X-A: b\r\n"),
    (b"GET /admin/v2/clusters HTTP/1.1\r\nHost: x\r\nX-Long: ", b"a"),
    (b"GET /admin/v2/clusters?", b"a"),
    (b"GET /ws/v2/producer/persistent/public/default/t HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",
     b"X-A: b\r\n"),
], ids=["many header lines", "one endless header", "endless url", "a WebSocket upgrade's head"])
def test_a_request_head_without_end_is_refused_at_its_bound(broker: Broker, start: bytes, unit: bytes) -> None:
    baseline = settle_rss(broker)
    answer, rss = flood_head(broker, start, unit)
    held = rss - baseline
    print(f"endless request head: answer {answer[:40]!r}, RSS +{held / MIB:.1f} MiB")
    assert held < HEADER_FLOOD_RSS_BYTES_MAX, f"+{held / MIB:.0f} MiB"
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert b'"code":"headers_too_large"' in answer


def test_a_head_within_the_bound_is_served_with_its_body_in_the_same_read(broker: Broker) -> None:
    """A head of exactly ``httpMaxRequestHeaderSize`` bytes, sent in one write with a 200 KB
    body, is read and answered; one byte more is refused with 431."""
    port = int(broker.http_url.rsplit(":", 1)[1])
    body = json.dumps({"messages": [{"payload": base64.b64encode(bytes(150_000)).decode()}]}).encode()
    bearer = token("admin")

    def post(head_bytes: int) -> bytes:
        head = (f"POST /topics/persistent/public/default/head-bound HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {bearer}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\nX-Pad: ").encode()
        head += b"p" * (head_bytes - len(head) - 4) + b"\r\n\r\n"
        assert len(head) == head_bytes
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            with contextlib.suppress(OSError):
                sock.sendall(head + body)
            return sock.recv(4096)

    assert post(HEADER_BYTES_MAX).startswith(b"HTTP/1.1 200 ")
    assert post(HEADER_BYTES_MAX + 1).startswith(b"HTTP/1.1 431 ")
