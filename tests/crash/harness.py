"""Shared harness of the crash suites: seeds, and child processes killed with SIGKILL.

A crash test starts a child with :func:`started_child` (whatever happens, the child is
SIGKILLed by PID and reaped), reads its stdout with :class:`LineReader` (only complete lines
count: a line cut by the kill was never reported), and waits for its ``READY`` line with
:func:`wait_until_ready`. ``MAGNETAR_CRASH_SEED`` pins the run (a fresh random seed otherwise,
named in every failure); ``MAGNETAR_CRASH_ROUNDS`` sets the number of rounds (``make crash``
runs a long soak).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parents[2]
ROUNDS_DEFAULT = 30
REAP_TIMEOUT_SECONDS = 30.0
STDERR_TAIL_BYTES = 4000


def crash_seed() -> int:
    raw = os.environ.get("MAGNETAR_CRASH_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(2**32)


def crash_rounds() -> int:
    return int(os.environ.get("MAGNETAR_CRASH_ROUNDS", ROUNDS_DEFAULT))


ROUND_SECONDS_MAX = 10


def rounds_timeout_s() -> int:
    """The per-test time bound of a suite that runs ``crash_rounds()`` rounds (a soak of
    hundreds of rounds gets proportionally longer than pytest's default)."""
    return 120 + ROUND_SECONDS_MAX * crash_rounds()


@dataclass(frozen=True)
class ChildResult:
    lines: list[str]
    returncode: int
    stderr: str


class LineReader:
    """Collects the child's complete stdout lines in a thread (a full pipe would block it)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), name="crash-child-stdout", daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            if not raw.endswith(b"\n"):
                break  # cut by the kill: the event was never reported
            line = raw.decode("ascii", errors="replace").rstrip("\n")
            self.lines.append(line)
            if line.startswith("READY"):
                self.ready.set()

    def join(self, timeout_seconds: float) -> None:
        self._thread.join(timeout_seconds)
        assert not self._thread.is_alive(), "child stdout stayed open after the child was reaped"


@contextmanager
def started_child(command: list[str], stderr_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start the child in the repository root; whatever happens, it is SIGKILLed by PID and
    reaped on exit."""
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=stderr)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def wait_until_ready(proc: subprocess.Popen[bytes], reader: LineReader, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not reader.ready.wait(0.05):
        if proc.poll() is not None:
            return  # exited early; the return code check reports it
        if time.monotonic() >= deadline:
            raise AssertionError(f"child did not report READY within {timeout_seconds} s (recovery hung?)")


def kill_after(proc: subprocess.Popen[bytes], reader: LineReader, *, wait_ready: bool, delay_seconds: float,
               ready_timeout_seconds: float) -> int:
    """Optionally wait for READY, wait ``delay_seconds``, SIGKILL the child and reap it; return
    its exit code (``-SIGKILL`` unless it had already exited)."""
    if wait_ready:
        wait_until_ready(proc, reader, ready_timeout_seconds)
    time.sleep(delay_seconds)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    return proc.wait(REAP_TIMEOUT_SECONDS)


def stderr_tail(stderr_path: Path) -> str:
    return stderr_path.read_bytes()[-STDERR_TAIL_BYTES:].decode("utf-8", errors="replace")
