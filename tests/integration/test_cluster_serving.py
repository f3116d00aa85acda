"""Two ``magnetar broker`` processes over one ZooKeeper and three bookies: lookups, redirects,
and bundle administration, seen by plain HTTP, WebSocket, the Spark connector's client, and
Pulsar's binary protocol (the official ``pulsar-client`` and raw frames).

One cluster serves the module (ZooKeeper, bookies and brokers are real processes on
127.0.0.1, stopped by PID at the end; every broker has an HTTP and a binary-protocol port).
Each test uses its own namespace, created with ``BUNDLES`` bundles, so the first lookups spread
its topics over both brokers.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest
from websockets.sync.client import connect as ws_connect

from api.pulsar.proto import pulsar_api_pb2 as pb
from consumers.client import Client, HttpError
from consumers.cluster_launcher import Cluster, Process, running_cluster
from consumers.spark.client import BrokerClient
from tests.integration.pulsar_support import client, receive_all
from tests.integration.pulsar_wire import RawConnection, T, command, entry, send_frame

BUNDLES = 8
READ_PAGES_MAX = 100
MOVE_DEADLINE_S = 120.0
"""The whole produce-and-consume-across-an-unload scenario ends within this (a bound, not a timing claim)."""
ACKED_BEFORE_MOVE = 15
ACKED_AFTER_MOVE = 15
SEND_PACE_S = 0.02


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = Path(tmp_path_factory.mktemp("serving"))
    with open(base / "cluster.log", "wb") as log, \
            running_cluster(base, bookies=3, brokers=2, output=log,
                            broker_args=("--zk-session-timeout-s", "4", "--load-report-interval-ms", "500")) as made:
        yield made


@pytest.fixture
def namespace(cluster: Cluster) -> str:
    name = f"public/ns{uuid.uuid4().hex[:8]}"
    response = httpx.put(f"{cluster.broker_url}/admin/v2/namespaces/{name}", json={"bundles": {"numBundles": BUNDLES}})
    assert response.status_code == 204, response.text
    return name


def _owners(cluster: Cluster, namespace: str, count: int) -> dict[str, str]:
    """topic -> the broker id serving it, after a first lookup of each."""
    owners = {}
    for i in range(count):
        response = httpx.get(f"{cluster.broker_url}/lookup/v2/topic/persistent/{namespace}/t{i}")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["httpUrl"] == f"http://{body['brokerId']}" and body["bundle"].startswith(namespace + "/0x")
        owners[f"t{i}"] = body["brokerId"]
    return owners


def _elsewhere(cluster: Cluster, owners: dict[str, str]) -> tuple[str, str, str]:
    """A topic, the broker serving it and another broker's URL."""
    for topic, owner in owners.items():
        other = next(b.address for b in cluster.brokers if b.address != owner)
        return topic, owner, f"http://{other}"
    raise AssertionError("no topic")


def test_first_lookups_spread_topics_and_other_brokers_redirect(cluster: Cluster, namespace: str) -> None:
    owners = _owners(cluster, namespace, 16)
    assert set(owners.values()) == {b.address for b in cluster.brokers}
    topic, owner, other = _elsewhere(cluster, owners)
    path = f"/topics/persistent/{namespace}/{topic}"
    body = {"messages": [{"payload": base64.b64encode(b"one").decode()}], "payloadEncoding": "base64"}
    refused = httpx.post(f"{other}{path}?x=1", json=body)
    assert refused.status_code == 307
    assert refused.headers["location"] == f"http://{owner}{path}?x=1"
    assert refused.json()["code"] == "topic_redirect"
    followed = httpx.post(f"{other}{path}", json=body, follow_redirects=True)
    assert followed.status_code == 200 and followed.json()["messagePublishResults"][0]["offset"] == 0
    stats = httpx.get(f"{other}/admin/v2/persistent/{namespace}/{topic}/stats", follow_redirects=True)
    assert stats.status_code == 200 and stats.json()["ownerBroker"] == owner and stats.json()["nextOffset"] == 1
    read = httpx.get(f"{other}{path}/messages", params={"offset": 0}, follow_redirects=True)
    assert [base64.b64decode(m["payload"]) for m in read.json()["messages"]] == [b"one"]


def test_websocket_upgrades_are_redirected_to_the_owner(cluster: Cluster, namespace: str) -> None:
    owners = _owners(cluster, namespace, 8)
    topic, owner, other = _elsewhere(cluster, owners)
    ws_other = other.replace("http://", "ws://")
    with ws_connect(f"{ws_other}/ws/v2/producer/persistent/{namespace}/{topic}") as ws:  # follows the 307
        ws.send(json.dumps({"payload": base64.b64encode(b"ws").decode(), "context": "1"}))
        answer = json.loads(ws.recv(timeout=30))
        assert answer["result"] == "ok" and answer["context"] == "1"
    stats = httpx.get(f"http://{owner}/admin/v2/persistent/{namespace}/{topic}/stats").json()
    assert stats["msgInCounter"] == 1 and stats["ownerBroker"] == owner


def test_python_client_and_spark_client_reach_owners_through_any_broker(cluster: Cluster, namespace: str) -> None:
    owners = _owners(cluster, namespace, 8)
    topic, owner, other = _elsewhere(cluster, owners)
    full = f"persistent://{namespace}/{topic}"
    service_url = f"http://127.0.0.1:1,{other}"  # an unreachable broker first: the next one is tried
    with Client(service_url) as client:
        producer = client.create_producer(full)
        results = [producer.send(f"m{i}".encode()) for i in range(5)]
        assert [r.offset for r in results] == [0, 1, 2, 3, 4]
        assert client.produce_batch(full, [b"rest"])[0].offset == 5
        consumer = client.subscribe(full, "sub", initial_position="earliest")
        assert [consumer.receive(10_000).data for _ in range(6)] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"rest"]
        assert client.request("GET", f"/admin/v2/persistent/{namespace}/{topic}/stats").json()["ownerBroker"] == owner
    with BrokerClient(other) as spark:
        chunk = spark.read_arrow(full, 0, 100)
        assert chunk.next_offset == 6 and sum(b.num_rows for b in chunk.batches) == 6
        assert spark.offsets(full)[1][full].next == 6
        assert spark.produce(full, {"messages": [{"payload": base64.b64encode(b"spark").decode()}]})[0]["offset"] == 6


def _broker(cluster: Cluster, broker_id: str) -> Process:
    return next(b for b in cluster.brokers if b.address == broker_id)


def _other(cluster: Cluster, broker_id: str) -> Process:
    return next(b for b in cluster.brokers if b.address != broker_id)


def _stored(http_url: str, namespace: str, topic: str) -> list[bytes]:
    """Every payload of ``topic`` in offset order, read through REST on ``http_url`` (no redirects)."""
    payloads: list[bytes] = []
    for _ in range(READ_PAGES_MAX):
        response = httpx.get(f"{http_url}/topics/persistent/{namespace}/{topic}/messages",
                             params={"offset": len(payloads)}, timeout=30)
        assert response.status_code == 200, response.text
        page = [base64.b64decode(m["payload"]) for m in response.json()["messages"]]
        if not page:
            return payloads
        payloads += page
    raise AssertionError(f"{topic} holds more than {READ_PAGES_MAX} pages")


def _bundle_of(cluster: Cluster, namespace: str, topic: str) -> tuple[str, str]:
    """(bundle range, owner broker id) of ``topic``."""
    found = httpx.get(f"{cluster.broker_url}/lookup/v2/topic/persistent/{namespace}/{topic}").json()
    return found["bundle"].rsplit("/", 1)[1], found["brokerId"]


def test_the_pulsar_client_follows_redirects_from_any_broker_to_the_owner(cluster: Cluster, namespace: str) -> None:
    owners = _owners(cluster, namespace, 8)
    topic, owner, _ = _elsewhere(cluster, owners)
    full = f"persistent://{namespace}/{topic}"
    pc = client(_other(cluster, owner).pulsar_url)  # the broker that does not serve the topic
    try:
        producer = pc.create_producer(full, batching_enabled=False)
        for i in range(5):
            producer.send(f"p{i}".encode())
        consumer = pc.subscribe(full, "sub", initial_position=pulsar.InitialPosition.Earliest)
        assert [m.data() for m in receive_all(consumer, 5)] == [f"p{i}".encode() for i in range(5)]
        # what the binary client produced is on the owner, readable through its REST API
        assert _stored(f"http://{owner}", namespace, topic) == [f"p{i}".encode() for i in range(5)]
        stats = httpx.get(f"http://{owner}/admin/v2/persistent/{namespace}/{topic}/stats").json()
        assert stats["ownerBroker"] == owner and stats["msgInCounter"] == 5
        # topics nobody looked up yet: the binary lookup assigns their bundles, as HTTP's first lookup
        fresh = [f"fresh{i}" for i in range(8)]
        for name in fresh:
            pc.create_producer(f"persistent://{namespace}/{name}", batching_enabled=False).send(name.encode())
        for name in fresh:
            _, serving = _bundle_of(cluster, namespace, name)
            assert _stored(f"http://{serving}", namespace, name) == [name.encode()]
        # a partitioned topic: metadata from any broker, each partition from its own owner
        created = httpx.put(f"{cluster.broker_url}/admin/v2/persistent/{namespace}/parted/partitions", json=6,
                            follow_redirects=True, timeout=30)
        assert created.status_code in (200, 204), created.text
        parted = f"persistent://{namespace}/parted"
        multi = pc.subscribe(parted, "all", initial_position=pulsar.InitialPosition.Earliest)
        spread = pc.create_producer(parted, batching_enabled=False)
        for i in range(12):
            spread.send(f"q{i}".encode(), partition_key=f"k{i}")
        assert sorted(m.data() for m in receive_all(multi, 12)) == sorted(f"q{i}".encode() for i in range(12))
    finally:
        pc.close()


def test_binary_lookups_name_the_owner_and_non_owners_refuse_producers_and_consumers(
        cluster: Cluster, namespace: str) -> None:
    # The first lookups, all on the first broker, assign the other broker's bundles to it, which
    # takes each one when a client asks there.
    owners = _owners(cluster, namespace, 8)
    first = cluster.brokers[0].address
    topic, owner = next((t, o) for t, o in owners.items() if o != first)
    full = f"persistent://{namespace}/{topic}"
    serving, elsewhere = _broker(cluster, owner), _other(cluster, owner)
    with RawConnection(elsewhere.pulsar_port) as conn:
        conn.connect()
        conn.send_command(command(T.LOOKUP, lookupTopic={"topic": full, "request_id": 1}))
        assigned = conn.expect(T.LOOKUP_RESPONSE).lookupTopicResponse  # assigned there, not taken yet
        assert assigned.response == pb.CommandLookupTopicResponse.Redirect and assigned.authoritative
        assert assigned.brokerServiceUrl == serving.pulsar_url
        assert not assigned.proxy_through_service_url
    with RawConnection(serving.pulsar_port) as conn:
        conn.connect()
        conn.send_command(command(T.LOOKUP, lookupTopic={"topic": full, "request_id": 1, "authoritative": True}))
        connect = conn.expect(T.LOOKUP_RESPONSE).lookupTopicResponse  # it takes the bundle
        assert connect.response == pb.CommandLookupTopicResponse.Connect
        assert connect.brokerServiceUrl == serving.pulsar_url
    with RawConnection(elsewhere.pulsar_port) as conn:
        conn.connect()
        conn.send_command(command(T.LOOKUP, lookupTopic={"topic": full, "request_id": 1}))
        owned = conn.expect(T.LOOKUP_RESPONSE).lookupTopicResponse  # owned elsewhere: Connect there
        assert owned.response == pb.CommandLookupTopicResponse.Connect
        assert owned.brokerServiceUrl == serving.pulsar_url
        assert not owned.proxy_through_service_url
        conn.send_command(command(T.PARTITIONED_METADATA, partitionMetadata={"topic": full, "request_id": 2}))
        metadata = conn.expect(T.PARTITIONED_METADATA_RESPONSE).partitionMetadataResponse
        assert metadata.response == pb.CommandPartitionedTopicMetadataResponse.Success and metadata.partitions == 0
        conn.send_command(command(T.PRODUCER, producer={"topic": full, "producer_id": 1, "request_id": 3}))
        refused = conn.expect(T.ERROR).error
        assert refused.request_id == 3 and refused.error == pb.ServiceNotReady and owner in refused.message
        conn.send_command(command(T.SUBSCRIBE, subscribe={"topic": full, "subscription": "never", "subType": 0,
                                                          "consumer_id": 1, "request_id": 4}))
        refused = conn.expect(T.ERROR).error
        assert refused.request_id == 4 and refused.error == pb.ServiceNotReady
    produced = httpx.post(f"http://{owner}/topics/persistent/{namespace}/{topic}",
                          json={"messages": [{"payload": base64.b64encode(b"x").decode()}]})
    assert produced.status_code == 200, produced.text
    stats = httpx.get(f"http://{owner}/admin/v2/persistent/{namespace}/{topic}/stats").json()
    assert stats["subscriptions"] == {} and stats["msgInCounter"] == 1  # the refusals created nothing


def test_an_unload_closes_binary_producers_and_consumers_on_the_old_owner(cluster: Cluster, namespace: str) -> None:
    owners = _owners(cluster, namespace, 8)
    topic, owner, _ = _elsewhere(cluster, owners)
    full = f"persistent://{namespace}/{topic}"
    bundle, _ = _bundle_of(cluster, namespace, topic)
    with RawConnection(_broker(cluster, owner).pulsar_port) as conn:
        conn.connect()
        conn.send_command(command(T.PRODUCER, producer={"topic": full, "producer_id": 1, "request_id": 1}))
        assert conn.expect(T.PRODUCER_SUCCESS).producer_success.request_id == 1
        conn.send_command(command(T.SUBSCRIBE, subscribe={"topic": full, "subscription": "s", "subType": 0,
                                                          "consumer_id": 2, "request_id": 2}))
        assert conn.expect(T.SUCCESS).success.request_id == 2
        conn.send(send_frame(1, 0, entry(b"before", sequence_id=0)))
        assert conn.expect(T.SEND_RECEIPT).send_receipt.sequence_id == 0
        moved = httpx.put(f"http://{owner}/admin/v2/namespaces/{namespace}/{bundle}/unload", timeout=60)
        assert moved.status_code == 204, moved.text
        closed = [conn.expect(T.CLOSE_PRODUCER, T.CLOSE_CONSUMER) for _ in range(2)]
        assert {(c.type, c.close_producer.producer_id if c.type == T.CLOSE_PRODUCER else c.close_consumer.consumer_id)
                for c in closed} == {(T.CLOSE_PRODUCER, 1), (T.CLOSE_CONSUMER, 2)}
        # a send the client had on the wire before it heard of the close is dropped, not a violation
        conn.send(send_frame(1, 1, entry(b"late", sequence_id=1)))
        conn.send_command(command(T.LOOKUP, lookupTopic={"topic": full, "request_id": 3}))
        answer = conn.expect(T.LOOKUP_RESPONSE).lookupTopicResponse
        # the other broker owns the bundle now (Connect there) or was just chosen to take it
        # (an authoritative Redirect to it, which takes it on the client's lookup there)
        assert answer.brokerServiceUrl == _other(cluster, owner).pulsar_url
        assert answer.response == pb.CommandLookupTopicResponse.Connect or (
            answer.response == pb.CommandLookupTopicResponse.Redirect and answer.authoritative)
    assert _stored(f"http://{_other(cluster, owner).address}", namespace, topic) == [b"before"]


def test_pulsar_clients_go_on_when_an_unload_moves_their_topic(cluster: Cluster, namespace: str) -> None:
    """A producer and a consumer of the official client, reaching the topic through the broker
    that does not serve it, keep working while its bundle is unloaded to that other broker:
    every acknowledged send is delivered and stored once on the new owner."""
    owners = _owners(cluster, namespace, 8)
    topic, owner, _ = _elsewhere(cluster, owners)
    full = f"persistent://{namespace}/{topic}"
    bundle, _ = _bundle_of(cluster, namespace, topic)
    pc = client(_other(cluster, owner).pulsar_url)
    acknowledged: list[bytes] = []
    failures: list[BaseException] = []
    moved = threading.Event()
    deadline_s = time.monotonic() + MOVE_DEADLINE_S

    def produce(producer: pulsar.Producer) -> None:
        after_move = 0
        for i in range(100_000):
            if time.monotonic() >= deadline_s or after_move >= ACKED_AFTER_MOVE:
                return
            was_moved = moved.is_set()
            try:
                producer.send(f"m{i}".encode())
            except Exception as exc:  # not acknowledged: it may or may not be stored
                failures.append(exc)
                continue
            acknowledged.append(f"m{i}".encode())
            after_move += was_moved
            time.sleep(SEND_PACE_S)

    try:
        producer = pc.create_producer(full, producer_name="mover", batching_enabled=False)
        consumer = pc.subscribe(full, "moving", initial_position=pulsar.InitialPosition.Earliest)
        producing = threading.Thread(target=produce, args=(producer,), name="producer")
        producing.start()
        received: list[bytes] = []
        received_after_move = 0
        while time.monotonic() < deadline_s:
            if not moved.is_set() and len(acknowledged) >= ACKED_BEFORE_MOVE:
                unloaded = httpx.put(f"http://{owner}/admin/v2/namespaces/{namespace}/{bundle}/unload", timeout=60)
                assert unloaded.status_code == 204, unloaded.text
                moved.set()
            try:
                message = consumer.receive(500)
            except pulsar.Timeout:
                if not producing.is_alive() and set(acknowledged) <= set(received):
                    break
                continue
            received.append(message.data())
            received_after_move += moved.is_set()
            consumer.acknowledge(message)
        producing.join(timeout=max(deadline_s - time.monotonic(), 1.0))
        assert not producing.is_alive(), "the producer did not finish within the deadline"
        assert moved.is_set() and not failures, failures
        assert len(acknowledged) >= ACKED_BEFORE_MOVE + ACKED_AFTER_MOVE and received_after_move > 0
        assert set(acknowledged) <= set(received), "an acknowledged message was never delivered"
    finally:
        pc.close()
    _, new_owner = _bundle_of(cluster, namespace, topic)
    assert new_owner != owner
    stored = _stored(f"http://{new_owner}", namespace, topic)
    assert set(acknowledged) <= set(stored) and len(stored) == len(set(stored))  # every send stored once


def test_brokers_bundles_split_and_unload(cluster: Cluster, namespace: str) -> None:
    url = cluster.broker_url
    assert sorted(httpx.get(f"{url}/admin/v2/brokers").json()) == sorted(b.address for b in cluster.brokers)
    assert sorted(httpx.get(f"{url}/admin/v2/brokers/standalone").json()) == sorted(b.address for b in cluster.brokers)
    reports = httpx.get(f"{url}/admin/v2/broker-stats/load-reports").json()
    assert {r["brokerId"] for r in reports} == {b.address for b in cluster.brokers}
    assert httpx.get(f"{url}/admin/v2/namespaces/{namespace}/bundles").json()["numBundles"] == BUNDLES
    owners = _owners(cluster, namespace, 8)
    for topic in owners:
        produced = httpx.post(f"{url}/topics/persistent/{namespace}/{topic}", follow_redirects=True,
                              json={"messages": [{"payload": base64.b64encode(b"x").decode()}]})
        assert produced.status_code == 200, produced.text
    bundle_owners = httpx.get(f"{url}/admin/v2/namespaces/{namespace}/bundles/owners").json()
    assert len(bundle_owners) == BUNDLES and set(owners.values()) <= set(bundle_owners.values())
    owned = next(name for name, owner in bundle_owners.items() if owner is not None)
    split = httpx.put(f"{url}/admin/v2/namespaces/{namespace}/{owned}/split", follow_redirects=True)
    assert split.status_code == 200, split.text
    assert len(split.json()["bundles"]) == 2
    assert httpx.get(f"{url}/admin/v2/namespaces/{namespace}/bundles").json()["numBundles"] == BUNDLES + 1
    for topic in owners:  # every topic is still served, with its data, by the broker its lookup names
        found = httpx.get(f"{url}/lookup/v2/topic/persistent/{namespace}/{topic}").json()
        stats = httpx.get(f"{url}/admin/v2/persistent/{namespace}/{topic}/stats", follow_redirects=True).json()
        assert stats["ownerBroker"] == found["brokerId"] and stats["nextOffset"] == 1
    current = httpx.get(f"{url}/admin/v2/namespaces/{namespace}/bundles/owners").json()
    unowned = next((n for n, o in current.items() if o is None), None)
    if unowned is not None:
        refused = httpx.put(f"{url}/admin/v2/namespaces/{namespace}/{unowned}/unload")
        assert refused.status_code == 404 and refused.json()["code"] == "not_found"
    for bad in ("0x1_0x0", "nonsense"):
        refused = httpx.put(f"{url}/admin/v2/namespaces/{namespace}/{bad}/unload")
        assert refused.status_code == 400 and refused.json()["code"] == "invalid_request"
    bundle, owner = next((n, o) for n, o in current.items() if o is not None)
    refused = httpx.put(f"{url}/admin/v2/namespaces/{namespace}/{bundle}/unload",
                        params={"destinationBroker": "127.0.0.1:1"}, follow_redirects=True)
    assert refused.status_code == 404 and "not live" in refused.json()["message"]
    moved = httpx.put(f"{url}/admin/v2/namespaces/{namespace}/{bundle}/unload", follow_redirects=True)
    assert moved.status_code == 204, moved.text
    topic = next(t for t in owners
                 if httpx.get(f"{url}/lookup/v2/topic/persistent/{namespace}/{t}").json()["bundle"].endswith(bundle))
    stats = httpx.get(f"{url}/admin/v2/persistent/{namespace}/{topic}/stats", follow_redirects=True).json()
    assert stats["ownerBroker"] != owner and stats["nextOffset"] == 1
    metrics = httpx.get(f"http://{owner}/metrics").text
    released = re.search(r"^magnetar_bundles_released_total (\S+)$", metrics, re.MULTILINE)
    assert released is not None and float(released.group(1)) >= 1  # the split and the unload
    assert re.search(r"^magnetar_serving 1\.0$", metrics, re.MULTILINE)


def test_a_client_error_is_not_retried_as_a_failover(cluster: Cluster) -> None:
    with Client(cluster.service_url, failover_timeout_s=5) as client:
        with pytest.raises(HttpError) as missing:
            client.request("GET", "/admin/v2/persistent/public/nowhere/t/stats")
        assert missing.value.status == 404


def _exclusive(conn: RawConnection, topic: str, producer_id: int, epoch: int | None = None) -> pb.BaseCommand:
    body: dict[str, object] = {"topic": topic, "producer_id": producer_id, "request_id": producer_id,
                               "producer_access_mode": pb.ProducerAccessMode.Exclusive}
    if epoch is not None:
        body["topic_epoch"] = epoch
    conn.send_command(command(T.PRODUCER, producer=body))
    return conn.expect(T.PRODUCER_SUCCESS, T.ERROR)


def _take(conn: RawConnection, topic: str) -> None:
    conn.send_command(command(T.LOOKUP, lookupTopic={"topic": topic, "request_id": 99, "authoritative": True}))
    assert conn.expect(T.LOOKUP_RESPONSE).lookupTopicResponse.response == pb.CommandLookupTopicResponse.Connect


def test_a_topic_epoch_moves_with_the_topic_to_its_next_owner(cluster: Cluster, namespace: str) -> None:
    """The epoch is stored with the topic (its managed ledger's ``__topicEpoch``): after an
    unload moves the topic, its new owner fences a producer presenting an older epoch."""
    owners = _owners(cluster, namespace, 8)
    topic, owner = next(iter(owners.items()))
    full = f"persistent://{namespace}/{topic}"
    with RawConnection(_broker(cluster, owner).pulsar_port) as conn:
        conn.connect()
        _take(conn, full)
        epochs = []
        for producer_id in (1, 2):
            epochs.append(_exclusive(conn, full, producer_id).producer_success.topic_epoch)
            conn.send_command(command(T.CLOSE_PRODUCER, close_producer={"producer_id": producer_id,
                                                                        "request_id": 50 + producer_id}))
            assert conn.expect(T.SUCCESS).success.request_id == 50 + producer_id
    assert epochs[1] > epochs[0]
    bundle, _ = _bundle_of(cluster, namespace, topic)
    moved = httpx.put(f"http://{owner}/admin/v2/namespaces/{namespace}/{bundle}/unload", timeout=60)
    assert moved.status_code == 204, moved.text
    _, next_owner = _bundle_of(cluster, namespace, topic)
    assert next_owner != owner
    with RawConnection(_broker(cluster, next_owner).pulsar_port) as conn:
        conn.connect()
        _take(conn, full)
        stale = _exclusive(conn, full, 1, epoch=epochs[0])
        assert stale.type == T.ERROR and stale.error.error == pb.ProducerFenced, stale
        fresh = _exclusive(conn, full, 2)
        assert fresh.type == T.PRODUCER_SUCCESS and fresh.producer_success.topic_epoch > epochs[1]
