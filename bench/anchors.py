"""The anchors of the end-to-end benchmark: Redis Streams and NATS JetStream, each a private server.

Role: ``bench/e2e_bench.py`` compares Magnetar with these two, measured in the same run on the
same machine with Python clients, the same payloads and the same bounds (:class:`Plan`):

- **Redis Streams**: ``redis-server`` on 127.0.0.1 with an ephemeral port and a temporary
  directory, ``--appendonly yes --appendfsync always`` (a reply is sent only after the AOF is
  fsync'd) and no RDB snapshots. Publish = ``XADD`` pipelined, ``publish_window_messages``
  commands per round trip; catch-up = ``XREAD COUNT catch_up_batch_messages`` from ``0-0``;
  latency = ``XADD`` per probe and a blocking ``XREAD`` on a second connection.
- **NATS JetStream**: ``nats-server -js -sd <tmp> -a 127.0.0.1 -p <port>``, one file-storage
  stream per phase. Publish = ``publish_async`` with at most ``publish_window_messages``
  acknowledgements outstanding; catch-up = a pull consumer (``AckPolicy.NONE``, like a reader)
  fetching batches; latency = ``publish`` per probe and a push consumer acking each message.
  NATS 2.9 (Debian's) writes JetStream messages to the OS page cache and fsyncs in the
  background (every 2 minutes by default): its acknowledgements are not fsync-durable.

Invariants: every loop is bounded by the plan's durations or counts and a deadline; every
server is stopped by its PID (SIGTERM, then SIGKILL); every reader touches every payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e_support import (
    CpuSpent,
    Latency,
    LatencyRecorder,
    Plan,
    ServerProcess,
    Throughput,
    free_port,
    measured_cpu,
    paced_due_s,
    probe_payload,
    seconds_until,
    started,
)

REDIS_FIELD = b"d"
REDIS_BLOCK_MS = 1000
NATS_FETCH_TIMEOUT_S = 5.0
NATS_FETCH_DIVISOR = 10
NATS_STORE_DIR = "nats"
REDIS_STORE_DIR = "redis"
INSTALL_TIMEOUT_S = 600.0
REDIS_LATENCY_CONNECTIONS = 32
"""Enough for 2,000 probes/s even when an fsync takes 10 ms (Redis answers after its AOF fsync)."""
SUBSCRIBE_SETTLE_S = 0.2
"""Pause between a latency consumer being subscribed and the first probe."""
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
ANCHOR_PACKAGES = {"redis-server": "redis-server", "nats-server": "nats-server"}
"""Executable → Debian package."""


# --- installation -------------------------------------------------------------------------


def find_executable(name: str) -> str | None:
    """``name`` on PATH or in the sbin directories (Debian installs nats-server in /usr/sbin)."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN_DIRS))


def ensure_installed(executable: str) -> tuple[str | None, str]:
    """The path of ``executable``, installing its Debian package when absent; else None and why."""
    found = find_executable(executable)
    if found is not None:
        return found, "already installed"
    package = ANCHOR_PACKAGES[executable]
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None or shutil.which("apt-get") is None:
        return None, f"{executable} is not installed and apt-get (as root or via sudo) is not available"
    print(f"installing {package} with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in ([*prefix, "apt-get", "install", "-y", package],
                 [*prefix, "apt-get", "update"], [*prefix, "apt-get", "install", "-y", package]):
        try:
            subprocess.run(argv, env=env, capture_output=True, timeout=INSTALL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"installing {package} failed: {exc}"
        found = find_executable(executable)
        if found is not None:
            return found, f"installed {package} with apt-get"
    return None, f"`apt-get install -y {package}` did not provide {executable}"


# --- Redis Streams ------------------------------------------------------------------------


def start_redis(executable: str, work_dir: Path) -> ServerProcess:
    data_dir = work_dir / REDIS_STORE_DIR
    data_dir.mkdir()
    port = free_port()
    argv = [executable, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
            "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
            "--protected-mode", "no"]
    return started(ServerProcess("redis-server", argv, port, work_dir / "redis.log"), ServerProcess.wait_for_port)


def redis_parser() -> str:
    """Which reply parser redis-py uses here (hiredis is much faster at large replies)."""
    try:
        import hiredis  # noqa: F401
    except ImportError:
        return "redis-py's Python parser (hiredis not installed)"
    return "hiredis parser"


def redis_publish(server: ServerProcess, plan: Plan, payload_bytes: int, key: str) -> Throughput:
    """Pipelined XADD of ``payload_bytes`` payloads for ``plan.publish_duration_s``; every reply
    (an entry id, sent after the AOF fsync) is checked."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=server.port)
    payload = os.urandom(payload_bytes)
    window = plan.publish_window_messages
    cpu: list[CpuSpent] = []
    acked = 0
    with measured_cpu(server, cpu):
        started = time.perf_counter()
        deadline = started + plan.publish_duration_s
        while time.perf_counter() < deadline:
            pipe = client.pipeline(transaction=False)
            for _ in range(window):
                pipe.xadd(key, {REDIS_FIELD: payload})
            ids = pipe.execute()
            if len(ids) != window or not all(ids):
                raise RuntimeError(f"XADD pipeline answered {len(ids)} ids for {window} commands")
            acked += window
        duration_s = time.perf_counter() - started
    client.close()
    return Throughput(acked, payload_bytes, duration_s, cpu[0],
                      f"pipelines of {window} XADD, appendfsync always")


def redis_catch_up(server: ServerProcess, plan: Plan, key: str, expected: int) -> Throughput:
    """XREAD from the start of ``key`` in batches until ``expected`` messages or the deadline."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=server.port)
    last_id: bytes | str = "0-0"
    read = payload_total_bytes = 0
    cpu: list[CpuSpent] = []
    with measured_cpu(server, cpu):
        started = time.perf_counter()
        deadline = started + plan.catch_up_duration_s_max
        while read < expected and time.perf_counter() < deadline:
            reply: Any = client.xread({key: last_id}, count=plan.catch_up_batch_messages)
            if not reply:
                break
            entries = reply[0][1]
            for _entry_id, fields in entries:
                payload_total_bytes += len(fields[REDIS_FIELD])
            read += len(entries)
            last_id = entries[-1][0]
        duration_s = time.perf_counter() - started
    client.close()
    return Throughput(read, payload_total_bytes // max(read, 1), duration_s, cpu[0],
                      f"XREAD COUNT {plan.catch_up_batch_messages}; {redis_parser()}")


async def redis_latency(server: ServerProcess, plan: Plan, key: str) -> Latency:
    """Paced XADD probes at ``plan.latency_rate_per_s`` over a small connection pool, replies
    checked but not awaited before the next probe; a blocking XREAD receives them."""
    import redis.asyncio as aioredis

    pool = aioredis.BlockingConnectionPool(host="127.0.0.1", port=server.port,
                                           max_connections=REDIS_LATENCY_CONNECTIONS, timeout=plan.drain_timeout_s)
    sender = aioredis.Redis(connection_pool=pool)
    receiver = aioredis.Redis(host="127.0.0.1", port=server.port)
    recorder = LatencyRecorder(plan.latency_warmup_messages)
    await sender.ping()
    await receiver.ping()

    async def receive() -> None:
        last_id: bytes | str = "0-0"
        deadline = time.monotonic() + plan.latency_messages / plan.latency_rate_per_s + plan.drain_timeout_s
        while recorder.received < plan.latency_messages and time.monotonic() < deadline:
            reply: Any = await receiver.xread({key: last_id}, count=plan.publish_window_messages, block=REDIS_BLOCK_MS)
            received_ns = time.perf_counter_ns()
            if not reply:
                continue
            entries = reply[0][1]
            for _entry_id, fields in entries:
                recorder.record(fields[REDIS_FIELD], received_ns)
            last_id = entries[-1][0]

    async def send(index: int) -> Any:
        return await sender.xadd(key, {REDIS_FIELD: probe_payload(index, plan.latency_payload_bytes)})

    cpu: list[CpuSpent] = []
    with measured_cpu(server, cpu):
        receiving = asyncio.create_task(receive())
        await asyncio.sleep(SUBSCRIBE_SETTLE_S)
        send_duration_s = await paced_sends(plan, send, bool)
        await receiving
    await sender.aclose()
    await pool.aclose()
    await receiver.aclose()
    return Latency(recorder.latencies_us, plan.latency_messages, recorder.received, send_duration_s, cpu[0],
                   f"XADD per probe over {REDIS_LATENCY_CONNECTIONS} pooled connections (replies checked, not awaited "
                   f"before the next probe), blocking XREAD on another connection")


async def paced_sends(plan: Plan, send: Callable[[int], Coroutine[Any, Any, Any]],
                      acknowledged: Callable[[Any], bool]) -> float:
    """Send ``plan.latency_messages`` probes on the paced schedule, each as a task, with at most
    ``publish_window_messages`` unacknowledged; check every acknowledgement; return the send time."""
    pending: deque[asyncio.Task[Any]] = deque()

    async def settle_oldest(timeout_s: float | None) -> None:
        reply = await asyncio.wait_for(pending.popleft(), timeout_s)
        if not acknowledged(reply):
            raise RuntimeError(f"publish not acknowledged: {str(reply)[:200]}")

    started = time.perf_counter()
    for index in range(plan.latency_messages):
        await asyncio.sleep(seconds_until(paced_due_s(started, index, plan.latency_rate_per_s)))
        while pending and (pending[0].done() or len(pending) >= plan.publish_window_messages):
            await settle_oldest(None)
        pending.append(asyncio.create_task(send(index)))
    send_duration_s = time.perf_counter() - started
    while pending:
        await settle_oldest(plan.drain_timeout_s)
    return send_duration_s


# --- NATS JetStream -----------------------------------------------------------------------


def start_nats(executable: str, work_dir: Path) -> ServerProcess:
    store_dir = work_dir / NATS_STORE_DIR
    store_dir.mkdir()
    port = free_port()
    argv = [executable, "-js", "-sd", str(store_dir), "-a", "127.0.0.1", "-p", str(port)]
    return started(ServerProcess("nats-server", argv, port, work_dir / "nats.log"), ServerProcess.wait_for_port)


@dataclass(frozen=True)
class NatsStream:
    """One file-storage stream holding one subject."""

    name: str
    subject: str


async def _nats_connect(server: ServerProcess) -> Any:
    import nats

    return await nats.connect(f"nats://127.0.0.1:{server.port}", allow_reconnect=False)


async def nats_add_stream(server: ServerProcess, stream: NatsStream) -> None:
    from nats.js.api import StorageType

    nc = await _nats_connect(server)
    try:
        await nc.jetstream().add_stream(name=stream.name, subjects=[stream.subject], storage=StorageType.FILE)
    finally:
        await nc.close()


async def nats_publish(server: ServerProcess, plan: Plan, payload_bytes: int, stream: NatsStream) -> Throughput:
    """``publish_async`` for ``plan.publish_duration_s`` with a sliding window of outstanding
    acknowledgements; every acknowledgement is awaited and checked."""
    await nats_add_stream(server, stream)
    nc = await _nats_connect(server)
    window = plan.publish_window_messages
    js = nc.jetstream(publish_async_max_pending=window)
    payload = os.urandom(payload_bytes)
    pending: deque[asyncio.Future[Any]] = deque()
    acked = 0
    cpu: list[CpuSpent] = []
    with measured_cpu(server, cpu):
        started = time.perf_counter()
        deadline = started + plan.publish_duration_s
        while time.perf_counter() < deadline:
            if len(pending) >= window:
                acked += _checked_ack(await pending.popleft(), stream)
            pending.append(await js.publish_async(stream.subject, payload))
        while pending:
            acked += _checked_ack(await asyncio.wait_for(pending.popleft(), plan.drain_timeout_s), stream)
        duration_s = time.perf_counter() - started
    await nc.close()
    return Throughput(acked, payload_bytes, duration_s, cpu[0],
                      f"publish_async, window {window}, file storage (acks not fsync'd: NATS syncs in the background)")


def _checked_ack(ack: Any, stream: NatsStream) -> int:
    if ack.stream != stream.name or ack.seq <= 0:
        raise RuntimeError(f"unexpected JetStream ack {ack}")
    return 1


async def nats_catch_up(server: ServerProcess, plan: Plan, stream: NatsStream, expected: int) -> Throughput:
    """A pull consumer from the first message, fetching batches until ``expected`` or the deadline."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await _nats_connect(server)
    js = nc.jetstream()
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
    batch = max(1, plan.catch_up_batch_messages // NATS_FETCH_DIVISOR)
    read = payload_total_bytes = 0
    cpu: list[CpuSpent] = []
    with measured_cpu(server, cpu):
        started = time.perf_counter()
        pull = await js.pull_subscribe(stream.subject, stream=stream.name, config=config)
        deadline = started + plan.catch_up_duration_s_max
        while read < expected and time.perf_counter() < deadline:
            messages = await pull.fetch(min(batch, expected - read), timeout=NATS_FETCH_TIMEOUT_S)
            for message in messages:
                payload_total_bytes += len(message.data)
            read += len(messages)
        duration_s = time.perf_counter() - started
    await nc.close()
    return Throughput(read, payload_total_bytes // max(read, 1), duration_s, cpu[0],
                      f"pull consumer, AckPolicy.NONE, fetch({batch})")


async def nats_latency(server: ServerProcess, plan: Plan, stream: NatsStream) -> Latency:
    """Paced ``publish_async`` probes (acks checked, not awaited before the next probe) and a push
    consumer that acks every message."""
    await nats_add_stream(server, stream)
    publisher, subscriber = await _nats_connect(server), await _nats_connect(server)
    recorder = LatencyRecorder(plan.latency_warmup_messages)
    all_received = asyncio.Event()

    async def on_message(message: Any) -> None:
        recorder.record(message.data, time.perf_counter_ns())
        await message.ack()
        if recorder.received >= plan.latency_messages:
            all_received.set()

    js_pub = publisher.jetstream(publish_async_max_pending=plan.publish_window_messages)

    async def send(index: int) -> Any:
        return await (await js_pub.publish_async(stream.subject, probe_payload(index, plan.latency_payload_bytes)))

    subscription = await subscriber.jetstream().subscribe(stream.subject, cb=on_message, manual_ack=True)
    cpu: list[CpuSpent] = []
    with measured_cpu(server, cpu):
        await asyncio.sleep(SUBSCRIBE_SETTLE_S)
        send_duration_s = await paced_sends(plan, send, lambda ack: _checked_ack(ack, stream) == 1)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_received.wait(), plan.drain_timeout_s)
    await subscription.unsubscribe()
    await publisher.close()
    await subscriber.close()
    return Latency(recorder.latencies_us, plan.latency_messages, recorder.received, send_duration_s, cpu[0],
                   "publish_async per probe (acks checked, not awaited before the next probe), push consumer "
                   "acking each message")
