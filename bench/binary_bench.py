"""Binary-protocol benchmark: the official ``pulsar-client`` against Magnetar and pulsar-lite.

Role: acceptance 5 of the binary front end. Both brokers run as child processes on 127.0.0.1
in the same run: ``magnetar standalone --pulsar-port`` and pulsar-lite (PyPI ``pulsar-lite``,
a broker written in Rust that speaks Pulsar's binary protocol; its executable ships in the
wheel). The same Python client (``pulsar-client``, over Pulsar's C++ library) drives both with
the same payloads and bounds, one broker at a time, interleaved by measure:

- publish with batching (the client's defaults: up to 1000 messages or 10 ms per batch) and
  without it, ``send_async`` with at most ``window`` messages pending, for a fixed duration;
  a message counts once its receipt arrived. Magnetar sends a receipt once the entry is
  fsync'd; pulsar-lite does not sync its RocksDB writes before answering (traced with strace:
  10 ``fsync``/``fdatasync`` calls in a whole run that acknowledged 500 synchronous sends), so
  its receipts are not durable;
- consume: a new subscription from the earliest position reads every message published with
  batching, acknowledging each (the client groups acknowledgements);
- latency at 2,000 msg/s: unbatched probes sent on a paced schedule, received by a consumer in
  another thread; each probe carries its send time on the monotonic clock.

Every figure notes the CPU the broker process spent per message and the share of the machine
other processes used (the machine is shared). Targets (from the issue): batched publish and
consume >= 1.0x pulsar-lite, unbatched publish >= 0.3x, Magnetar's p50 latency <= 1 ms.

Invariants: every loop is bounded by a duration, a count and a deadline; both brokers are
stopped by their PIDs. ``--out bench/RESULTS.md`` writes the table into its own section (a
full run only). ``--measures`` and ``--brokers`` pick a subset for an A/B while working (e.g.
``--measures unbatched,latency --brokers magnetar``); ``PYTHONPATH`` picks another checkout of
the broker for the Magnetar child, as in ``profile_broker.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pulsar
from common import DEFAULT_WORK_ROOT, Row, machine_summary, render_table, report, scratch_dir
from e2e_support import (
    CpuSpent,
    Latency,
    LatencyRecorder,
    ServerProcess,
    Throughput,
    free_port,
    load_note,
    measured_cpu,
    paced_due_s,
    percentile_label,
    probe_payload,
    running,
    seconds_until,
    started,
)
from magnetar_e2e import wait_for_health

SECTION_HEADING = "## Binary protocol (bench/binary_bench.py)"
PAYLOAD_BYTES = 100
LATENCY_TARGET_US = 1000.0
RECEIVE_TIMEOUT_MS = 1000
OPERATION_TIMEOUT_S = 30
TARGETS = {"publish batched": 1.0, "publish unbatched": 0.3, "consume": 1.0}
ANCHOR = "pulsar-lite"
BROKERS = (ANCHOR, "magnetar")


@dataclass(frozen=True)
class BinaryPlan:
    publish_duration_s: float
    messages_max: int
    """Upper bound on messages per publish phase (the duration normally ends it first)."""
    window_messages: int
    """The producer's ``max_pending_messages``: room for several batches of 1000 in flight (with
    the client's default of 1000, one batch at a time makes a publish a round-trip measure)."""
    consume_deadline_s: float
    latency_rate_per_s: int
    latency_messages: int
    slow_latency_rate_per_s: int
    """A second, lower rate, measured after the target's: where the latency floor lies when a
    broker keeps up (on a loaded machine it may not keep up at the target's rate)."""
    latency_warmup_messages: int
    drain_timeout_s: float


NORMAL_PLAN = BinaryPlan(publish_duration_s=5.0, messages_max=2_000_000, window_messages=10_000,
                         consume_deadline_s=60.0, latency_rate_per_s=2000, latency_messages=20_000,
                         slow_latency_rate_per_s=500, latency_warmup_messages=1000, drain_timeout_s=30.0)
QUICK_PLAN = BinaryPlan(publish_duration_s=1.0, messages_max=200_000, window_messages=10_000,
                        consume_deadline_s=20.0, latency_rate_per_s=2000, latency_messages=2000,
                        slow_latency_rate_per_s=500, latency_warmup_messages=200, drain_timeout_s=10.0)


@dataclass
class Broker:
    name: str
    server: ServerProcess
    service_url: str


# --- the brokers ----------------------------------------------------------------------------


def start_magnetar(work_dir: Path) -> ServerProcess:
    executable = Path(sys.executable).parent / "magnetar"
    http_port, binary_port = free_port(), free_port()
    argv = [str(executable), "standalone", "--data-dir", str(work_dir / "magnetar"), "--host", "127.0.0.1",
            "--port", str(http_port), "--pulsar-port", str(binary_port), "--log-level", "warning"]
    server = ServerProcess("magnetar", argv, http_port, work_dir / "magnetar.log")

    def ready(s: ServerProcess) -> None:
        wait_for_health(s)
        s.port = binary_port
        s.wait_for_port()

    return started(server, ready)


def pulsar_lite_executable() -> Path:
    import pulsar_lite
    return Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"


def start_pulsar_lite(work_dir: Path) -> ServerProcess:
    port = free_port()
    data = work_dir / "pulsar-lite"
    data.mkdir()
    argv = [str(pulsar_lite_executable()), "--addr", f"127.0.0.1:{port}", "--db-path", str(data / "broker.db"),
            "--log-level", "error"]
    return started(ServerProcess("pulsar-lite", argv, port, work_dir / "pulsar-lite.log", cwd=data),
                   lambda s: s.wait_for_port())


@contextmanager
def connected(broker: Broker) -> Iterator[pulsar.Client]:
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        yield client
    finally:
        client.close()


# --- the measures ---------------------------------------------------------------------------


class Counter:
    """Receipts counted from the client's callback threads."""

    def __init__(self) -> None:
        self.ok = self.failed = 0
        self._lock = threading.Lock()

    def __call__(self, result: pulsar.Result, _message_id: pulsar.MessageId) -> None:
        with self._lock:
            if result == pulsar.Result.Ok:
                self.ok += 1
            else:
                self.failed += 1


def publish(broker: Broker, topic: str, *, batching: bool, plan: BinaryPlan) -> Throughput:
    payload = os.urandom(PAYLOAD_BYTES)
    receipts = Counter()
    cpu: list[CpuSpent] = []
    with connected(broker) as client:
        producer = client.create_producer(topic, batching_enabled=batching, max_pending_messages=plan.window_messages,
                                          block_if_queue_full=True, send_timeout_millis=OPERATION_TIMEOUT_S * 1000)
        sent = 0
        with measured_cpu(broker.server, cpu):
            started_s = time.perf_counter()
            while time.perf_counter() - started_s < plan.publish_duration_s and sent < plan.messages_max:
                producer.send_async(payload, receipts)
                sent += 1
            producer.flush()
            duration_s = time.perf_counter() - started_s
        producer.close()
    if receipts.failed or receipts.ok != sent:
        raise RuntimeError(f"{broker.name}: {receipts.ok} of {sent} sends acknowledged, {receipts.failed} failed")
    mode = "batching (client defaults: 1000 messages or 10 ms)" if batching else "no batching"
    return Throughput(receipts.ok, PAYLOAD_BYTES, duration_s, cpu[0],
                      f"{receipts.ok:,} messages in {duration_s:.1f} s; send_async, {mode}, "
                      f"at most {plan.window_messages} pending")


def consume(broker: Broker, topic: str, expected: int, plan: BinaryPlan) -> Throughput:
    cpu: list[CpuSpent] = []
    received = 0
    with connected(broker) as client:
        consumer = client.subscribe(topic, "bench-consume", initial_position=pulsar.InitialPosition.Earliest,
                                    receiver_queue_size=1000)
        with measured_cpu(broker.server, cpu):
            started_s = time.perf_counter()
            deadline_s = started_s + plan.consume_deadline_s
            while received < expected and time.perf_counter() < deadline_s:
                try:
                    message = consumer.receive(RECEIVE_TIMEOUT_MS)
                except pulsar.Timeout:
                    continue
                if len(message.data()) != PAYLOAD_BYTES:
                    raise RuntimeError(f"{broker.name}: a message of {len(message.data())} bytes")
                consumer.acknowledge(message)
                received += 1
            duration_s = time.perf_counter() - started_s
        consumer.close()
    ended = "" if received == expected else f" (deadline: {received:,} of {expected:,})"
    return Throughput(received, PAYLOAD_BYTES, duration_s, cpu[0],
                      f"{received:,} messages in {duration_s:.1f} s{ended}; new subscription from earliest, "
                      "receiver queue 1000, acknowledge per message")


def latency(broker: Broker, topic: str, plan: BinaryPlan) -> Latency:
    recorder = LatencyRecorder(plan.latency_warmup_messages)
    total = plan.latency_messages + plan.latency_warmup_messages
    cpu: list[CpuSpent] = []
    with connected(broker) as client:
        consumer = client.subscribe(topic, "bench-latency", receiver_queue_size=1000)
        producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=plan.window_messages,
                                          block_if_queue_full=True)
        receipts = Counter()
        stop = threading.Event()

        def receive_loop() -> None:
            while recorder.received < total and not stop.is_set():
                try:
                    message = consumer.receive(RECEIVE_TIMEOUT_MS)
                except pulsar.Timeout:
                    continue
                recorder.record(message.data(), time.perf_counter_ns())
                consumer.acknowledge(message)

        receiver = threading.Thread(target=receive_loop, name="latency-receiver")
        with measured_cpu(broker.server, cpu):
            receiver.start()
            started_s = time.perf_counter()
            for index in range(total):
                time.sleep(seconds_until(paced_due_s(started_s, index, plan.latency_rate_per_s)))
                producer.send_async(probe_payload(index, PAYLOAD_BYTES), receipts)
            send_duration_s = time.perf_counter() - started_s
            producer.flush()
            receiver.join(plan.drain_timeout_s)
            stop.set()
            receiver.join()
        producer.close()
        consumer.close()
    return Latency(recorder.latencies_us, total, recorder.received, send_duration_s, cpu[0],
                   f"{recorder.received:,} of {total:,} received, first {plan.latency_warmup_messages:,} excluded; "
                   f"unbatched send_async on a paced schedule, consumer thread acknowledging each")


# --- the run ------------------------------------------------------------------------------


def throughput_row(measure: str, broker: Broker, result: Throughput, anchor: Throughput | None, *,
                   anchored: bool = True) -> Row:
    value = f"{result.messages_per_s:,.0f} msg/s, {result.mb_per_s:.1f} MB/s"
    if not anchored:
        ratio = "- (pulsar-lite not run)"
    elif anchor is None:
        ratio = "1.00x (anchor)"
    else:
        factor = result.messages_per_s / max(anchor.messages_per_s, 1e-9)
        target = TARGETS[measure]
        ratio = f"{factor:.2f}x pulsar-lite (target >= {target}x: {'met' if factor >= target else 'missed'})"
    return Row(f"{broker.name} {measure} {PAYLOAD_BYTES} B", value, ratio, f"{result.detail}; {result.cpu_note()}")


def latency_row(broker: Broker, result: Latency, judged: bool) -> Row:
    p50 = result.percentile_us(0.5)
    ratio = "-" if not judged else f"p50 {p50 / LATENCY_TARGET_US:.2f}x of 1 ms (target <= 1.0x: " \
        f"{'met' if p50 <= LATENCY_TARGET_US else 'missed'})"
    server_share = result.cpu.server_s / max(result.cpu.wall_s, 1e-9)
    server_us_per_message = result.cpu.server_s / max(result.received, 1) * 1e6
    return Row(f"{broker.name} latency at {result.sent_per_s:,.0f} msg/s", percentile_label(result), ratio,
               f"{result.detail}; max {max(result.latencies_us, default=float('nan')):,.0f} µs; "
               f"the broker used {server_share:.0%} of a core, {server_us_per_message:,.0f} µs of CPU per message "
               f"(to compare with the unbatched publish's CPU per message); {load_note(result.cpu)}")


MEASURES = ("batched", "unbatched", "consume", "latency")
"""What ``--measures`` may pick (all by default); ``consume`` reads what ``batched`` wrote."""


def throughput_rows(measure: str, brokers: list[Broker], results: dict[str, Throughput]) -> list[Row]:
    """Rows of one throughput measure; the anchor's ratio only when pulsar-lite ran too."""
    anchor = next((b for b in brokers if b.name == ANCHOR), None)
    rows = []
    for broker in brokers:
        if broker is anchor:
            rows.append(throughput_row(measure, broker, results[broker.name], None))
        else:
            anchor_result = results[anchor.name] if anchor is not None else None
            rows.append(throughput_row(measure, broker, results[broker.name], anchor_result,
                                       anchored=anchor is not None))
    return rows


def run(brokers: list[Broker], plan: BinaryPlan, measures: tuple[str, ...] = MEASURES) -> list[Row]:
    rows: list[Row] = []
    batched: dict[str, Throughput] = {}
    for measure, batching in (("publish batched", True), ("publish unbatched", False)):
        if measure.split()[1] not in measures:
            continue
        results = {b.name: publish(b, f"bench-{measure.split()[1]}", batching=batching, plan=plan) for b in brokers}
        if batching:
            batched = results
        rows += throughput_rows(measure, brokers, results)
    if "consume" in measures:
        if not batched:
            raise SystemExit("--measures consume needs batched: it reads what the batched publish wrote")
        consumed = {b.name: consume(b, "bench-batched", batched[b.name].messages, plan) for b in brokers}
        rows += throughput_rows("consume", brokers, consumed)
    if "latency" in measures:
        slow = dataclasses.replace(plan, latency_rate_per_s=plan.slow_latency_rate_per_s,
                                   latency_messages=plan.latency_messages // 4)
        for rate_plan, topic in ((plan, "bench-latency"), (slow, "bench-latency-slow")):
            for broker in brokers:
                judged = broker.name == "magnetar" and rate_plan is plan
                rows.append(latency_row(broker, latency(broker, topic, rate_plan), judged))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short smoke run (about 20 s)")
    parser.add_argument("--measures", default=",".join(MEASURES),
                        help=f"comma-separated subset of {','.join(MEASURES)} (default: all)")
    parser.add_argument("--brokers", default=",".join(BROKERS),
                        help=f"comma-separated subset of {','.join(BROKERS)} (default: both)")
    parser.add_argument("--out", type=Path, help="write the table into this markdown file's binary-protocol section")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_ROOT,
                        help="where both brokers keep their data (a scratch directory is made inside)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK_PLAN if args.quick else NORMAL_PLAN
    measures = tuple(m for m in args.measures.split(",") if m)
    chosen = tuple(b for b in args.brokers.split(",") if b)
    if not set(measures) <= set(MEASURES) or not set(chosen) <= set(BROKERS) or not chosen:
        raise SystemExit(f"--measures takes {','.join(MEASURES)}, --brokers {','.join(BROKERS)}")
    if args.out is not None and (measures != MEASURES or len(chosen) != len(BROKERS)):
        raise SystemExit("--out writes the full table only: run every measure on both brokers")
    versions = {name: importlib.metadata.version(name) for name in ("pulsar-client", "pulsar-lite")}
    with scratch_dir(args.work_dir, "binary-bench-") as work_dir, ExitStack() as stack:
        starters: list[tuple[str, Callable[[Path], ServerProcess]]] = [
            ("pulsar-lite", start_pulsar_lite), ("magnetar", start_magnetar)]
        brokers = []
        for name, start in starters:
            if name not in chosen:
                continue
            server = stack.enter_context(running(start(work_dir)))
            brokers.append(Broker(name, server, f"pulsar://127.0.0.1:{server.port}"))
        rows = run(brokers, plan, measures)
        machine = machine_summary(work_dir)
    config = (f"payload {PAYLOAD_BYTES} B; publish {plan.publish_duration_s:.0f} s per case, at most "
              f"{plan.window_messages} pending; consume up to {plan.consume_deadline_s:.0f} s; latency "
              f"{plan.latency_messages:,} probes at {plan.latency_rate_per_s:,} msg/s (then a quarter as many at "
              f"{plan.slow_latency_rate_per_s} msg/s); both brokers up, measured "
              f"one at a time and interleaved by measure; client pulsar-client {versions['pulsar-client']} in the "
              f"bench process; anchor pulsar-lite {versions['pulsar-lite']} (its executable, --log-level error); "
              "`magnetar standalone` defaults, --log-level warning; MB = 10^6 bytes of payload")
    report(SECTION_HEADING, machine, config, render_table(rows), args.out, show_config=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
