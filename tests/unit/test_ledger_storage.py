"""LedgerStorage front door: reads, LAC, fencing, deletion, restart, back-pressure, read path.

Checks: every acknowledged entry reads back byte-for-byte after a clean close; LAC and fenced
state survive a restart; a fenced ledger's adds stay refused after its deletion; typed errors
for missing ledgers and entries; a full write cache pushes back instead of growing; the read
path serves from write cache, then read cache with read-ahead, then the entry log; reads that
jump about a ledger read no more than their entry.
"""

from __future__ import annotations

import pytest

from storage import (
    InvalidArgument,
    LedgerFenced,
    LedgerStorage,
    NoSuchEntry,
    NoSuchLedger,
    StorageClosed,
    StorageConfig,
    WriteCacheFull,
)


def entry_bytes(ledger_id: int, entry_id: int) -> bytes:
    return bytes((ledger_id * 31 + entry_id + i) % 251 for i in range((entry_id * 37) % 3000))


READ_PATH_CONFIG = StorageConfig.test_min().replace(read_cache_bytes_max=1 << 20, read_ahead_bytes_max=64 * 1024,
                                                   read_ahead_entries_max=100)
"""The read-path tests' storage: read-ahead of 100 entries or 64 KiB, a read cache that holds it."""


def hundred_bytes(entry_id: int) -> bytes:
    return bytes([entry_id % 256]) * 100


def add_each(st: LedgerStorage, ledger_id: int, entries: dict[int, bytes]) -> None:
    """Each entry added on its own (one journal item each), all waited for."""
    for future in [st.add_entries(ledger_id, [entry_id], [data]) for entry_id, data in entries.items()]:
        future.result(timeout=10)


def test_entries_read_back_after_clean_close_with_lac_and_fence(data_dir: str) -> None:
    config = StorageConfig.test_min()
    with LedgerStorage.open(data_dir, config) as st:
        for future in [st.add_entries(lg, [e], [entry_bytes(lg, e)]) for lg in (1, 2, 3) for e in range(200)]:
            future.result(timeout=10)
        st.fence(2).result(timeout=10)
        assert st.get_last_add_confirmed(1) == 199
    with LedgerStorage.open(data_dir, config) as st:
        for lg in (1, 2, 3):
            assert st.get_last_add_confirmed(lg) == 199
            for e in range(200):
                assert st.get_entry(lg, e) == entry_bytes(lg, e)
            assert st.get_entry(lg, -1) == entry_bytes(lg, 199)
        assert st.is_fenced(2) and not st.is_fenced(1)
        with pytest.raises(LedgerFenced):
            st.add_entries(2, [200], [b"x"])
        assert st.add_entries(2, [200], [b"recovery add"], recovery=True).result(timeout=10) == 200
        assert st.check_consistency().ok


def test_a_fenced_ledger_stays_fenced_after_its_deletion_and_a_restart(data_dir: str) -> None:
    """A new owner that recovered an empty ledger deletes it; the old writer's next plain add
    must still be refused as fenced, not make the ledger anew (nobody would read it)."""
    config = StorageConfig.test_min()
    with LedgerStorage.open(data_dir, config) as st:
        st.fence(5).result(timeout=10)  # recovery of a ledger with no entry on this bookie
        st.add_entries(6, [0], [b"a"]).result(timeout=10)
        st.fence(6).result(timeout=10)
        st.add_entries(7, [0], [b"b"]).result(timeout=10)
        st.add_entries(9, [0, 1], [b"kept", b"kept"]).result(timeout=10)
        for ledger_id in (5, 6, 7):
            st.delete_ledger(ledger_id)
        for ledger_id in (5, 6):
            with pytest.raises(LedgerFenced):
                st.add_entries(ledger_id, [0], [b"zombie"])
            assert st.fence(ledger_id).result(timeout=10) is None  # fencing again is harmless
            assert not st.ledger_exists(ledger_id)
    with LedgerStorage.open(data_dir, config) as st:
        for ledger_id in (5, 6):
            with pytest.raises(LedgerFenced):
                st.add_entries(ledger_id, [1], [b"zombie"])
            with pytest.raises(NoSuchLedger):
                st.get_last_add_confirmed(ledger_id)
        assert st.ledgers() == [9] and st.get_last_add_confirmed(9) == 1
        assert st.check_consistency().ok


def test_typed_errors(storage: LedgerStorage) -> None:
    with pytest.raises(NoSuchLedger):
        storage.get_entry(42, 0)
    with pytest.raises(NoSuchLedger):
        storage.get_last_add_confirmed(42)
    storage.add_entries(42, [0], [b"a"]).result(timeout=10)
    with pytest.raises(NoSuchEntry):
        storage.get_entry(42, 1)
    with pytest.raises(InvalidArgument):
        storage.add_entries(-1, [0], [b"a"])
    with pytest.raises(NoSuchLedger):
        storage.delete_ledger(43)


def test_empty_ledger_has_no_last_entry(storage: LedgerStorage) -> None:
    storage.fence(5).result(timeout=10)
    assert storage.get_last_add_confirmed(5) == -1
    with pytest.raises(NoSuchEntry):
        storage.get_entry(5, -1)


def test_deleted_ledger_stays_deleted_after_restart(data_dir: str) -> None:
    config = StorageConfig.test_min()
    with LedgerStorage.open(data_dir, config) as st:
        for e in range(50):
            st.add_entries(9, [e], [b"doomed"]).result(timeout=10)
            st.add_entries(10, [e], [b"kept"]).result(timeout=10)
        st.delete_ledger(9)
        with pytest.raises(NoSuchLedger):
            st.get_entry(9, 0)
    with LedgerStorage.open(data_dir, config) as st:
        assert st.ledgers() == [10]
        assert st.get_entry(10, 49) == b"kept"
        assert st.check_consistency().ok


def test_closed_storage_refuses_calls(data_dir: str) -> None:
    st = LedgerStorage.open(data_dir, StorageConfig.test_min())
    st.add_entries(1, [0], [b"a"]).result(timeout=10)
    st.close()
    with pytest.raises(StorageClosed):
        st.add_entries(1, [1], [b"b"])
    with pytest.raises(StorageClosed):
        st.get_entry(1, 0)


def test_full_write_cache_pushes_back_instead_of_growing(data_dir: str) -> None:
    config = StorageConfig.test_min().replace(write_cache_full_wait_ms=50, flush_interval_ms=600_000)
    with LedgerStorage.open(data_dir, config) as st:
        with st._flush_lock:  # a stuck flush: the being-flushed buffer cannot drain
            accepted = 0
            with pytest.raises(WriteCacheFull):
                for e in range(10_000):
                    st.add_entries(1, [e], [b"x" * 1000])
                    accepted += 1
            stats = st.statistics().write_cache
            assert stats.size_bytes <= config.write_cache_bytes_max
            assert accepted * 1000 <= config.write_cache_bytes_max
        st.add_entries(1, [accepted], [b"after the flush drained"]).result(timeout=10)
        assert st.get_entry(1, accepted) == b"after the flush drained"


def test_read_path_levels_and_read_ahead(data_dir: str) -> None:
    with LedgerStorage.open(data_dir, READ_PATH_CONFIG) as st:
        add_each(st, 1, {e: hundred_bytes(e) for e in range(400)})
        st.add_entries(2, [0], [b"hot"]).result(timeout=10)
        st.flush()
        st.add_entries(2, [1], [b"still in the write cache"]).result(timeout=10)
        assert st.get_entry(2, 1) == b"still in the write cache"
        assert st.statistics().read_path.write_cache_hits == 1
        for e in range(400):
            assert st.get_entry(1, e) == hundred_bytes(e)
        stats = st.statistics()
        # one log read serves a whole read-ahead batch (entries sorted by ledger on flush)
        assert stats.read_path.entry_log_reads <= 400 // 50
        assert stats.read_cache.hits >= 400 - stats.read_path.entry_log_reads
        assert stats.read_path.random_reads == 0


def test_a_range_read_takes_its_entries_from_each_level_and_caches_only_what_it_read_past_its_end(
        data_dir: str) -> None:
    with LedgerStorage.open(data_dir, READ_PATH_CONFIG) as st:
        add_each(st, 1, {e: entry_bytes(1, e) for e in range(300)})
        st.flush()
        st.add_entries(1, [300], [entry_bytes(1, 300)]).result(timeout=10)  # still in the write cache
        assert st.get_entries(1, 0, 9) == [entry_bytes(1, e) for e in range(10)]
        stats = st.statistics()
        assert stats.read_path.entry_log_reads == 1  # the rest of the range came with the first read
        assert stats.read_cache.misses == 1
        assert stats.read_cache.hits == stats.read_path.read_cache_hits == 9  # counted, not looked up
        ahead = stats.read_cache.entries
        assert ahead > 0  # what that read found past entry 9, and only that
        assert st.get_entries(1, 10, 9 + ahead) == [entry_bytes(1, e) for e in range(10, 10 + ahead)]
        assert st.statistics().read_cache.misses == 1
        assert st.get_entry(1, 10) == entry_bytes(1, 10)
        assert st.statistics().read_path.entry_log_reads == 1  # from the cache
        assert st.get_entries(1, 11, 300) == [entry_bytes(1, e) for e in range(11, 301)]
        stats = st.statistics()
        assert stats.read_path.write_cache_hits == 1
        assert stats.read_path.random_reads == 0
        assert stats.read_path.entry_log_reads <= 1 + 300 // 20  # every log read serves a run
        assert st.get_entries(1, 5, 4) == []
        with pytest.raises(NoSuchEntry):
            st.get_entries(1, 299, 301)
        with pytest.raises(NoSuchLedger):
            st.get_entries(7, 0, 0)


def test_a_range_read_takes_the_entries_it_asks_for_in_one_log_read_wherever_it_starts(data_dir: str) -> None:
    """A range read's own entries are not read-ahead: one that jumps reads them all in its one
    log read (not one read an entry) and puts nothing past its end in the cache; a sequential
    one longer than the read-ahead takes its entries in one log read too."""
    with LedgerStorage.open(data_dir, READ_PATH_CONFIG) as st:
        add_each(st, 1, {e: hundred_bytes(e) for e in range(600)})
        st.flush()
        assert st.get_entries(1, 0, 249) == [hundred_bytes(e) for e in range(250)]
        stats = st.statistics()
        assert stats.read_path.entry_log_reads == 1 and stats.read_path.random_reads == 0
        assert stats.read_cache.entries == 0  # it asked for more than the read-ahead: nothing past them
        assert st.get_entries(1, 400, 449) == [hundred_bytes(e) for e in range(400, 450)]
        stats = st.statistics()
        assert stats.read_path.entry_log_reads == 2 and stats.read_path.random_reads == 1
        assert stats.read_cache.entries == 0


def test_reads_that_jump_about_a_ledger_read_no_ahead_and_sequential_ones_do_again(data_dir: str) -> None:
    with LedgerStorage.open(data_dir, READ_PATH_CONFIG) as st:
        add_each(st, 1, {e: hundred_bytes(e) for e in range(400)})
        st.flush()
        assert st.get_entry(1, 5) == hundred_bytes(5)  # the ledger's first read reads ahead
        cached = st.statistics().read_cache.entries
        assert cached > 0
        for e in range(200, 400, 10):  # one key's entries, say
            assert st.get_entry(1, e) == hundred_bytes(e)
        stats = st.statistics()
        assert stats.read_path.entry_log_reads == 1 + 20 and stats.read_path.random_reads == 20
        assert stats.read_cache.entries == cached  # nothing read ahead for the jumps
        for e in range(391, 400):  # a reader going on from the last jump reads ahead again
            assert st.get_entry(1, e) == hundred_bytes(e)
        stats = st.statistics()
        assert stats.read_path.entry_log_reads == 22 and stats.read_path.random_reads == 20
