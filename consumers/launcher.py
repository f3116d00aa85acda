"""``magnetar standalone`` as a child process: for ``make demo``, the tests and the benchmarks.

Role: start the broker on 127.0.0.1 and a free port, wait (bounded) until ``/healthz`` answers,
and whatever happens stop it by PID: SIGTERM for a graceful shutdown, SIGKILL if it has not
exited in time. With ``https`` (the client's ``ssl`` context: the broker's authorities, and a
client certificate when the broker requires one) the free port is the web service's TLS port
(``--tls-port``), plain HTTP is off, and the health check and the URL are ``https://``; the
broker's certificate and key come from the ``--config`` among the arguments.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

HEALTH_TIMEOUT_S = 30.0
HEALTH_POLL_S = 0.1
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def standalone_command(data_dir: str | Path, port: int, *extra: str) -> list[str]:
    """The command line of a broker on 127.0.0.1:``port``; its binary-protocol listener is off
    unless ``extra`` names a ``--pulsar-port`` (several brokers share one machine here)."""
    return [sys.executable, "-m", "api.cli", "standalone", "--data-dir", str(data_dir),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--pulsar-port", "0", *extra]


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = HEALTH_TIMEOUT_S, *,
                 verify: ssl.SSLContext | bool = True) -> httpx.Response:
    """The first answer of ``url`` (the broker's ``/healthz``; ``verify``: how an ``https://``
    one is trusted); fails if the process exits first or nothing answers within ``timeout_s``."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"magnetar standalone exited early with code {proc.returncode}")
        try:
            return httpx.get(url, timeout=1.0, verify=verify)
        except httpx.TransportError:
            time.sleep(HEALTH_POLL_S)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


def stop_process(proc: subprocess.Popen[bytes], *, kill: bool = False) -> int:
    """Stop the child by PID (SIGKILL at once with ``kill``, else SIGTERM and SIGKILL after
    ``STOP_TIMEOUT_S``) and reap it; its exit code."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


@contextmanager
def running_standalone(data_dir: str | Path, *extra: str, cwd: str | Path | None = None,
                       env: Mapping[str, str] | None = None, output: IO[bytes] | int = subprocess.DEVNULL,
                       file_limit: int | None = None,
                       https: ssl.SSLContext | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``(url, process)`` of a healthy broker; stopped by PID on the way out. ``file_limit``
    caps the child's open file descriptors (soft and hard) from its start; ``https`` serves only
    HTTPS (see the module's docstring)."""
    port = free_port()
    if https is None:
        command = standalone_command(data_dir, port, *extra)
    else:
        command = standalone_command(data_dir, 0, "--tls-port", str(port), *extra)
    if file_limit is not None:  # util-linux's prlimit sets the limit and execs: the PID is the broker's
        command = ["prlimit", f"--nofile={file_limit}:{file_limit}", *command]
    proc = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})}, stdout=output,
                            stderr=subprocess.STDOUT)
    try:
        url = f"{'http' if https is None else 'https'}://127.0.0.1:{port}"
        wait_healthy(f"{url}/healthz", proc, verify=https or True)
        yield url, proc
    finally:
        stop_process(proc)
