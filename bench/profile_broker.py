"""Profile a running broker under one load: py-spy samples ``magnetar standalone`` while a client
drives it, then the hottest functions are printed by own time and by time including callees.

Usage (from the repository root)::

    .venv/bin/python bench/profile_broker.py --load ws-publish --seconds 20
    .venv/bin/python bench/profile_broker.py --load ws-batching --out /tmp/ws.txt

Loads: ``ws-publish`` (one message per WebSocket frame), ``ws-batching`` (``batchingEnabled``),
``rest-publish`` (1000 messages per request), ``ws-read`` (a WebSocket reader catching up on
what the load wrote first), ``latency`` (the latency measure's paced producer and acking
consumer, for ``--seconds`` at its rate), and through Pulsar's binary protocol with the official
client (``binary_bench.py``'s measures): ``bin-unbatched`` and ``bin-batched`` (publish),
``bin-consume`` (a new subscription reading what a batched publish wrote first) and
``bin-latency`` (paced unbatched probes at 2,000 msg/s). The collapsed stacks (py-spy's ``raw``
format, one line per stack with its sample count) are kept with ``--out``, for a flame graph or a diff of two runs.
The broker runs from this interpreter's environment (``PYTHONPATH`` picks another checkout).

``--threads`` measures instead of sampling: the CPU time each of the broker's threads spent in
the load (user and system, from ``/proc/<pid>/task``), divided by the messages the load moved,
with the threads named as Python names them (from ``py-spy dump``; a pool thread started and
gone during the load keeps its number). This shows where a message's CPU goes between the event
loop, the journal, the flusher and the pools, which sampling does not (it counts waiting threads).

``--stalls`` records how the event loop was held over the load, from the broker's own figures
(``/admin/v2/broker-stats/overview`` read before and after; see ``api/loop_stalls.py``): the loop
stall histogram's samples in the load by bucket with percentiles, the longest stalls with when
they happened, the garbage collector's collections and time by generation, and the journal's
fsync latency histogram over the same interval, so a stall can be put beside what ran::

    .venv/bin/python bench/profile_broker.py --load bin-latency --seconds 10 --stalls
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import binary_bench
import httpx
import magnetar_e2e
from e2e_support import NORMAL_PLAN, Plan, ServerProcess, percentile_label, running

SAMPLE_RATE_HZ = 250
TOP_FUNCTIONS = 30
LOADS = ("ws-publish", "ws-batching", "rest-publish", "ws-read", "latency", "bin-unbatched", "bin-batched",
         "bin-consume", "bin-latency")
BINARY_LOADS = frozenset(load for load in LOADS if load.startswith("bin-"))


def py_spy() -> str:
    candidate = Path(sys.executable).parent / "py-spy"
    if candidate.exists():
        return str(candidate)
    raise SystemExit("py-spy is not installed: pip install py-spy (it is in the dev extras)")


async def drive(load: str, server: ServerProcess, plan: Plan) -> int:
    """Run ``load``; the messages it moved."""
    if load == "ws-publish":
        return (await magnetar_e2e.ws_publish(server, plan, 100, "profile", batching=False)).messages
    if load == "ws-batching":
        return (await magnetar_e2e.ws_publish(server, plan, 100, "profile", batching=True)).messages
    if load == "rest-publish":
        return (await magnetar_e2e.rest_publish(server, plan, 100, "profile")).messages
    if load == "latency":  # the latency measure's load: paced producer, consumer acking each message
        return (await magnetar_e2e.ws_latency(server, plan, "profile-latency")).received
    raise ValueError(load)


def binary_plan(seconds: float) -> binary_bench.BinaryPlan:
    plan = binary_bench.NORMAL_PLAN
    rate = plan.latency_rate_per_s
    return dataclasses.replace(plan, publish_duration_s=seconds + 2.0, latency_messages=int((seconds + 2.0) * rate),
                               latency_warmup_messages=0)


def drive_binary(load: str, broker: binary_bench.Broker, plan: binary_bench.BinaryPlan, written: int) -> int:
    """Run ``load``; the messages it moved."""
    if load == "bin-unbatched":
        return binary_bench.publish(broker, "profile-unbatched", batching=False, plan=plan).messages
    if load == "bin-batched":
        return binary_bench.publish(broker, "profile-batched", batching=True, plan=plan).messages
    if load == "bin-consume":
        return binary_bench.consume(broker, "profile-batched", written, plan).messages
    if load == "bin-latency":
        return binary_bench.latency(broker, "profile-latency", plan).received
    raise ValueError(load)


def thread_cpu_s(pid: int) -> dict[str, tuple[float, float]]:
    """Each thread of ``pid`` (by thread id): user and system CPU seconds so far."""
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    found: dict[str, tuple[float, float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
        found[tid] = (int(fields[11]) * tick_s, int(fields[12]) * tick_s)
    return found


def thread_names(pid: int) -> dict[str, str]:
    """Thread id -> the name Python gave the thread, from ``py-spy dump``."""
    dump = subprocess.run([py_spy(), "dump", "--pid", str(pid)], check=False, capture_output=True, text=True,
                          timeout=60).stdout
    names = {}
    for line in dump.splitlines():
        if line.startswith("Thread ") and '"' in line:
            tid = line.split()[1]
            names[tid] = line.split('"')[1]
    return names


def thread_table(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
                 names: dict[str, str], messages: int) -> str:
    rows = []
    for tid, (user_s, system_s) in after.items():
        was_user_s, was_system_s = before.get(tid, (0.0, 0.0))
        spent = (user_s - was_user_s, system_s - was_system_s)
        if sum(spent) > 0:
            rows.append((sum(spent), names.get(tid, f"thread {tid}"), spent))
    lines = [f"{messages:,} messages; broker CPU per message by thread (user + system µs):"]
    for total_s, name, (user_s, system_s) in sorted(rows, reverse=True):
        lines.append(f"  {name:32s} {total_s / messages * 1e6:7.1f}  ({user_s / messages * 1e6:.1f} + "
                     f"{system_s / messages * 1e6:.1f})")
    lines.append(f"  {'all threads':32s} {sum(r[0] for r in rows) / messages * 1e6:7.1f}")
    return "\n".join(lines)


def http_url(server: ServerProcess) -> str:
    """The broker's HTTP address (a binary broker's ``port`` is its Pulsar port)."""
    argv = [str(arg) for arg in server.process.args]  # type: ignore[union-attr]
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"


def broker_overview(server: ServerProcess) -> dict[str, Any]:
    response = httpx.get(f"{http_url(server)}/admin/v2/broker-stats/overview", timeout=30)
    response.raise_for_status()
    overview: dict[str, Any] = response.json()
    return overview


def bucket_delta(before: Sequence[Sequence[int]], after: Sequence[Sequence[int]], total: int) -> list[tuple[str, int]]:
    """Per-bucket (not cumulative) observations between two cumulative snapshots; ``total`` for +Inf."""
    rows, below = [], 0
    for (bound_us, was), (_, now) in zip(before, after, strict=True):
        cumulative = now - was
        rows.append((f"<= {bound_us / 1000:g} ms", cumulative - below))
        below = cumulative
    rows.append((f"> {after[-1][0] / 1000:g} ms", total - below))
    return rows


def quantile_bucket(rows: list[tuple[str, int]], q: float) -> str:
    """The bucket that holds the ``q`` quantile of per-bucket ``rows``."""
    total = sum(n for _, n in rows)
    running = 0
    for label, n in rows:
        running += n
        if total and running >= q * total:
            return label
    return "none"


def histogram_lines(title: str, before: Sequence[Sequence[int]], after: Sequence[Sequence[int]],
                    total: int) -> list[str]:
    rows = bucket_delta(before, after, total)
    lines = [f"{title}: {total:,} samples; p50 {quantile_bucket(rows, 0.5)}, p99 {quantile_bucket(rows, 0.99)}"
             f", p99.9 {quantile_bucket(rows, 0.999)}"]
    lines += [f"  {label:>14s} {n:8,}" for label, n in rows if n]
    return lines


def stall_report(before: dict[str, Any], after: dict[str, Any], started_ms: float) -> str:
    """The event loop's stalls, the gc's collections and the journal's fsyncs between two overviews."""
    loop_was, loop = before["eventLoop"], after["eventLoop"]
    lines = histogram_lines("event loop stalls (heartbeat lateness)", loop_was["stallBucketsUs"],
                            loop["stallBucketsUs"], loop["samples"] - loop_was["samples"])
    longest = [s for s in loop["longestStalls"] if _epoch_ms(s["at"]) >= started_ms]
    lines.append(f"longest stalls in the load (latest {len(longest)} of >= 5 ms):")
    lines += [f"  {s['at']}  {s['us'] / 1000:8.2f} ms late; of the {s['windowUs'] / 1000:.2f} ms since the beat "
              f"before, the loop's thread ran {s['loopCpuUs'] / 1000:.2f} ms, the process "
              f"{s['processCpuUs'] / 1000:.2f} ms; the loop blocked {s['loopWaits']} times, was preempted "
              f"{s['loopPreemptions']}" for s in sorted(longest, key=lambda s: -s["us"])]
    lines.append("garbage collections in the load:")
    for was, now in zip(loop_was["gcPauses"], loop["gcPauses"], strict=True):
        lines.append(f"  generation {now['generation']}: {now['collections'] - was['collections']:6,} collections, "
                     f"{(now['totalUs'] - was['totalUs']) / 1000:8.2f} ms in all")
    storage_was, storage = before.get("storage"), after.get("storage")
    if storage_was and storage:
        journal_was, journal = storage_was["journal"], storage["journal"]
        lines += histogram_lines("journal fsyncs", journal_was["fsyncLatencyBucketsUs"],
                                 journal["fsyncLatencyBucketsUs"], journal["fsyncs"] - journal_was["fsyncs"])
        lines += histogram_lines("write-cache flushes", storage_was["flushLatencyBucketsUs"],
                                 storage["flushLatencyBucketsUs"], storage["flushes"] - storage_was["flushes"])
        on_loop = journal["groupsOnCallerThread"] - journal_was["groupsOnCallerThread"]
        lines.append(f"journal groups written on the event loop: {on_loop:,} of "
                     f"{journal['groupsCommitted'] - journal_was['groupsCommitted']:,}")
    return "\n".join(lines)


def _epoch_ms(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000


def summarize(collapsed: Path, top: int) -> str:
    """Own and inclusive sample shares of the hottest functions, from py-spy's raw output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame for frame in stack.split(";") if frame and not frame.startswith("process ")
                  and not frame.startswith("thread ")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{total} samples"]
    for title, counter in (("own time", own), ("including callees", inclusive)):
        lines.append(f"\n-- {title} --")
        lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in counter.most_common(top)]
    return "\n".join(lines)


def _run_load(load: str, server: ServerProcess, broker: binary_bench.Broker, plan: Plan, seconds: float,
              written: int) -> int:
    if load in BINARY_LOADS:
        return drive_binary(load, broker, binary_plan(seconds), written)
    if load == "ws-read":
        reader_plan = Plan(**{**NORMAL_PLAN.__dict__, "catch_up_duration_s_max": seconds})
        return asyncio.run(magnetar_e2e.ws_catch_up(server, reader_plan, "profile", 10**9)).messages
    return asyncio.run(drive(load, server, plan))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", choices=LOADS, default="ws-publish")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", type=Path, help="keep the collapsed stacks here")
    parser.add_argument("--top", type=int, default=TOP_FUNCTIONS)
    parser.add_argument("--threads", action="store_true",
                        help="CPU per message of each broker thread (from /proc) instead of py-spy samples")
    parser.add_argument("--stalls", action="store_true",
                        help="the event loop's stalls, gc collections and fsyncs over the load, from the broker's "
                             "figures, instead of py-spy samples")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="magnetar-profile-") as scratch:
        work_dir = Path(scratch)
        collapsed = args.out or work_dir / "stacks.txt"
        binary = args.load in BINARY_LOADS
        start = binary_bench.start_magnetar if binary else magnetar_e2e.start_magnetar
        with running(start(work_dir)) as server:
            broker = binary_bench.Broker("magnetar", server, f"pulsar://127.0.0.1:{server.port}")
            written = 0
            if args.load == "bin-consume":  # what the consumer reads, written before sampling starts
                written = binary_bench.publish(broker, "profile-batched", batching=True,
                                               plan=binary_plan(args.seconds)).messages
            plan = Plan(**{**NORMAL_PLAN.__dict__, "publish_duration_s": args.seconds + 2.0,
                           "latency_messages": int((args.seconds + 2.0) * NORMAL_PLAN.latency_rate_per_s)})
            load = args.load
            if load == "ws-read":
                asyncio.run(magnetar_e2e.ws_publish(server, plan, 100, "profile", batching=True))
            if args.stalls:
                overview_before, started_ms = broker_overview(server), time.time() * 1000
                if load == "bin-latency":  # the client's figures beside the broker's
                    result = binary_bench.latency(broker, "profile-latency", binary_plan(args.seconds))
                    print(f"{result.received:,} probes: {percentile_label(result)}, "
                          f"max {result.percentile_us(1.0):,.0f} µs")
                else:
                    messages = _run_load(load, server, broker, plan, args.seconds, written)
                    print(f"{messages:,} messages moved by {load}")
                print(stall_report(overview_before, broker_overview(server), started_ms))
                return 0
            if args.threads:
                before = thread_cpu_s(server.pid)
                messages = _run_load(load, server, broker, plan, args.seconds, written)
                print(thread_table(before, thread_cpu_s(server.pid), thread_names(server.pid), max(messages, 1)))
                return 0
            recorder = subprocess.Popen([py_spy(), "record", "--pid", str(server.pid), "--rate",
                                         str(SAMPLE_RATE_HZ), "--duration", str(int(args.seconds)), "--format",
                                         "raw", "--output", str(collapsed), "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)
            _run_load(load, server, broker, plan, args.seconds, written)
            _, errors = recorder.communicate(timeout=args.seconds + 60)
            if recorder.returncode != 0:
                print(errors.decode(errors="replace"), file=sys.stderr)
                return 1
        print(summarize(collapsed, args.top))
        if args.out is None:
            os.remove(collapsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
