"""Position hints: where the entries of recent reads, and the entry after each, start; bounded,
oldest forgotten first; only ever true."""

from __future__ import annotations

import pytest

from broker.entry import Entry
from broker.message_id import Position
from broker.offset_index import LedgerInfo, PositionHints


def _run(ledger_id: int, first_entry: int, count: int, messages_per_entry: int) -> list[Entry]:
    return [Entry(Position(ledger_id, e), b"", e * messages_per_entry, (e + 1) * messages_per_entry - 1, 0)
            for e in range(first_entry, first_entry + count)]


def test_a_read_hints_each_entry_it_held_and_the_one_after_its_last() -> None:
    hints = PositionHints(ranges_max=8, entries_max=100)
    info = LedgerInfo(7, first_offset=0, entries=50)
    hints.remember(info, _run(7, 10, 5, messages_per_entry=3))
    assert [hints.get(o) for o in (30, 33, 36, 39, 42)] == [Position(7, e) for e in (10, 11, 12, 13, 14)]
    assert hints.get(45) == Position(7, 15)  # the entry after the last
    assert [hints.get(o) for o in (29, 31, 32, 44, 46)] == [None] * 5  # no entry starts there, or not known
    hints.remember(info, [Entry(Position(7, e), b"", 30 + e, 30 + e, 0) for e in range(15, 50)])  # to the end
    assert hints.get(80) is None  # past the ledger's last entry: no entry starts there
    assert hints.get(45) == Position(7, 15) and hints.get(79) == Position(7, 49)


def test_reads_of_several_ledgers_and_readers_each_answer_for_their_own_entries() -> None:
    hints = PositionHints(ranges_max=8, entries_max=1000)
    hints.remember(LedgerInfo(1, first_offset=0, entries=100), _run(1, 90, 10, messages_per_entry=1))
    second = LedgerInfo(2, first_offset=100, entries=100)
    hints.remember(second, [Entry(Position(2, e), b"", 100 + e, 100 + e, 0) for e in range(0, 20)])
    hints.remember(second, [Entry(Position(2, e), b"", 100 + e, 100 + e, 0) for e in range(5, 10)])  # another reader
    assert hints.get(95) == Position(1, 95)
    assert hints.get(100) == Position(2, 0)  # ledger 1's read knows no successor: its last entry is the ledger's
    assert hints.get(107) == Position(2, 7) and hints.get(115) == Position(2, 15)
    assert hints.get(110) == Position(2, 10) and hints.get(120) == Position(2, 20)


def test_entries_not_consecutive_are_not_hinted() -> None:
    hints = PositionHints(ranges_max=8, entries_max=1000)
    info = LedgerInfo(4, first_offset=0, entries=100)
    hints.remember(info, [*_run(4, 0, 3, messages_per_entry=1), *_run(4, 5, 2, messages_per_entry=1)])
    assert [hints.get(o) for o in range(0, 8)] == [None] * 8


@pytest.mark.parametrize("messages_per_entry", [1, 2])
@pytest.mark.parametrize("read_entries", [1, 7, 1000])
def test_long_reading_keeps_the_newest_hints_within_both_bounds(read_entries: int, messages_per_entry: int) -> None:
    hints = PositionHints(ranges_max=4, entries_max=64)
    info = LedgerInfo(3, first_offset=0, entries=100_000)
    for start in range(0, 30 * read_entries, read_entries):
        hints.remember(info, _run(3, start, read_entries, messages_per_entry=messages_per_entry))
        end = start + read_entries
        assert hints.get(end * messages_per_entry) == Position(3, end)  # where the next read starts
        kept = range(end - min(read_entries, 64), end)
        assert [hints.get(e * messages_per_entry) for e in kept] == [Position(3, e) for e in kept]
        assert [hints.get(e * messages_per_entry + 1) for e in kept] == \
            ([Position(3, e + 1) for e in kept] if messages_per_entry == 1 else [None] * len(kept))
        statistics = hints.statistics()
        assert statistics.ranges <= 4 and statistics.entries <= 64
    assert hints.get(0) is None  # forgotten
