"""What ``magnetar standalone`` (and ``bookie``, ``broker``) checks before it starts anything:
the data directory and ports.

Role: a newcomer's usual start-up failures (a port another process holds, a data directory
another broker uses, a directory it may not write) are answered with one line naming the cause
and what to do, and a non-zero exit, before the broker opens its storage or the web server
logs anything. Without these checks they surfaced as tracebacks of 79 and 85 lines from deep
in uvicorn or RocksDB.

Invariants: the data directory lock (``magnetar.lock``, an ``flock`` holding the owner's pid)
is held by the returned ``DataDirLock`` for the whole life of the process; the kernel drops it
when the process dies, so a ``kill -9`` leaves nothing stale. The port check binds as the real
listeners do (``SO_REUSEADDR``) and lets go at once; the listeners' own bind failures still
stop the start-up if another process takes a port in between. RocksDB's own lock stays as the
second guard.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from dataclasses import dataclass

LOCK_FILE = "magnetar.lock"


class StartupError(Exception):
    """A start-up problem, in one line: the cause and what to do."""


@dataclass(frozen=True)
class Port:
    """A listener the process will open: its port, the setting that names it, and the flag."""

    port: int
    setting: str
    """Pulsar's key (``webServicePort``, ``brokerServicePort``, ...)."""
    flag: str
    """The command-line flag that moves it (``--port``, ``--pulsar-port``, ...)."""


class DataDirLock:
    """The data directory, writable and locked for this process (see the module's invariants)."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, LOCK_FILE)
        check_writable(data_dir, "data directory", "--data-dir (or dataDir)")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise StartupError(f"the data directory {data_dir} cannot be locked ({exc.strerror})") from None
            raise StartupError(f"the data directory {data_dir} is in use by another Magnetar process"
                               f"{_owner_of(self.path)}: stop it, or give this one its own --data-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def check_writable(directory: str, what: str, setting: str) -> None:
    """``StartupError`` unless ``directory`` exists (made if need be) and takes a file."""
    probe = os.path.join(directory, f".magnetar-write-check-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as exc:
        raise StartupError(f"the {what} {directory} cannot be written ({exc.strerror}): give one this user may "
                           f"write with {setting}") from None


def _owner_of(path: str) -> str:
    with contextlib.suppress(OSError, ValueError), open(path) as held:
        return f" (pid {int(held.read().strip())})"
    return ""


def check_ports_free(host: str, ports: list[Port]) -> None:
    """``StartupError`` for the first of ``ports`` (0 = off, skipped) another process holds."""
    for wanted in ports:
        if not wanted.port:
            continue
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, wanted.port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise StartupError(f"port {wanted.port} ({wanted.setting}) is in use by another process: stop "
                                       f"it, or choose another port with {wanted.flag} (0 turns that listener "
                                       "off)") from None
                raise StartupError(f"cannot listen on {host}:{wanted.port} ({wanted.setting}): {exc.strerror}") \
                    from None
