"""``make demo``: the broker, the clickstream producer and the Spark job, end to end on this machine.

Steps, each with a deadline: start ``magnetar standalone`` on 127.0.0.1 and a free port with a
fresh data directory and wait for ``/healthz``; send ``--clicks`` clicks with the producer (as
fast as the broker takes them; event time advances 100 ms per click); run the Spark job with
``--available-now`` and ``--max-offsets-per-trigger`` (so the watermark advances between
micro-batches and the stragglers arrive after their windows closed); it prints the windowed
counts. Then reconcile: clicks sent against clicks counted in the Parquet output, and the window
results read back from the topic ``clickstream-page-counts`` with the Python client.

Invariants: the broker is stopped by its PID whatever happens (``consumers/launcher.py``: SIGTERM,
then SIGKILL after a bound); a child that overruns its deadline is killed and the demo fails; the work
directory is a new temporary one, removed at the end, unless ``--work-dir`` names one to keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq

from consumers.client import Client
from consumers.launcher import running_standalone, stop_process

REPO_ROOT = Path(__file__).resolve().parents[1]
CLICKS_DEFAULT = 2000
ROWS_PER_TRIGGER_DEFAULT = 200
START_MS = 1_767_225_600_000
"""Event time of the first click (2026-01-01 00:00:00 UTC): a fixed clock makes runs comparable."""
PRODUCER_TIMEOUT_S = 120.0
SPARK_TIMEOUT_S = 300.0
RESULTS_TOPIC = "clickstream-page-counts"
RESULTS_READ_MAX = 10_000
RESULTS_SHOWN = 3
READ_TIMEOUT_MS = 5000


@contextmanager
def running_broker(data_dir: Path, log_path: Path) -> Iterator[str]:
    """``magnetar standalone`` on 127.0.0.1 and a free port; stopped by PID on the way out."""
    with log_path.open("wb") as log, running_standalone(data_dir, cwd=REPO_ROOT, output=log) as (url, proc):
        print(f"[demo] broker pid {proc.pid} at {url}, data in {data_dir}", flush=True)
        try:
            yield url
        finally:
            code = stop_process(proc)
            print(f"[demo] broker pid {proc.pid} stopped (exit code {code})", flush=True)


def run_step(name: str, command: list[str], timeout_s: float) -> str:
    """Run one demo step, echoing its output; its stdout. Fails past the deadline or on non-zero."""
    print(f"[demo] {name}: {' '.join(command[1:])}", flush=True)
    started_s = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"{name} did not finish within {timeout_s:.0f} s") from None
    print(out, end="", flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed with exit code {proc.returncode}")
    print(f"[demo] {name} took {time.monotonic() - started_s:.1f} s", flush=True)
    return out


def producer_summary(output: str) -> dict[str, object]:
    """The producer's last ``summary: {...}`` line."""
    lines = [line for line in output.splitlines() if line.startswith("summary: ")]
    if not lines:
        raise RuntimeError("the producer printed no summary line")
    summary: dict[str, object] = json.loads(lines[-1].removeprefix("summary: "))
    return summary


def read_results(url: str) -> list[dict[str, object]]:
    """Every window result in the results topic, read with the Python client's reader."""
    results: list[dict[str, object]] = []
    with Client(url) as client, client.create_reader(RESULTS_TOPIC, "earliest") as reader:
        while len(results) < RESULTS_READ_MAX and reader.has_message_available():
            results.append(json.loads(reader.read_next(timeout_ms=READ_TIMEOUT_MS).data))
    return results


def reconcile(summary: dict[str, object], parquet_dir: Path, results: list[dict[str, object]]) -> None:
    counted = sum(pq.read_table(parquet_dir).column("clicks").to_pylist()) if parquet_dir.exists() else 0
    from_topic = sum(int(str(r["clicks"])) for r in results)
    print(f"[demo] sent {summary['clicks']} clicks ({summary['late']} late but within the watermark, "
          f"{summary['stragglers']} stragglers) and one end marker")
    print(f"[demo] counted {counted} clicks in closed windows (Parquet) and {from_topic} in "
          f"{len(results)} window results on topic {RESULTS_TOPIC}; "
          f"{int(str(summary['clicks'])) - counted} clicks arrived after their window had closed")
    for result in results[:RESULTS_SHOWN]:
        print(f"[demo]   {RESULTS_TOPIC}: {json.dumps(result)}")
    if counted != from_topic:
        raise RuntimeError(f"the Parquet output ({counted}) and the results topic ({from_topic}) disagree")


def run(work_dir: Path, clicks: int, rows_per_trigger: int) -> None:
    started_s = time.monotonic()
    output_dir, checkpoint_dir = work_dir / "output" / "page-counts", work_dir / "checkpoints"
    with running_broker(work_dir / "data", work_dir / "broker.log") as url:
        produced = run_step("producer", [
            sys.executable, "-m", "demo.clickstream_producer", "--service-url", url, "--count", str(clicks),
            "--rate", "0", "--event-interval-ms", "100", "--start-ms", str(START_MS)], PRODUCER_TIMEOUT_S)
        run_step("spark job", [
            sys.executable, "-m", "demo.spark_job", "--service-url", url, "--available-now",
            "--max-offsets-per-trigger", str(rows_per_trigger), "--output-dir", str(output_dir),
            "--checkpoint-dir", str(checkpoint_dir), "--timeout-s", str(SPARK_TIMEOUT_S)], SPARK_TIMEOUT_S + 60)
        reconcile(producer_summary(produced), output_dir, read_results(url))
    print(f"[demo] done in {time.monotonic() - started_s:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the clickstream demo end to end on this machine.")
    parser.add_argument("--clicks", type=int, default=CLICKS_DEFAULT)
    parser.add_argument("--rows-per-trigger", type=int, default=ROWS_PER_TRIGGER_DEFAULT,
                        help="the Spark job's maxOffsetsPerTrigger")
    parser.add_argument("--work-dir", help="keep data, checkpoints and Parquet output here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.clicks < 1 or args.rows_per_trigger < 1:
        parser.error("--clicks and --rows-per-trigger must be at least 1")
    if args.work_dir and Path(args.work_dir).exists() and any(Path(args.work_dir).iterdir()):
        parser.error(f"--work-dir {args.work_dir} is not empty: the demo starts from nothing")
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="magnetar-demo-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        run(work_dir, args.clicks, args.rows_per_trigger)
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"[demo] failed: {exc}", file=sys.stderr)
        log = work_dir / "broker.log"
        if log.exists():
            print(f"[demo] broker log tail:\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
        return 1
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
