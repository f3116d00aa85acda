"""A newcomer's start-up failures of ``magnetar standalone``, as real processes: each is one line
on stderr naming the cause and what to do, and exit code 2, before anything is opened.

Before ``api/startup_checks.py`` they were: a held HTTP port, an ERROR line among uvicorn's
start-up and shut-down lines, after the storage had been opened and closed; a held binary port
the same; a data directory another broker uses, RocksDB's 85-line traceback ("While lock
file: …/bookie/index/LOCK: Resource temporarily unavailable") and "Application startup
failed"; a data directory that cannot be written, a traceback from the storage's ``makedirs``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standalone import REPO_ROOT, free_port, standalone_command, standalone_process

EXIT_TIMEOUT_S = 30.0


def run_refused(*args: str) -> str:
    """Run the command to its end; the one line it printed on stderr (failing otherwise)."""
    done = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=EXIT_TIMEOUT_S, check=False)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, f"exit code {done.returncode}; stderr:\n{done.stderr}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{done.stderr}"
    assert done.stdout == "", done.stdout
    return lines[0]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process (here: a listening socket of the test) holds."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_held_http_port_is_one_line(tmp_path: Path, held_port: int) -> None:
    line = run_refused(*standalone_command(tmp_path / "data", held_port))
    assert line == (f"magnetar standalone: port {held_port} (webServicePort) is in use by another process: stop "
                    "it, or choose another port with --port (make run: PORT=) (0 turns that listener off)")
    assert not (tmp_path / "data").exists()  # refused before anything was made or opened


def test_a_held_binary_port_is_one_line(tmp_path: Path, held_port: int) -> None:
    command = standalone_command(tmp_path / "data", free_port())
    command[command.index("--pulsar-port") + 1] = str(held_port)
    line = run_refused(*command)
    assert f"port {held_port} (brokerServicePort) is in use" in line and "--pulsar-port" in line, line


def test_a_data_dir_another_broker_uses_is_one_line_naming_its_pid(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with standalone_process(data_dir) as (_, first):
        line = run_refused(*standalone_command(data_dir, free_port()))
        assert line == (f"magnetar standalone: the data directory {data_dir} is in use by another Magnetar process "
                        f"(pid {first.pid}): stop it, or give this one its own --data-dir")


def test_a_data_dir_freed_by_kill_9_is_taken_again(tmp_path: Path) -> None:
    """The lock is the kernel's: a killed broker leaves nothing stale behind."""
    data_dir = tmp_path / "data"
    with standalone_process(data_dir) as (_, first):
        first.kill()
        first.wait(timeout=EXIT_TIMEOUT_S)
        with standalone_process(data_dir) as (url, _):
            assert url.startswith("http://")


def test_a_data_dir_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    line = run_refused(*standalone_command(not_a_dir / "data", free_port()))
    assert line == (f"magnetar standalone: the data directory {not_a_dir / 'data'} cannot be written (Not a "
                    "directory): give one this user may write with --data-dir (or dataDir)")


def test_version() -> None:
    done = subprocess.run([sys.executable, "-m", "api.cli", "--version"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=EXIT_TIMEOUT_S, check=True)
    assert done.stdout.startswith("magnetar ") and done.stdout.strip() != "magnetar (not installed)", done.stdout


def cluster_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "api.cli", *args]


def test_cluster_processes_refuse_held_ports_and_data_dirs_in_one_line(tmp_path: Path, held_port: int) -> None:
    """``magnetar bookie`` and ``magnetar broker`` check as ``standalone`` does, before they reach
    ZooKeeper (none runs here: the checks come first). Before: a bookie on a held port or a data
    directory in use, a traceback (26 lines for the data directory, RocksDB's lock); a broker on
    a held binary port, uvloop's 86-line traceback and exit code 3."""
    store = "zk:127.0.0.1:1/nowhere"
    bookie_port = run_refused(*cluster_command("bookie", "--data-dir", str(tmp_path / "b1"), "--host", "127.0.0.1",
                                               "--port", str(held_port), "--metadata-store", store))
    assert bookie_port == (f"magnetar bookie: port {held_port} (bookiePort) is in use by another process: stop it, "
                           "or choose another port with --port (0 turns that listener off)")
    from api.startup_checks import DataDirLock

    held = DataDirLock(str(tmp_path / "b2"))  # this test's process holds it, as another bookie would
    try:
        in_use = run_refused(*cluster_command("bookie", "--data-dir", str(tmp_path / "b2"), "--host", "127.0.0.1",
                                              "--port", str(free_port()), "--metadata-store", store))
    finally:
        held.release()
    assert in_use.startswith(f"magnetar bookie: the data directory {tmp_path / 'b2'} is in use by another Magnetar "
                             "process") and "--data-dir" in in_use, in_use
    broker = run_refused(*cluster_command("broker", "--metadata-store", store, "--host", "127.0.0.1",
                                          "--port", str(free_port()), "--pulsar-port", str(held_port)))
    assert f"port {held_port} (brokerServicePort) is in use" in broker and "--pulsar-port" in broker, broker
