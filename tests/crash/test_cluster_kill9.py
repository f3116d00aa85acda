"""A real cluster on 127.0.0.1 loses bookies to ``kill -9`` under load and keeps every
acknowledged message.

Processes: one ZooKeeper (Debian's package), three ``magnetar bookie`` and one ``magnetar
broker`` (its re-replication worker on), each started with a known PID and stopped by it at the
end whatever happens. The namespace's persistence policy is E=3, Qw=2, Qa=2.

1. A WebSocket producer and a REST producer publish to two topics. Once both have
   acknowledgements, one bookie is killed with SIGKILL: producing goes on (the ledgers change
   ensemble onto the two live bookies) and both producers get new acknowledgements.
2. Every acknowledged message reads back at its offset through the broker.
3. The re-replication worker restores two copies of every entry: each entry of every ledger is
   read from the live bookies themselves and found on at least two of them.
4. A second bookie is killed with SIGKILL: every acknowledged message still reads back, through
   the broker and straight from the last bookie.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import WebSocketException

from broker.bookkeeper.bookie_network import BookieNetwork, BookieNetworkConfig
from broker.bookkeeper.remote_bookie import RemoteBookie
from broker.errors import MagnetarError
from broker.metadata.zookeeper import ZooKeeperMetadataStore
from consumers.cluster_launcher import Cluster, running_cluster
from tests.integration.ws_client import open_ws, recv_frame, send_frame, ws_base

pytestmark = pytest.mark.crash

NAMESPACE = "public/default"
WS_TOPIC = "cluster-ws"
REST_TOPIC = "cluster-rest"
ACKS_BEFORE_KILL = 150
ACKS_AFTER_KILL = 150
WINDOW = 20
DEADLINE_S = 90.0
BROKER_ARGS = ("--autorecovery-interval-ms", "200", "--audit-interval-ms", "500", "--bookie-timeout-ms", "3000",
               "--zk-session-timeout-s", "4")


@dataclass
class Acks:
    """Acknowledged payloads by offset, per topic, filled by the producer threads."""

    by_topic: dict[str, dict[int, bytes]] = field(default_factory=lambda: {WS_TOPIC: {}, REST_TOPIC: {}})
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, topic: str, offset: int, payload: bytes) -> None:
        with self.lock:
            self.by_topic[topic][offset] = payload

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.by_topic[WS_TOPIC]), len(self.by_topic[REST_TOPIC])


def ws_producer(url: str, acks: Acks, stop: threading.Event) -> None:
    sequence = 0
    deadline = time.monotonic() + DEADLINE_S
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            with open_ws(f"{ws_base(url)}/ws/v2/producer/persistent/{NAMESPACE}/{WS_TOPIC}") as ws:
                while not stop.is_set() and time.monotonic() < deadline:
                    sent = {}
                    for _ in range(WINDOW):
                        payload = f"ws-{sequence}".encode()
                        send_frame(ws, {"payload": base64.b64encode(payload).decode(), "context": str(sequence)})
                        sent[str(sequence)] = payload
                        sequence += 1
                    for _ in range(WINDOW):
                        result = recv_frame(ws, timeout_s=30.0)
                        if result.get("result") == "ok":
                            acks.add(WS_TOPIC, int(result["offset"]), sent[result["context"]])
                        else:
                            acks.errors.append(f"ws: {result}")
        except (OSError, TimeoutError, WebSocketException) as exc:
            acks.errors.append(f"ws connection: {exc!r}")
            time.sleep(0.2)


def rest_producer(url: str, acks: Acks, stop: threading.Event) -> None:
    sequence = 0
    deadline = time.monotonic() + DEADLINE_S
    with httpx.Client(base_url=url, timeout=30.0) as client:
        while not stop.is_set() and time.monotonic() < deadline:
            payloads = [f"rest-{sequence + i}" for i in range(10)]
            sequence += 10
            try:
                response = client.post(f"/topics/persistent/{NAMESPACE}/{REST_TOPIC}",
                                       json={"producerName": "rest", "messages": [{"payload": p} for p in payloads]})
            except httpx.HTTPError as exc:
                acks.errors.append(f"rest: {exc!r}")
                continue
            if response.status_code != 200:
                acks.errors.append(f"rest: {response.status_code} {response.text[:200]}")
                continue
            for payload, result in zip(payloads, response.json()["messagePublishResults"], strict=True):
                if result["errorCode"] == 0:
                    acks.add(REST_TOPIC, int(result["offset"]), payload.encode())


def wait_for(condition: Any, what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def read_topic(client: httpx.Client, topic: str, end: int) -> dict[int, bytes]:
    """Every message of ``topic`` below offset ``end``, through the broker's range reads."""
    found: dict[int, bytes] = {}
    offset = 0
    while offset < end:
        response = client.get(f"/topics/persistent/{NAMESPACE}/{topic}/messages",
                              params={"offset": offset, "maxMessages": 500}, headers={"accept": "application/json"})
        assert response.status_code == 200, response.text
        body = response.json()
        for message in body["messages"]:
            found[int(message["offset"])] = base64.b64decode(message["payload"])
        assert body["nextOffset"] > offset, body
        offset = body["nextOffset"]
    return found


def assert_readable(url: str, acks: Acks, when: str) -> None:
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for topic, acked in acks.by_topic.items():
            stored = read_topic(client, topic, max(acked) + 1)
            lost = [offset for offset, payload in acked.items() if stored.get(offset) != payload]
            assert not lost, f"{topic}: {len(lost)} acknowledged messages lost {when}, e.g. offsets {lost[:5]}"


def ledger_entries(url: str) -> dict[int, int]:
    """Entries per ledger of both topics, as the broker's managed ledgers count them."""
    entries: dict[int, int] = {}
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for topic in (WS_TOPIC, REST_TOPIC):
            stats = client.get(f"/admin/v2/persistent/{NAMESPACE}/{topic}/internalStats").json()
            entries.update({int(ledger["ledgerId"]): int(ledger["entries"]) for ledger in stats["ledgers"]})
    return entries


def copies(bookies: list[RemoteBookie], ledger_id: int, entries: int) -> list[int]:
    """How many of ``bookies`` hold each entry of the ledger (read from the bookies themselves)."""
    counts = [0] * entries
    for bookie in bookies:
        for entry_id in range(entries):
            try:
                bookie.read_entry(ledger_id, entry_id)
            except MagnetarError:
                continue
            counts[entry_id] += 1
    return counts


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    log_path = tmp_path / "cluster.log"
    with log_path.open("wb") as log, running_cluster(tmp_path, bookies=3, broker_args=BROKER_ARGS, output=log) as made:
        try:
            yield made
        except BaseException:
            print(log_path.read_text(errors="replace")[-6000:])
            raise


def test_killing_bookies_under_load_loses_no_acknowledged_message(cluster: Cluster) -> None:
    url = cluster.broker_url
    with httpx.Client(base_url=url, timeout=30.0) as admin:
        policy = {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2}
        assert admin.post(f"/admin/v2/namespaces/{NAMESPACE}/persistence", json=policy).status_code == 204
        assert admin.post(f"/admin/v2/namespaces/{NAMESPACE}/retention",
                          json={"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}).status_code == 204
        too_wide = {"bookkeeperEnsemble": 4, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2}
        assert admin.post(f"/admin/v2/namespaces/{NAMESPACE}/persistence", json=too_wide).status_code == 400

    acks, stop = Acks(), threading.Event()
    producers = [threading.Thread(target=f, args=(url, acks, stop), daemon=True) for f in (ws_producer, rest_producer)]
    for producer in producers:
        producer.start()
    try:
        wait_for(lambda: min(acks.counts()) >= ACKS_BEFORE_KILL, "acknowledgements before the kill")
        first_victim = cluster.bookies[0]
        assert first_victim.proc is not None
        os.kill(first_victim.proc.pid, signal.SIGKILL)
        first_victim.stop()
        before = acks.counts()
        wait_for(lambda: all(now - then >= ACKS_AFTER_KILL for now, then in zip(acks.counts(), before, strict=True)),
                 "producing to go on after a bookie was killed")
    finally:
        stop.set()
        for producer in producers:
            producer.join(DEADLINE_S)
    assert not any(p.is_alive() for p in producers)

    time.sleep(2.5)  # past the broker's entry cache age: reads below go to the bookies
    assert_readable(url, acks, "after the first bookie was killed")

    network = BookieNetwork(BookieNetworkConfig())
    try:
        survivors = [RemoteBookie(b.address, network) for b in cluster.bookies[1:]]
        entries = ledger_entries(url)
        assert entries and sum(entries.values()) > 0

        def two_copies_everywhere() -> bool:
            return all(min(copies(survivors, ledger_id, count), default=2) >= 2
                       for ledger_id, count in entries.items())

        wait_for(two_copies_everywhere, "re-replication to restore two copies of every entry")
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        copied = re.search(r"^magnetar_autorecovery_entries_copied_total ([0-9.e+]+)$", metrics, re.MULTILINE)
        assert copied is not None and float(copied.group(1)) > 0, "the broker's worker copied nothing"
        assert "magnetar_bookies_available 2.0" in metrics
        store = ZooKeeperMetadataStore.open(cluster.metadata_store)
        try:
            for ledger_id in entries:
                stat = store.get(f"/ledgers/{ledger_id}")
                assert stat is not None
                metadata = json.loads(stat.value)
                fragments = metadata["fragments"]
                print(f"ledger {ledger_id}: E={metadata['ensembleSize']} fragments {fragments}")
                assert (metadata["ensembleSize"], metadata["writeQuorumSize"], metadata["ackQuorumSize"]) == (3, 2, 2)
                assert all(first_victim.address not in ensemble for _, ensemble in fragments), fragments
        finally:
            store.close()

        second_victim = cluster.bookies[1]
        assert second_victim.proc is not None
        os.kill(second_victim.proc.pid, signal.SIGKILL)
        second_victim.stop()
        assert_readable(url, acks, "after the second bookie was killed")
        last = survivors[1]
        for ledger_id, count in entries.items():
            assert copies([last], ledger_id, count) == [1] * count, f"ledger {ledger_id} incomplete on {last.bookie_id}"
    finally:
        network.close()
    print(f"acknowledged: ws {len(acks.by_topic[WS_TOPIC])}, rest {len(acks.by_topic[REST_TOPIC])}; "
          f"producer errors (not acknowledged, so allowed): {len(acks.errors)} {acks.errors[:3]}")
