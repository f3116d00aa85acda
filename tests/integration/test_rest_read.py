"""Range reads by offset (Arrow IPC and JSON) and the offsets endpoint, against a real uvicorn server.

The broker runs with ``BrokerConfig.test_min()`` (a ledger rolls over every 5 entries), so reads
cross entry and ledger boundaries. What was stored is checked against the broker's own reader.
Checks: byte-exact round trips in both formats (keys, properties, publish and event times,
message ids that decode to the stored ledger/entry/batch index); an empty key is empty and a
missing one null, in both formats; resuming from
``X-Magnetar-Next-Offset`` in small chunks and bounded by ``maxMessages``/``maxBytes``; reading
past the end is empty; trimmed offsets are 410 ``data_lost`` naming the first available offset;
every bad-input class is a 400 with code and message; partition paths; offsets by timestamp;
the consume permission.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from api.auth import AuthConfig
from api.limits import READ_MESSAGES_MAX
from api.rest_read import ARROW_STREAM_MEDIA_TYPE
from broker import OFFSET_MAX, iso_time
from broker.delivery import Delivery
from broker.entry_format.columns import ARROW_SCHEMA
from broker.message_id import MessageId, message_ids_of_entry
from broker.service import BrokerConfig, BrokerService
from broker.topic_name import TopicName
from consumers.cli.tokens import create_token
from tests.integration.server import running_server, stored_deliveries

TOPIC = "public/default/events"
TOPIC_URL = f"/topics/persistent/{TOPIC}"
ARROW = {"accept": ARROW_STREAM_MEDIA_TYPE}
KEEP_FOREVER = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
ENTRIES = 8
MESSAGES_PER_ENTRY = 3


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[httpx.Client, BrokerService]]:
    with running_server(str(tmp_path / "data"), BrokerConfig.test_min()) as (url, service), \
            httpx.Client(base_url=url, timeout=30) as client:
        service.namespaces.set_policy("public/default", "retention_policies", KEEP_FOREVER)
        yield client, service


def produce(client: httpx.Client, url: str, messages: list[dict[str, Any]], producer: str = "p") -> list[int]:
    body = {"producerName": producer, "payloadEncoding": "base64",
            "messages": [{**m, "payload": base64.b64encode(m["payload"]).decode()} for m in messages]}
    response = client.post(url, json=body)
    assert response.status_code == 200, response.text
    return [r["offset"] for r in response.json()["messagePublishResults"]]


def produce_sample(client: httpx.Client, url: str = TOPIC_URL) -> list[bytes]:
    """``ENTRIES`` entries of ``MESSAGES_PER_ENTRY`` binary messages, some keyed, some timed."""
    payloads = []
    for entry in range(ENTRIES):
        messages = []
        for i in range(MESSAGES_PER_ENTRY):
            payload = bytes([entry, i, 0, 255]) + os.urandom(8)
            message: dict[str, Any] = {"payload": payload, "properties": {"n": str(i)} if i else {}}
            if i != 1:
                message["key"] = f"key-{entry}-{i}"
            if i == 2:
                message["eventTime"] = 1_700_000_000_000 + entry
            messages.append(message)
            payloads.append(payload)
        produce(client, url, messages)
    return payloads


def stored(service: BrokerService, topic: str = TOPIC) -> list[Delivery]:
    return stored_deliveries(service, topic)


def read_arrow(client: httpx.Client, url: str, **params: int) -> tuple[httpx.Response, pa.Table]:
    response = client.get(f"{url}/messages", params=params, headers=ARROW)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ARROW_STREAM_MEDIA_TYPE
    return response, pa.ipc.open_stream(response.content).read_all()


def test_arrow_read_is_what_was_stored(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    payloads = produce_sample(client)
    response, table = read_arrow(client, TOPIC_URL, offset=0)
    assert table.schema.equals(ARROW_SCHEMA)
    assert response.headers["X-Magnetar-Next-Offset"] == str(len(payloads))
    assert response.headers["X-Magnetar-First-Offset"] == "0"
    rows = table.to_pylist()
    expected = stored(service)
    assert [r["value"] for r in rows] == payloads == [d.message.payload for d in expected]
    for row, delivery in zip(rows, expected, strict=True):
        assert row["offset"] == delivery.offset
        assert row["topic"] == f"persistent://{TOPIC}" and row["partition"] == -1
        assert row["key"] == (None if delivery.message.key is None else delivery.message.key.encode())
        assert dict(row["properties"]) == delivery.message.properties
        assert int(row["publishTime"].timestamp() * 1000) == delivery.publish_time_ms
        event_ms = None if row["eventTime"] is None else int(row["eventTime"].timestamp() * 1000)
        assert event_ms == delivery.message.event_time_ms
        assert MessageId.from_base64(row["messageId"]) == delivery.message_id
    assert sum(r["eventTime"] is not None for r in rows) == ENTRIES
    assert len({MessageId.from_base64(r["messageId"]).ledger_id for r in rows}) >= 2  # crossed a ledger


def test_json_read_is_what_was_stored(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    produce_sample(client)
    response = client.get(f"{TOPIC_URL}/messages", params={"offset": 4, "maxMessages": 7})
    assert response.status_code == 200
    body = response.json()
    assert body["nextOffset"] == 11 and response.headers["X-Magnetar-Next-Offset"] == "11"
    expected = stored(service)[4:11]
    assert [m["offset"] for m in body["messages"]] == list(range(4, 11))
    for message, delivery in zip(body["messages"], expected, strict=True):
        assert base64.b64decode(message["payload"]) == delivery.message.payload
        assert message.get("key") == delivery.message.key
        assert message["properties"] == delivery.message.properties
        assert message["publishTimeMs"] == delivery.publish_time_ms  # epoch ms under its own name
        assert message["publishTime"] == iso_time(delivery.publish_time_ms)  # ISO-8601, as every JSON message
        assert message.get("eventTimeMs") == delivery.message.event_time_ms
        event_time = delivery.message.event_time_ms
        assert message.get("eventTime") == (None if event_time is None else iso_time(event_time))
        assert MessageId.from_base64(message["messageId"]) == delivery.message_id


def test_an_empty_key_stays_empty_and_a_missing_key_stays_null(server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    produce(client, TOPIC_URL, [{"payload": b"a", "key": ""}, {"payload": b"b"}])
    _, table = read_arrow(client, TOPIC_URL, offset=0)
    assert table.column("key").to_pylist() == [b"", None]
    messages = client.get(f"{TOPIC_URL}/messages", params={"offset": 0}).json()["messages"]
    assert [m.get("key", "absent") for m in messages] == ["", "absent"]


def test_chunked_reads_resume_at_next_offset_across_entries_and_ledgers(
        server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    payloads = produce_sample(client)
    offset, seen, sizes = 1, [], []  # start inside the first entry
    for _ in range(len(payloads)):  # bounded: every read advances by at least one message
        response, table = read_arrow(client, TOPIC_URL, offset=offset, maxMessages=4)
        if table.num_rows == 0:
            break
        sizes.append(table.num_rows)
        seen.extend(table.column("value").to_pylist())
        assert table.column("offset").to_pylist() == list(range(offset, offset + table.num_rows))
        offset = int(response.headers["X-Magnetar-Next-Offset"])
    assert seen == payloads[1:]
    assert max(sizes) == 4 and offset == len(payloads)
    _, one = read_arrow(client, TOPIC_URL, offset=5, maxBytes=1)
    assert one.column("value").to_pylist() == [payloads[5]]


def test_reading_at_or_past_the_end_is_empty(server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    produce_sample(client)
    end = ENTRIES * MESSAGES_PER_ENTRY
    for offset in (end, end + 1000, OFFSET_MAX):
        response, table = read_arrow(client, TOPIC_URL, offset=offset)
        assert table.num_rows == 0 and table.schema.equals(ARROW_SCHEMA)
        assert response.headers["X-Magnetar-Next-Offset"] == str(offset)
        as_json = client.get(f"{TOPIC_URL}/messages", params={"offset": offset}).json()
        assert as_json["messages"] == [] and as_json["nextOffset"] == offset


def test_trimmed_offsets_are_410_data_lost(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    service.namespaces.set_policy("public/default", "retention_policies",
                                  {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    payloads = produce_sample(client)
    service.maintenance.run()  # no subscription and no retention: every closed ledger goes
    first = service.topics.topic(TopicName.parse(TOPIC)).ml.first_offset
    assert 0 < first < len(payloads)
    lost = client.get(f"{TOPIC_URL}/messages", params={"offset": first - 1}, headers=ARROW)
    assert lost.status_code == 410
    assert lost.json()["code"] == "data_lost" and f"first available offset is {first}" in lost.json()["message"]
    response, table = read_arrow(client, TOPIC_URL, offset=first)
    assert table.column("value").to_pylist() == payloads[first:]
    assert response.headers["X-Magnetar-First-Offset"] == str(first)
    offsets = client.get(f"{TOPIC_URL}/offsets").json()["offsets"][f"persistent://{TOPIC}"]
    assert offsets == {"first": first, "next": len(payloads)}


@pytest.mark.parametrize(("path", "params"), [
    (f"{TOPIC_URL}/messages", {"offset": -1}),
    (f"{TOPIC_URL}/messages", {"offset": OFFSET_MAX + 1}),
    (f"{TOPIC_URL}/offsets", {"timestamp": OFFSET_MAX + 1}),
    (f"{TOPIC_URL}/messages", {}),
    (f"{TOPIC_URL}/messages", {"offset": "one"}),
    (f"{TOPIC_URL}/messages", {"offset": 0, "maxMessages": 0}),
    (f"{TOPIC_URL}/messages", {"offset": 0, "maxMessages": READ_MESSAGES_MAX + 1}),
    (f"{TOPIC_URL}/messages", {"offset": 0, "maxBytes": 0}),
    ("/topics/persistent/public/default/bad%20name/messages", {"offset": 0}),
    ("/topics/persistent/public/default/bad%20name/offsets", {}),
    (f"{TOPIC_URL}/offsets", {"timestamp": -5}),
    (f"{TOPIC_URL}/partitions/1/messages", {"offset": 0}),
    (f"{TOPIC_URL}/partitions/-1/messages", {"offset": 0}),
    (f"{TOPIC_URL}/partitions/one/messages", {"offset": 0}),
])
def test_bad_input_is_a_400_with_code_and_message(server: tuple[httpx.Client, BrokerService], path: str,
                                                  params: dict[str, Any]) -> None:
    client, _ = server
    produce(client, TOPIC_URL, [{"payload": b"x"}])
    for headers in ({}, ARROW):
        response = client.get(path, params=params, headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_request" and response.json()["message"]


def test_unknown_topic_is_404(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    for path in ("/topics/persistent/public/default/nothing/messages?offset=0",
                 "/topics/persistent/public/default/nothing/offsets"):
        response = client.get(path)
        assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert not service.topics.exists(TopicName.parse("public/default/nothing"))  # reads create nothing


def test_partition_paths(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    base = TopicName.parse("public/default/parts")
    service.topics.create_partitioned(base, 3)
    url = "/topics/persistent/public/default/parts"
    produce(client, f"{url}/partitions/1", [{"payload": b"one-a"}, {"payload": b"one-b"}])
    produce(client, f"{url}/partitions/2", [{"payload": b"two"}])
    _, table = read_arrow(client, f"{url}/partitions/1", offset=0)
    assert table.column("value").to_pylist() == [b"one-a", b"one-b"]
    assert set(table.column("topic").to_pylist()) == {f"{base.full_name}-partition-1"}
    assert set(table.column("partition").to_pylist()) == {1}
    assert {MessageId.from_base64(i).partition for i in table.column("messageId").to_pylist()} == {1}
    _, by_name = read_arrow(client, f"{url}-partition-2", offset=0)
    assert by_name.column("value").to_pylist() == [b"two"]
    _, unwritten = read_arrow(client, f"{url}/partitions/0", offset=0)
    assert unwritten.num_rows == 0
    whole = client.get(f"{url}/messages", params={"offset": 0})
    assert whole.status_code == 400 and "partitions/{n}" in whole.json()["message"]
    assert client.get(f"{url}/partitions/3/messages", params={"offset": 0}).status_code == 400


def test_offsets_of_partitions_and_by_timestamp(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    for i in range(6):
        produce(client, TOPIC_URL, [{"payload": f"m{i}".encode()}])
    times = [m["publishTimeMs"] for m in client.get(f"{TOPIC_URL}/messages", params={"offset": 0}).json()["messages"]]
    for pivot in (times[0], times[3], times[5], times[5] + 1):
        body = client.get(f"{TOPIC_URL}/offsets", params={"timestamp": pivot}).json()
        assert body["partitions"] == 0
        at = body["offsets"][f"persistent://{TOPIC}"]["atTimestamp"]
        assert at == next((i for i, t in enumerate(times) if t >= pivot), len(times))
    base = TopicName.parse("public/default/grow")
    service.topics.create_partitioned(base, 2)
    produce(client, "/topics/persistent/public/default/grow/partitions/1", [{"payload": b"a"}, {"payload": b"b"}])
    body = client.get("/topics/persistent/public/default/grow/offsets").json()
    assert body == {"partitions": 2, "offsets": {f"{base.full_name}-partition-0": {"first": 0, "next": 0},
                                                 f"{base.full_name}-partition-1": {"first": 0, "next": 2}}}
    service.topics.update_partitioned(base, 3)
    grown = client.get("/topics/persistent/public/default/grow/offsets").json()
    assert grown["partitions"] == 3 and f"{base.full_name}-partition-2" in grown["offsets"]


def test_message_ids_of_an_entry_match_pulsar_encoding() -> None:
    for partition, count in ((-1, 1), (-1, 3), (4, 300)):
        ids = message_ids_of_entry(7, 130, partition, count)
        expected = [MessageId(7, 130, partition, -1 if count == 1 else i).to_base64() for i in range(count)]
        assert [i.decode() for i in ids] == expected
    assert message_ids_of_entry(7, 130, 2, 400, 250, 260) == [
        MessageId(7, 130, 2, i).to_base64().encode() for i in range(250, 260)]


def test_reading_needs_the_consume_permission(tmp_path: Path) -> None:
    secret = b"range-read-test-secret-of-32-bytes!"
    auth = AuthConfig(enabled=True, secret_key=secret, superuser_roles=frozenset({"admin"}))
    with running_server(str(tmp_path / "data"), BrokerConfig.test_min(), auth=auth) as (url, service), \
            httpx.Client(base_url=url, timeout=30) as client:
        service.namespaces.set_policy("public/default", "auth_policies", {"namespace_auth": {"writer": ["produce"],
                                                                                             "reader": ["consume"]}})
        admin = {"authorization": f"Bearer {create_token('admin', secret_key=secret)}"}
        assert client.post(TOPIC_URL, json={"messages": [{"payload": "x"}]}, headers=admin).status_code == 200
        for path in (f"{TOPIC_URL}/messages?offset=0", f"{TOPIC_URL}/offsets"):
            assert client.get(path).status_code == 401
            writer = client.get(path, headers={"authorization": f"Bearer {create_token('writer', secret_key=secret)}"})
            assert writer.status_code == 403 and writer.json()["code"] == "forbidden"
            reader = client.get(path, headers={"authorization": f"Bearer {create_token('reader', secret_key=secret)}"})
            assert reader.status_code == 200
