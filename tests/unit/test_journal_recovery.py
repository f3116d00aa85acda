"""Journal: group commit, torn-tail recovery at every byte offset, checkpoint and replay.

Checks acceptance points: far fewer fsyncs than entries under concurrent adds (group commit);
truncating the journal anywhere inside its last records still recovers every complete record
before the cut and nothing after it; a checkpoint trims the journal and recovery replays only
the records after the mark.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from storage import LedgerStorage, NoSuchEntry, StorageConfig
from storage.fileio import FaultyFileIO
from storage.journal import HEADER_SIZE

QUIET = StorageConfig.production().replace(flush_interval_ms=600_000, journal_group_wait_ms=2.0)


def payload(ledger_id: int, entry_id: int, size_bytes: int = 24) -> bytes:
    seed = f"{ledger_id}:{entry_id}:".encode()
    return (seed * (size_bytes // len(seed) + 1))[:size_bytes]


def test_group_commit_uses_far_fewer_fsyncs_than_entries(data_dir: str) -> None:
    threads_count, per_thread = 8, 1250
    futures: list[list[Future[int]]] = [[] for _ in range(threads_count)]
    with LedgerStorage.open(data_dir, QUIET) as st:
        def writer(index: int) -> None:
            for entry_id in range(per_thread):
                futures[index].append(st.add_entries(index + 1, [entry_id], [payload(index + 1, entry_id, 100)]))

        workers = [threading.Thread(target=writer, args=(i,)) for i in range(threads_count)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        for index in range(threads_count):
            assert [f.result(timeout=30) for f in futures[index]] == list(range(per_thread))
        stats = st.statistics().journal
        assert stats.records_written == threads_count * per_thread
        assert stats.fsync_count * 10 <= stats.records_written, stats
        assert stats.largest_group_records > 10


def crashed_copy_with_journal_only(data_dir: str, entries: list[tuple[int, int, bytes]]) -> None:
    """Leave ``data_dir`` as a process killed right after acknowledging ``entries``: everything
    acknowledged is in the journal, nothing was flushed or checkpointed."""
    fio = FaultyFileIO(seed=1)
    st = LedgerStorage.open(data_dir, QUIET, fileio=fio)
    for future in [st.add_entries(ledger, [entry], [data]) for ledger, entry, data in entries]:
        future.result(timeout=10)
    fio.crash()
    st.close()


def journal_file(data_dir: str) -> Path:
    files = sorted(Path(data_dir, "journal").glob("*.jnl"))
    assert len(files) == 1
    return files[0]


def record_ends_of(entries: list[tuple[int, int, bytes]]) -> list[int]:
    ends, end = [], 0
    for _, _, data in entries:
        end += HEADER_SIZE + len(data)
        ends.append(end)
    return ends


@pytest.mark.parametrize("tail", ["cut off", "zeroed"])
def test_a_torn_journal_tail_at_every_byte_keeps_complete_records(data_dir: str, tmp_path: Path, tail: str) -> None:
    """The tail after a byte is lost either as a shorter file or, in a preallocated journal
    file, as the zeros that were there before the write."""
    entries = [(7, e, payload(7, e, 10 + 7 * e)) for e in range(6)]
    crashed_copy_with_journal_only(data_dir, entries)
    path = journal_file(data_dir)
    record_ends = record_ends_of(entries)
    end = record_ends[-1]
    raw = path.read_bytes()
    assert len(raw) >= end + QUIET.journal_preallocate_bytes and not any(raw[end:])  # preallocated zeros
    first_cut = record_ends[2]  # every byte inside the last three records
    for cut in range(first_cut, end + 1):
        trial = str(tmp_path / f"cut-{cut}")
        shutil.copytree(data_dir, trial)
        trial_path = Path(trial, "journal", path.name)
        if tail == "cut off":
            os.truncate(trial_path, cut)
        else:
            trial_path.write_bytes(raw[:cut] + bytes(len(raw) - cut))
        with LedgerStorage.open(trial, QUIET) as st:
            complete = sum(1 for record_end in record_ends if record_end <= cut)
            for ledger, entry, data in entries[:complete]:
                assert st.get_entry(ledger, entry) == data, f"cut at {cut}"
            for ledger, entry, _ in entries[complete:]:
                with pytest.raises(NoSuchEntry):
                    st.get_entry(ledger, entry)
            assert st.get_last_add_confirmed(7) == complete - 1
            st.add_entries(7, [complete], [b"after recovery"]).result(timeout=10)
        shutil.rmtree(trial)


def test_garbled_byte_in_the_tail_record_drops_only_that_record(data_dir: str) -> None:
    entries = [(3, e, payload(3, e, 40)) for e in range(4)]
    crashed_copy_with_journal_only(data_dir, entries)
    path = journal_file(data_dir)
    raw = bytearray(path.read_bytes())
    raw[record_ends_of(entries)[-1] - 5] ^= 0xFF
    path.write_bytes(bytes(raw))
    with LedgerStorage.open(data_dir, QUIET) as st:
        assert [st.get_entry(3, e) for e in range(3)] == [d for _, _, d in entries[:3]]
        with pytest.raises(NoSuchEntry):
            st.get_entry(3, 3)


def test_checkpoint_trims_the_journal_and_recovery_replays_only_after_the_mark(data_dir: str) -> None:
    config = StorageConfig.test_min().replace(
        flush_interval_ms=600_000, write_cache_bytes_max=1 << 20, write_cache_flush_bytes=1 << 20
    )
    fio = FaultyFileIO(seed=2)
    st = LedgerStorage.open(data_dir, config, fileio=fio)
    for e in range(300):  # 300 x ~600 B rotates 64 KiB journal files a few times
        st.add_entries(1, [e], [payload(1, e, 600)]).result(timeout=10)
    files_before = len(list(Path(data_dir, "journal").glob("*.jnl")))
    assert files_before > 2
    st.checkpoint()
    files_after = len(list(Path(data_dir, "journal").glob("*.jnl")))
    assert files_after < files_before
    after_mark = 25
    for e in range(300, 300 + after_mark):
        st.add_entries(1, [e], [payload(1, e, 600)]).result(timeout=10)
    fio.crash()
    st.close()
    with LedgerStorage.open(data_dir, config) as reopened:
        assert reopened.statistics().replayed_records == after_mark
        for e in range(300 + after_mark):
            assert reopened.get_entry(1, e) == payload(1, e, 600)
        assert reopened.check_consistency().ok


def test_replay_stops_at_the_preallocated_zeros_and_cuts_them_off(data_dir: str) -> None:
    entries = [(5, e, payload(5, e, 30)) for e in range(3)]
    crashed_copy_with_journal_only(data_dir, entries)
    path = journal_file(data_dir)
    end = record_ends_of(entries)[-1]
    assert path.stat().st_size > end  # the crash left the zeros
    with LedgerStorage.open(data_dir, QUIET) as st:
        assert [st.get_entry(5, e) for e in range(3)] == [d for _, _, d in entries]
        with pytest.raises(NoSuchEntry):
            st.get_entry(5, 3)
        assert st.get_last_add_confirmed(5) == 2
        assert not path.exists() or path.stat().st_size == end  # zeros cut off (or the file trimmed)
        st.add_entries(5, [3], [b"after recovery"]).result(timeout=10)
    with LedgerStorage.open(data_dir, QUIET) as st:
        assert st.get_entry(5, 3) == b"after recovery"
