"""REST consumers (pull, ack, negative ack) against a real uvicorn server on an ephemeral port.

Checks: a pull returns messages in the WebSocket API's shape (base64 ``MessageIdData`` ids that
name the stored entry, base64 payloads, keys, properties, ISO-8601 times, offsets); a new
subscription starts at ``latest`` unless asked otherwise; acks are durable — after a server
restart on the same data directory acked messages are not redelivered, an unacked one is, with
its redelivery count, and an id handed out before the restart can still be acked; unacked
messages come back after the ack timeout and nacked ones after the nack delay; concurrent pulls
on a Shared subscription never hand out one message twice, and a pull that names no type joins
an active Shared subscription beside its other consumers; partitions; the registry closes idle
REST consumers (redelivering what they held) but never one with a pull in progress, replaces a
consumer closed under it, and is bounded; every bad-input class gets a 4xx JSON error and
acknowledges nothing; and with authentication on, no token → 401, no consume grant → 403, a
granted role → 200.
"""

from __future__ import annotations

import base64
import dataclasses
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.auth import AuthConfig
from api.errors import TooManyConnections
from api.limits import EdgeLimits
from api.rest_consume import ConsumerSettings, PullParams, RestConsumers
from broker.consumer import ConsumerConfig
from broker.entry_format import Message
from broker.message_id import MessageId
from broker.service import BrokerConfig, BrokerService
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName
from consumers.cli.tokens import create_token
from tests.integration.server import running_server
from tests.publishing import publish_to

TOPIC = "public/default/events"
TOPIC_URL = f"/topics/persistent/{TOPIC}"
SUB_URL = f"{TOPIC_URL}/subscription/workers"
WAIT_DEADLINE_S = 30.0
PULL_BYTES = EdgeLimits().pull_response_bytes_max
SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[httpx.Client, BrokerService]]:
    with running_server(str(tmp_path / "data")) as (url, service), httpx.Client(base_url=url, timeout=60) as client:
        yield client, service


def produce(client: httpx.Client, payloads: list[str], url: str = TOPIC_URL, **fields: Any) -> list[dict[str, Any]]:
    response = client.post(url, json={"messages": [{"payload": p, **fields} for p in payloads]})
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["messagePublishResults"]
    return results


def pull(client: httpx.Client, url: str = SUB_URL, **params: Any) -> list[dict[str, Any]]:
    response = client.post(f"{url}/pull", params=params)
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def pull_until(client: httpx.Client, count: int, url: str = SUB_URL, **params: Any) -> list[dict[str, Any]]:
    """Pull (long-polling) until ``count`` messages arrived or the deadline passed."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + WAIT_DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        got += pull(client, url, waitTimeMs=2_000, **params)
    return got


def ack(client: httpx.Client, url: str = SUB_URL, **body: Any) -> httpx.Response:
    return client.post(f"{url}/ack", json=body)


def payloads(messages: list[dict[str, Any]]) -> list[str]:
    return [base64.b64decode(m["payload"]).decode() for m in messages]


def backlog(service: BrokerService, topic: str, subscription: str) -> int:
    cursor = service.topics.topic(TopicName.parse(topic), create=False).cursors.get(subscription)
    assert cursor is not None
    return cursor.backlog_messages()


def test_pull_returns_messages_in_the_websocket_shape(server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    first = produce(client, ["alpha"], key="k1", properties={"a": "1"}, eventTime="1700000000123")
    batch = produce(client, ["beta", "gamma"])
    messages = pull(client, subscriptionInitialPosition="Earliest", maxMessages=10)
    assert payloads(messages) == ["alpha", "beta", "gamma"]
    assert [m["offset"] for m in messages] == [0, 1, 2]
    assert [m["redeliveryCount"] for m in messages] == [0, 0, 0]
    produced_ids = [MessageId.parse(r["messageId"]) for r in first + batch]
    assert [MessageId.from_base64(m["messageId"]) for m in messages] == produced_ids
    assert messages[0]["key"] == "k1" and messages[0]["properties"] == {"a": "1"}
    assert messages[0]["eventTime"] == "2023-11-14T22:13:20.123Z"
    assert messages[1]["key"] is None and messages[1]["eventTime"] is None
    publish_time = datetime.fromisoformat(messages[0]["publishTime"])
    assert publish_time.utcoffset() is not None and publish_time.year >= 2024


def test_new_subscriptions_start_at_latest_by_default(server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    produce(client, ["before"])
    assert pull(client) == []
    produce(client, ["after"])
    assert payloads(pull(client)) == ["after"]


def test_max_messages_bounds_a_pull_and_the_rest_waits_for_the_next(
        server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    produce(client, [f"m{i}" for i in range(5)])
    first = pull(client, subscriptionInitialPosition="Earliest", maxMessages=2)
    second = pull(client, maxMessages=10)
    assert payloads(first) == ["m0", "m1"] and payloads(second) == ["m2", "m3", "m4"]


def test_acks_are_durable_across_a_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    with running_server(data_dir) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        produce(client, [f"m{i}" for i in range(5)])
        messages = pull(client, subscriptionInitialPosition="Earliest", maxMessages=10)
        assert payloads(messages) == ["m0", "m1", "m2", "m3", "m4"]
        done = ack(client, messageIds=[messages[0]["messageId"], messages[1]["messageId"]],
                   offsets=[messages[2]["offset"]])
        assert done.status_code == 200 and done.json() == {"acknowledged": 3}
        late_id = messages[3]["messageId"]
    with running_server(data_dir) as (url, service), httpx.Client(base_url=url, timeout=60) as client:
        # No REST consumer exists yet: this ack goes to the cursor directly.
        assert ack(client, messageIds=[late_id]).json() == {"acknowledged": 1}
        again = pull(client, maxMessages=10)
        assert payloads(again) == ["m4"]
        assert again[0]["redeliveryCount"] == 1  # handed out before the restart, never acked
        assert backlog(service, TOPIC, "workers") == 1


def test_unacked_messages_come_back_after_the_ack_timeout(server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    produce(client, ["slow"])
    first = pull(client, subscriptionInitialPosition="Earliest", ackTimeoutMillis=1_000)
    again = pull_until(client, 1)
    assert payloads(again) == ["slow"]
    assert again[0]["messageId"] == first[0]["messageId"] and again[0]["redeliveryCount"] == 1
    assert ack(client, messageIds=[again[0]["messageId"]]).status_code == 200


def test_negative_acknowledge_redelivers_after_the_delay(server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    produce(client, ["retry-me", "fine"])
    messages = pull(client, subscriptionInitialPosition="Earliest", negativeAckRedeliveryDelay=0, maxMessages=2)
    assert payloads(messages) == ["retry-me", "fine"]
    nacked = client.post(f"{SUB_URL}/negativeAcknowledge", json={"messageIds": [messages[0]["messageId"]]})
    assert nacked.status_code == 200 and nacked.json() == {"negativelyAcknowledged": 1}
    again = pull_until(client, 1)
    assert payloads(again) == ["retry-me"] and again[0]["redeliveryCount"] == 1


def test_stats_stop_counting_a_nacked_message_as_delayed_once_it_is_acknowledged(
        server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    produce(client, ["nacked then acked"])
    messages = pull(client, subscriptionInitialPosition="Earliest", subscriptionType="Shared")
    message_id = messages[0]["messageId"]
    stats_url = f"/admin/v2/persistent/{TOPIC}/stats"
    assert client.post(f"{SUB_URL}/negativeAcknowledge", json={"messageIds": [message_id]}).status_code == 200
    assert client.get(stats_url).json()["subscriptions"]["workers"]["msgDelayed"] == 1  # 60 s nack delay
    assert ack(client, messageIds=[message_id]).json() == {"acknowledged": 1}
    workers = client.get(stats_url).json()["subscriptions"]["workers"]
    assert (workers["msgDelayed"], workers["msgBacklog"]) == (0, 0)


def test_concurrent_pulls_on_a_shared_subscription_never_share_a_message(
        server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    total, pullers = 200, 4
    pull(client, subscriptionType="Shared")  # creates the subscription at latest
    for start in range(0, total, 20):
        produce(client, [f"m{i}" for i in range(start, start + 20)])
    seen: list[list[int]] = [[] for _ in range(pullers)]
    done = threading.Event()

    def puller(index: int) -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as own:
            deadline = time.monotonic() + WAIT_DEADLINE_S
            while not done.is_set() and time.monotonic() < deadline:
                got = pull(own, subscriptionType="Shared", maxMessages=7, waitTimeMs=200)
                seen[index] += [m["offset"] for m in got]
                if got:
                    assert ack(own, messageIds=[m["messageId"] for m in got]).status_code == 200
                if sum(len(s) for s in seen) >= total:
                    done.set()

    with ThreadPoolExecutor(pullers) as pool:
        for future in [pool.submit(puller, i) for i in range(pullers)]:
            future.result()
    everything = [offset for part in seen for offset in part]
    assert sorted(everything) == list(range(total))  # each message exactly once
    assert backlog(service, TOPIC, "workers") == 0


def test_partitions(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    service.topics.create_partitioned(TopicName.parse("public/default/parts"), 2)
    url = "/topics/persistent/public/default/parts/partitions/1/subscription/s"
    assert pull(client, url) == []
    produce(client, ["p1"], url="/topics/persistent/public/default/parts/partitions/1")
    messages = pull(client, url)
    assert payloads(messages) == ["p1"] and MessageId.from_base64(messages[0]["messageId"]).partition == 1
    assert ack(client, url, messageIds=[messages[0]["messageId"]]).status_code == 200
    assert backlog(service, "public/default/parts-partition-1", "s") == 0
    base = client.post("/topics/persistent/public/default/parts/subscription/s/pull")
    assert base.status_code == 400 and "partitions" in base.json()["message"]
    missing = client.post("/topics/persistent/public/default/parts/partitions/5/subscription/s/pull")
    assert missing.status_code == 400 and missing.json()["code"] == "invalid_request"


BAD_PULLS: list[tuple[str, dict[str, Any]]] = [
    (f"{SUB_URL}/pull", {"maxMessages": 0}),
    (f"{SUB_URL}/pull", {"maxMessages": 10_001}),
    (f"{SUB_URL}/pull", {"maxMessages": "many"}),
    (f"{SUB_URL}/pull", {"waitTimeMs": 30_001}),
    (f"{SUB_URL}/pull", {"waitTimeMs": -1}),
    (f"{SUB_URL}/pull", {"ackTimeoutMillis": 10}),
    (f"{SUB_URL}/pull", {"subscriptionType": "Everyone"}),
    (f"{SUB_URL}/pull", {"subscriptionInitialPosition": "middle"}),
    (f"{SUB_URL}/pull", {"deadLetterTopic": "a/b/c/d"}),
    ("/topics/persistent/public/default/bad%20name/subscription/s/pull", {}),
    ("/topics/persistent/public/default/events/subscription/bad%20sub/pull", {}),
]

BAD_ACK_BODIES = [
    b"{not json",
    b"[]",
    b"{}",
    b'{"messageIds": "CAEQAA=="}',
    b'{"messageIds": ["%%%not-base64"]}',
    b'{"messageIds": ["AAAA"]}',  # base64, but not a MessageIdData
    b'{"messageIds": ["CGMQAA=="]}',  # ledger 99, entry 0: no such message
    b'{"offsets": [-1]}',
    b'{"offsets": [0, 99]}',
    b'{"offsets": ["zero"]}',
]


def test_bad_pull_parameters_get_a_400(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    for path, params in BAD_PULLS:
        response = client.post(path, params=params)
        assert response.status_code == 400, (path, params, response.text)
        assert response.json()["code"] == "invalid_request" and response.json()["message"], (path, params)
    assert service.subscriptions.of(TopicName.parse(TOPIC)) == []


def test_bad_acks_get_a_400_and_acknowledge_nothing(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    produce(client, ["one", "two"])
    assert len(pull(client, subscriptionInitialPosition="Earliest")) == 2
    for body in BAD_ACK_BODIES:
        for action in ("ack", "negativeAcknowledge"):
            response = client.post(f"{SUB_URL}/{action}", content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400, (action, body, response.text)
            assert response.json()["code"] == "invalid_request" and response.json()["message"], (action, body)
    assert backlog(service, TOPIC, "workers") == 2
    (subscription,) = service.subscriptions.of(TopicName.parse(TOPIC))
    assert subscription.statistics().unacked_messages == 2  # nothing was nacked either


@pytest.fixture
def pulled(server: tuple[httpx.Client, BrokerService]) -> tuple[httpx.Client, BrokerService, list[dict[str, Any]]]:
    client, service = server
    produce(client, ["one", "two"])
    return client, service, pull(client, subscriptionInitialPosition="Earliest")


def test_an_ack_with_one_unknown_id_acknowledges_none(
        pulled: tuple[httpx.Client, BrokerService, list[dict[str, Any]]]) -> None:
    client, service, messages = pulled
    unknown = MessageId(99, 0).to_base64()
    response = ack(client, messageIds=[messages[0]["messageId"], unknown])
    assert response.status_code == 400 and unknown in response.json()["message"]
    assert backlog(service, TOPIC, "workers") == 2


def test_acks_for_unknown_subscriptions_and_topics_are_404(
        pulled: tuple[httpx.Client, BrokerService, list[dict[str, Any]]]) -> None:
    client, _, messages = pulled
    for url in (f"{TOPIC_URL}/subscription/nobody", "/topics/persistent/public/default/nowhere/subscription/s"):
        response = ack(client, url, messageIds=[messages[0]["messageId"]])
        assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_conflicting_consumer_settings_are_refused(server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    assert pull(client, subscriptionType="Exclusive", ackTimeoutMillis=5_000) == []
    assert pull(client) == []  # omitted settings follow the running consumer
    for params in ({"subscriptionType": "Shared"}, {"ackTimeoutMillis": 6_000}):
        response = client.post(f"{SUB_URL}/pull", params=params)
        assert response.status_code == 409 and response.json()["code"] == "consumer_busy"


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now_s


def test_idle_rest_consumers_close_and_hand_back_their_messages(tmp_path: Path) -> None:
    clock = FakeClock()
    no_ack_timeouts = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000)
    service = BrokerService(str(tmp_path / "data"), no_ack_timeouts, clock=clock)
    service.start()
    registry = RestConsumers(service, EdgeLimits())
    name = TopicName.parse(TOPIC)
    settings = ConsumerSettings.of(PullParams.model_validate({"ackTimeoutMillis": 3_600_000}))
    try:
        publish_to(service, name, [Message(payload=b"held")], producer_name="p")
        rest = registry.begin_pull(name, "workers", settings, "earliest", 1, "anonymous")
        assert [d.message.payload for d in rest.take(1, PULL_BYTES)] == [b"held"]
        clock.now_s += 7_200
        assert registry.sweep() == 0  # a pull is still in progress
        registry.end_pull(rest, 0)
        clock.now_s += 3_599
        assert registry.sweep() == 0  # idle, but not for longer than its ack timeout
        clock.now_s += 2
        assert registry.sweep() == 1 and len(registry) == 0
        assert rest.consumer.closed
        again = registry.begin_pull(name, "workers", settings, "earliest", 1, "anonymous")
        redelivered = again.take(1, PULL_BYTES)
        assert [(d.message.payload, d.redelivery_count) for d in redelivered] == [(b"held", 1)]
        registry.end_pull(again, 0)
    finally:
        registry.close()
        service.close()


def test_a_consumer_closed_under_the_registry_is_replaced(tmp_path: Path) -> None:
    service = BrokerService(str(tmp_path / "data"), BrokerConfig.test_min())
    service.start()
    registry = RestConsumers(service, EdgeLimits())
    name = TopicName.parse(TOPIC)
    settings = ConsumerSettings.of(PullParams.model_validate({}))
    try:
        first = registry.begin_pull(name, "workers", settings, "earliest", 1, "anonymous")
        registry.end_pull(first, 1)
        first.consumer.close()  # e.g. the subscription was deleted by force
        publish_to(service, name, [Message(payload=b"after")], producer_name="p")
        second = registry.begin_pull(name, "workers", settings, "earliest", 1, "anonymous")
        assert second is not first and not second.consumer.closed
        assert [d.message.payload for d in second.take(1, PULL_BYTES)] == [b"after"]
        registry.end_pull(second, 0)
    finally:
        registry.close()
        service.close()


def test_a_pull_without_a_type_joins_an_active_shared_subscription(tmp_path: Path) -> None:
    service = BrokerService(str(tmp_path / "data"), BrokerConfig.test_min())
    service.start()
    registry = RestConsumers(service, EdgeLimits())
    name = TopicName.parse(TOPIC)
    try:
        other = service.subscriptions.subscribe(name, "workers", SubscriptionType.SHARED, ConsumerConfig("ws-consumer"))
        for i in range(10):
            publish_to(service, name, [Message(payload=f"m{i}".encode())], producer_name="p")
        other.flow(4)
        rest = registry.begin_pull(name, "workers", ConsumerSettings.of(PullParams.model_validate({})), "latest", 10,
                                   "anonymous")
        pulled = rest.take(10, PULL_BYTES)
        registry.end_pull(rest, 10 - len(pulled))
        assert rest.consumer.subscription.type is SubscriptionType.SHARED
        to_other: list[int] = []
        while (run := other.poll()) is not None:
            to_other.extend(run.offsets)
        assert len(to_other) == 4
        assert sorted(to_other + [d.offset for d in pulled]) == list(range(10))  # shared, never twice
    finally:
        registry.close()
        service.close()


def test_the_registry_is_bounded_in_all_per_role_and_per_namespace(tmp_path: Path) -> None:
    service = BrokerService(str(tmp_path / "data"), BrokerConfig.test_min())
    service.start()
    service.namespaces.create_namespace("public/other")
    limits = EdgeLimits(rest_consumers_max=3, rest_consumers_per_role_max=1, rest_consumers_per_namespace_max=2)
    registry = RestConsumers(service, limits)
    settings = ConsumerSettings.of(PullParams.model_validate({}))
    here, there = TopicName.parse(TOPIC), TopicName.parse("persistent://public/other/t")
    try:
        first = registry.begin_pull(here, "a", settings, "latest", 1, "alice")
        registry.end_pull(first, 1)
        with pytest.raises(TooManyConnections, match="role 'alice' has 1 REST consumers open"):
            registry.begin_pull(here, "b", settings, "latest", 1, "alice")  # one role cannot take them all
        registry.end_pull(registry.begin_pull(here, "b", settings, "latest", 1, "bob"), 1)
        with pytest.raises(TooManyConnections, match="namespace public/default has 2 REST consumers open"):
            registry.begin_pull(here, "c", settings, "latest", 1, "carol")  # nor one namespace
        registry.end_pull(registry.begin_pull(there, "c", settings, "latest", 1, "carol"), 1)
        with pytest.raises(TooManyConnections, match="3 REST consumers are open"):
            registry.begin_pull(there, "d", settings, "latest", 1, "dave")
        assert registry.begin_pull(here, "a", settings, "latest", 1, "bob") is first  # an open one is shared
        registry.end_pull(first, 1)
    finally:
        registry.close()
        service.close()


def test_authorization(tmp_path: Path) -> None:
    auth = AuthConfig(enabled=True, secret_key=SECRET, superuser_roles=frozenset({"admin"}))
    with running_server(str(tmp_path / "data"), auth=auth) as (url, service), \
            httpx.Client(base_url=url, timeout=60) as client:
        def as_role(role: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {create_token(role, secret_key=SECRET)}"}

        admin = as_role("admin")
        assert client.post(f"{SUB_URL}/pull", headers=admin).status_code == 200
        client.post(TOPIC_URL, json={"messages": [{"payload": "secret"}]}, headers=admin)
        for path in ("pull", "ack", "negativeAcknowledge"):
            body = {"offsets": [0]}
            anonymous = client.post(f"{SUB_URL}/{path}", json=body)
            assert anonymous.status_code == 401 and anonymous.json()["code"] == "unauthorized"
            ungranted = client.post(f"{SUB_URL}/{path}", json=body, headers=as_role("reader"))
            assert ungranted.status_code == 403 and ungranted.json()["code"] == "forbidden"
        assert backlog(service, TOPIC, "workers") == 1  # the refused ack changed nothing
        service.namespaces.set_policy("public/default", "auth_policies", {"namespace_auth": {"reader": ["consume"]}})
        granted = client.post(f"{SUB_URL}/pull", headers=as_role("reader"))
        assert granted.status_code == 200 and payloads(granted.json()["messages"]) == ["secret"]
        acked = client.post(f"{SUB_URL}/ack", json={"offsets": [0]}, headers=as_role("reader"))
        assert acked.status_code == 200 and backlog(service, TOPIC, "workers") == 0
        writer_only = {"namespace_auth": {"reader": ["consume"], "writer": ["produce"]}}
        service.namespaces.set_policy("public/default", "auth_policies", writer_only)
        assert client.post(f"{SUB_URL}/pull", headers=as_role("writer")).status_code == 403
