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
from pathlib import Path

import binary_bench
import magnetar_e2e
from e2e_support import NORMAL_PLAN, Plan, ServerProcess, running

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


async def drive(load: str, server: ServerProcess, plan: Plan) -> None:
    if load == "ws-publish":
        await magnetar_e2e.ws_publish(server, plan, 100, "profile", batching=False)
    elif load == "ws-batching":
        await magnetar_e2e.ws_publish(server, plan, 100, "profile", batching=True)
    elif load == "rest-publish":
        await magnetar_e2e.rest_publish(server, plan, 100, "profile")
    elif load == "latency":  # the latency measure's load: paced producer, consumer acking each message
        await magnetar_e2e.ws_latency(server, plan, "profile-latency")
    else:
        raise ValueError(load)


def binary_plan(seconds: float) -> binary_bench.BinaryPlan:
    plan = binary_bench.NORMAL_PLAN
    rate = plan.latency_rate_per_s
    return dataclasses.replace(plan, publish_duration_s=seconds + 2.0, latency_messages=int((seconds + 2.0) * rate),
                               latency_warmup_messages=0)


def drive_binary(load: str, broker: binary_bench.Broker, plan: binary_bench.BinaryPlan, written: int) -> None:
    if load == "bin-unbatched":
        binary_bench.publish(broker, "profile-unbatched", batching=False, plan=plan)
    elif load == "bin-batched":
        binary_bench.publish(broker, "profile-batched", batching=True, plan=plan)
    elif load == "bin-consume":
        binary_bench.consume(broker, "profile-batched", written, plan)
    elif load == "bin-latency":
        binary_bench.latency(broker, "profile-latency", plan)
    else:
        raise ValueError(load)


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", choices=LOADS, default="ws-publish")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", type=Path, help="keep the collapsed stacks here")
    parser.add_argument("--top", type=int, default=TOP_FUNCTIONS)
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
            recorder = subprocess.Popen([py_spy(), "record", "--pid", str(server.pid), "--rate",
                                         str(SAMPLE_RATE_HZ), "--duration", str(int(args.seconds)), "--format",
                                         "raw", "--output", str(collapsed), "--nonblocking"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)
            if binary:
                drive_binary(load, broker, binary_plan(args.seconds), written)
            elif load == "ws-read":
                reader_plan = Plan(**{**NORMAL_PLAN.__dict__, "catch_up_duration_s_max": args.seconds})
                asyncio.run(magnetar_e2e.ws_catch_up(server, reader_plan, "profile", 10**9))
            else:
                asyncio.run(drive(load, server, plan))
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
