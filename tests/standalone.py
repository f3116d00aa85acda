"""``magnetar standalone`` as a real child process for integration, crash, Spark and e2e tests
(a thin face over ``consumers/launcher.py``, which ``make demo`` uses too)."""

from __future__ import annotations

import base64
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx

from consumers.launcher import free_port, running_standalone, standalone_command, stop_process, wait_healthy

REPO_ROOT = Path(__file__).resolve().parents[1]

__all__ = ["REPO_ROOT", "free_port", "read_all", "standalone_command", "standalone_process", "stop", "wait_healthy"]

READ_ALL_CHUNK = 1000
READ_ALL_ROUNDS_MAX = 1000


def stop(proc: subprocess.Popen[bytes], *, kill: bool = False) -> int:
    return stop_process(proc, kill=kill)


@contextmanager
def standalone_process(data_dir: str | Path, *extra: str, env: dict[str, str] | None = None,
                       output: IO[bytes] | int = subprocess.DEVNULL, file_limit: int | None = None,
                       https: ssl.SSLContext | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with running_standalone(data_dir, *extra, cwd=REPO_ROOT, env=env, output=output, file_limit=file_limit,
                            https=https) as running:
        yield running


def read_all(url: str, topic_path: str, *, missing_ok: bool = False) -> list[dict[str, Any]]:
    """Every message of the topic (partition) at ``topic_path`` (``/topics/persistent/t/ns/x``)
    through the JSON range read, payloads decoded, in offset order. With ``missing_ok`` a topic
    that does not exist reads as empty."""
    messages: list[dict[str, Any]] = []
    offset = 0
    for _ in range(READ_ALL_ROUNDS_MAX):
        response = httpx.get(f"{url}{topic_path}/messages", params={"offset": offset, "maxMessages": READ_ALL_CHUNK},
                             timeout=30)
        if missing_ok and response.status_code == 404:
            return messages
        assert response.status_code == 200, response.text
        body = response.json()
        if not body["messages"]:
            return messages
        messages.extend({**m, "payload": base64.b64decode(m["payload"])} for m in body["messages"])
        offset = body["nextOffset"]
    raise AssertionError(f"{topic_path} did not end within {READ_ALL_ROUNDS_MAX} reads")
