"""Fixed-bucket latency histograms for the storage hot paths (the journal's ``fdatasync``).

Role: a writer thread records how long one operation took; ``statistics()`` callers (the admin
API, ``/metrics``, benchmarks, tests) read a consistent snapshot. The buckets are fixed when the
histogram is made, so recording costs one binary search and one increment and memory never grows.

Invariants:
- Bucket upper bounds are positive, strictly increasing whole microseconds; an observation
  belongs to the first bucket whose bound is at or above it; anything above the last bound is
  counted only in ``count`` (Prometheus's ``+Inf`` bucket).
- A snapshot is taken under the histogram's lock, so its cumulative counts never decrease from
  one bucket to the next, the last of them is at most ``count``, and ``count`` and
  ``sum_seconds`` describe the same observations.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LatencySnapshot:
    bounds_us: tuple[int, ...]
    cumulative_counts: tuple[int, ...]
    """Observations at or under each bound, in bound order (cumulative, as Prometheus wants)."""
    count: int
    sum_seconds: float

    def buckets_us(self) -> tuple[tuple[int, int], ...]:
        """(upper bound in µs, observations at or under it) pairs."""
        return tuple(zip(self.bounds_us, self.cumulative_counts, strict=True))


class LatencyHistogram:
    """Thread-safe; ``record`` is cheap enough for a per-group call on the journal thread."""

    def __init__(self, bounds_us: Sequence[int]) -> None:
        bounds = tuple(bounds_us)
        if not bounds or bounds[0] <= 0 or any(b >= a for b, a in itertools.pairwise(bounds)):
            raise ValueError(f"histogram bounds must be positive and strictly increasing, not {bounds}")
        self._bounds_us = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last slot holds observations above every bound
        self._sum_seconds = 0.0
        self._lock = threading.Lock()

    @property
    def bounds_us(self) -> tuple[int, ...]:
        return self._bounds_us

    def record(self, seconds: float) -> None:
        index = bisect.bisect_left(self._bounds_us, seconds * 1e6)
        with self._lock:
            self._counts[index] += 1
            self._sum_seconds += seconds

    def snapshot(self) -> LatencySnapshot:
        with self._lock:
            counts = list(self._counts)
            total_seconds = self._sum_seconds
        cumulative: list[int] = []
        running = 0
        for count in counts[:-1]:
            running += count
            cumulative.append(running)
        return LatencySnapshot(self._bounds_us, tuple(cumulative), running + counts[-1], total_seconds)
