"""The Spark Structured Streaming source: Magnetar topic partitions read by offset ranges.

Role: ``spark.readStream.format("magnetar")``. On the driver, :class:`MagnetarStreamReader`
discovers the topic partitions (a topic list, or every topic of a namespace matching
``topicsPattern``; a partitioned topic contributes all its partitions, so partitions and topics
created later are found on the next trigger) and plans each micro-batch as one offset range per
topic partition. On the executors, :func:`read_range` fetches a range with the broker's Arrow
range read (``GET .../messages``, ``Accept: application/vnd.apache.arrow.stream``) in bounded
chunks and yields the record batches as they arrive (only the two timestamp columns are cast,
milliseconds to Spark's microseconds, column-wise), fetching the next chunk meanwhile.

Offsets: a JSON object ``{"<full partition topic name>": next_offset}`` with sorted keys
(Spark compares offsets as JSON strings). A partition absent from a micro-batch's start offset
(discovered later) is read from offset 0.

Invariants:
- Deterministic replay: a range depends only on the (start, end) offsets Spark logged, so a
  re-run micro-batch reads exactly the same messages; together with Spark's checkpoint this
  makes the source exactly-once.
- ``maxOffsetsPerTrigger`` bounds every micro-batch: the budget is spread over the partitions in
  proportion to their backlog and the shares add up to exactly the budget (never more).
- ``Trigger.AvailableNow`` reads up to the offsets seen when the query started, never beyond,
  and ends.
- Data removed by retention before it was read fails the query (``failOnDataLoss``, the
  default) with a message naming the topic partition and the offsets lost; with
  ``failOnDataLoss=false`` the read skips to the first retained offset and logs a warning.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from consumers.spark.client import (
    DEFAULT_NAMESPACE,
    BrokerClient,
    BrokerHttpError,
    PartitionOffsets,
    RangeRead,
    full_topic_name,
    partition_index,
    tls_of,
)
from consumers.tls import ClientTls

log = logging.getLogger(__name__)

READ_CHUNK_MESSAGES_DEFAULT = 20_000
READ_CHUNK_MESSAGES_MAX = 100_000
"""The broker's bound on one range read (``READ_MESSAGES_MAX`` in api/limits.py)."""
READ_AHEAD_CHUNKS = 1
"""Chunks fetched while Spark consumes the current one (memory: this many more chunks per task)."""
EARLIEST, LATEST = -2, -1
"""Offsets that mean "first retained" and "next" in a ``startingOffsets`` JSON (as Kafka's)."""

SPARK_TIMESTAMP = pa.timestamp("us", tz="UTC")
SPARK_ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("messageId", pa.string()),
    pa.field("publishTime", SPARK_TIMESTAMP),
    pa.field("eventTime", SPARK_TIMESTAMP),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
])
"""What Spark expects of a batch for the source's schema (``to_arrow_schema(..., timezone="UTC")``)."""
_TIMESTAMP_COLUMNS = frozenset({"publishTime", "eventTime"})


# --- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOptions:
    service_url: str
    token: str | None
    topics: tuple[str, ...]
    """Full names of the topics read (partitioned ones expand to their partitions)."""
    pattern: re.Pattern[str] | None
    pattern_namespace: str | None
    starting_offsets: str
    """``earliest``, ``latest`` or a JSON object."""
    starting_time_ms: int | None
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    read_chunk_messages: int
    tls: ClientTls

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        service_url = options.get("service.url")
        if not service_url:
            raise ValueError("the magnetar source needs option 'service.url' (http://host:port)")
        chosen = [k for k in ("topic", "topics", "topicsPattern") if options.get(k)]
        if len(chosen) != 1:
            raise ValueError("set exactly one of the options 'topic', 'topics' or 'topicsPattern'"
                             f" (got {chosen or 'none'})")
        topics: tuple[str, ...] = ()
        pattern: re.Pattern[str] | None = None
        namespace: str | None = None
        if chosen[0] == "topicsPattern":
            pattern, namespace = _parse_pattern(options["topicsPattern"])
        else:
            names = [t for t in options[chosen[0]].split(",") if t.strip()]
            topics = tuple(sorted({full_topic_name(t) for t in names}))
        return cls(service_url=service_url, token=options.get("token") or None, topics=topics, pattern=pattern,
                   pattern_namespace=namespace,
                   starting_offsets=options.get("startingOffsets", "latest").strip(),
                   starting_time_ms=_optional_int(options, "startingTime", minimum=0),
                   max_offsets_per_trigger=_optional_int(options, "maxOffsetsPerTrigger", minimum=1),
                   fail_on_data_loss=_bool(options, "failOnDataLoss", default=True),
                   read_chunk_messages=_optional_int(options, "readChunkMessages", minimum=1,
                                                     maximum=READ_CHUNK_MESSAGES_MAX)
                   or READ_CHUNK_MESSAGES_DEFAULT, tls=tls_of(options))


def _parse_pattern(text: str) -> tuple[re.Pattern[str], str]:
    """A ``topicsPattern`` is a regex over full topic names of one namespace, named by its prefix
    (``persistent://tenant/namespace/...``; without a prefix, ``public/default``)."""
    full = text.strip() if "://" in text else f"persistent://{DEFAULT_NAMESPACE}/{text.strip()}"
    parts = full.partition("://")[2].split("/", 2)
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise ValueError(f"topicsPattern {text!r} must look like persistent://tenant/namespace/regex")
    try:
        return re.compile(full), f"{parts[0]}/{parts[1]}"
    except re.error as exc:
        raise ValueError(f"topicsPattern {text!r} is not a valid regular expression: {exc}") from exc


def _optional_int(options: Mapping[str, str], name: str, *, minimum: int, maximum: int | None = None) -> int | None:
    text = options.get(name)
    if text is None or not str(text).strip():
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, got {text!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ValueError(f"option {name!r} must be {bound}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, *, default: bool) -> bool:
    text = str(options.get(name, str(default))).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"option {name!r} must be true or false, got {text!r}")
    return text == "true"


# --- offsets ----------------------------------------------------------------------------------


def sorted_offsets(offsets: Mapping[str, int]) -> dict[str, int]:
    """Offsets as Spark must see them: keys in sorted order, so equal offsets are equal JSON."""
    return {name: int(offsets[name]) for name in sorted(offsets)}


def apportion(backlogs: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` rows over partitions in proportion to their backlog (largest remainders
    first, ties by name). The shares never exceed a backlog and add up to ``min(budget, total)``."""
    total = sum(backlogs.values())
    if total <= budget:
        return dict(backlogs)
    shares = {name: backlog * budget // total for name, backlog in backlogs.items()}
    left = budget - sum(shares.values())
    for name in sorted(backlogs, key=lambda n: (-(backlogs[n] * budget % total), n)):
        if left == 0:
            break
        if shares[name] < backlogs[name]:
            shares[name] += 1
            left -= 1
    return shares


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark input partition: offsets ``[from_offset, until_offset)`` of one topic partition."""

    service_url: str
    token: str | None
    topic_partition: str
    from_offset: int
    until_offset: int
    fail_on_data_loss: bool
    read_chunk_messages: int
    tls: ClientTls = field(default_factory=ClientTls)


# --- the driver side --------------------------------------------------------------------------


class MagnetarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; ``read`` runs on the executors (stateless)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = SourceOptions.parse(options)
        self._client: BrokerClient | None = None
        self._available_now_target: dict[str, int] | None = None
        self._latest_seen: dict[str, int] | None = None

    def _broker(self) -> BrokerClient:
        if self._client is None:
            self._client = BrokerClient(self.options.service_url, token=self.options.token, tls=self.options.tls)
        return self._client

    def discover(self, *, timestamp_ms: int | None = None) -> dict[str, PartitionOffsets]:
        """Offsets of every topic partition the query reads, by full partition name."""
        found: dict[str, PartitionOffsets] = {}
        for topic in self._topics():
            try:
                _, offsets = self._broker().offsets(topic, timestamp_ms=timestamp_ms)
            except BrokerHttpError as exc:
                if exc.status != 404:
                    raise
                log.info("topic %s does not exist (yet); it is read once it does", topic)
                continue
            found.update(offsets)
        return found

    def _topics(self) -> list[str]:
        if self.options.pattern is None:
            return list(self.options.topics)
        assert self.options.pattern_namespace is not None
        topics, partitioned = self._broker().list_topics(self.options.pattern_namespace)
        bases = set(partitioned)
        names = bases | {t for t in topics if partition_index(t) < 0 or t.rpartition("-partition-")[0] not in bases}
        return sorted(n for n in names if self.options.pattern.fullmatch(n))

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's method name
        options = self.options
        if options.starting_time_ms is not None:
            found = self.discover(timestamp_ms=options.starting_time_ms)
            return sorted_offsets({name: o.at_timestamp if o.at_timestamp is not None else o.next
                                   for name, o in found.items()})
        found = self.discover()
        mode = options.starting_offsets
        if mode == "earliest":
            return sorted_offsets({name: o.first for name, o in found.items()})
        if mode == "latest":
            return sorted_offsets({name: o.next for name, o in found.items()})
        return sorted_offsets(_json_starting_offsets(mode, found))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._available_now_target = {name: o.next for name, o in self.discover().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        available = self._available_offsets()
        self._latest_seen = sorted_offsets(available)
        backlogs: dict[str, int] = {}
        for name, next_offset in available.items():
            from_offset = start.get(name, 0)
            if next_offset < from_offset:
                self._offsets_went_back(name, from_offset, next_offset)
                from_offset = 0
            if next_offset > from_offset:
                backlogs[name] = next_offset - from_offset
        if isinstance(limit, ReadMaxRows):
            backlogs = apportion(backlogs, limit.max_rows)
        end = dict(start)
        for name, share in backlogs.items():
            if share > 0:
                from_offset = start.get(name, 0)
                end[name] = (0 if available[name] < from_offset else from_offset) + share
        return sorted_offsets(end)

    def _available_offsets(self) -> dict[str, int]:
        if self._available_now_target is not None:
            return dict(self._available_now_target)
        return {name: o.next for name, o in self.discover().items()}

    def _offsets_went_back(self, name: str, from_offset: int, next_offset: int) -> None:
        message = (f"{name}: the query is at offset {from_offset} but the topic partition now ends at "
                   f"{next_offset} (deleted and re-created?); messages may have been lost")
        if self.options.fail_on_data_loss:
            raise RuntimeError(message + ". Set failOnDataLoss=false to read it again from offset 0.")
        log.warning("%s; reading it again from offset 0", message)

    def reportLatestOffset(self) -> dict[str, int] | None:  # noqa: N802
        return self._latest_seen

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[OffsetRange]:
        ranges = []
        for name in sorted(end):
            from_offset = start.get(name, 0)
            until = end[name]
            if until < from_offset:  # the partition was re-created (see latestOffset)
                from_offset = 0
            if until > from_offset:
                ranges.append(OffsetRange(self.options.service_url, self.options.token, name, from_offset, until,
                                          self.options.fail_on_data_loss, self.options.read_chunk_messages,
                                          self.options.tls))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the source holds no broker-side state (no cursor)."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _json_starting_offsets(text: str, found: Mapping[str, PartitionOffsets]) -> dict[str, int]:
    try:
        given = json.loads(text)
    except ValueError:
        raise ValueError(f"startingOffsets must be 'earliest', 'latest' or a JSON object, got {text!r}") from None
    if not isinstance(given, dict) or not all(isinstance(v, int) for v in given.values()):
        raise ValueError('startingOffsets JSON must map topic partitions to offsets: {"persistent://t/ns/x": 5}')
    wanted = {full_topic_name(name): offset for name, offset in given.items()}
    unknown = sorted(set(wanted) - set(found))
    if unknown:
        raise ValueError(f"startingOffsets names topic partitions this query does not read: {unknown}")
    start = {}
    for name, offsets in found.items():
        offset = wanted.get(name, EARLIEST)
        if offset < LATEST:
            offset = offsets.first
        elif offset == LATEST:
            offset = offsets.next
        start[name] = offset
    return start


# --- the executor side ------------------------------------------------------------------------


def to_spark_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A range-read batch in Spark's layout: columns in schema order, times in microseconds."""
    arrays = [batch.column(f.name).cast(SPARK_TIMESTAMP) if f.name in _TIMESTAMP_COLUMNS else batch.column(f.name)
              for f in SPARK_ARROW_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=SPARK_ARROW_SCHEMA)


class DataLossError(RuntimeError):
    """Messages the query had to read were removed by retention (``failOnDataLoss=true``)."""


def read_range(task: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Every message of ``[from_offset, until_offset)`` of one topic partition, in chunks of at
    most ``read_chunk_messages``. The next chunk is fetched (one ahead, ``READ_AHEAD_CHUNKS``)
    while Spark consumes the current one, so the broker's work overlaps Spark's. Each chunk
    advances the offset, so the loop is bounded."""
    offset = task.from_offset
    with BrokerClient(task.service_url, token=task.token, tls=task.tls) as broker, \
            ThreadPoolExecutor(READ_AHEAD_CHUNKS) as fetcher:

        def fetch(at: int) -> Future[RangeRead]:
            return fetcher.submit(broker.read_arrow, task.topic_partition, at,
                                  min(task.read_chunk_messages, task.until_offset - at))

        pending = fetch(offset)
        while True:
            try:
                chunk = pending.result()
            except BrokerHttpError as exc:
                if exc.code != "data_lost":
                    raise
                offset = _after_data_loss(task, broker, offset, exc)
                if offset >= task.until_offset:
                    return
                pending = fetch(offset)
                continue
            if chunk.next_offset <= offset:
                _report_loss(task, offset, task.until_offset, "the topic partition ends before offsets "
                             f"[{offset}, {task.until_offset}) the micro-batch planned")
                return
            offset = chunk.next_offset
            if offset < task.until_offset:
                pending = fetch(offset)
            for batch in chunk.batches:
                yield to_spark_batch(batch)
            if offset >= task.until_offset:
                return


def _after_data_loss(task: OffsetRange, broker: BrokerClient, offset: int, error: BrokerHttpError) -> int:
    """The offset to continue from after ``offset`` turned out to be trimmed (or fail)."""
    _, offsets = broker.offsets(task.topic_partition)
    first = offsets[task.topic_partition].first if task.topic_partition in offsets else task.until_offset
    if first <= offset:  # trimmed and refilled in between: cannot be; do not loop
        raise DataLossError(f"{task.topic_partition}: {error.message}") from error
    lost_until = min(first, task.until_offset)
    _report_loss(task, offset, lost_until, f"retention removed them before they were read "
                 f"(the first available offset is {first})")
    return lost_until


def _report_loss(task: OffsetRange, from_offset: int, until_offset: int, why: str) -> None:
    message = f"{task.topic_partition}: offsets [{from_offset}, {until_offset}) were lost: {why}"
    if task.fail_on_data_loss:
        raise DataLossError(message + ". Set failOnDataLoss=false to skip lost data and continue.")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
