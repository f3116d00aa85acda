"""Entry logs: the bookie's long-term home for entry data.

Role: a flush appends the write cache's sorted entries here and records each entry's location
in the index; reads come here after every cache missed. Files are ``{log_id:08x}.log``, each
starting with a 16-byte header (``MGNTELOG``, version, log id), then records (big-endian)::

    [size u32][ledger u64][entry u64][crc32c u32][data]

The CRC covers ledger, entry and data. An entry's location is ``(log_id << 32) | offset`` of
its record; offset 0 is the header, so location 0 always means "absent".

Invariants:
- Appends come from one thread at a time (the caller holds the flush lock).
- A location is handed to the index only after :meth:`EntryLogger.flush` made it durable.
- A read checks the record's ledger, entry, size and CRC and raises ``CorruptEntry`` rather
  than return wrong bytes. Logs rotate at ``entry_log_size_bytes_max``; a rotated log is never
  written again (GC may delete it whole after copying its live entries elsewhere).
"""

from __future__ import annotations

import contextlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import crc32c

from storage.errors import CorruptEntry
from storage.fileio import AppendFile, FileIO, ReadFile
from storage.limits import ENTRY_BYTES_MAX, ENTRY_LOG_SCAN_CHUNK_BYTES, FIRST_READ_BYTES

try:
    from storage._entry_records import parse_records as _native_parse_records
except ImportError:  # built without a C compiler (see setup.py)
    NATIVE_RECORDS = False
else:
    NATIVE_RECORDS = True
"""Whether the records read ahead are parsed and checked by ``_entry_records.c`` (which takes the
ids and counts of stored entries: a ledger id of 64 bits, a count of 63)."""

MAGIC = b"MGNTELOG"
VERSION = 1
_FILE_HEADER = struct.Struct(">8sII")
FILE_HEADER_SIZE = _FILE_HEADER.size
_RECORD = struct.Struct(">IQQI")
RECORD_HEADER_SIZE = _RECORD.size
_IDS = struct.Struct(">QQ")
SUFFIX = ".log"


class LogMissing(Exception):
    """The entry log was removed (by GC) after its location was looked up."""


def make_location(log_id: int, offset: int) -> int:
    return (log_id << 32) | offset


def split_location(location: int) -> tuple[int, int]:
    return location >> 32, location & 0xFFFFFFFF


def record_crc(ledger_id: int, entry_id: int, data: bytes | memoryview) -> int:
    return crc32c.crc32c(data, crc32c.crc32c(_IDS.pack(ledger_id, entry_id)))


@dataclass(frozen=True)
class ScannedRecord:
    log_id: int
    offset: int
    ledger_id: int
    entry_id: int
    size_bytes: int

    @property
    def location(self) -> int:
        return make_location(self.log_id, self.offset)


@dataclass(frozen=True)
class EntryLogStats:
    logs: int
    current_log_id: int
    bytes_appended: int
    entries_appended: int
    syncs: int
    reads: int
    read_ahead_entries: int
    disk_bytes: int
    scans: int


class EntryLogger:
    def __init__(self, directory: str, fileio: FileIO, *, size_bytes_max: int,
                 write_buffer_bytes: int, open_read_files_max: int) -> None:
        self._dir = directory
        self._fileio = fileio
        self._size_bytes_max = size_bytes_max
        self._write_buffer_bytes = write_buffer_bytes
        self._open_read_files_max = open_read_files_max
        fileio.make_dirs(directory)
        ids = self.log_ids()
        self._next_log_id = (ids[-1] + 1) if ids else 1
        self._current: AppendFile | None = None
        self._current_id = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._current_usage: dict[int, int] = {}
        self.sealed_usage: dict[int, dict[int, int]] = {}
        """Bytes per ledger of logs sealed by this process (known from appends, no scan needed)."""
        self._readers: OrderedDict[int, ReadFile] = OrderedDict()
        self._readers_lock = threading.Lock()
        self._bytes_appended = 0
        self._entries_appended = 0
        self._syncs = 0
        self._reads = 0
        self._read_ahead_entries = 0
        self._scans = 0

    # --- files -------------------------------------------------------------------------
    def path(self, log_id: int) -> str:
        return f"{self._dir}/{log_id:08x}{SUFFIX}"

    def log_ids(self) -> list[int]:
        return sorted(int(n[: -len(SUFFIX)], 16) for n in self._fileio.list_dir(self._dir) if n.endswith(SUFFIX))

    @property
    def current_log_id(self) -> int:
        """The log being appended to (0 before the first append)."""
        return self._current_id

    def sealed_log_ids(self) -> list[int]:
        """Logs that will never be written again. Call with appends excluded (flush lock held):
        a log being created by a rotation has an id at or above the bound."""
        bound = self._current_id if self._current is not None else self._next_log_id
        return [log_id for log_id in self.log_ids() if log_id < bound]

    def disk_bytes(self) -> int:
        return sum(self._fileio.file_size(self.path(i)) for i in self.log_ids())

    # --- appending ---------------------------------------------------------------------
    def add(self, ledger_id: int, entry_id: int, data: bytes) -> int:
        """Append one record (buffered); return its location. Durable after :meth:`flush`."""
        record_bytes = RECORD_HEADER_SIZE + len(data)
        if self._current is None or (
            self._current.size_bytes + self._pending_bytes + record_bytes > self._size_bytes_max
            and self._current.size_bytes + self._pending_bytes > FILE_HEADER_SIZE
        ):
            self._rotate()
        assert self._current is not None
        offset = self._current.size_bytes + self._pending_bytes
        self._pending.append(_RECORD.pack(len(data), ledger_id, entry_id, record_crc(ledger_id, entry_id, data)))
        self._pending.append(data)
        self._pending_bytes += record_bytes
        self._current_usage[ledger_id] = self._current_usage.get(ledger_id, 0) + record_bytes
        self._bytes_appended += record_bytes
        self._entries_appended += 1
        if self._pending_bytes >= self._write_buffer_bytes:
            self._write_pending()
        return make_location(self._current_id, offset)

    def add_many(self, entries: Iterable[tuple[int, int, bytes]]) -> list[tuple[int, int, int]]:
        """:meth:`add` for a whole flush: ``(ledger, entry, data)`` in, ``(ledger, entry,
        location)`` out, with the per-record work kept in one loop."""
        located: list[tuple[int, int, int]] = []
        pack, ids, crc = _RECORD.pack, _IDS.pack, crc32c.crc32c
        pending, usage = self._pending, self._current_usage
        for ledger_id, entry_id, data in entries:
            record_bytes = RECORD_HEADER_SIZE + len(data)
            if self._current is None or (
                self._current.size_bytes + self._pending_bytes + record_bytes > self._size_bytes_max
                and self._current.size_bytes + self._pending_bytes > FILE_HEADER_SIZE
            ):
                self._rotate()
                pending, usage = self._pending, self._current_usage
            assert self._current is not None
            offset = self._current.size_bytes + self._pending_bytes
            pending.append(pack(len(data), ledger_id, entry_id, crc(data, crc(ids(ledger_id, entry_id)))))
            pending.append(data)
            self._pending_bytes += record_bytes
            self._bytes_appended += record_bytes
            usage[ledger_id] = usage.get(ledger_id, 0) + record_bytes
            located.append((ledger_id, entry_id, (self._current_id << 32) | offset))
            if self._pending_bytes >= self._write_buffer_bytes:
                self._write_pending()
                pending = self._pending
        self._entries_appended += len(located)
        return located

    def _write_pending(self) -> None:
        if self._pending and self._current is not None:
            self._current.write(b"".join(self._pending))
            self._pending = []
            self._pending_bytes = 0

    def flush(self) -> None:
        """Write buffered records and fdatasync the current log."""
        if self._current is None:
            return
        self._write_pending()
        self._current.sync()
        self._syncs += 1

    def _rotate(self) -> None:
        """Seal the current log and start the next. A failure leaves no current log (the next
        add starts one again) and no half-written file behind."""
        if self._current is not None:
            self.flush()
            self._current.close()
            self.sealed_usage[self._current_id] = self._current_usage
            self._current = None
            self._current_usage = {}
        log_id = self._next_log_id
        current = self._fileio.open_append(self.path(log_id))
        try:
            current.write(_FILE_HEADER.pack(MAGIC, VERSION, log_id))
        except BaseException:
            current.close()
            with contextlib.suppress(OSError):
                self._fileio.remove(self.path(log_id))
            raise
        self._next_log_id += 1
        self._current, self._current_id = current, log_id

    def current_usage(self) -> tuple[int, dict[int, int]]:
        """The current log's id and bytes per ledger so far (id 0 while there is none)."""
        if self._current is None:
            return 0, {}
        return self._current_id, dict(self._current_usage)

    def close(self) -> None:
        if self._current is not None:
            self._write_pending()
            self._current.close()
            self._current = None
        with self._readers_lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()

    def abandon_pending(self) -> None:
        """Drop buffered, unwritten records (after a failed flush)."""
        self._pending = []
        self._pending_bytes = 0

    def remove_log(self, log_id: int) -> None:
        if self._current is not None and log_id == self._current_id:
            raise ValueError("the current entry log cannot be removed")
        with self._readers_lock:
            reader = self._readers.pop(log_id, None)
        if reader is not None:
            reader.close()
        try:
            self._fileio.remove(self.path(log_id))
        except FileNotFoundError:
            return  # already removed

    # --- reading -------------------------------------------------------------------------
    def _reader(self, log_id: int) -> ReadFile:
        with self._readers_lock:
            reader = self._readers.get(log_id)
            if reader is not None:
                self._readers.move_to_end(log_id)
                return reader
            try:
                reader = self._fileio.open_read(self.path(log_id))
            except FileNotFoundError as exc:
                raise LogMissing(log_id) from exc
            self._readers[log_id] = reader
            while len(self._readers) > self._open_read_files_max:
                _, old = self._readers.popitem(last=False)
                old.close()
            return reader

    def read(self, location: int, ledger_id: int, entry_id: int, *, read_ahead_entries: int = 0,
             read_ahead_bytes: int = 0) -> tuple[bytes, list[tuple[int, bytes]]]:
        """Read the entry at ``location`` and up to ``read_ahead_entries`` following entries of
        the same ledger found in the same read. Raises ``CorruptEntry`` on any mismatch."""
        log_id, offset = split_location(location)
        reader = self._reader(log_id)
        self._reads += 1
        head = reader.pread(RECORD_HEADER_SIZE + FIRST_READ_BYTES, offset)
        if len(head) < RECORD_HEADER_SIZE:
            raise CorruptEntry(f"entry {ledger_id}:{entry_id}: truncated record header in log {log_id} at {offset}")
        size, rec_ledger, rec_entry, crc = _RECORD.unpack_from(head, 0)
        if (rec_ledger, rec_entry) != (ledger_id, entry_id) or size > ENTRY_BYTES_MAX:
            raise CorruptEntry(
                f"entry {ledger_id}:{entry_id}: log {log_id} offset {offset} holds a record for "
                f"{rec_ledger}:{rec_entry} of {size} bytes"
            )
        end = RECORD_HEADER_SIZE + size
        # One more read covers the record's rest plus read-ahead sized for entries like this one.
        ahead_bytes = min(read_ahead_bytes, end * read_ahead_entries) if read_ahead_entries else 0
        chunk = head
        if end + ahead_bytes > len(head):
            chunk = head + reader.pread(end + ahead_bytes - len(head), offset + len(head))
        if len(chunk) < end:
            raise CorruptEntry(f"entry {ledger_id}:{entry_id}: record cut short in log {log_id}")
        data = chunk[RECORD_HEADER_SIZE:end]
        if record_crc(ledger_id, entry_id, data) != crc:
            raise CorruptEntry(f"entry {ledger_id}:{entry_id}: CRC mismatch in log {log_id} at {offset}")
        ahead = _native_parse_records(chunk, end, ledger_id, read_ahead_entries) \
            if NATIVE_RECORDS and type(chunk) is bytes else self._parse_ahead(chunk, end, ledger_id, read_ahead_entries)
        self._read_ahead_entries += len(ahead)
        return data, ahead

    @staticmethod
    def _parse_ahead(chunk: bytes, pos: int, ledger_id: int, limit: int) -> list[tuple[int, bytes]]:
        ahead: list[tuple[int, bytes]] = []
        view = memoryview(chunk)
        while len(ahead) < limit and pos + RECORD_HEADER_SIZE <= len(chunk):
            size, rec_ledger, rec_entry, crc = _RECORD.unpack_from(chunk, pos)
            end = pos + RECORD_HEADER_SIZE + size
            if rec_ledger != ledger_id or end > len(chunk):
                break
            data = view[pos + RECORD_HEADER_SIZE : end]
            if record_crc(rec_ledger, rec_entry, data) != crc:
                break
            ahead.append((rec_entry, bytes(data)))
            pos = end
        return ahead

    def scan(self, log_id: int) -> Iterator[ScannedRecord]:
        """Every complete record of a log, in file order (stops at a torn tail)."""
        reader = self._fileio.open_read(self.path(log_id))
        self._scans += 1
        try:
            size_bytes = reader.size_bytes()
            pos = FILE_HEADER_SIZE
            while pos + RECORD_HEADER_SIZE <= size_bytes:
                chunk = reader.pread(min(ENTRY_LOG_SCAN_CHUNK_BYTES, size_bytes - pos), pos)
                at = 0
                while at + RECORD_HEADER_SIZE <= len(chunk):
                    size, ledger, entry, _ = _RECORD.unpack_from(chunk, at)
                    if size > ENTRY_BYTES_MAX or pos + at + RECORD_HEADER_SIZE + size > size_bytes:
                        return
                    yield ScannedRecord(log_id, pos + at, ledger, entry, size)
                    at += RECORD_HEADER_SIZE + size
                pos += at  # a record larger than the chunk moves ``at`` past the chunk's end
        finally:
            reader.close()

    def statistics(self) -> EntryLogStats:
        return EntryLogStats(
            logs=len(self.log_ids()),
            current_log_id=self._current_id,
            bytes_appended=self._bytes_appended,
            entries_appended=self._entries_appended,
            syncs=self._syncs,
            reads=self._reads,
            read_ahead_entries=self._read_ahead_entries,
            disk_bytes=self.disk_bytes(),
            scans=self._scans,
        )
