"""The Magnetar streaming source in a real local Spark against a real broker process.

Checks: a query reads exactly the produced messages with every column right, also those the
official ``pulsar-client`` produced over the binary protocol (with the ids it was given);
``maxOffsetsPerTrigger`` bounds every micro-batch; ``Trigger.AvailableNow`` drains the backlog
and stops, and a restart from the checkpoint reads only what came later; ``startingOffsets``
(latest, JSON) and ``startingTime`` start where asked; a running query picks up partitions added
to its topic, and ``topicsPattern`` picks up matching topics created later; bad options fail
with a message naming the option.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from consumers.spark import SOURCE_SCHEMA
from consumers.spark.source import SPARK_ARROW_SCHEMA
from tests.spark.support import (
    QUERY_TIMEOUT_S,
    Collected,
    collect_available_now,
    full_name,
    produce,
    produce_values,
    read_back,
    source,
)

pytestmark = pytest.mark.slow


def epoch_ms(value: datetime | None) -> int | None:
    """Spark's naive UTC datetime as epoch milliseconds."""
    return None if value is None else round(value.replace(tzinfo=UTC).timestamp() * 1000)


def test_reads_exactly_the_produced_messages_with_every_column(spark: SparkSession, broker_url: str,
                                                               tmp_path: Path) -> None:
    topic = "spark-columns"
    for entry in range(3):
        produce(broker_url, topic, [
            {"payload": bytes([entry, 0, 255]) + os.urandom(5), "key": f"k{entry}", "properties": {"e": str(entry)},
             "eventTime": 1_700_000_000_000 + entry},
            {"payload": os.urandom(7)},
        ])
    frame = source(spark, broker_url, topic=topic, startingOffsets="earliest")
    assert frame.schema == StructType.fromDDL(SOURCE_SCHEMA)
    assert to_arrow_schema(frame.schema, timezone="UTC").equals(SPARK_ARROW_SCHEMA)
    rows = sorted(collect_available_now(frame, str(tmp_path / "ck")).rows, key=lambda r: r.offset)
    expected = read_back(broker_url, topic)
    assert len(rows) == len(expected) == 6
    for row, message in zip(rows, expected, strict=True):
        assert row.offset == message["offset"]
        assert row.value == message["payload"]
        assert row.key == (message["key"].encode() if "key" in message else None)
        assert (row.properties or {}) == message["properties"]
        assert row.topic == full_name(topic) and row.partition == -1
        assert row.messageId == message["messageId"]
        assert epoch_ms(row.publishTime) == message["publishTimeMs"]
        assert epoch_ms(row.eventTime) == message.get("eventTimeMs")


def test_binary_produced_messages_read_through_the_source_with_the_same_ids(
        spark: SparkSession, spark_broker: tuple[str, str], tmp_path: Path) -> None:
    """Messages the official ``pulsar-client`` produced (one alone, three in one batch) are the
    rows the source reads, with the ids the client was given."""
    import pulsar

    from broker.message_id import MessageId
    broker_url, pulsar_url = spark_broker
    topic = "spark-from-binary"
    client = pulsar.Client(pulsar_url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        alone = client.create_producer(topic, batching_enabled=False)
        ids = [alone.send(b"alone", partition_key="k", properties={"p": "1"}, event_timestamp=1_700_000_000_000)]
        batched = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                         batching_max_publish_delay_ms=50)
        receipts: list[pulsar.MessageId] = []
        for i in range(3):
            batched.send_async(f"b{i}".encode(), lambda result, mid: receipts.append(mid))
        batched.flush()
        ids += sorted(receipts, key=lambda m: m.batch_index())
    finally:
        client.close()
    frame = source(spark, broker_url, topic=topic, startingOffsets="earliest")
    rows = sorted(collect_available_now(frame, str(tmp_path / "ck")).rows, key=lambda r: r.offset)
    assert [r.value for r in rows] == [b"alone", b"b0", b"b1", b"b2"]
    assert (rows[0].key, rows[0].properties, epoch_ms(rows[0].eventTime)) == (b"k", {"p": "1"}, 1_700_000_000_000)
    assert [MessageId.from_base64(r.messageId) for r in rows] == [
        MessageId(m.ledger_id(), m.entry_id(), m.partition(), m.batch_index()) for m in ids]


def test_max_offsets_per_trigger_bounds_every_micro_batch(spark: SparkSession, broker_url: str,
                                                          tmp_path: Path) -> None:
    produce_values(broker_url, "spark-bounded-a", [f"a{i}".encode() for i in range(13)])
    produce_values(broker_url, "spark-bounded-b", [f"b{i}".encode() for i in range(7)])
    frame = source(spark, broker_url, topics="spark-bounded-a,spark-bounded-b", startingOffsets="earliest",
                   maxOffsetsPerTrigger=6, readChunkMessages=4)
    collected = collect_available_now(frame, str(tmp_path / "ck"))
    assert collected.sizes() == [6, 6, 6, 2]  # bounded, and availableNow stopped at the end
    assert [p["numInputRows"] for p in collected.progress if p["numInputRows"]] == [6, 6, 6, 2]
    values = sorted(row.value for row in collected.rows)
    assert values == sorted([f"a{i}".encode() for i in range(13)] + [f"b{i}".encode() for i in range(7)])


def test_latest_then_restart_reads_only_later_messages(spark: SparkSession, broker_url: str, tmp_path: Path) -> None:
    topic = "spark-latest"
    produce_values(broker_url, topic, [b"old-1", b"old-2"])
    frame = source(spark, broker_url, topic=topic)  # startingOffsets defaults to latest, as Kafka's
    checkpoint = str(tmp_path / "ck")
    assert collect_available_now(frame, checkpoint).rows == []
    produce_values(broker_url, topic, [b"new-1", b"new-2", b"new-3"])
    again = collect_available_now(frame, checkpoint)
    assert sorted(row.value for row in again.rows) == [b"new-1", b"new-2", b"new-3"]
    assert collect_available_now(frame, checkpoint).rows == []


def test_starting_offsets_json_and_starting_time(spark: SparkSession, broker_url: str, tmp_path: Path) -> None:
    topic = "spark-starting"
    for i in range(8):
        produce(broker_url, topic, [{"payload": f"m{i}".encode()}])
    by_offset = source(spark, broker_url, topic=topic, startingOffsets=json.dumps({full_name(topic): 5}))
    assert sorted(r.offset for r in collect_available_now(by_offset, str(tmp_path / "ck1")).rows) == [5, 6, 7]
    messages = read_back(broker_url, topic)
    pivot_ms = messages[3]["publishTimeMs"]
    expected = [m["offset"] for m in messages if m["publishTimeMs"] >= pivot_ms]
    by_time = source(spark, broker_url, topic=topic, startingTime=pivot_ms, startingOffsets="latest")
    assert sorted(r.offset for r in collect_available_now(by_time, str(tmp_path / "ck2")).rows) == expected
    assert expected[0] <= 3


def test_bad_options_fail_clearly(spark: SparkSession, broker_url: str, tmp_path: Path) -> None:
    cases = [
        ({"topic": "x", "topics": "y"}, "exactly one of"),
        ({}, "exactly one of"),
        ({"topic": "x", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"topic": "x", "startingOffsets": "{not json"}, "startingOffsets"),
        ({"topic": "spark-columns", "startingOffsets": json.dumps({full_name("elsewhere"): 1})}, "does not read"),
    ]
    for options, expected in cases:
        with pytest.raises(Exception, match=expected):
            frame = source(spark, broker_url, **options)
            collect_available_now(frame, str(tmp_path / f"ck-{len(options)}-{expected[:5]}"))
    assert httpx.get(f"{broker_url}/healthz").status_code == 200


def admin(url: str, method: str, path: str, body: object) -> None:
    response = httpx.request(method, f"{url}/admin/v2/persistent/public/default/{path}", json=body, timeout=30)
    assert response.status_code == 204, response.text


def wait_for_rows(collected: Collected, expected: set[bytes], query: StreamingQuery) -> None:
    """Until the query has handed over every ``expected`` value (bounded by a deadline)."""
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    while not expected <= {row.value for row in collected.rows}:
        if query.exception() is not None or not query.isActive:
            raise AssertionError(f"query ended early: {query.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"missing {sorted(expected - {row.value for row in collected.rows})}")
        time.sleep(0.1)


def test_running_query_picks_up_new_partitions(spark: SparkSession, broker_url: str, tmp_path: Path) -> None:
    topic = "spark-grow"
    admin(broker_url, "PUT", f"{topic}/partitions", 2)
    produce(broker_url, f"public/default/{topic}/partitions/0", [{"payload": b"p0-a"}])
    produce(broker_url, f"public/default/{topic}/partitions/1", [{"payload": b"p1-a"}])
    collected = Collected()

    def keep(batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        with collected.lock:
            collected.batches.append((batch_id, rows))

    query = (source(spark, broker_url, topic=topic, startingOffsets="earliest").writeStream.foreachBatch(keep)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    try:
        wait_for_rows(collected, {b"p0-a", b"p1-a"}, query)
        admin(broker_url, "POST", f"{topic}/partitions", 3)
        produce(broker_url, f"public/default/{topic}/partitions/2", [{"payload": b"p2-a"}, {"payload": b"p2-b"}])
        produce(broker_url, f"public/default/{topic}/partitions/0", [{"payload": b"p0-b"}])
        wait_for_rows(collected, {b"p2-a", b"p2-b", b"p0-b"}, query)
    finally:
        query.stop()
    rows = collected.rows
    assert sorted(row.value for row in rows) == [b"p0-a", b"p0-b", b"p1-a", b"p2-a", b"p2-b"]  # each once
    new_partition = sorted((row.partition, row.offset, row.topic) for row in rows if row.partition == 2)
    assert new_partition == [(2, 0, f"{full_name(topic)}-partition-2"), (2, 1, f"{full_name(topic)}-partition-2")]


def test_topics_pattern_picks_up_new_matching_topics(spark: SparkSession, broker_url: str, tmp_path: Path) -> None:
    produce_values(broker_url, "spark-pattern-a", [b"a1", b"a2"])
    admin(broker_url, "PUT", "spark-pattern-parts/partitions", 2)
    produce(broker_url, "public/default/spark-pattern-parts/partitions/1", [{"payload": b"parts-1"}])
    frame = source(spark, broker_url, topicsPattern="persistent://public/default/spark-pattern-.*",
                   startingOffsets="earliest")
    checkpoint = str(tmp_path / "ck")
    assert sorted(r.value for r in collect_available_now(frame, checkpoint).rows) == [b"a1", b"a2", b"parts-1"]
    produce_values(broker_url, "spark-pattern-b", [b"b1"])
    produce_values(broker_url, "spark-unrelated", [b"other"])
    produce_values(broker_url, "spark-pattern-a", [b"a3"])
    later = collect_available_now(frame, checkpoint).rows
    assert sorted(r.value for r in later) == [b"a3", b"b1"]
    assert {r.topic for r in later if r.value == b"b1"} == {full_name("spark-pattern-b")}
