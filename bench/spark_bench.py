"""Spark source benchmark: the Magnetar streaming source against the Python Data Source API's ceiling.

Role: measures, in one run and one local Spark session (``local[2]``), how many rows per second
a streaming query moves into the ``noop`` sink with ``Trigger(availableNow=True)``:

1. anchor: an in-memory Python streaming source with the same schema, the same number of input
   partitions and the same rows (100 B values), yielding pre-built Arrow record batches: what the
   API itself costs on this machine (Arrow hand-over to the JVM, task scheduling, micro-batch
   bookkeeping), i.e. the ceiling any Python source can reach;
2. Magnetar: ``format("magnetar")`` reading the same number of pre-produced 100 B messages from
   a ``magnetar standalone`` child process (a partitioned topic, one input partition per topic
   partition), fetched with the Arrow range read.

Each query runs once as a warm-up on a small backlog (JVM JIT, Python workers), then once
measured; the figure is rows over the wall time from ``start()`` to the query's end. The
broker's CPU seconds during the measured query are reported too, and which range-read columns
it used (``NATIVE_COLUMNS`` in broker/entry_format/columns.py: the C accelerator or the pure-Python
reference). A micro-benchmark in this process adds the broker's serving cost per row for both
column builders on entries shaped like the backlog's (collect, record batch, IPC stream; best of
``SERVING_ROUNDS``). Every wait has a deadline and the broker is stopped by its PID.
Run from the repository root: ``.venv/bin/python bench/spark_bench.py [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow as pa
from common import (
    DEFAULT_WORK_ROOT,
    Row,
    machine_summary,
    render_table,
    report,
    scratch_dir,
)
from e2e_support import ServerProcess, free_port, running, started
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, SupportsTriggerAvailableNow

from api.rest_read import arrow_stream
from broker.entry import Entry
from broker.entry_format import Message, encode_entry
from broker.entry_format.columns import NATIVE_COLUMNS, collect_entries
from broker.message_id import Position
from consumers.spark import SOURCE_SCHEMA, MagnetarDataSource
from consumers.spark.source import READ_CHUNK_MESSAGES_DEFAULT, SPARK_ARROW_SCHEMA

SECTION_HEADING = "## Spark source (bench/spark_bench.py)"
TARGET_RATIO = 0.8
PAYLOAD_BYTES = 100
PARTITIONS = 2
PRODUCE_MESSAGES_PER_REQUEST = 10_000
PRODUCE_THREADS = 2
ANCHOR_BATCH_ROWS = 20_000
WARMUP_ROWS = 20_000
START_TIMEOUT_S = 60.0
QUERY_TIMEOUT_S = 600
TOPIC = "spark-bench"
SERVING_ROUNDS = 7
SERVING_BYTES_MAX = 64 * 1024 * 1024
CONFIG_NOTE = (f"`local[2]`, {PARTITIONS} input partitions, {PAYLOAD_BYTES} B values, "
               "`Trigger(availableNow=True)` into `format(\"noop\")`; broker: `magnetar standalone` defaults")


@dataclass(frozen=True)
class Plan:
    rows: int


NORMAL_PLAN = Plan(rows=1_000_000)
QUICK_PLAN = Plan(rows=200_000)


@dataclass(frozen=True)
class QueryRun:
    rows: int
    wall_s: float
    batches: int
    broker_cpu_s: float = 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s


# --- the anchor: an in-memory source -----------------------------------------------------------


class _InMemoryPartition(InputPartition):
    def __init__(self, index: int, rows: int) -> None:
        super().__init__(index)
        self.index = index
        self.rows = rows


class InMemoryReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``rows`` rows over ``PARTITIONS`` partitions, available at once; one micro-batch."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's method names
        return {"rows": 0}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        assert isinstance(limit, ReadAllAvailable)
        return {"rows": self.rows}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """All rows exist from the start."""

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        total = end["rows"] - start["rows"]
        if total <= 0:
            return []
        share, extra = divmod(total, PARTITIONS)
        return [_InMemoryPartition(i, share + (1 if i < extra else 0)) for i in range(PARTITIONS)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _InMemoryPartition)
        batch = anchor_batch(partition.index, min(ANCHOR_BATCH_ROWS, partition.rows))
        left = partition.rows
        while left > 0:
            yield batch if left >= batch.num_rows else batch.slice(0, left)
            left -= batch.num_rows


def anchor_batch(partition: int, rows: int) -> pa.RecordBatch:
    """Rows shaped like the Magnetar source's: 100 B values, ids, times, empty properties."""
    now_us = int(time.time() * 1_000_000)
    arrays = [
        pa.nulls(rows, pa.binary()),
        pa.array([os.urandom(PAYLOAD_BYTES) for _ in range(rows)], pa.binary()),
        pa.array([f"persistent://public/default/{TOPIC}-partition-{partition}"] * rows, pa.string()),
        pa.array([partition] * rows, pa.int32()),
        pa.array(range(rows), pa.int64()),
        pa.array([base64.b64encode(i.to_bytes(8, "big")).decode() for i in range(rows)], pa.string()),
        pa.array([now_us] * rows, SPARK_ARROW_SCHEMA.field("publishTime").type),
        pa.nulls(rows, SPARK_ARROW_SCHEMA.field("eventTime").type),
        pa.MapArray.from_arrays(pa.array([0] * (rows + 1), pa.int32()), pa.array([], pa.string()),
                                pa.array([], pa.string())),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=SPARK_ARROW_SCHEMA)


class InMemoryDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_in_memory"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: object) -> DataSourceStreamReader:  # noqa: N802
        return InMemoryReader(int(self.options["rows"]))


# --- the broker ------------------------------------------------------------------------------


def start_broker(work_dir: Path) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "api.cli", "standalone", "--data-dir", str(work_dir / "broker"),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    return started(ServerProcess("magnetar", argv, port, work_dir / "broker.log"), wait_healthy)


def base_url(server: ServerProcess) -> str:
    return f"http://127.0.0.1:{server.port}"


def wait_healthy(server: ServerProcess) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            if httpx.get(f"{base_url(server)}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the broker did not answer /healthz within {START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


def produce_backlog(url: str, topic: str, rows: int) -> float:
    """``rows`` 100 B messages spread evenly over the partitions; returns the seconds it took."""
    response = httpx.put(f"{url}/admin/v2/persistent/public/default/{topic}/partitions", json=PARTITIONS, timeout=30)
    response.raise_for_status()
    payload = base64.b64encode(os.urandom(PAYLOAD_BYTES)).decode()
    requests = []
    for partition in range(PARTITIONS):
        left = rows // PARTITIONS + (1 if partition < rows % PARTITIONS else 0)
        while left > 0:
            count = min(left, PRODUCE_MESSAGES_PER_REQUEST)
            requests.append((partition, count))
            left -= count

    def send(request: tuple[int, int]) -> None:
        partition, count = request
        body = {"payloadEncoding": "base64", "messages": [{"payload": payload}] * count}
        httpx.post(f"{url}/topics/persistent/public/default/{topic}/partitions/{partition}", json=body,
                   timeout=120).raise_for_status()

    started_s = time.perf_counter()
    with ThreadPoolExecutor(PRODUCE_THREADS) as pool:
        list(pool.map(send, requests))
    return time.perf_counter() - started_s


# --- queries --------------------------------------------------------------------------------


def spark_session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("magnetar-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(PARTITIONS))
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MagnetarDataSource)
    spark.dataSource.register(InMemoryDataSource)
    return spark


def run_query(spark: SparkSession, source: str, options: dict[str, str], checkpoint: Path,
              broker: ServerProcess | None = None) -> QueryRun:
    reader = spark.readStream.format(source)
    for key, value in options.items():
        reader = reader.option(key, value)
    broker_cpu_before_s = broker.cpu_s() if broker is not None else 0.0
    started_s = time.perf_counter()
    query = (reader.load().writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        query.stop()
        raise RuntimeError(f"{source} query did not finish within {QUERY_TIMEOUT_S:.0f} s")
    wall_s = time.perf_counter() - started_s
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    broker_cpu_s = broker.cpu_s() - broker_cpu_before_s if broker is not None else 0.0
    return QueryRun(sum(p["numInputRows"] for p in progress), wall_s, len(progress), broker_cpu_s)


def measure(spark: SparkSession, url: str, broker: ServerProcess, plan: Plan, work_dir: Path) -> tuple[QueryRun, ...]:
    magnetar = {"service.url": url, "startingOffsets": "earliest"}
    run_query(spark, "bench_in_memory", {"rows": str(WARMUP_ROWS)}, work_dir / "warm-anchor")
    run_query(spark, "magnetar", {**magnetar, "topic": f"{TOPIC}-warmup"}, work_dir / "warm-magnetar")
    anchor = run_query(spark, "bench_in_memory", {"rows": str(plan.rows)}, work_dir / "anchor")
    measured = run_query(spark, "magnetar", {**magnetar, "topic": TOPIC}, work_dir / "magnetar", broker)
    if anchor.rows != plan.rows or measured.rows != plan.rows:
        raise RuntimeError(f"expected {plan.rows} rows, the anchor read {anchor.rows} and Magnetar {measured.rows}")
    return anchor, measured


# --- the broker's serving cost, in process ----------------------------------------------------


def backlog_entries(rows: int) -> list[Entry]:
    """Entries like the backlog's: one per produce request of 100 B messages without keys."""
    entries: list[Entry] = []
    offset = 0
    while offset < rows:
        count = min(PRODUCE_MESSAGES_PER_REQUEST, rows - offset)
        now_ms = int(time.time() * 1000)
        data = encode_entry([Message(os.urandom(PAYLOAD_BYTES)) for _ in range(count)], producer_name="bench",
                            sequence_id=offset, publish_time_ms=now_ms, broker_timestamp_ms=now_ms,
                            index=offset + count - 1)
        entries.append(Entry(Position(1, len(entries)), data, offset, offset + count - 1, now_ms))
        offset += count
    return entries


def serving_us_per_row(entries: list[Entry], *, native: bool) -> float:
    """CPU microseconds per row of one chunk's collect + record batch + IPC stream (best round)."""
    rows = entries[-1].last_offset + 1
    best_s = float("inf")
    for _ in range(SERVING_ROUNDS):
        started_s = time.process_time()
        columns = collect_entries(entries, 0, 0, rows, SERVING_BYTES_MAX, native=native)
        arrow_stream(columns.record_batch(f"persistent://public/default/{TOPIC}-partition-0", 0))
        best_s = min(best_s, time.process_time() - started_s)
    return best_s / rows * 1e6


def serving_rows() -> list[Row]:
    entries = backlog_entries(READ_CHUNK_MESSAGES_DEFAULT)
    python_us = serving_us_per_row(entries, native=False)
    rows = [Row("broker serving cost, pure-Python columns (reference)", f"{python_us:.3f} µs/row", "-",
                f"in process: collect + record batch + IPC stream of one {READ_CHUNK_MESSAGES_DEFAULT:,}-row chunk, "
                f"best of {SERVING_ROUNDS}")]
    if NATIVE_COLUMNS:
        native_us = serving_us_per_row(entries, native=True)
        rows.append(Row("broker serving cost, native columns (broker/entry_format/_range_columns.c)",
                        f"{native_us:.3f} µs/row",
                        f"{python_us / native_us:.0f}x less than pure Python", "the same chunk; what the broker uses"))
    return rows


def result_rows(anchor: QueryRun, measured: QueryRun, produce_s: float, plan: Plan) -> list[Row]:
    ratio = measured.rows_per_s / anchor.rows_per_s
    return [
        Row("in-memory Python streaming source → noop (API ceiling)", f"{anchor.rows_per_s:,.0f} rows/s",
            "1.00x (ceiling)", f"{anchor.rows:,} rows in {anchor.wall_s:.2f} s, {anchor.batches} micro-batch(es); "
            f"pre-built Arrow batches of {ANCHOR_BATCH_ROWS:,} rows"),
        Row("Magnetar source → noop", f"{measured.rows_per_s:,.0f} rows/s",
            f"{ratio:.2f}x of the ceiling (target >= {TARGET_RATIO}x)",
            f"{measured.rows:,} pre-produced messages in {measured.wall_s:.2f} s, {measured.batches} micro-batch(es); "
            f"broker CPU {measured.broker_cpu_s:.2f} s ({measured.broker_cpu_s / measured.rows * 1e6:.2f} µs/row), "
            f"{'native' if NATIVE_COLUMNS else 'pure-Python'} range-read columns; "
            f"backlog produced over REST in {produce_s:.1f} s"),
        *serving_rows(),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_PLAN.rows:,} rows instead of "
                                                             f"{NORMAL_PLAN.rows:,}")
    parser.add_argument("--out", type=Path, help="write the result table into this markdown file (a section)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_ROOT, help="where scratch data goes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK_PLAN if args.quick else NORMAL_PLAN
    with scratch_dir(args.work_dir, "spark-bench-") as work_dir, running(start_broker(work_dir)) as broker:
        url = base_url(broker)
        produce_backlog(url, f"{TOPIC}-warmup", WARMUP_ROWS)
        produce_s = produce_backlog(url, TOPIC, plan.rows)
        spark = spark_session()
        try:
            anchor, measured = measure(spark, url, broker, plan, work_dir)
        finally:
            spark.stop()
        machine = machine_summary(work_dir)
    table = render_table(result_rows(anchor, measured, produce_s, plan))
    report(SECTION_HEADING, machine, CONFIG_NOTE, table, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
