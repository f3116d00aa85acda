"""Tiered storage through a real ``magnetar standalone``: offload by the admin call and by a
namespace threshold, then every transport reads the same messages, ids and offsets.

Checks: without ``managedLedgerOffloadDriver`` an offload request is refused with a clear 400 and
the status says NOT_RUN; the namespace offload policies are Pulsar's routes with their bounds;
with the filesystem driver, messages produced by the official ``pulsar-client`` into small
ledgers (``managedLedgerMaxEntriesPerLedger=5``) are offloaded (status SUCCESS, internalStats
``offloaded`` and, with a deletion lag of 0, ``bookkeeperDeleted``), and after a restart (an
empty entry cache) a binary consumer from earliest, a WebSocket reader, the REST range read
(JSON and Arrow) and the per-key stream read return exactly what was written, with the same
message ids and offsets; a corrupted offloaded object makes a read of its ledger fail with 503
``offload_read_error`` naming the ledger (never other data) and counts in ``/metrics``, while
the local ledgers still read; an offload yields to publishing
(``managedLedgerOffloadFlowPermitsPerSecondWhilePublishing``) and ends at full speed once it
stops. ``test_tiered_storage_s3.py`` does the same against an S3 API.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa

from tests.integration.pulsar_support import binary_broker, client
from tests.integration.test_cli import magnetar, ok
from tests.integration.ws_client import open_ws, recv_frame, unb64, ws_base
from tests.standalone import read_all, standalone_process

TOPIC = "persistent://public/default/tiered"
ADMIN = "/admin/v2/persistent/public/default/tiered"
MESSAGES = 40
KEYS = 4
WAIT_S = 30.0


def offload_config(tmp_path: Path, **keys: str) -> str:
    path = tmp_path / "standalone.conf"
    settings = {"managedLedgerMaxEntriesPerLedger": "5", "managedLedgerMinLedgerRolloverTimeMinutes": "0", **keys}
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return str(path)


def start_offload_of_everything(http: httpx.Client, path: str = ADMIN) -> None:
    """``PUT …/offload`` of every closed ledger (an id past the last message's ledger)."""
    last = http.get(f"{path}/lastMessageId").json()
    assert http.put(f"{path}/offload", json={"ledgerId": last["ledgerId"] + 1, "entryId": 0}).status_code == 204


def wait_offload_status(http: httpx.Client, path: str = ADMIN) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        status: dict[str, Any] = http.get(f"{path}/offload").json()
        if status["status"] not in ("RUNNING", "NOT_RUN"):
            return status
        time.sleep(0.1)
    raise AssertionError(f"the offload did not end within {WAIT_S} s")


def produce_messages(pulsar_url: str, padding_bytes: int = 0) -> list[tuple[str, bytes, str]]:
    """(message id, payload, key) of each message, sent one entry each."""
    sent = []
    pulsar_client = client(pulsar_url)
    try:
        producer = pulsar_client.create_producer(TOPIC, batching_enabled=False)
        for i in range(MESSAGES):
            payload, key = f"event-{i}".encode() + b"." * padding_bytes, f"k{i % KEYS}"
            sent.append((str(producer.send(payload, partition_key=key)), payload, key))
    finally:
        pulsar_client.close()
    return sent


def check_every_transport(url: str, pulsar_url: str, sent: list[tuple[str, bytes, str]]) -> None:
    pulsar_client = client(pulsar_url)
    try:
        consumer = pulsar_client.subscribe(TOPIC, "from-earliest", initial_position=pulsar_client_earliest())
        received = [consumer.receive(10_000) for _ in sent]
        assert [(str(m.message_id()), m.data()) for m in received] == [(i, p) for i, p, _ in sent]
    finally:
        pulsar_client.close()
    ranged = read_all(url, "/topics/persistent/public/default/tiered")
    assert [(m["offset"], m["payload"]) for m in ranged] == [(i, p) for i, (_, p, _) in enumerate(sent)]
    arrow = httpx.get(f"{url}/topics/persistent/public/default/tiered/messages", timeout=WAIT_S,
                      params={"offset": 0, "maxMessages": MESSAGES},
                      headers={"Accept": "application/vnd.apache.arrow.stream"})
    table = pa.ipc.open_stream(arrow.content).read_all()
    assert list(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True)) == \
        [(i, p) for i, (_, p, _) in enumerate(sent)]
    with open_ws(f"{ws_base(url)}/ws/v2/reader/persistent/public/default/tiered?messageId=earliest") as reader:
        frames = [recv_frame(reader, WAIT_S) for _ in sent]
    assert [unb64(f["payload"]) for f in frames] == [p for _, p, _ in sent]
    assert [base64.b64decode(f["messageId"]) for f in frames] == [base64.b64decode(m["messageId"]) for m in ranged]
    for k in range(KEYS):
        body = httpx.get(f"{url}/topics/persistent/public/default/tiered/keys/k{k}/messages",
                         params={"fromVersion": 0}, timeout=WAIT_S).json()
        expected = [(i, p) for i, (_, p, key) in enumerate(sent) if key == f"k{k}"]
        assert [(m["offset"], base64.b64decode(m["payload"])) for m in body["messages"]] == expected


def pulsar_client_earliest() -> Any:
    import pulsar
    return pulsar.InitialPosition.Earliest


def test_without_a_driver_an_offload_is_refused_and_policies_follow_pulsars_routes(tmp_path: Path) -> None:
    with standalone_process(tmp_path / "data", "--config", offload_config(tmp_path)) as (url, _), \
            httpx.Client(base_url=url, timeout=WAIT_S) as http:
        for _ in range(12):  # one entry each
            assert http.post("/topics/persistent/public/default/tiered",
                             json={"messages": [{"payload": "x"}]}).status_code == 200
        assert http.get(f"{ADMIN}/offload").json()["status"] == "NOT_RUN"
        refused = http.put(f"{ADMIN}/offload", json={"ledgerId": 2**40, "entryId": 0})
        assert refused.status_code == 400
        assert "managedLedgerOffloadDriver" in refused.json()["message"]
        ledgers = http.get(f"{ADMIN}/internalStats").json()["ledgers"]
        assert len(ledgers) >= 3 and not any(ledger["offloaded"] for ledger in ledgers)
        ns = "/admin/v2/namespaces/public/default"
        assert http.get(f"{ns}/offloadThreshold").json() is None
        assert http.put(f"{ns}/offloadThreshold", json=10 * 1024 * 1024).status_code == 204
        assert http.get(f"{ns}/offloadThreshold").json() == 10 * 1024 * 1024
        bad = http.put(f"{ns}/offloadDeletionLagMs", json=-5)
        assert bad.status_code == 400 and "offloadDeletionLagMs" in bad.json()["message"]
        assert http.put(f"{ns}/offloadDeletionLagMs", json=60_000).status_code == 204
        assert http.get(f"{ns}/offloadDeletionLagMs").json() == 60_000
        assert http.delete(f"{ns}/offloadDeletionLagMs").status_code == 204
        assert http.get(f"{ns}/offloadDeletionLagMs").json() is None
        policies = {"managedLedgerOffloadThresholdInBytes": 0, "managedLedgerOffloadDeletionLagInMillis": 1000,
                    "managedLedgerOffloadDriver": "filesystem"}
        assert http.post(f"{ADMIN}/offloadPolicies", json=policies).status_code == 204
        assert http.get(f"{ADMIN}/offloadPolicies").json() == {"managedLedgerOffloadThresholdInBytes": 0,
                                                               "managedLedgerOffloadDeletionLagInMillis": 1000}
        bad = http.post(f"{ADMIN}/offloadPolicies", json={"managedLedgerOffloadThresholdInSeconds": -2})
        assert bad.status_code == 400 and "managedLedgerOffloadThresholdInSeconds" in bad.json()["message"]
        ok(url, "admin", "namespaces", "set-offload-threshold", "-s", "1G", "public/default")
        ok(url, "admin", "namespaces", "set-offload-deletion-lag", "-l", "2h", "public/default")
        assert ok(url, "admin", "namespaces", "get-offload-threshold", "public/default").strip() == str(1 << 30)
        assert ok(url, "admin", "namespaces", "get-offload-deletion-lag", "public/default").strip() == "7200000"
        ok(url, "admin", "namespaces", "clear-offload-deletion-lag", "public/default")
        assert ok(url, "admin", "namespaces", "get-offload-deletion-lag", "public/default").strip() == "null"
        refused_cli = magnetar("--service-url", url, "admin", "topics", "offload", "-s", "0", TOPIC)
        assert refused_cli.returncode == 1 and "managedLedgerOffloadDriver" in refused_cli.stderr
        assert '"NOT_RUN"' in ok(url, "admin", "topics", "offload-status", TOPIC)


def test_filesystem_offload_by_admin_call_then_every_transport_reads_the_same(tmp_path: Path) -> None:
    config = offload_config(tmp_path, managedLedgerOffloadDriver="filesystem", fileSystemURI=f"file://{tmp_path}/store",
                     managedLedgerOffloadDeletionLagMs="0")
    with binary_broker(tmp_path / "data", "--config", config) as (url, pulsar_url, _):
        sent = produce_messages(pulsar_url)
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            triggered = ok(url, "admin", "topics", "offload", "-s", "0", TOPIC)  # keep nothing but the current ledger
            assert "Offload triggered for persistent/public/default/tiered" in triggered
            status = json.loads(ok(url, "admin", "topics", "offload-status", "-w", TOPIC))
            assert (status["status"], status["lastError"]) == ("SUCCESS", ""), status
            ledgers = http.get(f"{ADMIN}/internalStats").json()["ledgers"]
            offloaded = [ledger for ledger in ledgers if ledger["offloaded"]]
            assert len(offloaded) == len(ledgers) - 1 >= MESSAGES // 5 - 1
            deadline = time.monotonic() + WAIT_S  # the local copies go in the next maintenance pass at the latest
            while not all(ledger["bookkeeperDeleted"] for ledger in offloaded) and time.monotonic() < deadline:
                time.sleep(0.2)
                offloaded = [ledger for ledger in http.get(f"{ADMIN}/internalStats").json()["ledgers"]
                             if ledger["offloaded"]]
            assert all(ledger["bookkeeperDeleted"] for ledger in offloaded)
            metrics = http.get("/metrics").text
            assert 'pulsar_storage_offloaded_size{topic="persistent://public/default/tiered"}' in metrics
            assert "magnetar_offloader_objects_written_total" in metrics
    with binary_broker(tmp_path / "data", "--config", config) as (url, pulsar_url, _):
        check_every_transport(url, pulsar_url, sent)


def test_a_namespace_threshold_offloads_the_oldest_ledgers(tmp_path: Path) -> None:
    config = offload_config(tmp_path, managedLedgerOffloadDriver="filesystem", fileSystemURI=f"file://{tmp_path}/store")
    with binary_broker(tmp_path / "data", "--config", config) as (url, pulsar_url, _):
        sent = produce_messages(pulsar_url)
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            ledgers = http.get(f"{ADMIN}/internalStats").json()["ledgers"]
            keep = sum(ledger["size"] for ledger in ledgers[-2:])
            assert http.put("/admin/v2/namespaces/public/default/offloadThreshold", json=keep).status_code == 204
            status = wait_offload_status(http)
            assert status["status"] == "SUCCESS", status
            flags = [ledger["offloaded"] for ledger in http.get(f"{ADMIN}/internalStats").json()["ledgers"]]
            assert flags == [True] * (len(flags) - 2) + [False] * 2
        check_every_transport(url, pulsar_url, sent)


def test_a_topic_offload_policy_wins_over_its_namespace(tmp_path: Path) -> None:
    config = offload_config(tmp_path, managedLedgerOffloadDriver="filesystem", fileSystemURI=f"file://{tmp_path}/store")
    with binary_broker(tmp_path / "data", "--config", config) as (url, pulsar_url, _):
        sent = produce_messages(pulsar_url)
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            assert http.put("/admin/v2/namespaces/public/default/offloadThreshold", json=-1).status_code == 204
            assert http.post(f"{ADMIN}/offloadPolicies",
                             json={"managedLedgerOffloadThresholdInBytes": 0}).status_code == 204
            assert wait_offload_status(http)["status"] == "SUCCESS"
            flags = [ledger["offloaded"] for ledger in http.get(f"{ADMIN}/internalStats").json()["ledgers"]]
            assert flags == [True] * (len(flags) - 1) + [False]
        check_every_transport(url, pulsar_url, sent)


def test_a_corrupt_offloaded_object_is_an_error_naming_the_ledger_never_other_data(tmp_path: Path) -> None:
    config = offload_config(tmp_path, managedLedgerOffloadDriver="filesystem", fileSystemURI=f"file://{tmp_path}/store",
                            managedLedgerOffloadDeletionLagMs="0")
    with binary_broker(tmp_path / "data", "--config", config) as (url, pulsar_url, _):
        produce_messages(pulsar_url)
        ok(url, "admin", "topics", "offload", "-s", "0", TOPIC)
        assert json.loads(ok(url, "admin", "topics", "offload-status", "-w", TOPIC))["status"] == "SUCCESS"
        first = httpx.get(f"{url}{ADMIN}/internalStats", timeout=WAIT_S).json()["ledgers"][0]["ledgerId"]
    data = next(p for p in (tmp_path / "store").rglob(f"{first}-*") if not p.name.endswith("-index"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside an entry of the first block
    data.write_bytes(bytes(raw))
    with binary_broker(tmp_path / "data", "--config", config) as (url, _, _):
        answer = httpx.get(f"{url}/topics/persistent/public/default/tiered/messages", params={"offset": 0},
                           timeout=WAIT_S)
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "offload_read_error" and f"ledger {first}" in answer.json()["message"]
        later = httpx.get(f"{url}/topics/persistent/public/default/tiered/messages", params={"offset": MESSAGES - 2},
                          timeout=WAIT_S)
        assert [m["offset"] for m in later.json()["messages"]] == [MESSAGES - 2, MESSAGES - 1]  # the local ledger
        assert "magnetar_offloader_errors_total 1.0" in httpx.get(f"{url}/metrics", timeout=WAIT_S).text


YIELDING_BYTES_PER_S = 2000
"""The offload's rate while publishing in the test below: its 160 KB would take 80 s at it."""


def offloader_waited_for_publishing_ms(http: httpx.Client) -> float:
    found = re.search(r"^magnetar_offloader_flow_waited_for_publishing_ms_total ([0-9.e+]+)$",
                      http.get("/metrics").text, re.MULTILINE)
    assert found is not None, "the offloader's waits for publishing are not in /metrics"
    return float(found.group(1))


def test_an_offload_yields_to_publishing_and_ends_at_full_speed_once_it_stops(tmp_path: Path) -> None:
    config = offload_config(tmp_path, managedLedgerOffloadDriver="filesystem", fileSystemURI=f"file://{tmp_path}/store",
                            managedLedgerOffloadFlowPermitsPerSecondWhilePublishing=str(YIELDING_BYTES_PER_S))
    with binary_broker(tmp_path / "data", "--config", config) as (url, pulsar_url, _):
        sent = produce_messages(pulsar_url, padding_bytes=4000)  # 40 entries of 4 KB in 8 ledgers
        stop = threading.Event()
        published = [0]

        def publish_until_stopped() -> None:
            busy = client(pulsar_url)
            try:
                producer = busy.create_producer("persistent://public/default/busy", batching_enabled=False)
                while not stop.is_set():
                    producer.send(b"busy")
                    published[0] += 1
            finally:
                busy.close()

        publisher = threading.Thread(target=publish_until_stopped)
        publisher.start()
        try:
            with httpx.Client(base_url=url, timeout=WAIT_S) as http:
                deadline = time.monotonic() + WAIT_S
                while published[0] == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert offloader_waited_for_publishing_ms(http) == 0
                start_offload_of_everything(http)
                while offloader_waited_for_publishing_ms(http) == 0 and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert offloader_waited_for_publishing_ms(http) > 0  # it yielded to the publisher
                assert http.get(f"{ADMIN}/offload").json()["status"] == "RUNNING"
                stop.set()
                publisher.join()
                status = wait_offload_status(http)  # within WAIT_S (30 s), not the 80 s the yielding rate takes
                assert (status["status"], status["lastError"]) == ("SUCCESS", ""), status
        finally:
            stop.set()
            publisher.join()
        check_every_transport(url, pulsar_url, sent)
