"""The only module of the bookie that touches files, and its fault-injecting twin.

``FileIO`` is the narrow I/O boundary: append files with ``write``/``writev``/``sync``
(fdatasync), positional reads, atomic small-file replacement, directory listing and removal.
``FaultyFileIO`` wraps the real files and, driven by a seed, injects torn writes, EIO and
ENOSPC on write or sync, EMFILE (out of file descriptors) on open, crashes at named
failpoints, and power loss (every file cut back to its last synced length plus a random,
possibly garbled, part of what was written after it).

Invariants:
- A file created by ``open_append`` is durable as a directory entry before the call returns.
- ``write_atomic`` either leaves the old content or the new content, never a mix.
- Failpoints (``fileio.failpoint(name)``) do nothing on the real implementation.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

IOV_MAX = 1024
_ZEROS = bytes(1024 * 1024)
"""Preallocation writes zeros in pieces of this size."""


class AppendFile:
    """An append-only file written by one thread at a time (its owner serializes the writes).

    ``size_bytes`` is the logical size: where the next write goes. With ``preallocate_bytes``
    the file is extended with zeros ahead of the writes, that many bytes at a time, and writes
    land over the zeros at the logical size (BookKeeper's ``journalPreAllocSizeMB``). An
    ``fdatasync`` after writing inside the file's length flushes data only; one after growing
    the file must also commit the new length through the filesystem's own journal, where it
    queues behind whatever metadata every other writer of the disk changed (entry-log flushes,
    RocksDB, checkpoints). Readers see zeros after the last write; closing cuts them off.
    """

    def __init__(self, path: str, fd: int, size_bytes: int, preallocate_bytes: int = 0) -> None:
        self.path = path
        self._fd = fd
        self.size_bytes = size_bytes
        self._preallocate_bytes = preallocate_bytes
        self._allocated_bytes = size_bytes

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        self._reserve(len(view))
        while view:
            if self._preallocate_bytes:
                written = os.pwrite(self._fd, view, self.size_bytes)
            else:
                written = os.write(self._fd, view)
            self.size_bytes += written
            view = view[written:]

    def writev(self, buffers: Sequence[bytes]) -> None:
        self._reserve(sum(map(len, buffers)))
        for start in range(0, len(buffers), IOV_MAX):
            chunk = buffers[start : start + IOV_MAX]
            expected = sum(map(len, chunk))
            if self._preallocate_bytes:
                written = os.pwritev(self._fd, chunk, self.size_bytes)
            else:
                written = os.writev(self._fd, chunk)
            self.size_bytes += written
            if written != expected:  # a short write: finish the remainder byte-exactly
                self.write(b"".join(chunk)[written:])

    def preallocate(self) -> None:
        """Put ``preallocate_bytes`` of zeros ahead of the logical size now (a new file)."""
        self._reserve(self._preallocate_bytes)

    def fits_preallocated(self, size_bytes: int) -> bool:
        """Whether ``size_bytes`` more go over zeros already there (no growth, no preallocation)."""
        return not self._preallocate_bytes or self.size_bytes + size_bytes <= self._allocated_bytes

    def _reserve(self, size_bytes: int) -> None:
        """With preallocation, make sure zeros already cover the next ``size_bytes``."""
        if not self._preallocate_bytes or self.size_bytes + size_bytes <= self._allocated_bytes:
            return
        end = self.size_bytes + size_bytes + self._preallocate_bytes
        while self._allocated_bytes < end:
            zeros = memoryview(_ZEROS)[: min(len(_ZEROS), end - self._allocated_bytes)]
            self._allocated_bytes += os.pwrite(self._fd, zeros, self._allocated_bytes)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                if self._allocated_bytes > self.size_bytes:
                    os.ftruncate(self._fd, self.size_bytes)  # readers need not skip the zeros
            finally:
                os.close(self._fd)
                self._fd = -1


class ReadFile:
    """A file opened for positional reads; safe to share between threads."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    def pread(self, size_bytes: int, offset: int) -> bytes:
        return os.pread(self._fd, size_bytes, offset)

    def size_bytes(self) -> int:
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _open_for_append(fileio: FileIO, path: str, preallocate_bytes: int) -> tuple[int, int]:
    """(fd, size) of ``path`` opened for appending, created (and its directory entry synced) if
    missing. A preallocated file must start empty: zeros left in an old one would be taken for
    written bytes, and replay stops at the first zero header."""
    existed = os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (0 if preallocate_bytes else os.O_APPEND), 0o644)
    if not existed:
        fileio.sync_dir(os.path.dirname(path))
    size = os.fstat(fd).st_size
    if preallocate_bytes and size:
        os.close(fd)
        raise ValueError(f"{path} has {size} bytes: only a new, empty file is appended with preallocation")
    return fd, size


class FileIO:
    """Real files with real fsync."""

    def open_append(self, path: str, *, preallocate_bytes: int = 0) -> AppendFile:
        """Open ``path`` for appending (created if missing); ``preallocate_bytes`` as in
        :class:`AppendFile` (the file is then written at explicit offsets, not ``O_APPEND``)."""
        fd, size = _open_for_append(self, path, preallocate_bytes)
        return AppendFile(path, fd, size, preallocate_bytes)

    def open_read(self, path: str) -> ReadFile:
        return ReadFile(path, os.open(path, os.O_RDONLY))

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self.sync_dir(os.path.dirname(path))

    def sync_dir(self, path: str) -> None:
        fd = os.open(path or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def list_dir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def make_dirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def remove(self, path: str) -> None:
        os.remove(path)
        self.sync_dir(os.path.dirname(path))

    def truncate(self, path: str, size_bytes: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)

    def failpoint(self, name: str) -> None:
        """A named point where a test may inject a crash; nothing happens here."""


@dataclass
class _Fault:
    op: str  # "write" | "sync" | "open"
    kind: str  # "EIO" | "ENOSPC" | "torn" | "EMFILE"
    path_contains: str
    skip: int  # matching calls to let through first
    remaining: int  # faults left to inject (-1: forever)


class FaultyFileIO(FileIO):
    """Real files plus seeded faults, crash points and power-loss simulation (tests only)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._crash_points: dict[str, int] = {}
        self.crashed = False
        self.durable_size_bytes: dict[str, int] = {}
        self.written_size_bytes: dict[str, int] = {}
        """Logical size of each append file: preallocated zeros after it are not written data."""
        self.failpoints_hit: dict[str, int] = {}

    # --- configuration -------------------------------------------------------------
    def inject(
        self, op: str, kind: str, *, path_contains: str = "", skip: int = 0, count: int = 1
    ) -> None:
        known = ("EMFILE",) if op == "open" else ("EIO", "ENOSPC", "torn") if op in ("write", "sync") else ()
        if kind not in known:
            raise ValueError(f"unknown fault {op}/{kind}")
        with self._lock:
            self._faults.append(_Fault(op, kind, path_contains, skip, count))

    def crash_at(self, failpoint_name: str, hits_before: int = 0) -> None:
        """Crash (every later write/sync fails) when ``failpoint_name`` is reached."""
        self._crash_points[failpoint_name] = hits_before

    def crash(self) -> None:
        """The process dies now: every later write or sync fails."""
        self.crashed = True

    def lose_unsynced(self) -> None:
        """Power loss after :meth:`crash`: cut each file back to its synced length plus a
        random prefix of the unsynced bytes, sometimes garbling that prefix."""
        for path, durable in sorted(self.durable_size_bytes.items()):
            if not os.path.exists(path):
                continue
            size = os.stat(path).st_size
            written = self.written_size_bytes.get(path, size)  # less than size: zeros preallocated
            if written <= durable:
                continue
            keep = durable + self.rng.randint(0, written - durable)
            os.truncate(path, keep)
            if size > written:
                os.truncate(path, size)  # the preallocated length stays, zeros after the cut
            if keep > durable and self.rng.random() < 0.3:
                with open(path, "r+b") as f:
                    f.seek(self.rng.randrange(durable, keep))
                    f.write(bytes([self.rng.randrange(256)]))

    # --- hooks ---------------------------------------------------------------------
    def failpoint(self, name: str) -> None:
        self.failpoints_hit[name] = self.failpoints_hit.get(name, 0) + 1
        if name in self._crash_points:
            if self._crash_points[name] <= 0:
                del self._crash_points[name]
                self.crashed = True
                raise OSError(errno.EIO, f"simulated crash at failpoint {name!r}")
            self._crash_points[name] -= 1

    def _check(self, op: str, path: str) -> str | None:
        if self.crashed and op != "open":
            raise OSError(errno.EIO, f"simulated crash: {op} on {path}")
        with self._lock:
            for fault in self._faults:
                if fault.op != op or fault.path_contains not in path:
                    continue
                if fault.skip > 0:
                    fault.skip -= 1
                    return None
                if fault.remaining > 0:
                    fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault.kind
        return None

    def _check_open(self, path: str) -> None:
        if self._check("open", path) is not None:
            raise OSError(errno.EMFILE, "Too many open files (injected)", path)

    def open_read(self, path: str) -> ReadFile:
        self._check_open(path)
        return super().open_read(path)

    def open_append(self, path: str, *, preallocate_bytes: int = 0) -> AppendFile:
        self._check_open(path)
        fd, size = _open_for_append(self, path, preallocate_bytes)
        self.durable_size_bytes.setdefault(path, size)
        self.written_size_bytes[path] = size
        return _FaultyAppendFile(self, path, fd, size, preallocate_bytes)

    def write_atomic(self, path: str, data: bytes) -> None:
        if self._check("write", path) is not None or self._check("sync", path) is not None:
            raise OSError(errno.EIO, f"injected fault writing {path}")
        super().write_atomic(path, data)


class _FaultyAppendFile(AppendFile):
    def __init__(self, owner: FaultyFileIO, path: str, fd: int, size_bytes: int, preallocate_bytes: int) -> None:
        super().__init__(path, fd, size_bytes, preallocate_bytes)
        self._owner = owner

    def write(self, data: bytes | bytearray | memoryview) -> None:
        kind = self._owner._check("write", self.path)
        if kind == "ENOSPC":
            raise OSError(errno.ENOSPC, f"injected ENOSPC writing {self.path}")
        if kind == "EIO":
            raise OSError(errno.EIO, f"injected EIO writing {self.path}")
        if kind == "torn":
            cut = self._owner.rng.randint(0, max(0, len(data) - 1))
            self._write(memoryview(data)[:cut])
            raise OSError(errno.EIO, f"injected torn write on {self.path} after {cut} bytes")
        self._write(data)

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        super().write(data)
        self._owner.written_size_bytes[self.path] = self.size_bytes

    def writev(self, buffers: Sequence[bytes]) -> None:
        self.write(b"".join(buffers))

    def sync(self) -> None:
        kind = self._owner._check("sync", self.path)
        if kind is not None:
            code = errno.ENOSPC if kind == "ENOSPC" else errno.EIO
            raise OSError(code, f"injected {kind} on fdatasync of {self.path}")
        super().sync()
        self._owner.durable_size_bytes[self.path] = self.size_bytes

    def close(self) -> None:
        if self._owner.crashed:  # a dead process tidies nothing: preallocated zeros stay
            self._allocated_bytes = self.size_bytes
        super().close()
