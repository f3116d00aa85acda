"""End-to-end encryption with the official client against a real ``magnetar standalone``.

The client encrypts (RSA-wrapped AES data key, ``encryption_keys`` in the clear
``MessageMetadata``); the broker stores the entry as sent and delivers it untouched. A consumer
or reader with the private key reads the plain messages, batched or not; one without it gets
what Pulsar's client gives it (CONSUME: the stored ciphertext with its encryption context;
FAIL: nothing). WebSocket and REST readers get the stored bytes with an ``encryptionContext``
shaped like Pulsar's WebSocket one. Compaction keeps the latest entry of each clear key, and a
restart (dedup and key index replay) reads the encrypted entries back as they are.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest

from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client, drain, nothing_more
from tests.integration.ws_client import open_ws, receive, unb64, ws_base
from tests.tls_material import write_rsa_key_pair

NS = "persistent/public/default"
KEY_NAME = "client-rsa.pem"
COMPACTION_WAIT_S = 30


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> pulsar.CryptoKeyReader:
    public, private = write_rsa_key_pair(tmp_path_factory.mktemp("keys"))
    return pulsar.CryptoKeyReader(str(public), str(private))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("encryption")


@pytest.fixture(scope="module")
def broker(data_dir: Path) -> Iterator[tuple[str, str]]:
    with binary_broker(data_dir) as (http_url, pulsar_url, _):
        yield http_url, pulsar_url


@pytest.fixture
def pc(broker: tuple[str, str]) -> Iterator[pulsar.Client]:
    c = client(broker[1])
    yield c
    c.close()


def encrypted_producer(pc: pulsar.Client, topic: str, keys: pulsar.CryptoKeyReader, *,
                       batched: bool) -> pulsar.Producer:
    return pc.create_producer(topic, encryption_key=KEY_NAME, crypto_key_reader=keys, batching_enabled=batched,
                              batching_max_publish_delay_ms=50, batching_max_messages=3)


def send_sample(producer: pulsar.Producer, batched: bool) -> list[bytes]:
    """Three messages with keys: each an entry of its own, or one batch."""
    payloads = [f"secret-{i}".encode() for i in range(3)]
    if batched:
        for i, payload in enumerate(payloads):
            producer.send_async(payload, None, partition_key=f"k{i}")
        producer.flush()
    else:
        for i, payload in enumerate(payloads):
            producer.send(payload, partition_key=f"k{i}")
    return payloads


@pytest.mark.parametrize("batched", [False, True])
def test_encrypted_messages_reach_a_consumer_and_a_reader_with_the_key(
        pc: pulsar.Client, keys: pulsar.CryptoKeyReader, batched: bool) -> None:
    topic = f"encrypted-{'batched' if batched else 'single'}"
    consumer = pc.subscribe(topic, "with-key", crypto_key_reader=keys)
    payloads = send_sample(encrypted_producer(pc, topic, keys, batched=batched), batched)
    received = [consumer.receive(RECEIVE_TIMEOUT_MS) for _ in payloads]
    assert [m.data() for m in received] == payloads
    assert [m.partition_key() for m in received] == ["k0", "k1", "k2"]
    for message in received:
        consumer.acknowledge(message)
    reader = pc.create_reader(topic, pulsar.MessageId.earliest, crypto_key_reader=keys)
    assert [reader.read_next(RECEIVE_TIMEOUT_MS).data() for _ in payloads] == payloads


def test_an_encrypted_batch_of_one_message_reaches_the_consumer_as_a_batch(
        pc: pulsar.Client, keys: pulsar.CryptoKeyReader) -> None:
    """The broker gives a lone message stored as a batch in Pulsar's unbatched form; an
    encrypted batch is never rewritten (its payload is the encrypted batch, compressed)."""
    topic = "encrypted-batch-of-one"
    consumer = pc.subscribe(topic, "with-key", crypto_key_reader=keys)
    producer = pc.create_producer(topic, encryption_key=KEY_NAME, crypto_key_reader=keys, batching_enabled=True,
                                  compression_type=pulsar.CompressionType.LZ4)
    producer.send_async(b"alone " * 20, None, partition_key="k")
    producer.flush()
    message = consumer.receive(RECEIVE_TIMEOUT_MS)
    assert (message.data(), message.partition_key()) == (b"alone " * 20, "k")


def test_a_consumer_without_the_key_gets_what_pulsar_gives(pc: pulsar.Client, keys: pulsar.CryptoKeyReader) -> None:
    topic = "encrypted-no-key"
    consume = pc.subscribe(topic, "consume", crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    fail = pc.subscribe(topic, "fail")
    encrypted_producer(pc, topic, keys, batched=False).send(b"plain text", partition_key="k")
    message = consume.receive(RECEIVE_TIMEOUT_MS)
    assert message.data() != b"plain text" and len(message.data()) >= len(b"plain text")
    context = message.encryption_context()
    assert context is not None and context.is_decryption_failed()
    names = [k.key for k in context.keys()]  # noqa: SIM118 (a list of keys, not a mapping)
    assert names == [KEY_NAME]
    assert nothing_more(fail, 1000)


def test_websocket_and_rest_readers_get_the_stored_bytes_with_their_encryption_context(
        pc: pulsar.Client, keys: pulsar.CryptoKeyReader, broker: tuple[str, str]) -> None:
    http_url = broker[0]
    topic = "encrypted-to-ws"
    stats_url = f"{http_url}/admin/v2/{NS}/{topic}/stats"
    raw = pc.subscribe(topic, "raw", crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    producer = encrypted_producer(pc, topic, keys, batched=False)
    producer.send(b"lone", partition_key="k")
    batch = encrypted_producer(pc, topic, keys, batched=True)
    send_sample(batch, batched=True)
    stored = [raw.receive(RECEIVE_TIMEOUT_MS) for _ in range(2)]  # the lone message, then the whole batch
    contexts = [m.encryption_context() for m in stored]
    assert [c.batch_size() for c in contexts if c is not None] == [-1, 3]
    with open_ws(f"{ws_base(http_url)}/ws/v2/consumer/{NS}/{topic}/ws-sub?subscriptionInitialPosition=Earliest"
                 ) as ws:
        over_ws = receive(ws, 2)
        assert backlogs_drain(stats_url, ["ws-sub"])  # the ack of the batch took its whole entry
    with open_ws(f"{ws_base(http_url)}/ws/v2/reader/{NS}/{topic}?messageId=earliest") as ws:
        over_reader = receive(ws, 2, ack=False)
    ranged = httpx.get(f"{http_url}/topics/{NS}/{topic}/messages", params={"offset": 0}, timeout=30).json()
    assert ranged["nextOffset"] == 4  # the lone message and the batch of three
    rest_url = f"{http_url}/topics/{NS}/{topic}/subscription/rest-sub"
    pulled = httpx.post(f"{rest_url}/pull", params={"subscriptionInitialPosition": "Earliest", "maxMessages": 10},
                        timeout=30).json()["messages"]
    acked = httpx.post(f"{rest_url}/ack", json={"messageIds": [m["messageId"] for m in pulled]}, timeout=30)
    assert acked.status_code == 200, acked.text
    assert backlogs_drain(stats_url, ["rest-sub"])  # so did the REST one
    for seen in (over_ws, over_reader, ranged["messages"], pulled):
        assert [unb64(m["payload"]) for m in seen] == [m.data() for m in stored]
        assert [m.get("key") for m in seen] == [m.partition_key() for m in stored] == ["k", "k0"]  # the clear key
        for frame, message in zip(seen, stored, strict=True):
            check_context(frame["encryptionContext"], message.encryption_context())


def backlogs_drain(stats_url: str, subscriptions: list[str], deadline_s: float = 30, backlog: int = 0) -> bool:
    """True once each subscription's backlog is down to ``backlog`` (acks travel in groups)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        stats = httpx.get(stats_url, timeout=30).json()["subscriptions"]
        if all(stats[s]["msgBacklog"] == backlog for s in subscriptions):
            return True
        time.sleep(0.05)
    return False


def check_context(shown: dict[str, Any], context: pulsar.EncryptionContext | None) -> None:
    """``shown`` is Pulsar's WebSocket ``encryptionContext`` for what the client saw."""
    assert context is not None
    assert {name: base64.b64decode(k["keyValue"]) for name, k in shown["keys"].items()} == \
        {k.key: k.value for k in context.keys()}  # noqa: SIM118
    assert all(k["metadata"] == {} for k in shown["keys"].values())
    assert base64.b64decode(shown["param"]) == context.param()
    assert shown["compressionType"] == "NONE" and shown["uncompressedMessageSize"] == 0
    assert shown.get("batchSize") == (None if context.batch_size() < 0 else context.batch_size())


def test_key_shared_dispatch_routes_encrypted_messages_by_their_clear_key(
        pc: pulsar.Client, keys: pulsar.CryptoKeyReader) -> None:
    topic = "encrypted-key-shared"
    consumers = [pc.subscribe(topic, "by-key", consumer_type=pulsar.ConsumerType.KeyShared, crypto_key_reader=keys,
                              consumer_name=f"c{i}") for i in range(2)]
    producer = encrypted_producer(pc, topic, keys, batched=False)
    sent = [(f"k{i % 8}", f"m{i}".encode()) for i in range(32)]
    for key, value in sent:
        producer.send(value, partition_key=key)
    seen = [[(m.partition_key(), m.data()) for m in drain(c)] for c in consumers]
    assert sorted(seen[0] + seen[1]) == sorted(sent)
    assert all(seen), "both consumers got keys"
    assert not {k for k, _ in seen[0]} & {k for k, _ in seen[1]}, "a key reached both consumers"


def compact(http_url: str, topic: str) -> None:
    url = f"{http_url}/admin/v2/{NS}/{topic}/compaction"
    assert httpx.put(url, timeout=30).status_code in (200, 204)
    deadline = time.monotonic() + COMPACTION_WAIT_S
    while (status := httpx.get(url, timeout=30).json()["status"]) in ("NOT_RUN", "RUNNING"):
        assert time.monotonic() < deadline, "compaction did not finish"
        time.sleep(0.05)
    assert status == "SUCCESS", status


def test_compaction_keeps_the_latest_encrypted_message_of_each_clear_key(
        pc: pulsar.Client, keys: pulsar.CryptoKeyReader, broker: tuple[str, str]) -> None:
    """Lone messages by their key; a batch, which the broker cannot split, whole by its clear
    key (its first message's, as the client writes it). A read-compacted consumer with the key
    sees the view and acknowledges all of it; a compacted WebSocket reader gets the batch as
    one message with its encryption context."""
    http_url = broker[0]
    topic = "encrypted-compacted"
    producer = encrypted_producer(pc, topic, keys, batched=False)
    for key, value in (("k1", b"a"), ("k2", b"b"), ("k1", b"c")):
        producer.send(value, partition_key=key)
    batch = encrypted_producer(pc, topic, keys, batched=True)
    for key, value in (("k3", b"x"), ("k4", b"y")):
        batch.send_async(value, None, partition_key=key)
    batch.flush()
    compact(http_url, topic)
    view = pc.subscribe(topic, "view", is_read_compacted=True, crypto_key_reader=keys,
                        initial_position=pulsar.InitialPosition.Earliest)
    assert [(m.partition_key(), m.data()) for m in drain(view)] == [("k2", b"b"), ("k1", b"c"), ("k3", b"x"),
                                                                     ("k4", b"y")]
    # every delivered message acknowledged, the batch's two too; the backlog left is k1's first
    # message, compacted out and never delivered (as on an unencrypted topic)
    assert backlogs_drain(f"{http_url}/admin/v2/{NS}/{topic}/stats", ["view"], backlog=1)
    url = f"{ws_base(http_url)}/ws/v2/reader/{NS}/{topic}?messageId=earliest&readCompacted=true"
    with open_ws(url) as ws:
        frames = receive(ws, 3, ack=False)
    assert [(f.get("key"), f.get("encryptionContext", {}).get("batchSize")) for f in frames] == \
        [("k2", None), ("k1", None), ("k3", 2)]
    assert all("encryptionContext" in f for f in frames)


def test_encrypted_entries_survive_a_crash(data_dir: Path, keys: pulsar.CryptoKeyReader) -> None:
    """Killed without a snapshot, the broker replays dedup and the key index over encrypted
    entries (a lone message, then a batch of two) when it starts again."""
    topic = "encrypted-restart"
    with binary_broker(data_dir / "restart") as (_, pulsar_url, process):
        c = client(pulsar_url)
        encrypted_producer(c, topic, keys, batched=False).send(b"before-0", partition_key="k")
        producer = c.create_producer(topic, producer_name="p-restart", encryption_key=KEY_NAME,
                                     crypto_key_reader=keys, batching_enabled=False)
        producer.send(b"before-1", partition_key="k")
        batch = c.create_producer(topic, producer_name="p-restart-batch", encryption_key=KEY_NAME,
                                  crypto_key_reader=keys, batching_enabled=True, batching_max_messages=2,
                                  initial_sequence_id=9)
        for i in (2, 3):
            batch.send_async(f"before-{i}".encode(), None, partition_key="k")
        batch.flush()
        c.close()
        process.kill()
        process.wait(timeout=30)
    with binary_broker(data_dir / "restart") as (http_url, pulsar_url, _):
        c = client(pulsar_url)
        again = c.create_producer(topic, producer_name="p-restart-batch", encryption_key=KEY_NAME,
                                  crypto_key_reader=keys)
        assert again.last_sequence_id() == 11  # 10 and 11: the batch, replayed
        again.send(b"after", partition_key="k")
        info = httpx.get(f"{http_url}/topics/{NS}/{topic}/keys/k", timeout=30).json()
        assert info["version"] == 4  # the key index counted every message of the clear key "k", the batch's too
        reader = c.create_reader(topic, pulsar.MessageId.earliest, crypto_key_reader=keys)
        assert [reader.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(5)] == \
            [b"before-0", b"before-1", b"before-2", b"before-3", b"after"]
        c.close()
