"""Exactly-once end to end across a crash: Magnetar source → Magnetar sink, killed and restarted.

A child process (its own Python and JVM, ``stream_child.py``) copies a topic micro-batch by
micro-batch. Once at least ``COMMITS_BEFORE_KILL`` micro-batches are committed in its checkpoint
the whole process group is SIGKILLed, wherever it is (possibly in the middle of writing a
micro-batch). A second child resumes from the same checkpoint with ``Trigger.AvailableNow``.
The target must then hold every source message exactly once, in source order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.spark.stream_child import ROWS_PER_TRIGGER
from tests.spark.support import produce, read_back
from tests.standalone import REPO_ROOT

pytestmark = pytest.mark.slow

SOURCE_TOPIC = "crash-source"
TARGET_TOPIC = "crash-target"
MESSAGES = 160
COMMITS_BEFORE_KILL = 2
CHILD_DEADLINE_S = 240.0
POLL_S = 0.1


def start_child(url: str, checkpoint: Path, mode: str, log_dir: Path) -> subprocess.Popen[bytes]:
    with open(log_dir / f"child-{mode}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.stream_child", url, str(checkpoint), SOURCE_TOPIC, TARGET_TOPIC, mode],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child and its JVM (the child leads its own process group) and reap it."""
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=30)


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.exists() else 0


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


def test_kill_mid_stream_then_restart_copies_every_message_once(broker_url: str, tmp_path: Path) -> None:
    values = [f"message-{i:04d}".encode() for i in range(MESSAGES)]
    for start in range(0, MESSAGES, 10):
        produce(broker_url, SOURCE_TOPIC, [{"payload": v, "key": f"k{start}"} for v in values[start:start + 10]])
    checkpoint = tmp_path / "ck"
    runner = start_child(broker_url, checkpoint, "run", tmp_path)
    try:
        deadline = time.monotonic() + CHILD_DEADLINE_S
        while committed_batches(checkpoint) < COMMITS_BEFORE_KILL:
            assert runner.poll() is None, f"the streaming child died early:\n{tail(tmp_path / 'child-run.log')}"
            assert time.monotonic() < deadline, f"no commits in time:\n{tail(tmp_path / 'child-run.log')}"
            time.sleep(POLL_S)
        assert runner.poll() is None  # killed mid-stream, not after finishing
    finally:
        kill_group(runner)
    assert len(read_back(broker_url, TARGET_TOPIC)) >= COMMITS_BEFORE_KILL * ROWS_PER_TRIGGER

    finisher = start_child(broker_url, checkpoint, "finish", tmp_path)
    try:
        assert finisher.wait(timeout=CHILD_DEADLINE_S) == 0, tail(tmp_path / "child-finish.log")
    finally:
        kill_group(finisher)
    copied = read_back(broker_url, TARGET_TOPIC)
    assert [m["payload"] for m in copied] == values
    assert [m["key"] for m in copied] == [f"k{i - i % 10}" for i in range(MESSAGES)]
