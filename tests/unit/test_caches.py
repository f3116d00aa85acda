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


def test_runs_of_the_caches_stop_at_the_first_entry_missing() -> None:
    write = WriteCache(capacity_bytes=1 << 20)
    for entry in (4, 5, 6, 8):
        write.put(1, entry, bytes([entry]))
    write.put(2, 7, b"other ledger")
    assert write.get_run(1, 4, 10) == [b"\x04", b"\x05", b"\x06"]  # 7 is missing (of ledger 1)
    assert write.get_run(1, 5, 5) == [b"\x05"] and write.get_run(1, 7, 9) == []

    read = ReadCache(capacity_bytes=300)
    read.put_many(1, [(0, b"a" * 100), (1, b"b" * 100), (2, b"c" * 100)])
    assert read.get_run(1, 1, 5) == [b"b" * 100, b"c" * 100]  # 1 and 2 become the most recently used
    read.put_many(1, [(3, b"d" * 100)])
    assert read.get_run(1, 0, 0) == []  # the least recently used went
    assert read.get_run(1, 1, 3) == [b"b" * 100, b"c" * 100, b"d" * 100] and read.size_bytes == 300
    stats = read.statistics()
    assert (stats.hits, stats.misses, stats.evictions) == (5, 1, 1)  # a run that finds nothing is one miss


def test_a_read_caches_bulk_put_keeps_the_newest_within_capacity() -> None:
    """``put_many`` (a log read's read-ahead) leaves here what one ``put`` after another does:
    a replaced entry counted once, one larger than the cache left out, the least recently put
    evicted down to capacity."""
    items = [(0, b"a" * 120), (1, b"b" * 90), (0, b"c" * 50), (2, b"x" * 301), (3, b"d" * 100), (4, b"e" * 80)]
    one_by_one, bulk = ReadCache(capacity_bytes=300), ReadCache(capacity_bytes=300)
    for entry, data in items:
        one_by_one.put(7, entry, data)
    bulk.put_many(7, items)
    assert list(bulk._entries.items()) == list(one_by_one._entries.items())
    assert bulk.size_bytes == one_by_one.size_bytes == sum(map(len, bulk._entries.values())) <= 300
