"""Ledgers with BookKeeper semantics over real embedded bookies.

Checks: reads never pass the LAC; recovery-open fences the ledger so the old writer's adds fail
with ``LedgerFenced`` and closes it at the last durable entry; a closed ledger's last entry is
fixed; with three bookies at E=3, Qw=2, Qa=2 stopping any one loses no acknowledged entry and
reads fall over to a replica; a failed bookie is replaced by an ensemble change when a spare
exists.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.bookkeeper.bookie import BookieClient, LocalBookie, QuorumConfig, write_set
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.bookkeeper.ledger_metadata import LedgerState
from broker.errors import LedgerClosed, LedgerFenced, NoSuchEntry
from broker.metadata import InMemoryMetadataStore
from storage import LedgerStorage, StorageConfig


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[list[LocalBookie]]:
    made = [LocalBookie(f"bookie-{i}", LedgerStorage.open(str(tmp_path / f"b{i}"), StorageConfig.test_min()))
            for i in range(4)]
    try:
        yield made
    finally:
        for bookie in made:
            bookie.storage.close()


def manager_over(bookies: list[LocalBookie]) -> LedgerManager:
    return LedgerManager(InMemoryMetadataStore(), BookieClient(bookies))


def test_reads_never_pass_the_lac_and_close_fixes_the_last_entry(bookies: list[LocalBookie]) -> None:
    manager = manager_over(bookies[:1])
    handle = manager.create()
    assert [handle.append([f"e{i}".encode()]).result(timeout=10) for i in range(5)] == list(range(5))
    assert handle.last_add_confirmed == 4
    assert handle.read(0, 4) == [f"e{i}".encode() for i in range(5)]
    with pytest.raises(NoSuchEntry):
        handle.read(3, 5)
    with pytest.raises(NoSuchEntry):
        handle.read_entry(5)
    handle.close()
    with pytest.raises(LedgerClosed):
        handle.append([b"late"])
    reader = manager.open(handle.ledger_id)
    assert reader.metadata.state is LedgerState.CLOSED and reader.metadata.last_entry_id == 4
    assert reader.read_entry(4) == b"e4"


def test_recovery_fences_the_old_writer_and_closes_at_the_last_durable_entry(bookies: list[LocalBookie]) -> None:
    manager = manager_over(bookies[:1])
    writer = manager.create()
    for i in range(10):
        writer.append([f"w{i}".encode()]).result(timeout=10)
    recovered = manager.open(writer.ledger_id, recovery=True)
    assert recovered.metadata.state is LedgerState.CLOSED
    assert recovered.metadata.last_entry_id == 9
    assert recovered.metadata.length_bytes == sum(len(f"w{i}") for i in range(10))
    future = writer.append([b"after fencing"])
    with pytest.raises(LedgerFenced):
        future.result(timeout=10)
    with pytest.raises(LedgerFenced):
        writer.close()
    assert manager.open(writer.ledger_id).metadata.last_entry_id == 9


def test_replicas_serve_reads_when_any_one_bookie_stops(bookies: list[LocalBookie]) -> None:
    quorum = QuorumConfig(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
    for stopped in range(3):
        trio = bookies[:3]
        for bookie in trio:
            bookie._stopped = False
        manager = manager_over(trio)
        handle = manager.create(quorum)
        ensemble = handle.metadata.fragments[0][1]
        assert write_set(ensemble, 4, 2) == [ensemble[1], ensemble[2]]
        payloads = [f"entry-{stopped}-{i}".encode() * 3 for i in range(30)]
        for payload in payloads:
            handle.append([payload]).result(timeout=10)
        for entry_id in range(30):  # each entry really is on exactly its write set
            holders = {b.bookie_id for b in trio if b.storage.ledger_exists(handle.ledger_id)
                       and b.storage.get_last_add_confirmed(handle.ledger_id) >= entry_id
                       and _has(b, handle.ledger_id, entry_id)}
            assert holders == set(write_set(ensemble, entry_id, 2))
        trio[stopped].stop()
        assert handle.read(0, 29) == payloads
        assert manager.open(handle.ledger_id, recovery=False).read(0, 28) == payloads[:29]


def _has(bookie: LocalBookie, ledger_id: int, entry_id: int) -> bool:
    try:
        bookie.storage.get_entry(ledger_id, entry_id)
    except NoSuchEntry:
        return False
    return True


def test_a_failed_bookie_is_replaced_by_an_ensemble_change(bookies: list[LocalBookie]) -> None:
    manager = manager_over(bookies)
    handle = manager.create(QuorumConfig(3, 2, 2))
    for i in range(5):
        handle.append([f"before-{i}".encode()]).result(timeout=10)
    victim = handle.metadata.fragments[0][1][0]
    next(b for b in bookies if b.bookie_id == victim).stop()
    for i in range(5):
        handle.append([f"after-{i}".encode()]).result(timeout=10)
    assert len(handle.metadata.fragments) == 2
    assert victim not in handle.metadata.fragments[1][1]
    handle.close()
    reader = manager.open(handle.ledger_id)
    assert reader.read(0, 9) == [f"before-{i}".encode() for i in range(5)] + [f"after-{i}".encode() for i in range(5)]
