"""The semantics of issue 34, each with the official client against a broker configured as
Pulsar's own client CI configures it (``pulsar_ci.py``: authentication and authorization on, the
anonymous role granted produce and consume on ``public/default``, the namespaces made through
admin v2 with their bodies), as the ``anonymous`` role a client without credentials is.

Each test is one item: end-to-end encryption (a batched encrypted producer, a consumer and a
reader with the key, as the client's own ``test_encryption``), the namespace the CI creates
with ``encryption_required`` (an unencrypted producer, and an unencrypted message, refused
with Pulsar's ``MetadataError``; an encrypted producer served), a read-compacted subscription, producer access modes
(a second ``Exclusive`` producer fenced at once), a non-persistent topic, ``has_message_available``
of a reader at ``latest`` with an inclusive start, and a schema the namespace's compatibility
strategy refuses. Every refusal must come within ``REFUSAL_S_MAX``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pulsar
import pytest
from pulsar.schema import AvroSchema, Record, String

from api.pulsar.proto import pulsar_api_pb2 as pb
from tests.integration.pulsar_ci import SETUP, CiBroker, ci_broker, refused_fast
from tests.integration.pulsar_wire import RawConnection, command, entry, send_frame
from tests.tls_material import write_rsa_key_pair

T = pb.BaseCommand.Type
RECEIVE_MS = 10_000
KEY_NAME = "ci-key"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CiBroker]:
    with ci_broker(tmp_path_factory.mktemp("pulsar-ci-semantics")) as running:
        assert all(status in (200, 204) for status in running.setup_statuses.values()), running.setup_statuses
        yield running


@pytest.fixture(scope="module")
def anonymous(broker: CiBroker) -> Iterator[pulsar.Client]:
    client = broker.client()  # no credentials: the anonymous role
    yield client
    client.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> pulsar.CryptoKeyReader:
    public, private = write_rsa_key_pair(tmp_path_factory.mktemp("keys"))
    return pulsar.CryptoKeyReader(str(public), str(private))


def unique(namespace: str = "public/default", domain: str = "persistent") -> str:
    return f"{domain}://{namespace}/t-{uuid.uuid4().hex[:10]}"


def test_encrypted_batches_reach_a_consumer_and_a_reader_with_the_key(
        anonymous: pulsar.Client, keys: pulsar.CryptoKeyReader) -> None:
    topic = unique()
    consumer = anonymous.subscribe(topic, "sub", crypto_key_reader=keys)
    producer = anonymous.create_producer(topic, encryption_key=KEY_NAME, crypto_key_reader=keys,
                                         batching_enabled=True, batching_max_publish_delay_ms=10)
    for i in range(10):
        producer.send_async(f"hello-{i}".encode(), None)
    producer.flush()
    assert [consumer.receive(RECEIVE_MS).data() for _ in range(10)] == [f"hello-{i}".encode() for i in range(10)]
    reader = anonymous.create_reader(topic, pulsar.MessageId.earliest, crypto_key_reader=keys)
    assert [reader.read_next(RECEIVE_MS).data() for _ in range(10)] == [f"hello-{i}".encode() for i in range(10)]


def test_a_namespace_that_requires_encryption_refuses_what_is_not_encrypted(
        broker: CiBroker, anonymous: pulsar.Client, keys: pulsar.CryptoKeyReader) -> None:
    """As Pulsar: a producer that does not encrypt is answered ``MetadataError`` "Encryption is
    required in <topic>", and a message without encryption keys from one that said it would is
    answered the same code, "Messages must be encrypted". (Python's client, like Pulsar's C++
    one, retries ``MetadataError`` until its operation timeout, against Pulsar too.)"""
    assert dict(SETUP)["namespaces/public/default-4"]["encryption_required"] is True  # as the CI creates it
    assert broker.admin("GET", "namespaces/public/default-4/encryptionRequired").json() is True
    topic = unique("public/default-4")
    with RawConnection(int(broker.pulsar_url.rsplit(":", 1)[1])) as raw:
        raw.connect()
        raw.send_command(command(T.PRODUCER, producer={"topic": topic, "producer_id": 1, "request_id": 1}))
        refused = raw.expect(T.ERROR).error
        assert (refused.error, refused.message) == (pb.MetadataError, f"Encryption is required in {topic}")
        raw.send_command(command(T.PRODUCER, producer={"topic": topic, "producer_id": 2, "request_id": 2,
                                                       "encrypted": True}))
        raw.expect(T.PRODUCER_SUCCESS)
        raw.send(send_frame(2, 0, entry(b"plain", producer="raw")))
        plain = raw.expect(T.SEND_ERROR).send_error
        assert (plain.error, plain.message) == (pb.MetadataError, "Messages must be encrypted")
    local = topic.split("://", 1)[1]
    rest = httpx.post(f"{broker.http_url}/topics/persistent/{local}", json={"messages": [{"payload": "plain"}]},
                      timeout=30)
    assert rest.status_code == 412 and rest.json()["code"] == "encryption_required", rest.text
    producer = anonymous.create_producer(topic, encryption_key=KEY_NAME, crypto_key_reader=keys)
    consumer = anonymous.subscribe(topic, "sub", crypto_key_reader=keys,
                                   initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"secret")
    assert consumer.receive(RECEIVE_MS).data() == b"secret"


def test_a_read_compacted_subscription_sees_the_latest_value_of_each_key(
        broker: CiBroker, anonymous: pulsar.Client) -> None:
    topic = unique()
    producer = anonymous.create_producer(topic, batching_enabled=False)
    for key, value in (("a", b"1"), ("b", b"2"), ("a", b"3")):
        producer.send(value, partition_key=key)
    local = topic.split("/", 2)[2]
    compacted = broker.admin("PUT", f"persistent/{local}/compaction")
    assert compacted.status_code == 204, compacted.text
    _wait_compacted(broker, local)
    consumer = anonymous.subscribe(topic, "compacted", is_read_compacted=True,
                                   initial_position=pulsar.InitialPosition.Earliest)
    seen = [consumer.receive(RECEIVE_MS) for _ in range(2)]
    assert sorted((m.partition_key(), m.data()) for m in seen) == [("a", b"3"), ("b", b"2")]


def _wait_compacted(broker: CiBroker, local: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = broker.admin("GET", f"persistent/{local}/compaction").json()["status"]
        if status == "SUCCESS":
            return
        assert status in ("RUNNING", "NOT_RUN"), status
        time.sleep(0.1)
    raise AssertionError("compaction did not finish in 30 s")


def test_a_second_exclusive_producer_is_fenced_at_once(anonymous: pulsar.Client) -> None:
    topic = unique()
    anonymous.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    refused_fast(lambda: anonymous.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive),
                 pulsar.ProducerFenced)


def test_a_non_persistent_topic_delivers_to_connected_consumers(anonymous: pulsar.Client) -> None:
    topic = unique(domain="non-persistent")
    consumer = anonymous.subscribe(topic, "live")
    anonymous.create_producer(topic).send(b"now")
    assert consumer.receive(RECEIVE_MS).data() == b"now"


def test_a_reader_at_latest_inclusive_has_the_last_message_available(anonymous: pulsar.Client) -> None:
    topic = unique()
    anonymous.create_producer(topic).send(b"last")
    reader = anonymous.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert reader.has_message_available()
    assert reader.read_next(RECEIVE_MS).data() == b"last"


Click = type("Click", (Record,), {"page": String()})
Renamed = type("Click", (Record,), {"url": String()})  # a field without a default: FULL refuses it


def test_an_incompatible_schema_is_refused_at_once(anonymous: pulsar.Client) -> None:
    topic = unique()
    anonymous.create_producer(topic, schema=AvroSchema(Click)).send(Click(page="/"))
    refused_fast(lambda: anonymous.create_producer(topic, schema=AvroSchema(Renamed)), pulsar.IncompatibleSchema)
