"""Two ``magnetar broker`` processes over one ZooKeeper and three bookies: lookups, redirects,
and bundle administration, seen by plain HTTP, WebSocket and the Spark connector's client.

One cluster serves the module (ZooKeeper, bookies and brokers are real processes on
127.0.0.1, stopped by PID at the end). Each test uses its own namespace, created with
``BUNDLES`` bundles, so the first lookups spread its topics over both brokers.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from consumers.client import Client, HttpError
from consumers.cluster_launcher import Cluster, running_cluster
from consumers.spark.client import BrokerClient

BUNDLES = 8


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
