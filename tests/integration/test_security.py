"""What a security review found, each against a real server with authentication on.

- A consumer's own ``deadLetterTopic`` is a write into that topic: it needs the produce
  permission there (WebSocket and REST pull), or nothing is written.
- A request body is not read before its caller is known; bodies are bounded for everyone.
- Silent and slow connections are closed after the header timeout.
- A ``topicsPattern`` consumer stops following topics when it closes, and a pattern that
  backtracks catastrophically in Python's ``re`` costs nothing (RE2).
- Answers are bounded in bytes: a range read, a consumer that never acknowledges (push and
  pull), a reader.
- Revoking a permission ends the open WebSocket sessions that needed it.
- ``/metrics`` can require a superuser; concurrent scrapes share one rendering, and a scrape's
  work grows linearly with topics.
- ``magnetar tokens create`` and the broker read a key file the same way, to the last byte.
"""

from __future__ import annotations

import base64
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from api.auth import AuthConfig
from api.cli import main as cli_main
from api.config import StandaloneConfig
from api.limits import EdgeLimits
from api.loop_stalls import LoopStallMonitor
from api.metrics import BrokerCollector
from broker.consumer import ConsumerConfig
from broker.entry_format import Message
from broker.service import BrokerConfig, BrokerService
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName
from consumers.cli.tokens import create_token
from tests.integration.server import running_server, stored
from tests.integration.ws_client import open_ws, produce, recv_frame, refused_status, send_frame, ws_base
from tests.publishing import publish_to
from tests.standalone import standalone_process

SECRET = b"0123456789abcdef0123456789abcdef"
WAIT_S = 30.0
SMALL = EdgeLimits(header_timeout_ms=300, idle_timeout_ms=300, consumer_unacked_bytes_max=256 * 1024,
                   read_response_bytes_max=64 * 1024, pull_response_bytes_max=64 * 1024,
                   body_bytes_max=64 * 1024)


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(role, secret_key=SECRET)}"}


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[str, BrokerService]]:
    auth = AuthConfig(enabled=True, secret_key=SECRET, superuser_roles=frozenset({"admin"}),
                      authenticate_metrics=True)
    with running_server(str(tmp_path / "data"), auth=auth, limits=SMALL) as (url, service):
        service.namespaces.set_policy("public/default", "auth_policies",
                                      {"namespace_auth": {"reader": ["consume"], "writer": ["produce"],
                                                          "both": ["produce", "consume"]}})
        service.namespaces.create_tenant("secret", {})
        service.namespaces.create_namespace("secret/ns")
        service.namespaces.set_policy("secret/ns", "auth_policies", {"namespace_auth": {"both": ["produce"]}})
        yield url, service


def test_a_dead_letter_topic_needs_the_produce_permission_there(secured: tuple[str, BrokerService]) -> None:
    url, service = secured
    injected = "persistent://secret/ns/injected"
    consumer = (f"{ws_base(url)}/ws/v2/consumer/persistent/public/default/dl/sub?subscriptionType=Shared"
                f"&maxRedeliverCount=1&negativeAckRedeliveryDelay=0&deadLetterTopic={injected}")
    status, body = refused_status(consumer, **bearer("reader"))
    assert (status, body["code"]) == (403, "forbidden") and "secret/ns/injected" in body["message"]
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        pulled = http.post("/topics/persistent/public/default/dl/subscription/sub/pull",
                           params={"deadLetterTopic": injected}, headers=bearer("reader"))
        assert pulled.status_code == 403 and "secret/ns/injected" in pulled.json()["message"]
    assert not service.topics.exists(TopicName.parse(injected))
    with open_ws(consumer, **bearer("both")) as allowed:  # produce there and consume here: fine
        send_frame(allowed, {"type": "isEndOfTopic"})
        assert "endOfTopic" in recv_frame(allowed)


def test_a_body_without_a_token_is_refused_from_its_headers(secured: tuple[str, BrokerService]) -> None:
    url, service = secured
    host, port = url.removeprefix("http://").split(":")
    head = (f"POST /topics/persistent/public/default/big HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as raw:
        raw.sendall(head + b'{"messages": [')  # 200 MB announced, a few bytes sent
        answer = _read_answer(raw)
    assert answer.startswith(b"HTTP/1.1 401") and b'"unauthorized"' in answer
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        too_big = http.post("/topics/persistent/public/default/big", headers=bearer("writer"),
                            json={"messages": [{"payload": "x" * (70 * 1024)}]})
        assert too_big.status_code == 413 and too_big.json()["code"] == "request_too_large"

        def chunks() -> Iterator[bytes]:
            yield b'{"messages": [{"payload": "'
            for _ in range(100):
                yield b"y" * 1024
            yield b'"}]}'

        chunked = http.post("/topics/persistent/public/default/big", headers=bearer("writer"), content=chunks())
        assert chunked.status_code == 413
        fits = http.post("/topics/persistent/public/default/big", headers=bearer("writer"),
                         json={"messages": [{"payload": "small"}]})
        assert fits.status_code == 200
        # an admin route whose body FastAPI parses before the route runs: refused from its headers too
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as raw:
            raw.sendall((f"PUT /admin/v2/tenants/intruder HTTP/1.1\r\nHost: {host}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n{").encode())
            answer = _read_answer(raw)
        assert answer.startswith(b"HTTP/1.1 401") and b'"unauthorized"' in answer
    assert stored(service, "big") == [b"small"]
    assert "intruder" not in service.namespaces.tenants()


def test_a_refused_small_body_is_read_so_the_answer_is_not_reset(secured: tuple[str, BrokerService]) -> None:
    """A client that sends its headers, then its body: refused, it still reads the whole 401 and
    an orderly close (an answer sent before the body arrived would be reset under the client)."""
    url, service = secured
    host, port = url.removeprefix("http://").split(":")
    body = b'{"messages": [{"payload": "eA=="}]}'
    head = (f"POST /topics/persistent/public/default/late-body HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as raw:
        raw.sendall(head)
        readable, _, _ = select.select([raw], [], [], 0.3)
        assert not readable  # no answer before the declared body: the broker waits for it
        raw.sendall(body)
        answer = _read_answer(raw)
        assert raw.recv(4096) == b""  # then an orderly close, not a reset
    assert answer.startswith(b"HTTP/1.1 401") and b'"unauthorized"' in answer
    assert stored(service, "late-body") == []


def _read_answer(raw: socket.socket) -> bytes:
    """One HTTP answer (headers and a Content-Length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
        chunk = raw.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _content_length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _closed_by_server(raw: socket.socket, deadline_s: float) -> bool:
    raw.settimeout(0.2)
    while time.monotonic() < deadline_s:
        try:
            if raw.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True
    return False


def test_silent_and_slow_connections_are_closed(secured: tuple[str, BrokerService]) -> None:
    url, _ = secured
    host, port = url.removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)))
    slow = socket.create_connection((host, int(port)))
    slow_upgrade = socket.create_connection((host, int(port)))  # held by the guard while it may be an upgrade
    try:
        deadline = time.monotonic() + WAIT_S
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        slow_upgrade.sendall(b"GET /ws/v2/reader/persistent/public/default/t HTTP/1.1\r\nUpgrade: websocket\r\n")
        assert _closed_by_server(silent, deadline)
        assert _closed_by_server(slow, deadline)
        assert _closed_by_server(slow_upgrade, deadline)
    finally:
        silent.close()
        slow.close()
        slow_upgrade.close()
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:  # a normal client is unaffected
        assert http.get("/healthz").status_code == 200


def test_a_pattern_consumer_stops_following_topics_once_closed(tmp_path: Path) -> None:
    with running_server(str(tmp_path / "data")) as (url, service):
        pattern = f"{ws_base(url)}/ws/v3/consumer/watch?topicsPattern=persistent://public/default/orders-.*"
        with open_ws(pattern) as consumer:
            service.topics.topic("public/default/orders-1")
            send_frame(consumer, {"type": "isEndOfTopic"})
            recv_frame(consumer)
        first = service.topics.topic("public/default/orders-1").name
        deadline = time.monotonic() + WAIT_S
        while any(s.consumers for s in service.subscriptions.of(first)):  # until the server saw the client go
            assert time.monotonic() < deadline, "the pattern consumer's session never ended"
            time.sleep(0.05)
        second = service.topics.topic("public/default/orders-2").name  # created after the pattern consumer left
        assert all(not s.consumers for s in service.subscriptions.of(second))
        exclusive = f"{ws_base(url)}/ws/v2/consumer/persistent/public/default/orders-2/watch"
        with open_ws(exclusive) as later:  # no leftover consumer holds the Exclusive subscription
            send_frame(later, {"type": "isEndOfTopic"})
            assert recv_frame(later) == {"endOfTopic": False}


def test_a_catastrophic_pattern_costs_nothing(tmp_path: Path) -> None:
    with running_server(str(tmp_path / "data")) as (url, service):
        evil = f"{ws_base(url)}/ws/v3/consumer/evil?topicsPattern=persistent://public/default/(a%2B)%2Bb"
        with open_ws(evil) as consumer, httpx.Client(base_url=url, timeout=WAIT_S) as http:
            name = "a" * 60  # 2^60 steps for a backtracking engine
            answer = http.post(f"/topics/persistent/public/default/{name}", json={"messages": [{"payload": "p"}]})
            assert answer.status_code == 200
            send_frame(consumer, {"type": "isEndOfTopic"})
            assert "endOfTopic" in recv_frame(consumer)
        too_long = f"{ws_base(url)}/ws/v3/consumer/long?topicsPattern=persistent://public/default/{'x' * 600}"
        status, body = refused_status(too_long)
        assert status == 400 and "longer than 512 bytes" in body["message"]
        assert service.topics.loaded()


def test_answers_and_outstanding_deliveries_are_bounded_in_bytes(tmp_path: Path) -> None:
    big = b"m" * (60 * 1024)
    with running_server(str(tmp_path / "data"), limits=SMALL) as (url, service):
        service.namespaces.set_policy("public/default", "retention_policies", {"retentionTimeInMinutes": -1,
                                                                               "retentionSizeInMB": -1})
        for _ in range(20):
            publish_to(service, "public/default/heavy", [Message(payload=big)], producer_name="p")
        publish_to(service, "public/default/tiny", [Message(payload=b"t" * 600) for _ in range(2000)],
                        producer_name="p")
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            read = http.get("/topics/persistent/public/default/tiny/messages",
                            params={"offset": 0, "maxMessages": 100_000})
            assert read.status_code == 200 and len(read.content) <= SMALL.read_response_bytes_max
            assert 0 < len(read.json()["messages"]) < 2000
            one = http.get("/topics/persistent/public/default/heavy/messages", params={"offset": 0})
            assert one.status_code == 200, one.text
            assert len(one.json()["messages"]) == 1  # one message even when it alone passes the bound
            pulled = http.post("/topics/persistent/public/default/heavy/subscription/p/pull",
                               params={"maxMessages": 1000, "subscriptionInitialPosition": "Earliest"})
            assert 1 <= len(pulled.json()["messages"]) <= 2
        # a consumer that never acknowledges holds at most the outstanding bytes (plus one message)
        held_max = SMALL.consumer_unacked_bytes_max // len(big) + 1
        base = f"{ws_base(url)}/ws/v2/consumer/persistent/public/default/heavy"
        for url_ws, permits in ((f"{base}/push?subscriptionInitialPosition=Earliest", 0),
                                (f"{base}/pull?subscriptionInitialPosition=Earliest&pullMode=true", 1000)):
            with open_ws(url_ws) as consumer:
                for _ in range(permits):
                    send_frame(consumer, {"type": "permit", "permitMessages": 1000})
                got = _frames_until_quiet(consumer)
                assert 1 <= got <= held_max, (url_ws, got)
        reader = f"{ws_base(url)}/ws/v2/reader/persistent/public/default/heavy?messageId=earliest"
        with open_ws(reader) as unread:
            assert 1 <= _frames_until_quiet(unread) <= held_max


def _frames_until_quiet(ws: object, quiet_s: float = 1.0) -> int:
    count = 0
    while True:
        try:
            ws.recv(timeout=quiet_s)  # type: ignore[attr-defined]
        except TimeoutError:
            return count
        count += 1
        assert count <= 1000


def test_revoking_a_permission_ends_the_sessions_that_needed_it(secured: tuple[str, BrokerService]) -> None:
    url, _ = secured
    consumer = f"{ws_base(url)}/ws/v2/consumer/persistent/public/default/rev/sub?subscriptionType=Shared"
    producer = f"{ws_base(url)}/ws/v2/producer/persistent/public/default/rev"
    with open_ws(consumer, **bearer("reader")) as revoked, open_ws(producer, **bearer("writer")) as kept:
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            answer = http.delete("/admin/v2/namespaces/public/default/permissions/reader", headers=bearer("admin"))
            assert answer.status_code == 204
        with pytest.raises(ConnectionClosed) as closed:
            revoked.recv(timeout=WAIT_S)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert "permission revoked" in closed.value.rcvd.reason
        assert produce(kept, [b"still allowed"])[0]["result"] == "ok"  # other roles' sessions go on


def test_metrics_can_require_a_superuser(secured: tuple[str, BrokerService]) -> None:
    url, _ = secured
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers=bearer("reader")).status_code == 403
        scraped = http.get("/metrics", headers=bearer("admin"))
        assert scraped.status_code == 200 and "magnetar_journal_fsyncs" in scraped.text


def _calls_during(work: object) -> int:
    calls = 0

    def count(_frame: object, event: str, _arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        work()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return calls


def test_a_scrape_grows_linearly_with_topics_and_bursts_share_one_rendering(tmp_path: Path) -> None:
    service = BrokerService(str(tmp_path / "data"), BrokerConfig.test_min())
    service.start()
    try:
        def add_topics(start: int, stop: int) -> None:
            for i in range(start, stop):
                publish_to(service, f"t{i}", [Message(payload=b"x")], producer_name="p")
                service.subscriptions.subscribe(f"t{i}", "s", SubscriptionType.SHARED, ConsumerConfig(name="c")).close()

        collector = BrokerCollector(service, LoopStallMonitor())
        add_topics(0, 150)
        small = _calls_during(lambda: list(collector.collect()))
        add_topics(150, 600)
        large = _calls_during(lambda: list(collector.collect()))
        assert large <= 4 * small * 1.25, (small, large)  # 4x the topics: about 4x the work, not 16x
    finally:
        service.close()
    with running_server(str(tmp_path / "data2")) as (url, served):
        from prometheus_client.registry import CollectorRegistry

        from api.metrics import SharedScrape

        registry = CollectorRegistry(auto_describe=False)
        started, release = threading.Event(), threading.Event()

        class Slow(BrokerCollector):
            def collect(self):  # type: ignore[no-untyped-def]
                started.set()
                release.wait(WAIT_S)
                yield from super().collect()

        registry.register(Slow(served, LoopStallMonitor()))
        shared = SharedScrape(registry)
        results: list[bytes] = []
        first = threading.Thread(target=lambda: results.append(shared.render()))
        first.start()
        assert started.wait(WAIT_S)
        others = [threading.Thread(target=lambda: results.append(shared.render())) for _ in range(3)]
        for thread in others:
            thread.start()
        release.set()
        for thread in (first, *others):
            thread.join(WAIT_S)
        assert len(results) == 4 and len(set(results)) == 1 and shared.renderings <= 2
        assert url


def test_cli_tokens_and_the_broker_read_a_key_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "secret.key"
    key.write_bytes(b"k" * 31 + b" ")  # a random key may end in whitespace
    assert cli_main(["tokens", "create", "--secret-key", f"file://{key}", "--subject", "app"]) == 0
    token = capsys.readouterr().out.strip()
    config = StandaloneConfig.load(None, {"authenticationEnabled": "true", "tokenSecretKey": f"file://{key}",
                                          "superUserRoles": "app"})
    with running_server(str(tmp_path / "data"), auth=config.auth) as (url, _):
        answer = httpx.get(f"{url}/admin/v2/tenants", headers={"Authorization": f"Bearer {token}"}, timeout=WAIT_S)
        assert answer.status_code == 200


def test_tokens_never_reach_the_log(tmp_path: Path) -> None:
    secret = base64.b64encode(SECRET).decode()
    conf = tmp_path / "standalone.conf"
    conf.write_text(f"authenticationEnabled=true\ntokenSecretKey=data:;base64,{secret}\nsuperUserRoles=admin\n")
    token = create_token("admin", secret_key=SECRET)
    forged = create_token("admin", secret_key=b"f" * 32)
    log = tmp_path / "broker.log"
    with log.open("wb") as output, standalone_process(tmp_path / "data", "--config", str(conf), "--log-level",
                                                      "info", output=output) as (url, _):
        assert httpx.get(f"{url}/admin/v2/tenants", params={"token": token}, timeout=WAIT_S).status_code == 200
        assert httpx.get(f"{url}/admin/v2/tenants", params={"token": forged}, timeout=WAIT_S).status_code == 401
        reader = f"{ws_base(url)}/ws/v2/reader/persistent/public/default/logged?messageId=earliest&token={token}"
        with open_ws(reader) as ws:
            send_frame(ws, {"type": "isEndOfTopic"})
            recv_frame(ws)
    text = log.read_text(errors="replace")
    assert "/admin/v2/tenants?token=<redacted>" in text and "/ws/v2/reader/" in text  # the requests were logged
    assert token not in text and forged not in text and token.split(".")[1] not in text
