"""What the end-to-end benchmark shares between its systems: plan, results, processes, pacing.

Role: ``bench/e2e_bench.py`` measures Magnetar and its anchors (``bench/anchors.py``: Redis
Streams, NATS JetStream) as separate server processes driven by Python clients from the bench
process. This module holds what is independent of the system measured:

- :class:`Plan`, the bounds of one run (durations, windows, message counts);
- :class:`ServerProcess`, a server started as a child process with its output in a log file,
  waited for with a deadline and stopped by its PID (SIGTERM, then SIGKILL after a deadline);
  its CPU seconds are read from ``/proc`` so each figure can say what it cost the server;
- :class:`Throughput` and :class:`Latency`, one measured figure each, with the CPU both sides
  spent on it;
- the latency probe's payload (the send time on the monotonic clock, which every process on
  the host shares) and a paced schedule that sends on time, catching up without sleeping when
  late, so the mean rate is exactly the plan's.

Invariants: every wait has a deadline; every process started here is stopped by its own PID.
MB means 10^6 bytes.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from common import append_sync_loop, system_busy_cpu_s

MB = 1_000_000
KiB = 1024
PUBLISH_PAYLOADS_BYTES = (100, 1 * KiB)
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.05
LOG_TAIL_BYTES = 2000


@dataclass(frozen=True)
class Plan:
    """The bounds of one run."""

    publish_duration_s: float
    catch_up_duration_s_max: float
    latency_rate_per_s: int
    latency_messages: int
    latency_warmup_messages: int
    publish_window_messages: int = 1000
    """Redis: XADD commands per pipeline round trip; NATS and the WebSocket producer:
    outstanding unacknowledged messages."""
    rest_messages_per_request: int = 1000
    rest_requests_in_flight: int = 4
    catch_up_batch_messages: int = 10_000
    """Redis XREAD COUNT; NATS fetches ``catch_up_batch_messages // 10`` per request."""
    receiver_queue_size: int = 1000
    latency_payload_bytes: int = 100
    drain_timeout_s: float = 30.0
    """How long a phase may wait for outstanding acknowledgements or messages after its end."""
    disk_probe_duration_s: float = 2.0


NORMAL_PLAN = Plan(publish_duration_s=5.0, catch_up_duration_s_max=10.0, latency_rate_per_s=2000,
                   latency_messages=20_000, latency_warmup_messages=1000)
QUICK_PLAN = Plan(publish_duration_s=1.0, catch_up_duration_s_max=2.0, latency_rate_per_s=2000,
                  latency_messages=2000, latency_warmup_messages=200, drain_timeout_s=10.0,
                  disk_probe_duration_s=0.5)
DISK_PROBE_RECORD_BYTES = 100


def size_label(payload_bytes: int) -> str:
    return f"{payload_bytes // KiB} KiB" if payload_bytes >= KiB and payload_bytes % KiB == 0 else f"{payload_bytes} B"


# --- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuSpent:
    """CPU seconds a phase cost the server process, the bench process (all its threads) and
    every other process on the machine, over ``wall_s`` seconds."""

    server_s: float
    client_s: float
    other_s: float
    wall_s: float

    @property
    def other_share(self) -> float:
        """Fraction of the machine's CPU capacity used by other processes during the phase."""
        return max(0.0, self.other_s) / max(1e-9, self.wall_s * (os.cpu_count() or 1))


@dataclass(frozen=True)
class Throughput:
    """Messages moved in one phase: acknowledged publishes or messages read."""

    messages: int
    payload_bytes: int
    duration_s: float
    cpu: CpuSpent
    detail: str = ""

    @property
    def messages_per_s(self) -> float:
        return self.messages / max(self.duration_s, 1e-9)

    @property
    def mb_per_s(self) -> float:
        return self.messages * self.payload_bytes / max(self.duration_s, 1e-9) / MB

    def cpu_note(self) -> str:
        per_message = max(self.messages, 1)
        return (f"CPU per message: server {self.cpu.server_s / per_message * 1e6:,.1f} µs, "
                f"client {self.cpu.client_s / per_message * 1e6:,.1f} µs; {load_note(self.cpu)}")


def load_note(cpu: CpuSpent) -> str:
    return f"other processes used {cpu.other_share:.0%} of the machine"


@dataclass(frozen=True)
class Latency:
    """End-to-end latencies (µs) of the probes received after the warm-up."""

    latencies_us: list[float]
    sent: int
    received: int
    send_duration_s: float
    cpu: CpuSpent
    detail: str = ""

    def percentile_us(self, fraction: float) -> float:
        ordered = sorted(self.latencies_us)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    @property
    def sent_per_s(self) -> float:
        return self.sent / max(self.send_duration_s, 1e-9)


@dataclass
class LatencyRecorder:
    """Collects one latency per probe; the first ``warmup`` probes (by sequence) are dropped."""

    warmup: int
    latencies_us: list[float] = field(default_factory=list)
    received: int = 0

    def record(self, payload: bytes, received_ns: int) -> None:
        self.received += 1
        sent_ns, sequence = probe_fields(payload)
        if sequence >= self.warmup:
            self.latencies_us.append((received_ns - sent_ns) / 1000)


PROBE_HEADER = struct.Struct(">qq")
"""A latency probe starts with the sender's ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared
by every process on the host) and its sequence number."""


def probe_payload(sequence: int, payload_bytes: int) -> bytes:
    """A latency probe: send time (ns, monotonic), sequence number, padding to ``payload_bytes``."""
    header = PROBE_HEADER.pack(time.perf_counter_ns(), sequence)
    return header + b"p" * max(0, payload_bytes - len(header))


def probe_fields(payload: bytes) -> tuple[int, int]:
    sent_ns, sequence = PROBE_HEADER.unpack_from(payload)
    return sent_ns, sequence


def paced_due_s(started_s: float, index: int, rate_per_s: int) -> float:
    """When message ``index`` is due (``time.perf_counter`` seconds) at ``rate_per_s``."""
    return started_s + index / rate_per_s


def seconds_until(due_s: float) -> float:
    return max(0.0, due_s - time.perf_counter())


def percentile_label(latency: Latency) -> str:
    return f"p50 {latency.percentile_us(0.50):,.0f} µs, p99 {latency.percentile_us(0.99):,.0f} µs"


@dataclass(frozen=True)
class DiskProbe:
    """Latencies (µs) of appending a small record and fdatasync'ing it: the floor under every
    durable acknowledgement (Redis with ``appendfsync always``, Magnetar's journal)."""

    latencies_us: list[float]
    duration_s: float

    def percentile_us(self, fraction: float) -> float:
        ordered = sorted(self.latencies_us)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")

    @property
    def ops_per_s(self) -> float:
        return len(self.latencies_us) / max(self.duration_s, 1e-9)


def probe_disk(work_dir: Path, duration_s: float) -> DiskProbe:
    started = time.perf_counter()
    latencies_s = append_sync_loop(work_dir / "fsync-probe", b"r" * DISK_PROBE_RECORD_BYTES, duration_s)
    return DiskProbe([s * 1e6 for s in latencies_s], time.perf_counter() - started)


# --- processes ----------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's ephemeral choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its threads (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    utime_ticks, stime_ticks = int(fields[11]), int(fields[12])
    return (utime_ticks + stime_ticks) / os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """A server running as a child process; its output goes to ``log_path``."""

    def __init__(self, name: str, argv: list[str], port: int, log_path: Path, cwd: Path | None = None) -> None:
        self.name = name
        self.port = port
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd,
                                        start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_s(self) -> float:
        return process_cpu_s(self.pid)

    def log_tail(self) -> str:
        with suppress(OSError):
            data = self.log_path.read_bytes()
            return data[-LOG_TAIL_BYTES:].decode(errors="replace")
        return ""

    def wait_for_port(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once the server accepts TCP connections; raise if it exits or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            with socket.socket() as sock:
                sock.settimeout(POLL_INTERVAL_S * 4)
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(POLL_INTERVAL_S)
        raise RuntimeError(f"{self.name} did not listen on port {self.port} within {timeout_s:.0f} s:\n"
                           f"{self.log_tail()}")

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with code {code}:\n{self.log_tail()}")

    def stop(self) -> int | None:
        """SIGTERM, wait up to ``STOP_TIMEOUT_S``, then SIGKILL; return the exit code."""
        if self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)
        self._log.close()
        return self.process.returncode


def started(server: ServerProcess, wait: Callable[[ServerProcess], None]) -> ServerProcess:
    """``server`` once ``wait`` says it is ready; stopped (by PID) if it never gets there."""
    try:
        wait(server)
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    """Stop ``server`` by its PID when the block ends, however it ends."""
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def measured_cpu(server: ServerProcess, out: list[CpuSpent]) -> Iterator[None]:
    """Append the CPU the block cost ``server``, this process and everything else to ``out``."""
    server_before_s, client_before_s = server.cpu_s(), time.process_time()
    busy_before_s, started_s = system_busy_cpu_s(), time.perf_counter()
    try:
        yield
    finally:
        server_s, client_s = server.cpu_s() - server_before_s, time.process_time() - client_before_s
        other_s = system_busy_cpu_s() - busy_before_s - server_s - client_s
        out.append(CpuSpent(server_s, client_s, other_s, time.perf_counter() - started_s))
