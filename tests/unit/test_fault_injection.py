"""Injected I/O faults: a failed write or sync never loses an acknowledged entry.

Role: drive ``LedgerStorage`` over ``FaultyFileIO.inject`` and check the read-only contract of
``storage/ledger_storage.py``.

Checks:
- EIO on the journal's fdatasync, ENOSPC on its write and a torn journal write each fail the
  add in flight with ``StorageIOError`` (a ``StorageReadOnly``); later adds, fences, deletions
  and flushes are refused with ``StorageReadOnly``; earlier acknowledged entries still read
  back, and after a restart they are all there while the failed add is absent or byte-exact;
- EIO while a flush writes or syncs an entry log turns the storage read-only without losing
  acknowledged entries: a reopen with plain ``FileIO`` reads every one of them back.
"""

from __future__ import annotations

import pytest

from storage import LedgerStorage, NoSuchEntry, StorageConfig, StorageIOError, StorageReadOnly
from storage.fileio import FaultyFileIO, FileIO

CONFIG = StorageConfig.test_min()
QUIET = CONFIG.replace(flush_interval_ms=600_000)  # only explicit flushes (the test's data stays under the threshold)
JOURNAL_FILES = ".jnl"  # not "journal": the test's own tmp directory may contain that word
ENTRY_LOGS = "/entrylogs/"
LEDGER = 5
RESULT_TIMEOUT_S = 10.0


def payload(entry_id: int, size_bytes: int = 700) -> bytes:
    seed = f"{LEDGER}:{entry_id}:".encode()
    return (seed * (size_bytes // len(seed) + 1))[:size_bytes]


def add_acknowledged(st: LedgerStorage, entry_ids: range) -> None:
    for entry_id in entry_ids:
        assert st.add_entries(LEDGER, [entry_id], [payload(entry_id)]).result(timeout=RESULT_TIMEOUT_S) == entry_id


def assert_read_only(st: LedgerStorage, next_entry: int) -> None:
    assert st.read_only
    with pytest.raises(StorageReadOnly):
        st.add_entries(LEDGER, [next_entry], [payload(next_entry)])
    with pytest.raises(StorageReadOnly):
        st.fence(LEDGER)
    with pytest.raises(StorageReadOnly):
        st.delete_ledger(LEDGER)
    with pytest.raises(StorageReadOnly):
        st.flush()


def assert_entries(st: LedgerStorage, entry_ids: range) -> None:
    for entry_id in entry_ids:
        assert st.get_entry(LEDGER, entry_id) == payload(entry_id), f"entry {entry_id}"


def assert_recovered(data_dir: str, acknowledged: range, failed: int | None = None) -> None:
    """Reopen with real files: every acknowledged entry is back; a failed add is absent or exact."""
    with LedgerStorage.open(data_dir, CONFIG, fileio=FileIO()) as st:
        assert_entries(st, acknowledged)
        assert st.get_last_add_confirmed(LEDGER) >= acknowledged[-1]
        if failed is not None:
            try:
                assert st.get_entry(LEDGER, failed) == payload(failed)
            except NoSuchEntry:
                assert st.get_last_add_confirmed(LEDGER) == acknowledged[-1]
        assert st.check_consistency().ok
        st.add_entries(LEDGER, [1_000], [b"writable again"]).result(timeout=RESULT_TIMEOUT_S)


@pytest.mark.parametrize(
    ("op", "kind"),
    [("sync", "EIO"), ("write", "ENOSPC"), ("write", "torn")],
    ids=["eio-on-fdatasync", "enospc-on-write", "torn-write"],
)
def test_journal_fault_fails_the_add_and_turns_read_only(data_dir: str, op: str, kind: str) -> None:
    fio = FaultyFileIO(seed=11)
    acknowledged = range(20)
    st = LedgerStorage.open(data_dir, CONFIG, fileio=fio)
    try:
        add_acknowledged(st, acknowledged)
        fio.inject(op, kind, path_contains=JOURNAL_FILES)
        failed = acknowledged[-1] + 1
        future = st.add_entries(LEDGER, [failed], [payload(failed)])
        with pytest.raises(StorageIOError):
            future.result(timeout=RESULT_TIMEOUT_S)
        assert issubclass(StorageIOError, StorageReadOnly)
        assert_read_only(st, failed + 1)
        assert_entries(st, acknowledged)
        assert st.get_last_add_confirmed(LEDGER) == acknowledged[-1]
        assert st.check_consistency().ok
    finally:
        st.close()
    assert_recovered(data_dir, acknowledged, failed)


@pytest.mark.parametrize("op", ["write", "sync"])
def test_entry_log_fault_during_flush_keeps_acknowledged_entries(data_dir: str, op: str) -> None:
    fio = FaultyFileIO(seed=12)
    flushed, cached = range(30), range(30, 45)
    st = LedgerStorage.open(data_dir, QUIET, fileio=fio)
    try:
        add_acknowledged(st, flushed)
        st.flush()
        add_acknowledged(st, cached)
        fio.inject(op, "EIO", path_contains=ENTRY_LOGS)
        with pytest.raises(StorageIOError):
            st.flush()
        assert_read_only(st, cached[-1] + 1)
        assert_entries(st, range(cached[-1] + 1))
        assert st.get_last_add_confirmed(LEDGER) == cached[-1]
    finally:
        st.close()
    assert_recovered(data_dir, range(cached[-1] + 1))


def test_fault_writing_the_checkpoint_mark_turns_read_only(data_dir: str) -> None:
    fio = FaultyFileIO(seed=13)
    acknowledged = range(10)
    st = LedgerStorage.open(data_dir, QUIET, fileio=fio)
    try:
        add_acknowledged(st, acknowledged)
        fio.inject("write", "EIO", path_contains="lastMark")
        with pytest.raises(StorageIOError):
            st.checkpoint()
        assert_read_only(st, acknowledged[-1] + 1)
        assert_entries(st, acknowledged)
    finally:
        st.close()
    assert_recovered(data_dir, acknowledged)


def test_close_after_a_crash_right_after_open_does_not_raise(data_dir: str) -> None:
    acknowledged = range(10)
    with LedgerStorage.open(data_dir, QUIET) as st:
        add_acknowledged(st, acknowledged)
    fio = FaultyFileIO(seed=14)
    st = LedgerStorage.open(data_dir, QUIET, fileio=fio)  # nothing to replay, no entry log open yet
    fio.crash()
    st.close()
    fio.lose_unsynced()
    assert_recovered(data_dir, acknowledged)
