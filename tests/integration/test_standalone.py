"""``magnetar standalone`` as a real process: it serves /healthz on the address it is given and
shuts down gracefully on SIGTERM (exit code 0, storage checkpointed)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx

from tests.standalone import free_port, standalone_command, wait_healthy


def test_standalone_serves_healthz_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "data"
    proc = subprocess.Popen(standalone_command(data_dir, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
