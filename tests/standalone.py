"""``magnetar standalone`` as a real child process for integration, crash, Spark and e2e tests
(a thin face over ``api/launcher.py``, which ``make demo`` uses too)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from api.launcher import free_port, running_standalone, standalone_command, stop_process, wait_healthy

REPO_ROOT = Path(__file__).resolve().parents[1]

__all__ = ["REPO_ROOT", "free_port", "standalone_command", "standalone_process", "stop", "wait_healthy"]


def stop(proc: subprocess.Popen[bytes], *, kill: bool = False) -> int:
    return stop_process(proc, kill=kill)


@contextmanager
def standalone_process(data_dir: str | Path, *extra: str,
                       env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with running_standalone(data_dir, *extra, cwd=REPO_ROOT, env=env) as running:
        yield running
