"""A topic whose managed ledger cannot be loaded: the request fails retriably, nothing stays loaded.

Role: drive the loader (``ManagedLedgerFactory.open`` and ``TopicRegistry.topic``) over a real
storage and RocksDB metadata stack in which another writer rewrites the topic's ledger list just
before each of the loader's compare-and-set writes, as a second broker loading the same topic
would.

Checks:
- ``LOAD_ATTEMPTS_MAX`` lost compare-and-sets in a row fail the open with ``ServiceUnitNotReady``
  (retriable: HTTP 503, ServiceNotReady on the binary protocol) and leave no managed ledger
  behind: the next open loads afresh, appends after the entries stored before, and reads them;
- one lost compare-and-set fewer than ``LOAD_ATTEMPTS_MAX`` is absorbed by the loader's retries;
- through ``TopicRegistry.topic`` the failed load leaves nothing in the topic map: the next
  request loads the topic afresh and publishes after the earlier messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from broker.bookkeeper.bookie import BookieClient, LocalBookie
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.entry_cache import EntryCache
from broker.entry_format import Message, decode_entry
from broker.errors import ServiceUnitNotReady
from broker.limits import LOAD_ATTEMPTS_MAX
from broker.managed_ledger import ML_ROOT, ManagedLedger
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.managed_ledger_factory import ManagedLedgerFactory
from broker.metadata import RocksDBMetadataStore, Stat
from broker.service import BrokerConfig, BrokerService
from broker.topic_name import TopicName
from storage import LedgerStorage, StorageConfig
from tests.publishing import publish
from tests.unit.broker_stack import FakeClock, Stack, append_messages, open_stack

RESULT_TIMEOUT_S = 10.0


class RivalWriterStore(RocksDBMetadataStore):
    """A RocksDB metadata store in which, while ``rival_writes`` is above zero, another writer
    rewrites ``watched`` (same content, next version) just before each versioned put to it, so
    that put loses its compare-and-set. ``refused`` counts the puts this made fail."""

    def __init__(self, path: str, clock: Callable[[], float] | None = None) -> None:
        super().__init__(path, clock=clock)
        self.watched = ""
        self.rival_writes = 0
        self.refused = 0

    def put(self, path: str, value: bytes, expected_version: int | None = None, *, durable: bool = True) -> Stat:
        if path == self.watched and self.rival_writes > 0 and expected_version is not None:
            self.rival_writes -= 1
            self.refused += 1
            current = self.get(path)
            super().put(path, value if current is None else current.value)  # the other writer's rewrite
        return super().put(path, value, expected_version, durable=durable)


def payloads(ml: ManagedLedger) -> list[bytes]:
    return [m.payload for e in ml.read_entries(ml.first_position(), 100) for m in decode_entry(e.data).messages]


@pytest.mark.parametrize("lost_races", [LOAD_ATTEMPTS_MAX, LOAD_ATTEMPTS_MAX - 1])
def test_a_load_that_keeps_losing_to_another_writer_fails_retriably_and_keeps_nothing(
        data_dir: str, lost_races: int) -> None:
    name = "t/ns/persistent/contended"
    config = ManagedLedgerConfig()
    stack = open_stack(data_dir)
    ml, _ = stack.open(name, config)
    append_messages(ml, [b"before"])
    stack.close()

    clock = FakeClock()
    storage = LedgerStorage.open(f"{data_dir}/bookie", StorageConfig.test_min())
    store = RivalWriterStore(f"{data_dir}/metadata", clock)
    ledgers = LedgerManager(store, BookieClient([LocalBookie("local", storage)]), clock)
    cache = EntryCache(1 << 20, clock=clock)
    stack = Stack(storage, store, ledgers, ManagedLedgerFactory(store, ledgers, cache, clock), clock, cache)
    try:
        store.watched, store.rival_writes = f"{ML_ROOT}/{name}", lost_races
        if lost_races >= LOAD_ATTEMPTS_MAX:
            with pytest.raises(ServiceUnitNotReady, match="could not be loaded"):
                stack.factory.open(name, config)
            assert store.refused == LOAD_ATTEMPTS_MAX
        loaded = stack.factory.open(name, config)  # afresh after a failure; absorbed by the retries otherwise
        assert store.rival_writes == 0 and store.refused == lost_races
        assert append_messages(loaded, [b"after"]).first_offset == 1
        assert payloads(loaded) == [b"before", b"after"]
        assert stack.factory.open(name, config) is loaded
    finally:
        stack.close()


def test_a_failed_topic_load_leaves_nothing_in_the_topic_map(data_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("broker.service.RocksDBMetadataStore", RivalWriterStore)
    config = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000)
    service = BrokerService(data_dir, config, FakeClock())
    service.start()
    try:
        name = TopicName.parse("persistent://public/default/contended")
        publish(service.topics.topic(name), [Message(b"before")], producer_name="p").result(timeout=RESULT_TIMEOUT_S)
        assert service.topics.unload(lambda n: n == name, graceful=True) == [name]
        store = service.store
        assert isinstance(store, RivalWriterStore)
        store.watched, store.rival_writes = f"{ML_ROOT}/{name.managed_ledger_name}", LOAD_ATTEMPTS_MAX
        with pytest.raises(ServiceUnitNotReady) as refused:
            service.topics.topic(name)
        assert refused.value.retriable and refused.value.http_status == 503
        assert name.full_name not in [t.name.full_name for t in service.topics.loaded()]
        topic = service.topics.topic(name)
        assert topic.ml.next_offset == 1
        publish(topic, [Message(b"after")], producer_name="p").result(timeout=RESULT_TIMEOUT_S)
        assert payloads(topic.ml) == [b"before", b"after"]
    finally:
        service.close()
