"""Event streams benchmark: what per-key versions cost on publish, and what they buy on reads.

Role: one ``magnetar standalone`` process; Python clients in this process; every comparison in
the same run, interleaved round by round so that load from other processes on this shared
machine drifts over both sides alike.

1. Publish, REST produce, 100 B payloads, ``--messages`` (1,000,000) messages over ``--keys``
   (10,000) keys per topic: each request carries ``--keys-per-request`` (1,000) messages, one
   event of each of that many keys (one entry). The same requests go to three topics, a round
   at a time (a round = every key once): with ``expectedKeyVersions`` naming every key of the
   request at the version the previous round left it (conditional), without (plain, keyed),
   and without keys (keyless: what the key index itself costs). Four keep-alive connections,
   each owning a quarter of the keys, one request in flight each. Target: conditional >= 0.9x
   plain.
2. Read one key's 100 events: by key (``GET .../keys/{key}/messages?maxMessages=100``, Arrow)
   against scanning the partition for them (the Arrow range read of the whole partition, the
   fastest scan Magnetar has, filtered by key on the client: what a Kafka or Pulsar user must
   do). The data is the conditional topic's: a key's events lie in as many entries as it has
   events, the worst layout for reads by key (each entry is read whole for one message). The
   scans and the reads by key alternate, and each read's server CPU is measured. Target: by key
   >= 50x faster.
3. Take a topic over: ``--takeover-events`` (1,000,000) events over ``--takeover-keys``
   (100,000) keys are published to their own topic, the key index checkpoints them, one more
   event of half the keys is published (a tail past the checkpoint), and the broker is killed
   with SIGKILL. A new broker process on the same data opens the topic on its
   first request (``GET .../keys/{key}``): from the checkpoint (the record, the segments'
   indexes, the entries after ``indexedTo``), then, killed again with the checkpoint record
   deleted, by a full rebuild from every entry. Each is timed from the first request to its
   answer (the process is already serving ``/healthz``), and both must give every sampled key
   its exact version. Target: from the checkpoint >= 10x faster.

Run from the repository root: ``.venv/bin/python bench/event_bench.py [--quick] [--out FILE]``.
Every request is bounded by a timeout, the server is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.compute as pc
from common import DEFAULT_WORK_ROOT, Row, machine_summary, render_table, report, scratch_dir
from e2e_support import CpuSpent, ServerProcess, measured_cpu, running
from magnetar_e2e import ARROW_STREAM, NAMESPACE_PATH, NEXT_OFFSET_HEADER, http_base, start_magnetar

SECTION_HEADING = "## Event streams (bench/event_bench.py)"
TARGET_CONDITIONAL_VS_PLAIN = 0.9
TARGET_BY_KEY_VS_SCAN = 50.0
PAYLOAD_BYTES = 100
CONNECTIONS = 4
HTTP_TIMEOUT_S = 120.0
SCAN_MESSAGES_PER_REQUEST = 10_000
EVENTS_READ = 100
KEY_READ_SAMPLES = 30
SCANS = 3
INDEX_CATCH_UP_S_MAX = 120.0
MODES = ("conditional", "plain", "keyless")
TARGET_TAKEOVER_VS_REBUILD = 10.0
TAKEOVER_TOPIC = "events-takeover"
TAKEOVER_SAMPLED_KEYS = 20
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class PublishTotals:
    messages: int = 0
    seconds: float = 0.0
    cpu: list[CpuSpent] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.messages / max(self.seconds, 1e-9)

    def server_us_per_message(self) -> float:
        return sum(c.server_s for c in self.cpu) / max(self.messages, 1) * 1e6

    def other_share(self) -> float:
        wall = sum(c.wall_s for c in self.cpu)
        return sum(max(0.0, c.other_s) for c in self.cpu) / max(1e-9, wall * (os.cpu_count() or 1))


def key_name(index: int) -> str:
    return f"acct-{index:06d}"


def request_body(mode: str, keys: range, version: int, payload: str) -> bytes:
    """One request: an event of each key of ``keys``; conditional on ``version - 1`` for every key."""
    if mode == "keyless":
        messages = ",".join(f'{{"payload":"{payload}"}}' for _ in keys)
    else:
        messages = ",".join(f'{{"payload":"{payload}","key":"{key_name(k)}"}}' for k in keys)
    body = f'{{"producerName":"bench-{mode}-{keys.start}","payloadEncoding":"base64","messages":[{messages}]'
    if mode == "conditional":
        body += ',"expectedKeyVersions":{' + ",".join(f'"{key_name(k)}":{version - 1}' for k in keys) + "}"
    return (body + "}").encode()


def check_answer(response: httpx.Response, mode: str, keys: range, version: int) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"{mode} publish answered {response.status_code}: {response.text[:300]}")
    results = response.json()["messagePublishResults"]
    if len(results) != len(keys) or any(r["errorCode"] for r in results):
        raise RuntimeError(f"{mode} publish acknowledged {len(results)} of {len(keys)}")
    if mode != "keyless" and any(r.get("keyVersion") != version for r in results):
        raise RuntimeError(f"{mode} publish gave versions other than {version}")


async def publish_round(client: httpx.AsyncClient, url: str, mode: str, groups: list[list[range]], version: int,
                        payload: str) -> None:
    """Every key once: each connection sends its own key groups, one request in flight."""
    async def connection(own: list[range]) -> None:
        for keys in own:
            body = request_body(mode, keys, version, payload)
            response = await client.post(url, content=body, headers={"content-type": "application/json"})
            check_answer(response, mode, keys, version)

    await asyncio.gather(*(connection(own) for own in groups))


async def publish_all(server: ServerProcess, args: argparse.Namespace) -> dict[str, PublishTotals]:
    rounds = args.messages // args.keys
    requests = [range(start, min(start + args.keys_per_request, args.keys))
                for start in range(0, args.keys, args.keys_per_request)]
    groups = [requests[c::CONNECTIONS] for c in range(CONNECTIONS)]
    payload = base64.b64encode(os.urandom(PAYLOAD_BYTES)).decode("ascii")
    totals = {mode: PublishTotals() for mode in MODES}
    limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    async with httpx.AsyncClient(limits=limits, timeout=HTTP_TIMEOUT_S) as client:
        for version in range(rounds):
            order = MODES if version % 2 == 0 else MODES[::-1]  # alternate who goes first
            for mode in order:
                url = f"{http_base(server)}/topics/{NAMESPACE_PATH}/events-{mode}"
                with measured_cpu(server, totals[mode].cpu):
                    started = time.perf_counter()
                    await publish_round(client, url, mode, groups, version, payload)
                    totals[mode].seconds += time.perf_counter() - started
                totals[mode].messages += args.keys
            if version % 10 == 9:
                print(f"  round {version + 1}/{rounds}", flush=True)
    return totals


def wait_for_index(server: ServerProcess) -> dict[str, int]:
    """The key index's statistics once nothing waits to be indexed."""
    deadline = time.monotonic() + INDEX_CATCH_UP_S_MAX
    while True:
        stats: dict[str, int] = httpx.get(f"{http_base(server)}/admin/v2/broker-stats/overview",
                                          timeout=HTTP_TIMEOUT_S).json()["keyIndex"]
        if stats["pendingRows"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


async def publish_takeover_topic(server: ServerProcess, rounds: range, keys: int, keys_per_request: int) -> None:
    """One event of each of the first ``keys`` keys per round, to the takeover topic."""
    requests = [range(start, min(start + keys_per_request, keys)) for start in range(0, keys, keys_per_request)]
    groups = [requests[c::CONNECTIONS] for c in range(CONNECTIONS)]
    payload = base64.b64encode(os.urandom(PAYLOAD_BYTES)).decode("ascii")
    url = f"{http_base(server)}/topics/{NAMESPACE_PATH}/{TAKEOVER_TOPIC}"
    limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    async with httpx.AsyncClient(limits=limits, timeout=HTTP_TIMEOUT_S) as client:
        for version in rounds:
            await publish_round(client, url, "plain", groups, version, payload)


def key_index_stats(server: ServerProcess) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(f"{http_base(server)}/admin/v2/broker-stats/overview",
                                      timeout=HTTP_TIMEOUT_S).json()["keyIndex"]
    return stats


def open_topic_by_key(server: ServerProcess, keys: int, last_version: int, tail_keys: int) -> float:
    """Seconds from the first request for a key of the takeover topic to its answer; every
    sampled key must be at ``last_version`` (one more for the first ``tail_keys``)."""
    base = f"{http_base(server)}/topics/{NAMESPACE_PATH}/{TAKEOVER_TOPIC}/keys"
    sampled = list(range(0, keys, max(1, keys // TAKEOVER_SAMPLED_KEYS)))
    with httpx.Client(timeout=HTTP_TIMEOUT_S * 5) as client:
        started = time.perf_counter()
        first = client.get(f"{base}/{key_name(sampled[0])}")
        seconds = time.perf_counter() - started
        for k in sampled:
            answer = first if k == sampled[0] else client.get(f"{base}/{key_name(k)}")
            expected = last_version + 1 if k < tail_keys else last_version
            if answer.status_code != 200 or answer.json()["version"] != expected:
                raise RuntimeError(f"after the takeover {key_name(k)} answered {answer.status_code} "
                                   f"{answer.text[:200]}, not version {expected}")
    return seconds


def delete_checkpoint_record(data_dir: Path) -> None:
    """Delete the takeover topic's key index record (the broker is stopped), so its next owner
    rebuilds the index from every entry."""
    name = f"{NAMESPACE_PATH.replace('persistent/', '', 1)}/persistent/{TAKEOVER_TOPIC}"
    code = ("import sys\n"
            "from broker.metadata.rocksdb import RocksDBMetadataStore\n"
            "from broker.key_index.checkpoint import CheckpointStore\n"
            "store = RocksDBMetadataStore(sys.argv[1])\n"
            "found = CheckpointStore(store, sys.argv[2]).load()\n"
            "assert found is not None, 'no key index record for ' + sys.argv[2]\n"
            "CheckpointStore(store, sys.argv[2]).delete()\n"
            "store.close()\n")
    subprocess.run([sys.executable, "-c", code, str(data_dir / "metadata"), name], cwd=REPO_ROOT, check=True,
                   timeout=HTTP_TIMEOUT_S)


@dataclass
class Takeover:
    from_checkpoint_s: float
    rebuild_s: float
    replayed_from_checkpoint: int
    replayed_by_rebuild: int
    checkpoints: int
    segments: int
    tail_events: int


def take_over(work_dir: Path, events: int, keys: int, keys_per_request: int) -> Takeover:
    own = work_dir / "takeover"
    own.mkdir()
    rounds, tail_keys = events // keys, keys // 2 // keys_per_request * keys_per_request
    server = start_magnetar(own)
    with running(server):
        print(f"publishing {events:,} events over {keys:,} keys for the takeover", flush=True)
        asyncio.run(publish_takeover_topic(server, range(rounds), keys, keys_per_request))
        written = wait_for_index(server)
        # a tail after the checkpoint, as a broker that dies between checkpoints leaves it
        asyncio.run(publish_takeover_topic(server, range(rounds, rounds + 1), tail_keys, keys_per_request))
        server.process.kill()
    server = start_magnetar(own)
    with running(server):
        from_checkpoint_s = open_topic_by_key(server, keys, rounds - 1, tail_keys)
        after_checkpoint = key_index_stats(server)
        server.process.kill()
    delete_checkpoint_record(own / "magnetar")
    server = start_magnetar(own)
    with running(server):
        rebuild_s = open_topic_by_key(server, keys, rounds - 1, tail_keys)
        after_rebuild = key_index_stats(server)
        server.process.kill()
    return Takeover(from_checkpoint_s, rebuild_s, after_checkpoint["entriesReplayed"],
                    after_rebuild["entriesReplayed"], written["checkpoints"], written["segments"], tail_keys)


def takeover_rows(takeover: Takeover, events: int, keys: int) -> list[Row]:
    ratio = takeover.rebuild_s / max(takeover.from_checkpoint_s, 1e-9)
    met = "met" if ratio >= TARGET_TAKEOVER_VS_REBUILD else "missed"
    shape = (f"{events:,} events over {keys:,} keys checkpointed, then {takeover.tail_events:,} more (a tail the "
             "checkpoint does not hold), SIGKILL, then a new broker process on the same data")
    return [
        Row("take a topic over, full rebuild of its key index", f"{takeover.rebuild_s:,.2f} s", "1.00x (anchor)",
            f"{shape}, its checkpoint record deleted: {takeover.replayed_by_rebuild:,} entries read again; timed "
            f"from the first request for a key to its answer; {TAKEOVER_SAMPLED_KEYS} keys checked at their version"),
        Row("take a topic over from its key index checkpoint", f"{takeover.from_checkpoint_s:,.2f} s",
            f"{ratio:,.0f}x faster (target >= {TARGET_TAKEOVER_VS_REBUILD:.0f}x: {met})",
            f"{shape}: the record and the segments' indexes read, {takeover.replayed_from_checkpoint:,} entries "
            f"after it read again; the writer made {takeover.checkpoints} checkpoints, {takeover.segments} "
            "segment(s) kept"),
    ]


def read_by_key(client: httpx.Client, base: str, key: str) -> float:
    """One key's first ``EVENTS_READ`` events by key, checked dense from version 0: seconds."""
    started = time.perf_counter()
    response = client.get(f"{base}/keys/{key}/messages", params={"maxMessages": EVENTS_READ},
                          headers={"accept": ARROW_STREAM})
    table = pa.ipc.open_stream(response.content).read_all()
    elapsed = time.perf_counter() - started
    if response.status_code != 200 or table.column("keyVersion").to_pylist() != list(range(EVENTS_READ)):
        raise RuntimeError(f"read of {key} by key: {response.status_code}, {table.num_rows} rows")
    return elapsed


def scan_for_key(client: httpx.Client, base: str, key: str) -> tuple[float, int]:
    """Every message of the partition, by range reads, keeping ``key``'s: (seconds, messages scanned)."""
    started = time.perf_counter()
    wanted = key.encode()
    found: list[pa.Table] = []
    offset = scanned = 0
    while True:
        response = client.get(f"{base}/messages", params={"offset": offset, "maxMessages": SCAN_MESSAGES_PER_REQUEST},
                              headers={"accept": ARROW_STREAM})
        if response.status_code != 200:
            raise RuntimeError(f"range read at {offset}: {response.status_code} {response.text[:200]}")
        table = pa.ipc.open_stream(response.content).read_all()
        if table.num_rows == 0:
            break
        scanned += table.num_rows
        found.append(table.filter(pc.equal(table.column("key"), pa.scalar(wanted, pa.binary()))))
        offset = int(response.headers[NEXT_OFFSET_HEADER])
    elapsed = time.perf_counter() - started
    rows = sum(t.num_rows for t in found)
    if rows != EVENTS_READ:
        raise RuntimeError(f"the scan found {rows} events of {key}, not {EVENTS_READ}")
    return elapsed, scanned


def publish_rows(totals: dict[str, PublishTotals], args: argparse.Namespace) -> list[Row]:
    plain = totals["plain"].per_s
    shape = (f"{args.keys_per_request} messages per request, one event each of as many keys; {CONNECTIONS} "
             f"connections x 1 request in flight; rounds interleaved with the other rows")
    notes = {"conditional": f"expectedKeyVersions naming all {args.keys_per_request} keys of each request; ",
             "plain": "the same keyed requests without expectedKeyVersions; ",
             "keyless": "the same requests without keys (no key index work); "}
    rows = []
    for mode in MODES:
        total = totals[mode]
        if mode == "plain":
            ratio = "1.00x (anchor)"
        elif mode == "conditional":
            met = "met" if total.per_s >= TARGET_CONDITIONAL_VS_PLAIN * plain else "missed"
            ratio = f"{total.per_s / plain:.2f}x plain (target >= {TARGET_CONDITIONAL_VS_PLAIN}x: {met})"
        else:
            ratio = f"{total.per_s / plain:.2f}x plain"
        note = (f"{total.messages:,} messages in {total.seconds:.1f} s; {notes[mode]}{shape}; server CPU "
                f"{total.server_us_per_message():.1f} µs/msg; other processes used {total.other_share():.0%} of "
                "the machine")
        rows.append(Row(f"REST publish 100 B, {mode}", f"{total.per_s:,.0f} msg/s", ratio, note))
    return rows


@dataclass
class Reads:
    """Timed reads of one kind, each with the server CPU it cost."""

    seconds: list[float] = field(default_factory=list)
    cpu: list[CpuSpent] = field(default_factory=list)
    scanned: int = 0

    def median_s(self) -> float:
        return statistics.median(self.seconds)

    def server_ms_per_read(self) -> float:
        return sum(c.server_s for c in self.cpu) / max(len(self.cpu), 1) * 1000

    def other_share(self) -> float:
        wall = sum(c.wall_s for c in self.cpu)
        return sum(max(0.0, c.other_s) for c in self.cpu) / max(1e-9, wall * (os.cpu_count() or 1))


def read_both_ways(server: ServerProcess, base: str, keys: int) -> tuple[Reads, Reads]:
    """``SCANS`` scans, each followed by its share of the ``KEY_READ_SAMPLES`` reads by key, so
    that load from other processes drifts over both alike."""
    by_key, scans = Reads(), Reads()
    sampled = [key_name(k) for k in range(0, keys, max(1, keys // KEY_READ_SAMPLES))][:KEY_READ_SAMPLES]
    per_scan = -(-len(sampled) // SCANS)
    with httpx.Client(timeout=HTTP_TIMEOUT_S) as client:
        for round_index in range(SCANS):
            with measured_cpu(server, scans.cpu):
                seconds, scans.scanned = scan_for_key(client, base, sampled[round_index])
            scans.seconds.append(seconds)
            for key in sampled[round_index * per_scan:(round_index + 1) * per_scan]:
                with measured_cpu(server, by_key.cpu):
                    by_key.seconds.append(read_by_key(client, base, key))
    return by_key, scans


def read_rows(by_key: Reads, scans: Reads, index: dict[str, int]) -> list[Row]:
    ratio = scans.median_s() / by_key.median_s()
    met = "met" if ratio >= TARGET_BY_KEY_VS_SCAN else "missed"
    p90_ms = statistics.quantiles(by_key.seconds, n=10)[-1] * 1000
    return [
        Row(f"read one key's {EVENTS_READ} events, scanning the partition", f"{scans.median_s() * 1000:,.0f} ms",
            "1.00x (anchor)", f"median of {len(scans.seconds)} scans of {scans.scanned:,} messages by the Arrow range "
                              f"read ({SCAN_MESSAGES_PER_REQUEST:,} per request), filtered by key in pyarrow; server "
                              f"CPU {scans.server_ms_per_read():,.0f} ms per scan; other processes used "
                              f"{scans.other_share():.0%} of the machine"),
        Row(f"read one key's {EVENTS_READ} events by key", f"{by_key.median_s() * 1000:,.1f} ms",
            f"{ratio:,.0f}x faster (target >= {TARGET_BY_KEY_VS_SCAN:.0f}x: {met})",
            f"median of {len(by_key.seconds)} keys (p90 {p90_ms:,.1f} ms), read between the scans; "
            f"GET .../keys/{{key}}/messages?maxMessages={EVENTS_READ}, Arrow; each event in its own entry of "
            f"1,000 messages (an entry read whole for one message); server CPU {by_key.server_ms_per_read():,.1f} "
            f"ms per read; other processes used {by_key.other_share():.0%} of the machine; key index: "
            f"{index['rowsIndexed']:,} rows in {index['segments']:,} segment(s) after {index['checkpoints']:,} "
            "checkpoints"),
    ]


def run(args: argparse.Namespace, work_dir: Path) -> tuple[list[Row], str]:
    if args.takeover_only:
        takeover = take_over(work_dir, args.takeover_events, args.takeover_keys, args.keys_per_request)
        return takeover_rows(takeover, args.takeover_events, args.takeover_keys), "the takeover only"
    server = start_magnetar(work_dir)
    with running(server):
        print(f"publishing {args.messages:,} messages over {args.keys:,} keys to each of {', '.join(MODES)}",
              flush=True)
        totals = asyncio.run(publish_all(server, args))
        index = wait_for_index(server)
        base = f"{http_base(server)}/topics/{NAMESPACE_PATH}/events-conditional"
        print("reading by key and by scan", flush=True)
        by_key, scans = read_both_ways(server, base, args.keys)
    takeover = take_over(work_dir, args.takeover_events, args.takeover_keys, args.keys_per_request)
    rows = [*publish_rows(totals, args), *read_rows(by_key, scans, index),
            *takeover_rows(takeover, args.takeover_events, args.takeover_keys)]
    config = (f"{args.messages:,} messages over {args.keys:,} keys per topic ({args.messages // args.keys} events "
              f"per key), {PAYLOAD_BYTES} B payloads, REST produce; `magnetar standalone` defaults; "
              f"clients in the bench process; the machine is shared with other work (each row says how much of "
              f"it other processes used), so the ratios come from rounds and reads interleaved in one run")
    return rows, config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per topic")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--keys-per-request", type=int, default=1000)
    parser.add_argument("--takeover-events", type=int, default=1_000_000, help="events of the takeover topic")
    parser.add_argument("--takeover-keys", type=int, default=100_000)
    parser.add_argument("--takeover-only", action="store_true", help="measure only the takeover")
    parser.add_argument("--quick", action="store_true",
                        help="100,000 messages over 1,000 keys; a takeover of 100,000 events over 10,000 keys")
    parser.add_argument("--out", type=Path, default=None, help="write the section into this markdown file")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_ROOT)
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.keys = 100_000, 1_000
        args.takeover_events, args.takeover_keys = 100_000, 10_000
    if args.messages != EVENTS_READ * args.keys or args.keys % args.keys_per_request:
        parser.error(f"give {EVENTS_READ} events per key (--messages = {EVENTS_READ} x --keys) and keys divisible "
                     "by --keys-per-request")
    if args.takeover_events % args.takeover_keys or args.takeover_keys % args.keys_per_request:
        parser.error("give --takeover-events a multiple of --takeover-keys, and --takeover-keys divisible by "
                     "--keys-per-request")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with scratch_dir(args.work_dir, "event-bench-") as work_dir:
        rows, config = run(args, work_dir)
        machine = machine_summary(work_dir)
    report(SECTION_HEADING, machine, config, render_table(rows), args.out, show_config=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
