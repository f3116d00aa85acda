"""Saving a topic's ledger list when the metadata store stops answering.

Role: drive ``ManagedLedger`` over real storage and a RocksDB metadata store whose next put to
the topic's ledger list fails without an answer, either after being applied (the answer was
lost, as ZooKeeper's can be) or before (the request was lost).

Checks:
- a lost answer to a save that listed a new ledger is not taken for another writer's change:
  the next append takes the stored version back, goes on in a new ledger, and the ledger listed
  by the lost save (empty) is dropped from the list and deleted; everything acknowledged reads
  back after a reload;
- a ledger dropped from the list because it is empty is deleted only after a list without it
  is saved: when that save is lost, the stored list still names the ledger, the ledger still
  exists, and the topic loads again (it used to be deleted first, and every later load failed).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from broker.entry_format import decode_entry
from broker.errors import BrokerError, NoSuchLedger
from broker.managed_ledger import ML_ROOT, ManagedLedger
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.metadata import RocksDBMetadataStore, Stat
from tests.unit.broker_stack import Stack, append_messages, open_stack

TOPIC = "t/ns/persistent/list-saves"


class StoreCutOff(BrokerError):
    code = "metadata_store_unavailable"
    http_status = 503
    retriable = True


def flaky(stack: Stack) -> FlakyPuts:
    """Wrap ``stack.store``'s put to the topic's ledger list."""
    puts = FlakyPuts(stack.store)
    stack.store.put = puts.put  # type: ignore[method-assign]
    return puts


class FlakyPuts:
    """The next put to the topic's ledger list fails without an answer: ``"applied"`` after it
    took effect, ``"lost"`` before."""

    def __init__(self, store: RocksDBMetadataStore) -> None:
        self._put = store.put
        self.next_failure: str | None = None

    def put(self, path: str, value: bytes, expected_version: int | None = None, *, durable: bool = True) -> Stat:
        failure, watched = self.next_failure, path == f"{ML_ROOT}/{TOPIC}"
        if watched and failure is not None:
            self.next_failure = None
            if failure == "applied":
                self._put(path, value, expected_version, durable=durable)
            raise StoreCutOff(f"no answer for {path} ({failure})")
        return self._put(path, value, expected_version, durable=durable)


def payloads(ml: ManagedLedger) -> list[bytes]:
    return [m.payload for e in ml.read_entries(ml.first_position(), 100) for m in decode_entry(e.data).messages]


def listed(stack: Stack) -> list[int]:
    stat = stack.store.get(f"{ML_ROOT}/{TOPIC}")
    assert stat is not None
    return [int(i["ledgerId"]) for i in json.loads(stat.value)["ledgers"]]


def test_a_lost_answer_is_not_taken_for_another_writer(data_dir: str) -> None:
    stack = open_stack(data_dir)
    try:
        ml, _ = stack.open(TOPIC, dataclasses.replace(ManagedLedgerConfig.test_min(), ledger_entries_max=1))
        puts = flaky(stack)
        append_messages(ml, [b"a"])
        before = listed(stack)
        puts.next_failure = "applied"  # the roll-over's new ledger is listed, the answer lost
        with pytest.raises(StoreCutOff):
            append_messages(ml, [b"b"])
        orphan = listed(stack)[-1]
        assert orphan not in before
        append_messages(ml, [b"c"])  # not LedgerFenced: the stored list was this writer's own
        assert payloads(ml) == [b"a", b"c"]
        assert orphan not in listed(stack)
    finally:
        stack.close()
    stack = open_stack(data_dir)
    try:
        ml, _ = stack.open(TOPIC, ManagedLedgerConfig.test_min())  # deletes what the list dropped
        assert payloads(ml) == [b"a", b"c"]
        with pytest.raises(NoSuchLedger):
            stack.ledgers.open(orphan)
    finally:
        stack.close()


def test_an_empty_ledger_is_deleted_only_once_no_saved_list_names_it(data_dir: str) -> None:
    stack = open_stack(data_dir)
    try:
        ml, _ = stack.open(TOPIC, ManagedLedgerConfig.test_min())
        append_messages(ml, [b"kept"])
        stack.factory.close_all()
        ml, _ = stack.open(TOPIC, ManagedLedgerConfig.test_min())  # a new, empty current ledger
        empty = listed(stack)[-1]
        puts = flaky(stack)
        puts.next_failure = "lost"
        with pytest.raises(StoreCutOff):
            ml.close()  # drops the empty ledger from the list, whose save is lost
        assert empty in listed(stack)
        assert stack.ledgers.open(empty).last_add_confirmed == -1  # still there, as the list says
    finally:
        stack.close()
    stack = open_stack(data_dir)
    try:
        ml, _ = stack.open(TOPIC, ManagedLedgerConfig.test_min())  # recovers the empty ledger, drops it
        append_messages(ml, [b"after"])
        assert payloads(ml) == [b"kept", b"after"]
        assert empty not in listed(stack)
        with pytest.raises(NoSuchLedger):
            stack.ledgers.open(empty)
    finally:
        stack.close()
