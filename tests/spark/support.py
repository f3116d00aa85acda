"""Helpers of the Spark tests: produce and read back over HTTP, run bounded streaming queries.

Every wait has a deadline (``QUERY_TIMEOUT_S``); a query that overruns it is stopped and the
test fails. Queries collect what they saw with ``foreachBatch`` (batch id, rows), so a test can
check both the data and how it was split into micro-batches.
"""

from __future__ import annotations

import base64
import itertools
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from consumers.spark import MagnetarDataSource
from tests.standalone import read_all

SPARK_CONFIG = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}


def spark_session(app_name: str) -> SparkSession:
    """A local session with the Magnetar data source registered (also used by child processes)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in SPARK_CONFIG.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MagnetarDataSource)
    return session


QUERY_TIMEOUT_S = 120
_names = itertools.count()


def topic_url(topic: str) -> str:
    """REST path of a short (``public/default``) or ``tenant/ns/topic`` name."""
    return "/topics/persistent/" + (topic if "/" in topic else f"public/default/{topic}")


def full_name(topic: str) -> str:
    return "persistent://" + (topic if "/" in topic else f"public/default/{topic}")


def produce(url: str, topic: str, messages: list[dict[str, Any]], *, producer: str | None = None) -> list[int]:
    """REST-produce ``messages`` (``payload`` as bytes) as one entry; their offsets."""
    body: dict[str, Any] = {"payloadEncoding": "base64",
                            "messages": [{**m, "payload": base64.b64encode(m["payload"]).decode()} for m in messages]}
    if producer is not None:
        body["producerName"] = producer
    response = httpx.post(url + topic_url(topic), json=body, timeout=30)
    assert response.status_code == 200, response.text
    return [r["offset"] for r in response.json()["messagePublishResults"]]


def produce_values(url: str, topic: str, values: list[bytes], *, per_request: int = 10) -> None:
    for start in range(0, len(values), per_request):
        produce(url, topic, [{"payload": v} for v in values[start:start + per_request]])


def read_back(url: str, topic: str) -> list[dict[str, Any]]:
    """Every message of a topic (partition) through the JSON range read, payloads decoded."""
    return read_all(url, topic_url(topic), missing_ok=True)


def source(spark: SparkSession, url: str, **options: str | int) -> DataFrame:
    reader = spark.readStream.format("magnetar").option("service.url", url)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


@dataclass
class Collected:
    """What a query handed to ``foreachBatch``: (batch id, rows) per micro-batch, and its progress."""

    batches: list[tuple[int, list[Row]]] = field(default_factory=list)
    progress: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rows(self) -> list[Row]:
        return [row for _, rows in self.batches for row in rows]

    def sizes(self) -> list[int]:
        return [len(rows) for _, rows in self.batches]


def await_query(query: StreamingQuery, timeout_s: int = QUERY_TIMEOUT_S) -> None:
    """Wait for an availableNow query to end; stop it and fail if it overruns the deadline."""
    if not query.awaitTermination(timeout_s):
        query.stop()
        raise AssertionError(f"query {query.name} did not finish within {timeout_s} s")


def collect_available_now(frame: DataFrame, checkpoint: str) -> Collected:
    """Run ``frame`` with ``Trigger(availableNow=True)`` to the end, collecting every micro-batch."""
    collected = Collected()

    def keep(batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        with collected.lock:
            collected.batches.append((batch_id, rows))

    query = (frame.writeStream.queryName(f"collect_{next(_names)}").foreachBatch(keep)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    await_query(query)
    collected.progress = list(query.recentProgress)
    return collected


def write_available_now(frame: DataFrame, checkpoint: str, url: str, **options: str) -> list[dict[str, Any]]:
    """Run ``frame`` into the magnetar sink with ``Trigger(availableNow=True)``; its progress."""
    writer = frame.writeStream.format("magnetar").option("service.url", url)
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    await_query(query)
    return list(query.recentProgress)
