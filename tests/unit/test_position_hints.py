"""Position hints: where the entries after recently read ones start, bounded, oldest forgotten first."""

from __future__ import annotations

from broker.managed_ledger_reads import Entry
from broker.message_id import Position
from broker.offset_index import LedgerInfo, PositionHints


def _run(ledger_id: int, first_entry: int, count: int, messages_per_entry: int) -> list[Entry]:
    return [Entry(Position(ledger_id, e), b"", e * messages_per_entry, (e + 1) * messages_per_entry - 1, 0)
            for e in range(first_entry, first_entry + count)]


def test_a_read_hints_each_entry_after_its_first_and_the_one_after_its_last() -> None:
    hints = PositionHints(hints_max=100)
    info = LedgerInfo(7, first_offset=0, entries=50)
    hints.remember(info, _run(7, 10, 5, messages_per_entry=3))
    assert hints.get(30) is None  # the first entry read: its reader knew where it starts
    assert [hints.get(o) for o in (33, 36, 39, 42)] == [Position(7, e) for e in (11, 12, 13, 14)]
    assert hints.get(45) == Position(7, 15)  # the entry after the last
    hints.remember(info, _run(7, 45, 5, messages_per_entry=1))
    assert hints.get(50) is None  # past the ledger's last entry: no entry starts there


def test_a_long_read_keeps_the_newest_hints_within_the_bound() -> None:
    hints = PositionHints(hints_max=64)
    info = LedgerInfo(3, first_offset=0, entries=10_000)
    for start in range(0, 3000, 1000):
        hints.remember(info, _run(3, start, 1000, messages_per_entry=1))
        assert hints.get(start + 1000) == Position(3, start + 1000)  # where the next read starts
        assert [hints.get(o) for o in range(start + 937, start + 1000)] == \
            [Position(3, e) for e in range(start + 937, start + 1000)]
        assert hints.get(start + 936) is None
    assert len(hints._hints) == 64
