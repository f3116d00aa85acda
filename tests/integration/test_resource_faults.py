"""A broker process out of file descriptors or out of disk: what clients and operators see.

Real ``magnetar standalone`` processes, real sockets, a real (small, tmpfs) file system:

- More connections than the process may hold: the listener answers the excess ``503
  too_many_connections`` and closes them, the storage stays writable, and the log holds no
  traceback.
- Descriptors run out anyway (the limit is lowered under a running broker): the storage's
  flush fails, is retried and logged once, never turns the storage read-only; once the
  connections go, everything written is served and producing goes on.
- The disk fills: produce answers 503 ``storage_full``, ``/healthz`` answers 503 and says the
  disk is full, reads keep working, nothing acknowledged is lost; after space returns a
  restart serves everything and takes writes again.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.standalone import read_all, standalone_process

WAIT_S = 30.0
TOPIC = "/topics/persistent/public/default/t"
RETAIN = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
FILE_LIMIT = 256


def _produce(url: str, payload: str) -> httpx.Response:
    return httpx.post(f"{url}{TOPIC}", json={"messages": [{"payload": payload}]}, timeout=WAIT_S)


@contextlib.contextmanager
def _flood(url: str, count: int) -> Iterator[list[socket.socket]]:
    host, port = url.removeprefix("http://").split(":")
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            try:
                socks.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                break  # the backlog is full: the flood is as big as it gets
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _wait_for_line(log: Path, text: str) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def test_a_connection_flood_is_refused_and_storage_stays_writable(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    with log.open("wb") as output, standalone_process(tmp_path / "data", output=output,
                                                      file_limit=FILE_LIMIT) as (url, _):
        assert _produce(url, "before").status_code == 200
        with _flood(url, FILE_LIMIT + 150) as socks:
            refused = 0
            for sock in socks[-50:]:
                sock.settimeout(WAIT_S)
                if sock.recv(4096).startswith(b"HTTP/1.1 503"):
                    refused += 1
            assert refused == 50  # the newest connections are over the bound: answered and closed
        assert _produce(url, "after").status_code == 200
        health = httpx.get(f"{url}/healthz", timeout=WAIT_S).json()
        assert health["status"] == "ok" and not health["storage_read_only"]
        payloads = [m["payload"] for m in read_all(url, TOPIC)]
        assert payloads == [b"before", b"after"]
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and len(text.splitlines()) < 20


def test_out_of_descriptors_the_storage_retries_and_stays_writable(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    with log.open("wb") as output, standalone_process(tmp_path / "data", output=output) as (url, proc):
        assert httpx.post(f"{url}/admin/v2/namespaces/public/default/retention", json=RETAIN,
                          timeout=WAIT_S).status_code == 204
        assert _produce(url, "in the write cache").status_code == 200
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))  # under a running broker
        with _flood(url, FILE_LIMIT + 100):
            assert _wait_for_line(log, "flushing the write cache failed")  # the flush met EMFILE ...
        assert _wait_for_line(log, "flushing the write cache works again")  # ... and was retried
        assert _produce(url, "afterwards").status_code == 200
        health = httpx.get(f"{url}/healthz", timeout=WAIT_S).json()
        assert health["status"] == "ok" and not health["storage_read_only"]
        assert [m["payload"] for m in read_all(url, TOPIC)] == [b"in the write cache", b"afterwards"]
    text = log.read_text(errors="replace")
    assert text.count("flushing the write cache failed") == 1  # logged once, not per attempt
    assert "Traceback" not in text and len(text.splitlines()) < 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs, grown to 512 MiB by the test when space returns; unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"the disk-full test mounts a tmpfs and needs root: {done.stderr.strip()}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_refuses_writes_clearly_and_loses_nothing(small_disk: Path) -> None:
    data = small_disk / "data"
    payload = "x" * (256 * 1024)
    acknowledged: list[int] = []
    with standalone_process(data) as (url, _):
        assert httpx.post(f"{url}/admin/v2/namespaces/public/default/retention", json=RETAIN,
                          timeout=WAIT_S).status_code == 204
        filler = small_disk / "filler"
        free = shutil.disk_usage(small_disk).free
        with filler.open("wb") as handle:
            handle.write(b"\0" * max(0, free - 24 * 1024 * 1024))  # leave about 24 MiB
        refusal = None
        for index in range(400):
            answer = _produce(url, f"{index:06d}{payload}")
            if answer.status_code == 200:
                acknowledged.append(index)
                continue
            refusal = answer
            break
        assert refusal is not None, "the disk never filled"
        assert refusal.status_code == 503 and refusal.json()["code"] in ("storage_full", "storage_read_only")
        assert "disk is full" in refusal.json()["message"]
        again = _produce(url, "refused too")
        assert again.status_code == 503 and again.json()["code"] == "storage_full"
        health = httpx.get(f"{url}/healthz", timeout=WAIT_S)
        assert health.status_code == 503 and health.json()["storage_read_only"]
        assert "disk full" in health.json()["storage_read_only_reason"]
        read = read_all(url, TOPIC)  # reads keep working
        assert [int(m["payload"][:6]) for m in read][:len(acknowledged)] == acknowledged
        filler.unlink()
    subprocess.run(["mount", "-o", "remount,size=512m", str(small_disk)], check=True)
    with standalone_process(data) as (url, _):  # space is back: a restart serves everything
        stored = [int(m["payload"][:6]) for m in read_all(url, TOPIC)]
        assert stored[:len(acknowledged)] == acknowledged  # nothing acknowledged lost
        assert set(stored) - set(acknowledged) <= {len(acknowledged)}  # at most the refused one, whole
        assert _produce(url, "writable again").status_code == 200
    assert not os.path.exists(small_disk / "filler")
