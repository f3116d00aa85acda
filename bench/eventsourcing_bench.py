"""The ``eventsourcing`` library's recorder workloads: Magnetar against the library's PostgreSQL.

Role: one run measures, side by side, the library's ``ApplicationRecorder`` over Magnetar
(``consumers.eventsourcing``, one ``magnetar standalone`` process) and over PostgreSQL (the
library's ``eventsourcing.postgres``, a ``postgres`` server from Debian's ``postgresql`` package
started here on a free port in a temporary directory, as user ``postgres``). Both keep their
defaults for durability: Magnetar's journal syncs every acknowledged append, PostgreSQL commits
with ``fsync`` and ``synchronous_commit`` on. The workloads are the library's own operations:

1. Insert aggregate events: ``insert_events`` of one new aggregate's first event (100 B of
   state), ``--inserts`` times from one thread, then the same from ``--threads`` threads.
2. Select an aggregate's events: ``select_events`` of a 10-event aggregate, ``--selects`` times.
3. Read notifications: ``select_notifications`` in pages of ``--page`` from the first to the
   last, what a projection or a follower does, ``--passes`` times: the first pass (what a
   projection catching up does once, each store's first reads of the rows) and the passes after
   it (each store warm: one pass of some 8,000 notifications lasts 20-50 ms, too short to be
   measured once) are two rows; latency percentiles are of a whole pass.

The targets (issue 36): Magnetar >= 1.0x PostgreSQL on inserts and on reading notifications.
Each workload prints operations per second, latency p50/p99 (ms) and the server's CPU per
operation (µs: the Magnetar process; the postmaster and its backends). The two stores run one
after the other on the same machine, each once, in the same run.

Run from the repository root: ``.venv/bin/python bench/eventsourcing_bench.py [--quick] [--out
bench/RESULTS.md]``. Needs ``postgresql`` (``apt-get install postgresql``) and the ``bench``
Python extra (``psycopg``).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import DEFAULT_WORK_ROOT, Row, machine_summary, render_table, report, scratch_dir
from e2e_support import ServerProcess, free_port, process_cpu_s, running
from eventsourcing.persistence import ApplicationRecorder, InfrastructureFactory, StoredEvent
from eventsourcing.utils import Environment
from magnetar_e2e import start_magnetar

HEADING = "## Event sourcing: the eventsourcing library's recorders, Magnetar vs PostgreSQL"
POSTGRES_BIN = Path("/usr/lib/postgresql")
POSTGRES_USER = "postgres"
DB_USER = "bench"
START_TIMEOUT_S = 60.0
STATE = b"x" * 100
AGGREGATE_EVENTS = 10


@dataclass
class Result:
    ops: int
    elapsed_s: float
    latencies_s: list[float]
    server_cpu_s: float

    @property
    def rate(self) -> float:
        return self.ops / self.elapsed_s

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(int(len(ordered) * q), len(ordered) - 1)] * 1000 if ordered else 0.0

    @property
    def cpu_us_per_op(self) -> float:
        return self.server_cpu_s / self.ops * 1e6


# --- the stores ---------------------------------------------------------------------------------
def postgres_binaries() -> Path:
    versions = sorted(POSTGRES_BIN.glob("*/bin/postgres"))
    if not versions or shutil.which("runuser") is None:
        raise SystemExit("PostgreSQL is not installed: apt-get install postgresql (Debian's package)")
    return versions[-1].parent


@contextmanager
def postgres(work_dir: Path) -> Iterator[tuple[dict[str, str], Callable[[], float]]]:
    """A PostgreSQL server in ``work_dir`` on a free port; the library's environment for it and
    a function giving the CPU seconds of the postmaster and its backends."""
    binaries = postgres_binaries()
    data = work_dir / "pgdata"
    data.mkdir()
    shutil.chown(work_dir, POSTGRES_USER)
    shutil.chown(data, POSTGRES_USER)
    as_postgres = ["runuser", "-u", POSTGRES_USER, "--"]
    subprocess.run([*as_postgres, str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", DB_USER],
                   check=True, capture_output=True)
    port = free_port()
    argv = [*as_postgres, str(binaries / "postgres"), "-D", str(data), "-p", str(port), "-k", str(work_dir),
            "-c", "listen_addresses=127.0.0.1"]
    server = ServerProcess("postgres", argv, port, work_dir / "postgres.log")
    with running(server):
        server.wait_for_port(START_TIMEOUT_S)
        subprocess.run([*as_postgres, str(binaries.parent / "bin" / "createdb"), "-h", "127.0.0.1", "-p", str(port),
                        "-U", DB_USER, "eventsourcing"], check=True, capture_output=True)
        env = {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": "eventsourcing",
               "POSTGRES_HOST": "127.0.0.1", "POSTGRES_PORT": str(port), "POSTGRES_USER": DB_USER,
               "POSTGRES_PASSWORD": "trusted", "POSTGRES_POOL_SIZE": "8", "CREATE_TABLE": "y"}
        yield env, lambda: postgres_cpu_s(server.pid)


def postgres_cpu_s(root_pid: int) -> float:
    """CPU seconds of the process tree under ``root_pid`` (runuser, the postmaster, backends)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry))
    total, pending = 0.0, [root_pid]
    while pending:
        pid = pending.pop()
        total += process_cpu_s(pid)
        pending.extend(children.get(pid, []))
    return total


@contextmanager
def magnetar(work_dir: Path) -> Iterator[tuple[dict[str, str], Callable[[], float]]]:
    server = start_magnetar(work_dir)
    with running(server):
        env = {"PERSISTENCE_MODULE": "consumers.eventsourcing",
               "MAGNETAR_SERVICE_URL": f"http://127.0.0.1:{server.port}"}
        yield env, server.cpu_s


def recorder_of(env: dict[str, str]) -> tuple[InfrastructureFactory[Any], ApplicationRecorder]:
    factory = InfrastructureFactory.construct(Environment("BenchApp", env))
    return factory, factory.application_recorder()


# --- the workloads ------------------------------------------------------------------------------
def new_aggregate_event() -> StoredEvent:
    return StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic="bench:Created", state=STATE)


def measured(cpu_s: Callable[[], float], threads: int, ops_each: int, op: Callable[[], object]) -> Result:
    latencies: list[list[float]] = [[] for _ in range(threads)]

    def worker(index: int) -> None:
        for _ in range(ops_each):
            started = time.perf_counter()
            op()
            latencies[index].append(time.perf_counter() - started)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    gc.collect()  # each measure starts with no collector debt left by what ran before (the other store's run)
    cpu_before, started_s = cpu_s(), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed_s, server_cpu_s = time.perf_counter() - started_s, cpu_s() - cpu_before
    return Result(threads * ops_each, elapsed_s, [x for each in latencies for x in each], server_cpu_s)


def workloads(recorder: ApplicationRecorder, cpu_s: Callable[[], float], args: argparse.Namespace) -> dict[str, Result]:
    results = {}
    recorder.insert_events([new_aggregate_event()])  # warm: connections, tables, topics
    results["insert (1 thread)"] = measured(cpu_s, 1, args.inserts,
                                            lambda: recorder.insert_events([new_aggregate_event()]))
    results[f"insert ({args.threads} threads)"] = measured(
        cpu_s, args.threads, args.inserts // args.threads, lambda: recorder.insert_events([new_aggregate_event()]))
    aggregate = uuid.uuid4()
    recorder.insert_events([StoredEvent(originator_id=aggregate, originator_version=v, topic="bench:Changed",
                                        state=STATE) for v in range(1, AGGREGATE_EVENTS + 1)])
    results[f"select_events ({AGGREGATE_EVENTS} events)"] = measured(
        cpu_s, 1, args.selects, lambda: check_events(recorder.select_events(aggregate)))
    last = recorder.max_notification_id() or 0
    pages = [0]

    def read_all() -> None:
        start: int | None = None
        while True:
            page = recorder.select_notifications(start, args.page)
            pages[0] += 1
            if not page or page[-1].id >= last:
                return
            start = page[-1].id + 1

    first = measured(cpu_s, 1, 1, read_all)
    results[f"select_notifications, first pass (pages of {args.page})"] = Result(
        last, first.elapsed_s, first.latencies_s, first.server_cpu_s)
    if args.passes > 1:
        again = measured(cpu_s, 1, args.passes - 1, read_all)
        results[f"select_notifications, passes 2-{args.passes}"] = Result(
            last * (args.passes - 1), again.elapsed_s, again.latencies_s, again.server_cpu_s)
    return results


def check_events(events: Sequence[StoredEvent]) -> None:
    if len(events) != AGGREGATE_EVENTS:
        raise RuntimeError(f"select_events gave {len(events)} events, not {AGGREGATE_EVENTS}")


def run_store(name: str, store: Any, work_dir: Path, args: argparse.Namespace) -> dict[str, Result]:
    with store(work_dir) as (env, cpu_s):
        factory, recorder = recorder_of(env)
        try:
            results = workloads(recorder, cpu_s, args)
        finally:
            factory.close()
    for workload, result in results.items():
        print(f"{name:10} {workload:40} {result.rate:10.0f}/s  p50 {result.percentile_ms(0.5):7.2f} ms  "
              f"p99 {result.percentile_ms(0.99):7.2f} ms  server CPU {result.cpu_us_per_op:8.0f} µs/op", flush=True)
    return results


def rows(magnetar_results: dict[str, Result], postgres_results: dict[str, Result]) -> list[Row]:
    table = []
    for workload, ours in magnetar_results.items():
        theirs = postgres_results[workload]
        table.append(Row(workload, f"{ours.rate:,.0f}/s vs {theirs.rate:,.0f}/s", f"{ours.rate / theirs.rate:.2f}x",
                         f"p50 {ours.percentile_ms(0.5):.2f} vs {theirs.percentile_ms(0.5):.2f} ms; p99 "
                         f"{ours.percentile_ms(0.99):.2f} vs {theirs.percentile_ms(0.99):.2f} ms; server CPU "
                         f"{ours.cpu_us_per_op:,.0f} vs {theirs.cpu_us_per_op:,.0f} µs/op"))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inserts", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--selects", type=int, default=2000)
    parser.add_argument("--page", type=int, default=500)
    parser.add_argument("--passes", type=int, default=5, help="reads of every notification (latency: of a pass)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the operations")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.inserts, args.selects = args.inserts // 10, args.selects // 10
    postgres_binaries()
    with scratch_dir(DEFAULT_WORK_ROOT, "es-bench-") as work_dir:
        work_dir.chmod(0o711)  # the postgres user reaches its data directory through it
        (work_dir / "pg").mkdir()
        (work_dir / "mg").mkdir()
        ours = run_store("magnetar", magnetar, work_dir / "mg", args)
        theirs = run_store("postgres", postgres, work_dir / "pg", args)
        machine = machine_summary(work_dir)
    config = (f"{args.inserts} inserts of one new aggregate's first event ({len(STATE)} B state) from 1 thread, "
              f"then from {args.threads}; {args.selects} select_events of a {AGGREGATE_EVENTS}-event aggregate; "
              f"every notification read in pages of {args.page}, {args.passes} times; each store's durable defaults; "
              f"ratio = Magnetar / PostgreSQL {postgres_binaries().parent.name} (higher is better for Magnetar)")
    report(HEADING, machine, config, render_table(rows(ours, theirs)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
