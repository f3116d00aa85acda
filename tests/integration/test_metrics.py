"""``/metrics`` against a real uvicorn server, parsed with prometheus_client's own parser.

Checks: the body is Prometheus text that the reference parser accepts; per-topic counters
(messages and bytes in, messages out) and per-subscription gauges (backlog, unacked) move as
messages are produced over REST, pulled and acknowledged; storage counters (journal records,
fsyncs, bytes, cache reads, entry logs) grow with writes and the write cache's flushes are
timed; the journal fsync latency histogram's
``_count`` grows with fsyncs and equals ``magnetar_journal_fsyncs_total``, its buckets are
cumulative and monotone with ``+Inf == _count``; the broker's rates turn positive under steady
traffic; and the endpoint stays public when token authentication is on.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.auth import AuthConfig
from tests.integration.server import running_server

TOPIC = "persistent://public/default/metered"
TOPIC_URL = "/topics/persistent/public/default/metered"
SUB_URL = f"{TOPIC_URL}/subscription/audit"
RATE_DEADLINE_S = 30.0
FLUSH_DEADLINE_S = 30.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    with running_server(str(tmp_path / "data")) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        yield http


def scrape(client: httpx.Client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def fsync_buckets(samples: Samples) -> list[tuple[float, float]]:
    """(le, cumulative count) of the fsync histogram, in bound order (+Inf last)."""
    buckets = [(float(dict(labels)["le"]), count) for (name, labels), count in samples.items()
               if name == "magnetar_journal_fsync_latency_seconds_bucket"]
    return sorted(buckets)


def produce(client: httpx.Client, count: int) -> None:
    response = client.post(TOPIC_URL, json={"messages": [{"payload": f"m{i}"} for i in range(count)]})
    assert response.status_code == 200, response.text


def pull(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    response = client.post(f"{SUB_URL}/pull", params=params)
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def test_topic_and_subscription_metrics_follow_produce_pull_and_ack(client: httpx.Client) -> None:
    assert pull(client) == []  # opens the topic and the subscription (at latest)
    empty = scrape(client)
    assert value(empty, "magnetar_topic_messages_in_total", topic=TOPIC) == 0
    assert value(empty, "magnetar_subscription_backlog_messages", topic=TOPIC, subscription="audit") == 0
    produce(client, 3)
    produce(client, 2)
    produced = scrape(client)
    assert value(produced, "magnetar_topic_messages_in_total", topic=TOPIC) == 5
    assert value(produced, "magnetar_topic_bytes_in_total", topic=TOPIC) > 10
    assert value(produced, "magnetar_topic_entries", topic=TOPIC) == 2
    assert value(produced, "magnetar_subscription_backlog_messages", topic=TOPIC, subscription="audit") == 5
    messages = pull(client, maxMessages=10)
    assert len(messages) == 5
    pulled = scrape(client)
    assert value(pulled, "magnetar_topic_messages_out_total", topic=TOPIC) == 5
    assert value(pulled, "magnetar_subscription_messages_out_total", topic=TOPIC, subscription="audit") == 5
    assert value(pulled, "magnetar_subscription_unacked_messages", topic=TOPIC, subscription="audit") == 5
    assert value(pulled, "magnetar_subscription_consumers", topic=TOPIC, subscription="audit") == 1
    acked = client.post(f"{SUB_URL}/ack", json={"offsets": [m["offset"] for m in messages]})
    assert acked.status_code == 200
    done = scrape(client)
    assert value(done, "magnetar_subscription_unacked_messages", topic=TOPIC, subscription="audit") == 0
    assert value(done, "magnetar_subscription_backlog_messages", topic=TOPIC, subscription="audit") == 0
    assert value(done, "magnetar_topic_messages_in_total", topic=TOPIC) == 5  # counters never go back


def test_storage_counters_and_the_fsync_histogram_grow_with_writes(client: httpx.Client) -> None:
    before = scrape(client)
    for _ in range(5):  # one request at a time: each is its own journal group and fdatasync
        produce(client, 1)
    assert len(pull(client, subscriptionInitialPosition="Earliest", maxMessages=10)) == 5
    after = scrape(client)
    for name in ("magnetar_journal_records_total", "magnetar_journal_bytes_written_total",
                 "magnetar_storage_entries_added_total", "magnetar_journal_fsyncs_total"):
        assert value(after, name) > value(before, name), name
    assert value(after, "magnetar_journal_fsyncs_total") >= value(before, "magnetar_journal_fsyncs_total") + 5
    assert value(after, "magnetar_storage_ledgers") >= 1 and value(after, "magnetar_journal_files") >= 1
    on_loop = value(after, "magnetar_journal_groups_on_caller_thread_total")  # a share of the groups
    assert 0 <= on_loop <= value(after, "magnetar_journal_groups_committed_total")
    count = value(after, "magnetar_journal_fsync_latency_seconds_count")
    assert count == value(after, "magnetar_journal_fsyncs_total")
    assert count >= value(before, "magnetar_journal_fsync_latency_seconds_count") + 5
    assert value(after, "magnetar_journal_fsync_latency_seconds_sum") > 0
    buckets = fsync_buckets(after)
    assert len(buckets) >= 2 and buckets[-1] == (float("inf"), count)
    assert all(low[1] <= high[1] for low, high in itertools.pairwise(buckets)), buckets
    deadline = time.monotonic() + FLUSH_DEADLINE_S  # the write cache flushes in the background
    while value(after, "magnetar_storage_flush_seconds_count") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        after = scrape(client)
    assert value(after, "magnetar_storage_flush_seconds_count") >= 1
    assert value(after, "magnetar_storage_flush_seconds_sum") > 0


def test_catch_up_reads_after_a_restart_show_in_the_read_path_counters(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    with running_server(data_dir) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(4):
            produce(http, 3)
    with running_server(data_dir) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        assert len(pull(http, subscriptionInitialPosition="Earliest", maxMessages=100)) == 12
        samples = scrape(http)
    assert value(samples, "magnetar_entry_logs") >= 1 and value(samples, "magnetar_entry_log_disk_bytes") > 0
    assert value(samples, "magnetar_entry_cache_misses_total") >= 1  # nothing cached after the restart
    from_log = value(samples, "magnetar_storage_reads_total", served_by="entry_log")
    from_read_cache = value(samples, "magnetar_storage_reads_total", served_by="read_cache")
    assert from_log >= 1 and from_log + from_read_cache >= 4  # every entry came from storage
    assert value(samples, "magnetar_entry_log_reads_total") >= from_log
    assert value(samples, "magnetar_read_cache_misses_total") >= from_log
    assert value(samples, "magnetar_write_cache_misses_total") == \
        value(samples, "magnetar_read_cache_hits_total") + value(samples, "magnetar_read_cache_misses_total")


def test_rates_turn_positive_under_steady_traffic(client: httpx.Client) -> None:
    pull(client, subscriptionType="Shared")
    rates = {"in": 0.0, "out": 0.0}
    deadline = time.monotonic() + RATE_DEADLINE_S
    while min(rates.values()) <= 0 and time.monotonic() < deadline:
        produce(client, 1)
        for message in pull(client, maxMessages=10):
            client.post(f"{SUB_URL}/ack", json={"messageIds": [message["messageId"]]})
        samples = scrape(client)
        rates["in"] = max(rates["in"], value(samples, "magnetar_topic_msg_rate_in", topic=TOPIC))
        rates["out"] = max(rates["out"], value(samples, "magnetar_topic_msg_rate_out", topic=TOPIC))
    assert rates["in"] > 0 and rates["out"] > 0, rates


def test_metrics_stay_public_with_authentication_on(tmp_path: Path) -> None:
    auth = AuthConfig(enabled=True, secret_key=b"0123456789abcdef0123456789abcdef")
    with running_server(str(tmp_path / "data"), auth=auth) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        assert http.post(f"{SUB_URL}/pull").status_code == 401
        samples = scrape(http)
        assert value(samples, "magnetar_storage_read_only") == 0
