"""BrokerService as a composition root: its parts exist from ``start`` on, listeners added
before it hear of what happens after it, and each part with state counts it in
``statistics()`` (and in ``BrokerService.statistics()``): loaded topics, cached partition
counts, subscriptions, patterns, topic-list watchers, compactors. Topics that stop being served
here are let go by every part that follows them before the transports hear of it."""

from __future__ import annotations

import dataclasses

import pytest

from broker.consumer import ConsumerConfig
from broker.entry_format import Message
from broker.service import BrokerConfig, BrokerService
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName
from tests.publishing import publish
from tests.unit.broker_stack import FakeClock


def test_parts_exist_from_start_and_earlier_listeners_hear_later_changes(data_dir: str) -> None:
    service = BrokerService(data_dir, dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000),
                            FakeClock())
    with pytest.raises(RuntimeError, match="not started"):
        service.topics.topic("public/default/t")
    told: list[str] = []
    service.add_policy_listener(lambda: told.append("policy"))
    service.start()
    try:
        service.namespaces.set_policy("public/default", "message_ttl_in_seconds", 60)
        assert told == ["policy"]
    finally:
        service.close()
    with pytest.raises(RuntimeError, match="not started"):
        service.subscriptions.of(TopicName.parse("public/default/t"))


def test_each_part_counts_its_state(data_dir: str) -> None:
    service = BrokerService(data_dir, dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000),
                            FakeClock())
    service.start()
    try:
        service.topics.create_partitioned(TopicName.parse("public/default/p"), 2)
        publish(service.topics.topic("public/default/a"), [Message(b"x")], producer_name="w").result(timeout=10)
        consumer = service.subscriptions.subscribe("public/default/a", "s", SubscriptionType.SHARED,
                                                   ConsumerConfig("c"))
        pattern = service.subscriptions.subscribe_pattern("public/default", "persistent://public/default/a.*", "ps",
                                                          SubscriptionType.SHARED, ConsumerConfig("pc"))
        unwatch = service.subscriptions.watch_topics("public/default", lambda name, exists: None)
        service.compactions.status(TopicName.parse("public/default/a"))
        stats = service.statistics()
        assert stats.topic_registry is not None and stats.topic_registry.topics_loaded == 1
        assert stats.topic_registry.partition_counts_cached == 1  # "a" (0: not partitioned); "p" was written
        assert stats.subscriptions == service.subscriptions.statistics()
        assert (stats.subscriptions.subscriptions, stats.subscriptions.patterns, stats.subscriptions.topic_watchers) \
            == (2, 1, 1)  # "s" and the pattern's "ps" on topic a
        assert stats.compactions is not None and stats.compactions.compactors == 1
        pattern.close()
        unwatch()
        consumer.close()
        assert (service.subscriptions.statistics().patterns, service.subscriptions.statistics().topic_watchers) \
            == (0, 0)
        service.subscriptions.unsubscribe(TopicName.parse("public/default/a"), "s")
        service.subscriptions.unsubscribe(TopicName.parse("public/default/a"), "ps")
        service.topics.delete(TopicName.parse("public/default/a"))
        assert service.topics.statistics().topics_loaded == 0
        assert service.compactions.statistics().compactors == 0  # forgotten with its topic
        assert service.subscriptions.statistics().subscriptions == 0
    finally:
        service.close()


def test_unloaded_topics_are_let_go_before_the_transports_hear_of_them(data_dir: str) -> None:
    service = BrokerService(data_dir, dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000),
                            FakeClock())
    heard: list[tuple[list[str], int, bool]] = []
    service.add_unload_listener(lambda names: heard.append(
        ([n.full_name for n in names], service.subscriptions.statistics().subscriptions, consumer.unloaded)))
    service.start()
    try:
        name = TopicName.parse("public/default/u")
        consumer = service.subscriptions.subscribe(name, "s", SubscriptionType.SHARED, ConsumerConfig("c"))
        service.compactions.status(name)
        assert service.topics.unload(lambda topic: topic == name, graceful=True) == [name]
        assert heard == [([name.full_name], 0, True)]  # subscription dropped, consumer closed as unloaded
        assert consumer.closed
        assert service.compactions.statistics().compactors == 0
        assert service.topics.statistics().topics_loaded == 0
        assert "s" in service.topics.topic(name).cursors.names()  # reloaded fresh: the durable cursor stayed
    finally:
        service.close()
