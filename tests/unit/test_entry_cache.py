"""The broker's entry cache (``broker/entry_cache.py``): entries kept as the ``Entry`` a read
gives, a run of them taken at once up to the first missing one, a byte budget or an offset,
hits and misses counted, and the bounds in bytes and age kept."""

from __future__ import annotations

from broker.entry import Entry
from broker.entry_cache import EntryCache
from broker.message_id import Position


def entry(ledger_id: int, entry_id: int, size: int = 10, messages: int = 1) -> Entry:
    first = entry_id * messages
    return Entry(Position(ledger_id, entry_id), b"x" * size, first, first + messages - 1, 1_000 + entry_id)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_a_run_is_the_cached_entries_themselves_up_to_the_first_missing_one() -> None:
    cache = EntryCache(1 << 20)
    made = [entry(7, i) for i in range(5)]
    for each in made[:3] + made[4:]:
        cache.insert(each)
    run, missed = cache.get_run(7, 0, 4)
    assert run == made[:3] and all(a is b for a, b in zip(run, made, strict=False)) and missed == 3
    assert cache.get_run(7, 4, 9) == ([made[4]], 5)
    assert cache.get_run(8, 0, 4) == ([], 0)  # another ledger's
    assert cache.get_run(7, 0, 1) == (made[:2], -1)  # all there: nothing looked up and missed
    stats = cache.statistics()
    assert (stats.hits, stats.misses) == (3 + 1 + 2, 3)


def test_a_run_stops_at_its_byte_budget_and_at_the_entry_holding_an_offset() -> None:
    cache = EntryCache(1 << 20)
    made = [entry(7, i, size=100, messages=10) for i in range(10)]
    for each in made:
        cache.insert(each)
    assert cache.get_run(7, 0, 9, bytes_left=250) == (made[:3], -1)  # the entry that reaches it included
    assert cache.get_run(7, 0, 9, bytes_left=200) == (made[:2], -1)
    assert cache.get_run(7, 2, 9, stop_after_offset=45) == (made[2:5], -1)  # entry 4 holds offsets 40-49
    assert cache.get_run(7, 0, 9, bytes_left=1 << 20, stop_after_offset=5) == (made[:1], -1)


def test_entries_are_kept_by_their_position_within_the_bounds_in_bytes_and_age() -> None:
    clock = Clock()
    cache = EntryCache(1_000, entry_age_ms_max=1_000, clock=clock)
    for i in range(10):
        cache.insert(entry(3, i, size=100))
    assert cache.size_bytes == 1_000 and cache.get_run(3, 0, 0)[0]
    cache.insert(entry(3, 10, size=100))  # over capacity: down to 90% of it, oldest first
    assert cache.size_bytes <= 900 and cache.get_run(3, 0, 0) == ([], 0) and cache.get_run(3, 10, 10)[0]
    clock.now_s = 2.0
    cache.evict_expired()
    assert cache.size_bytes == 0 and cache.get_run(3, 0, 10) == ([], 0)
    cache.insert(entry(3, 11, size=2_000))  # larger than the cache may hold: not kept
    assert cache.get_run(3, 11, 11) == ([], 11)
