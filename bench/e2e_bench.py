"""End-to-end benchmark: Magnetar beside Redis Streams and NATS JetStream, in one run, over the network.

Role: the anchors for the whole broker are other brokers on the same machine, driven by Python
clients from this process with the same payloads and bounds. Each system runs as its own
server process on 127.0.0.1 (``bench/anchors.py``: a private ``redis-server`` with
``appendfsync always`` and a private ``nats-server -js``; ``bench/magnetar_e2e.py``: ``magnetar
standalone``). All are started first and measured one at a time, each measure on every system
in turn, so that load from other processes on this shared machine drifts over all of them
alike; every row says how much of the machine other processes used meanwhile. Measured:

1. acknowledged publish, msg/s and MB/s at 100 B and 1 KiB: Redis ``XADD`` pipelined, NATS
   ``publish_async`` with a window, Magnetar over REST produce (many messages per request) and
   over the WebSocket producer (a window of frames; without and with ``batchingEnabled``);
2. catch-up read of everything the 100 B publish wrote, msg/s: Redis ``XREAD``, a NATS pull
   consumer, Magnetar's WebSocket reader from earliest and its HTTP range read (Arrow), both
   over the REST-written topic (entries of many messages) and the WebSocket-written one (one
   message per entry);
3. end-to-end latency p50/p99 at a fixed rate: a paced sender and a consumer subscribed before
   it, latency = receive time - send time carried in the payload (one host clock).

Targets: durable publish >= 1.0x Redis Streams, catch-up >= 1.0x NATS JetStream, p99 <= 5 ms.
An anchor that cannot be installed is reported as not measured and the rest still runs. Every
phase is bounded by a duration or count and a deadline; every server is stopped by its PID.
Run from the repository root: ``.venv/bin/python bench/e2e_bench.py [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import subprocess
import sys
import traceback
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anchors
import magnetar_e2e
from common import (
    DEFAULT_WORK_ROOT,
    Row,
    machine_summary,
    render_table,
    report,
    scratch_dir,
)
from e2e_support import (
    DISK_PROBE_RECORD_BYTES,
    NORMAL_PLAN,
    PUBLISH_PAYLOADS_BYTES,
    QUICK_PLAN,
    DiskProbe,
    Latency,
    Plan,
    ServerProcess,
    Throughput,
    load_note,
    percentile_label,
    probe_disk,
    running,
    size_label,
)

SECTION_HEADING = "## End to end (bench/e2e_bench.py)"
TARGET_PUBLISH_VS_REDIS = 1.0
TARGET_CATCH_UP_VS_NATS = 1.0
TARGET_P99_US = 5000.0
CATCH_UP_PAYLOAD_BYTES = 100
SYSTEMS = ("redis", "nats", "magnetar")
VERSION_TIMEOUT_S = 10.0
Outcome = Throughput | Latency | str
"""A measured figure, or why there is none."""


@dataclass
class Results:
    """Every outcome by (system, measure); a string outcome says why it was not measured."""

    outcomes: dict[tuple[str, str], Outcome] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    disk: list[DiskProbe] = field(default_factory=list)
    """The fsync probe before and after the run."""
    failed: bool = False

    def run(self, system: str, measure: str, phase: Callable[[], Outcome]) -> None:
        print(f"{system}: {measure} ...", flush=True)
        try:
            self.outcomes[system, measure] = phase()
        except Exception as exc:
            traceback.print_exc()
            self.outcomes[system, measure] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
            self.failed = True

    def skip(self, system: str, measures: list[str], reason: str) -> None:
        for measure in measures:
            self.outcomes[system, measure] = reason

    def throughput(self, system: str, measure: str) -> Throughput | None:
        outcome = self.outcomes.get((system, measure))
        return outcome if isinstance(outcome, Throughput) else None


def in_event_loop(phase: Callable[..., Coroutine[Any, Any, Outcome]], *args: Any,
                  **kwargs: Any) -> Callable[[], Outcome]:
    """A phase that runs the coroutine function ``phase`` in a fresh event loop when called."""
    return lambda: asyncio.run(phase(*args, **kwargs))


def publish_measure(size: int) -> str:
    return f"publish {size_label(size)}"


# --- the systems --------------------------------------------------------------------------


MAGNETAR_PUBLISHERS = {"REST": "rest", "WebSocket": "ws", "WebSocket batching": "ws-batch"}
"""Publish method label → topic prefix."""
MAGNETAR_READ_BACK = ("REST", "WebSocket")
"""Topics read back by the catch-up phases, by the method that wrote them."""


def measures_of(system: str) -> list[str]:
    if system != "magnetar":
        return [*(publish_measure(s) for s in PUBLISH_PAYLOADS_BYTES), "catch-up", "latency"]
    return [*(f"{label} {publish_measure(s)}" for s in PUBLISH_PAYLOADS_BYTES for label in MAGNETAR_PUBLISHERS),
            *(f"catch-up {how}, {label}-written" for label in MAGNETAR_READ_BACK
              for how in ("WebSocket reader", "HTTP range read")),
            "latency"]


def start_server(system: str, work_dir: Path, results: Results) -> ServerProcess | None:
    """The system's server, started and ready; None (with the reason in ``results``) if it cannot be."""
    try:
        if system == "magnetar":
            return magnetar_e2e.start_magnetar(work_dir)
        executable, how = anchors.ensure_installed(f"{system}-server")
        if executable is None:
            print(f"{system}: NOT MEASURED: {how}", flush=True)
            results.skip(system, measures_of(system), f"not measured: {how}")
            return None
        if system == "redis":
            results.notes.append(f"Redis: {tool_version([executable, '--version'])} ({how}); {anchors.redis_parser()}")
            return anchors.start_redis(executable, work_dir)
        results.notes.append(f"NATS: {tool_version([executable, '--version'])} ({how})")
        return anchors.start_nats(executable, work_dir)
    except Exception as exc:
        traceback.print_exc()
        results.skip(system, measures_of(system), f"not measured: the server did not start: {str(exc)[:200]}")
        results.failed = True
        return None


def nats_stream(size: int) -> anchors.NatsStream:
    return anchors.NatsStream(f"PUBLISH_{size}", f"publish.{size}")


def run_publish(results: Results, servers: dict[str, ServerProcess], plan: Plan, size: int) -> None:
    measure = publish_measure(size)
    if (redis := servers.get("redis")) is not None:
        results.run("redis", measure, partial(anchors.redis_publish, redis, plan, size, f"publish-{size}"))
    if (nats := servers.get("nats")) is not None:
        results.run("nats", measure, in_event_loop(anchors.nats_publish, nats, plan, size, nats_stream(size)))
    if (magnetar := servers.get("magnetar")) is not None:
        for label, prefix in MAGNETAR_PUBLISHERS.items():
            results.run("magnetar", f"{label} {measure}",
                        magnetar_publish_phase(magnetar, plan, size, f"{prefix}-{size}", label))


def magnetar_publish_phase(server: ServerProcess, plan: Plan, size: int, topic: str,
                           label: str) -> Callable[[], Outcome]:
    if label == "REST":
        return in_event_loop(magnetar_e2e.rest_publish, server, plan, size, topic)
    return in_event_loop(magnetar_e2e.ws_publish, server, plan, size, topic, batching=label == "WebSocket batching")


def run_catch_up(results: Results, servers: dict[str, ServerProcess], plan: Plan) -> None:
    measure, size = publish_measure(CATCH_UP_PAYLOAD_BYTES), CATCH_UP_PAYLOAD_BYTES
    if (redis := servers.get("redis")) is not None:
        expected = published(results, "redis", measure)
        results.run("redis", "catch-up", lambda: anchors.redis_catch_up(redis, plan, f"publish-{size}", expected))
    if (nats := servers.get("nats")) is not None:
        expected = published(results, "nats", measure)
        results.run("nats", "catch-up", in_event_loop(anchors.nats_catch_up, nats, plan, nats_stream(size), expected))
    if (magnetar := servers.get("magnetar")) is not None:
        for label in MAGNETAR_READ_BACK:
            topic = f"{MAGNETAR_PUBLISHERS[label]}-{size}"
            expected = published(results, "magnetar", f"{label} {measure}")
            results.run("magnetar", f"catch-up WebSocket reader, {label}-written",
                        in_event_loop(magnetar_e2e.ws_catch_up, magnetar, plan, topic, expected))
            results.run("magnetar", f"catch-up HTTP range read, {label}-written",
                        partial(magnetar_e2e.http_range_read, magnetar, plan, topic, expected))


def run_latency(results: Results, servers: dict[str, ServerProcess], plan: Plan) -> None:
    if (redis := servers.get("redis")) is not None:
        results.run("redis", "latency", in_event_loop(anchors.redis_latency, redis, plan, "latency"))
    if (nats := servers.get("nats")) is not None:
        stream = anchors.NatsStream("LATENCY", "latency")
        results.run("nats", "latency", in_event_loop(anchors.nats_latency, nats, plan, stream))
    if (magnetar := servers.get("magnetar")) is not None:
        results.run("magnetar", "latency", in_event_loop(magnetar_e2e.ws_latency, magnetar, plan, "latency"))


def published(results: Results, system: str, measure: str) -> int:
    result = results.throughput(system, measure)
    return result.messages if result is not None else 0


def tool_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return " ".join(lines[0].split()[:3]) if lines else "version unknown"


def client_versions() -> str:
    names = ("redis", "hiredis", "nats-py", "httpx", "websockets", "uvicorn")
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} absent")
    return ", ".join(found)


# --- report -------------------------------------------------------------------------------


def rate_value(result: Throughput) -> str:
    return f"{result.messages_per_s:,.0f} msg/s, {result.mb_per_s:,.1f} MB/s"


def ratio_text(value: float, anchor: Throughput | None, anchor_name: str, target: float | None) -> str:
    if anchor is None or anchor.messages_per_s <= 0:
        return f"- ({anchor_name} not measured)"
    ratio = value / anchor.messages_per_s
    text = f"{ratio:.2f}x {anchor_name}"
    if target is not None:
        text += f" (target >= {target:.1f}x: {'met' if ratio >= target else 'missed'})"
    return text


def throughput_row(measure: str, outcome: Outcome | None, anchor: Throughput | None, anchor_name: str,
                   target: float | None) -> Row:
    if not isinstance(outcome, Throughput):
        return Row(measure, "-", "-", outcome if isinstance(outcome, str) else "not run")
    anchored = anchor is outcome
    ratio = "1.00x (anchor)" if anchored else ratio_text(outcome.messages_per_s, anchor, anchor_name, target)
    note = f"{outcome.messages:,} messages in {outcome.duration_s:.1f} s; {outcome.detail}; {outcome.cpu_note()}"
    return Row(measure, rate_value(outcome), ratio, note)


def publish_rows(results: Results) -> list[Row]:
    rows = []
    for size in PUBLISH_PAYLOADS_BYTES:
        measure = publish_measure(size)
        redis = results.throughput("redis", measure)
        rows.append(throughput_row(f"Redis Streams {measure}", results.outcomes.get(("redis", measure)),
                                   redis, "Redis", None))
        rows.append(throughput_row(f"NATS JetStream {measure}", results.outcomes.get(("nats", measure)),
                                   redis, "Redis", None))
        for label in MAGNETAR_PUBLISHERS:
            key = ("magnetar", f"{label} {measure}")
            rows.append(throughput_row(f"Magnetar {label} {measure}", results.outcomes.get(key), redis, "Redis",
                                       TARGET_PUBLISH_VS_REDIS))
    return rows


def catch_up_rows(results: Results) -> list[Row]:
    nats = results.throughput("nats", "catch-up")
    rows = [throughput_row("NATS JetStream catch-up 100 B", results.outcomes.get(("nats", "catch-up")), nats,
                           "NATS", None),
            throughput_row("Redis Streams catch-up 100 B", results.outcomes.get(("redis", "catch-up")), nats,
                           "NATS", None)]
    for (system, measure), outcome in results.outcomes.items():
        if system == "magnetar" and measure.startswith("catch-up"):
            rows.append(throughput_row(f"Magnetar {measure} 100 B", outcome, nats, "NATS", TARGET_CATCH_UP_VS_NATS))
    return rows


def latency_rows(results: Results, plan: Plan) -> list[Row]:
    rows = []
    for system, name in (("redis", "Redis Streams"), ("nats", "NATS JetStream"), ("magnetar", "Magnetar")):
        outcome = results.outcomes.get((system, "latency"))
        measure = f"{name} latency at {plan.latency_rate_per_s:,} msg/s"
        if not isinstance(outcome, Latency):
            rows.append(Row(measure, "-", "-", outcome if isinstance(outcome, str) else "not run"))
            continue
        p99_us = outcome.percentile_us(0.99)
        verdict = "met" if p99_us <= TARGET_P99_US else "missed"
        ratio = f"p99 {p99_us / TARGET_P99_US:.2f}x of 5 ms (target <= 1.0x: {verdict})"
        note = (f"{outcome.received:,} of {outcome.sent:,} received, first {plan.latency_warmup_messages:,} "
                f"excluded; sent at {outcome.sent_per_s:,.0f} msg/s; max {outcome.percentile_us(1.0):,.0f} µs; "
                f"{outcome.detail}; the server used {outcome.cpu.server_s / outcome.cpu.wall_s:.0%} of a core; "
                f"{load_note(outcome.cpu)}")
        rows.append(Row(measure, percentile_label(outcome), ratio, note))
    return rows


def disk_row(results: Results) -> Row:
    before, after = results.disk[0], results.disk[-1]
    return Row(f"disk: append {DISK_PROBE_RECORD_BYTES} B + fdatasync",
               f"p50 {before.percentile_us(0.5):,.0f} µs, p99 {before.percentile_us(0.99):,.0f} µs", "-",
               f"{before.ops_per_s:,.0f} ops/s before the run; after it: p50 {after.percentile_us(0.5):,.0f} µs, "
               f"p99 {after.percentile_us(0.99):,.0f} µs, {after.ops_per_s:,.0f} ops/s; the floor under every "
               f"durable acknowledgement (Redis appendfsync always, Magnetar's journal; NATS does not fsync)")


def config_note(plan: Plan, results: Results) -> str:
    notes = "; ".join(results.notes)
    return (f"publish {plan.publish_duration_s:.0f} s per case, window {plan.publish_window_messages}, REST "
            f"{plan.rest_messages_per_request} msg/request x {plan.rest_requests_in_flight} connections; catch-up "
            f"<= {plan.catch_up_duration_s_max:.0f} s; latency {plan.latency_messages:,} probes of "
            f"{plan.latency_payload_bytes} B at {plan.latency_rate_per_s:,} msg/s; all servers up, measured one at a "
            f"time and interleaved by measure; clients in the bench process; `magnetar standalone` defaults "
            f"(`BrokerConfig()`), --log-level warning; {notes}; clients: {client_versions()}; "
            f"MB = 10^6 bytes of payload")


# --- main -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short smoke run (about 40 s)")
    parser.add_argument("--out", type=Path, help="write the table into this markdown file's end-to-end section")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_ROOT,
                        help="scratch directory for the servers' data (removed afterwards)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    return args


def run_all(systems: list[str], plan: Plan, work_dir: Path) -> Results:
    """Start every server, then run each measure on every system in turn, so that load from
    outside drifts over all of them alike; the idle servers cost next to nothing meanwhile."""
    results = Results()
    print("disk fsync probe ...", flush=True)
    results.disk.append(probe_disk(work_dir, plan.disk_probe_duration_s))
    with ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        for system in (s for s in SYSTEMS if s in systems):
            server = start_server(system, work_dir, results)
            if server is not None:
                servers[system] = stack.enter_context(running(server))
        for size in PUBLISH_PAYLOADS_BYTES:
            run_publish(results, servers, plan, size)
        run_catch_up(results, servers, plan)
        run_latency(results, servers, plan)
        for system, server in servers.items():
            if server.process.poll() is not None:
                results.notes.append(f"{system} exited during the run (code {server.process.returncode})")
                results.failed = True
    print("disk fsync probe ...", flush=True)
    results.disk.append(probe_disk(work_dir, plan.disk_probe_duration_s))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK_PLAN if args.quick else NORMAL_PLAN
    with scratch_dir(args.work_dir, "e2e-bench-") as work_dir:
        results = run_all(args.systems.split(","), plan, work_dir)
        machine = machine_summary(work_dir)
    rows = [disk_row(results), *publish_rows(results), *catch_up_rows(results), *latency_rows(results, plan)]
    table = render_table(rows)
    config = config_note(plan, results)
    report(SECTION_HEADING, machine, config, table, args.out, show_config=True)
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
