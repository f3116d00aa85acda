"""Managed-ledger benchmark: batched 100 B messages published and read back, against anchors.

Role: measures, in one run, the broker's topic storage (``ManagedLedger`` over the real
stack: ``LedgerStorage`` with ``StorageConfig.production()``, ``LocalBookie``,
``BookieClient``, RocksDB metadata store, ``LedgerManager``, ``EntryCache``) and prints every
figure with its ratio to anchors measured in the same run:

1. anchors: raw 1 MiB append + fdatasync on the data directory's filesystem (MB/s, before and
   after the broker phases; ratios use the mean), and the interpreter's ceiling for touching
   messages: iterating a list of pre-built 100 B messages (as many as the catch-up reads);
2. publish: one publisher, ``ManagedLedger.append`` of entries of 1000 x 100 B messages
   (Pulsar's batch format) with a bounded window of outstanding futures, once encoding every
   entry with ``encode_entry`` and once with pre-encoded entries;
3. cold catch-up: everything published is flushed, the stack closed and reopened (empty entry
   cache and storage read cache), the OS page cache dropped when permitted, then a durable
   cursor reads from the earliest message with ``read_entries(100)`` until nothing is left,
   counting messages per entry from its offsets and acknowledging cumulatively each batch (as
   Pulsar's dispatcher forwards entries without decoding them); then the same cold read once
   more decoding every entry with ``decode_entry`` and touching every message;
4. tail read: a cursor following a publisher, served from the broker's entry cache.

Every phase is bounded by a duration and a message count. MB means 10^6 bytes (entry bytes as
stored, i.e. messages with their per-message metadata). The stack and the phases' measurements
are ``managed_ledger_phases.py``; this script runs them and reports.
Run from the repository root: ``.venv/bin/python bench/managed_ledger_bench.py [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from dataclasses import dataclass
from pathlib import Path

from common import (
    DEFAULT_WORK_ROOT,
    Row,
    cpu_share,
    machine_summary,
    measure_chunk_mb_per_s,
    render_table,
    report,
    scratch_dir,
)
from managed_ledger_phases import (
    READ_BATCH_ENTRIES,
    TOPIC,
    CatchUpResult,
    MemoryResult,
    Plan,
    PublishResult,
    TailResult,
    measure_catch_up,
    measure_memory_ceiling,
    measure_publish,
    measure_tail,
    stack_at,
)

SECTION_HEADING = "## Managed ledger (bench/managed_ledger_bench.py)"
CONFIG_NOTE = ("`StorageConfig.production()`, `ManagedLedgerConfig()`, entry cache 256 MiB (1 s age limit); "
               "MB = 10^6 bytes of stored entries")
TARGET_CATCH_UP_MESSAGES_PER_S = 1_000_000

NORMAL_PLAN = Plan(baseline_duration_s=3.0, publish_window_entries=64, encoding_publish_duration_s=8.0,
                   encoding_publish_messages_max=5_000_000, pre_encoded_publish_duration_s=8.0,
                   pre_encoded_publish_messages_max=10_000_000, decode_read_duration_s=12.0, tail_duration_s=5.0)
QUICK_PLAN = Plan(baseline_duration_s=0.5, publish_window_entries=64, encoding_publish_duration_s=1.5,
                  encoding_publish_messages_max=1_000_000, pre_encoded_publish_duration_s=1.5,
                  pre_encoded_publish_messages_max=2_000_000, decode_read_duration_s=2.5, tail_duration_s=1.5)


# --- report ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Results:
    disk_before_mb_per_s: float
    disk_after_mb_per_s: float
    memory: MemoryResult
    publishes: list[PublishResult]
    catch_up: CatchUpResult
    catch_up_decoding: CatchUpResult
    tail: TailResult

    @property
    def disk_mb_per_s(self) -> float:
        return (self.disk_before_mb_per_s + self.disk_after_mb_per_s) / 2


def anchor_rows(results: Results) -> list[Row]:
    memory = results.memory
    return [
        Row("raw append + fdatasync, 1 MiB chunks", f"{results.disk_mb_per_s:,.0f} MB/s", "1.00x (baseline)",
            f"os.write + os.fdatasync on the same filesystem; mean of {results.disk_before_mb_per_s:,.0f} (before) "
            f"and {results.disk_after_mb_per_s:,.0f} (after)"),
        Row("in-memory: iterate pre-built 100 B messages", f"{memory.messages_per_s:,.0f} msg/s",
            "1.00x (ceiling)",
            f"`for m in list: n += len(m)` over {memory.messages:,} distinct bytes objects (the catch-up's "
            f"message count; building the list took {memory.build_duration_s:.1f} s)"),
    ]


def publish_row(result: PublishResult, disk_mb_per_s: float) -> Row:
    how = "encode_entry per entry" if result.encoding else "pre-encoded entries"
    return Row(f"publish, 1000 x 100 B per entry, {how}",
               f"{result.messages_per_s:,.0f} msg/s, {result.entries_per_s:,.0f} entries/s, "
               f"{result.mb_per_s:,.1f} MB/s",
               f"{result.mb_per_s / disk_mb_per_s:.2f}x raw MB/s",
               f"1 publisher, window {result.window_entries} append futures; {result.messages:,} messages "
               f"in {result.duration_s:.1f} s; {result.fsyncs:,} journal fsyncs "
               f"({result.entries / max(1, result.fsyncs):,.1f} entries/fsync); "
               f"CPU {result.cpu_us_per_message:,.2f} µs/msg (all threads)")


def catch_up_row(result: CatchUpResult, results: Results) -> Row:
    target = f"{result.messages_per_s / TARGET_CATCH_UP_MESSAGES_PER_S:.2f}x of 1M msg/s target"
    memory = f"{result.messages_per_s / results.memory.messages_per_s:.2f}x in-memory"
    storage = result.storage
    where = (f"storage read cache hit ratio {result.storage_read_cache_hit_ratio:.3f}, "
             f"{storage.read_path.entry_log_reads:,} entry-log reads, disk bytes read / bytes delivered "
             f"{result.disk_read_bytes / max(1, result.entry_bytes):.2f}; "
             f"broker entry reads / entries delivered {result.broker_reads_per_entry:.2f}; "
             f"reopen {result.reopen_duration_s:.2f} s; {result.page_cache}")
    if result.decoding:
        return Row("cold catch-up through a cursor, decode_entry every entry",
                   f"{result.messages_per_s:,.0f} msg/s, {result.mb_per_s:,.1f} MB/s "
                   f"({result.payload_mb_per_s:,.1f} MB/s of payload)",
                   f"{target}; {memory}",
                   f"{result.messages:,} of {result.backlog_messages:,} messages in {result.duration_s:.1f} s "
                   f"(bounded by time); CRC verified, every message built and its payload touched; {where}")
    return Row("cold catch-up through a cursor (dispatch: entries not decoded)",
               f"{result.messages_per_s:,.0f} msg/s, {result.mb_per_s:,.1f} MB/s",
               f"{target}; {memory}; {result.mb_per_s / results.disk_mb_per_s:.2f}x raw write MB/s",
               f"read_entries({READ_BATCH_ENTRIES}) + ack_cumulative per batch, durable cursor from earliest; "
               f"{result.messages:,} messages ({result.entries:,} entries) in {result.duration_s:.2f} s; {where}")


def tail_row(tail: TailResult) -> Row:
    return Row("tail read through a cursor (1 reader, 1 publisher)", f"{tail.messages_per_s:,.0f} msg/s",
               f"{tail.read_messages / max(1, tail.published_messages):.2f}x of published",
               f"bounded by the publisher (pre-encoded, window 64: {tail.published_messages_per_s:,.0f} msg/s); "
               f"{tail.messages_per_busy_s:,.0f} msg per busy second of the reader; "
               f"entry cache hit ratio {tail.entry_cache_hit_ratio:.3f}; max lag {tail.lag_messages_max:,} messages")


def result_rows(results: Results) -> list[Row]:
    return [*anchor_rows(results), *(publish_row(p, results.disk_mb_per_s) for p in results.publishes),
            catch_up_row(results.catch_up, results), catch_up_row(results.catch_up_decoding, results),
            tail_row(results.tail)]


# --- main ------------------------------------------------------------------------------------


def run_publishes(data_dir: Path, plan: Plan) -> list[PublishResult]:
    """Both publish cases into one topic (the catch-up reads all of it); flushed on close."""
    results: list[PublishResult] = []
    with stack_at(data_dir) as stack:
        ml, _ = stack.open(TOPIC)
        for encoding in (True, False):
            print(f"publish, {'encoding every entry' if encoding else 'pre-encoded entries'} ...", flush=True)
            results.append(measure_publish(stack, ml, plan, encoding=encoding))
    return results


def run_all(work_dir: Path, plan: Plan) -> Results:
    data_dir = work_dir / "broker"
    print("baseline (before) ...", flush=True)
    disk_before_mb_per_s = measure_chunk_mb_per_s(work_dir, plan.baseline_duration_s)
    publishes = run_publishes(data_dir, plan)
    published_messages = sum(p.messages for p in publishes)
    print("in-memory ceiling ...", flush=True)
    memory = measure_memory_ceiling(published_messages)
    print("cold catch-up ...", flush=True)
    catch_up = measure_catch_up(data_dir, "catch-up", decoding=False, duration_s=float("inf"))
    if catch_up.messages != published_messages:
        raise AssertionError(f"catch-up read {catch_up.messages} messages, {published_messages} were published")
    print("cold catch-up, decoding ...", flush=True)
    decoding = measure_catch_up(data_dir, "catch-up-decode", decoding=True, duration_s=plan.decode_read_duration_s)
    print("tail read ...", flush=True)
    with stack_at(data_dir) as stack:
        tail = measure_tail(stack, plan)
    print("baseline (after) ...", flush=True)
    disk_after_mb_per_s = measure_chunk_mb_per_s(work_dir, plan.baseline_duration_s)
    return Results(disk_before_mb_per_s, disk_after_mb_per_s, memory, publishes, catch_up, decoding, tail)


def run_profile(work_dir: Path, plan: Plan, functions_max: int) -> None:
    """Publish pre-encoded entries, then profile the cold dispatch catch-up (the reading thread)."""
    data_dir = work_dir / "broker"
    with stack_at(data_dir) as stack:
        ml, _ = stack.open(TOPIC)
        published = measure_publish(stack, ml, plan, encoding=False)
    profile = cProfile.Profile()
    profile.enable()
    result = measure_catch_up(data_dir, "catch-up", decoding=False, duration_s=float("inf"))
    profile.disable()
    print(f"cold catch-up under cProfile: {result.messages_per_s:,.0f} msg/s over {published.messages:,} messages")
    pstats.Stats(profile).sort_stats("tottime").print_stats(functions_max)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (under 20 s)")
    parser.add_argument("--out", type=Path, help="write the table into this markdown file's managed-ledger section")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_ROOT,
                        help="scratch directory on the filesystem to measure (removed afterwards)")
    parser.add_argument("--profile", action="store_true",
                        help="only profile the cold catch-up read and print the top functions")
    parser.add_argument("--profile-functions", type=int, default=15)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK_PLAN if args.quick else NORMAL_PLAN
    with scratch_dir(args.work_dir, "managed-ledger-bench-") as work_dir:
        if args.profile:
            run_profile(work_dir, plan, args.profile_functions)
            return 0
        with cpu_share() as shares:
            rows = result_rows(run_all(work_dir, plan))
        share = shares[0]
        table = render_table(rows)
        machine = (f"{machine_summary(work_dir)}; CPU used outside this process (other processes, kernel "
                   f"threads): {share.other_share:.0%} of capacity during the run")
    report(SECTION_HEADING, machine, CONFIG_NOTE, table, args.out,
           shown_machine=f"{machine}; run took {share.wall_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
