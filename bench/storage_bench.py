"""Storage benchmark: the embedded bookie measured against the raw disk it runs on, in one run.

Role: the anchor for ``storage/`` is the physical disk, so this script first measures plain
``os.write`` + ``os.fdatasync`` on the same filesystem as the bookie's data directory, then the
bookie itself, and prints each figure with its ratio to that baseline:

1. baseline: 1 MiB append + fdatasync (MB/s) and 4 KiB append + fdatasync (ops/s, p50 latency);
2. durable ``LedgerStorage.add_entries`` of one entry at 100 B, 1 KiB and 64 KiB payloads: several writer
   threads, each on its own ledger, each keeping a bounded window of outstanding futures and
   counting only acknowledged (durable) entries; journal fsyncs show the group commit;
3. cold catch-up read: one ledger written, flushed, the storage closed and reopened (empty read
   cache), the OS page cache dropped when permitted, then every entry read in order;
4. tail read: one reader following the last add confirmed of a ledger a writer is appending to.

Every phase is bounded by a duration and every queue by a window. MB means 10^6 bytes.
Run from the repository root: ``.venv/bin/python bench/storage_bench.py [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from common import (
    DEFAULT_WORK_ROOT,
    MB,
    KiB,
    MiB,
    Row,
    append_sync_loop,
    drop_page_cache,
    machine_summary,
    process_io_bytes,
    profile_threads,
    render_table,
    report,
    run_threads,
    scratch_dir,
)

from storage import LedgerStorage, StorageConfig, WriteCacheFull

SECTION_HEADING = "## Storage (bench/storage_bench.py)"
TARGET_64K_RATIO = 0.7
TARGET_100B_ENTRIES_PER_S = 100_000
WRITE_PAYLOADS_BYTES = (100, 1 * KiB, 64 * KiB)
DEADLINE_CHECK_ENTRIES = 128
ACK_TIMEOUT_S = 60.0
ENTRIES_UNBOUNDED = 2**62
"""Writers bounded by duration only."""
CONFIG_NOTE = "`StorageConfig.production()`; MB = 10^6 bytes"


@dataclass(frozen=True)
class Plan:
    """The bounds of one run."""

    baseline_duration_s: float
    write_duration_s: float
    writer_threads: int
    window_entries_max: int
    window_bytes_max: int
    catch_up_bytes: int
    catch_up_payload_bytes: int
    catch_up_write_duration_s_max: float
    tail_duration_s: float
    tail_payload_bytes: int


NORMAL_PLAN = Plan(baseline_duration_s=3.0, write_duration_s=8.0, writer_threads=4, window_entries_max=1000,
                   window_bytes_max=16 * MiB, catch_up_bytes=200 * MB, catch_up_payload_bytes=1 * KiB,
                   catch_up_write_duration_s_max=40.0, tail_duration_s=5.0, tail_payload_bytes=1 * KiB)
QUICK_PLAN = Plan(baseline_duration_s=1.0, write_duration_s=1.5, writer_threads=4, window_entries_max=1000,
                  window_bytes_max=16 * MiB, catch_up_bytes=20 * MB, catch_up_payload_bytes=1 * KiB,
                  catch_up_write_duration_s_max=5.0, tail_duration_s=1.5, tail_payload_bytes=1 * KiB)


# --- physical baseline ------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    chunk_mb_per_s: float
    small_ops_per_s: float
    small_p50_us: float


@dataclass(frozen=True)
class BaselinePair:
    """The baseline measured before and after the storage phases: a shared disk drifts, and
    the ratios use the mean of the two."""

    first: Baseline
    last: Baseline

    @property
    def chunk_mb_per_s(self) -> float:
        return (self.first.chunk_mb_per_s + self.last.chunk_mb_per_s) / 2


def measure_baseline(work_dir: Path, duration_s: float) -> Baseline:
    chunk_latencies_s = append_sync_loop(work_dir / "baseline-1m", os.urandom(1 * MiB), duration_s)
    small_latencies_s = append_sync_loop(work_dir / "baseline-4k", os.urandom(4 * KiB), duration_s)
    small_latencies_s.sort()
    return Baseline(
        chunk_mb_per_s=len(chunk_latencies_s) * MiB / sum(chunk_latencies_s) / MB,
        small_ops_per_s=len(small_latencies_s) / sum(small_latencies_s),
        small_p50_us=small_latencies_s[len(small_latencies_s) // 2] * 1e6,
    )


# --- pipelined durable writers ----------------------------------------------------------


@dataclass
class WriterTally:
    acked_entries: int = 0
    cache_full_rejections: int = 0


def window_entries(plan: Plan, payload_bytes: int) -> int:
    """Outstanding futures per writer: bounded by count and by bytes."""
    return max(1, min(plan.window_entries_max, plan.window_bytes_max // payload_bytes))


def pipelined_write(st: LedgerStorage, ledger_id: int, payload: bytes, *, window: int, deadline_s: float,
                    entries_max: int, tally: WriterTally) -> None:
    """Add entries until ``deadline_s`` (monotonic, checked every ``DEADLINE_CHECK_ENTRIES``
    adds) or ``entries_max``, keeping at most ``window`` futures outstanding; wait for every one
    of them before returning. Counters are local so the harness costs little per entry."""
    pending: deque[Future[int]] = deque()
    add, wait_oldest, append = st.add_entries, pending.popleft, pending.append
    entry_id = acked = rejected = 0
    while entry_id < entries_max and (entry_id % DEADLINE_CHECK_ENTRIES or time.monotonic() < deadline_s):
        if len(pending) >= window:
            wait_oldest().result(timeout=ACK_TIMEOUT_S)
            acked += 1
        try:
            append(add(ledger_id, (entry_id,), (payload,)))
        except WriteCacheFull:
            rejected += 1
            if time.monotonic() >= deadline_s:
                break
            continue
        entry_id += 1
    while pending:
        wait_oldest().result(timeout=ACK_TIMEOUT_S)
        acked += 1
    tally.acked_entries += acked
    tally.cache_full_rejections += rejected


@dataclass(frozen=True)
class WriteResult:
    payload_bytes: int
    writer_threads: int
    window_entries: int
    acked_entries: int
    duration_s: float
    fsyncs: int
    fsync_mean_us: float
    cache_full_rejections: int
    disk_write_bytes: int
    cpu_s: float
    """Process CPU time (all threads, user + system) spent during the run."""

    @property
    def entries_per_s(self) -> float:
        return self.acked_entries / self.duration_s

    @property
    def mb_per_s(self) -> float:
        return self.entries_per_s * self.payload_bytes / MB

    @property
    def entries_per_fsync(self) -> float:
        return self.acked_entries / max(1, self.fsyncs)

    @property
    def cpu_us_per_entry(self) -> float:
        return self.cpu_s / max(1, self.acked_entries) * 1e6

    @property
    def write_amplification(self) -> float:
        """Bytes sent to disk (journal, entry logs, index) per payload byte acknowledged."""
        return self.disk_write_bytes / max(1, self.acked_entries * self.payload_bytes)


def measure_writes(st: LedgerStorage, plan: Plan, payload_bytes: int, duration_s: float,
                   first_ledger_id: int = 1) -> WriteResult:
    payload = os.urandom(payload_bytes)
    window = window_entries(plan, payload_bytes)
    tallies = [WriterTally() for _ in range(plan.writer_threads)]
    journal_before = st.statistics().journal
    _, written_before_bytes = process_io_bytes()
    cpu_before_s = time.process_time()
    deadline_s = time.monotonic() + duration_s
    targets: list[Callable[[], None]] = [
        partial(pipelined_write, st, first_ledger_id + i, payload, window=window, deadline_s=deadline_s,
                entries_max=ENTRIES_UNBOUNDED, tally=tallies[i])
        for i in range(plan.writer_threads)
    ]
    elapsed_s = run_threads(targets)
    journal_after = st.statistics().journal
    _, written_after_bytes = process_io_bytes()
    cpu_s = time.process_time() - cpu_before_s
    fsyncs = journal_after.fsync_count - journal_before.fsync_count
    fsync_s = journal_after.fsync_seconds_total - journal_before.fsync_seconds_total
    return WriteResult(payload_bytes, plan.writer_threads, window, sum(t.acked_entries for t in tallies),
                       elapsed_s, fsyncs, fsync_s / max(1, fsyncs) * 1e6,
                       sum(t.cache_full_rejections for t in tallies), written_after_bytes - written_before_bytes,
                       cpu_s)


@contextmanager
def fresh_storage(work_dir: Path, config: StorageConfig) -> Iterator[LedgerStorage]:
    """A storage in a new directory, closed and deleted afterwards."""
    data_dir = Path(tempfile.mkdtemp(prefix="storage-", dir=work_dir))
    st = LedgerStorage.open(str(data_dir), config)
    try:
        yield st
    finally:
        st.close()
        shutil.rmtree(data_dir, ignore_errors=True)


# --- cold catch-up read -----------------------------------------------------------------


@dataclass(frozen=True)
class CatchUpResult:
    entries: int
    payload_bytes: int
    write_duration_s: float
    reopen_duration_s: float
    read_duration_s: float
    read_cache_hit_ratio: float
    entry_log_reads: int
    disk_read_bytes: int
    page_cache: str

    @property
    def read_amplification(self) -> float:
        """Bytes fetched from disk per payload byte read."""
        return self.disk_read_bytes / max(1, self.entries * self.payload_bytes)

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.read_duration_s

    @property
    def mb_per_s(self) -> float:
        return self.entries_per_s * self.payload_bytes / MB


def read_all(st: LedgerStorage, ledger_id: int, entries: int, payload_bytes: int) -> float:
    """Read entries 0..entries-1 in order; return the seconds taken."""
    started = time.perf_counter()
    for entry_id in range(entries):
        if len(st.get_entry(ledger_id, entry_id)) != payload_bytes:
            raise AssertionError(f"entry {ledger_id}:{entry_id} has the wrong size")
    return time.perf_counter() - started


def measure_catch_up(work_dir: Path, plan: Plan, config: StorageConfig) -> CatchUpResult:
    ledger_id = 1
    payload_bytes = plan.catch_up_payload_bytes
    payload = os.urandom(payload_bytes)
    data_dir = Path(tempfile.mkdtemp(prefix="catch-up-", dir=work_dir))
    try:
        tally = WriterTally()
        with LedgerStorage.open(str(data_dir), config) as st:
            deadline_s = time.monotonic() + plan.catch_up_write_duration_s_max
            window = window_entries(plan, payload_bytes)
            write_duration_s = run_threads([partial(
                pipelined_write, st, ledger_id, payload, window=window, deadline_s=deadline_s,
                entries_max=plan.catch_up_bytes // payload_bytes, tally=tally)])
            st.flush()
        page_cache = drop_page_cache()
        started = time.perf_counter()
        with LedgerStorage.open(str(data_dir), config) as st:
            reopen_duration_s = time.perf_counter() - started
            drop_page_cache()  # reopening read the index and the journal tail back in
            read_before_bytes, _ = process_io_bytes()
            read_duration_s = read_all(st, ledger_id, tally.acked_entries, payload_bytes)
            disk_read_bytes = process_io_bytes()[0] - read_before_bytes
            stats = st.statistics()
        lookups = stats.read_cache.hits + stats.read_cache.misses
        return CatchUpResult(tally.acked_entries, payload_bytes, write_duration_s, reopen_duration_s,
                             read_duration_s, stats.read_cache.hits / max(1, lookups), stats.entry_logs.reads,
                             disk_read_bytes, page_cache)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


# --- tail read --------------------------------------------------------------------------


@dataclass(frozen=True)
class TailResult:
    payload_bytes: int
    reads: int
    written_entries: int
    duration_s: float
    write_cache_hit_ratio: float
    lag_entries_max: int
    busy_s: float

    @property
    def reads_per_s(self) -> float:
        return self.reads / self.duration_s

    @property
    def reads_per_busy_s(self) -> float:
        """What the reader sustains while it has entries to read (its ceiling)."""
        return self.reads / max(self.busy_s, 1e-9)


@dataclass
class TailTally:
    reads: int = 0
    lag_entries_max: int = 0
    busy_s: float = 0.0
    """Time spent in ``get_entry`` calls (not waiting for the writer)."""


def follow_tail(st: LedgerStorage, ledger_id: int, deadline_s: float, writer_done: threading.Event,
                tally: TailTally) -> None:
    """Read every entry up to the last add confirmed as it advances, until the writer is done
    and the reader has caught up (or the deadline plus a grace second passes)."""
    next_entry_id = 0
    hard_deadline_s = deadline_s + 1.0
    while time.monotonic() < hard_deadline_s:
        lac = st.get_last_add_confirmed(ledger_id) if st.ledger_exists(ledger_id) else -1
        if next_entry_id > lac:
            if writer_done.is_set():
                return
            time.sleep(0.0002)
            continue
        tally.lag_entries_max = max(tally.lag_entries_max, lac - next_entry_id + 1)
        started = time.perf_counter()
        while next_entry_id <= lac:
            st.get_entry(ledger_id, next_entry_id)
            next_entry_id += 1
            tally.reads += 1
        tally.busy_s += time.perf_counter() - started


def measure_tail(st: LedgerStorage, plan: Plan) -> TailResult:
    ledger_id = 1
    payload = os.urandom(plan.tail_payload_bytes)
    window = window_entries(plan, plan.tail_payload_bytes)
    deadline_s = time.monotonic() + plan.tail_duration_s
    writer_done = threading.Event()
    write_tally, read_tally = WriterTally(), TailTally()

    def write() -> None:
        try:
            pipelined_write(st, ledger_id, payload, window=window, deadline_s=deadline_s,
                            entries_max=ENTRIES_UNBOUNDED, tally=write_tally)
        finally:
            writer_done.set()

    hits_before = st.statistics().read_path
    duration_s = run_threads([write, lambda: follow_tail(st, ledger_id, deadline_s, writer_done, read_tally)])
    hits = st.statistics().read_path
    cache_hits = (hits.write_cache_hits - hits_before.write_cache_hits
                  + hits.flushing_cache_hits - hits_before.flushing_cache_hits)
    return TailResult(plan.tail_payload_bytes, read_tally.reads, write_tally.acked_entries, duration_s,
                      cache_hits / max(1, read_tally.reads), read_tally.lag_entries_max, read_tally.busy_s)


# --- profiling ----------------------------------------------------------------------------


def run_profile(work_dir: Path, plan: Plan, config: StorageConfig, functions_max: int) -> None:
    """Profile the 100 B durable write case across all threads; print the top functions."""
    with profile_threads() as profiles, fresh_storage(work_dir, config) as st:
        result = measure_writes(st, plan, 100, plan.write_duration_s)
    print(f"100 B under cProfile: {result.entries_per_s:,.0f} entries/s "
          f"({result.entries_per_fsync:,.0f} entries/fsync), {len(profiles)} threads profiled")
    stats = pstats.Stats(*profiles)
    stats.sort_stats("tottime").print_stats(functions_max)


# --- report -------------------------------------------------------------------------------


def baseline_rows(baseline: BaselinePair) -> list[Row]:
    first, last = baseline.first, baseline.last
    return [
        Row("raw append + fdatasync, 1 MiB chunks", f"{baseline.chunk_mb_per_s:,.0f} MB/s", "1.00x (baseline)",
            f"os.write + os.fdatasync on the same filesystem; mean of {first.chunk_mb_per_s:,.0f} (before) "
            f"and {last.chunk_mb_per_s:,.0f} (after)"),
        Row("raw append + fdatasync, 4 KiB", f"{first.small_ops_per_s:,.0f} ops/s", "-",
            f"p50 {first.small_p50_us:,.0f} µs (after: {last.small_ops_per_s:,.0f} ops/s, "
            f"p50 {last.small_p50_us:,.0f} µs)"),
    ]


def write_row(result: WriteResult, baseline: BaselinePair) -> Row:
    size = f"{result.payload_bytes // KiB} KiB" if result.payload_bytes >= KiB else f"{result.payload_bytes} B"
    value = f"{result.entries_per_s:,.0f} entries/s, {result.mb_per_s:,.1f} MB/s"
    if result.payload_bytes == 100:
        ratio = f"{result.entries_per_s / TARGET_100B_ENTRIES_PER_S:.2f}x of 100k entries/s target"
    else:
        ratio = f"{result.mb_per_s / baseline.chunk_mb_per_s:.2f}x raw MB/s"
        if result.payload_bytes == 64 * KiB:
            ratio += f" (target >= {TARGET_64K_RATIO}x)"
    writers = f"{result.writer_threads} writer{'s' if result.writer_threads > 1 else ''}"
    note = (f"{writers} x window {result.window_entries}; "
            f"{result.fsyncs:,} fsyncs, {result.entries_per_fsync:,.0f} entries/fsync, "
            f"mean fsync {result.fsync_mean_us:,.0f} µs; CPU {result.cpu_us_per_entry:,.1f} µs/entry; "
            f"disk bytes written / payload ≈{result.write_amplification:.2f}")
    if result.cache_full_rejections:
        note += f"; {result.cache_full_rejections} WriteCacheFull"
    return Row(f"durable add {size}, {writers}", value, ratio, note)


def read_rows(catch_up: CatchUpResult, tail: TailResult, baseline: BaselinePair) -> list[Row]:
    return [
        Row(f"cold catch-up get_entry {catch_up.payload_bytes // KiB} KiB",
            f"{catch_up.entries_per_s:,.0f} entries/s, {catch_up.mb_per_s:,.1f} MB/s",
            f"{catch_up.mb_per_s / baseline.chunk_mb_per_s:.2f}x raw write MB/s",
            f"{catch_up.entries:,} entries ({catch_up.entries * catch_up.payload_bytes / MB:,.0f} MB, written in "
            f"{catch_up.write_duration_s:.1f} s); "
            f"read cache hit ratio {catch_up.read_cache_hit_ratio:.3f}; {catch_up.entry_log_reads:,} entry-log "
            f"reads; disk bytes read / payload {catch_up.read_amplification:.2f}; "
            f"reopen {catch_up.reopen_duration_s:.2f} s; {catch_up.page_cache}"),
        Row(f"tail get_entry {tail.payload_bytes // KiB} KiB (1 reader, 1 writer)",
            f"{tail.reads_per_s:,.0f} reads/s", "-",
            f"bounded by the writer ({tail.written_entries / tail.duration_s:,.0f} entries/s acked); "
            f"{tail.reads_per_busy_s:,.0f} reads per busy second; "
            f"write-cache hit ratio {tail.write_cache_hit_ratio:.3f}; max lag {tail.lag_entries_max:,} entries"),
    ]


# --- main -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (about 20 s)")
    parser.add_argument("--out", type=Path, help="write the table into this markdown file's storage section")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_ROOT,
                        help="scratch directory on the filesystem to measure (removed afterwards)")
    parser.add_argument("--profile", action="store_true",
                        help="only profile the 100 B write case (all threads) and print the top functions")
    parser.add_argument("--profile-functions", type=int, default=15)
    return parser.parse_args(argv)


def run_writes(work_dir: Path, plan: Plan, config: StorageConfig) -> list[WriteResult]:
    """Every payload size with ``plan.writer_threads`` writers, then 100 B with one writer (the
    single-thread figure shows what the concurrent writers gain or lose)."""
    cases = [(plan, payload_bytes) for payload_bytes in WRITE_PAYLOADS_BYTES]
    cases.append((dataclasses.replace(plan, writer_threads=1), 100))
    results: list[WriteResult] = []
    for case_plan, payload_bytes in cases:
        print(f"durable writes, {payload_bytes} B, {case_plan.writer_threads} writer(s) ...", flush=True)
        with fresh_storage(work_dir, config) as st:
            results.append(measure_writes(st, case_plan, payload_bytes, plan.write_duration_s))
    return results


def run_all(work_dir: Path, plan: Plan, config: StorageConfig) -> list[Row]:
    print("baseline (before) ...", flush=True)
    first = measure_baseline(work_dir, plan.baseline_duration_s)
    writes = run_writes(work_dir, plan, config)
    print("cold catch-up ...", flush=True)
    catch_up = measure_catch_up(work_dir, plan, config)
    print("tail read ...", flush=True)
    with fresh_storage(work_dir, config) as st:
        tail = measure_tail(st, plan)
    print("baseline (after) ...", flush=True)
    baseline = BaselinePair(first, measure_baseline(work_dir, plan.baseline_duration_s))
    return [*baseline_rows(baseline), *(write_row(w, baseline) for w in writes),
            *read_rows(catch_up, tail, baseline)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK_PLAN if args.quick else NORMAL_PLAN
    config = StorageConfig.production()
    with scratch_dir(args.work_dir, "storage-bench-") as work_dir:
        if args.profile:
            run_profile(work_dir, plan, config, args.profile_functions)
            return 0
        table = render_table(run_all(work_dir, plan, config))
        machine = machine_summary(work_dir)
    report(SECTION_HEADING, machine, CONFIG_NOTE, table, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
