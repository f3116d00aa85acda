"""Delivery through the broker service: partition routing, multi-topic and pattern consumers,
readers at every kind of start position (and the compacted view), the dead-letter topic, and
bounded broker memory under a large backlog with a slow consumer."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest

from broker.consumer import Consumer, ConsumerConfig
from broker.delivery import Delivery
from broker.entry_format import Message
from broker.errors import ConsumerBusy
from broker.message_id import MessageId
from broker.reader import StartPosition
from broker.routing import MultiConsumer
from broker.service import BrokerConfig, BrokerService
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName
from tests.publishing import publish, publish_to
from tests.unit.broker_stack import FakeClock

WAIT_S = 10.0


@pytest.fixture
def service(data_dir: str) -> Iterator[BrokerService]:
    config = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000)
    started = BrokerService(data_dir, config, FakeClock())
    started.start()
    yield started
    started.close()


def wait_for(source: Consumer | MultiConsumer, count: int) -> list[Delivery]:
    """Poll until ``count`` deliveries arrived (dispatch runs on the dispatch thread)."""
    got: list[Delivery] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        run = source.poll()
        if run is None:
            time.sleep(0.005)
        else:
            got.extend(run.messages())
    return got


def test_keyed_messages_route_consistently_across_partitions(service: BrokerService) -> None:
    name = TopicName.parse("public/default/routed")
    service.topics.create_partitioned(name, 4)
    partition_of: dict[str, set[int]] = {}
    for i in range(200):
        key = f"k{i % 17}"
        result = publish_to(service, name, [Message(b"v", key=key)], producer_name="p")
        partition_of.setdefault(key, set()).add(result.message_ids[0].partition)
    assert all(len(parts) == 1 for parts in partition_of.values())
    assert len({p for parts in partition_of.values() for p in parts}) > 1
    unkeyed = {publish_to(service, name, [Message(b"v")], producer_name="q").message_ids[0].partition
               for _ in range(8)}
    assert unkeyed == {0, 1, 2, 3}  # round-robin


def test_multi_topic_and_pattern_consumers_include_topics_created_later(service: BrokerService) -> None:
    service.topics.create_partitioned(TopicName.parse("public/default/orders"), 2)
    multi = service.subscriptions.subscribe_many(["public/default/orders", "public/default/audit"], "s",
                                                 SubscriptionType.SHARED, ConsumerConfig("m"), initial="earliest")
    pattern = service.subscriptions.subscribe_pattern("public/default", r"persistent://public/default/metrics-.*", "p",
                                                      SubscriptionType.SHARED, ConsumerConfig("pm"), initial="earliest")
    multi.flow(100)
    for key in ("a", "b", "c", "d"):
        publish_to(service, "public/default/orders", [Message(key.encode(), key=key)], producer_name="o")
    publish_to(service, "public/default/audit", [Message(b"x")], producer_name="a")
    got = wait_for(multi, 5)
    assert sorted(d.message.payload for d in got) == [b"a", b"b", b"c", b"d", b"x"]
    assert {d.topic for d in got} >= {"persistent://public/default/audit"}
    publish_to(service, "public/default/metrics-cpu", [Message(b"1")], producer_name="m")
    publish_to(service, "public/default/metrics-mem", [Message(b"2")], producer_name="m")  # created after subscribing
    pattern.flow(10)
    later = wait_for(pattern, 2)
    assert sorted(d.message.payload for d in later) == [b"1", b"2"]
    assert sorted(pattern.topics()) == ["persistent://public/default/metrics-cpu",
                                        "persistent://public/default/metrics-mem"]
    for delivery in got:
        multi.ack(delivery.topic, [delivery.offset])


def test_readers_start_exactly_where_asked(service: BrokerService) -> None:
    clock: FakeClock = service.clock  # type: ignore[assignment]
    topic = service.topics.topic("public/default/reads")
    ids: list[MessageId] = []
    times: list[int] = []
    for i in range(12):
        clock.advance(1.0)
        result = publish(topic, [Message(f"m{i}".encode(), key=f"k{i % 3}")], producer_name="p").result(timeout=10)
        ids.append(result.message_ids[0])
        times.append(result.publish_time_ms)

    def first_payload(start: StartPosition, compacted: bool = False) -> bytes | None:
        delivery = service.subscriptions.reader("public/default/reads", start, compacted=compacted).read_next()
        return None if delivery is None else delivery.message.payload

    assert first_payload(StartPosition.earliest()) == b"m0"
    assert first_payload(StartPosition.latest()) is None
    assert first_payload(StartPosition("message_id", message_id=ids[5], inclusive=True)) == b"m5"
    assert first_payload(StartPosition("message_id", message_id=ids[5], inclusive=False)) == b"m6"
    assert first_payload(StartPosition("offset", offset=7)) == b"m7"
    assert first_payload(StartPosition("timestamp", timestamp_ms=times[9])) == b"m9"
    latest = service.subscriptions.reader("public/default/reads", StartPosition.latest())
    assert not latest.has_message_available()
    publish(topic, [Message(b"tail")], producer_name="p").result(timeout=10)
    assert latest.has_message_available()
    delivered = latest.read_next()
    assert delivered is not None and delivered.message.payload == b"tail"
    service.compactions.compactor(TopicName.parse("public/default/reads")).compact()
    reader = service.subscriptions.reader("public/default/reads", StartPosition.earliest(), compacted=True)
    compacted = []
    while (delivery := reader.read_next()) is not None:
        compacted.append(delivery.message.payload)
    assert compacted == [b"m9", b"m10", b"m11"]


def test_dead_letter_topic_gets_each_message_exactly_once(service: BrokerService) -> None:
    clock: FakeClock = service.clock  # type: ignore[assignment]
    consumer = service.subscriptions.subscribe("public/default/poison", "s", SubscriptionType.SHARED,
                                               ConsumerConfig("c", negative_ack_redelivery_delay_ms=100,
                                                              max_redeliver_count=1),
                                               initial="earliest")
    consumer.flow(100)
    publish_to(service, "public/default/poison", [Message(b"bad")], producer_name="p")
    for _ in range(2):
        delivery = wait_for(consumer, 1)
        assert len(delivery) == 1
        consumer.nack([delivery[0].offset])
        clock.advance(0.2)
        service.maintenance.run()
    service.maintenance.run()
    dlq = service.subscriptions.reader("public/default/poison-s-DLQ", StartPosition.earliest())
    first = dlq.read_next()
    assert first is not None and first.message.payload == b"bad"
    assert first.message.properties["REAL_TOPIC"] == "persistent://public/default/poison"
    assert dlq.read_next() is None
    subscription = service.subscriptions.of(TopicName.parse("public/default/poison"))[0]
    assert subscription.cursor.backlog_messages() == 0
    replay = Message(b"bad")  # a replayed dead-letter publish is deduplicated
    again = publish(service.topics.topic("public/default/poison-s-DLQ"),
        [replay], producer_name=f"DLQ:persistent://public/default/poison:s:{first.offset}", sequence_id=0
    ).result(timeout=10)
    assert again.duplicate


def test_slow_consumer_keeps_broker_memory_bounded(service: BrokerService) -> None:
    topic = service.topics.topic("public/default/backlog")
    for _ in range(20_000 // 500):
        publish(topic, [Message(b"x" * 100)] * 500, producer_name="p").result(timeout=10)
    consumer = service.subscriptions.subscribe("public/default/backlog", "slow", SubscriptionType.SHARED,
                                               ConsumerConfig("c", receiver_queue_size=10), initial="earliest")
    consumer.flow(10)
    assert len(wait_for(consumer, 10)) == 10
    subscription = service.subscriptions.of(TopicName.parse("public/default/backlog"))[0]
    held = sum(len(waiting.offsets) for waiting in subscription._reads.pending) + len(subscription._redelivery.due) + \
        consumer.outbox_messages
    assert held <= 500 + 10  # at most one entry (500 messages) decoded beyond the permits
    assert subscription.cursor.read_offset <= 1000
    assert service.cache.size_bytes <= service.cache.capacity_bytes
    stats = subscription.statistics()
    assert stats.msg_backlog == 20_000 and stats.unacked_messages == 10
    assert stats.consumers[0].available_permits == 0


def test_initial_positions_non_durable_subscriptions_unsubscribe_and_rates(service: BrokerService) -> None:
    clock: FakeClock = service.clock  # type: ignore[assignment]
    for i in range(5):
        publish_to(service, "public/default/subs", [Message(f"old{i}".encode())], producer_name="p")
    earliest = service.subscriptions.subscribe("public/default/subs", "from-start", SubscriptionType.EXCLUSIVE,
                                               ConsumerConfig("e"), initial="earliest")
    latest = service.subscriptions.subscribe("public/default/subs", "from-now", SubscriptionType.EXCLUSIVE,
                                             ConsumerConfig("l"), initial="latest")
    transient = service.subscriptions.subscribe("public/default/subs", "transient", SubscriptionType.EXCLUSIVE,
                                                ConsumerConfig("t"), initial="earliest", durable=False)
    for consumer in (earliest, latest, transient):
        consumer.flow(100)
    publish_to(service, "public/default/subs", [Message(b"new")], producer_name="p")
    assert len(wait_for(earliest, 6)) == 6
    assert [d.message.payload for d in wait_for(latest, 1)] == [b"new"]
    assert len(wait_for(transient, 6)) == 6
    topic = service.topics.topic("public/default/subs")
    assert topic.cursors.names() == ["from-now", "from-start"]  # the non-durable one is not stored
    with pytest.raises(ConsumerBusy):
        service.subscriptions.unsubscribe(TopicName.parse("public/default/subs"), "from-now")
    latest.close()
    service.subscriptions.unsubscribe(TopicName.parse("public/default/subs"), "from-now")
    assert topic.cursors.names() == ["from-start"]
    subscription = next(s for s in service.subscriptions.of(TopicName.parse("public/default/subs"))
                        if s.name == "from-start")
    clock.advance(2.0)
    service.maintenance.run()
    stats = subscription.statistics()
    assert stats.msg_out_counter == 6 and stats.msg_rate_out == pytest.approx(3.0)
    assert stats.unacked_messages == 6 and stats.consumers[0].available_permits == 94


def test_redelivery_counts_survive_a_restart(data_dir: str) -> None:
    clock = FakeClock()
    config = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000)
    service = BrokerService(data_dir, config, clock)
    service.start()
    consumer_config = ConsumerConfig("c", negative_ack_redelivery_delay_ms=100, max_redeliver_count=3)
    consumer = service.subscriptions.subscribe("public/default/counts", "s", SubscriptionType.SHARED, consumer_config,
                                               initial="earliest")
    consumer.flow(10)
    publish_to(service, "public/default/counts", [Message(b"flaky")], producer_name="p")
    for expected_count in (0, 1):
        delivery = wait_for(consumer, 1)
        assert [d.redelivery_count for d in delivery] == [expected_count]
        consumer.nack([delivery[0].offset])
        clock.advance(0.2)
        service.maintenance.run()
    service.close()
    service = BrokerService(data_dir, config, clock)
    service.start()
    consumer = service.subscriptions.subscribe("public/default/counts", "s", SubscriptionType.SHARED, consumer_config)
    consumer.flow(10)
    assert [d.redelivery_count for d in wait_for(consumer, 1)] == [2]
    service.close()
