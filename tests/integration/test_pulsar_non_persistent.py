"""Non-persistent topics (``non-persistent://``) with the official ``pulsar-client`` against a
real ``magnetar standalone``: at-most-once, in memory, delivered only to consumers connected
when a message is sent; a consumer with no room has the message dropped (``msgDropRate`` in the
topic's stats), the producer is never held back; nothing survives a restart.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest

from tests.integration.pulsar_support import binary_broker, client, drain, nothing_more, receive_all
from tests.integration.ws_client import open_ws, recv_frame, recv_nothing, send_frame, ws_base

NS = "public/default"
PREFIX = f"non-persistent://{NS}"
WAIT_S = 15


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with binary_broker(tmp_path_factory.mktemp("non-persistent")) as (http_url, pulsar_url, _):
        yield http_url, pulsar_url


@pytest.fixture()
def pulsar_client(broker: tuple[str, str]) -> Iterator[pulsar.Client]:
    c = client(broker[1])
    yield c
    c.close()


def test_a_consumer_connected_at_send_time_gets_the_message_a_later_one_does_not(
        pulsar_client: pulsar.Client) -> None:
    topic = f"{PREFIX}/np-basic"
    early = pulsar_client.subscribe(topic, "early")
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    sent = [producer.send(f"m{i}".encode()) for i in range(3)]
    assert len({(m.ledger_id(), m.entry_id()) for m in sent}) == 3  # each send has its own id
    assert [m.data() for m in receive_all(early, 3)] == [b"m0", b"m1", b"m2"]
    late = pulsar_client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    assert nothing_more(late, 500)  # nothing is stored for a subscription that was not there
    producer.send(b"after")
    assert late.receive(10_000).data() == b"after"
    assert early.receive(10_000).data() == b"after"


def test_a_shared_subscription_spreads_over_its_consumers(pulsar_client: pulsar.Client) -> None:
    topic = f"{PREFIX}/np-shared"
    consumers = [pulsar_client.subscribe(topic, "work", consumer_type=pulsar.ConsumerType.Shared,
                                         consumer_name=f"c{i}") for i in range(2)]
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"s{i}".encode())
    got = [sorted(m.data() for m in drain(c)) for c in consumers]
    assert sorted(got[0] + got[1]) == sorted(f"s{i}".encode() for i in range(20))
    assert got[0] and got[1]  # both consumers got some


def test_key_shared_keeps_each_key_on_one_consumer_and_failover_on_the_active_one(
        pulsar_client: pulsar.Client) -> None:
    topic = f"{PREFIX}/np-keyed"
    keyed = [pulsar_client.subscribe(topic, "keyed", consumer_type=pulsar.ConsumerType.KeyShared,
                                     consumer_name=f"k{i}") for i in range(2)]
    failover = [pulsar_client.subscribe(topic, "failover", consumer_type=pulsar.ConsumerType.Failover,
                                        consumer_name=f"f{i}") for i in range(2)]
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    for i in range(40):
        producer.send(f"{i}".encode(), partition_key=f"key-{i % 8}")
    by_consumer = [{m.partition_key() for m in drain(c)} for c in keyed]
    assert sum(len(keys) for keys in by_consumer) == 8 and not by_consumer[0] & by_consumer[1]
    counts = sorted(len(drain(c)) for c in failover)
    assert counts == [0, 40]


def test_a_reader_gets_what_is_sent_after_it_connected(pulsar_client: pulsar.Client) -> None:
    topic = f"{PREFIX}/np-reader"
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    reader = pulsar_client.create_reader(topic, pulsar.MessageId.earliest)
    producer.send(b"after")
    assert reader.read_next(10_000).data() == b"after"
    with pytest.raises(pulsar.Timeout):
        reader.read_next(300)
    with pytest.raises(pulsar.NotAllowedError):  # nothing is stored: Pulsar has no last message id either
        reader.has_message_available()
    with pytest.raises(pulsar.NotAllowedError):
        reader.seek(pulsar.MessageId.earliest)


def test_a_pattern_subscription_finds_live_non_persistent_topics(pulsar_client: pulsar.Client) -> None:
    producers = [pulsar_client.create_producer(f"{PREFIX}/np-pat-{i}", batching_enabled=False) for i in range(2)]
    other = pulsar_client.create_producer(f"{PREFIX}/np-other", batching_enabled=False)
    consumer = pulsar_client.subscribe(re.compile(f"{PREFIX}/np-pat-.*"), "pat",
                                       regex_subscription_mode=pulsar.RegexSubscriptionMode.NonPersistentOnly)
    for i, producer in enumerate(producers):
        producer.send(f"p{i}".encode())
    other.send(b"not for the pattern")
    got = sorted(m.data() for m in receive_all(consumer, 2))
    assert got == [b"p0", b"p1"]
    assert nothing_more(consumer, 500)


def test_a_partitioned_non_persistent_topic(broker: tuple[str, str], pulsar_client: pulsar.Client) -> None:
    http_url, _ = broker
    response = httpx.put(f"{http_url}/admin/v2/non-persistent/{NS}/np-parted/partitions", json=3, timeout=30)
    assert response.status_code in (200, 204), response.text
    meta = httpx.get(f"{http_url}/admin/v2/non-persistent/{NS}/np-parted/partitions", timeout=30)
    assert meta.json()["partitions"] == 3
    found = httpx.get(f"{http_url}/lookup/v2/topic/non-persistent/{NS}/np-parted", timeout=30)
    assert found.status_code == 200 and found.json()["brokerUrl"].startswith("pulsar://")
    consumer = pulsar_client.subscribe(f"{PREFIX}/np-parted", "all")
    producer = pulsar_client.create_producer(f"{PREFIX}/np-parted", batching_enabled=False)
    for i in range(9):
        producer.send(f"k{i}".encode(), partition_key=f"key-{i}")
    got = receive_all(consumer, 9)
    assert sorted(m.data() for m in got) == sorted(f"k{i}".encode() for i in range(9))
    assert len({m.topic_name() for m in got}) > 1  # spread over the partitions
    stats = httpx.get(f"{http_url}/admin/v2/non-persistent/{NS}/np-parted/partitioned-stats", timeout=30).json()
    assert stats["metadata"]["partitions"] == 3 and stats["msgInCounter"] == 9 and stats["msgOutCounter"] == 9
    assert len(stats["partitions"]) == 3


def _stats(http_url: str, local: str) -> dict:  # type: ignore[type-arg]
    response = httpx.get(f"{http_url}/admin/v2/non-persistent/{NS}/{local}/stats", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_a_consumer_that_stops_reading_has_messages_dropped_and_counted(
        broker: tuple[str, str], pulsar_client: pulsar.Client) -> None:
    http_url, _ = broker
    topic = f"{PREFIX}/np-drop"
    slow = pulsar_client.subscribe(topic, "slow", receiver_queue_size=5)
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    sent = 200
    for i in range(sent):
        producer.send(f"d{i}".encode())  # never held back by the consumer that reads nothing
    received = drain(slow, 1000)
    assert 0 < len(received) < sent
    stats = _stats(http_url, "np-drop")
    subscription = stats["subscriptions"]["slow"]
    assert len(received) + subscription["msgDropCounter"] == sent  # each message delivered or dropped
    assert subscription["msgDropRate"] > 0 and subscription["msgBacklog"] == 0
    assert subscription["consumers"][0]["consumerName"]
    assert stats["msgDropRate"] > 0
    assert stats["publishers"] and stats["publishers"][0]["producerName"] == producer.producer_name()
    assert subscription["type"] == "Exclusive"
    listed = httpx.get(f"{http_url}/admin/v2/non-persistent/{NS}", timeout=30)
    assert listed.status_code == 200 and topic in listed.json()


def test_a_subscription_vanishes_with_its_last_consumer(broker: tuple[str, str],
                                                        pulsar_client: pulsar.Client) -> None:
    http_url, _ = broker
    topic = f"{PREFIX}/np-vanish"
    producer = pulsar_client.create_producer(topic, batching_enabled=False)
    consumer = pulsar_client.subscribe(topic, "gone-soon")
    assert "gone-soon" in _stats(http_url, "np-vanish")["subscriptions"]
    consumer.close()
    deadline = time.monotonic() + WAIT_S
    while "gone-soon" in _stats(http_url, "np-vanish")["subscriptions"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "gone-soon" not in _stats(http_url, "np-vanish")["subscriptions"]
    producer.close()


def test_websocket_producer_and_consumer_on_a_non_persistent_topic(broker: tuple[str, str]) -> None:
    base = f"{ws_base(broker[0])}/ws/v2"
    with open_ws(f"{base}/consumer/non-persistent/{NS}/np-ws/sub") as consumer, \
            open_ws(f"{base}/producer/non-persistent/{NS}/np-ws") as producer:
        send_frame(producer, {"payload": base64.b64encode(b"over ws").decode(), "context": "c1"})
        receipt = recv_frame(producer)
        assert receipt["result"] == "ok" and receipt["context"] == "c1"
        message = recv_frame(consumer)
        assert base64.b64decode(message["payload"]) == b"over ws"
        send_frame(consumer, {"messageId": message["messageId"]})  # an acknowledgement changes nothing
        assert recv_nothing(consumer)


def test_refusals_on_non_persistent_topics_are_pulsars_errors(pulsar_client: pulsar.Client) -> None:
    with pytest.raises(pulsar.TopicNotFound):
        pulsar_client.create_producer("non-persistent://public/nowhere/t")
    with pytest.raises(pulsar.NotAllowedError):
        pulsar_client.create_producer(f"{PREFIX}/bad%name")
    pulsar_client.subscribe(f"{PREFIX}/np-refusals", "held")
    with pytest.raises(pulsar.ConsumerBusy):
        pulsar_client.subscribe(f"{PREFIX}/np-refusals", "held")
    pulsar_client.subscribe(f"{PREFIX}/np-refusals", "shared", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        pulsar_client.subscribe(f"{PREFIX}/np-refusals", "shared")


def test_namespace_quotas_bound_non_persistent_topics(broker: tuple[str, str], pulsar_client: pulsar.Client) -> None:
    http_url, _ = broker
    namespace = f"{http_url}/admin/v2/namespaces/public/np-quotas"
    assert httpx.put(namespace, timeout=30).status_code in (200, 204)
    for policy in ("maxConsumersPerTopic", "maxProducersPerTopic"):
        assert httpx.post(f"{namespace}/{policy}", json=1, timeout=30).status_code in (200, 204)
    topic = "non-persistent://public/np-quotas/bounded"
    pulsar_client.subscribe(topic, "one", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        pulsar_client.subscribe(topic, "one", consumer_type=pulsar.ConsumerType.Shared)
    pulsar_client.create_producer(topic)
    with pytest.raises(pulsar.ProducerBusy):
        pulsar_client.create_producer(topic)


def test_bad_non_persistent_names_get_pulsars_error(broker: tuple[str, str]) -> None:
    http_url, _ = broker
    response = httpx.get(f"{http_url}/admin/v2/non-persistent/{NS}/no-such-topic/stats", timeout=30)
    assert response.status_code == 404 and response.json()["message"]


def test_nothing_is_there_after_a_restart(tmp_path: Path) -> None:
    topic = f"{PREFIX}/np-restart"
    with binary_broker(tmp_path) as (_, pulsar_url, _proc):
        c = client(pulsar_url)
        producer = c.create_producer(topic, batching_enabled=False)
        for i in range(5):
            producer.send(f"r{i}".encode())
        c.close()
    with binary_broker(tmp_path) as (http_url, pulsar_url, _proc):
        c = client(pulsar_url)
        consumer = c.subscribe(topic, "after-restart", initial_position=pulsar.InitialPosition.Earliest)
        assert nothing_more(consumer, 1000)
        listed = httpx.get(f"{http_url}/admin/v2/non-persistent/{NS}", timeout=30)
        assert listed.status_code == 200 and topic in listed.json()  # the consumer keeps it alive
        consumer.close()
        c.close()
