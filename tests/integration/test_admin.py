"""Admin v2 REST API against a real uvicorn server on an ephemeral port.

Checks, each by its real effect: tenants and namespaces round-trip and their policies reach open
topics; non-empty tenants and namespaces are not deleted; topics and partitioned topics are
created, listed, grown and deleted; ``stats``, ``partitioned-stats`` and ``internalStats`` carry
the broker's numbers; subscriptions are created at earliest, latest or a message id; resetting a
subscription by time or message id redelivers from the right message to a connected consumer;
``skip``, ``skip_all`` and ``expireMessages`` move the backlog; peek and ``examinemessage``
return the payload with Pulsar's headers; ``lastMessageId``, ``terminate`` (later produces are
refused) and compaction (reaches SUCCESS, the compacted view holds the latest value per key).
Bad input of every class gets a 4xx JSON error with a code and changes nothing; with token
authentication on, tenants need a superuser and everything inside a tenant its admins.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.auth import AuthConfig
from broker.consumer import Consumer, ConsumerConfig
from broker.delivery import Delivery
from broker.entry_format import Message
from broker.message_id import MessageId
from broker.reader import StartPosition
from broker.service import BrokerService
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName
from consumers.cli.tokens import create_token
from tests.integration.server import running_server
from tests.publishing import publish_to

WAIT_S = 10.0
ADMIN = "/admin/v2"
TOPIC = "public/default/orders"
TOPIC_URL = f"{ADMIN}/persistent/{TOPIC}"
SECRET = b"admin-test-secret-key-of-32-bytes!"

Server = tuple[httpx.Client, BrokerService]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with running_server(str(tmp_path / "data")) as (url, service), httpx.Client(base_url=url, timeout=30) as client:
        yield client, service


def publish(service: BrokerService, payloads: list[bytes], topic: str = TOPIC, key: str | None = None) -> list[int]:
    """Publish one message per entry; returns the publish times (ms)."""
    return [publish_to(service, topic, [Message(p, key=key)], producer_name="p").publish_time_ms for p in payloads]


def after_ms(service: BrokerService, epoch_ms: int) -> None:
    """Wait (bounded) until the broker's clock has passed ``epoch_ms``, so the next publish is later."""
    deadline = time.monotonic() + WAIT_S
    while int(service.clock() * 1000) <= epoch_ms and time.monotonic() < deadline:
        time.sleep(0.001)


def take(consumer: Consumer, count: int) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        run = consumer.poll()
        if run is None:
            time.sleep(0.005)
        else:
            got.extend(run.messages())
    return got


def stats(client: httpx.Client, url: str = TOPIC_URL) -> dict[str, Any]:
    response = client.get(f"{url}/stats")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def backlog(client: httpx.Client, subscription: str, url: str = TOPIC_URL) -> int:
    count: int = stats(client, url)["subscriptions"][subscription]["msgBacklog"]
    return count


def ok(response: httpx.Response, status: int = 204) -> httpx.Response:
    assert response.status_code == status, response.text
    return response


def keep_consumed_ledgers(client: httpx.Client) -> None:
    """Infinite retention on public/default: consumed ledgers stay, so cursors can go back."""
    ok(client.post(f"{ADMIN}/namespaces/public/default/retention",
                   json={"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}))


# --- tenants and namespaces ------------------------------------------------------------------
def test_tenants_and_namespaces_round_trip_and_reach_open_topics(server: Server) -> None:
    client, service = server
    assert ok(client.get(f"{ADMIN}/tenants"), 200).json() == ["public"]
    ok(client.put(f"{ADMIN}/tenants/acme", json={"adminRoles": ["ops"], "allowedClusters": ["standalone"]}))
    exists = client.put(f"{ADMIN}/tenants/acme", json={})
    assert exists.status_code == 409 and exists.json()["code"] == "already_exists"
    ok(client.post(f"{ADMIN}/tenants/acme", json={"adminRoles": ["ops", "dev"], "allowedClusters": ["standalone"]}))
    assert ok(client.get(f"{ADMIN}/tenants/acme"), 200).json() == {"adminRoles": ["ops", "dev"],
                                                                   "allowedClusters": ["standalone"]}
    ok(client.put(f"{ADMIN}/namespaces/acme/prod"))
    assert ok(client.get(f"{ADMIN}/namespaces/acme"), 200).json() == ["acme/prod"]
    topic = service.topics.topic("acme/prod/events")
    ok(client.post(f"{ADMIN}/namespaces/acme/prod/retention",
                   json={"retentionTimeInMinutes": 10, "retentionSizeInMB": 100}))
    assert ok(client.get(f"{ADMIN}/namespaces/acme/prod/retention"), 200).json() == {
        "retentionTimeInMinutes": 10, "retentionSizeInMB": 100}
    assert topic.ml.config.retention_time_ms == 600_000 and topic.ml.config.retention_size_bytes == 100 << 20
    ok(client.delete(f"{ADMIN}/namespaces/acme/prod/retention"))  # back to the broker's default: keep everything
    assert topic.ml.config.retention_time_ms == -1 and topic.ml.config.retention_size_bytes == -1
    assert ok(client.get(f"{ADMIN}/namespaces/acme/prod/retention"), 200).json() == {
        "retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    ok(client.post(f"{ADMIN}/namespaces/acme/prod/messageTTL", json=60))
    assert ok(client.get(f"{ADMIN}/namespaces/acme/prod/messageTTL"), 200).json() == 60
    assert topic.ml.config.message_ttl_ms == 60_000
    ok(client.delete(f"{ADMIN}/namespaces/acme/prod/messageTTL"))
    assert client.get(f"{ADMIN}/namespaces/acme/prod/messageTTL").json() is None and topic.ml.config.message_ttl_ms == 0
    ok(client.post(f"{ADMIN}/namespaces/acme/prod/deduplication", json=False))
    assert ok(client.get(f"{ADMIN}/namespaces/acme/prod/deduplication"), 200).json() is False
    assert service.topics.topic("acme/prod/loaded-later").dedup is None
    policies = ok(client.get(f"{ADMIN}/namespaces/acme/prod"), 200).json()
    assert policies["deduplicationEnabled"] is False and "auth_policies" in policies


def test_non_empty_tenants_and_namespaces_are_not_deleted(server: Server) -> None:
    client, service = server
    ok(client.put(f"{ADMIN}/tenants/acme", json={"adminRoles": []}))
    ok(client.put(f"{ADMIN}/namespaces/acme/prod"))
    ok(client.put(f"{ADMIN}/persistent/acme/prod/t"))
    for url in (f"{ADMIN}/namespaces/acme/prod", f"{ADMIN}/tenants/acme"):
        refused = client.delete(url)
        assert refused.status_code == 409 and refused.json()["code"] == "not_empty", refused.text
    assert service.namespaces.namespaces("acme") == ["acme/prod"]
    ok(client.delete(f"{ADMIN}/persistent/acme/prod/t"))
    ok(client.delete(f"{ADMIN}/namespaces/acme/prod"))
    ok(client.delete(f"{ADMIN}/tenants/acme"))
    gone = client.get(f"{ADMIN}/tenants/acme")
    assert gone.status_code == 404 and gone.json()["code"] == "not_found"


# --- topics and partitioned topics -----------------------------------------------------------
def test_topics_and_partitioned_topics_are_created_listed_grown_and_deleted(server: Server) -> None:
    client, service = server
    ok(client.put(TOPIC_URL))
    assert client.put(TOPIC_URL).status_code == 409
    ok(client.put(f"{ADMIN}/persistent/public/default/parts/partitions", json=3))
    assert ok(client.get(f"{ADMIN}/persistent/public/default/parts/partitions"), 200).json() == {"partitions": 3}
    assert ok(client.get(f"{TOPIC_URL}/partitions"), 200).json() == {"partitions": 0}
    assert ok(client.get(f"{ADMIN}/persistent/public/default/partitioned"), 200).json() == [
        "persistent://public/default/parts"]
    assert ok(client.get(f"{ADMIN}/persistent/public/default"), 200).json() == [
        "persistent://public/default/orders"] + [f"persistent://public/default/parts-partition-{i}" for i in range(3)]
    ok(client.post(f"{ADMIN}/persistent/public/default/parts/partitions", json=5))
    assert service.topics.partitions(TopicName.parse("public/default/parts")) == 5
    shrink = client.post(f"{ADMIN}/persistent/public/default/parts/partitions", json=2)
    assert shrink.status_code == 400 and service.topics.partitions(TopicName.parse("public/default/parts")) == 5
    ok(client.delete(f"{ADMIN}/persistent/public/default/parts/partitions"))
    assert client.get(f"{ADMIN}/persistent/public/default/parts/partitions").json() == {"partitions": 0}
    ok(client.delete(TOPIC_URL))
    assert ok(client.get(f"{ADMIN}/persistent/public/default"), 200).json() == []


def test_deleting_a_topic_with_subscriptions_needs_force(server: Server) -> None:
    client, service = server
    publish(service, [b"a"])
    consumer = service.subscriptions.subscribe(TOPIC, "sub", SubscriptionType.EXCLUSIVE, ConsumerConfig("c"),
                                               initial="earliest")
    refused = client.delete(TOPIC_URL)
    assert refused.status_code == 405 and refused.json()["code"] == "not_allowed"
    assert service.topics.exists(TopicName.parse(TOPIC))
    ok(client.delete(TOPIC_URL, params={"force": "true"}))
    assert consumer.closed and not service.topics.exists(TopicName.parse(TOPIC))


# --- statistics ------------------------------------------------------------------------------
def test_stats_and_internal_stats_carry_the_brokers_numbers(server: Server) -> None:
    client, service = server
    ok(client.put(TOPIC_URL))
    ok(client.put(f"{TOPIC_URL}/subscription/sub", json="earliest"))  # keeps the ledgers from trimming
    publish(service, [f"m{i}".encode() for i in range(12)])
    topic_stats = stats(client)
    assert topic_stats["msgInCounter"] == 12 and topic_stats["bytesInCounter"] > 12 * 2
    assert topic_stats["storageSize"] >= topic_stats["bytesInCounter"] and topic_stats["publishers"] == []
    assert isinstance(topic_stats["msgRateIn"], float) and topic_stats["nextOffset"] == 12
    assert topic_stats["subscriptions"]["sub"]["msgBacklog"] == 12
    consumer = service.subscriptions.subscribe(TOPIC, "sub", SubscriptionType.SHARED, ConsumerConfig("worker"))
    consumer.flow(5)
    delivered = take(consumer, 5)
    consumer.ack([d.offset for d in delivered if d.offset != 1] + [7])
    sub = stats(client)["subscriptions"]["sub"]
    assert sub["msgBacklog"] == 12 - 5 and sub["msgOutCounter"] == 5 and sub["unackedMessages"] == 1
    assert sub["type"] == "Shared" and [c["consumerName"] for c in sub["consumers"]] == ["worker"]
    assert stats(client)["msgOutCounter"] == 5

    internal = ok(client.get(f"{TOPIC_URL}/internalStats"), 200).json()
    assert internal["entriesAddedCounter"] == 12 and internal["numberOfEntries"] == 12
    assert len(internal["ledgers"]) >= 3 and sum(ledger["entries"] for ledger in internal["ledgers"]) == 12
    assert internal["state"] == "LedgerOpened"
    last = ok(client.get(f"{TOPIC_URL}/lastMessageId"), 200).json()
    assert internal["lastConfirmedEntry"] == f"{last['ledgerId']}:{last['entryId']}"
    cursor = internal["cursors"]["sub"]
    first = service.topics.topic(TOPIC).message_id_of_offset(0)
    assert cursor["markDeletePosition"] == f"{first.ledger_id}:{first.entry_id}"  # offset 0 acked, 1 not
    seven = service.topics.topic(TOPIC).message_id_of_offset(7)
    assert f"({seven.ledger_id}:{seven.entry_id - 1}..{seven.ledger_id}:{seven.entry_id}]" in \
        cursor["individuallyDeletedMessages"]
    assert cursor["markDeleteOffset"] == 1 and cursor["ackedOffsetRanges"] == [[2, 5], [7, 8]]


def test_partitioned_stats_sum_the_partitions(server: Server) -> None:
    client, service = server
    name = "public/default/parts"
    ok(client.put(f"{ADMIN}/persistent/{name}/partitions", json=2))
    publish(service, [b"a", b"b"], topic=f"{name}-partition-0")
    publish(service, [b"c"], topic=f"{name}-partition-1")
    ok(client.put(f"{ADMIN}/persistent/{name}/subscription/sub", json="earliest"))
    body = ok(client.get(f"{ADMIN}/persistent/{name}/partitioned-stats"), 200).json()
    assert body["metadata"] == {"partitions": 2} and body["msgInCounter"] == 3
    assert sorted(body["partitions"]) == [f"persistent://{name}-partition-{i}" for i in range(2)]
    assert body["subscriptions"]["sub"]["msgBacklog"] == 3
    assert ok(client.get(f"{ADMIN}/persistent/{name}/subscriptions"), 200).json() == ["sub"]
    not_per_partition = client.get(f"{ADMIN}/persistent/{name}/partitioned-stats", params={"perPartition": "false"})
    assert not_per_partition.json()["partitions"] == {}
    single = client.get(f"{ADMIN}/persistent/{name}/stats")
    assert single.status_code == 405 and single.json()["code"] == "not_allowed"


# --- subscriptions and cursor moves ----------------------------------------------------------
def test_subscriptions_are_created_at_a_position_listed_and_deleted(server: Server) -> None:
    client, service = server
    keep_consumed_ledgers(client)
    publish(service, [f"m{i}".encode() for i in range(5)])
    ok(client.put(f"{TOPIC_URL}/subscription/from-start", json="earliest"))
    ok(client.put(f"{TOPIC_URL}/subscription/from-now", params={"messageId": "latest"}))
    third = service.topics.topic(TOPIC).message_id_of_offset(2)
    ok(client.put(f"{TOPIC_URL}/subscription/from-third", json={"ledgerId": third.ledger_id,
                                                                 "entryId": third.entry_id}))
    ok(client.put(f"{TOPIC_URL}/subscription/after-third", params={"messageId": f"{third.ledger_id}:{third.entry_id}"},
                  json={"ledgerId": third.ledger_id, "entryId": third.entry_id, "isExcluded": True}))
    assert [backlog(client, s) for s in ("from-start", "from-now", "from-third", "after-third")] == [5, 0, 3, 2]
    again = client.put(f"{TOPIC_URL}/subscription/from-start")
    assert again.status_code == 409 and again.json()["code"] == "already_exists"
    assert ok(client.get(f"{TOPIC_URL}/subscriptions"), 200).json() == [
        "after-third", "from-now", "from-start", "from-third"]
    consumer = service.subscriptions.subscribe(TOPIC, "from-start", SubscriptionType.EXCLUSIVE, ConsumerConfig("c"))
    busy = client.delete(f"{TOPIC_URL}/subscription/from-start")
    assert busy.status_code == 412 and busy.json()["code"] == "precondition_failed" and not consumer.closed
    ok(client.delete(f"{TOPIC_URL}/subscription/from-start", params={"force": "true"}))
    assert consumer.closed and "from-start" not in client.get(f"{TOPIC_URL}/subscriptions").json()
    missing = client.delete(f"{TOPIC_URL}/subscription/from-start")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


def test_resetcursor_redelivers_from_the_right_message_to_a_connected_consumer(server: Server) -> None:
    client, service = server
    keep_consumed_ledgers(client)
    times = publish(service, [f"m{i}".encode() for i in range(5)])
    after_ms(service, times[-1])
    times += publish(service, [f"m{i}".encode() for i in range(5, 10)])
    consumer = service.subscriptions.subscribe(TOPIC, "sub", SubscriptionType.EXCLUSIVE, ConsumerConfig("c"),
                                               initial="earliest")
    consumer.flow(100)
    first = take(consumer, 10)
    consumer.ack_cumulative(first[-1].offset)
    assert backlog(client, "sub") == 0
    ok(client.post(f"{TOPIC_URL}/subscription/sub/resetcursor/{times[5]}"))
    assert [d.message.payload for d in take(consumer, 5)] == [f"m{i}".encode() for i in range(5, 10)]
    assert consumer.poll() is None
    consumer.ack_cumulative(9)
    third = service.topics.topic(TOPIC).message_id_of_offset(2)
    body = {"ledgerId": third.ledger_id, "entryId": third.entry_id, "partitionIndex": -1, "batchIndex": -1}
    ok(client.post(f"{TOPIC_URL}/subscription/sub/resetcursor", json=body))
    assert [d.offset for d in take(consumer, 8)] == list(range(2, 10))
    consumer.ack_cumulative(9)
    ok(client.post(f"{TOPIC_URL}/subscription/sub/resetcursor", json={**body, "excluded": True}))
    assert [d.offset for d in take(consumer, 7)] == list(range(3, 10))
    unknown = client.post(f"{TOPIC_URL}/subscription/nobody/resetcursor/0")
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"


def test_skip_skip_all_and_expire_move_the_backlog(server: Server) -> None:
    client, service = server
    ok(client.put(TOPIC_URL))
    for sub in ("a", "b", "c"):
        ok(client.put(f"{TOPIC_URL}/subscription/{sub}", json="earliest"))
    times = publish(service, [f"m{i}".encode() for i in range(10)])
    ok(client.post(f"{TOPIC_URL}/subscription/a/skip/3"))
    assert backlog(client, "a") == 7
    assert ok(client.get(f"{TOPIC_URL}/subscription/a/position/1"), 200).content == b"m3"
    ok(client.post(f"{TOPIC_URL}/subscription/a/skip_all"))
    assert backlog(client, "a") == 0
    assert client.get(f"{TOPIC_URL}/subscription/a/position/1").status_code == 404
    ok(client.post(f"{TOPIC_URL}/subscription/b/expireMessages/3600"))
    assert backlog(client, "b") == 10  # nothing is an hour old
    after_ms(service, times[-1])
    ok(client.post(f"{TOPIC_URL}/subscription/b/expireMessages/0"))
    assert backlog(client, "b") == 0
    ok(client.put(f"{TOPIC_URL}/subscription/d", json="earliest"))
    ok(client.post(f"{TOPIC_URL}/all_subscription/expireMessages/0"))
    assert [backlog(client, s) for s in ("a", "b", "c", "d")] == [0, 0, 0, 0]


# --- messages ----------------------------------------------------------------------------------
def test_peek_and_examine_return_the_payload_with_pulsar_headers(server: Server) -> None:
    client, _ = server
    produced = client.post(f"/topics/persistent/{TOPIC}", json={"producerName": "rest", "messages": [
        {"payload": "hello", "key": "k1", "properties": {"a": "1", "two words": "x"}, "eventTime": "1700000000123"}]})
    assert produced.status_code == 200, produced.text
    message_id = produced.json()["messagePublishResults"][0]["messageId"]
    client.post(f"/topics/persistent/{TOPIC}", json={"payloadEncoding": "base64", "messages": [
        {"payload": base64.b64encode(b"\x00\xffraw").decode(), "key": "ключ"}]})
    ok(client.put(f"{TOPIC_URL}/subscription/sub", json="earliest"))
    peeked = ok(client.get(f"{TOPIC_URL}/subscription/sub/position/1"), 200)
    headers = peeked.headers
    assert peeked.content == b"hello" and headers["content-type"] == "application/octet-stream"
    assert headers["X-Pulsar-Message-ID"] == ":".join(message_id.split(":")[:2])
    assert headers["X-Pulsar-PROPERTY-a"] == "1" and "X-Pulsar-PROPERTY-two words" not in headers
    assert headers["X-Pulsar-PROPERTY"] == '{"a":"1","two words":"x"}'
    assert headers["X-Pulsar-partition-key"] == "k1" and headers["X-Pulsar-partition-key-b64-encoded"] == "false"
    assert datetime.fromisoformat(headers["X-Pulsar-event-time"]).timestamp() == 1700000000.123
    assert datetime.fromisoformat(headers["X-Pulsar-publish-time"]).year >= 2024
    assert headers["X-Pulsar-producer-name"] == "rest" and headers["X-Pulsar-redelivery-count"] == "0"
    assert headers["X-Magnetar-Offset"] == "0" and headers["X-Pulsar-sequence-id"] == "0"
    binary = ok(client.get(f"{TOPIC_URL}/subscription/sub/position/2"), 200)
    assert binary.content == b"\x00\xffraw" and binary.headers["X-Magnetar-Offset"] == "1"
    assert base64.b64decode(binary.headers["X-Pulsar-partition-key"]).decode() == "ключ"
    assert binary.headers["X-Pulsar-partition-key-b64-encoded"] == "true"
    assert client.get(f"{TOPIC_URL}/subscription/sub/position/3").status_code == 404
    earliest = client.get(f"{TOPIC_URL}/examinemessage", params={"initialPosition": "earliest", "messagePosition": 1})
    latest = client.get(f"{TOPIC_URL}/examinemessage", params={"initialPosition": "latest", "messagePosition": 1})
    assert (earliest.content, latest.content) == (b"hello", b"\x00\xffraw")


def test_last_message_id_terminate_then_produce_is_refused(server: Server) -> None:
    client, service = server
    ok(client.put(TOPIC_URL))
    empty = ok(client.get(f"{TOPIC_URL}/lastMessageId"), 200).json()
    assert empty["entryId"] == -1 and empty["partitionIndex"] == -1
    result = publish_to(service, TOPIC, [Message(b"a"), Message(b"b")], producer_name="p")
    last = ok(client.get(f"{TOPIC_URL}/lastMessageId"), 200).json()
    expected = result.message_ids[-1]
    assert MessageId(last["ledgerId"], last["entryId"], last["partitionIndex"], last["batchIndex"]) == expected
    assert last["offset"] == 1
    terminated = ok(client.post(f"{TOPIC_URL}/terminate"), 200).json()
    assert terminated == last
    refused = client.post(f"/topics/persistent/{TOPIC}", json={"messages": [{"payload": "late"}]})
    assert refused.status_code == 409 and refused.json()["code"] == "topic_terminated"
    assert ok(client.get(f"{TOPIC_URL}/internalStats"), 200).json()["state"] == "Terminated"
    assert stats(client)["msgInCounter"] == 2


def test_compaction_status_reaches_success_and_keeps_the_latest_value_per_key(server: Server) -> None:
    client, service = server
    for key, value in (("k1", b"a"), ("k2", b"b"), ("k1", b"c")):
        publish(service, [value], key=key)
    assert ok(client.get(f"{TOPIC_URL}/compaction"), 200).json()["status"] == "NOT_RUN"
    ok(client.put(f"{TOPIC_URL}/compaction"))
    deadline = time.monotonic() + WAIT_S
    status = client.get(f"{TOPIC_URL}/compaction").json()
    while status["status"] in ("NOT_RUN", "RUNNING") and time.monotonic() < deadline:
        time.sleep(0.01)
        status = client.get(f"{TOPIC_URL}/compaction").json()
    assert status["status"] == "SUCCESS" and status["lastError"] == "" and status["messages"] == 2
    reader = service.subscriptions.reader(TOPIC, StartPosition.earliest(), compacted=True)
    view = []
    while (delivery := reader.read_next()) is not None:
        view.append((delivery.message.key, delivery.message.payload))
    assert view == [("k2", b"b"), ("k1", b"c")]
    compacted = ok(client.get(f"{TOPIC_URL}/internalStats"), 200).json()["compactedLedger"]
    assert compacted["ledgerId"] == status["compactedLedgerId"] and compacted["entries"] == 2


# --- bad input ---------------------------------------------------------------------------------
BAD_INPUT = [
    ("get", f"{ADMIN}/tenants/nope", None, 404, "not_found"),
    ("get", f"{ADMIN}/namespaces/nope", None, 404, "not_found"),
    ("get", f"{ADMIN}/persistent/public/nope", None, 404, "not_found"),
    ("get", f"{ADMIN}/namespaces/public/nope/retention", None, 404, "not_found"),
    ("get", f"{ADMIN}/persistent/public/default/nope/stats", None, 404, "not_found"),
    ("get", f"{ADMIN}/persistent/public/default/nope/internalStats", None, 404, "not_found"),
    ("post", f"{TOPIC_URL}/subscription/nobody/skip_all", None, 404, "not_found"),
    ("put", f"{ADMIN}/tenants/bad%20name", {}, 400, "invalid_request"),
    ("put", f"{ADMIN}/namespaces/public/bad%20ns", None, 400, "invalid_request"),
    ("put", f"{ADMIN}/persistent/public/default/bad%20topic", None, 400, "invalid_request"),
    ("put", f"{ADMIN}/persistent/public/default/p/partitions", "three", 400, "invalid_request"),
    ("put", f"{ADMIN}/persistent/public/default/p/partitions", 2.5, 400, "invalid_request"),
    ("put", f"{ADMIN}/persistent/public/default/p/partitions", "3", 400, "invalid_request"),
    ("put", f"{ADMIN}/persistent/public/default/p/partitions", 0, 400, "invalid_request"),
    ("put", f"{ADMIN}/tenants/mars", {"allowedClusters": ["mars"]}, 412, "precondition_failed"),
    ("post", f"{ADMIN}/namespaces/public/default/retention", {"retentionTimeInMinutes": -5, "retentionSizeInMB": 1},
     400, "invalid_request"),
    ("post", f"{ADMIN}/namespaces/public/default/messageTTL", -1, 400, "invalid_request"),
    ("post", f"{ADMIN}/namespaces/public/default/deduplication", "yes", 400, "invalid_request"),
    ("post", f"{ADMIN}/namespaces/public/default/permissions/app", ["fly"], 400, "invalid_request"),
    ("post", f"{TOPIC_URL}/subscription/sub/skip/0", None, 400, "invalid_request"),
    ("post", f"{TOPIC_URL}/subscription/sub/resetcursor", {"ledgerId": "x", "entryId": 0}, 400, "invalid_request"),
    ("post", f"{TOPIC_URL}/subscription/sub/resetcursor/-1", None, 400, "invalid_request"),
    ("put", f"{TOPIC_URL}/subscription/other", {"ledgerId": 999999, "entryId": 0}, 404, "no_such_entry"),
    ("put", f"{TOPIC_URL}/subscription/sub", None, 409, "already_exists"),
    ("get", f"{TOPIC_URL}/subscription/sub/position/0", None, 400, "invalid_request"),
    ("get", f"{TOPIC_URL}/examinemessage?initialPosition=middle", None, 400, "invalid_request"),
]


def _state(client: httpx.Client, service: BrokerService) -> tuple[Any, ...]:
    topic = service.topics.topic(TOPIC)
    namespaces = service.namespaces
    return (namespaces.tenants(), namespaces.namespaces("public"), namespaces.policies("public/default"),
            client.get(f"{ADMIN}/persistent/public/default").json(), service.topics.partitioned_names("public/default"),
            topic.cursors.names(), topic.cursors.get("sub").mark_delete_offset)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for every bad-input case (none of them may change anything)."""
    with running_server(str(tmp_path_factory.mktemp("bad-input"))) as (url, service), \
            httpx.Client(base_url=url, timeout=30) as client:
        ok(client.put(TOPIC_URL))
        ok(client.put(f"{TOPIC_URL}/subscription/sub", json="earliest"))
        publish(service, [b"m0", b"m1"])
        yield client, service


@pytest.mark.parametrize(("method", "url", "body", "status", "code"), BAD_INPUT)
def test_bad_input_gets_a_clear_4xx_and_changes_nothing(populated: Server, method: str, url: str, body: Any,
                                                         status: int, code: str) -> None:
    client, service = populated
    before = _state(client, service)
    response = client.request(method, url, json=body) if body is not None else client.request(method, url)
    assert response.status_code == status, response.text
    assert response.json()["code"] == code and response.json()["message"]
    assert _state(client, service) == before


# --- policy bounds -------------------------------------------------------------------------------
NS_URL = f"{ADMIN}/namespaces/public/default"
TOO_LARGE = 99999999999999999999
POLICY_OUT_OF_BOUNDS = [
    ("post", f"{NS_URL}/retention", {"retentionTimeInMinutes": TOO_LARGE, "retentionSizeInMB": 1},
     "retentionTimeInMinutes must be -1 (unlimited) or 0..2147483647 minutes, not 99999999999999999999"),
    ("post", f"{NS_URL}/retention", {"retentionTimeInMinutes": 1, "retentionSizeInMB": 2**43},
     "retentionSizeInMB must be -1 (unlimited) or 0..8796093022207 MB, not 8796093022208"),
    ("post", f"{NS_URL}/retention", {"retentionTimeInMinutes": -2, "retentionSizeInMB": 1},
     "retentionTimeInMinutes must be -1 (unlimited) or 0..2147483647 minutes, not -2"),
    ("post", f"{NS_URL}/messageTTL", TOO_LARGE, f"messageTTL must be 0..2147483647 seconds (0: none), not {TOO_LARGE}"),
    ("post", f"{NS_URL}/messageTTL", -1, "messageTTL must be 0..2147483647 seconds (0: none), not -1"),
    ("put", f"{ADMIN}/namespaces/public/bounded", {"message_ttl_in_seconds": 2**31},
     "messageTTL must be 0..2147483647 seconds (0: none), not 2147483648"),
    ("post", f"{NS_URL}/permissions/{'r' * 257}", ["consume"], "a role name must be 1..256 characters"),
    ("post", f"{NS_URL}/persistence", {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1,
                                       "managedLedgerMaxMarkDeleteRate": 1e7},
     "managedLedgerMaxMarkDeleteRate must be 0..1e+06 per second"),
]


@pytest.mark.parametrize(("method", "url", "body", "message"), POLICY_OUT_OF_BOUNDS)
def test_policy_values_beyond_their_bound_get_a_400_that_states_it(populated: Server, method: str, url: str,
                                                                     body: Any, message: str) -> None:
    client, service = populated
    before = _state(client, service)
    response = client.request(method, url, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_request" and message in response.json()["message"]
    assert _state(client, service) == before


def test_a_mark_delete_rate_of_infinity_is_refused_not_stored(populated: Server) -> None:
    client, _ = populated
    body = b'{"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1, ' \
           b'"managedLedgerMaxMarkDeleteRate": Infinity}'
    response = client.post(f"{NS_URL}/persistence", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"
    assert client.get(f"{NS_URL}/persistence").json() is None
    assert client.get(NS_URL).status_code == 200


def test_policy_values_at_their_bound_are_kept(server: Server) -> None:
    client, service = server
    at_bound = {"retentionTimeInMinutes": 2**31 - 1, "retentionSizeInMB": 2**43 - 1}
    assert client.post(f"{NS_URL}/retention", json=at_bound).status_code == 204
    assert client.post(f"{NS_URL}/messageTTL", json=2**31 - 1).status_code == 204
    assert client.get(f"{NS_URL}/retention").json() == at_bound
    assert client.get(f"{NS_URL}/messageTTL").json() == 2**31 - 1
    config = service.topics.topic(TOPIC).ml.config
    assert (config.retention_time_ms, config.retention_size_bytes) == ((2**31 - 1) * 60_000, (2**43 - 1) * 2**20)
    assert config.message_ttl_ms == (2**31 - 1) * 1000


# --- authentication and authorization ----------------------------------------------------------
def _bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(role, secret_key=SECRET)}"}


def test_tenants_need_a_superuser_and_tenant_admins_manage_only_their_tenant(tmp_path: Path) -> None:
    auth = AuthConfig(enabled=True, secret_key=SECRET, superuser_roles=frozenset({"admin"}))
    with running_server(str(tmp_path / "data"), auth=auth) as (url, service), \
            httpx.Client(base_url=url, timeout=30) as client:
        anonymous = client.get(f"{ADMIN}/tenants")
        assert anonymous.status_code == 401 and anonymous.json()["code"] == "unauthorized"
        assert client.get(f"{ADMIN}/tenants", headers={"Authorization": "Bearer not-a-jwt"}).status_code == 401
        stranger = client.get(f"{ADMIN}/tenants", headers=_bearer("ops"))
        assert stranger.status_code == 403 and stranger.json()["code"] == "forbidden"
        admin, ops, app = _bearer("admin"), _bearer("ops"), _bearer("app")
        assert ok(client.get(f"{ADMIN}/tenants", headers=admin), 200).json() == ["public"]
        ok(client.put(f"{ADMIN}/tenants/acme", json={"adminRoles": ["ops"]}, headers=admin))
        ok(client.put(f"{ADMIN}/tenants/other", json={"adminRoles": ["someone"]}, headers=admin))
        assert client.put(f"{ADMIN}/tenants/ops-own", json={}, headers=ops).status_code == 403
        assert client.delete(f"{ADMIN}/tenants/acme", headers=ops).status_code == 403
        assert client.post(f"{ADMIN}/tenants/acme", json={"adminRoles": ["ops", "app"]}, headers=ops).status_code == 403
        assert ok(client.get(f"{ADMIN}/tenants/acme", headers=ops), 200).json()["adminRoles"] == ["ops"]

        ok(client.put(f"{ADMIN}/namespaces/acme/prod", headers=ops))
        ok(client.put(f"{ADMIN}/persistent/acme/prod/t", headers=ops))
        assert ok(client.get(f"{ADMIN}/persistent/acme/prod", headers=ops), 200).json() == [
            "persistent://acme/prod/t"]
        for refused in (client.put(f"{ADMIN}/namespaces/other/x", headers=ops),
                        client.get(f"{ADMIN}/namespaces/other", headers=ops),
                        client.get(f"{ADMIN}/persistent/public/default", headers=ops)):
            assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        assert service.namespaces.namespaces("other") == []

        produce = {"messages": [{"payload": "x"}]}
        assert client.post("/topics/persistent/acme/prod/t", json=produce, headers=app).status_code == 403
        ok(client.post(f"{ADMIN}/namespaces/acme/prod/permissions/app", json=["produce"], headers=ops))
        assert ok(client.get(f"{ADMIN}/namespaces/acme/prod/permissions", headers=ops), 200).json() == {
            "app": ["produce"]}
        assert client.post("/topics/persistent/acme/prod/t", json=produce, headers=app).status_code == 200
        assert client.get(f"{ADMIN}/persistent/acme/prod", headers=app).status_code == 403  # not an admin
        ok(client.delete(f"{ADMIN}/namespaces/acme/prod/permissions/app", headers=ops))
        assert client.post("/topics/persistent/acme/prod/t", json=produce, headers=app).status_code == 403
        assert service.topics.topic("acme/prod/t").ml.statistics().messages_added == 1
