"""``magnetar standalone`` as a real process: it serves /healthz on the address it is given and
shuts down gracefully on SIGTERM (exit code 0, storage checkpointed)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], attempts: int = 300) -> httpx.Response:
    for _ in range(attempts):
        if proc.poll() is not None:
            raise AssertionError(f"standalone exited early with {proc.returncode}")
        try:
            return httpx.get(url, timeout=1.0)
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"{url} never answered")


def test_standalone_serves_healthz_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    cmd = [sys.executable, "-m", "api.cli", "standalone", "--data-dir", str(data_dir),
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        response = wait_healthy(f"http://127.0.0.1:{port}/healthz", proc)
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
        docs = httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=5.0).json()
        assert "/healthz" in docs["paths"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert (data_dir / "bookie" / "journal" / "lastMark").exists()  # closed by checkpoint
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
