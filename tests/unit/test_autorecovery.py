"""Re-replication over real embedded bookies, the in-memory metadata store and coordination twin.

Checks: a closed ledger whose ensemble lost a bookie gets a new ensemble and every entry on it
(read from the bookies), its mark is removed and a second bookie can then be lost (with no
spare left, the two live bookies each get every entry); an open
ledger's confirmed part is re-replicated under its writer, which merges that change into its
own next ensemble change instead of failing, and nothing it acknowledged is lost; two workers
never repair the same ledger at once; a worker whose session ended writes no metadata.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.bookkeeper.autorecovery import AutoRecoveryConfig, ReplicationWorker
from broker.bookkeeper.bookie import BookieClient, LocalBookie, QuorumConfig, write_set
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.bookkeeper.ledger_metadata import LedgerState
from broker.metadata import InMemoryMetadataStore
from broker.metadata.coordination import InMemoryCluster, InMemoryCoordination
from storage import LedgerStorage, StorageConfig

WAIT_S = 10.0
QUORUM = QuorumConfig(3, 2, 2)


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.bookies = [LocalBookie(f"b{i}", LedgerStorage.open(str(tmp_path / f"b{i}"), StorageConfig.test_min()))
                        for i in range(4)]
        self.members = InMemoryCluster()
        self.sessions = {b.bookie_id: InMemoryCoordination(self.members) for b in self.bookies}
        for bookie_id, session in self.sessions.items():
            session.register_bookie(bookie_id)
        self.store = InMemoryMetadataStore()
        self.client = BookieClient(self.bookies)
        self.manager = LedgerManager(self.store, self.client)

    def worker(self) -> ReplicationWorker:
        return ReplicationWorker(self.store, self.manager, InMemoryCoordination(self.members),
                                 AutoRecoveryConfig(audit_interval_ms=0))

    def kill(self, bookie_id: str) -> None:
        bookie = next(b for b in self.bookies if b.bookie_id == bookie_id)
        bookie.stop()
        self.sessions[bookie_id].unregister()

    def holders(self, ledger_id: int, entry_id: int) -> set[str]:
        found = set()
        for bookie in self.bookies:
            if bookie.available and bookie.storage.ledger_exists(ledger_id):
                try:
                    bookie.storage.get_entry(ledger_id, entry_id)
                except Exception:
                    continue
                found.add(bookie.bookie_id)
        return found

    def close(self) -> None:
        for bookie in self.bookies:
            bookie.storage.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_closed_ledger_gets_its_copies_back(cluster: Cluster) -> None:
    handle = cluster.manager.create(QUORUM)
    for i in range(30):
        handle.append([f"e{i}".encode()]).result(WAIT_S)
    handle.close()
    ensemble = handle.metadata.fragments[0][1]
    cluster.kill(ensemble[0])
    worker = cluster.worker()
    assert worker.run_once() == 1
    stats = worker.statistics()
    assert stats.ledgers_marked == 1 and stats.ledgers_replicated == 1 and stats.underreplicated == 0
    repaired, _ = cluster.manager.metadata(handle.ledger_id)
    new_ensemble = repaired.fragments[0][1]
    assert ensemble[0] not in new_ensemble and len(new_ensemble) == 3
    for entry_id in range(30):
        assert set(write_set(new_ensemble, entry_id, 2)) <= cluster.holders(handle.ledger_id, entry_id)
    assert stats.entries_copied == sum(1 for e in range(30) if ensemble[0] in write_set(ensemble, e, 2))
    cluster.kill(new_ensemble[1])
    assert cluster.manager.open(handle.ledger_id).read(0, 29) == [f"e{i}".encode() for i in range(30)]
    assert worker.run_once() == 1  # no spare left: the two live bookies each get every entry
    narrowed = cluster.manager.metadata(handle.ledger_id)[0].fragments[0][1]
    assert sorted(narrowed) == sorted(b for b in new_ensemble if b != new_ensemble[1])
    assert all(cluster.holders(handle.ledger_id, e) == set(narrowed) for e in range(30))


def test_open_ledger_is_repaired_under_its_writer(cluster: Cluster) -> None:
    writer = cluster.manager.create(QUORUM)
    for i in range(10):
        writer.append([f"w{i}".encode()]).result(WAIT_S)
    victim = writer.metadata.fragments[0][1][2]
    cluster.kill(victim)
    worker = cluster.worker()
    worker.run_once()
    stored, _ = cluster.manager.metadata(writer.ledger_id)
    assert stored.state is LedgerState.OPEN
    assert [first for first, _ in stored.fragments] == [0, 9]  # split at the confirmed LAC the bookies know
    assert victim not in stored.fragments[0][1] and stored.fragments[1][1] == writer.metadata.fragments[0][1]
    for i in range(10, 20):  # the writer meets the dead bookie, changes ensemble and merges the worker's change
        writer.append([f"w{i}".encode()]).result(WAIT_S)
    writer.close()
    final, _ = cluster.manager.metadata(writer.ledger_id)
    assert final.fragments[0] == stored.fragments[0] and final.last_entry_id == 19
    worker.run_once()
    repaired, _ = cluster.manager.metadata(writer.ledger_id)
    assert all(victim not in ensemble for _, ensemble in repaired.fragments)
    survivors = [b.bookie_id for b in cluster.bookies if b.available]
    cluster.kill(survivors[0])
    assert cluster.manager.open(writer.ledger_id).read(0, 19) == [f"w{i}".encode() for i in range(20)]


def test_workers_take_turns_and_a_lost_session_writes_nothing(cluster: Cluster) -> None:
    handle = cluster.manager.create(QUORUM)
    for i in range(5):
        handle.append([f"x{i}".encode()]).result(WAIT_S)
    handle.close()
    cluster.kill(handle.metadata.fragments[0][1][0])
    first, second = cluster.worker(), cluster.worker()
    assert first.audit() == [handle.ledger_id]
    lease = first.coordination.try_lock(f"ledger-{handle.ledger_id}")
    assert lease is not None
    assert second.run_once() == 0  # the ledger is locked by the first worker
    _, version = cluster.manager.metadata(handle.ledger_id)
    assert isinstance(first.coordination, InMemoryCoordination)
    first.coordination.expire_session()
    assert not lease.held
    assert first.replicate(handle.ledger_id, lease) is False
    assert cluster.manager.metadata(handle.ledger_id)[1] == version  # nothing written after the session ended
    assert second.run_once() == 1
    assert second.underreplicated() == []
