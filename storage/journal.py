"""Journal: the bookie's write-ahead log, with group commit.

Role in the write path: ``LedgerStorage.add_entries`` puts the entries in the write cache, then
hands their journal records here as one item; the single writer thread appends queued records with one
``writev`` and makes the whole group durable with one ``fdatasync`` before completing every
waiter. An entry is acknowledged only after its record is synced.

Record format (big-endian), interleaved across ledgers::

    [length u32][crc32c u32][type u8][ledger u64][entry u64][payload]

``length`` counts ``type..payload``; the CRC covers the same bytes. Files are named
``{file_id:016x}.jnl`` and rotate at ``journal_file_bytes_max``. They are preallocated with
zeros ``journal_preallocate_bytes`` ahead of the writes (see ``AppendFile``), so a group's
``fdatasync`` flushes data without a file-size change to commit; a zero header is not a
record, so the scan stops at the zeros after the last record. A ``LogMark`` (file id,
offset) names a position; the checkpoint persists one in ``lastMark`` and replay starts there.

Invariants:
- Whoever holds the write lock (the writer thread, or the caller's thread below) is the only
  writer of journal files; records reach disk in append order.
- A waiter is completed only after the ``fdatasync`` that covers its record (unless
  ``journal_sync`` is off, an explicit opt-out).
- Replay stops at the first torn or garbled record of a file and truncates the file there, so
  every complete record before the cut is kept and nothing after it is half-applied.
- The queue needs no bound of its own: every queued add already holds room in the bounded
  write cache, so queued bytes never exceed the write cache's two buffers.
- After a write or sync error the journal fails every pending and later record (read-only).
- Written on the caller's thread when idle (:meth:`Journal.write_on_caller_thread`): records
  appended on that thread while nothing is queued for the writer thread wait in a list that the
  caller's scheduler drains with one group write and fdatasync, saving two thread hand-overs
  per group at low rates. The writer thread takes such records first, and takes what arrives
  while it holds the write lock before it lets go, so records still reach disk in append order.
  A group that would grow the file (preallocation) or that follows a full file is left to the
  writer thread, so the caller's thread never pays for zeros or a rotation. The writer thread polls every
  ``backstop_ms`` while the caller appends (not once it has been idle for ``CALLER_IDLE_S``; its
  next record wakes the writer thread once): records the caller's thread leaves undrained (it
  blocks waiting on them, or stays busy) are written by the writer thread, late but never lost.
  After an fdatasync slower than ``CALLER_FSYNC_US_MAX`` groups go to the writer thread until
  ``CALLER_FSYNC_CALM_GROUPS`` syncs in a row were fast again, so a cluster of slow syncs stalls
  the caller's thread (an event loop) at most once.
- Rotation opens the next file before it lets the current one go, after the group it follows
  is completed: a rotation that fails transiently (out of file descriptors) leaves the journal
  writing to its current file and is tried again after the next group (logged once).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from storage.fileio import AppendFile, FileIO
from storage.histogram import LatencyHistogram, LatencySnapshot
from storage.io_errors import OnceLog, is_transient
from storage.limits import (
    CALLER_BACKSTOP_MS,
    CALLER_FSYNC_CALM_GROUPS,
    CALLER_FSYNC_US_MAX,
    CALLER_IDLE_S,
    GROUP_NAP_S,
    JOURNAL_SCAN_CHUNK_BYTES,
    RECORD_PAYLOAD_BYTES_MAX,
)

RECORD_ADD_ENTRY = 1
RECORD_FENCE = 2

_HEADER = struct.Struct(">IIBQQ")  # length, crc, type, ledger, entry
HEADER_SIZE = _HEADER.size
_BODY_HEAD = struct.Struct(">BQQ")
_MARK = struct.Struct(">QQI")  # file id, offset, crc32c of the first 16 bytes
MARK_FILE = "lastMark"
SUFFIX = ".jnl"
_NOTHING_QUEUED: tuple[Sequence[bytes], int, Any] = ((), 0, "backstop")
"""The writer thread's backstop woke with nothing queued."""
_WAKE: tuple[Sequence[bytes], int, Any] = ((), 0, "wake")
"""Queued to make the writer thread take up a new backstop period; not a record."""

log = logging.getLogger(__name__)

GroupCompletion = Callable[[list[Any], BaseException | None], None]
"""Called once per group by whoever wrote it (the writer thread, or the caller's thread of
:meth:`Journal.write_on_caller_thread`), under the write lock: the tokens, and None or the error."""

FSYNC_BUCKETS_US = (50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000)


@dataclass(frozen=True, order=True)
class LogMark:
    file_id: int
    offset: int


@dataclass(frozen=True)
class JournalStats:
    records_written: int
    bytes_written: int
    fsync_count: int
    fsync_seconds_total: float
    fsync_latency_buckets_us: tuple[tuple[int, int], ...]
    """Cumulative histogram: (upper bound in µs, count of fsyncs at or under it)."""
    fsync_latency: LatencySnapshot
    """The same histogram with its count and sum, taken together (for ``/metrics``)."""
    groups_committed: int
    largest_group_records: int
    groups_on_caller_thread: int
    """Groups written by the appending thread itself (see :meth:`Journal.write_on_caller_thread`)."""
    queue_depth: int
    current_file_id: int
    files: int
    failed: bool


def _closed_error() -> BaseException:
    from storage.errors import StorageClosed

    return StorageClosed("journal closed")


def encode_header(record_type: int, ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    crc = crc32c.crc32c(payload, crc32c.crc32c(_BODY_HEAD.pack(record_type, ledger_id, entry_id)))
    return _HEADER.pack(_BODY_HEAD.size + len(payload), crc, record_type, ledger_id, entry_id)


def file_name(file_id: int) -> str:
    return f"{file_id:016x}{SUFFIX}"


@dataclass(frozen=True)
class JournalRecord:
    record_type: int
    ledger_id: int
    entry_id: int
    payload: bytes
    end: LogMark


class FileScan:
    """Iterate the complete, CRC-valid records of one journal file from ``start``, reading in
    bounded chunks. After iteration ``good_end`` is the end of the last good record: the cut
    point for a torn or garbled tail."""

    def __init__(self, fileio: FileIO, path: str, file_id: int, start: int) -> None:
        self._fileio = fileio
        self._path = path
        self._file_id = file_id
        self.good_end = start

    def __iter__(self) -> Iterator[JournalRecord]:
        reader = self._fileio.open_read(self._path)
        try:
            size = reader.size_bytes()
            pos = self.good_end
            buf, buf_start = b"", pos
            while pos + HEADER_SIZE <= size:
                if pos + HEADER_SIZE > buf_start + len(buf):
                    buf, buf_start = reader.pread(JOURNAL_SCAN_CHUNK_BYTES, pos), pos
                length, crc, rtype, ledger, entry = _HEADER.unpack_from(buf, pos - buf_start)
                end = pos + 8 + length
                if not _BODY_HEAD.size <= length <= _BODY_HEAD.size + RECORD_PAYLOAD_BYTES_MAX or end > size:
                    return
                if end > buf_start + len(buf):
                    buf, buf_start = reader.pread(max(JOURNAL_SCAN_CHUNK_BYTES, end - pos), pos), pos
                view = memoryview(buf)[pos + 8 - buf_start : end - buf_start]
                if crc32c.crc32c(view) != crc or rtype not in (RECORD_ADD_ENTRY, RECORD_FENCE):
                    return
                yield JournalRecord(rtype, ledger, entry, bytes(view[_BODY_HEAD.size :]), LogMark(self._file_id, end))
                pos = self.good_end = end
        finally:
            reader.close()


class Journal:
    """Group-committing write-ahead log. Create, :meth:`replay`, then :meth:`start`."""

    def __init__(self, directory: str, fileio: FileIO, complete: GroupCompletion, *, sync: bool,
                 group_wait_ms: float, group_bytes_max: int, file_bytes_max: int,
                 preallocate_bytes: int) -> None:
        self._dir = directory
        self._complete = complete
        self._fileio = fileio
        self._sync = sync
        self._group_wait_s = group_wait_ms / 1000.0
        self._group_bytes_max = group_bytes_max
        self._file_bytes_max = file_bytes_max
        self._preallocate_bytes = preallocate_bytes
        self._queue: queue.SimpleQueue[tuple[Sequence[bytes], int, Any] | None] = queue.SimpleQueue()
        """Items: (the buffers of one or more records, their size in bytes, the token)."""
        self._file: AppendFile | None = None
        self._file_id = 0
        self._written_mark = LogMark(0, 0)
        self._failure: BaseException | None = None
        self._rotation_trouble = OnceLog(log, "starting a new journal file")
        self._thread: threading.Thread | None = None
        self._stats_lock = threading.Lock()
        self._records_written = 0
        self._bytes_written = 0
        self._fsync_latency = LatencyHistogram(FSYNC_BUCKETS_US)
        self._groups = 0
        self._largest_group = 0
        self._caller_groups = 0
        self._write_lock = threading.Lock()
        """Held by whoever writes a group: the writer thread or the caller's thread."""
        self._state_lock = threading.Lock()
        self._queued = 0
        """Items in the queue or in the writer thread's hands, not yet completed."""
        self._at_caller: list[tuple[Sequence[bytes], int, Any]] = []
        """Items appended on the caller's thread, waiting for its scheduled write (or the writer
        thread's backstop)."""
        self._caller_thread: int | None = None
        self._caller_schedule: Callable[[Callable[[], None]], object] | None = None
        self._caller_backstop_s: float | None = None
        self._fast_fsyncs_in_row = CALLER_FSYNC_CALM_GROUPS
        self._caller_added_at = 0.0
        self._closing = False
        self._handover = False
        """Records at the caller are the writer thread's to write (set before it is woken, or
        while it holds the write lock)."""
        self._writer_asleep = False
        """The writer thread waits without a backstop (the caller's thread was idle)."""
        fileio.make_dirs(directory)

    # --- files and marks ---------------------------------------------------------------
    def file_ids(self) -> list[int]:
        return sorted(int(n[: -len(SUFFIX)], 16) for n in self._fileio.list_dir(self._dir) if n.endswith(SUFFIX))

    def _path(self, file_id: int) -> str:
        return f"{self._dir}/{file_name(file_id)}"

    def read_mark(self) -> LogMark:
        path = f"{self._dir}/{MARK_FILE}"
        if not self._fileio.exists(path):
            return LogMark(0, 0)
        raw = self._fileio.read_file(path)
        if len(raw) != _MARK.size:
            raise ValueError(f"journal mark file {path} has {len(raw)} bytes")
        file_id, offset, crc = _MARK.unpack(raw)
        if crc32c.crc32c(raw[:16]) != crc:
            raise ValueError(f"journal mark file {path} fails its CRC")
        return LogMark(file_id, offset)

    def write_mark(self, mark: LogMark) -> None:
        head = struct.pack(">QQ", mark.file_id, mark.offset)
        self._fileio.write_atomic(f"{self._dir}/{MARK_FILE}", head + struct.pack(">I", crc32c.crc32c(head)))

    def trim_before(self, mark: LogMark) -> int:
        """Delete journal files wholly before ``mark``; return how many were deleted."""
        removed = 0
        for file_id in self.file_ids():
            if file_id < mark.file_id and file_id != self._file_id:
                self._fileio.remove(self._path(file_id))
                removed += 1
        return removed

    # --- recovery ----------------------------------------------------------------------
    def replay(self, mark: LogMark) -> Iterator[JournalRecord]:
        """Yield every complete record after ``mark``; truncate torn tails in place."""
        for file_id in self.file_ids():
            if file_id < mark.file_id:
                continue
            start = mark.offset if file_id == mark.file_id else 0
            path = self._path(file_id)
            scan = FileScan(self._fileio, path, file_id, start)
            yield from scan
            if scan.good_end < self._fileio.file_size(path):
                self._fileio.truncate(path, scan.good_end)

    # --- writing -------------------------------------------------------------------------
    def start(self) -> None:
        ids = self.file_ids()
        self._open_file((ids[-1] + 1) if ids else 1)
        self._thread = threading.Thread(target=self._run, name="magnetar-journal", daemon=True)
        self._thread.start()

    def _open_file(self, file_id: int) -> None:
        opened = self._fileio.open_append(self._path(file_id), preallocate_bytes=self._preallocate_bytes)
        with contextlib.suppress(OSError):  # else the first write reserves them, and fails there
            opened.preallocate()  # zeros ahead from the start: a caller's thread can write the first group
        if self._file is not None:
            self._file.close()
        self._file = opened
        self._file_id = file_id
        self._written_mark = LogMark(file_id, self._file.size_bytes)

    def _rotate_if_full(self) -> None:
        """Start the next file once the current one reached its size limit (writer thread)."""
        if self._file is None or self._file.size_bytes < self._file_bytes_max:
            return
        try:
            self._open_file(self._file_id + 1)
        except OSError as exc:
            if not is_transient(exc):
                self._failure = exc
                return
            self._rotation_trouble.failed(exc)
            return
        self._rotation_trouble.succeeded()

    def write_on_caller_thread(self, schedule: Callable[[Callable[[], None]], object] | None, *,
                               backstop_ms: float = CALLER_BACKSTOP_MS) -> None:
        """From now on, records appended on the calling thread while the writer thread has nothing
        queued are written by that thread: ``schedule`` (an event loop's ``call_soon``) is handed
        the drain once per group, to run after the caller's current work, with no lock held. The
        writer thread then wakes every ``backstop_ms`` to write what stays undrained. ``None``
        turns this off (pending records are drained first, on this thread)."""
        if schedule is None:
            self._caller_thread = None
            self._caller_schedule = None
            self._drain_at_caller()
            if self._at_caller:  # the writer thread holds the write lock: it takes them
                self._hand_over()
            return
        if backstop_ms <= 0:
            raise ValueError("backstop_ms must be positive")
        self._caller_backstop_s = backstop_ms / 1000.0
        self._caller_schedule = schedule
        self._caller_thread = threading.get_ident()
        self._queue.put(_WAKE)  # the writer thread may be waiting without a timeout

    def append(self, buffers: Sequence[bytes], token: Any) -> None:
        """Queue records (``buffers``: each record's header from :func:`encode_header`, then its
        payload, in order) under one ``token``. They are written in one group, so the token is
        handed to the completion callback once, with the rest of its group, when all of them are
        durable (error None), or with the error that means none is."""
        self._add((buffers, sum(map(len, buffers)), token))

    def _add(self, item: tuple[Sequence[bytes], int, Any]) -> None:
        if self._failure is not None or self._closing:
            self._complete([item[2]], self._failure or _closed_error())
            return
        if self._caller_thread == threading.get_ident() and self._fast_fsyncs_in_row >= CALLER_FSYNC_CALM_GROUPS:
            with self._state_lock:
                if self._closing:
                    closed: BaseException | None = self._failure or _closed_error()
                else:
                    closed = None
                at_caller = self._queued == 0 and closed is None
                if at_caller:
                    first = not self._at_caller
                    self._at_caller.append(item)
                    self._caller_added_at = time.monotonic()
                    wake_writer, self._writer_asleep = self._writer_asleep, False
            if closed is not None:
                self._complete([item[2]], closed)
                return
            if at_caller:
                if wake_writer:  # back from idle: the writer thread takes up its backstop
                    self._queue.put(_WAKE)
                schedule = self._caller_schedule
                if first and schedule is not None:
                    try:
                        schedule(self._drain_at_caller)
                    except RuntimeError:  # the caller's loop is closed: the writer thread takes it
                        self._hand_over()
                return
        with self._state_lock:
            self._queued += 1
        self._queue.put(item)

    def _drain_at_caller(self) -> None:
        """Write what waits for the caller's thread, as one group (unless the writer thread has
        the write lock: it takes those records first)."""
        if not self._write_lock.acquire(blocking=False):
            self._handover = True  # the writer thread is writing: it looks again once done
            return
        try:
            with self._state_lock:
                if not self._at_caller:
                    return
                size = sum(item[1] for item in self._at_caller)
                if self._file is not None and (self._file.size_bytes >= self._file_bytes_max
                                               or not self._file.fits_preallocated(size)):
                    leave_to_writer = True  # zeros to write or a file to start: not on this thread
                else:
                    leave_to_writer = False
                    group, self._at_caller = self._at_caller, []
            if leave_to_writer:
                self._hand_over()
                return
            self._caller_groups += 1
            self._commit(group, rotate=False)
        finally:
            self._write_lock.release()

    def _hand_over(self) -> None:
        """Leave what waits for the caller's thread to the writer thread, and wake it."""
        self._handover = True
        self._queue.put(_WAKE)

    def _commit(self, group: list[tuple[Sequence[bytes], int, Any]], *, rotate: bool = True) -> None:
        """Write one group, make it durable, complete it (write lock held); then start the next
        file if this one is full (``rotate``: the writer thread's part)."""
        tokens = [token for _, _, token in group]
        if self._file is None:  # closed meanwhile
            self._complete(tokens, self._failure or _closed_error())
            return
        if self._failure is None:
            try:
                self._write_group(group)
            except OSError as exc:
                self._failure = exc
        self._complete(tokens, self._failure)
        if self._failure is None and rotate:
            self._rotate_if_full()

    def last_written_mark(self) -> LogMark:
        """The position just after the last record written to the journal file."""
        return self._written_mark

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def close(self) -> None:
        with self._state_lock:
            self._closing = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._caller_thread = None
        with self._write_lock, self._state_lock:
            left, self._at_caller = self._at_caller, []
        if left:  # appended after the writer thread's last look (it writes what waits at stop)
            self._complete([token for _, _, token in left], self._failure or _closed_error())
        if self._file is not None:
            self._file.close()
            self._file = None

    def _collect(self, first: tuple[Sequence[bytes], int, Any]) -> tuple[list[tuple[Sequence[bytes], int, Any]], bool]:
        """Gather a group: drain what is queued; while records keep arriving and the group is
        under its byte limit, nap in short slices (up to ``group_wait_ms`` in all) and drain
        again. Napping, not blocking per record, keeps producers from waking this thread for
        every add; a nap that brings nothing new ends the group at once (idle producers)."""
        group = [first]
        size = first[1]
        deadline = time.monotonic() + self._group_wait_s
        while True:
            drained, size, stop = self._drain_into(group, size)
            if stop:
                return group, True
            if size >= self._group_bytes_max:
                return group, False
            remaining = deadline - time.monotonic()
            if remaining <= 0 or drained == 0:
                return group, False
            time.sleep(min(remaining, GROUP_NAP_S))

    def _drain_into(self, group: list[tuple[Sequence[bytes], int, Any]], size: int) -> tuple[int, int, bool]:
        drained = 0
        while size < self._group_bytes_max:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return drained, size, True
            if item is _WAKE:
                continue
            group.append(item)
            size += item[1]
            drained += 1
        return drained, size, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first: tuple[Sequence[bytes], int, Any] | None
            if self._handover:  # the caller's thread left its records to this thread
                self._handover = False
                first = _NOTHING_QUEUED
            else:
                try:
                    first = self._queue.get(timeout=self._backstop_wait_s())
                except queue.Empty:
                    if not self._at_caller:
                        continue
                    first = _NOTHING_QUEUED
            if first is None:
                stop = True
                first = _NOTHING_QUEUED
            elif first is _WAKE:
                continue  # a new wait (backstop period), or a hand-over to look at
            with self._write_lock:
                with self._state_lock:  # records the caller's thread left undrained go first
                    group, self._at_caller = self._at_caller, []
                taken = 0
                if first is not _NOTHING_QUEUED:
                    collected, stop = self._collect(first)
                    group += collected
                    taken = len(collected)
                while group:  # then what the caller's thread appended meanwhile, before letting go
                    self._commit(group)
                    with self._state_lock:
                        group, self._at_caller = self._at_caller, []
                if self._failure is None and self._file is not None:
                    self._rotate_if_full()  # a full file the caller's thread left
            if taken:
                with self._state_lock:
                    self._queued -= taken
        self._drain_after_stop()

    def _backstop_wait_s(self) -> float | None:
        """How long the writer thread may wait for the queue: the backstop period while the
        caller's thread appends, else without limit (after ``CALLER_IDLE_S`` without its records;
        the caller's next record then wakes this thread once, see :meth:`_add`)."""
        with self._state_lock:
            if self._caller_thread is None:
                return self._caller_backstop_s if self._at_caller else None
            if self._at_caller or time.monotonic() - self._caller_added_at < CALLER_IDLE_S:
                return self._caller_backstop_s
            self._writer_asleep = True
            return None

    def _drain_after_stop(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item is not _WAKE:
                self._complete([item[2]], self._failure or _closed_error())

    def _write_group(self, group: list[tuple[Sequence[bytes], int, Any]]) -> None:
        assert self._file is not None
        buffers: list[bytes] = []
        records = 0
        for parts, _, _ in group:
            buffers.extend(part for part in parts if part)
            records += len(parts) // 2
        self._fileio.failpoint("journal: before write")
        self._file.writev(buffers)
        self._fileio.failpoint("journal: before fdatasync")
        if self._sync:
            started = time.perf_counter()
            self._file.sync()
            spent_s = time.perf_counter() - started
            self._fsync_latency.record(spent_s)
            self._fast_fsyncs_in_row = self._fast_fsyncs_in_row + 1 if spent_s * 1e6 <= CALLER_FSYNC_US_MAX else 0
        self._fileio.failpoint("journal: after fdatasync")
        written = self._file.size_bytes - self._written_mark.offset
        with self._stats_lock:
            self._records_written += records
            self._bytes_written += written
            self._groups += 1
            self._largest_group = max(self._largest_group, records)
        self._written_mark = LogMark(self._file_id, self._file.size_bytes)

    def statistics(self) -> JournalStats:
        fsync = self._fsync_latency.snapshot()
        with self._stats_lock:
            return JournalStats(
                records_written=self._records_written,
                bytes_written=self._bytes_written,
                fsync_count=fsync.count,
                fsync_seconds_total=fsync.sum_seconds,
                fsync_latency_buckets_us=fsync.buckets_us(),
                fsync_latency=fsync,
                groups_committed=self._groups,
                largest_group_records=self._largest_group,
                groups_on_caller_thread=self._caller_groups,
                queue_depth=self._queue.qsize() + len(self._at_caller),
                current_file_id=self._file_id,
                files=len(self.file_ids()),
                failed=self._failure is not None,
            )
