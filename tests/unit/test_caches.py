"""Write cache and read cache bounds (the caches never grow past their capacity)."""

from __future__ import annotations

from storage.read_cache import ReadCache
from storage.write_cache import PUT_FULL, PUT_OK, PUT_SEALED, WriteCache


def test_write_cache_refuses_instead_of_growing() -> None:
    cache = WriteCache(capacity_bytes=1000)
    assert cache.put(1, 0, b"a" * 600) == PUT_OK
    assert cache.put(1, 1, b"b" * 600) == PUT_FULL
    assert cache.size_bytes == 600 and cache.get(1, 1) is None
    assert cache.put(1, 0, b"c" * 900) == PUT_OK  # overwrite counts only the growth
    assert cache.size_bytes == 900 and cache.last_entry_id(1) == 0
    cache.seal()
    assert cache.put(2, 0, b"d") == PUT_SEALED and cache.get(2, 0) is None


def test_write_cache_sorts_by_ledger_then_entry() -> None:
    cache = WriteCache(capacity_bytes=1 << 20)
    for ledger, entry in [(3, 1), (1, 5), (3, 0), (1, 2), (2, 9)]:
        cache.put(ledger, entry, b"x")
    assert [(lg, e) for lg, e, _ in cache.sorted_entries()] == [(1, 2), (1, 5), (2, 9), (3, 0), (3, 1)]


def test_read_cache_evicts_least_recently_used_within_capacity() -> None:
    cache = ReadCache(capacity_bytes=300)
    for entry in range(3):
        cache.put(1, entry, b"x" * 100)
    assert cache.get(1, 0) is not None  # 0 becomes most recently used
    cache.put(1, 3, b"y" * 100)
    assert cache.get(1, 1) is None and cache.get(1, 0) is not None
    assert cache.size_bytes <= 300
    cache.put(1, 4, b"z" * 301)  # larger than the whole cache: not cached
    assert cache.get(1, 4) is None
    stats = cache.statistics()
    assert stats.evictions == 1 and stats.hits == 2 and stats.misses == 2
