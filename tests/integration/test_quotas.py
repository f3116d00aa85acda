"""Namespace and topic quotas and rate limits against a real ``magnetar standalone``, on every edge.

Each quota is set through admin v2 (Pulsar's paths and bodies) and then met on the binary
protocol (the official ``pulsar-client``), the WebSocket API and REST: a producer beyond
``maxProducersPerTopic`` is ProducerBusy / 409, a consumer beyond ``maxConsumersPerTopic``
ConsumerBusy / 409, a subscription beyond ``maxSubscriptionsPerTopic`` and a topic beyond
``maxTopicsPerNamespace`` NotAllowedError / 412. Rates throttle rather than refuse: N messages
at R msg/s take at least 0.7 x (N - R) / R seconds (the first second's R pass at once), and the
same run without the rate takes much less; the bounds are generous so a loaded machine does not
make them flaky.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pulsar
import pytest

from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client
from tests.integration.ws_client import b64, open_ws, recv_frame, refused_status, send_frame, ws_base

RATE = 10
"""Messages per second of every rate limit here."""
MESSAGES = 30
THROTTLED_S_MIN = 0.7 * (MESSAGES - RATE) / RATE
"""The least time MESSAGES take at RATE (the bucket starts with one second's RATE), with slack."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with binary_broker(tmp_path_factory.mktemp("quotas")) as (http_url, pulsar_url, _):
        yield http_url, pulsar_url


@pytest.fixture
def http(broker: tuple[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=broker[0], timeout=60) as c:
        yield c


@pytest.fixture
def pc(broker: tuple[str, str]) -> Iterator[pulsar.Client]:
    c = client(broker[1])
    yield c
    c.close()


_namespaces = iter(range(1_000_000))


@pytest.fixture
def namespace(http: httpx.Client) -> str:
    """A fresh namespace of tenant public, so each test's policies are its own."""
    name = f"public/quota-{next(_namespaces)}"
    assert http.put(f"/admin/v2/namespaces/{name}").status_code == 204
    return name


def set_policy(http: httpx.Client, path: str, value: Any) -> None:
    response = http.post(f"/admin/v2/{path}", json=value)
    assert response.status_code == 204, response.text


def rest_produce(http: httpx.Client, topic: str, payload: str = "x") -> httpx.Response:
    return http.post(f"/topics/persistent/{topic}", json={"messages": [{"payload": payload}]})


def rest_pull(http: httpx.Client, topic: str, subscription: str, **params: Any) -> httpx.Response:
    return http.post(f"/topics/persistent/{topic}/subscription/{subscription}/pull",
                     params={"subscriptionInitialPosition": "Earliest", **params})


def ws_url(broker: tuple[str, str], kind: str, topic: str, suffix: str = "") -> str:
    return f"{ws_base(broker[0])}/ws/v2/{kind}/persistent/{topic}{suffix}"


# --- admin v2 -------------------------------------------------------------------------------------
NAMESPACE_POLICIES: list[tuple[str, Any]] = [
    ("maxProducersPerTopic", 3), ("maxConsumersPerTopic", 4), ("maxSubscriptionsPerTopic", 5),
    ("maxTopicsPerNamespace", 6),
    ("publishRate", {"publishThrottlingRateInMsg": 100, "publishThrottlingRateInByte": 1 << 20}),
    ("dispatchRate", {"dispatchThrottlingRateInMsg": 100, "dispatchThrottlingRateInByte": -1,
                      "ratePeriodInSecond": 2, "relativeToPublishRate": False}),
]
TOPIC_POLICIES: list[tuple[str, Any]] = [
    ("maxProducers", 1), ("maxConsumers", 2), ("maxSubscriptionsPerTopic", 3),
    ("publishRate", {"publishThrottlingRateInMsg": 7, "publishThrottlingRateInByte": -1}),
    ("dispatchRate", {"dispatchThrottlingRateInMsg": 8, "dispatchThrottlingRateInByte": -1,
                      "ratePeriodInSecond": 1, "relativeToPublishRate": False}),
]


def test_every_quota_is_a_policy_set_read_and_removed_through_admin_v2(http: httpx.Client, namespace: str) -> None:
    for name, value in NAMESPACE_POLICIES:
        path = f"/admin/v2/namespaces/{namespace}/{name}"
        assert http.get(path).json() is None
        assert http.post(path, json=value).status_code == 204, name
        assert http.get(path).json() == value, name
        assert http.delete(path).status_code == 204
        assert http.get(path).json() is None
    assert rest_produce(http, f"{namespace}/t").status_code == 200
    for name, value in TOPIC_POLICIES:
        path = f"/admin/v2/persistent/{namespace}/t/{name}"
        assert http.get(path).json() is None
        assert http.post(path, json=value).status_code == 204, name
        assert http.get(path).json() == value, name
        assert http.delete(path).status_code == 204
        assert http.get(path).json() is None
    assert http.post(f"/admin/v2/persistent/{namespace}/missing/maxProducers", json=1).status_code == 404


@pytest.mark.parametrize(("path", "body"), [
    ("maxProducersPerTopic", -1), ("maxConsumersPerTopic", "ten"), ("maxTopicsPerNamespace", 2**31),
    ("publishRate", {"publishThrottlingRateInMsg": -5}), ("publishRate", {"rate": 5}),
    ("dispatchRate", {"ratePeriodInSecond": 0}), ("dispatchRate", [1, 2]),
])
def test_a_bad_policy_value_is_a_400_naming_the_bound(http: httpx.Client, namespace: str, path: str,
                                                      body: Any) -> None:
    response = http.post(f"/admin/v2/namespaces/{namespace}/{path}", json=body)
    assert response.status_code in (400, 422), response.text
    assert response.json()["code"] in ("invalid_request", "validation_error")
    assert response.json()["message"]


# --- maxProducersPerTopic -------------------------------------------------------------------------
def test_max_producers_per_topic_on_every_edge(broker: tuple[str, str], http: httpx.Client, pc: pulsar.Client,
                                               namespace: str) -> None:
    topic = f"{namespace}/producers"
    set_policy(http, f"namespaces/{namespace}/maxProducersPerTopic", 1)
    producer = pc.create_producer(f"persistent://{topic}")
    with pytest.raises(pulsar.ProducerBusy):
        pc.create_producer(f"persistent://{topic}")
    status, body = refused_status(ws_url(broker, "producer", topic))
    assert (status, body["code"]) == (409, "producer_busy") and "max producers" in body["message"]
    refused = rest_produce(http, topic)
    assert (refused.status_code, refused.json()["code"]) == (409, "producer_busy")
    producer.close()
    assert rest_produce(http, topic).status_code == 200  # the slot came back
    with open_ws(ws_url(broker, "producer", topic)):  # the WebSocket producer holds the one slot
        with pytest.raises(pulsar.ProducerBusy):
            pc.create_producer(f"persistent://{topic}")
        assert rest_produce(http, topic).status_code == 409
    deadline = time.monotonic() + 10
    while rest_produce(http, topic).status_code != 200:  # the session's end gives it back
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_topic_policy_overrides_its_namespace(http: httpx.Client, pc: pulsar.Client, namespace: str) -> None:
    topic = f"{namespace}/own"
    set_policy(http, f"namespaces/{namespace}/maxProducersPerTopic", 1)
    assert rest_produce(http, topic).status_code == 200
    set_policy(http, f"persistent/{topic}/maxProducers", 2)
    producers = [pc.create_producer(f"persistent://{topic}") for _ in range(2)]
    with pytest.raises(pulsar.ProducerBusy):
        pc.create_producer(f"persistent://{topic}")
    for p in producers:
        p.close()


# --- maxConsumersPerTopic -------------------------------------------------------------------------
def test_max_consumers_per_topic_on_every_edge(broker: tuple[str, str], http: httpx.Client, pc: pulsar.Client,
                                               namespace: str) -> None:
    topic = f"{namespace}/consumers"
    set_policy(http, f"namespaces/{namespace}/maxConsumersPerTopic", 1)
    consumer = pc.subscribe(f"persistent://{topic}", "a", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        pc.subscribe(f"persistent://{topic}", "b", consumer_type=pulsar.ConsumerType.Shared)
    status, body = refused_status(ws_url(broker, "consumer", topic, "/c?subscriptionType=Shared"))
    assert (status, body["code"]) == (409, "consumer_busy") and "max consumers" in body["message"]
    refused = rest_pull(http, topic, "d")
    assert (refused.status_code, refused.json()["code"]) == (409, "consumer_busy")
    consumer.close()
    assert rest_pull(http, topic, "d").status_code == 200  # the REST consumer now holds the slot
    with pytest.raises(pulsar.ConsumerBusy):
        pc.subscribe(f"persistent://{topic}", "a", consumer_type=pulsar.ConsumerType.Shared)


# --- maxSubscriptionsPerTopic ---------------------------------------------------------------------
def test_max_subscriptions_per_topic_on_every_edge(broker: tuple[str, str], http: httpx.Client, pc: pulsar.Client,
                                                   namespace: str) -> None:
    topic = f"{namespace}/subscriptions"
    set_policy(http, f"namespaces/{namespace}/maxSubscriptionsPerTopic", 1)
    pc.subscribe(f"persistent://{topic}", "only").close()  # durable: it stays after the consumer
    with pytest.raises(pulsar.NotAllowedError):
        pc.subscribe(f"persistent://{topic}", "second")
    status, body = refused_status(ws_url(broker, "consumer", topic, "/second"))
    assert (status, body["code"]) == (412, "quota_exceeded") and "subscriptions" in body["message"]
    refused = rest_pull(http, topic, "second")
    assert (refused.status_code, refused.json()["code"]) == (412, "quota_exceeded")
    assert http.put(f"/admin/v2/persistent/{topic}/subscription/second").status_code == 412
    pc.subscribe(f"persistent://{topic}", "only").close()  # the existing one is no new subscription
    assert http.delete(f"/admin/v2/namespaces/{namespace}/maxSubscriptionsPerTopic").status_code == 204
    assert rest_pull(http, topic, "second").status_code == 200


# --- maxTopicsPerNamespace ------------------------------------------------------------------------
def test_max_topics_per_namespace_on_every_edge(broker: tuple[str, str], http: httpx.Client, pc: pulsar.Client,
                                                namespace: str) -> None:
    set_policy(http, f"namespaces/{namespace}/maxTopicsPerNamespace", 3)
    assert http.put(f"/admin/v2/persistent/{namespace}/parted/partitions", json=2).status_code == 204
    assert rest_produce(http, f"{namespace}/third").status_code == 200  # auto-created: 3 of 3
    with pytest.raises(pulsar.NotAllowedError):
        pc.create_producer(f"persistent://{namespace}/binary")
    status, body = refused_status(ws_url(broker, "producer", f"{namespace}/ws"))
    assert (status, body["code"]) == (412, "quota_exceeded")
    assert "Exceed maximum number of topics in namespace" in body["message"]
    refused = rest_produce(http, f"{namespace}/rest")
    assert (refused.status_code, refused.json()["code"]) == (412, "quota_exceeded")
    assert http.put(f"/admin/v2/persistent/{namespace}/admin").status_code == 412
    producer = pc.create_producer(f"persistent://{namespace}/parted")  # its partitions were counted
    producer.send(b"ok")
    producer.close()
    topics = http.get(f"/admin/v2/persistent/{namespace}").json()
    assert not [t for t in topics if t.rsplit("/", 1)[-1] in ("binary", "ws", "rest", "admin")]


# --- publishRate ------------------------------------------------------------------------------------
def _timed(run: Callable[[], None]) -> float:
    started = time.monotonic()
    run()
    return time.monotonic() - started


def _binary_sends(pc: pulsar.Client, topic: str) -> Callable[[], None]:
    def run() -> None:
        producer = pc.create_producer(f"persistent://{topic}", batching_enabled=False)
        for i in range(MESSAGES):
            producer.send(f"m{i}".encode())
        producer.close()
    return run


def _ws_sends(broker: tuple[str, str], topic: str) -> Callable[[], None]:
    def run() -> None:
        with open_ws(ws_url(broker, "producer", topic)) as ws:
            for i in range(MESSAGES):
                send_frame(ws, {"payload": b64(f"m{i}"), "context": str(i)})
                assert recv_frame(ws)["result"] == "ok"
    return run


def _rest_sends(http: httpx.Client, topic: str) -> Callable[[], None]:
    def run() -> None:
        for i in range(MESSAGES):
            assert rest_produce(http, topic, f"m{i}").status_code == 200
    return run


@pytest.mark.parametrize("edge", ["binary", "websocket", "rest"])
def test_publish_rate_throttles_every_edge(broker: tuple[str, str], http: httpx.Client, pc: pulsar.Client,
                                           namespace: str, edge: str) -> None:
    def sends(topic: str) -> Callable[[], None]:
        if edge == "binary":
            return _binary_sends(pc, topic)
        return _ws_sends(broker, topic) if edge == "websocket" else _rest_sends(http, topic)

    free_s = _timed(sends(f"{namespace}/free"))
    set_policy(http, f"namespaces/{namespace}/publishRate", {"publishThrottlingRateInMsg": RATE})
    throttled_s = _timed(sends(f"{namespace}/throttled"))
    assert throttled_s >= THROTTLED_S_MIN, f"{MESSAGES} messages at {RATE}/s took {throttled_s:.2f} s"
    assert free_s < throttled_s / 2, f"unthrottled {free_s:.2f} s, throttled {throttled_s:.2f} s"
    stored = http.get(f"/admin/v2/persistent/{namespace}/throttled/stats").json()
    assert stored["msgInCounter"] == MESSAGES  # throttled, never refused


# --- dispatchRate -----------------------------------------------------------------------------------
def _fill(http: httpx.Client, topic: str) -> None:
    """MESSAGES messages, each its own entry (a batch is dispatched whole, as Pulsar does)."""
    for i in range(MESSAGES):
        assert rest_produce(http, topic, f"m{i}").status_code == 200


def _binary_receives(pc: pulsar.Client, topic: str) -> Callable[[], None]:
    def run() -> None:
        consumer = pc.subscribe(f"persistent://{topic}", "s", initial_position=pulsar.InitialPosition.Earliest)
        for _ in range(MESSAGES):
            consumer.acknowledge(consumer.receive(RECEIVE_TIMEOUT_MS))
        consumer.close()
    return run


def _ws_receives(broker: tuple[str, str], topic: str) -> Callable[[], None]:
    def run() -> None:
        url = ws_url(broker, "consumer", topic, "/s?subscriptionInitialPosition=Earliest")
        with open_ws(url) as ws:
            for _ in range(MESSAGES):
                send_frame(ws, {"messageId": recv_frame(ws)["messageId"]})
    return run


def _rest_receives(http: httpx.Client, topic: str) -> Callable[[], None]:
    def run() -> None:
        got: list[str] = []
        deadline = time.monotonic() + 60
        while len(got) < MESSAGES:
            assert time.monotonic() < deadline
            response = rest_pull(http, topic, "s", waitTimeMs=1000)
            assert response.status_code == 200, response.text
            messages = response.json()["messages"]
            got += [base64.b64decode(m["payload"]).decode() for m in messages]
            if messages:
                ack = http.post(f"/topics/persistent/{topic}/subscription/s/ack",
                                json={"messageIds": [m["messageId"] for m in messages]})
                assert ack.status_code == 200, ack.text
        assert sorted(got) == sorted(f"m{i}" for i in range(MESSAGES))
    return run


@pytest.mark.parametrize("edge", ["binary", "websocket", "rest"])
def test_dispatch_rate_throttles_every_edge(broker: tuple[str, str], http: httpx.Client, pc: pulsar.Client,
                                            namespace: str, edge: str) -> None:
    def receives(topic: str) -> Callable[[], None]:
        if edge == "binary":
            return _binary_receives(pc, topic)
        return _ws_receives(broker, topic) if edge == "websocket" else _rest_receives(http, topic)

    for topic in ("free", "throttled"):
        _fill(http, f"{namespace}/{topic}")
    free_s = _timed(receives(f"{namespace}/free"))
    set_policy(http, f"persistent/{namespace}/throttled/dispatchRate", {"dispatchThrottlingRateInMsg": RATE})
    throttled_s = _timed(receives(f"{namespace}/throttled"))
    assert throttled_s >= THROTTLED_S_MIN, f"{MESSAGES} messages at {RATE}/s took {throttled_s:.2f} s"
    assert free_s < throttled_s / 2, f"unthrottled {free_s:.2f} s, throttled {throttled_s:.2f} s"
