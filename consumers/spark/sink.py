"""The Spark Structured Streaming sink: exactly-once writes through the broker's producer dedup.

Role: ``writeStream.format("magnetar")``. Each Spark task of a micro-batch publishes its rows
with REST produce (Pulsar's PIP-64 body, ``payloadEncoding: "base64"``). Columns: ``value``
(binary or string, required), optional ``key`` (string or UTF-8 binary), ``properties``
(map<string,string>), ``eventTime`` (timestamp) and ``topic`` (a per-row target that overrides
the ``topic`` option; unlike Kafka's sink, where the option wins). Other columns are ignored.

Exactly-once: the broker stores a message once per (producer name, sequence id) and treats a
sequence id not above the producer's last stored one as a duplicate. The sink names its
producers after (query id, Spark partition id, target topic partition) and gives row ``i`` of a
task of micro-batch ``b`` the sequence id ``b * ROWS_PER_PARTITION_MAX + i``. The query id and
the batch id come from Spark's local properties (``sql.streaming.queryId`` survives restarts
from a checkpoint; ``streaming.sql.batchId``). A retried task or a micro-batch Spark re-runs
after a crash resends the same rows with the same ids, so whatever was stored before is
acknowledged as a duplicate and nothing is written twice.

Invariants and limits:
- A task writes at most ``ROWS_PER_PARTITION_MAX`` rows per micro-batch (beyond that it fails
  with a clear message), so sequence ids of later micro-batches are always higher.
- Rows go out in order, one bounded request at a time (``REQUEST_MESSAGES_MAX`` messages,
  ``REQUEST_PAYLOAD_BYTES_MAX`` payload bytes; one request is one entry), with request
  boundaries that depend only on the rows, so a replay splits them the same way.
- A partitioned target is routed by the sink itself, deterministically: a keyed row to
  ``murmur3_32(key) % partitions`` (as the broker routes), an unkeyed row to partition
  ``spark_partition_id % partitions``. A target's partition count must not change between a
  micro-batch and its replay (an unkeyed row would land elsewhere).
- A replay writes nothing twice only if it presents each task the same rows in the same order:
  true for a deterministic source (such as Magnetar's) and row-wise transformations; not after a
  shuffle whose order varies.
- The broker's dedup must be on (the default; a namespace may turn it off).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import mmh3
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, DataType, MapType, StringType, StructType, TimestampType

from consumers.spark.client import BrokerClient, BrokerHttpError, full_topic_name, tls_of

log = logging.getLogger(__name__)

ROWS_PER_PARTITION_MAX = 100_000_000
"""Rows one Spark task may write in one micro-batch; sequence ids are ``batch * this + row``."""
REQUEST_MESSAGES_MAX = 1000
REQUEST_PAYLOAD_BYTES_MAX = 4 * 1024 * 1024
"""Below the broker's entry limit (5 MiB + 64 KiB), since one request is stored as one entry."""
SEND_ATTEMPTS_MAX = 8
RETRY_DELAY_S_FIRST = 0.1
RETRY_DELAY_S_MAX = 2.0
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
DUPLICATE_MESSAGE_ID = "-1:-1:-1"

_ACCEPTED_TYPES: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "value": ((BinaryType, StringType), "binary or string"),
    "key": ((BinaryType, StringType), "binary or string"),
    "properties": ((MapType,), "map<string,string>"),
    "eventTime": ((TimestampType,), "timestamp"),
    "topic": ((StringType,), "string"),
}


def check_sink_schema(schema: StructType, default_topic: str | None) -> None:
    """Refuse, before any task runs, a DataFrame the sink cannot write."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise ValueError(f"the magnetar sink needs a 'value' column (binary or string); got {sorted(fields)}")
    for name, (accepted, described) in _ACCEPTED_TYPES.items():
        if name in fields and not isinstance(fields[name], accepted):
            raise ValueError(f"column {name!r} of the magnetar sink must be {described}, "
                             f"not {fields[name].simpleString()}")
    properties = fields.get("properties")
    if isinstance(properties, MapType) and not (
            isinstance(properties.keyType, StringType) and isinstance(properties.valueType, StringType)):
        raise ValueError(f"column 'properties' must be map<string,string>, not {properties.simpleString()}")
    if default_topic is None and "topic" not in fields:
        raise ValueError("the magnetar sink needs the option 'topic' or a 'topic' column")


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task did: rows seen, messages stored, and messages the broker already had."""

    partition_id: int
    rows: int = 0
    stored: int = 0
    duplicates: int = 0


@dataclass
class _Pending:
    """Messages for one target (topic partition) not sent yet."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    payload_bytes: int = 0


@dataclass(frozen=True)
class _Target:
    topic: str
    partition: int | None
    """None for an unpartitioned topic; else the partition the request is posted to."""


class MagnetarStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        service_url = options.get("service.url")
        if not service_url:
            raise ValueError("the magnetar sink needs option 'service.url' (http://host:port)")
        self.service_url = service_url
        self.token = options.get("token") or None
        self.tls = tls_of(options)
        topic = options.get("topic")
        self.default_topic = full_topic_name(topic) if topic else None
        check_sink_schema(schema, self.default_topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("the magnetar sink runs in Spark tasks only")
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        if batch_id is None or query_id is None:
            raise RuntimeError("the magnetar sink needs a streaming query (no micro-batch id in the task)")
        task = _TaskWriter(BrokerClient(self.service_url, token=self.token, tls=self.tls), self.default_topic, query_id,
                           int(batch_id), context.partitionId())
        with task:
            for batch in iterator:
                task.add(batch)
            task.flush_all()
        return task.commit

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.info("magnetar sink: micro-batch %d wrote %d messages (%d already stored) from %d rows",
                 batchId, sum(m.stored for m in done), sum(m.duplicates for m in done), sum(m.rows for m in done))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("magnetar sink: micro-batch %d aborted; a re-run stores only what is missing", batchId)


class _TaskWriter:
    """The rows of one Spark task of one micro-batch, published in order."""

    def __init__(self, broker: BrokerClient, default_topic: str | None, query_id: str, batch_id: int,
                 partition_id: int) -> None:
        self._broker = broker
        self._default_topic = default_topic
        self._query_id = query_id
        self._first_sequence_id = batch_id * ROWS_PER_PARTITION_MAX
        self._partition_id = partition_id
        self._partitions: dict[str, int] = {}
        self._pending: dict[_Target, _Pending] = {}
        self._row = 0
        self.commit = SinkCommit(partition_id)

    def __enter__(self) -> _TaskWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self._broker.close()

    def add(self, batch: pa.RecordBatch) -> None:
        names = set(batch.schema.names)
        values = batch.column("value")
        if pa.types.is_string(values.type):
            values = values.cast(pa.binary())
        columns = {
            "value": values.to_pylist(),
            "key": _column(batch, "key", names),
            "properties": _column(batch, "properties", names),
            "eventTime": _event_times_ms(batch) if "eventTime" in names else None,
            "topic": _column(batch, "topic", names),
        }
        for i in range(batch.num_rows):
            self._add_row(columns, i)

    def _add_row(self, columns: dict[str, list[Any] | None], i: int) -> None:
        if self._row >= ROWS_PER_PARTITION_MAX:
            raise RuntimeError(f"a Spark task wrote more than {ROWS_PER_PARTITION_MAX} rows in one micro-batch; "
                               "lower maxOffsetsPerTrigger or use more partitions")
        value = _at(columns, "value", i)
        if value is None:
            raise ValueError("the magnetar sink cannot write a null 'value'")
        key = _key_text(_at(columns, "key", i))
        message: dict[str, Any] = {"payload": base64.b64encode(value).decode("ascii"),
                                   "sequenceId": self._first_sequence_id + self._row}
        if key is not None:
            message["key"] = key
        properties = _at(columns, "properties", i)
        if properties:
            message["properties"] = dict(properties)
        event_time_ms = _at(columns, "eventTime", i)
        if event_time_ms is not None:
            message["eventTime"] = event_time_ms
        target = self._target(_at(columns, "topic", i), key)
        pending = self._pending.setdefault(target, _Pending())
        if pending.messages and (len(pending.messages) >= REQUEST_MESSAGES_MAX
                                 or pending.payload_bytes + len(value) > REQUEST_PAYLOAD_BYTES_MAX):
            self._flush(target)
            pending = self._pending.setdefault(target, _Pending())
        pending.messages.append(message)
        pending.payload_bytes += len(value)
        self._row += 1
        self.commit.rows += 1

    def _target(self, row_topic: str | None, key: str | None) -> _Target:
        topic = full_topic_name(row_topic) if row_topic else self._default_topic
        if topic is None:
            raise ValueError("a row has no 'topic' and the sink has no 'topic' option")
        count = self._partition_count(topic)
        if count == 0:
            return _Target(topic, None)
        if key is not None:
            return _Target(topic, (mmh3.hash(key.encode(), 0, signed=True) & 0x7FFFFFFF) % count)
        return _Target(topic, self._partition_id % count)

    def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            try:
                count = self._broker.offsets(topic)[0]
            except BrokerHttpError as exc:
                if exc.status != 404:
                    raise
                count = 0  # not there yet: REST produce creates it
            self._partitions[topic] = count
        return count

    def producer_name(self, target: _Target) -> str:
        where = target.topic if target.partition is None else f"{target.topic}-partition-{target.partition}"
        return f"spark:{self._query_id}:{self._partition_id}:{where}"

    def flush_all(self) -> None:
        for target in list(self._pending):
            self._flush(target)

    def _flush(self, target: _Target) -> None:
        pending = self._pending.pop(target, None)
        if pending is None or not pending.messages:
            return
        body = {"producerName": self.producer_name(target), "payloadEncoding": "base64",
                "messages": pending.messages}
        results = self._send(target, body)
        duplicates = sum(1 for r in results if r.get("messageId") == DUPLICATE_MESSAGE_ID)
        self.commit.duplicates += duplicates
        self.commit.stored += len(results) - duplicates

    def _send(self, target: _Target, body: dict[str, Any]) -> list[dict[str, Any]]:
        delay_s = RETRY_DELAY_S_FIRST
        for attempt in range(1, SEND_ATTEMPTS_MAX + 1):
            try:
                results = self._broker.produce(target.topic, body, partition=target.partition)
            except BrokerHttpError as exc:
                if not exc.retriable or attempt == SEND_ATTEMPTS_MAX:
                    raise RuntimeError(f"magnetar sink: writing to {target.topic} failed: {exc}") from exc
                log.warning("magnetar sink: retrying a write to %s (attempt %d): %s", target.topic, attempt, exc)
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, RETRY_DELAY_S_MAX)
                continue
            failed = [r for r in results if r.get("errorCode", 0) != 0]
            if failed:
                raise RuntimeError(f"magnetar sink: {target.topic} refused messages: {failed[0].get('errorMsg')}")
            return results
        raise AssertionError("unreachable: the last attempt returns or raises")


def _column(batch: pa.RecordBatch, name: str, names: set[str]) -> list[Any] | None:
    return batch.column(name).to_pylist() if name in names else None


def _at(columns: dict[str, list[Any] | None], name: str, i: int) -> Any:
    column = columns[name]
    return None if column is None else column[i]


def _event_times_ms(batch: pa.RecordBatch) -> list[int | None]:
    """Spark's microsecond timestamps as epoch milliseconds (integer division, column-wise)."""
    millis: list[int | None] = pc.divide(batch.column("eventTime").cast(pa.int64()), 1000).to_pylist()
    return millis


def _key_text(key: str | bytes | None) -> str | None:
    if key is None or isinstance(key, str):
        return key
    try:
        return key.decode()
    except UnicodeDecodeError:
        raise ValueError("a 'key' is not UTF-8: Magnetar keys are strings") from None
