"""Cluster benchmark: publish and catch-up through remote bookies beside the embedded bookie, in one run.

Role: the anchor for ``magnetar broker`` over ``magnetar bookie`` processes is ``magnetar
standalone`` on the same machine, driven by the same clients (``bench/magnetar_e2e.py``). The
cluster is one ZooKeeper (Debian's package), three bookies and one broker whose ledgers use
E=3, Qw=2, Qa=2, so every entry is written to two bookies and acknowledged by both. Both
systems are started first and measured one measure at a time, embedded then cluster, so drift
on this shared 2-core machine falls on both alike. Measured:

1. acknowledged publish, 100 B messages: WebSocket producer without batching (one entry per
   message: the per-entry cost shows), with ``batchingEnabled``, and REST produce (1000
   messages per request, one entry);
2. catch-up of the WebSocket-written topic (one message per entry): HTTP range read (Arrow)
   and WebSocket reader, after the broker's entry cache has aged out, so entries come from
   the bookies.

With ``--serving`` (and after the measures above when run whole) a second broker joins the same
cluster and ``bench/serving_bench.py`` compares aggregate publish over 20 topics with two brokers
against one, in the same run, on the same bookies (its own section).

Reported per measure: msg/s and the cluster/embedded ratio; the broker's CPU per message (the
serving process: standalone holds the storage too, the cluster broker does not), the bookies'
CPU per message summed; network round trips per entry (bookie requests counted by the cluster
broker's ``/metrics``, divided by the entries its topic holds). Target: cluster publish >= 0.5x
embedded. Every process is stopped by its PID. Run from the repository root:
``.venv/bin/python bench/cluster_bench.py [--quick] [--serving] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import magnetar_e2e
import serving_bench
from common import DEFAULT_WORK_ROOT, Row, machine_summary, render_table, report, scratch_dir
from e2e_support import NORMAL_PLAN, QUICK_PLAN, Plan, ServerProcess, Throughput, free_port, process_cpu_s, started

SECTION_HEADING = "## Cluster (bench/cluster_bench.py)"
SERVING_HEADING = "## Cluster serving: two brokers against one (bench/cluster_bench.py --serving)"
TARGET_PUBLISH_RATIO = 0.5
PAYLOAD_BYTES = 100
CACHE_AGE_WAIT_S = 2.5
ZOOKEEPER_CLASSPATH = "/usr/share/java/zookeeper.jar"
BOOKIES = 3
QUORUM = ("3", "2", "2")
SYSTEMS = ("embedded", "cluster")
PUBLISHERS = {"WebSocket": "ws", "WebSocket batching": "ws-batch", "REST": "rest"}
REQUESTS_METRIC = re.compile(r'^magnetar_bookie_requests_total\{bookie="[^"]*"\} ([0-9.e+]+)$', re.MULTILINE)


@dataclass
class System:
    name: str
    broker: ServerProcess
    helpers: list[ServerProcess] = field(default_factory=list)
    """The cluster's bookies (and ZooKeeper, last): their CPU is reported apart."""
    store: str = ""
    """The cluster's metadata store (``zk:...``), for brokers that join later."""

    def helpers_cpu_s(self) -> float:
        return sum(process_cpu_s(p.pid) for p in self.helpers[:BOOKIES])

    def bookie_requests(self) -> float:
        text = httpx.get(f"{magnetar_e2e.http_base(self.broker)}/metrics", timeout=30).text
        return sum(float(v) for v in REQUESTS_METRIC.findall(text))

    def entries(self, topic: str) -> int:
        stats = httpx.get(f"{magnetar_e2e.http_base(self.broker)}/admin/v2/persistent/public/default/{topic}"
                          "/internalStats", timeout=30).json()
        return int(stats["numberOfEntries"])


@dataclass(frozen=True)
class Measured:
    throughput: Throughput
    bookies_cpu_s: float
    round_trips_per_entry: float | None


# --- starting the systems ------------------------------------------------------------------------


def start_cluster(work_dir: Path, stack: ExitStack) -> System:
    zk_port = free_port()
    zk_dir = work_dir / "zookeeper"
    zk_dir.mkdir(parents=True)
    work_dir.mkdir(exist_ok=True)
    (zk_dir / "zoo.cfg").write_text(f"tickTime=500\ndataDir={zk_dir}\nclientPort={zk_port}\n"
                                    "clientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxClientCnxns=0\n")
    zookeeper = ServerProcess("zookeeper", ["java", "-Xmx256m", "-Djute.maxbuffer=33554432", "-cp", ZOOKEEPER_CLASSPATH,
                                            "org.apache.zookeeper.server.ZooKeeperServerMain", str(zk_dir / "zoo.cfg")],
                              zk_port, work_dir / "zookeeper.log")
    stack.callback(zookeeper.stop)
    zookeeper.wait_for_port()
    store = f"zk:127.0.0.1:{zk_port}/bench"
    magnetar = str(Path(sys.executable).parent / "magnetar")
    bookies = []
    for index in range(BOOKIES):
        port = free_port()
        data = work_dir / f"bookie-{index}"
        bookie = ServerProcess(f"bookie-{index}", [magnetar, "bookie", "--data-dir", str(data / "ledgers"),
                                                   "--journal-dir", str(data / "journal"), "--host", "127.0.0.1",
                                                   "--port", str(port), "--metadata-store", store],
                               port, work_dir / f"bookie-{index}.log")
        stack.callback(bookie.stop)
        bookie.wait_for_port()
        bookies.append(bookie)
    broker = start_broker(work_dir, stack, store, "broker")
    return System("cluster", broker, [*bookies, zookeeper], store)


def start_broker(work_dir: Path, stack: ExitStack, store: str, name: str) -> ServerProcess:
    magnetar = str(Path(sys.executable).parent / "magnetar")
    port = free_port()
    broker = started(ServerProcess(name, [magnetar, "broker", "--metadata-store", store, "--host", "127.0.0.1",
                                          "--port", str(port), "--pulsar-port", str(free_port()),
                                          "--log-level", "warning",
                                          "--data-dir", str(work_dir / name),
                                          "--ensemble-size", QUORUM[0], "--write-quorum", QUORUM[1],
                                          "--ack-quorum", QUORUM[2]], port, work_dir / f"{name}.log"),
                     magnetar_e2e.wait_for_health)
    stack.callback(broker.stop)
    return broker


def start_embedded(work_dir: Path, stack: ExitStack) -> System:
    work_dir.mkdir(parents=True)
    server = magnetar_e2e.start_magnetar(work_dir)
    stack.callback(server.stop)
    return System("embedded", server)


# --- measures ------------------------------------------------------------------------------------


def measured(system: System, topic: str, phase: Callable[[], Throughput]) -> Measured:
    requests_before, helpers_before = system.bookie_requests(), system.helpers_cpu_s()
    throughput = phase()
    requests = system.bookie_requests() - requests_before
    entries = system.entries(topic)
    trips = requests / entries if system.helpers and entries else None
    return Measured(throughput, system.helpers_cpu_s() - helpers_before, trips)


def publish_phase(system: System, plan: Plan, label: str) -> Callable[[], Throughput]:
    topic = f"{PUBLISHERS[label]}-{PAYLOAD_BYTES}"
    if label == "REST":
        return lambda: asyncio.run(magnetar_e2e.rest_publish(system.broker, plan, PAYLOAD_BYTES, topic))
    return lambda: asyncio.run(magnetar_e2e.ws_publish(system.broker, plan, PAYLOAD_BYTES, topic,
                                                       batching=label == "WebSocket batching"))


def catch_up_phase(system: System, plan: Plan, how: str, expected: int) -> Callable[[], Throughput]:
    topic = f"ws-{PAYLOAD_BYTES}"

    def phase() -> Throughput:
        time.sleep(CACHE_AGE_WAIT_S)  # the broker's entry cache ages out: reads go to the bookies
        if how == "HTTP range read":
            return magnetar_e2e.http_range_read(system.broker, plan, topic, expected)
        return asyncio.run(magnetar_e2e.ws_catch_up(system.broker, plan, topic, expected))

    return phase


def run_all(systems: dict[str, System], plan: Plan) -> dict[tuple[str, str], Measured | str]:
    results: dict[tuple[str, str], Measured | str] = {}

    def run(system: System, measure: str, topic: str, phase: Callable[[], Throughput]) -> None:
        print(f"{system.name}: {measure} ...", flush=True)
        try:
            results[system.name, measure] = measured(system, topic, phase)
        except Exception as exc:
            traceback.print_exc()
            results[system.name, measure] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"

    for label, prefix in PUBLISHERS.items():
        for name in SYSTEMS:
            system = systems[name]
            run(system, f"publish {label}", f"{prefix}-{PAYLOAD_BYTES}", publish_phase(system, plan, label))
    for how in ("HTTP range read", "WebSocket reader"):
        for name in SYSTEMS:
            written = results.get((name, "publish WebSocket"))
            expected = written.throughput.messages if isinstance(written, Measured) else 0
            run(systems[name], f"catch-up {how}", f"ws-{PAYLOAD_BYTES}", catch_up_phase(systems[name], plan, how,
                                                                                        expected))
    return results


# --- report --------------------------------------------------------------------------------------


def rows_of(results: dict[tuple[str, str], Measured | str]) -> list[Row]:
    rows: list[Row] = []
    measures = [m for (s, m) in results if s == "embedded"]
    for measure in measures:
        base, cluster = results.get(("embedded", measure)), results.get(("cluster", measure))
        for name, outcome in (("embedded", base), ("cluster", cluster)):
            if not isinstance(outcome, Measured):
                rows.append(Row(f"{measure}, {name}", str(outcome), "", ""))
                continue
            t = outcome.throughput
            per_message = max(t.messages, 1)
            ratio = ""
            if name == "cluster" and isinstance(base, Measured):
                ratio = f"{t.messages_per_s / max(base.throughput.messages_per_s, 1e-9):.2f}x"
                if measure.startswith("publish"):
                    met = t.messages_per_s >= TARGET_PUBLISH_RATIO * base.throughput.messages_per_s
                    ratio += " (target >= 0.5x: " + ("met" if met else "NOT met") + ")"
            note = (f"broker CPU {t.cpu.server_s / per_message * 1e6:,.1f} µs/msg")
            if name == "cluster":
                note += f", bookies CPU {outcome.bookies_cpu_s / per_message * 1e6:,.1f} µs/msg"
                if outcome.round_trips_per_entry is not None:
                    note += f", {outcome.round_trips_per_entry:.2f} bookie round trips per entry"
            note += f"; {t.detail}; other processes used {t.cpu.other_share:.0%} of the machine"
            rows.append(Row(f"{measure}, {name}", f"{t.messages_per_s:,.0f} msg/s", ratio, note))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (a smoke run)")
    parser.add_argument("--out", type=Path, help="write the section into this markdown file")
    parser.add_argument("--work-root", type=Path, default=DEFAULT_WORK_ROOT)
    parser.add_argument("--serving", action="store_true", help="only two brokers against one (bench/serving_bench.py)")
    args = parser.parse_args(argv)
    plan = QUICK_PLAN if args.quick else NORMAL_PLAN
    if not Path(ZOOKEEPER_CLASSPATH).exists():
        print("the cluster benchmark needs ZooKeeper: apt-get install zookeeper", file=sys.stderr)
        return 2
    results: dict[tuple[str, str], Measured | str] = {}
    with scratch_dir(args.work_root, "cluster-bench-") as work_dir, ExitStack() as stack:
        cluster = start_cluster(work_dir / "cluster", stack)
        if not args.serving:
            systems = {"embedded": start_embedded(work_dir / "embedded", stack), "cluster": cluster}
            results = run_all(systems, plan)
        second = start_broker(work_dir / "cluster", stack, cluster.store, "broker-2")
        serving = serving_bench.run_serving([cluster.broker, second], cluster.helpers[:BOOKIES], cluster.helpers[-1],
                                            plan)
        machine = machine_summary(work_dir)
    if not args.serving:
        config = (f"{PAYLOAD_BYTES} B payloads; cluster: ZooKeeper + {BOOKIES} bookies + 1 broker on 127.0.0.1, "
                  f"E={QUORUM[0]} Qw={QUORUM[1]} Qa={QUORUM[2]}; embedded: magnetar standalone (E=Qw=Qa=1); "
                  f"publish phases {plan.publish_duration_s:.0f} s, WebSocket window {plan.publish_window_messages}")
        report(SECTION_HEADING, machine, config, render_table(rows_of(results)), args.out)
    config = (f"{serving_bench.PAYLOAD_BYTES} B payloads, {serving_bench.TOPICS} topics, one WebSocket producer per "
              f"topic on its owner, window {serving_bench.WINDOW}, one entry per message; ZooKeeper + {BOOKIES} "
              f"bookies (E={QUORUM[0]} Qw={QUORUM[1]} Qa={QUORUM[2]}) + 2 brokers on 127.0.0.1; 'one broker': a "
              f"namespace of 1 bundle, 'two brokers': {serving_bench.BUNDLES_SPREAD} bundles spread by the first "
              f"lookups; {serving_bench.ROUNDS} alternating rounds of {plan.publish_duration_s:.0f} s; 'paced': "
              f"{serving_bench.PACED_RATE_PER_TOPIC} msg/s offered per topic, 'half the topics': "
              f"{serving_bench.TOPICS // 2} topics on one broker, the load each of two brokers carries")
    report(SERVING_HEADING, machine, config, render_table(serving_bench.serving_rows(serving)), args.out)
    return 1 if any(isinstance(v, str) for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

