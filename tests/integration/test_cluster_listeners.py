"""Advertised listeners across brokers: two ``magnetar broker`` processes over one ZooKeeper and
one bookie, each advertising ``internal`` on 127.0.0.1 and ``external`` on localhost. A broker
asked for a topic another one serves answers that owner's URL of the listener the client names
(the listeners travel with the ownership node and the load report), and the official client
naming ``external`` produces to topics spread over both brokers.

Before the listeners travelled with the broker's address, a broker answered another's topic
with the owner's one ``pulsar://127.0.0.1:PORT`` whatever listener the client named.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar.proto import pulsar_api_pb2 as pb
from consumers.cluster_launcher import Cluster, running_cluster
from tests.integration.pulsar_support import client, receive_all
from tests.integration.pulsar_wire import RawConnection, T, command

BUNDLES = 8
TOPICS = 8
LookupType = pb.CommandLookupTopicResponse


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = Path(tmp_path_factory.mktemp("listeners"))

    def listeners(index: int, pulsar_port: int) -> tuple[str, ...]:
        config = base / f"broker-{index}.conf"
        config.write_text(f"advertisedListeners=internal:pulsar://127.0.0.1:{pulsar_port},"
                          f"external:pulsar://localhost:{pulsar_port}\n")
        return ("--config", str(config))

    with open(base / "cluster.log", "wb") as log, \
            running_cluster(base, bookies=1, brokers=2, output=log, broker_args_of=listeners,
                            broker_args=("--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1",
                                         "--load-report-interval-ms", "500")) as made:
        yield made


def _lookup(port: int, topic: str, listener: str, request_id: int) -> pb.CommandLookupTopicResponse:
    with RawConnection(port) as conn:
        conn.connect()
        conn.send_command(command(T.LOOKUP, lookupTopic={"topic": topic, "request_id": request_id,
                                                         "advertised_listener_name": listener}))
        return conn.expect(T.LOOKUP_RESPONSE).lookupTopicResponse


def test_another_brokers_topic_is_answered_with_the_owners_named_listener(cluster: Cluster) -> None:
    namespace = f"public/ns{uuid.uuid4().hex[:8]}"
    created = httpx.put(f"{cluster.broker_url}/admin/v2/namespaces/{namespace}",
                        json={"bundles": {"numBundles": BUNDLES}})
    assert created.status_code == 204, created.text
    ports = {broker.address: broker.pulsar_port for broker in cluster.brokers}
    owners = {}
    for i in range(TOPICS):
        found = httpx.get(f"{cluster.broker_url}/lookup/v2/topic/persistent/{namespace}/t{i}",
                          params={"listenerName": "external"})
        assert found.status_code == 200, found.text
        owners[f"t{i}"] = found.json()["brokerId"]
        assert found.json()["brokerUrl"] == f"pulsar://localhost:{ports[owners[f't{i}']]}"
    assert len(set(owners.values())) == 2, owners  # the first lookups spread the topics
    pc = client(f"pulsar://127.0.0.1:{cluster.brokers[0].pulsar_port}", listener_name="external")
    try:
        for topic in owners:
            full = f"persistent://{namespace}/{topic}"
            consumer = pc.subscribe(full, "s", initial_position=pulsar.InitialPosition.Earliest)
            pc.create_producer(full, batching_enabled=False).send(topic.encode())
            assert [m.data() for m in receive_all(consumer, 1)] == [topic.encode()]
    finally:
        pc.close()
    for request_id, (topic, owner) in enumerate(owners.items(), 1):
        other = next(b for b in cluster.brokers if b.address != owner)
        full = f"persistent://{namespace}/{topic}"
        answered = _lookup(other.pulsar_port, full, "external", request_id)  # owned elsewhere: Connect there
        assert answered.response == LookupType.Connect, answered
        assert answered.brokerServiceUrl == f"pulsar://localhost:{ports[owner]}"
        internal = _lookup(other.pulsar_port, full, "internal", request_id)
        assert internal.brokerServiceUrl == f"pulsar://127.0.0.1:{ports[owner]}"
        refused = _lookup(other.pulsar_port, full, "elsewhere", request_id)
        assert refused.response == LookupType.Failed and refused.error == pb.ServiceNotReady
        assert refused.message == "the broker do not have elsewhere listener"
