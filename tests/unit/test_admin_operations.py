"""The broker operations behind the admin API: cursor moves through an active subscription,
peek positions, publish rates, forced subscription deletion, background compaction, tenant
updates and the not-empty refusals.

Checks: a reset redelivers everything unacknowledged from the new position to a connected
consumer, without duplicating what it still holds; a skip withdraws undelivered messages (their
permits come back) and releases held ones it acknowledged, so they are never redelivered; the
n-th unacknowledged offset skips acked ranges; rates follow the injected clock; a subscription
with consumers is deleted only with force; compaction runs off the request thread.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest

from broker.consumer import Consumer, ConsumerConfig
from broker.delivery import Delivery
from broker.entry_format import Message
from broker.errors import NotAllowed, NotEmpty, PreconditionFailed
from broker.service import BrokerConfig, BrokerService
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName
from tests.publishing import publish_to
from tests.unit.broker_stack import FakeClock

WAIT_S = 10.0
TOPIC = TopicName.parse("public/default/admin-ops")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def service(data_dir: str, clock: FakeClock) -> Iterator[BrokerService]:
    config = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000)
    started = BrokerService(data_dir, config, clock)
    started.start()
    yield started
    started.close()


def publish(service: BrokerService, count: int, *, first: int = 0) -> None:
    for i in range(first, first + count):
        publish_to(service, TOPIC, [Message(f"m{i}".encode(), key=f"k{i % 3}")], producer_name="p")


def take(consumer: Consumer, count: int) -> list[Delivery]:
    """Poll until ``count`` deliveries arrived or the deadline passed."""
    got: list[Delivery] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        run = consumer.poll()
        if run is None:
            time.sleep(0.005)
        else:
            got.extend(run.messages())
    return got


def test_reset_redelivers_from_the_new_position_without_duplicating_held_messages(service: BrokerService) -> None:
    publish(service, 10)
    consumer = service.subscriptions.subscribe(TOPIC, "s", SubscriptionType.EXCLUSIVE,
                                               ConsumerConfig("c", negative_ack_redelivery_delay_ms=0),
                                               initial="earliest")
    consumer.flow(5)
    first = take(consumer, 5)
    assert [d.offset for d in first] == [0, 1, 2, 3, 4]
    consumer.ack([0, 1, 2])  # 3 and 4 stay held, unacknowledged
    service.subscriptions.move_cursor(TOPIC, "s", lambda cursor: cursor.reset_to_offset(1))
    consumer.flow(10)
    again = take(consumer, 7)
    assert [d.offset for d in again] == [1, 2, 5, 6, 7, 8, 9]
    assert consumer.poll() is None  # 3 and 4 were not handed out a second time
    consumer.nack([3])
    redelivered = take(consumer, 1)
    assert [(d.offset, d.redelivery_count) for d in redelivered] == [(3, 1)]
    subscription = consumer.subscription
    assert subscription.statistics().unacked_messages == len(consumer.unacked) == 9


def test_skip_all_withdraws_undelivered_messages_and_releases_held_ones(service: BrokerService) -> None:
    publish(service, 10)
    consumer = service.subscriptions.subscribe(TOPIC, "s", SubscriptionType.SHARED, ConsumerConfig("c"),
                                               initial="earliest")
    consumer.flow(5)
    held = take(consumer, 1)
    assert [d.offset for d in held] == [0]
    service.subscriptions.move_cursor(TOPIC, "s", lambda cursor: cursor.skip_all())
    assert consumer.poll() is None  # offsets 1-4 were withdrawn from the outbox
    assert consumer.permits == 4 and len(consumer.unacked) == 0  # their permits are back, 0 is released
    assert consumer.subscription.statistics().msg_backlog == 0
    publish(service, 1, first=10)
    assert [d.offset for d in take(consumer, 1)] == [10]
    consumer.close()  # a departing consumer gives back nothing the skip acknowledged
    later = service.subscriptions.subscribe(TOPIC, "s", SubscriptionType.SHARED, ConsumerConfig("d"))
    later.flow(10)
    assert [d.offset for d in take(later, 1)] == [10]


def test_moves_without_an_active_subscription_change_the_cursor(service: BrokerService) -> None:
    publish(service, 6)
    topic = service.topics.topic(TOPIC)
    topic.cursors.open("idle", initial="earliest")
    service.subscriptions.move_cursor(TOPIC, "idle", lambda cursor: cursor.skip(4))
    cursor = topic.cursors.get("idle")
    assert cursor is not None and cursor.backlog_messages() == 2 and cursor.mark_delete_offset == 4


def test_nth_unacked_offset_skips_acknowledged_messages(service: BrokerService) -> None:
    publish(service, 10)
    cursor = service.topics.topic(TOPIC).cursors.open("peek", initial="earliest")
    cursor.ack([1, 2, 5]).result(timeout=WAIT_S)
    assert [cursor.nth_unacked_offset(n) for n in range(1, 9)] == [0, 3, 4, 6, 7, 8, 9, None]
    cursor.ack_cumulative(3).result(timeout=WAIT_S)
    assert cursor.nth_unacked_offset(1) == 4 and cursor.nth_unacked_offset(2) == 6


def test_publish_rates_follow_the_injected_clock(service: BrokerService, clock: FakeClock) -> None:
    topic = service.topics.topic(TOPIC)
    publish(service, 10)
    clock.advance(2.0)
    topic.tick()
    messages_per_s, bytes_per_s = topic.publish_rates()
    assert messages_per_s == 5.0
    assert bytes_per_s == topic.ml.statistics().bytes_added / 2.0 > 0
    clock.advance(1.0)
    topic.tick()
    assert topic.publish_rates() == (0.0, 0.0)


def test_a_subscription_with_consumers_is_deleted_only_with_force(service: BrokerService) -> None:
    publish(service, 2)
    consumer = service.subscriptions.subscribe(TOPIC, "s", SubscriptionType.EXCLUSIVE, ConsumerConfig("c"),
                                               initial="earliest")
    told: list[bool] = []
    consumer.listener = lambda: told.append(consumer.closed)
    with pytest.raises(PreconditionFailed):
        service.subscriptions.delete(TOPIC, "s")
    service.subscriptions.delete(TOPIC, "s", force=True)
    assert consumer.closed and told and told[-1]
    assert service.topics.topic(TOPIC).cursors.names() == []


def test_compaction_runs_in_the_background(service: BrokerService) -> None:
    for key, value in (("a", b"1"), ("b", b"2"), ("a", b"3")):
        publish_to(service, TOPIC, [Message(value, key=key)], producer_name="p")
    assert service.compactions.status(TOPIC).status == "NOT_RUN"
    service.compactions.trigger(TOPIC)
    deadline = time.monotonic() + WAIT_S
    while service.compactions.status(TOPIC).status != "SUCCESS" and time.monotonic() < deadline:
        time.sleep(0.01)
    status = service.compactions.status(TOPIC)
    assert status.status == "SUCCESS" and status.messages == 2 and status.horizon_offset == 3


def test_tenant_update_and_not_empty_refusals(service: BrokerService) -> None:
    service.namespaces.create_tenant("acme", {"adminRoles": ["ops"]})
    service.namespaces.update_tenant("acme", {"adminRoles": ["ops", "dev"]})
    assert service.namespaces.tenant_info("acme") == {"adminRoles": ["ops", "dev"], "allowedClusters": ["standalone"]}
    service.namespaces.create_namespace("acme/prod")
    service.topics.topic("acme/prod/t")
    with pytest.raises(NotEmpty) as refused_namespace:
        service.namespaces.delete_namespace("acme/prod")
    with pytest.raises(NotEmpty):
        service.namespaces.delete_tenant("acme")
    assert isinstance(refused_namespace.value, NotAllowed) and refused_namespace.value.http_status == 409
