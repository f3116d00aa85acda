"""``magnetar standalone`` as a real child process for integration, crash, Spark and e2e tests.

:func:`standalone_process` starts it on 127.0.0.1 and a free port, waits for ``/healthz`` (bounded)
and, whatever happens, stops it by PID: SIGTERM, then SIGKILL if it does not exit in time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
HEALTH_ATTEMPTS = 300
HEALTH_POLL_S = 0.1
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], attempts: int = HEALTH_ATTEMPTS) -> httpx.Response:
    for _ in range(attempts):
        if proc.poll() is not None:
            raise AssertionError(f"standalone exited early with {proc.returncode}")
        try:
            return httpx.get(url, timeout=1.0)
        except httpx.TransportError:
            time.sleep(HEALTH_POLL_S)
    raise AssertionError(f"{url} never answered")


def standalone_command(data_dir: str | Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "api.cli", "standalone", "--data-dir", str(data_dir),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra]


def stop(proc: subprocess.Popen[bytes], *, kill: bool = False) -> int:
    """Stop the child by PID (SIGKILL at once with ``kill``) and reap it; its exit code."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


@contextmanager
def standalone_process(data_dir: str | Path, *extra: str,
                       env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = subprocess.Popen(standalone_command(data_dir, port, *extra), cwd=REPO_ROOT,
                            env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/healthz", proc)
        yield url, proc
    finally:
        stop(proc)
