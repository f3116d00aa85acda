"""BrokerService: tenants, namespaces, topics and partitioned topics live in the metadata store
and survive a restart; namespace retention and TTL policies drive trimming and expiry."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest

from broker.consumer import ConsumerConfig
from broker.entry_format import Message
from broker.errors import AlreadyExists, InvalidRequest, NotAllowed, NotFound
from broker.service import BrokerConfig, BrokerService
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName
from tests.publishing import publish
from tests.unit.broker_stack import FakeClock


def started(data_dir: str, clock: FakeClock, *, auto_create_topics: bool = True) -> BrokerService:
    config = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000,
                                 auto_create_topics=auto_create_topics)
    service = BrokerService(data_dir, config, clock)
    service.start()
    return service


def test_admin_state_survives_restart(data_dir: str) -> None:
    clock = FakeClock()
    service = started(data_dir, clock)
    assert service.namespaces.tenants() == ["public"] and service.namespaces.namespaces("public") == ["public/default"]
    service.namespaces.create_tenant("acme", {"adminRoles": ["ops"]})
    with pytest.raises(AlreadyExists):
        service.namespaces.create_tenant("acme", {})
    service.namespaces.create_namespace("acme/prod")
    service.topics.create_partitioned(TopicName.parse("acme/prod/orders"), 3)
    publish(service.topics.topic("acme/prod/events"), [Message(b"e")], producer_name="p").result(timeout=10)
    with pytest.raises(NotAllowed):
        service.topics.topic("acme/prod/orders")  # the partitioned topic itself takes no messages
    publish(service.topics.topic("acme/prod/orders-partition-1"), [Message(b"o")], producer_name="p").result(timeout=10)
    with pytest.raises(NotFound):
        service.topics.topic("acme/prod/orders-partition-3")
    service.close()
    service = started(data_dir, clock)
    assert service.namespaces.tenant_info("acme")["adminRoles"] == ["ops"]
    assert service.namespaces.namespaces("acme") == ["acme/prod"]
    assert service.topics.partitions(TopicName.parse("acme/prod/orders")) == 3
    service.topics.update_partitioned(TopicName.parse("acme/prod/orders"), 5)
    assert service.topics.partitions(TopicName.parse("acme/prod/orders")) == 5
    with pytest.raises(InvalidRequest):
        service.topics.update_partitioned(TopicName.parse("acme/prod/orders"), 2)  # partitions only grow
    publish(service.topics.topic("acme/prod/orders-partition-4"), [Message(b"new")],
            producer_name="p").result(timeout=10)
    assert service.topics.names("acme/prod") == ["persistent://acme/prod/events",
                                                 "persistent://acme/prod/orders-partition-1",
                                                 "persistent://acme/prod/orders-partition-4"]
    assert service.topics.topic("acme/prod/events").ml.next_offset == 1
    with pytest.raises(NotAllowed):
        service.namespaces.delete_namespace("acme/prod")
    service.close()


def test_auto_creation_can_be_turned_off(data_dir: str) -> None:
    service = started(data_dir, FakeClock(), auto_create_topics=False)
    with pytest.raises(NotFound, match="allowAutoTopicCreation is off: create it first"):
        service.topics.topic("public/default/nope")
    service.topics.create(TopicName.parse("public/default/yes"))
    assert service.topics.topic("public/default/yes").ml.next_offset == 0
    with pytest.raises(NotFound):
        service.topics.topic("nowhere/ns/t", create=True)
    service.close()


def test_ttl_policy_expires_backlog_and_retention_trims(data_dir: str) -> None:
    clock = FakeClock()
    service = started(data_dir, clock)
    service.namespaces.set_policy("public/default", "message_ttl_in_seconds", 60)
    service.namespaces.set_policy("public/default", "retention_policies",  # consumed ledgers go (Pulsar's default)
                                  {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    topic = service.topics.topic("ttl")
    cursor = topic.cursors.open("sub", initial="earliest")
    for i in range(12):
        publish(topic, [Message(f"{i}".encode())], producer_name="p").result(timeout=10)
    assert cursor.backlog_messages() == 12
    ledgers_before = len(topic.ml.ledger_infos())
    clock.advance(61)
    publish(topic, [Message(b"fresh")], producer_name="p").result(timeout=10)
    service.maintenance.run()
    cursor.flush()
    assert cursor.backlog_messages() == 1
    service.maintenance.run()  # the persisted mark-delete now lets trimming go
    assert len(topic.ml.ledger_infos()) < ledgers_before
    service.close()


def test_dispatch_of_new_entries_runs_on_the_given_executor(data_dir: str) -> None:
    """With an executor (the API passes its event loop's), a confirmed entry reaches consumers
    only through it: nothing is delivered until the queued work runs, and going back to None
    restores the dispatch thread."""
    service = started(data_dir, FakeClock())
    queued: list[Callable[[], None]] = []
    service.use_dispatch_executor(queued.append)
    consumer = service.subscriptions.subscribe("orders", "s", SubscriptionType.SHARED, ConsumerConfig(name="c"))
    consumer.flow(10)
    publish(service.topics.topic("orders"), [Message(b"first")], producer_name="p").result(timeout=10)
    assert consumer.poll() is None and len(queued) == 1
    queued.pop()()
    run = consumer.poll()
    assert run is not None and [d.message.payload for d in run.messages()] == [b"first"]
    service.use_dispatch_executor(None)
    publish(service.topics.topic("orders"), [Message(b"second")], producer_name="p").result(timeout=10)
    deadline = time.monotonic() + 10
    while (run := consumer.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert run is not None and [d.message.payload for d in run.messages()] == [b"second"] and not queued
    service.close()
