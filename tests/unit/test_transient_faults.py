"""Transient failures never turn the storage read-only; a full disk says so.

Role: drive ``LedgerStorage`` over ``FaultyFileIO`` with EMFILE on open (what a flood of client
connections causes when the process runs out of file descriptors) and ENOSPC on write, and
check the contract of ``storage/io_errors.py``.

Checks:
- EMFILE when a flush opens a new entry log: the flush answers ``StorageBusy``, the storage
  stays writable, the sealed buffer is written by the next flush and nothing is lost, also
  across a reopen; the condition is logged once, not per attempt;
- EMFILE when garbage collection opens a log: GC reports ``StorageBusy``, storage writable;
- EMFILE when the journal starts its next file: adds keep being acknowledged on the current
  file, and the rotation happens once descriptors are back;
- EMFILE when a read opens an entry log: ``StorageBusy`` (retriable), not ``CorruptEntry``;
- ENOSPC on a journal write: ``StorageFull`` (code ``storage_full``), read-only, and the log
  says the disk is full.
"""

from __future__ import annotations

import logging

import pytest

from storage import LedgerStorage, StorageBusy, StorageConfig, StorageFull
from storage.fileio import FaultyFileIO, FileIO

CONFIG = StorageConfig.test_min().replace(flush_interval_ms=600_000)  # only explicit flushes
LEDGER = 9
RESULT_TIMEOUT_S = 10.0


def payload(entry_id: int) -> bytes:
    return f"entry-{entry_id}-".encode() * 20


def add(st: LedgerStorage, entry_ids: range) -> None:
    for entry_id in entry_ids:
        assert st.add_entries(LEDGER, [entry_id], [payload(entry_id)]).result(timeout=RESULT_TIMEOUT_S) == entry_id


def assert_all(st: LedgerStorage, entry_ids: range) -> None:
    for entry_id in entry_ids:
        assert st.get_entry(LEDGER, entry_id) == payload(entry_id), entry_id


def test_emfile_during_a_flush_retries_and_stays_writable(data_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    fio = FaultyFileIO(seed=21)
    st = LedgerStorage.open(data_dir, CONFIG, fileio=fio)
    try:
        add(st, range(20))
        fio.inject("open", "EMFILE", path_contains="/entrylogs/", count=3)
        with caplog.at_level(logging.WARNING, logger="storage"):
            for _ in range(3):
                with pytest.raises(StorageBusy):
                    st.flush()
                assert not st.read_only
                add(st, range(st.get_last_add_confirmed(LEDGER) + 1, st.get_last_add_confirmed(LEDGER) + 3))
        assert len([r for r in caplog.records if "flushing the write cache failed" in r.getMessage()]) == 1
        last = st.get_last_add_confirmed(LEDGER)
        st.flush()  # the fault is spent: the sealed buffer and the new entries are written
        assert not st.read_only
        assert st.statistics().write_cache_being_flushed.entries == 0
        assert_all(st, range(last + 1))
        assert st.check_consistency().ok
    finally:
        st.close()
    with LedgerStorage.open(data_dir, CONFIG, fileio=FileIO()) as reopened:
        assert_all(reopened, range(last + 1))


def test_emfile_during_garbage_collection_is_not_read_only(data_dir: str) -> None:
    fio = FaultyFileIO(seed=22)
    st = LedgerStorage.open(data_dir, CONFIG.replace(entry_log_size_bytes_max=4096), fileio=fio)
    try:
        for entry_id in range(40):  # two ledgers interleaved in every log
            for ledger in (LEDGER, LEDGER + 1):
                st.add_entries(ledger, [entry_id], [payload(entry_id)]).result(timeout=RESULT_TIMEOUT_S)
            if entry_id % 4 == 3:
                st.flush()  # several sealed logs (small log size), each half live after the delete
        st.delete_ledger(LEDGER + 1)
        fio.inject("open", "EMFILE", path_contains="/entrylogs/", count=-1)
        with pytest.raises(StorageBusy):
            st.collect_garbage(0.99)  # compaction must open the logs to copy the live half
        assert not st.read_only
        st.add_entries(LEDGER + 2, [0], [b"still writable"]).result(timeout=RESULT_TIMEOUT_S)
        fio._faults.clear()
        assert st.collect_garbage(0.99).logs_compacted > 0
        assert_all(st, range(40))
        assert st.check_consistency().ok
    finally:
        fio._faults.clear()
        st.close()


def test_emfile_when_the_journal_rotates_keeps_acknowledging(data_dir: str) -> None:
    fio = FaultyFileIO(seed=23)
    config = CONFIG.replace(journal_file_bytes_max=16 * 1024, journal_preallocate_bytes=0)
    st = LedgerStorage.open(data_dir, config, fileio=fio)
    try:
        files_before = st.statistics().journal.current_file_id
        fio.inject("open", "EMFILE", path_contains=".jnl", count=-1)
        add(st, range(100))  # far past one file's size: every rotation fails
        stats = st.statistics()
        assert not st.read_only and stats.journal.current_file_id == files_before
        fio._faults.clear()
        add(st, range(100, 110))
        assert st.statistics().journal.current_file_id > files_before
        assert_all(st, range(110))
    finally:
        st.close()
    with LedgerStorage.open(data_dir, config, fileio=FileIO()) as reopened:
        assert_all(reopened, range(110))


def test_emfile_on_a_read_is_busy_not_corrupt(data_dir: str) -> None:
    fio = FaultyFileIO(seed=24)
    with LedgerStorage.open(data_dir, CONFIG, fileio=fio) as st:
        add(st, range(5))
        st.flush()
        fio.inject("open", "EMFILE", path_contains="/entrylogs/")
        st._read_cache.delete_ledger(LEDGER)
        st._logs._readers.clear()
        with pytest.raises(StorageBusy) as busy:
            st.get_entry(LEDGER, 0)
        assert busy.value.retriable and busy.value.http_status == 503
        assert st.get_entry(LEDGER, 0) == payload(0)
        assert not st.read_only


def test_a_full_disk_is_named_as_such(data_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    fio = FaultyFileIO(seed=25)
    with LedgerStorage.open(data_dir, CONFIG, fileio=fio) as st:
        add(st, range(5))
        fio.inject("write", "ENOSPC", path_contains=".jnl")
        with caplog.at_level(logging.ERROR, logger="storage"):
            future = st.add_entries(LEDGER, [5], [payload(5)])
            with pytest.raises(StorageFull) as full:
                future.result(timeout=RESULT_TIMEOUT_S)
        assert full.value.code == "storage_full" and full.value.http_status == 503
        assert st.read_only
        assert any("disk is full" in r.getMessage() and "journal write" in r.getMessage() for r in caplog.records)
        assert_all(st, range(5))
