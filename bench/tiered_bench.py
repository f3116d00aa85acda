"""Tiered storage: a catch-up read of offloaded ledgers against the same read from local bookies,
and publishing while an offload runs.

Role: one run starts an S3 API server (moto's, ``python -m moto.server``, on a free port with a
bucket made by boto3; the same path a user's S3 or MinIO takes) and one ``magnetar standalone``
whose ``managedLedgerOffloadDriver`` is ``aws-s3`` at that endpoint, its ledgers rolled over every
``--ledger-entries`` entries and their local copies deleted as soon as they are offloaded
(``managedLedgerOffloadDeletionLagMs=0``). Then:

1. ``--size-mb`` of ``--message-kb`` messages are published with the official Pulsar client to
   two topics, ``tiered-local`` and ``tiered-offloaded``; the second is offloaded through the
   admin API (``PUT …/offload`` up to its last message id) until ``GET …/offload`` says
   ``SUCCESS`` and every closed ledger's local copy is deleted (``internalStats``).
2. The broker is restarted (no entry cache, no bookie read cache) and each topic is read from
   earliest by a Pulsar reader, local first, then offloaded, then both again in the other order:
   MB/s and the broker's CPU per MB. The target (issue 37): offloaded >= 0.5x local.
3. ``--rounds`` rounds of publishing for ``--publish-s`` seconds to another topic alone, then while
   one of ``--rounds`` topics of ``--size-mb`` (published in step 1) is offloaded, waiting for
   that offload to end before the next round; and alone once more at the end. Messages per
   second, the mean during the offloads over the mean alone, each round against the windows
   alone either side of it, and the CPU the broker and the S3 server took (the S3 server shares
   this machine's cores with the broker; a real store does not). The target: >= 0.9x alone.
   Rounds, not one window each: two windows alone a minute apart differ by up to 20% here (the
   disk's write-back), more than the effect measured.
   Steps 1 to 3 run the broker's defaults: an offload reads at full speed while nothing is
   published (step 1's offload) and yields to publishing while something is, reading at most
   ``managedLedgerOffloadFlowPermitsPerSecondWhilePublishing`` (8 MB/s) then; these rounds
   offload topics of ``--yielding-mb`` MB.
4. The same with the broker restarted without yielding
   (``managedLedgerOffloadFlowPermitsPerSecondWhilePublishing=-1``, Pulsar's behaviour: every
   offload at full speed), offloading ``--rounds`` topics of ``--size-mb`` published in step 1.
``--while-publishing-mb`` sets the yielding rate of steps 1 to 3 instead of the default.

``--store-nice 19`` runs the S3 server at that nice value, so it takes only the CPU the broker
leaves (closer to a store on other machines). Every read checks each message's size and counts
them all; the offloaded topic must read back exactly as many messages as were published to it.
Run from the repository root:
``.venv/bin/python bench/tiered_bench.py [--quick] [--out bench/RESULTS.md]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx
import pulsar
from common import DEFAULT_WORK_ROOT, Row, machine_summary, render_table, report, scratch_dir
from e2e_support import START_TIMEOUT_S, ServerProcess, free_port, started

from broker.offload.settings import OffloadSettings

HEADING = "## Tiered storage: reading offloaded ledgers, and publishing while an offload runs"
BUCKET = "magnetar-bench-offload"
ACCESS_KEY, SECRET_KEY = "bench-access-key", "bench-secret-key"
NAMESPACE = "persistent/public/default"
LOCAL_TOPIC, OFFLOADED_TOPIC, PUBLISH_TOPIC = "tiered-local", "tiered-offloaded", "tiered-publish"
POLL_S = 0.2
OFFLOAD_TIMEOUT_S = 1800.0
HTTP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ReadResult:
    topic: str
    messages: int
    bytes_read: int
    elapsed_s: float
    broker_cpu_s: float
    store_cpu_s: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes_read / self.elapsed_s / 1e6

    @property
    def cpu_ms_per_mb(self) -> float:
        return self.broker_cpu_s * 1000 / (self.bytes_read / 1e6)

    @property
    def store_cpu_ms_per_mb(self) -> float:
        return self.store_cpu_s * 1000 / (self.bytes_read / 1e6)


# --- the S3 server and the broker ---------------------------------------------------------------
def quiet_client(service_url: str) -> pulsar.Client:
    return pulsar.Client(service_url, operation_timeout_seconds=60,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))


@contextmanager
def running_s3(work_dir: Path, nice: int = 0) -> Iterator[tuple[str, ServerProcess]]:
    port = free_port()
    niced = ["nice", "-n", str(nice)] if nice else []
    server = ServerProcess("moto", [*niced, sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                           port, work_dir / "moto.log")
    started(server, lambda s: s.wait_for_port())
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                     aws_secret_access_key=SECRET_KEY).create_bucket(Bucket=BUCKET)
        yield endpoint, server
    finally:
        server.stop()


def write_config(work_dir: Path, endpoint: str, ledger_entries: int, while_publishing_per_s: int | None = None) -> Path:
    """The broker's offload configuration; ``while_publishing_per_s`` None keeps the default."""
    path = work_dir / "standalone.conf"
    yielding = ([] if while_publishing_per_s is None
                else [f"managedLedgerOffloadFlowPermitsPerSecondWhilePublishing={while_publishing_per_s}"])
    path.write_text("\n".join([
        *yielding,
        "managedLedgerOffloadDriver=aws-s3",
        f"s3ManagedLedgerOffloadBucket={BUCKET}",
        "s3ManagedLedgerOffloadRegion=us-east-1",
        f"s3ManagedLedgerOffloadServiceEndpoint={endpoint}",
        "managedLedgerOffloadDeletionLagMs=0",
        f"managedLedgerMaxEntriesPerLedger={ledger_entries}",
        "managedLedgerMinLedgerRolloverTimeMinutes=0",
        "",
    ]))
    return path


class Broker:
    """``magnetar standalone`` with the offload configuration; restartable on the same data."""

    def __init__(self, work_dir: Path, config: Path) -> None:
        self._work_dir, self._config = work_dir, config
        self.http_port, self.pulsar_port = free_port(), free_port()
        self.server: ServerProcess | None = None
        self._starts = 0

    def start(self) -> None:
        executable = Path(sys.executable).parent / "magnetar"
        argv = [str(executable), "standalone", "--config", str(self._config), "--data-dir",
                str(self._work_dir / "data"), "--host", "127.0.0.1", "--port", str(self.http_port),
                "--pulsar-port", str(self.pulsar_port), "--log-level", "warning"]
        self._starts += 1
        server = ServerProcess("magnetar", argv, self.http_port, self._work_dir / f"magnetar-{self._starts}.log")
        self.server = started(server, _wait_healthy)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def cpu_s(self) -> float:
        assert self.server is not None
        return self.server.cpu_s()

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.pulsar_port}"


def _wait_healthy(server: ServerProcess) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            if httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"magnetar was not healthy within {START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


# --- the workloads ------------------------------------------------------------------------------
def publish(service_url: str, topic: str, count: int, payload: bytes) -> None:
    client = quiet_client(service_url)
    try:
        producer = client.create_producer(f"persistent://public/default/{topic}", batching_enabled=False,
                                          max_pending_messages=256, block_if_queue_full=True,
                                          send_timeout_millis=0)
        for _ in range(count):
            producer.send_async(payload, None)
        producer.flush()
        producer.close()
    finally:
        client.close()


@dataclass(frozen=True)
class PublishRate:
    messages_per_s: float
    broker_cores: float
    store_cores: float
    """CPU the broker and the S3 server took while publishing (cores)."""


def publish_for(broker: Broker, store: ServerProcess, topic: str, duration_s: float, payload: bytes) -> PublishRate:
    """Messages per second acknowledged while publishing for ``duration_s``."""
    client = quiet_client(broker.service_url)
    acked = [0]

    def done(result: Any, _message_id: Any) -> None:
        if result == pulsar.Result.Ok:
            acked[0] += 1

    try:
        producer = client.create_producer(f"persistent://public/default/{topic}", batching_enabled=False,
                                          max_pending_messages=256, block_if_queue_full=True,
                                          send_timeout_millis=0)
        broker_s, store_s, started_s = broker.cpu_s(), store.cpu_s(), time.perf_counter()
        while time.perf_counter() - started_s < duration_s:
            producer.send_async(payload, done)
        producer.flush()
        elapsed_s = time.perf_counter() - started_s
        rate = PublishRate(acked[0] / elapsed_s, (broker.cpu_s() - broker_s) / elapsed_s,
                           (store.cpu_s() - store_s) / elapsed_s)
        producer.close()
        return rate
    finally:
        client.close()


@dataclass(frozen=True)
class PublishRound:
    """Publishing alone, then while one topic is offloaded."""

    alone: PublishRate
    during: PublishRate
    still_running: bool
    """Whether the offload was still running when the publishing during it ended."""


@dataclass(frozen=True)
class PublishDuringOffloads:
    rounds: list[PublishRound]
    last_alone: PublishRate
    """Publishing alone once the last offload ended."""

    @property
    def alone(self) -> list[PublishRate]:
        return [r.alone for r in self.rounds] + [self.last_alone]

    @property
    def during(self) -> list[PublishRate]:
        return [r.during for r in self.rounds]

    @property
    def ratio(self) -> float:
        """Mean rate during the offloads over the mean rate alone (the windows alone bracket
        every window during one, so a drift over the run weighs on both sides alike)."""
        return _mean_rate(self.during) / _mean_rate(self.alone)

    def round_ratios(self) -> list[float]:
        """Each window during an offload against the mean of the windows alone either side of it."""
        alone = self.alone
        return [r.during.messages_per_s / ((alone[i].messages_per_s + alone[i + 1].messages_per_s) / 2)
                for i, r in enumerate(self.rounds)]


def _mean_rate(rates: list[PublishRate]) -> float:
    return sum(r.messages_per_s for r in rates) / len(rates)


def _mean_cores(rates: list[PublishRate], of: str) -> float:
    return float(sum(getattr(r, of) for r in rates)) / len(rates)


def publish_during_offloads(broker: Broker, store: ServerProcess, topics: list[str], duration_s: float,
                            payload: bytes) -> PublishDuringOffloads:
    """Rounds of publishing alone and then while one of ``topics`` is offloaded (waiting for
    that offload to end before the next round), and alone once more at the end. One window
    alone against one during is not enough: on this machine two windows alone a minute apart
    differ by up to 20% (the disk's write-back), more than the effect measured."""
    rounds = []
    for topic in topics:
        alone = publish_for(broker, store, PUBLISH_TOPIC, duration_s, payload)
        offload_in_background(broker, topic)
        during = publish_for(broker, store, PUBLISH_TOPIC, duration_s, payload)
        rounds.append(PublishRound(alone, during, offload_running(broker, topic)))
        deadline = time.monotonic() + OFFLOAD_TIMEOUT_S
        while offload_running(broker, topic):
            if time.monotonic() > deadline:
                raise RuntimeError(f"offload of {topic} did not finish within {OFFLOAD_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)
    return PublishDuringOffloads(rounds, publish_for(broker, store, PUBLISH_TOPIC, duration_s, payload))


def read_all(broker: Broker, store: ServerProcess, topic: str, expected: int, message_bytes: int) -> ReadResult:
    client = quiet_client(broker.service_url)
    try:
        reader = client.create_reader(f"persistent://public/default/{topic}", pulsar.MessageId.earliest,
                                      receiver_queue_size=1000)
        cpu_before, store_before, started_s = broker.cpu_s(), store.cpu_s(), time.perf_counter()
        count = size = 0
        while count < expected:
            data = reader.read_next(timeout_millis=60_000).data()
            if len(data) != message_bytes:
                raise RuntimeError(f"{topic}: message {count} has {len(data)} bytes, not {message_bytes}")
            count += 1
            size += len(data)
        elapsed_s, cpu_s = time.perf_counter() - started_s, broker.cpu_s() - cpu_before
        reader.close()
        return ReadResult(topic, count, size, elapsed_s, cpu_s, store.cpu_s() - store_before)
    finally:
        client.close()


def admin(broker: Broker) -> httpx.Client:
    return httpx.Client(base_url=broker.http_url, timeout=HTTP_TIMEOUT_S, follow_redirects=True)


def offload_everything(broker: Broker, topic: str) -> float:
    """Offload ``topic`` up to its last message; wait for SUCCESS and for every offloaded ledger's
    local copy to be gone. Returns the seconds the offload took."""
    path = f"/admin/v2/{NAMESPACE}/{topic}"
    with admin(broker) as client:
        last = client.get(f"{path}/lastMessageId").raise_for_status().json()
        started_s = time.perf_counter()
        client.put(f"{path}/offload", json={"ledgerId": last["ledgerId"], "entryId": last["entryId"]}
                   ).raise_for_status()
        deadline = time.monotonic() + OFFLOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            status = client.get(f"{path}/offload").raise_for_status().json()
            if status["status"] == "ERROR":
                raise RuntimeError(f"offload of {topic} failed: {status.get('lastError')}")
            if status["status"] == "SUCCESS":
                break
            time.sleep(POLL_S)
        elapsed_s = time.perf_counter() - started_s
        while time.monotonic() < deadline:
            ledgers = client.get(f"{path}/internalStats").raise_for_status().json()["ledgers"][:-1]
            if ledgers and all(ledger["offloaded"] and ledger.get("bookkeeperDeleted") for ledger in ledgers):
                return elapsed_s
            time.sleep(POLL_S)
    raise RuntimeError(f"offload of {topic} did not finish within {OFFLOAD_TIMEOUT_S:.0f} s")


def offload_in_background(broker: Broker, topic: str) -> None:
    path = f"/admin/v2/{NAMESPACE}/{topic}"
    with admin(broker) as client:
        last = client.get(f"{path}/lastMessageId").raise_for_status().json()
        client.put(f"{path}/offload", json={"ledgerId": last["ledgerId"], "entryId": last["entryId"]}
                   ).raise_for_status()


def offload_running(broker: Broker, topic: str) -> bool:
    with admin(broker) as client:
        status = client.get(f"/admin/v2/{NAMESPACE}/{topic}/offload").raise_for_status().json()
    if status["status"] == "ERROR":
        raise RuntimeError(f"offload of {topic} failed: {status.get('lastError')}")
    return bool(status["status"] == "RUNNING")


# --- the run ------------------------------------------------------------------------------------
def run(args: argparse.Namespace, work_dir: Path) -> list[Row]:
    payload = os.urandom(args.message_kb * 1024)
    count = args.size_mb * 1024 // args.message_kb
    with running_s3(work_dir, args.store_nice) as (endpoint, store):
        yielding_per_s = None if args.while_publishing_mb is None else args.while_publishing_mb * 1_000_000
        broker = Broker(work_dir, write_config(work_dir, endpoint, args.ledger_entries, yielding_per_s))
        broker.start()
        try:
            for topic in (LOCAL_TOPIC, OFFLOADED_TOPIC):
                publish(broker.service_url, topic, count, payload)
            yielding_topics = [f"tiered-yielding-{i}" for i in range(args.rounds)]
            full_speed_topics = [f"tiered-full-speed-{i}" for i in range(args.rounds)]
            for topic in yielding_topics:
                publish(broker.service_url, topic, args.yielding_mb * 1024 // args.message_kb, payload)
            for topic in full_speed_topics:
                publish(broker.service_url, topic, count, payload)
            offload_s = offload_everything(broker, OFFLOADED_TOPIC)
            print(f"offloaded {args.size_mb} MB in {offload_s:.1f} s")
            broker.stop()
            broker.start()
            reads: dict[str, list[ReadResult]] = {LOCAL_TOPIC: [], OFFLOADED_TOPIC: []}
            for topic in (LOCAL_TOPIC, OFFLOADED_TOPIC, OFFLOADED_TOPIC, LOCAL_TOPIC):
                result = read_all(broker, store, topic, count, len(payload))
                print(f"read {topic}: {result.mb_per_s:.1f} MB/s, broker CPU {result.cpu_ms_per_mb:.1f} ms/MB")
                reads[topic].append(result)
            yielding = publish_during_offloads(broker, store, yielding_topics, args.publish_s, payload)
            print(f"publish during an offload (defaults: it yields to publishing): {yielding.ratio:.2f}x")
            broker.stop()
            write_config(work_dir, endpoint, args.ledger_entries, -1)
            broker.start()
            full_speed = publish_during_offloads(broker, store, full_speed_topics, args.publish_s, payload)
            print(f"publish during an offload that does not yield: {full_speed.ratio:.2f}x")
        finally:
            broker.stop()
    return rows(reads, yielding, full_speed, offload_s, args)


def rows(reads: dict[str, list[ReadResult]], yielding: PublishDuringOffloads, full_speed: PublishDuringOffloads,
         offload_s: float, args: argparse.Namespace) -> list[Row]:
    local = max(reads[LOCAL_TOPIC], key=lambda r: r.mb_per_s)
    defaults = "defaults: " if args.while_publishing_mb is None else ""
    yielding_mb = (OffloadSettings.flow_permits_per_second_while_publishing // 1_000_000
                   if args.while_publishing_mb is None else args.while_publishing_mb)
    offloaded = max(reads[OFFLOADED_TOPIC], key=lambda r: r.mb_per_s)
    each = "; ".join(f"{r.topic.removeprefix('tiered-')} {r.mb_per_s:.1f}" for pair in zip(
        reads[LOCAL_TOPIC], reads[OFFLOADED_TOPIC], strict=True) for r in pair)
    return [
        Row("catch-up read, offloaded vs local", f"{offloaded.mb_per_s:,.1f} vs {local.mb_per_s:,.1f} MB/s",
            f"{offloaded.mb_per_s / local.mb_per_s:.2f}x",
            f"best of 2 reads each (MB/s: {each}); broker CPU {offloaded.cpu_ms_per_mb:.1f} vs "
            f"{local.cpu_ms_per_mb:.1f} ms/MB, S3 server CPU {offloaded.store_cpu_ms_per_mb:.1f} ms/MB; "
            "target >= 0.5x"),
        _publish_row(f"publish while an offload runs vs alone ({defaults}the offload yields to publishing at "
                     f"{yielding_mb} MB/s)", yielding, args),
        _publish_row("publish while an offload that does not yield runs vs alone (WhilePublishing=-1, as Pulsar)",
                     full_speed, args, target=False),
        Row("offload of the read topic, nothing published meanwhile (defaults)",
            f"{args.size_mb / offload_s:,.1f} MB/s", "", f"{args.size_mb} MB in {offload_s:.1f} s, up to SUCCESS"),
    ]


def _publish_row(measure: str, result: PublishDuringOffloads, args: argparse.Namespace, *, target: bool = True) -> Row:
    alone, during = result.alone, result.during
    rounds = ", ".join(f"{r:.2f}" for r in result.round_ratios())
    ended = sum(not r.still_running for r in result.rounds)
    running = (f"{ended} offload(s) ended before the end of their window" if ended
               else "every offload was still running at the end of its window")
    return Row(measure, f"{_mean_rate(during):,.0f} vs {_mean_rate(alone):,.0f} msg/s", f"{result.ratio:.2f}x",
               f"{len(result.rounds)} rounds of {args.publish_s:.0f} s alone then {args.publish_s:.0f} s during an "
               f"offload, and {args.publish_s:.0f} s alone at the end; {args.message_kb} KiB messages; means of "
               f"{len(during)} windows during and {len(alone)} alone; each round against the windows alone either "
               f"side of it: {rounds}; "
               f"{running}; "
               f"mean CPU (cores) broker {_mean_cores(alone, 'broker_cores'):.2f} alone / "
               f"{_mean_cores(during, 'broker_cores'):.2f} during, S3 server {_mean_cores(during, 'store_cores'):.2f} "
               "during" + ("; target >= 0.9x" if target else "; for reference"))


def main(argv: list[str] | None = None) -> int:
    # the broker reads the store's credentials as a user's would: the standard AWS variables
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MB published to each topic read")
    parser.add_argument("--message-kb", type=int, default=64)
    parser.add_argument("--ledger-entries", type=int, default=1000, help="managedLedgerMaxEntriesPerLedger")
    parser.add_argument("--publish-s", type=float, default=8.0, help="seconds of each publishing window")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of publishing alone then during an offload, for each of the two offloads")
    parser.add_argument("--store-nice", type=int, default=0,
                        help="run the S3 server at this nice value (19: it takes only the CPU the broker leaves)")
    parser.add_argument("--yielding-mb", type=int, default=256,
                        help="MB of each topic offloaded while yielding (at 8 MB/s, 32 s: longer than a window)")
    parser.add_argument("--while-publishing-mb", type=int, default=None,
                        help="managedLedgerOffloadFlowPermitsPerSecondWhilePublishing of steps 1-3, in MB/s "
                             "(default: the broker's)")
    parser.add_argument("--quick", action="store_true", help="64 MB and 5 s (a smoke run)")
    parser.add_argument("--work-root", type=Path, default=DEFAULT_WORK_ROOT)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mb, args.publish_s, args.ledger_entries, args.yielding_mb, args.rounds = 64, 3.0, 200, 64, 2
    with scratch_dir(args.work_root, "tiered-bench-") as work_dir:
        table = render_table(run(args, work_dir))
        machine = machine_summary(work_dir)
    config = (f"{args.size_mb} MB per topic in {args.message_kb} KiB messages (batching off), ledgers of "
              f"{args.ledger_entries} entries, moto's S3 server on this machine (driver aws-s3), deletion lag 0; "
              "reads by the official Pulsar client's reader from earliest after a broker restart")
    report(HEADING, machine, config, table, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
