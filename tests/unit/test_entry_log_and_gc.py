"""Entry logs and GC: corruption is detected, never returned; deleting ledgers gives disk back.

Checks: a flipped byte anywhere in a record (header or data) makes the read raise
``CorruptEntry``; GC removes logs whose ledgers are all deleted and compacts logs under the
live-ratio threshold, after which live ledgers still read back byte-for-byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import CorruptEntry, LedgerStorage, StorageConfig
from storage.entry_log import FILE_HEADER_SIZE, RECORD_HEADER_SIZE


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.log"))


@pytest.mark.parametrize("flip_at", [0, 5, 13, 21, RECORD_HEADER_SIZE, RECORD_HEADER_SIZE + 63])
def test_flipped_byte_in_an_entry_log_raises_corrupt_entry(data_dir: str, flip_at: int) -> None:
    config = StorageConfig.test_min()
    with LedgerStorage.open(data_dir, config) as st:
        st.add_entries(1, [0], [b"A" * 64]).result(timeout=10)
        st.add_entries(1, [1], [b"B" * 64]).result(timeout=10)
    log = sorted(Path(data_dir, "entrylogs").glob("*.log"))[-1]
    raw = bytearray(log.read_bytes())
    raw[FILE_HEADER_SIZE + flip_at] ^= 0x40
    log.write_bytes(bytes(raw))
    with LedgerStorage.open(data_dir, config) as st:
        with pytest.raises(CorruptEntry):
            st.get_entry(1, 0)
        assert st.get_entry(1, 1) == b"B" * 64
        assert not st.check_consistency().ok


def test_gc_reclaims_deleted_ledgers_and_compaction_keeps_live_data(data_dir: str) -> None:
    config = StorageConfig.test_min().replace(gc_interval_ms=600_000)
    logs_dir = Path(data_dir, "entrylogs")
    with LedgerStorage.open(data_dir, config) as st:
        # interleave ledgers so every log holds some of each: deletion leaves partly-live logs
        for e in range(300):
            for ledger in (1, 2, 3, 4):
                st.add_entries(ledger, [e], [f"{ledger}:{e}:".encode() * 20])
            if e % 50 == 49:
                st.flush()
        st.checkpoint()
        before = disk_bytes(logs_dir)
        for ledger in (1, 2, 3):
            st.delete_ledger(ledger)
        result = st.collect_garbage(compaction_threshold=0.5)
        after = disk_bytes(logs_dir)
        assert result.logs_compacted + result.logs_removed > 0
        assert after < before * 0.5, (before, after, result)
        for e in range(300):
            assert st.get_entry(4, e) == f"4:{e}:".encode() * 20
        assert st.check_consistency().ok
    with LedgerStorage.open(data_dir, config) as st:
        assert st.ledgers() == [4]
        assert all(st.get_entry(4, e) == f"4:{e}:".encode() * 20 for e in range(300))
        assert st.check_consistency().ok


def test_gc_removes_logs_of_wholly_deleted_ledgers(data_dir: str) -> None:
    config = StorageConfig.test_min().replace(gc_interval_ms=600_000)
    logs_dir = Path(data_dir, "entrylogs")
    with LedgerStorage.open(data_dir, config) as st:
        for e in range(400):
            st.add_entries(1, [e], [b"x" * 900])
        st.checkpoint()
        st.add_entries(2, [0], [b"keeps a current log alive"]).result(timeout=10)
        st.flush()
        logs_before = len(list(logs_dir.glob("*.log")))
        st.delete_ledger(1)
        result = st.collect_garbage(compaction_threshold=0.0)
        assert result.logs_removed >= logs_before - 1 > 0
        assert st.get_entry(2, 0) == b"keeps a current log alive"
        assert st.statistics().gc.logs_removed == result.logs_removed


def test_gc_after_restart_does_not_rescan_entry_logs(data_dir: str) -> None:
    config = StorageConfig.test_min().replace(gc_interval_ms=600_000)
    with LedgerStorage.open(data_dir, config) as st:
        for e in range(400):
            st.add_entries(1, [e], [b"y" * 900])
        st.checkpoint()
        st.collect_garbage(compaction_threshold=0.0)
        assert st.statistics().entry_logs.scans == 0  # usage known from the appends
    with LedgerStorage.open(data_dir, config) as st:
        st.collect_garbage(compaction_threshold=0.0)
        assert st.statistics().entry_logs.scans == 0  # usage persisted in the index
        st.delete_ledger(1)
        assert st.collect_garbage(compaction_threshold=0.0).logs_removed > 0
