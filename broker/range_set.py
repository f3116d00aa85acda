"""RangeSet: a set of integers kept as sorted, disjoint, non-adjacent half-open ranges.

Used by cursors for individually acknowledged offsets above the mark-delete offset, so a
million acks with few holes cost a few ranges. All operations are O(log n + merged ranges).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator


class RangeSet:
    def __init__(self, ranges: list[tuple[int, int]] | None = None) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in ranges or []:
            self.add(start, end)

    def add(self, start: int, end: int) -> None:
        """Add ``[start, end)``, merging with overlapping or adjacent ranges."""
        if end <= start:
            return
        left = bisect.bisect_left(self._ends, start)  # first range ending at or after start
        right = bisect.bisect_right(self._starts, end)  # ranges starting at or before end
        if left < right:
            start = min(start, self._starts[left])
            end = max(end, self._ends[right - 1])
        self._starts[left:right] = [start]
        self._ends[left:right] = [end]

    def __contains__(self, value: int) -> bool:
        at = bisect.bisect_right(self._starts, value) - 1
        return at >= 0 and value < self._ends[at]

    def covers(self, start: int, end: int) -> bool:
        """True when every value of ``[start, end)`` is in the set."""
        at = bisect.bisect_right(self._starts, start) - 1
        return at >= 0 and end <= self._ends[at]

    def count_in(self, start: int, end: int) -> int:
        """How many values of ``[start, end)`` are in the set."""
        total = 0
        at = max(0, bisect.bisect_right(self._ends, start))
        while at < len(self._starts) and self._starts[at] < end:
            total += min(end, self._ends[at]) - max(start, self._starts[at])
            at += 1
        return total

    def discard_below(self, value: int) -> None:
        """Forget every value ``< value``."""
        at = bisect.bisect_right(self._ends, value)
        del self._starts[:at]
        del self._ends[:at]
        if self._starts and self._starts[0] < value:
            self._starts[0] = value

    def first_range(self) -> tuple[int, int] | None:
        return (self._starts[0], self._ends[0]) if self._starts else None

    def pop_first(self) -> tuple[int, int]:
        return self._starts.pop(0), self._ends.pop(0)

    def ranges(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)

    def total(self) -> int:
        return sum(e - s for s, e in self.ranges())

    def __len__(self) -> int:
        return len(self._starts)

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()
