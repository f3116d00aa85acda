"""Fixed-bucket latency histograms and the journal's fdatasync histogram.

Checks: an observation lands in the first bucket whose bound is at or above it (a bound is
inclusive), observations above every bound count only in ``count``; snapshots are cumulative,
monotone and agree with ``count`` and ``sum_seconds``, also while threads record; bad bounds are
refused; and a real journal records one observation per fdatasync, exposed through
``LedgerStorage.statistics()`` alongside the older per-field view.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from storage import LedgerStorage, StorageConfig
from storage.histogram import LatencyHistogram, LatencySnapshot
from storage.journal import FSYNC_BUCKETS_US


def assert_well_formed(snapshot: LatencySnapshot) -> None:
    counts = snapshot.cumulative_counts
    assert len(counts) == len(snapshot.bounds_us)
    assert all(a <= b for a, b in itertools.pairwise(counts)), counts
    assert not counts or counts[-1] <= snapshot.count


def test_observations_land_in_the_first_bucket_at_or_above_them() -> None:
    histogram = LatencyHistogram((100, 1_000, 10_000))
    for seconds in (0.000_010, 0.000_100, 0.000_101, 0.001, 0.005, 0.010, 0.5, 2.0):
        histogram.record(seconds)
    snapshot = histogram.snapshot()
    # ≤100 µs: 10 µs and exactly 100 µs; ≤1 ms: + 101 µs and exactly 1 ms; ≤10 ms: + 5 ms and 10 ms.
    assert snapshot.buckets_us() == ((100, 2), (1_000, 4), (10_000, 6))
    assert snapshot.count == 8  # 0.5 s and 2 s are above every bound: only in count (+Inf)
    assert snapshot.sum_seconds == pytest.approx(0.000_010 + 0.000_100 + 0.000_101 + 0.001 + 0.005 + 0.010 + 2.5)
    assert_well_formed(snapshot)


def test_an_empty_histogram_has_zero_buckets() -> None:
    snapshot = LatencyHistogram((1, 2)).snapshot()
    assert snapshot.buckets_us() == ((1, 0), (2, 0))
    assert snapshot.count == 0 and snapshot.sum_seconds == 0.0


@pytest.mark.parametrize("bounds", [(), (0, 10), (10, 10), (100, 50), (-5, 5)])
def test_bounds_must_be_positive_and_strictly_increasing(bounds: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        LatencyHistogram(bounds)


def test_snapshots_stay_consistent_while_threads_record() -> None:
    histogram = LatencyHistogram(FSYNC_BUCKETS_US)
    per_thread, threads_count = 2_000, 4
    stop = threading.Event()
    problems: list[str] = []

    def record(seed: int) -> None:
        for i in range(per_thread):
            histogram.record(((seed * 7919 + i * 104_729) % 200_000) / 1e6)

    def observe() -> None:
        while not stop.is_set():
            snapshot = histogram.snapshot()
            counts = snapshot.cumulative_counts
            if any(a > b for a, b in itertools.pairwise(counts)) or counts[-1] > snapshot.count:
                problems.append(repr(snapshot))
                return

    observer = threading.Thread(target=observe)
    observer.start()
    writers = [threading.Thread(target=record, args=(seed,)) for seed in range(threads_count)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=30)
    stop.set()
    observer.join(timeout=30)
    assert not problems
    final = histogram.snapshot()
    assert final.count == per_thread * threads_count
    assert_well_formed(final)


def test_journal_records_one_observation_per_fdatasync(data_dir: str) -> None:
    with LedgerStorage.open(data_dir, StorageConfig.test_min()) as storage:
        before = storage.statistics().journal
        for entry_id in range(20):  # one add at a time: every add is its own group and fdatasync
            storage.add_entries(1, [entry_id], [b"x" * 100]).result(timeout=10)
        after = storage.statistics().journal
    latency = after.fsync_latency
    assert latency.count == after.fsync_count >= before.fsync_count + 20
    assert latency.bounds_us == FSYNC_BUCKETS_US
    assert latency.buckets_us() == after.fsync_latency_buckets_us
    assert latency.sum_seconds == after.fsync_seconds_total > 0.0
    assert_well_formed(latency)


def test_journal_without_sync_records_no_fsync_latency(data_dir: str) -> None:
    with LedgerStorage.open(data_dir, StorageConfig.test_min().replace(journal_sync=False)) as storage:
        for entry_id in range(5):
            storage.add_entries(1, [entry_id], [b"y"]).result(timeout=10)
        journal = storage.statistics().journal
    assert journal.records_written >= 5
    assert journal.fsync_latency.count == 0 and journal.fsync_count == 0
    assert all(count == 0 for count in journal.fsync_latency.cumulative_counts)
