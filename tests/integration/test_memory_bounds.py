"""Memory bounded in bytes: a client that stops reading costs the broker a few MiB, never a backlog.

Against a real ``magnetar standalone`` with token authentication on, as ``alice``: a role that
is not a superuser, granted produce and consume on her namespace only. Each case starts the
broker afresh on data produced beforehand (entries of 4 KiB and of 1 MiB, one message each or
a batch of many small ones, sent by the official client), reads one message through each
transport (warm-up: code paths, caches), lets the entry cache age out, takes the broker's RSS
from ``/proc/PID/status`` as the baseline, then opens one consumer that never reads (a socket
receive buffer of 4 KiB, the most permits or receiver queue the transport allows) and watches
RSS for a few seconds: the highest figure, less the baseline, is what that consumer cost.

Honest figures: the broker runs with glibc's ``mmap`` threshold fixed and its trim threshold
low (``MALLOC_ENV``), so memory freed by the warm-up goes back to the system instead of being
reused unseen by what the consumer holds; the broker starts afresh per case for the same
reason (producing the data would leave the heap full of free chunks). The bookie's read cache
and the broker's entry cache are bounded broker-wide and fill only with what the consumer
makes the broker read, so they count in the figure.

Checks: one never-reading consumer (binary protocol, any subscription type or a reader;
WebSocket consumer or reader) adds less than ``RSS_ONE_CONSUMER_BYTES_MAX``; a consumer that
reads what it is sent and acknowledges nothing pins no payloads, and its messages come back to
the next consumer after it leaves; ten never-reading consumers stay within the broker-wide
reads-in-flight budget (``managedLedgerMaxReadsInFlightSizeInMB``) plus each connection's own
bounded buffer, their reads wait for the budget, and everything is delivered once they are
gone; producers on both transports are paused while the publish buffer
(``maxMessagePublishBufferSizeInMB``) is full and every message is stored (the WebSocket pause
also in process, where the test holds the buffer full itself).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar.proto import pulsar_api_pb2 as pb
from broker.service import BrokerConfig
from consumers.cli.tokens import create_token
from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client
from tests.integration.pulsar_wire import RawConnection, T, command
from tests.integration.server import running_server
from tests.integration.ws_client import open_ws, recv_frame, recv_nothing, send_frame
from tests.integration.ws_client import produce as ws_produce

MIB = 1024 * 1024
SECRET = b"0123456789abcdef0123456789abcdef"
ROLE = "alice"
NAMESPACE = "public/alice"
RSS_ONE_CONSUMER_BYTES_MAX = 16 * MIB
CLIENT_RECEIVE_BUFFER_BYTES = 4096
BINARY_PERMITS = 1_000_000
WS_RECEIVER_QUEUE = 1_000_000
SETTLE_S = 1.5
"""Longer than the entry cache keeps an entry (``entry_cache_age_ms_max``, 1 s)."""
WATCH_S = 3.0
SAMPLE_S = 0.1
HTTP_TIMEOUT_S = 30.0
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "2"}
"""glibc: allocations from 64 KiB up are mapped and unmapped on their own (no dynamic threshold
that would keep them in the heap after the first free), the heap's top is trimmed from 128 KiB,
and two arenas (not sixteen) hold what threads free."""


@dataclass(frozen=True)
class Backlog:
    """A topic of ``messages`` messages of ``payload_bytes``, sent alone or ``per_batch`` in
    each of the official client's batches (then entries are batches of about the same size as
    the unbatched backlog's: many small messages each)."""

    topic: str
    payload_bytes: int
    messages: int
    per_batch: int = 1

    @property
    def batched(self) -> bool:
        return self.per_batch > 1

    @property
    def full_name(self) -> str:
        return f"persistent://{NAMESPACE}/{self.topic}"


BACKLOGS = {  # entries of 4 KiB and of 1 MiB, one message each or a batch of many
    "4KiB": Backlog("small", 4096, 10_000),
    "4KiB-batched": Backlog("small-batched", 128, 320_000, per_batch=32),
    "1MiB": Backlog("large", MIB, 64),
    "1MiB-batched": Backlog("large-batched", 4096, 64 * 256, per_batch=256),
}


def token(role: str) -> str:
    return create_token(role, secret_key=SECRET)


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {token('admin')}"}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@dataclass(frozen=True)
class Data:
    data_dir: Path
    config: Path

    def with_settings(self, directory: Path, settings: str) -> Path:
        config = directory / "standalone.conf"
        config.write_text(self.config.read_text() + settings)
        return config


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    """A data directory holding every backlog, produced by ``alice`` with the official client."""
    directory = tmp_path_factory.mktemp("memory")
    secret = directory / "secret.key"
    secret.write_bytes(SECRET)
    config = directory / "standalone.conf"
    config.write_text(f"authenticationEnabled=true\ntokenSecretKey=file://{secret}\nsuperUserRoles=admin\n")
    with binary_broker(directory / "data", "--config", str(config)) as (http_url, pulsar_url, _):
        for path, body in ((f"/admin/v2/namespaces/{NAMESPACE}", None),
                           (f"/admin/v2/namespaces/{NAMESPACE}/permissions/{ROLE}", ["produce", "consume"])):
            call = httpx.put if body is None else httpx.post
            response = call(f"{http_url}{path}", json=body, headers=admin_headers(), timeout=HTTP_TIMEOUT_S)
            assert response.status_code in (200, 204), response.text
        produce_backlogs(pulsar_url)
        for backlog in BACKLOGS.values():
            stats = httpx.get(f"{http_url}/admin/v2/{backlog.full_name.replace('://', '/')}/internalStats",
                              headers=admin_headers(), timeout=HTTP_TIMEOUT_S).json()
            entries = stats["numberOfEntries"]
            assert (entries < backlog.messages) == backlog.batched, (backlog, entries)
    return Data(directory / "data", config)


def produce_backlogs(pulsar_url: str) -> None:
    c = client(pulsar_url, authentication=pulsar.AuthenticationToken(token(ROLE)))
    try:
        for backlog in BACKLOGS.values():
            producer = c.create_producer(backlog.full_name, batching_enabled=backlog.batched,
                                         batching_max_messages=max(backlog.per_batch, 2),
                                         batching_max_allowed_size_in_bytes=2 * backlog.per_batch
                                         * backlog.payload_bytes,
                                         batching_max_publish_delay_ms=50, block_if_queue_full=True,
                                         max_pending_messages=10_000)
            payload = os.urandom(backlog.payload_bytes)
            for _ in range(backlog.messages):
                producer.send_async(payload, None)
            producer.flush()
            producer.close()
    finally:
        c.close()


@dataclass
class Broker:
    http_url: str
    port: int
    pid: int

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def subscription_stats(self, backlog: Backlog, subscription: str) -> dict[str, object]:
        stats = httpx.get(f"{self.http_url}/admin/v2/{backlog.full_name.replace('://', '/')}/stats",
                          headers=admin_headers(), timeout=HTTP_TIMEOUT_S).json()
        found: dict[str, object] = stats["subscriptions"].get(subscription, {})
        return found

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.http_url}/metrics", headers=admin_headers(), timeout=HTTP_TIMEOUT_S).text
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"/metrics has no {name}")


@contextmanager
def broker(data: Data, config: Path | None = None) -> Iterator[Broker]:
    with binary_broker(data.data_dir, "--config", str(config or data.config), env=MALLOC_ENV) as (http_url, url, proc):
        yield Broker(http_url, int(url.rsplit(":", 1)[1]), proc.pid)


# --- clients ------------------------------------------------------------------------------
def binary_consumer(port: int, topic: str, subscription: str, sub_type: int, *, durable: bool = True,
                    permits: int = BINARY_PERMITS, receive_buffer_bytes: int | None = CLIENT_RECEIVE_BUFFER_BYTES,
                    ) -> RawConnection:
    """A binary-protocol consumer from the earliest message, given ``permits`` at once."""
    conn = RawConnection(port, receive_buffer_bytes=receive_buffer_bytes)
    assert conn.connect(token=token(ROLE)).type == T.CONNECTED
    body: dict[str, object] = {"topic": topic, "subscription": subscription, "subType": sub_type, "consumer_id": 1,
                               "request_id": 1, "initialPosition": pb.CommandSubscribe.Earliest, "durable": durable}
    if not durable:  # a reader: from the earliest message id
        body["start_message_id"] = {"ledgerId": (1 << 64) - 1, "entryId": (1 << 64) - 1}
    conn.send_command(command(T.SUBSCRIBE, subscribe=body))
    answer = conn.expect(T.SUCCESS, T.ERROR)
    assert answer.type == T.SUCCESS, answer
    conn.send_command(command(T.FLOW, flow={"consumer_id": 1, "messagePermits": permits}))
    return conn


def ws_never_reading(http_url: str, path: str) -> socket.socket:
    """A WebSocket session at ``path`` whose client reads the upgrade answer and nothing after it
    (byte by byte, so no frame is taken off the socket)."""
    host, port = http_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RECEIVE_BUFFER_BYTES)
    sock.settimeout(HTTP_TIMEOUT_S)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        assert byte, f"the broker closed the upgrade of {path}: {head!r}"
        head += byte
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def ws_path(kind: str, backlog: Backlog, subscription: str) -> str:
    topic = f"persistent/{NAMESPACE}/{backlog.topic}"
    if kind == "reader":
        return f"/ws/v2/reader/{topic}?messageId=earliest&receiverQueueSize={WS_RECEIVER_QUEUE}&token={token(ROLE)}"
    return (f"/ws/v2/consumer/{topic}/{subscription}?subscriptionInitialPosition=Earliest"
            f"&receiverQueueSize={WS_RECEIVER_QUEUE}&token={token(ROLE)}")


def warm_up(b: Broker, backlog: Backlog) -> None:
    """Read one message through each transport, as a normal client would, then let it settle."""
    with RawConnection(b.port) as conn:
        conn.connect(token=token(ROLE))
        conn.send_command(command(T.SUBSCRIBE, subscribe={
            "topic": backlog.full_name, "subscription": "warm-up", "subType": pb.CommandSubscribe.Exclusive,
            "consumer_id": 1, "request_id": 1, "initialPosition": pb.CommandSubscribe.Earliest}))
        assert conn.expect(T.SUCCESS).type == T.SUCCESS
        conn.send_command(command(T.FLOW, flow={"consumer_id": 1, "messagePermits": 1}))
        assert conn.expect(T.MESSAGE).type == T.MESSAGE
    with open_ws(f"{b.http_url.replace('http://', 'ws://')}/ws/v2/consumer/persistent/{NAMESPACE}/{backlog.topic}"
                 f"/warm-up-ws?subscriptionInitialPosition=Earliest&receiverQueueSize=1&token={token(ROLE)}") as ws:
        assert "payload" in recv_frame(ws)
    time.sleep(SETTLE_S)


def baseline(b: Broker) -> int:
    samples = []
    for _ in range(5):
        samples.append(b.rss())
        time.sleep(SAMPLE_S)
    return max(samples)


def peak_over(b: Broker, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    peak = 0
    while time.monotonic() < deadline:
        peak = max(peak, b.rss())
        time.sleep(SAMPLE_S)
    return peak


SUB_TYPES = {"Exclusive": pb.CommandSubscribe.Exclusive, "Shared": pb.CommandSubscribe.Shared,
             "Failover": pb.CommandSubscribe.Failover, "Key_Shared": pb.CommandSubscribe.Key_Shared}
CASES = [
    *[("binary", "Exclusive", name) for name in BACKLOGS],
    *[("websocket", "Exclusive", name) for name in BACKLOGS],
    ("binary", "Shared", "4KiB-batched"),
    ("binary", "Key_Shared", "1MiB"),
    ("binary", "Failover", "4KiB"),
    ("binary", "reader", "1MiB-batched"),
    ("websocket", "reader", "4KiB-batched"),
    ("websocket", "reader", "1MiB"),
]


@pytest.mark.parametrize(("transport", "kind", "backlog_name"), CASES)
def test_one_consumer_that_never_reads_costs_a_few_mib(data: Data, transport: str, kind: str,
                                                       backlog_name: str) -> None:
    backlog = BACKLOGS[backlog_name]
    subscription = f"idle-{transport}-{kind}".lower()
    with broker(data) as b, ExitStack() as clients:
        warm_up(b, backlog)
        before = baseline(b)
        if transport == "binary":
            conn = binary_consumer(b.port, backlog.full_name, subscription, SUB_TYPES.get(kind, 0),
                                   durable=kind != "reader")
            clients.callback(conn.sock.close)
        else:
            sock = ws_never_reading(b.http_url, ws_path(kind, backlog, subscription))
            clients.callback(sock.close)
        peak = peak_over(b, WATCH_S)
        if kind != "reader":
            sent = b.subscription_stats(backlog, subscription).get("msgOutCounter", 0)
            assert isinstance(sent, int) and sent > 0, "the consumer was sent nothing: the case proves nothing"
        added = peak - before
        print(f"{transport} {kind} {backlog_name}: baseline {before / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB, "
              f"added {added / MIB:+.1f} MiB")
        assert added < RSS_ONE_CONSUMER_BYTES_MAX, \
            f"one never-reading {transport} {kind} consumer added {added / MIB:.1f} MiB of RSS"


def read_frames(conn: RawConnection, quiet_s: float = 1.0) -> list[pb.BaseCommand]:
    """Every MESSAGE until none arrives for ``quiet_s`` (bounded by the read timeout overall)."""
    messages: list[pb.BaseCommand] = []
    while True:
        try:
            got = conn.next(quiet_s)
        except TimeoutError:
            return messages
        assert got is not None, "the broker closed the connection"
        if got.type == T.MESSAGE:
            messages.append(got)


def test_a_consumer_that_never_acknowledges_pins_no_payloads_and_its_messages_come_back(data: Data) -> None:
    """It reads what it is sent (as many as its unacknowledged bytes allow) and acknowledges
    nothing; then it leaves and its messages wait for redelivery. 1 MiB entries: their buffers
    are mapped and unmapped whole, so RSS shows what is held, not what the heap kept of the
    traffic."""
    backlog = BACKLOGS["1MiB"]
    with broker(data) as b:
        warm_up(b, backlog)
        before = baseline(b)
        with binary_consumer(b.port, backlog.full_name, "never-acks", SUB_TYPES["Shared"],
                             receive_buffer_bytes=None) as greedy:
            received = read_frames(greedy)
            held = b.rss() - before
        assert len(received) >= 8, "the consumer was sent too little to prove anything"
        time.sleep(SETTLE_S)  # it left: what it held waits for redelivery
        waiting = b.rss() - before
        print(f"received {len(received)} unacknowledged: held {held / MIB:+.1f} MiB, "
              f"after it left {waiting / MIB:+.1f} MiB")
        assert held < RSS_ONE_CONSUMER_BYTES_MAX and waiting < RSS_ONE_CONSUMER_BYTES_MAX, (held, waiting)
        with binary_consumer(b.port, backlog.full_name, "never-acks", SUB_TYPES["Shared"], permits=10,
                             receive_buffer_bytes=None) as next_one:
            again = next_one.expect(T.MESSAGE).message
            assert again.redelivery_count == 1
            first = received[0].message.message_id
            assert (again.message_id.ledgerId, again.message_id.entryId) == (first.ledgerId, first.entryId)


BUDGET_MIB = 8
IDLE_CONSUMERS = 10
CONNECTION_BUFFER_BYTES = 4 * MIB
"""What one never-reading connection may hold beyond the broker-wide budget: its outgoing buffer
(``write_buffer_bytes_max``) and the one entry written past it, at most 1 MiB each here."""


def test_many_never_reading_consumers_stay_within_the_broker_wide_budget(data: Data, tmp_path: Path) -> None:
    backlog = BACKLOGS["1MiB"]
    config = data.with_settings(tmp_path, f"managedLedgerMaxReadsInFlightSizeInMB={BUDGET_MIB}\n")
    with broker(data, config) as b:
        warm_up(b, backlog)
        before = baseline(b)
        with ExitStack() as clients:
            for index in range(IDLE_CONSUMERS):
                conn = binary_consumer(b.port, backlog.full_name, f"idle-{index}", SUB_TYPES["Exclusive"])
                clients.callback(conn.sock.close)
            peak = peak_over(b, WATCH_S)
            added = peak - before
            bound = BUDGET_MIB * MIB + IDLE_CONSUMERS * CONNECTION_BUFFER_BYTES
            print(f"{IDLE_CONSUMERS} never-reading consumers: added {added / MIB:+.1f} MiB "
                  f"(bound {bound / MIB:.0f} MiB)")
            assert b.metric("magnetar_reads_in_flight_bytes_max") == BUDGET_MIB * MIB
            waits = b.metric("magnetar_reads_in_flight_waits_total")
        assert waits > 0, "no read waited for the budget: the case proves nothing"
        assert added < bound, f"{IDLE_CONSUMERS} never-reading consumers added {added / MIB:.1f} MiB"
        c = client(f"pulsar://127.0.0.1:{b.port}", authentication=pulsar.AuthenticationToken(token(ROLE)))
        try:  # the budget they held is free again: a consumer reads the whole topic
            consumer = c.subscribe(backlog.full_name, "after-them", initial_position=pulsar.InitialPosition.Earliest)
            for _ in range(backlog.messages):
                consumer.acknowledge(consumer.receive(RECEIVE_TIMEOUT_MS))
        finally:
            c.close()


PUBLISH_BUFFER_MIB = 1
PUBLISHED_MESSAGES = 48
PUBLISH_GROUP_BYTES = 4 * MIB
"""What one producer connection may add past a full publish buffer before it is paused: the
SENDs (or WebSocket frames) it had read already, a few 1 MiB messages here."""


def test_producers_are_paused_while_the_publish_buffer_is_full_and_every_message_is_stored(
        data: Data, tmp_path: Path) -> None:
    config = data.with_settings(tmp_path, f"maxMessagePublishBufferSizeInMB={PUBLISH_BUFFER_MIB}\n")
    payload = os.urandom(MIB)
    topic = f"persistent://{NAMESPACE}/published"
    with broker(data, config) as b:
        c = client(f"pulsar://127.0.0.1:{b.port}", authentication=pulsar.AuthenticationToken(token(ROLE)))
        try:
            producer = c.create_producer(topic, batching_enabled=False, max_pending_messages=PUBLISHED_MESSAGES,
                                         block_if_queue_full=True)
            results: list[pulsar.Result] = []
            for _ in range(PUBLISHED_MESSAGES):
                producer.send_async(payload, lambda result, _id: results.append(result))
            producer.flush()
        finally:
            c.close()
        binary_waits = b.metric("magnetar_publish_buffer_waits_total")
        ws_url = f"{b.http_url.replace('http://', 'ws://')}/ws/v2/producer/persistent/{NAMESPACE}/published"
        with open_ws(f"{ws_url}?token={token(ROLE)}") as ws:
            answers = ws_produce(ws, [payload] * (PUBLISHED_MESSAGES // 4))
        peak = b.metric("magnetar_publish_buffer_peak_bytes")
        waits = b.metric("magnetar_publish_buffer_waits_total")
        stats = httpx.get(f"{b.http_url}/admin/v2/persistent/{NAMESPACE}/published/stats", headers=admin_headers(),
                          timeout=HTTP_TIMEOUT_S).json()
    print(f"publish buffer of {PUBLISH_BUFFER_MIB} MiB: peak {peak / MIB:.1f} MiB, connections paused "
          f"{binary_waits:.0f} times (binary), {waits - binary_waits:.0f} (WebSocket)")
    assert results == [pulsar.Result.Ok] * PUBLISHED_MESSAGES
    assert [a["result"] for a in answers] == ["ok"] * (PUBLISHED_MESSAGES // 4)
    assert stats["msgInCounter"] == PUBLISHED_MESSAGES + PUBLISHED_MESSAGES // 4
    assert binary_waits > 0, "no producer connection was paused: the case proves nothing"
    assert peak <= PUBLISH_BUFFER_MIB * MIB + PUBLISH_GROUP_BYTES


def test_a_websocket_producer_reads_no_frame_while_the_publish_buffer_is_full(tmp_path: Path) -> None:
    """In process, so the test holds the buffer full itself: a frame sent meanwhile is not
    published (no answer) until the buffer has room again, then it is."""
    config = dataclasses.replace(BrokerConfig.test_min(), publish_buffer_bytes_max=MIB)
    with running_server(str(tmp_path / "data"), config) as (url, service):
        held = service.publish_buffer
        with open_ws(f"{url.replace('http://', 'ws://')}/ws/v2/producer/persistent/public/default/held") as ws:
            assert ws_produce(ws, [b"before"])[0]["result"] == "ok"
            held.adjust(2 * MIB)  # full: the session stops reading frames
            send_frame(ws, {"payload": base64.b64encode(b"while full").decode(), "context": "held"})
            assert recv_nothing(ws, 1.0), "a frame was published while the publish buffer was full"
            held.adjust(-2 * MIB)
            answer = recv_frame(ws)
        assert answer["result"] == "ok" and answer["context"] == "held"
        assert held.statistics().waits >= 1
