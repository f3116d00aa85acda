"""GC interleavings the storage simulation found, replayed deterministically.

Role: the random runs of ``test_storage_simulation.py`` hit these only by luck (background GC
racing an entry-log rotation or another GC run). Each test here provokes one: a ``FileIO`` twin
holds the storage at the moment a concurrent GC run can observe, and the test checks that
nothing acknowledged is lost and the storage stays writable and consistent.

A sleep only widens the window of the interleaving; if a thread misses it the test passes
without having checked it, it never fails for timing reasons.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from storage import LedgerStorage, NoSuchEntry
from storage.fileio import AppendFile, FileIO
from tests.simulation.storage_model import CONFIG, RESULT_TIMEOUT_S

pytestmark = pytest.mark.simulation

QUIET = CONFIG.replace(flush_interval_ms=600_000, gc_interval_ms=600_000)  # explicit flush and GC only
WINDOW_S = 0.3


class NewEntryLogHook(FileIO):
    """Runs ``hook`` once, right after the first entry log file is created and before the
    storage has switched to it (the window a concurrent GC run can observe)."""

    def __init__(self) -> None:
        self.hook: Callable[[], None] | None = None

    def open_append(self, path: str, *, preallocate_bytes: int = 0) -> AppendFile:
        file = super().open_append(path, preallocate_bytes=preallocate_bytes)
        hook, self.hook = self.hook, None
        if hook is not None and path.endswith(".log"):
            hook()
        return file


class SlowLogRemoval(FileIO):
    def remove(self, path: str) -> None:
        if path.endswith(".log"):
            time.sleep(WINDOW_S)
        super().remove(path)


def collect_in_thread(st: LedgerStorage, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            st.collect_garbage(0.0)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="test-gc")
    thread.start()
    return thread


def add_all(st: LedgerStorage, ledger_id: int, entries: range, size_bytes: int = 1000) -> dict[int, bytes]:
    written = {entry_id: bytes([entry_id % 256]) * size_bytes for entry_id in entries}
    for entry_id, data in written.items():
        assert st.add_entries(ledger_id, [entry_id], [data]).result(timeout=RESULT_TIMEOUT_S) == entry_id
    return written


def test_gc_during_entry_log_rotation_keeps_live_logs(data_dir: str) -> None:
    """A GC run that lists an entry log created by a concurrent rotation, before the log became
    current, must not treat it as sealed: it would cache the log's usage as empty and, once the
    log is sealed, delete it whole with every live entry in it."""
    fileio = NewEntryLogHook()
    errors: list[BaseException] = []
    gc_threads: list[threading.Thread] = []
    with LedgerStorage.open(data_dir, QUIET, fileio=fileio) as st:
        def gc_while_rotating() -> None:
            gc_threads.append(collect_in_thread(st, errors))
            time.sleep(WINDOW_S)

        fileio.hook = gc_while_rotating
        written = add_all(st, 1, range(5))
        st.flush()  # creates entry log 1 while a GC run is looking
        for thread in gc_threads:
            thread.join(timeout=RESULT_TIMEOUT_S)
        written |= add_all(st, 1, range(5, 200))  # ~200 KiB: log 1 is sealed, log 2 is current
        st.flush()
        st.collect_garbage(0.0)
        unreadable = []
        for entry_id, data in written.items():
            try:
                assert st.get_entry(1, entry_id) == data
            except NoSuchEntry:
                unreadable.append(entry_id)
        assert not unreadable, f"{len(unreadable)} acknowledged entries lost, first {unreadable[:5]}"
        assert st.check_consistency().ok
    assert not errors, f"GC during a rotation raised {errors!r}"


def test_concurrent_gc_runs_do_not_turn_the_storage_read_only(data_dir: str) -> None:
    """Two GC runs (the background one and an explicit ``collect_garbage``) both pick the same
    dead log; the second removal must not fail with FileNotFoundError and turn writes off."""
    with LedgerStorage.open(data_dir, QUIET, fileio=SlowLogRemoval()) as st:
        add_all(st, 1, range(200))  # ~200 KiB: entry log 1 is sealed
        kept = add_all(st, 2, range(3))
        st.flush()
        st.delete_ledger(1)  # log 1 is dead now
        errors: list[BaseException] = []
        for thread in [collect_in_thread(st, errors) for _ in range(2)]:
            thread.join(timeout=RESULT_TIMEOUT_S)
        assert not errors, f"concurrent GC runs raised {errors!r}"
        assert not st.read_only
        assert all(st.get_entry(2, entry_id) == data for entry_id, data in kept.items())
        assert st.check_consistency().ok
