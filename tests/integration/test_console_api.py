"""The endpoints the web console reads, and the console's files, against a real server.

``/admin/v2/broker-stats/overview`` carries the bookie's and the broker's real numbers (fsyncs
and their latency percentiles, entry logs, index size, rates and counters that move when
messages are published and consumed); the namespace topic list sums a partitioned topic's
partitions and reports the slowest subscription's backlog; ``offsetOf`` resolves every form of
message id and refuses bad ones with a 4xx that says why; ``/console`` serves only its own files,
with a strict Content-Security-Policy and revalidation; with token authentication on, the
overview needs a superuser and the topic list a tenant admin, while the console's files stay
public. Also: the histogram percentile estimate, and that packaging ships every console file.
"""

from __future__ import annotations

import glob
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.admin_broker import latency_percentile_us
from api.auth import AuthConfig
from api.console import STATIC_DIR
from broker.consumer import ConsumerConfig
from broker.delivery import Delivery
from broker.entry_format import Message
from broker.reader import StartPosition
from broker.service import BrokerService
from broker.subscription_type import SubscriptionType
from consumers.cli.tokens import create_token
from tests.integration.server import running_server
from tests.publishing import publish_to
from tests.standalone import REPO_ROOT

WAIT_S = 15.0
OVERVIEW = "/admin/v2/broker-stats/overview"
SECRET = b"console-test-secret-key-32-bytes"

Server = tuple[httpx.Client, BrokerService]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with running_server(str(tmp_path / "data")) as (url, service), httpx.Client(base_url=url, timeout=30) as client:
        yield client, service


def wait_for(condition: Any, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy (bounded by ``WAIT_S``)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_overview_reports_storage_and_traffic_that_move_with_messages(server: Server) -> None:
    client, service = server
    before = client.get(OVERVIEW).json()
    assert before["status"] == "ok" and before["uptimeSeconds"] >= 0
    assert before["storage"]["readOnly"] is False
    # subscribed first: the subscription keeps what is published (without one, the test preset's
    # retention of nothing lets the maintenance pass trim rolled-over ledgers before they are read)
    consumer = service.subscriptions.subscribe("public/default/stats", "s", SubscriptionType.SHARED,
                                               ConsumerConfig("c"), initial="earliest")
    for _ in range(40):
        publish_to(service, "public/default/stats", [Message(b"x" * 100)], producer_name="p")
    consumer.flow(100)
    received: list[Delivery] = []

    def all_delivered() -> bool:
        while (run := consumer.poll()) is not None:
            received.extend(run.messages())
        return len(received) == 40

    wait_for(all_delivered, "40 deliveries")
    after = wait_for(lambda: (body := client.get(OVERVIEW).json())["rates"]["msgRateIn"] > 0 and body,
                     "a publish rate")
    storage, journal = after["storage"], after["storage"]["journal"]
    assert journal["recordsWritten"] - before["storage"]["journal"]["recordsWritten"] >= 40
    assert journal["fsyncs"] >= 1 and journal["fsyncs"] <= journal["recordsWritten"]
    latency = journal["fsyncLatencyUs"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["p999"]
    assert journal["fsyncLatencyBucketsUs"][-1][1] <= journal["fsyncs"]
    assert after["counters"]["msgInCounter"] == 40 and after["counters"]["msgOutCounter"] == len(received)
    assert after["loaded"] == {"topics": 1, "subscriptions": 1, "consumers": 1}
    assert storage["index"]["sstBytes"] + storage["index"]["memtableBytes"] > 0
    service.storage.flush()
    flushed = client.get(OVERVIEW).json()["storage"]
    assert flushed["entryLogs"]["logs"] >= 1 and flushed["entryLogs"]["diskBytes"] > 0
    assert flushed["writeCache"]["capacityBytes"] > 0
    consumer.close()


def test_namespace_topic_list_sums_partitions_and_counts_subscriptions(server: Server) -> None:
    client, service = server
    assert client.put("/admin/v2/persistent/public/default/clicks/partitions", json=3).status_code == 204
    for index in range(9):
        publish_to(service, "public/default/clicks", [Message(b"c", key=f"k{index}")], producer_name="p")
    assert client.put("/admin/v2/persistent/public/default/orders").status_code == 204
    for _ in range(5):
        publish_to(service, "public/default/orders", [Message(b"o")], producer_name="p")
    for name, position in (("slow", "earliest"), ("caught-up", "latest")):
        assert client.put(f"/admin/v2/persistent/public/default/orders/subscription/{name}",
                          json=position).status_code == 204
    body = client.get("/admin/v2/broker-stats/namespaces/public/default/topics").json()
    rows = {row["localName"]: row for row in body["topics"]}
    assert sorted(rows) == ["clicks", "orders"] and body["truncated"] is False
    assert rows["clicks"]["partitions"] == 3 and rows["clicks"]["msgInCounter"] == 9
    assert rows["orders"]["partitions"] == 0 and rows["orders"]["subscriptions"] == 2
    assert rows["orders"]["backlog"] == 5 and rows["orders"]["storageSize"] > 0
    missing = client.get("/admin/v2/broker-stats/namespaces/public/nowhere/topics")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


def test_offset_of_resolves_every_form_of_message_id(server: Server) -> None:
    client, service = server
    results = [client.post("/topics/persistent/public/default/ids",
                           json={"messages": [{"payload": "a"}, {"payload": "b"}, {"payload": "c"}]}).json()
               for _ in range(2)]
    second_batch_middle = results[1]["messagePublishResults"][1]
    url = "/topics/persistent/public/default/ids/offsetOf"
    found = client.get(url, params={"messageId": second_batch_middle["messageId"]}).json()
    assert found["offset"] == second_batch_middle["offset"] == 4 and found["partition"] == -1
    ledger, entry = found["messageId"]["ledgerId"], found["messageId"]["entryId"]
    assert client.get(url, params={"messageId": f"{ledger}:{entry}"}).json()["offset"] == 3
    delivered = service.subscriptions.reader("public/default/ids", StartPosition.earliest()).read_next()
    assert delivered is not None
    assert client.get(url, params={"messageId": delivered.message_id.to_base64()}).json()["offset"] == 0
    for bad, status, words in (("zz:1", 400, "non-integer"), ("%%%", 400, "base64"),
                               (f"{ledger}:{entry}:-1:7", 400, "no batch index 7"),
                               (f"{ledger}:999", 404, ""), (f"{ledger}:{entry}:2", 400, "not partitioned")):
        answer = client.get(url, params={"messageId": bad})
        assert answer.status_code == status, (bad, answer.text)
        assert answer.json()["code"] and words in answer.json()["message"]
    assert client.get("/topics/persistent/public/default/absent/offsetOf",
                      params={"messageId": "1:0"}).status_code == 404


def test_offset_of_on_a_partitioned_topic_needs_the_partition(server: Server) -> None:
    client, _ = server
    assert client.put("/admin/v2/persistent/public/default/parts/partitions", json=2).status_code == 204
    result = client.post("/topics/persistent/public/default/parts/partitions/1",
                         json={"messages": [{"payload": "p"}]}).json()["messagePublishResults"][0]
    url = "/topics/persistent/public/default/parts/offsetOf"
    found = client.get(url, params={"messageId": result["messageId"]}).json()
    assert found["partition"] == 1 and found["topic"].endswith("parts-partition-1") and found["offset"] == 0
    ledger, entry, _ = result["messageId"].split(":")
    unnamed = client.get(url, params={"messageId": f"{ledger}:{entry}"})
    assert unnamed.status_code == 400 and "partitions" in unnamed.json()["message"]


def test_console_serves_its_files_with_a_strict_policy(server: Server) -> None:
    client, _ = server
    page = client.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/console/js/app.js" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["cache-control"] == "no-cache"
    again = client.get("/console", headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    script = client.get("/console/js/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert client.get("/console/nope.js").json()["code"] == "not_found"
    for name in ("nope.js", "../app.py", "..%2F__init__.py", "js/../../__init__.py"):
        missing = client.get(f"/console/{name}")
        assert missing.status_code == 404 and "import" not in missing.text


def test_with_auth_on_the_overview_needs_a_superuser_and_the_console_stays_public(tmp_path: Path) -> None:
    auth = AuthConfig(enabled=True, secret_key=SECRET, superuser_roles=frozenset({"admin"}))
    with running_server(str(tmp_path / "data"), auth=auth) as (url, service), \
            httpx.Client(base_url=url, timeout=30) as client:
        service.namespaces.create_tenant("acme", {"adminRoles": ["acme-admin"]})
        service.namespaces.create_namespace("acme/apps")

        def bearer(role: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {create_token(role, secret_key=SECRET)}"}

        assert client.get("/console").status_code == 200
        assert client.get(OVERVIEW).status_code == 401
        assert client.get(OVERVIEW, headers=bearer("acme-admin")).status_code == 403
        assert client.get(OVERVIEW, headers=bearer("admin")).status_code == 200
        topics = "/admin/v2/broker-stats/namespaces/acme/apps/topics"
        assert client.get(topics, headers=bearer("acme-admin")).status_code == 200
        denied = client.get(topics, headers=bearer("someone"))
        assert denied.status_code == 403 and denied.json()["code"] == "forbidden"
        located = client.get("/topics/persistent/acme/apps/t/offsetOf", params={"messageId": "1:0"},
                             headers=bearer("someone"))
        assert located.status_code == 403


def test_fsync_percentiles_interpolate_inside_the_bucket() -> None:
    bounds, cumulative = (100, 200, 400), (10, 90, 100)
    assert latency_percentile_us(bounds, cumulative, 0, 0.5) is None
    assert latency_percentile_us(bounds, cumulative, 100, 0.05) == pytest.approx(50.0)
    assert latency_percentile_us(bounds, cumulative, 100, 0.5) == pytest.approx(150.0)
    assert latency_percentile_us(bounds, cumulative, 100, 0.95) == pytest.approx(300.0)
    assert latency_percentile_us(bounds, (10, 90, 100), 120, 0.99) == 400.0  # beyond the last bucket


def test_packaging_ships_every_console_file() -> None:
    """``[tool.setuptools.package-data]`` globs, expanded as setuptools does, cover ``static/``."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["api.console"]
    package_dir = STATIC_DIR.parent
    shipped = {Path(p).relative_to(package_dir).as_posix() for pattern in patterns
               for p in glob.glob(str(package_dir / pattern), recursive=True) if Path(p).is_file()}
    present = {p.relative_to(package_dir).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file()}
    assert present and present <= shipped


def test_overview_counts_the_subscriptions_of_topics_not_loaded_too(tmp_path: Path) -> None:
    """``subscriptions.total`` counts every topic's subscriptions: those of a topic unloaded
    here (counted again from the metadata store within a maintenance pass) and, after a restart
    that loaded nothing, all of them; ``loaded.subscriptions`` keeps counting the loaded ones."""
    base = "/admin/v2/persistent/public/default"
    data_dir = str(tmp_path / "data")
    with running_server(data_dir) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        for topic, subs in (("census-a", ["s1", "s2"]), ("census-b", ["s1"]), ("census-c", ["s1", "s2", "s3"])):
            for sub in subs:
                assert client.put(f"{base}/{topic}/subscription/{sub}", json="earliest").status_code == 204
        live = wait_for(lambda: (body := client.get(OVERVIEW).json())["subscriptions"]["total"] == 6 and body,
                        "a count of 6")
        assert live["loaded"]["subscriptions"] == 6 and live["subscriptions"]["complete"] is True
        unloaded_at_ms = int(time.time() * 1000)
        assert client.put(f"{base}/census-c/unload").status_code == 204
        after = wait_for(lambda: (body := client.get(OVERVIEW).json())["subscriptions"]["countedAtMs"] is not None
                         and body["subscriptions"]["countedAtMs"] >= unloaded_at_ms and body,
                         "a count after the unload")
        assert after["loaded"]["subscriptions"] == 3  # census-c's three are no longer loaded...
        assert after["subscriptions"]["total"] == 6  # ...and still counted
        assert client.delete(f"{base}/census-b/subscription/s1").status_code == 204
        assert client.get(OVERVIEW).json()["subscriptions"]["total"] == 5  # a loaded topic's change shows at once
    with running_server(data_dir) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        first = client.get(OVERVIEW).json()
        assert first["loaded"]["subscriptions"] == 0
        assert first["subscriptions"]["total"] in (None, 5)  # null until the first count, never a wrong figure
        restarted = wait_for(lambda: (body := client.get(OVERVIEW).json())["subscriptions"]["total"] is not None
                             and body, "the first count after a restart")
        assert restarted["subscriptions"]["total"] == 5 and restarted["loaded"]["subscriptions"] == 0
        assert restarted["subscriptions"]["topicsCounted"] == 3
