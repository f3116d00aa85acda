"""Helpers shared by the benchmarks in ``bench/``: baselines, threads, profiles, the report.

Role: every benchmark measures an anchor (the raw disk, an in-memory loop) in the same run as
the component, prints a markdown table of :class:`Row` and can write it into one section of
``bench/RESULTS.md`` without touching the other sections. What is here is independent of the
component measured. MB means 10^6 bytes.
"""

from __future__ import annotations

import cProfile
import datetime
import os
import platform
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KiB = 1024
MiB = 1024 * KiB
MB = 1_000_000
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORK_ROOT = REPO_ROOT / ".bench-tmp"
BASELINE_OPS_MAX = 1_000_000
DROP_CACHES_PATH = "/proc/sys/vm/drop_caches"
PROC_IO_PATH = "/proc/self/io"
PROC_STAT_PATH = "/proc/stat"


@dataclass(frozen=True)
class Row:
    measure: str
    value: str
    ratio: str
    note: str


# --- physical baseline ------------------------------------------------------------------


def append_sync_loop(path: Path, chunk: bytes, duration_s: float) -> list[float]:
    """Append ``chunk`` and fdatasync until ``duration_s`` passes; return each op's latency."""
    latencies_s: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        deadline = time.perf_counter() + duration_s
        while time.perf_counter() < deadline and len(latencies_s) < BASELINE_OPS_MAX:
            started = time.perf_counter()
            os.write(fd, chunk)
            os.fdatasync(fd)
            latencies_s.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return latencies_s


def measure_chunk_mb_per_s(work_dir: Path, duration_s: float) -> float:
    """Raw 1 MiB append + fdatasync throughput on the filesystem holding ``work_dir``."""
    latencies_s = append_sync_loop(work_dir / "baseline-1m", os.urandom(1 * MiB), duration_s)
    return len(latencies_s) * MiB / sum(latencies_s) / MB


# --- operating system ---------------------------------------------------------------------


def process_io_bytes() -> tuple[int, int]:
    """Bytes this process has read from and written to the storage layer (0, 0 if unknown)."""
    try:
        with open(PROC_IO_PATH) as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
    except OSError:
        return 0, 0
    return int(fields["read_bytes"]), int(fields["write_bytes"])


def system_busy_cpu_s() -> float:
    """CPU seconds every process has spent busy since boot (0.0 if unknown)."""
    try:
        with open(PROC_STAT_PATH) as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    idle_ticks = sum(ticks[3:5])  # idle, iowait
    return (sum(ticks) - idle_ticks) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuShare:
    """CPU used during a run by this process and by everything else on the machine."""

    own_cpu_s: float
    other_cpu_s: float
    wall_s: float

    @property
    def other_share(self) -> float:
        """Fraction of the machine's CPU capacity other processes used."""
        return max(0.0, self.other_cpu_s) / max(1e-9, self.wall_s * (os.cpu_count() or 1))


@contextmanager
def cpu_share() -> Iterator[list[CpuShare]]:
    """Measure the block's CPU use; the result is appended to the yielded list at the end."""
    out: list[CpuShare] = []
    busy_before_s, own_before_s, started = system_busy_cpu_s(), time.process_time(), time.perf_counter()
    try:
        yield out
    finally:
        own_s = time.process_time() - own_before_s
        other_s = system_busy_cpu_s() - busy_before_s - own_s
        out.append(CpuShare(own_s, other_s, time.perf_counter() - started))


def drop_page_cache() -> str:
    """Flush dirty pages and drop the OS page cache; return what happened."""
    os.sync()
    try:
        with open(DROP_CACHES_PATH, "w") as f:
            f.write("1\n")
    except OSError as exc:
        return f"page cache NOT dropped ({exc.strerror or exc}); reads may be served from RAM"
    return "page cache dropped"


@contextmanager
def scratch_dir(work_root: Path, prefix: str) -> Iterator[Path]:
    """A new directory under ``work_root``, removed afterwards (and the default root with it
    when it is left empty)."""
    work_root.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=work_root))
    try:
        yield work_dir
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
        if work_root == DEFAULT_WORK_ROOT and not any(work_root.iterdir()):
            work_root.rmdir()


# --- threads and profiles -------------------------------------------------------------------


def run_threads(targets: list[Callable[[], None]]) -> float:
    """Start every target together; return the seconds until the last one finished. An
    exception in any target is raised here."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets) + 1)

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            barrier.wait()
            try:
                target()
            except BaseException as exc:
                errors.append(exc)

        return body

    threads = [threading.Thread(target=wrap(t), name=f"bench-{i}") for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    duration_s = time.perf_counter() - started
    if errors:
        raise errors[0]
    return duration_s


@contextmanager
def profile_threads() -> Iterator[list[cProfile.Profile]]:
    """Profile every thread started inside the block (the storage's own threads included)."""
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()
    original_run = threading.Thread.run

    def profiled_run(thread: threading.Thread) -> None:
        profile = cProfile.Profile()
        with lock:
            profiles.append(profile)
        profile.enable()
        try:
            original_run(thread)
        finally:
            profile.disable()

    threading.Thread.run = profiled_run  # type: ignore[method-assign, assignment]
    try:
        yield profiles
    finally:
        threading.Thread.run = original_run  # type: ignore[method-assign]


# --- report -------------------------------------------------------------------------------


def render_table(rows: list[Row]) -> str:
    lines = ["| measure | value | ratio | notes |", "|---|---|---|---|"]
    lines += [f"| {r.measure} | {r.value} | {r.ratio} | {r.note} |" for r in rows]
    return "\n".join(lines)


def machine_summary(work_dir: Path) -> str:
    return (f"{os.cpu_count()} cores, {platform.system()} {platform.release()}, Python "
            f"{platform.python_version()}, data on {filesystem_of(work_dir)}")


def filesystem_of(path: Path) -> str:
    """The device and filesystem type holding ``path`` (longest matching mount point)."""
    best = ("?", "?", "")
    resolved = str(path.resolve())
    with open("/proc/mounts") as f:
        for line in f:
            device, mount_point, fs_type = line.split()[:3]
            if resolved.startswith(mount_point) and len(mount_point) >= len(best[2]):
                best = (device, fs_type, mount_point)
    return f"{best[0]} ({best[1]})"


def render_section(heading: str, command: str, machine: str, config: str, table: str) -> str:
    """A RESULTS.md section: heading, how it was produced, then the table."""
    today = datetime.date.today().isoformat()
    return (f"{heading}\n\n"
            f"- command: `{command}` (from the repository root)\n"
            f"- date: {today}\n"
            f"- machine: {machine}\n"
            f"- config: {config}\n\n"
            f"{table}\n")


def replace_section(path: Path, heading: str, section: str) -> None:
    """Write ``section`` into ``path``, replacing only an existing section with ``heading``."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        path.write_text(text.rstrip("\n") + "\n\n" + section)
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + section + ("\n" + tail if tail else ""))


def command_line() -> str:
    executable = os.path.relpath(sys.executable, Path.cwd())
    return shlex.join([executable, *sys.argv])


def report(heading: str, machine: str, config: str, table: str, out: Path | None, *,
           shown_machine: str | None = None, show_config: bool = False) -> None:
    """Print a benchmark's table; with ``out``, replace its section (``heading``) of that
    markdown file with the table, the machine, the configuration and the command line."""
    print()
    print(f"machine: {shown_machine or machine}")
    if show_config:
        print(f"config: {config}")
    print(table)
    if out is not None:
        replace_section(out, heading, render_section(heading, command_line(), machine, config, table))
        print(f"\nwrote section {heading!r} to {out}")
