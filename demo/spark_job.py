"""The clickstream demo's Spark job: clicks per page per event-time window, into Magnetar and Parquet.

Role: read the topic ``clickstream`` with the Magnetar source (from the earliest offset), parse
each message's JSON value, put a watermark ``--watermark-s`` behind the latest event time seen,
count clicks per page per ``--window-s`` tumbling window, and write each window's final count
(append mode: a window is written once, when the watermark passes its end) twice:

- to the topic ``clickstream-page-counts`` through the Magnetar sink: key = page, value = JSON
  ``{"page", "windowStartMs", "windowEndMs", "clicks"}``, event time = the window's end;
- to Parquet files under ``--output-dir`` (columns ``windowStart, windowEnd, page, clicks``).

Each output is its own streaming query with its own checkpoint under ``--checkpoint-dir``
(``magnetar/``, ``parquet/``), and a restart resumes each from its own. The Parquet sink is
exactly-once; the Magnetar sink stores a replayed micro-batch's rows once as long as Spark hands
them over in the same order (see ``consumers/spark/sink.py``).
Clicks whose window had already closed when they arrived (later than the watermark allows) are
dropped, as Spark drops late data; malformed messages are skipped.

Modes: ``--available-now`` processes the backlog present at start (``Trigger.AvailableNow``),
stops, and prints every window found in the Parquet output (``make demo`` and the tests);
without it the queries run every ``--trigger-s`` seconds until SIGTERM or Ctrl-C (or
``--run-timeout-s``), and a third query prints each newly closed window (docker-compose).

Invariants: Spark runs under this interpreter (``PYSPARK_PYTHON``); without Java 17+ the job
stops before starting Spark (exit code 2), naming the Debian package to install; a backlog run
ends within ``--timeout-s`` or fails; at most ``PRINT_WINDOWS_MAX`` windows are printed at once.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's usual alias
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from consumers.spark import MagnetarDataSource

JAVA_VERSION_MIN = 17
JAVA_PACKAGE = "openjdk-17-jre-headless"
JAVA_PROBE_TIMEOUT_S = 30
CLICK_SCHEMA = "userId string, page string, action string, eventTimeMs long"
PRINT_WINDOWS_MAX = 60
PAGE_COLUMN_WIDTH_MIN = 5
POLL_INTERVAL_S = 1
"""How often continuous mode checks for a stop signal (Spark takes whole seconds)."""
SPARK_CONFIG = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


# --- Java ---------------------------------------------------------------------------------------


def java_problem() -> str | None:
    """Why Spark cannot start here (no ``java``, or one older than 17), or None when it can."""
    java = shutil.which("java")
    if java is None:
        return f"Spark needs Java {JAVA_VERSION_MIN}+: install it with 'apt-get install {JAVA_PACKAGE}'"
    probe = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=JAVA_PROBE_TIMEOUT_S,
                           check=False)
    major = java_major_version(probe.stderr + probe.stdout)
    if major is None or major < JAVA_VERSION_MIN:
        return (f"Spark needs Java {JAVA_VERSION_MIN}+, found {major or 'an unknown version'} at {java}: "
                f"install '{JAVA_PACKAGE}'")
    return None


def java_major_version(version_text: str) -> int | None:
    """17 for ``openjdk version "17.0.15"``; 8 for the old ``"1.8.0_402"`` form."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', version_text)
    if found is None:
        return None
    first = int(found.group(1))
    return int(found.group(2) or 0) if first == 1 else first


# --- the streaming plan -------------------------------------------------------------------------


def build_session(master: str) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.builder.master(master).appName("magnetar-clickstream-demo")
    for key, value in SPARK_CONFIG.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(MagnetarDataSource)
    return session


def page_counts(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """Clicks per page per tumbling event-time window, final once the watermark passes the end."""
    reader = (spark.readStream.format("magnetar").option("service.url", args.service_url)
              .option("topic", args.topic).option("startingOffsets", "earliest"))
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    clicks = (reader.load()
              .select(F.from_json(F.col("value").cast("string"), CLICK_SCHEMA).alias("click"))
              .where(F.col("click.page").isNotNull() & F.col("click.eventTimeMs").isNotNull())
              .select(F.col("click.page").alias("page"),
                      F.timestamp_millis(F.col("click.eventTimeMs")).alias("eventTime")))
    return (clicks.withWatermark("eventTime", f"{args.watermark_s} seconds")
            .groupBy(F.window("eventTime", f"{args.window_s} seconds"), "page").count()
            .select(F.col("window.start").alias("windowStart"), F.col("window.end").alias("windowEnd"),
                    "page", F.col("count").alias("clicks")))


def as_messages(counts: DataFrame) -> DataFrame:
    """The sink's columns: key = page, value = the window result as JSON, event time = window end."""
    value = F.to_json(F.struct(
        "page", F.unix_millis("windowStart").alias("windowStartMs"),
        F.unix_millis("windowEnd").alias("windowEndMs"), "clicks"))
    return counts.select(F.col("page").alias("key"), value.alias("value"), F.col("windowEnd").alias("eventTime"))


def start_queries(counts: DataFrame, args: argparse.Namespace) -> list[StreamingQuery]:
    checkpoints = Path(args.checkpoint_dir)

    def triggered(writer: DataStreamWriter) -> DataStreamWriter:
        return writer.trigger(availableNow=True) if args.available_now else writer.trigger(
            processingTime=f"{args.trigger_s} seconds")

    to_topic = (as_messages(counts).writeStream.queryName("page_counts_to_magnetar").outputMode("append")
                .format("magnetar").option("service.url", args.service_url).option("topic", args.results_topic)
                .option("checkpointLocation", str(checkpoints / "magnetar")))
    to_parquet = (counts.writeStream.queryName("page_counts_to_parquet").outputMode("append").format("parquet")
                  .option("path", args.output_dir).option("checkpointLocation", str(checkpoints / "parquet")))
    writers = [to_topic, to_parquet]
    if not args.available_now:
        printer = partial(print_batch, window_s=args.window_s)
        writers.append(counts.writeStream.queryName("page_counts_to_console").outputMode("append")
                       .foreachBatch(printer).option("checkpointLocation", str(checkpoints / "console")))
    return [triggered(writer).start() for writer in writers]


# --- printing -----------------------------------------------------------------------------------


def format_windows(rows: Sequence[Row], window_s: int) -> list[str]:
    """Window results as a table: one line per window (oldest first, at most
    ``PRINT_WINDOWS_MAX``), one column per page (busiest first), and a total per window."""
    counts: dict[tuple[datetime, datetime], Counter[str]] = defaultdict(Counter)
    for row in rows:
        counts[(_utc(row["windowStart"]), _utc(row["windowEnd"]))][row["page"]] += row["clicks"]
    per_page: Counter[str] = Counter()
    for by_page in counts.values():
        per_page.update(by_page)
    pages = sorted(per_page, key=lambda page: (-per_page[page], page))
    widths = [max(len(page), PAGE_COLUMN_WIDTH_MIN) for page in pages]
    header = [f"{'window (UTC)':<29}", *(f"{page:>{w}}" for page, w in zip(pages, widths, strict=True)), "  total"]
    lines = [" ".join(header)]
    for start, end in sorted(counts)[:PRINT_WINDOWS_MAX]:
        by_page = counts[(start, end)]
        cells = (f"{by_page[page]:>{w}}" for page, w in zip(pages, widths, strict=True))
        lines.append(" ".join([f"{start:%Y-%m-%d %H:%M:%S}-{end:%H:%M:%S}", *cells, f"{by_page.total():>7}"]))
    if len(counts) > PRINT_WINDOWS_MAX:
        lines.append(f"... and {len(counts) - PRINT_WINDOWS_MAX} more windows")
    lines.append(f"{len(counts)} closed {window_s} s windows, {per_page.total()} clicks")
    return lines


def _utc(stamp: datetime) -> datetime:
    """Spark hands timestamps to Python as naive local times; make them UTC for printing."""
    return stamp.astimezone(UTC)


def print_batch(batch: DataFrame, batch_id: int, *, window_s: int) -> None:
    rows = batch.collect()
    if rows:
        print(f"-- micro-batch {batch_id}: windows closed")
        print("\n".join(format_windows(rows, window_s)), flush=True)


def print_parquet(spark: SparkSession, output_dir: str, window_s: int) -> None:
    if not any(Path(output_dir).glob("*.parquet")):
        print(f"no window has closed yet: {output_dir} holds no Parquet file", flush=True)
        return
    rows = spark.read.parquet(output_dir).collect()
    print(f"Clicks per page per {window_s} s event-time window, from the Parquet output {output_dir}:")
    print("\n".join(format_windows(rows, window_s)), flush=True)


# --- running ------------------------------------------------------------------------------------


def await_backlog(queries: Sequence[StreamingQuery], timeout_s: float) -> None:
    """Wait for available-now queries to finish; stop them all and fail past the deadline."""
    deadline_s = time.monotonic() + timeout_s
    for query in queries:
        if not query.awaitTermination(max(1, int(deadline_s - time.monotonic()))):
            for each in queries:
                each.stop()
            raise TimeoutError(f"query {query.name} did not finish within {timeout_s:.0f} s")
        if query.exception() is not None:
            raise RuntimeError(f"query {query.name} failed: {query.exception()}")
        batches = [p for p in query.recentProgress if p.numInputRows is not None]
        print(f"query {query.name}: {len(batches)} micro-batches, "
              f"{sum(p.numInputRows for p in batches)} messages read", flush=True)


def run_until_stopped(spark: SparkSession, queries: Sequence[StreamingQuery], run_timeout_s: float | None) -> None:
    """Continuous mode: poll until a query fails, SIGTERM/SIGINT arrives, or the optional timeout."""
    stop = threading.Event()
    install_stop_signals(stop.set)
    deadline_s = None if run_timeout_s is None else time.monotonic() + run_timeout_s
    try:
        while not stop.is_set() and (deadline_s is None or time.monotonic() < deadline_s):
            if spark.streams.awaitAnyTermination(POLL_INTERVAL_S):
                failed = [q for q in queries if not q.isActive and q.exception() is not None]
                if failed:
                    raise RuntimeError(f"query {failed[0].name} failed: {failed[0].exception()}")
                break
    finally:
        for query in queries:
            query.stop()


def install_stop_signals(on_stop: Callable[[], None]) -> None:
    def handle(_signum: int, _frame: object) -> None:
        on_stop()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Count clicks per page per event-time window with Spark.")
    parser.add_argument("--service-url", default="http://127.0.0.1:8080",
                        help="broker URL (http://host:port; a cluster: several, comma-separated)")
    parser.add_argument("--topic", default="clickstream")
    parser.add_argument("--results-topic", default="clickstream-page-counts")
    parser.add_argument("--output-dir", default="./demo-output/page-counts", help="Parquet output directory")
    parser.add_argument("--checkpoint-dir", default="./demo-output/checkpoints",
                        help="checkpoints of the queries (one subdirectory each)")
    parser.add_argument("--window-s", type=int, default=10, help="tumbling window length in seconds")
    parser.add_argument("--watermark-s", type=int, default=5, help="how late a click may arrive, in seconds")
    parser.add_argument("--max-offsets-per-trigger", type=int, help="messages per micro-batch at most")
    parser.add_argument("--available-now", action="store_true", help="process the backlog, print, stop")
    parser.add_argument("--trigger-s", type=int, default=5, help="micro-batch interval in continuous mode")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="deadline of an --available-now run")
    parser.add_argument("--run-timeout-s", type=float, help="stop a continuous run after this many seconds")
    parser.add_argument("--master", default="local[2]")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.window_s, args.trigger_s) < 1 or args.watermark_s < 0:
        parser.error("--window-s and --trigger-s must be at least 1, --watermark-s at least 0")
    if args.max_offsets_per_trigger is not None and args.max_offsets_per_trigger < 1:
        parser.error("--max-offsets-per-trigger must be at least 1")
    problem = java_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    spark = build_session(args.master)
    try:
        queries = start_queries(page_counts(spark, args), args)
        if args.available_now:
            await_backlog(queries, args.timeout_s)
            print_parquet(spark, args.output_dir, args.window_s)
        else:
            run_until_stopped(spark, queries, args.run_timeout_s)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
