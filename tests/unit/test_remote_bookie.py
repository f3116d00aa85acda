"""Remote bookies over real TCP on 127.0.0.1: the bookie server, the network client, and
ledgers with quorums over them.

Checks: pipelined adds are acknowledged once durable and read back (single reads and
read-ahead ranges); fencing and recovery adds cross the wire; a silent bookie times out, its
connection is dropped and requests fail fast while the client backs off, then it reconnects;
the bound on adds in flight pushes back with ``BookieBusy``; a ledger at E=3 Qw=2 Qa=2 keeps
every acknowledged entry when a bookie dies mid-stream (ensemble change onto the live ones).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.bookkeeper.bookie import BookieUnavailable, QuorumConfig
from broker.bookkeeper.bookie_network import BookieBusy, BookieNetwork, BookieNetworkConfig, BookieTimeout
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.bookkeeper.remote_bookie import RemoteBookie, RemoteBookieClient
from broker.errors import LedgerFenced, NoSuchEntry, NoSuchLedger
from broker.limits import GROUP_BYTES_MAX
from broker.metadata import InMemoryMetadataStore
from broker.metadata.coordination import InMemoryCluster, InMemoryCoordination
from storage import LedgerStorage, StorageConfig
from storage.bookie_server import BookieServer

WAIT_S = 10.0


class ServedBookie:
    """A real storage served on 127.0.0.1 from its own event-loop thread."""

    def __init__(self, path: Path, port: int = 0) -> None:
        self.storage = LedgerStorage.open(str(path), StorageConfig.test_min())
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = BookieServer(self.storage, "127.0.0.1", port)
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(WAIT_S)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        """Stop serving at once (connections aborted, as when the process dies)."""
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(WAIT_S)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT_S)
            self.loop.close()
            self.storage.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[ServedBookie]]:
    made = [ServedBookie(tmp_path / f"b{i}") for i in range(3)]
    try:
        yield made
    finally:
        for bookie in made:
            bookie.stop()


@pytest.fixture
def network() -> Iterator[BookieNetwork]:
    net = BookieNetwork(BookieNetworkConfig.test_min())
    try:
        yield net
    finally:
        net.close()


def test_pipelined_adds_reads_and_read_ahead(served: list[ServedBookie], network: BookieNetwork) -> None:
    bookie = RemoteBookie(served[0].address, network)
    futures = [bookie.add_entries(1, [e], e - 1, [(10 * (e + 1), f"entry-{e}".encode())]) for e in range(40)]
    assert [f.result(WAIT_S) for f in futures] == list(range(40))
    assert bookie.last_entry_id(1) == 39 and bookie.read_last_add_confirmed(1) == 38
    assert [bookie.read_entry(1, e).payload for e in range(40)] == [f"entry-{e}".encode() for e in range(40)]
    stats = bookie.statistics()
    assert stats.range_reads == 5 and stats.read_ahead_hits == 35  # ranges of 8 (test_min)
    assert bookie.read_entry(1, 7).length_bytes == 80
    with pytest.raises(NoSuchEntry):
        bookie.read_entry(1, 40)
    assert bookie.last_entry_id(2) == -1 and bookie.read_last_add_confirmed(2) == -1
    assert served[0].server.statistics().adds == 40


def test_group_adds_are_one_request_each_and_fail_together(served: list[ServedBookie],
                                                           network: BookieNetwork) -> None:
    """A striped share of entries (E=3, Qw=2: two of every three) goes as one ADD_MANY, is
    durable and readable entry by entry; a group larger than ``GROUP_BYTES_MAX``, or holding more
    than half the bound on adds in flight, goes as several requests under one future; a fenced
    ledger refuses a whole group."""
    bookie = RemoteBookie(served[0].address, network)
    share = [e for e in range(45) if e % 3 != 1]  # 30 entries: under half the bound of test_min
    entries = [(10 * (e + 1), f"entry-{e}".encode()) for e in share]
    requests_before = network.connection(served[0].address).statistics().requests
    assert bookie.add_entries(3, share, 5, entries).result(WAIT_S) == 44
    assert network.connection(served[0].address).statistics().requests == requests_before + 1
    assert served[0].server.statistics().adds == len(share)
    assert [bookie.read_entry(3, e).payload for e in share] == [payload for _, payload in entries]
    assert bookie.read_entry(3, 2).lac == 5 and bookie.read_entry(3, 2).length_bytes == 30
    with pytest.raises(NoSuchEntry):
        bookie.read_entry(3, 1)
    large = [(i + 1, bytes([i]) * (GROUP_BYTES_MAX // 2 + 1)) for i in range(5)]
    requests_before = network.connection(served[0].address).statistics().requests
    assert bookie.add_entries(4, range(5), -1, large).result(WAIT_S) == 4
    assert network.connection(served[0].address).statistics().requests == requests_before + 5
    assert [bookie.read_entry(4, e).payload for e in range(5)] == [payload for _, payload in large]
    many = network.config.inflight_adds_max  # test_min: 64; requests hold half of it at most
    requests_before = network.connection(served[0].address).statistics().requests
    assert bookie.add_entries(5, range(many), -1, [(e + 1, b"z") for e in range(many)]).result(WAIT_S) == many - 1
    assert network.connection(served[0].address).statistics().requests == requests_before + 2
    bookie.fence(3).result(WAIT_S)
    with pytest.raises(LedgerFenced):
        bookie.add_entries(3, [60, 62], 59, [(1, b"x"), (2, b"y")]).result(WAIT_S)
    with pytest.raises(NoSuchEntry):
        bookie.read_entry(3, 60)


def test_fence_recovery_adds_and_delete(served: list[ServedBookie], network: BookieNetwork) -> None:
    bookie = RemoteBookie(served[0].address, network)
    bookie.add_entries(5, [0], -1, [(1, b"a")]).result(WAIT_S)
    bookie.fence(5).result(WAIT_S)
    with pytest.raises(LedgerFenced):
        bookie.add_entries(5, [1], 0, [(2, b"b")]).result(WAIT_S)
    assert bookie.add_entries(5, [1], 0, [(2, b"b")], recovery=True).result(WAIT_S) == 1
    bookie.delete_ledger(5)
    bookie.delete_ledger(5)  # deleting a missing ledger is a no-op
    with pytest.raises(NoSuchLedger):
        bookie.read_entry(5, 0)


def silent_server() -> tuple[socket.socket, list[socket.socket]]:
    """Accepts connections and reads, never answers (a hung bookie)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return listener, accepted


def test_silent_bookie_times_out_backs_off_and_reconnects(tmp_path: Path) -> None:
    listener, accepted = silent_server()
    config = BookieNetworkConfig(request_timeout_ms=300, reconnect_backoff_ms_min=400, reconnect_backoff_ms_max=400)
    network = BookieNetwork(config)
    try:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        bookie = RemoteBookie(address, network)
        started = time.monotonic()
        with pytest.raises(BookieTimeout):
            bookie.add_entries(1, [0], -1, [(1, b"x")]).result(WAIT_S)
        assert time.monotonic() - started < 5.0
        with pytest.raises(BookieUnavailable):  # backing off: fails at once, no queueing
            bookie.add_entries(1, [1], -1, [(1, b"y")]).result(1.0)
        assert network.connection(address).statistics().timeouts >= 1
        listener.close()
        for conn in accepted:
            conn.close()
        served = ServedBookie(tmp_path / "revived")
        try:
            revived = RemoteBookie(served.address, network)
            assert revived.add_entries(1, [0], -1, [(1, b"z")]).result(WAIT_S) == 0
        finally:
            served.stop()
    finally:
        network.close()


def test_adds_in_flight_are_bounded() -> None:
    listener, accepted = silent_server()
    network = BookieNetwork(BookieNetworkConfig(request_timeout_ms=5_000, inflight_adds_max=4, add_wait_ms_max=200))
    try:
        bookie = RemoteBookie(f"127.0.0.1:{listener.getsockname()[1]}", network)
        pending = [bookie.add_entries(1, [e], -1, [(1, b"x")]) for e in range(4)]
        with pytest.raises(BookieBusy):
            bookie.add_entries(1, [4], -1, [(1, b"x")])
        assert not any(f.done() for f in pending)
    finally:
        network.close()
        listener.close()
        for conn in accepted:
            conn.close()


def test_ledger_survives_a_bookie_dying_mid_stream(served: list[ServedBookie]) -> None:
    cluster = InMemoryCluster()
    sessions = {bookie.address: InMemoryCoordination(cluster) for bookie in served}
    for address, session in sessions.items():
        session.register_bookie(address)
    client = RemoteBookieClient(InMemoryCoordination(cluster), BookieNetworkConfig.test_min())
    try:
        manager = LedgerManager(InMemoryMetadataStore(), client)
        handle = manager.create(QuorumConfig(3, 2, 2))
        acked = [handle.append([f"m{i}".encode()]).result(WAIT_S) for i in range(20)]
        acked.append(handle.append([f"m{i}".encode() for i in range(20, 30)]).result(WAIT_S))
        victim = handle.metadata.fragments[0][1][1]
        next(b for b in served if b.address == victim).stop()
        sessions[victim].unregister()
        acked.append(handle.append([f"m{i}".encode() for i in range(30, 40)]).result(WAIT_S))
        acked += [handle.append([f"m{i}".encode()]).result(WAIT_S) for i in range(40, 60)]
        assert acked == [*range(20), 29, 39, *range(40, 60)]
        assert len(handle.metadata.fragments) == 2
        assert victim not in handle.metadata.fragments[-1][1] and len(handle.metadata.fragments[-1][1]) == 2
        handle.close()
        reader = manager.open(handle.ledger_id)
        assert reader.read(0, 59) == [f"m{i}".encode() for i in range(60)]
    finally:
        client.close()
