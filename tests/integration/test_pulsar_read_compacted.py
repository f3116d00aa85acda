"""Read-compacted subscriptions on the binary protocol (``CommandSubscribe.read_compacted``),
with the official client against a real ``magnetar standalone``: the compacted view up to the
compaction horizon (the latest message of each key; an empty payload removes its key), then
the topic's tail, the same view a ``readCompacted=true`` WebSocket reader gets."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pulsar
import pytest

from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client, drain
from tests.integration.ws_client import open_ws, recv_frame, recv_nothing, unb64, ws_base

COMPACTION_WAIT_S = 30


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with binary_broker(tmp_path_factory.mktemp("compacted")) as (http_url, pulsar_url, _):
        yield http_url, pulsar_url


def compact(http_url: str, topic: str) -> None:
    url = f"{http_url}/admin/v2/persistent/public/default/{topic}/compaction"
    assert httpx.put(url, timeout=30).status_code in (200, 204)
    deadline = time.monotonic() + COMPACTION_WAIT_S
    while (status := httpx.get(url, timeout=30).json()["status"]) in ("NOT_RUN", "RUNNING"):
        assert time.monotonic() < deadline, "compaction did not finish"
        time.sleep(0.05)
    assert status == "SUCCESS"


VIEW = [("k1", b"c"), ("k3", b"d")]
"""What every reader of the compacted topic below sees: k2 removed by its empty payload, k1's
latest value, then k3 from the tail past the horizon."""


@pytest.fixture(scope="module")
def compacted(broker: tuple[str, str]) -> Iterator[pulsar.Client]:
    http_url, pulsar_url = broker
    pc = client(pulsar_url)
    producer = pc.create_producer("compacted", batching_enabled=False)
    for key, value in (("k1", b"a"), ("k2", b"b"), ("k1", b"c"), ("k2", b"")):
        producer.send(value, partition_key=key)
    compact(http_url, "compacted")
    producer.send(b"d", partition_key="k3")
    yield pc
    pc.close()


def test_read_compacted_consumer_sees_the_view_then_the_tail(compacted: pulsar.Client) -> None:
    consumer = compacted.subscribe("compacted", "view", is_read_compacted=True,
                                   initial_position=pulsar.InitialPosition.Earliest)
    assert [(m.partition_key(), m.data()) for m in drain(consumer)] == VIEW
    plain = compacted.subscribe("compacted", "everything", initial_position=pulsar.InitialPosition.Earliest)
    assert len(drain(plain)) == 5


def test_read_compacted_reader_and_websocket_reader_see_the_same_view(
        compacted: pulsar.Client, broker: tuple[str, str]) -> None:
    reader = compacted.create_reader("compacted", pulsar.MessageId.earliest, is_read_compacted=True)
    binary = []
    while reader.has_message_available():
        message = reader.read_next(RECEIVE_TIMEOUT_MS)
        binary.append((message.partition_key(), message.data()))
    url = f"{ws_base(broker[0])}/ws/v2/reader/persistent/public/default/compacted?messageId=earliest&readCompacted=true"
    with open_ws(url) as ws:
        websocket = [(frame["key"], unb64(frame["payload"])) for frame in (recv_frame(ws) for _ in VIEW)]
        assert recv_nothing(ws)
    assert binary == websocket == VIEW



def test_read_compacted_view_of_batched_messages(compacted: pulsar.Client, broker: tuple[str, str]) -> None:
    """Messages of a batch keep their ids, batch index included; acknowledged with batch-index
    acks (the client sends no ack for a batch part of which was compacted away otherwise)."""
    producer = compacted.create_producer("compacted-batches", batching_enabled=True, batching_max_messages=10,
                                         batching_max_publish_delay_ms=50)
    for key, value in (("k1", b"a"), ("k2", b"b"), ("k3", b"c"), ("k1", b"d")):
        producer.send_async(value, None, partition_key=key)
    producer.flush()
    compact(broker[0], "compacted-batches")
    consumer = compacted.subscribe("compacted-batches", "view", is_read_compacted=True, batch_index_ack_enabled=True,
                                   initial_position=pulsar.InitialPosition.Earliest)
    view = drain(consumer)
    assert [(m.partition_key(), m.data()) for m in view] == [("k2", b"b"), ("k3", b"c"), ("k1", b"d")]
    plain = compacted.subscribe("compacted-batches", "plain", initial_position=pulsar.InitialPosition.Earliest)
    ids = {m.data(): str(m.message_id()) for m in drain(plain)}
    assert [str(m.message_id()) for m in view] == [ids[b"b"], ids[b"c"], ids[b"d"]]  # each its own id
    consumer.close()
    again = compacted.subscribe("compacted-batches", "view", is_read_compacted=True, batch_index_ack_enabled=True)
    assert drain(again) == []
