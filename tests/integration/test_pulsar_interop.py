"""Interop of the binary protocol with the WebSocket and REST edges, on one real broker process.

Messages produced by the official ``pulsar-client`` (batched and not, with keys, properties and
event times) are read by WebSocket consumers and readers, by the REST range read and by a REST
pull subscription; messages produced over WebSocket and REST are consumed by the official
client. Every side must see the same payloads, metadata and message ids (ledger, entry,
partition, batch index), because they are the same stored entries.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pulsar
import pytest

from broker.message_id import MessageId
from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client, receive_all
from tests.integration.ws_client import b64, open_ws, produce, receive, unb64, ws_base

NS = "persistent/public/default"
EVENT_MS = 1_700_000_000_123


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with binary_broker(tmp_path_factory.mktemp("interop")) as (http_url, pulsar_url, _):
        yield http_url, pulsar_url


@pytest.fixture
def pc(broker: tuple[str, str]) -> Iterator[pulsar.Client]:
    c = client(broker[1])
    yield c
    c.close()


def ids_of(message: pulsar.Message) -> MessageId:
    mid = message.message_id()
    return MessageId(mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index())


def backlog_drains(stats_url: str, subscription: str, deadline_s: float = 30) -> bool:
    """True once ``subscription``'s backlog is empty (the client sends its acks in groups)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if httpx.get(stats_url, timeout=30).json()["subscriptions"][subscription]["msgBacklog"] == 0:
            return True
        time.sleep(0.05)
    return False


def binary_sample(pc: pulsar.Client, topic: str) -> list[tuple[bytes, str | None, dict[str, str], MessageId]]:
    """One unbatched message with a key, properties and an event time, then three messages
    batched into one entry: (payload, key, properties, id) of each, as the client saw them."""
    single = pc.create_producer(topic, batching_enabled=False)
    first = single.send(b"single", partition_key="k1", properties={"p": "1"}, event_timestamp=EVENT_MS)
    sent: list[tuple[bytes, str | None, dict[str, str], pulsar.MessageId]] = [(b"single", "k1", {"p": "1"}, first)]
    batched = pc.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50,
                                 batching_max_messages=3)
    receipts: list[pulsar.MessageId] = []
    for i in range(3):
        batched.send_async(f"b{i}".encode(), lambda result, mid: receipts.append(mid), properties={"i": str(i)})
    batched.flush()
    assert len(receipts) == 3 and len({(m.ledger_id(), m.entry_id()) for m in receipts}) == 1  # one entry
    receipts.sort(key=lambda m: m.batch_index())
    sent += [(f"b{i}".encode(), None, {"i": str(i)}, mid) for i, mid in enumerate(receipts)]
    return [(data, key, props, MessageId(m.ledger_id(), m.entry_id(), m.partition(), m.batch_index()))
            for data, key, props, m in sent]


def test_binary_produced_messages_reach_websocket_and_rest_readers_with_the_same_ids(
        pc: pulsar.Client, broker: tuple[str, str]) -> None:
    http_url = broker[0]
    topic = "to-ws-and-rest"
    with open_ws(f"{ws_base(http_url)}/ws/v2/consumer/{NS}/{topic}/ws-sub?subscriptionType=Shared") as consumer:
        sent = binary_sample(pc, topic)
        over_ws = receive(consumer, len(sent))
    with open_ws(f"{ws_base(http_url)}/ws/v2/reader/{NS}/{topic}?messageId=earliest") as reader:
        over_reader = receive(reader, len(sent))
    ranged = httpx.get(f"{http_url}/topics/{NS}/{topic}/messages", params={"offset": 0}, timeout=30).json()["messages"]
    pulled = httpx.post(f"{http_url}/topics/{NS}/{topic}/subscription/rest-sub/pull",
                        params={"subscriptionInitialPosition": "Earliest", "maxMessages": 10}, timeout=30)
    assert pulled.status_code == 200, pulled.text
    for seen in (over_ws, over_reader, ranged, pulled.json()["messages"]):
        assert [unb64(m["payload"]) for m in seen] == [data for data, _, _, _ in sent]
        assert [m.get("key") for m in seen] == [key for _, key, _, _ in sent]
        assert [m["properties"] for m in seen] == [props for _, _, props, _ in sent]
        assert [MessageId.from_base64(m["messageId"]) for m in seen] == [mid for _, _, _, mid in sent]
        assert seen[0]["eventTime"] == "2023-11-14T22:13:20.123Z"


def test_websocket_and_rest_produced_messages_reach_binary_consumers_with_the_same_ids(
        pc: pulsar.Client, broker: tuple[str, str]) -> None:
    http_url = broker[0]
    topic = "from-ws-and-rest"
    consumer = pc.subscribe(topic, "binary-sub", consumer_type=pulsar.ConsumerType.Shared)
    reader = pc.create_reader(topic, pulsar.MessageId.earliest)
    with open_ws(f"{ws_base(http_url)}/ws/v2/producer/{NS}/{topic}") as producer:
        over_ws = produce(producer, [b"ws-0", b"ws-1"], key="wk", properties={"via": "ws"})
    assert [r["result"] for r in over_ws] == ["ok", "ok"]
    body: dict[str, Any] = {"payloadEncoding": "base64", "messages": [
        {"payload": b64(b"\x00rest-0"), "key": "rk", "properties": {"via": "rest"}},
        {"payload": b64(b"rest-1"), "properties": {"via": "rest"}}]}
    over_rest = httpx.post(f"{http_url}/topics/{NS}/{topic}", json=body, timeout=30)
    assert over_rest.status_code == 200, over_rest.text
    given = [MessageId.from_base64(r["messageId"]) for r in over_ws] + \
        [MessageId.parse(r["messageId"]) for r in over_rest.json()["messagePublishResults"]]
    assert [i.batch_index for i in given] == [-1, -1, 0, 1]  # two lone messages, then one entry of two
    for received in (receive_all(consumer, 4), [reader.read_next(RECEIVE_TIMEOUT_MS) for _ in range(4)]):
        assert [m.data() for m in received] == [b"ws-0", b"ws-1", b"\x00rest-0", b"rest-1"]
        assert [m.partition_key() for m in received] == ["wk", "wk", "rk", ""]
        assert [m.properties()["via"] for m in received] == ["ws", "ws", "rest", "rest"]
        assert [ids_of(m) for m in received] == given
    assert backlog_drains(f"{http_url}/admin/v2/{NS}/{topic}/stats", "binary-sub")  # the binary acks landed
    after_first = pc.create_reader(topic, pulsar.MessageId(-1, given[0].ledger_id, given[0].entry_id, -1))
    assert after_first.read_next(RECEIVE_TIMEOUT_MS).data() == b"ws-1"  # from the id the WebSocket producer got


def test_a_binary_id_names_the_message_over_rest_and_websocket(pc: pulsar.Client, broker: tuple[str, str]) -> None:
    """A reader started at an id the binary client was given, over WebSocket, starts after it."""
    http_url = broker[0]
    topic = "ids-across"
    sent = binary_sample(pc, topic)
    start = quote(sent[1][3].to_base64(), safe="")
    with open_ws(f"{ws_base(http_url)}/ws/v2/reader/{NS}/{topic}?messageId={start}") as reader:
        after = receive(reader, 2)
    assert [unb64(m["payload"]) for m in after] == [b"b1", b"b2"]
