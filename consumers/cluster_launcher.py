"""A cluster of child processes on 127.0.0.1: ZooKeeper, ``magnetar bookie`` and ``magnetar broker``.

Role: what the cluster tests and ``bench/cluster_bench.py`` run against, as ``launcher.py`` is
for ``magnetar standalone``. ZooKeeper is Debian's ``zookeeper`` package run directly with
``java`` (``ZooKeeperServerMain`` on a generated ``zoo.cfg``: an ephemeral port, a temporary
data directory, no admin server, ``jute.maxbuffer`` large enough for the metadata store's
largest value). Every process is started with a known PID and stopped by that PID: SIGTERM,
then SIGKILL if it has not exited in time (``kill`` stops one at once, as a crash would).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from consumers.launcher import free_port, stop_process, wait_healthy

ZOOKEEPER_CLASSPATH = os.environ.get("ZOOKEEPER_CLASSPATH", "/usr/share/java/zookeeper.jar")
ZOOKEEPER_PACKAGE = "zookeeper"
ZOOKEEPER_TICK_MS = 500
"""ZooKeeper's tick: sessions may time out between 2 and 20 ticks (1 to 10 s here)."""
JUTE_MAXBUFFER_BYTES = 32 * 1024 * 1024
START_TIMEOUT_S = 60.0
POLL_S = 0.05


class ClusterLaunchError(RuntimeError):
    pass


def zookeeper_available() -> bool:
    return shutil.which("java") is not None and Path(ZOOKEEPER_CLASSPATH).exists()


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Return once 127.0.0.1:``port`` accepts connections; fail if ``proc`` exits first."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if proc.poll() is not None:
            raise ClusterLaunchError(f"{what} exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(POLL_S)
    raise ClusterLaunchError(f"{what} did not listen on port {port} within {timeout_s:.0f} s")


@contextmanager
def running_zookeeper(data_dir: str | Path, *, output: IO[bytes] | int = subprocess.DEVNULL) -> Iterator[str]:
    """``HOST:PORT`` of a fresh ZooKeeper server; stopped by PID on the way out."""
    if not zookeeper_available():
        raise ClusterLaunchError(f"ZooKeeper needs java and Debian's '{ZOOKEEPER_PACKAGE}' package "
                                 f"(apt-get install {ZOOKEEPER_PACKAGE}); {ZOOKEEPER_CLASSPATH} not found")
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = data / "zoo.cfg"
    config.write_text(f"tickTime={ZOOKEEPER_TICK_MS}\ndataDir={data}\nclientPort={port}\n"
                      "clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n"
                      "minSessionTimeout=1000\nmaxSessionTimeout=30000\n")
    command = ["java", "-Xmx256m", f"-Djute.maxbuffer={JUTE_MAXBUFFER_BYTES}", "-Dzookeeper.admin.enableServer=false",
               "-cp", ZOOKEEPER_CLASSPATH, "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)]
    proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, "ZooKeeper")
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)


def bookie_command(metadata_store: str, data_dir: str | Path, port: int, *extra: str) -> list[str]:
    data = Path(data_dir)
    return [sys.executable, "-m", "api.cli", "bookie", "--data-dir", str(data / "ledgers"),
            "--journal-dir", str(data / "journal"), "--host", "127.0.0.1", "--port", str(port),
            "--metadata-store", metadata_store, "--zk-session-timeout-s", "2", *extra]


def broker_command(metadata_store: str, port: int, pulsar_port: int, *extra: str) -> list[str]:
    """A broker on 127.0.0.1: HTTP on ``port``, Pulsar's binary protocol on ``pulsar_port`` (0 = off;
    every broker on one machine needs its own)."""
    return [sys.executable, "-m", "api.cli", "broker", "--metadata-store", metadata_store, "--host", "127.0.0.1",
            "--port", str(port), "--pulsar-port", str(pulsar_port), "--log-level", "warning", *extra]


@dataclass
class Process:
    """A child process of the cluster and how to reach it."""

    name: str
    command: list[str]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    pulsar_port: int = 0
    """A broker's binary-protocol port (0: none)."""
    cwd: Path | None = None
    """The working directory it runs in (None: the caller's)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pulsar_url(self) -> str:
        """``pulsar://127.0.0.1:port`` of a broker's binary-protocol listener."""
        assert self.pulsar_port, f"{self.name} has no binary-protocol listener"
        return f"pulsar://127.0.0.1:{self.pulsar_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, output: IO[bytes] | int = subprocess.DEVNULL) -> None:
        self.proc = subprocess.Popen(self.command, env={**os.environ, **self.env}, stdout=output,
                                     stderr=subprocess.STDOUT, cwd=self.cwd)

    def stop(self, *, kill: bool = False) -> int | None:
        if self.proc is None:
            return None
        return stop_process(self.proc, kill=kill)


@dataclass
class Cluster:
    zookeeper: str
    metadata_store: str
    bookies: list[Process]
    brokers: list[Process]
    output: IO[bytes] | int = subprocess.DEVNULL

    @property
    def broker_url(self) -> str:
        return f"http://{self.brokers[0].address}"

    @property
    def service_url(self) -> str:
        """Every broker, comma-separated (the clients try them in turn)."""
        return ",".join(f"http://{broker.address}" for broker in self.brokers)

    def start_bookie(self, bookie: Process) -> None:
        bookie.start(self.output)
        assert bookie.proc is not None
        wait_port(bookie.port, bookie.proc, bookie.name)

    def start_broker(self, broker: Process) -> None:
        broker.start(self.output)
        assert broker.proc is not None
        wait_healthy(f"http://{broker.address}/healthz", broker.proc, START_TIMEOUT_S)


@contextmanager
def running_cluster(base_dir: str | Path, *, bookies: int = 3, broker_args: tuple[str, ...] = (),
                    chroot: str = "/magnetar", output: IO[bytes] | int = subprocess.DEVNULL,
                    env: Mapping[str, str] | None = None, brokers: int = 1,
                    zookeeper_via: Callable[[int, str], str] | None = None,
                    broker_cwd: str | Path | None = None,
                    broker_args_of: Callable[[int, int], tuple[str, ...]] | None = None) -> Iterator[Cluster]:
    """ZooKeeper, ``bookies`` bookies and ``brokers`` brokers (each with HTTP and a binary-protocol
    listener on free ports), each stopped by PID on the way out. ``zookeeper_via(index, address)``
    gives the ZooKeeper address broker ``index`` connects to (something a test put in between);
    ``broker_cwd``: the directory the brokers run in (a broker keeps nothing on a local disk);
    ``broker_args_of(index, pulsar_port)``: more arguments for broker ``index`` alone."""
    base = Path(base_dir)
    with ExitStack() as stack:
        zookeeper = stack.enter_context(running_zookeeper(base / "zookeeper", output=output))
        store = f"zk:{zookeeper}{chroot}"
        made = [Process(f"bookie-{i}", [], free_port(), env=dict(env or {})) for i in range(bookies)]
        for index, bookie in enumerate(made):
            bookie.command = bookie_command(store, base / f"bookie-{index}", bookie.port)
        servers = []
        for index in range(brokers):
            port, pulsar_port = free_port(), free_port()
            name = "broker" if brokers == 1 else f"broker-{index}"
            reached = zookeeper_via(index, zookeeper) if zookeeper_via is not None else zookeeper
            own_args = broker_args_of(index, pulsar_port) if broker_args_of is not None else ()
            servers.append(Process(name, broker_command(f"zk:{reached}{chroot}", port, pulsar_port, *broker_args,
                                                        *own_args),
                                   port, env=dict(env or {}), pulsar_port=pulsar_port,
                                   cwd=None if broker_cwd is None else Path(broker_cwd)))
        cluster = Cluster(zookeeper, store, made, servers, output)
        for process in (*made, *servers):
            stack.callback(process.stop)
        for bookie in made:
            cluster.start_bookie(bookie)
        for broker in servers:
            cluster.start_broker(broker)
        yield cluster


def stop_all(processes: list[Process]) -> None:
    """Stop every process by PID (SIGTERM, then SIGKILL after a grace period)."""
    for process in processes:
        if process.running and process.proc is not None:
            os.kill(process.proc.pid, signal.SIGTERM)
    for process in processes:
        process.stop()
