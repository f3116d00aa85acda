"""The journal written by the appending thread while idle (``Journal.write_on_caller_thread``).

Checks with real files and fdatasync:
- records appended on the caller's thread while the writer thread has nothing are written, synced
  and completed by the caller's scheduled drain, as one group per burst, and survive a reopen;
- records reach disk and complete in append order when both writers are involved (records the
  caller has not drained yet are taken first by the writer thread);
- a caller that never drains (it blocks waiting on its own record) is covered by the writer
  thread's backstop, whether the writer was polling or asleep after an idle spell: late, never
  lost, no deadlock;
- a slow fdatasync sends later groups back to the writer thread, and keeps them there until
  ``CALLER_FSYNC_CALM_GROUPS`` fast ones in a row;
- a failing fdatasync fails exactly the caller's group and every later record;
- records still waiting for the caller at close are written; later ones are refused as closed;
- turning the path off while the writer thread holds the write lock strands nothing;
- a group that would grow the file (preallocation) is left to the writer thread;
- a caller whose loop is closed still gets its record written;
- an event loop that writes its own publishes through ``LedgerStorage`` completes them on itself.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import storage.journal as journal_module
from storage import LedgerStorage, StorageConfig
from storage.errors import StorageClosed
from storage.fileio import AppendFile, FaultyFileIO, FileIO
from storage.journal import RECORD_ADD_ENTRY, Journal, encode_header
from storage.limits import CALLER_IDLE_S

WAIT_S = 10.0
LONG_BACKSTOP_MS = 60_000.0
"""Long enough that only an explicit drain (or a queued record) writes what the caller left."""


@pytest.fixture(autouse=True)
def fsyncs_never_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which thread writes must not hang on how long this disk's fdatasync took (a new file's
    first one commits its preallocated size); the slow case has its own test."""
    monkeypatch.setattr(journal_module, "CALLER_FSYNC_US_MAX", 10**12)


class Completions:
    """The journal's completion callback: records each group's tokens, error and thread."""

    def __init__(self) -> None:
        self.groups: list[tuple[list[Any], BaseException | None, int]] = []
        self._cv = threading.Condition()

    def __call__(self, tokens: list[Any], error: BaseException | None) -> None:
        with self._cv:
            self.groups.append((list(tokens), error, threading.get_ident()))
            self._cv.notify_all()

    def tokens(self) -> list[Any]:
        with self._cv:
            return [token for tokens, _, _ in self.groups for token in tokens]

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        with self._cv:
            while sum(len(tokens) for tokens, _, _ in self.groups) < count:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"only {self.groups} completed"
                self._cv.wait(remaining)


@contextmanager
def on_caller(directory: Path, *, fileio: FileIO | None = None, backstop_ms: float = LONG_BACKSTOP_MS,
              ) -> Iterator[tuple[Journal, Completions, list[Callable[[], None]]]]:
    """A started journal written on this thread when idle: its drains are collected in the
    list (run one to act as the caller's event loop); closed on the way out."""
    completions = Completions()
    journal = open_journal(directory, completions, fileio)
    scheduled: list[Callable[[], None]] = []
    try:
        journal.write_on_caller_thread(scheduled.append, backstop_ms=backstop_ms)
        yield journal, completions, scheduled
    finally:
        journal.close()


def open_journal(directory: Path, completions: Completions, fileio: FileIO | None = None) -> Journal:
    journal = Journal(str(directory), fileio or FileIO(), completions, sync=True, group_wait_ms=0.0,
                      group_bytes_max=1 << 20, file_bytes_max=1 << 20, preallocate_bytes=4096)
    journal.start()
    return journal


def append(journal: Journal, entry_id: int) -> None:
    payload = f"record {entry_id}".encode()
    journal.append((encode_header(RECORD_ADD_ENTRY, 1, entry_id, payload), payload), entry_id)


def replayed(directory: Path) -> list[int]:
    reader = Journal(str(directory), FileIO(), Completions(), sync=True, group_wait_ms=0.0,
                     group_bytes_max=1 << 20, file_bytes_max=1 << 20, preallocate_bytes=4096)
    return [record.entry_id for record in reader.replay(reader.read_mark())]


def test_an_idle_journal_is_written_by_the_caller_in_one_group(tmp_path: Path) -> None:
    with on_caller(tmp_path) as (journal, completions, scheduled):
        for entry_id in range(3):
            append(journal, entry_id)
        assert len(scheduled) == 1  # one drain per burst
        assert completions.tokens() == []  # nothing written before the drain runs
        scheduled.pop()()
        assert completions.groups == [([0, 1, 2], None, threading.get_ident())]
        stats = journal.statistics()
        assert (stats.groups_on_caller_thread, stats.fsync_count, stats.records_written) == (1, 1, 3)
    assert replayed(tmp_path) == [0, 1, 2]


def test_both_writers_keep_append_order(tmp_path: Path) -> None:
    with on_caller(tmp_path) as (journal, completions, scheduled):
        append(journal, 0)  # waits for the caller's drain
        other = threading.Thread(target=append, args=(journal, 1))  # queued: the writer thread wakes
        other.start()
        other.join(WAIT_S)
        completions.wait_for(2)
        assert completions.tokens() == [0, 1]  # the caller's record first
        assert all(error is None and thread != threading.get_ident() for _, error, thread in completions.groups)
        scheduled.pop()()  # the drain finds nothing left
        append(journal, 2)  # idle again: the caller's
        scheduled.pop()()
        assert completions.tokens() == [0, 1, 2]
        assert completions.groups[-1][2] == threading.get_ident()
    assert replayed(tmp_path) == [0, 1, 2]


@pytest.mark.parametrize("caller_idle_s", [CALLER_IDLE_S, 0.0],
                         ids=["writer-polling", "writer-asleep"])
def test_a_caller_that_waits_on_its_own_record_is_covered_by_the_backstop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caller_idle_s: float) -> None:
    """Polling, or asleep after the caller's idle time (then the record wakes it once)."""
    monkeypatch.setattr(journal_module, "CALLER_IDLE_S", caller_idle_s)
    with on_caller(tmp_path, backstop_ms=5.0) as (journal, completions, scheduled):
        if caller_idle_s == 0.0:  # let the writer thread go to sleep first
            deadline = time.monotonic() + WAIT_S
            while not journal._writer_asleep:
                assert time.monotonic() < deadline, "the writer thread never went idle"
                time.sleep(0.001)
        append(journal, 0)
        completions.wait_for(1)  # the caller blocks here instead of running its drain
        assert completions.groups == [([0], None, completions.groups[0][2])]
        assert completions.groups[0][2] != threading.get_ident()
        assert journal.statistics().groups_on_caller_thread == 0
        scheduled.pop()()  # a late drain finds nothing: the record is not written twice
        assert journal.statistics().records_written == 1
    assert replayed(tmp_path) == [0]


def test_a_slow_fdatasync_sends_groups_back_to_the_writer_thread(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_module, "CALLER_FSYNC_US_MAX", 0)  # every real fdatasync is "slow"
    with on_caller(tmp_path) as (journal, completions, scheduled):
        append(journal, 0)  # no fdatasync measured yet: the caller's
        scheduled.pop()()
        append(journal, 1)  # the last one took longer than 0 µs: the writer thread's
        completions.wait_for(2)
        assert scheduled == []
        assert [thread == threading.get_ident() for _, _, thread in completions.groups] == [True, False]


class SlowSyncs(FileIO):
    """Real files whose fdatasync takes ``SLOW_SYNC_S`` longer while ``slow`` is set."""

    def __init__(self) -> None:
        self.slow = False

    def open_append(self, path: str, *, preallocate_bytes: int = 0) -> AppendFile:
        opened = super().open_append(path, preallocate_bytes=preallocate_bytes)
        owner = self

        class Slowed(AppendFile):
            def sync(self) -> None:
                if owner.slow:
                    time.sleep(SLOW_SYNC_S)
                super().sync()

        opened.__class__ = Slowed
        return opened


SLOW_SYNC_S = 0.3
SLOW_SYNC_US_MAX = 150_000
"""Above any real fdatasync of a few bytes here, below the slowed one."""
GROUPS_AFTER_SLOW = 10


def test_after_a_slow_fdatasync_groups_stay_with_the_writer_thread_for_a_while(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow syncs come in clusters: one fast sync by the writer thread does not bring the
    caller's thread (an event loop) back to the disk; ``CALLER_FSYNC_CALM_GROUPS`` of them do."""
    monkeypatch.setattr(journal_module, "CALLER_FSYNC_US_MAX", SLOW_SYNC_US_MAX)
    fileio = SlowSyncs()
    with on_caller(tmp_path, fileio=fileio) as (journal, completions, scheduled):
        append(journal, 0)
        scheduled.pop()()  # calm disk: the caller's
        fileio.slow = True
        append(journal, 1)
        scheduled.pop()()  # still the caller's: the slow sync is not known before it happens
        fileio.slow = False
        for entry_id in range(2, 2 + GROUPS_AFTER_SLOW):
            append(journal, entry_id)
            while scheduled:
                scheduled.pop()()
            completions.wait_for(entry_id + 1)
        on_caller_after_slow = sum(thread == threading.get_ident() for _, _, thread in completions.groups[2:])
        assert on_caller_after_slow == 0, f"{on_caller_after_slow} of {GROUPS_AFTER_SLOW} groups on the caller"
    assert replayed(tmp_path) == list(range(2 + GROUPS_AFTER_SLOW))


def test_a_failing_fdatasync_fails_the_callers_group_and_later_records(tmp_path: Path) -> None:
    fileio = FaultyFileIO(seed=7)
    with on_caller(tmp_path, fileio=fileio) as (journal, completions, scheduled):
        append(journal, 0)
        scheduled.pop()()
        fileio.inject("sync", "EIO", path_contains=".jnl")
        append(journal, 1)
        append(journal, 2)
        scheduled.pop()()
        completions.wait_for(3)  # by this drain, or by the writer thread if it held the lock then
        append(journal, 3)  # after the failure: refused at once
        assert [(tokens, error is None) for tokens, error, _ in completions.groups] == [
            ([0], True), ([1, 2], False), ([3], False)]
        assert isinstance(completions.groups[1][1], OSError)
        assert journal.failure is completions.groups[1][1]


def test_records_left_for_the_caller_at_close_are_written(tmp_path: Path) -> None:
    completions = Completions()
    journal = open_journal(tmp_path, completions)
    journal.write_on_caller_thread(lambda drain: None, backstop_ms=LONG_BACKSTOP_MS)
    append(journal, 0)
    journal.close()  # the writer thread writes what waits for the caller before it stops
    assert [(tokens, error) for tokens, error, _ in completions.groups] == [([0], None)]
    append(journal, 1)  # after close: refused, not left waiting
    assert [(tokens, type(error)) for tokens, error, _ in completions.groups[1:]] == [([1], StorageClosed)]
    assert replayed(tmp_path) == [0]


def test_turning_the_caller_path_off_while_the_writer_writes_strands_nothing(tmp_path: Path) -> None:
    """The caller's last drain finds the write lock taken (held here, as the writer thread holds
    it during a backstop commit) and the path is turned off meanwhile: the writer thread still
    writes the record once the lock is free."""
    with on_caller(tmp_path) as (journal, completions, scheduled):
        with journal._write_lock:
            append(journal, 0)
            journal.write_on_caller_thread(None)  # its drain cannot take the lock
            scheduled.pop()()  # nor can the one scheduled before
            assert completions.tokens() == []
        completions.wait_for(1)
        assert completions.groups[0][:2] == ([0], None)
        assert completions.groups[0][2] != threading.get_ident()


def test_a_group_that_would_grow_the_file_is_left_to_the_writer_thread(tmp_path: Path) -> None:
    """The caller's thread never writes preallocation zeros (here 4 KiB at a time)."""
    with on_caller(tmp_path) as (journal, completions, scheduled):
        append(journal, 0)
        scheduled.pop()()  # fits in the zeros the file started with: the caller's
        payload = b"p" * 10_000  # more than the zeros ahead (at most two steps of 4 KiB)
        journal.append((encode_header(RECORD_ADD_ENTRY, 1, 1, payload), payload), 1)
        scheduled.pop()()  # would grow the file: handed over
        completions.wait_for(2)
        assert [(tokens, thread == threading.get_ident()) for tokens, _, thread in completions.groups] == [
            ([0], True), ([1], False)]
    assert replayed(tmp_path) == [0, 1]


class GatedSyncFileIO(FileIO):
    """Real files whose journal fdatasync waits for the test once ``gate`` is set (``entered`` says
    a sync is waiting), to hold the writer thread inside a commit."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def open_append(self, path: str, *, preallocate_bytes: int = 0) -> AppendFile:
        opened = super().open_append(path, preallocate_bytes=preallocate_bytes)
        real_sync = opened.sync

        def sync() -> None:
            if self.gate:
                self.entered.set()
                assert self.release.wait(WAIT_S)
            real_sync()

        opened.sync = sync  # type: ignore[method-assign]
        return opened


def test_a_drain_that_finds_the_writer_busy_leaves_its_records_to_it(tmp_path: Path) -> None:
    """The writer thread commits a group the caller handed over (too big for the zeros ahead)
    while the caller appends again: the caller's drain cannot take the write lock, and the writer
    thread writes that record as soon as it is done, not a backstop period later."""
    fileio = GatedSyncFileIO()
    with on_caller(tmp_path, fileio=fileio) as (journal, completions, scheduled):
        try:
            fileio.gate = True
            payload = b"p" * 10_000
            journal.append((encode_header(RECORD_ADD_ENTRY, 1, 0, payload), payload), 0)
            scheduled.pop()()  # handed over: the writer thread commits it and waits in its sync
            assert fileio.entered.wait(WAIT_S)
            append(journal, 1)  # nothing queued: waits for the caller
            scheduled.pop()()  # the write lock is the writer thread's
            fileio.gate = False
            fileio.release.set()
            completions.wait_for(2)
            assert completions.tokens() == [0, 1]
            assert all(thread != threading.get_ident() for _, _, thread in completions.groups)
        finally:
            fileio.release.set()


def test_a_caller_whose_loop_is_closed_still_gets_its_record_written(tmp_path: Path) -> None:
    def closed_loop(drain: Callable[[], None]) -> None:
        raise RuntimeError("Event loop is closed")

    completions = Completions()
    journal = open_journal(tmp_path, completions)
    try:
        journal.write_on_caller_thread(closed_loop, backstop_ms=LONG_BACKSTOP_MS)
        append(journal, 0)  # accepted: no exception reaches the appender
        completions.wait_for(1)
        assert completions.groups[0][:2] == ([0], None)
    finally:
        journal.close()


def test_concurrent_writers_keep_each_threads_order_and_complete_each_record_once(tmp_path: Path) -> None:
    """The caller's thread appends and drains at seeded random points while three other threads
    append: every record completes once, without error, and each thread's records complete and
    replay in the order that thread appended them."""
    rng = random.Random(17)
    per_thread = 200

    def appender(thread_index: int) -> None:
        for n in range(per_thread):
            append(journal, thread_index * 10_000 + n)
            if n % 20 == 0:
                time.sleep(0.001)  # gaps, so the journal goes idle and the caller's path is taken too

    with on_caller(tmp_path, backstop_ms=1.0) as (journal, completions, scheduled):
        others = [threading.Thread(target=appender, args=(index,)) for index in (1, 2, 3)]
        for thread in others:
            thread.start()
        for n in range(per_thread):
            append(journal, n)
            if scheduled and rng.random() < 0.3:
                scheduled.pop(0)()
            if n % 10 == 0:
                time.sleep(rng.random() * 0.002)
        for thread in others:
            thread.join(WAIT_S)
        while scheduled:
            scheduled.pop(0)()
        completions.wait_for(4 * per_thread)
        assert all(error is None for _, error, _ in completions.groups)
        done = completions.tokens()
        assert sorted(done) == sorted(i * 10_000 + n for i in range(4) for n in range(per_thread))
    on_disk = replayed(tmp_path)
    for order in (done, on_disk):
        for index in range(4):
            mine = [token for token in order if token // 10_000 == index]
            assert mine == sorted(mine)


def test_an_event_loop_completes_its_own_adds(tmp_path: Path) -> None:
    config = StorageConfig.test_min()

    async def add_all(st: LedgerStorage) -> tuple[list[int], set[int]]:
        loop = asyncio.get_running_loop()
        st.write_journal_on_caller_thread(loop.call_soon, backstop_ms=LONG_BACKSTOP_MS)
        threads: set[int] = set()
        futures = [st.add_entries(5, [entry_id], [b"x%d" % entry_id]) for entry_id in range(4)]
        for future in futures:
            future.add_done_callback(lambda _: threads.add(threading.get_ident()))
        results = [await asyncio.wrap_future(future) for future in futures]
        st.write_journal_on_caller_thread(None)
        return results, threads

    with LedgerStorage.open(str(tmp_path), config) as st:
        results, threads = asyncio.run(add_all(st))
        assert results == [0, 1, 2, 3]
        assert threads == {threading.get_ident()}  # completed on the loop, no hand-over
        assert st.statistics().journal.groups_on_caller_thread == 1
    with LedgerStorage.open(str(tmp_path), config) as st:
        assert [st.get_entry(5, entry_id) for entry_id in range(4)] == [b"x%d" % e for e in range(4)]
