"""The Magnetar streaming sink: what it writes, where, and that a replayed micro-batch writes
nothing twice.

The replay is Spark's own: after a run, the last commit file of the checkpoint is deleted, so the
restarted query re-runs that micro-batch (same offsets, same batch id) and sends its rows again;
the broker's producer dedup must acknowledge them without storing them. Targets are a plain
topic (the ``topic`` option) and a partitioned topic chosen per row (the ``topic`` column).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import mmh3
import pytest
from pyspark.sql import SparkSession

from tests.spark.support import produce, read_back, source, write_available_now

pytestmark = pytest.mark.slow

SOURCE_TOPIC = "sink-source"
EVEN_TOPIC = "sink-even"
ODD_TOPIC = "sink-odd"
ODD_PARTITIONS = 3
MESSAGES = 30
PER_TRIGGER = 10


def murmur_partition(key: str, partitions: int) -> int:
    return (mmh3.hash(key.encode(), 0, signed=True) & 0x7FFFFFFF) % partitions


def test_replayed_micro_batch_writes_nothing_twice(spark: SparkSession, broker_url: str, tmp_path: Path) -> None:
    response = httpx.put(f"{broker_url}/admin/v2/persistent/public/default/{ODD_TOPIC}/partitions",
                         json=ODD_PARTITIONS, timeout=30)
    assert response.status_code == 204, response.text
    for start in range(0, MESSAGES, 5):
        produce(broker_url, SOURCE_TOPIC, [
            {"payload": f"v{i}".encode(), "key": f"k{i}", "properties": {"i": str(i)}, "eventTime": 1_000 + i}
            for i in range(start, start + 5)])
    frame = source(spark, broker_url, topic=SOURCE_TOPIC, startingOffsets="earliest",
                   maxOffsetsPerTrigger=PER_TRIGGER).selectExpr(
        "key", "value", "properties", "eventTime",
        f"CASE WHEN offset % 2 = 1 THEN '{ODD_TOPIC}' END AS topic")
    checkpoint = tmp_path / "ck"
    first_run = write_available_now(frame, str(checkpoint), broker_url, topic=EVEN_TOPIC)
    last_batch = max(p["batchId"] for p in first_run if p["numInputRows"])
    assert last_batch == MESSAGES // PER_TRIGGER - 1
    for name in (str(last_batch), f".{last_batch}.crc"):  # Spark re-runs that micro-batch on restart
        (checkpoint / "commits" / name).unlink()
    second_run = write_available_now(frame, str(checkpoint), broker_url, topic=EVEN_TOPIC)
    assert [(p["batchId"], p["numInputRows"]) for p in second_run if p["numInputRows"]] == [(last_batch, PER_TRIGGER)]

    even = read_back(broker_url, EVEN_TOPIC)
    assert [m["payload"] for m in even] == [f"v{i}".encode() for i in range(0, MESSAGES, 2)]
    for message in even:
        i = int(message["payload"][1:])
        assert (message["key"], message["properties"], message["eventTimeMs"]) == (f"k{i}", {"i": str(i)}, 1_000 + i)
    odd: list[bytes] = []
    for partition in range(ODD_PARTITIONS):
        payloads = [m["payload"] for m in read_back(broker_url, f"{ODD_TOPIC}-partition-{partition}")]
        assert all(murmur_partition(f"k{p[1:].decode()}", ODD_PARTITIONS) == partition for p in payloads)
        assert payloads == sorted(payloads, key=lambda p: int(p[1:]))  # in order within a partition
        odd.extend(payloads)
    assert sorted(odd) == sorted(f"v{i}".encode() for i in range(1, MESSAGES, 2))  # each exactly once
    assert len(set(odd)) == len(odd)


def test_sink_refuses_a_frame_it_cannot_write(spark: SparkSession, broker_url: str, tmp_path: Path) -> None:
    frame = source(spark, broker_url, topic=SOURCE_TOPIC)
    cases = [
        (frame.selectExpr("key"), "needs a 'value' column", {"topic": EVEN_TOPIC}),
        (frame.selectExpr("value", "offset AS key"), "column 'key'", {"topic": EVEN_TOPIC}),
        (frame.selectExpr("value"), "needs the option 'topic' or a 'topic' column", {}),
    ]
    for index, (invalid, message, options) in enumerate(cases):
        with pytest.raises(Exception, match=message):
            write_available_now(invalid, str(tmp_path / f"ck{index}"), broker_url, **options)
