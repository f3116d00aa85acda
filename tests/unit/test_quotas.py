"""Quotas and rate limits (``broker/quotas.py``) on an injected clock: the token bucket, the
producer, consumer, subscription and topic counts, the precedence of topic over namespace over
broker, and publish and dispatch throttling through a real ``BrokerService`` (no sleeping)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest

from broker.consumer import Consumer, ConsumerConfig
from broker.entry_builder import entries_of_messages, entry_of_messages
from broker.entry_format import Message
from broker.errors import ConsumerBusy, InvalidRequest, ProducerBusy, QuotaExceeded
from broker.quotas import (
    DispatchRate,
    PublishRate,
    QuotaDefaults,
    RateLimiter,
    TopicLimits,
    TopicQuotas,
    resolve_limits,
)
from broker.service import BrokerConfig, BrokerService
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName
from tests.unit.broker_stack import FakeClock

WAIT_S = 10.0


def started(data_dir: str, clock: FakeClock, quotas: QuotaDefaults | None = None) -> BrokerService:
    config = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000,
                                 quotas=quotas or QuotaDefaults())
    service = BrokerService(data_dir, config, clock)
    service.start()
    return service


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# --- the token bucket ---------------------------------------------------------------------------
def test_a_bucket_holds_one_period_and_refills_at_the_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(10, 0, 1, clock)
    limiter.consume(10, 0)
    limiter.refill()
    assert limiter.delay_s() == pytest.approx(0.1)  # one message's token comes in 1/10 s
    clock.advance(0.5)
    limiter.refill()
    assert limiter.delay_s() == 0.0
    clock.advance(60)  # idle a minute: still one period's worth, not 600 messages
    limiter.refill()
    limiter.consume(10, 0)
    assert limiter.delay_s() > 0


def test_a_large_consumption_is_repaid_by_a_longer_wait() -> None:
    clock = FakeClock()
    limiter = RateLimiter(0, 1000, 1, clock)  # bytes only
    limiter.consume(1, 5000)  # one message of 5 kB: never split, the tokens go below zero
    assert limiter.delay_s() == pytest.approx(4.001)
    clock.advance(4.0)
    limiter.refill()
    assert 0 < limiter.delay_s() < 0.01


def test_a_clock_going_back_earns_nothing() -> None:
    clock = FakeClock()
    limiter = RateLimiter(5, 0, 1, clock)
    limiter.consume(5, 0)
    clock.advance(-100)
    limiter.refill()
    assert limiter.delay_s() == pytest.approx(0.2)


def test_a_longer_period_allows_its_whole_budget_at_once() -> None:
    clock = FakeClock()
    limiter = RateLimiter(60, 0, 60, clock)  # 60 messages per minute
    limiter.consume(60, 0)
    assert limiter.delay_s() == pytest.approx(1.0)


def test_retuning_keeps_the_tokens_up_to_the_new_capacity() -> None:
    clock = FakeClock()
    quotas = TopicQuotas("t", clock)
    quotas.apply(TopicLimits(publish=PublishRate(100)))
    limiter = quotas.publish
    assert limiter is not None
    quotas.published(95, 0)
    quotas.apply(TopicLimits(publish=PublishRate(10)))
    assert quotas.publish is limiter  # not a fresh, full bucket
    assert quotas.publish_delay_s() == 0.0  # 5 tokens left
    quotas.published(6, 0)
    assert quotas.publish_delay_s() == pytest.approx(0.2)
    quotas.apply(TopicLimits())
    assert quotas.publish is None and quotas.publish_delay_s() == 0.0


# --- counts ---------------------------------------------------------------------------------------
def test_producer_and_consumer_slots_stop_at_the_limit_and_come_back() -> None:
    quotas = TopicQuotas("persistent://public/default/t")
    quotas.apply(TopicLimits(producers_max=2, consumers_max=1))
    quotas.add_producer()
    quotas.add_producer()
    with pytest.raises(ProducerBusy, match="Topic reached max producers limit"):
        quotas.add_producer()
    quotas.remove_producer()
    quotas.add_producer()
    quotas.add_consumer()
    with pytest.raises(ConsumerBusy, match="Topic reached max consumers limit"):
        quotas.add_consumer()
    quotas.apply(TopicLimits())  # 0: unlimited
    quotas.add_consumer()
    assert (quotas.producers, quotas.consumers) == (2, 2)


def test_a_topic_policy_wins_over_its_namespace_which_wins_over_the_broker() -> None:
    defaults = QuotaDefaults(max_producers_per_topic=5, max_consumers_per_topic=6, publish_rate_messages=100,
                             dispatch_rate_bytes=1000)
    namespace = {"max_producers_per_topic": 3, "publishMaxMessageRate": {"publishThrottlingRateInMsg": 50}}
    topic = {"maxProducers": 1, "dispatchRate": {"dispatchThrottlingRateInMsg": 7, "ratePeriodInSecond": 2}}
    limits = resolve_limits(defaults, namespace, topic)
    assert limits.producers_max == 1 and limits.consumers_max == 6 and limits.subscriptions_max == 0
    assert limits.publish == PublishRate(50, -1)
    assert limits.dispatch == DispatchRate(7, -1, 2)
    assert resolve_limits(defaults, {}, {}).dispatch == DispatchRate(-1, 1000)
    assert resolve_limits(defaults, {"max_producers_per_topic": 0}, {}).producers_max == 0  # unlimited, set


def test_policy_values_are_checked_against_their_bounds(data_dir: str) -> None:
    service = started(data_dir, FakeClock())
    try:
        for key, value in (("max_producers_per_topic", -1), ("max_topics_per_namespace", True),
                           ("publishMaxMessageRate", {"publishThrottlingRateInMsg": -2}),
                           ("publishMaxMessageRate", {"messages": 5}),
                           ("topicDispatchRate", {"ratePeriodInSecond": 0}),
                           ("topicDispatchRate", {"relativeToPublishRate": "yes"})):
            with pytest.raises(InvalidRequest):
                service.namespaces.set_policy("public/default", key, value)
        service.namespaces.set_policy("public/default", "publishMaxMessageRate", {"publishThrottlingRateInMsg": 5})
        assert service.namespaces.policies("public/default")["publishMaxMessageRate"] == {
            "publishThrottlingRateInMsg": 5, "publishThrottlingRateInByte": -1}
        service.topics.topic(TopicName.parse("t"))
        with pytest.raises(InvalidRequest):
            service.namespaces.set_topic_policy(TopicName.parse("t"), "maxProducerz", 1)
        with pytest.raises(InvalidRequest):
            service.namespaces.set_topic_policy(TopicName.parse("t"), "maxProducers", -1)
    finally:
        service.close()


# --- through the broker ---------------------------------------------------------------------------
def test_producers_consumers_and_subscriptions_are_counted_per_topic(data_dir: str) -> None:
    service = started(data_dir, FakeClock())
    try:
        name = TopicName.parse("quota")
        service.topics.topic(name)
        service.namespaces.set_topic_policy(name, "maxProducers", 1)
        first = service.topics.producer(name, "a")
        with pytest.raises(ProducerBusy):
            service.topics.producer(name, "b")
        first.close()
        first.close()  # a second close gives nothing back twice
        service.topics.producer(name, "b")
        with pytest.raises(ProducerBusy):
            service.topics.producer(name, "c")

        service.namespaces.set_policy("public/default", "max_consumers_per_topic", 2)
        consumers = [service.subscriptions.subscribe(name, f"s{i}", SubscriptionType.SHARED, ConsumerConfig(f"c{i}"))
                     for i in range(2)]
        with pytest.raises(ConsumerBusy):
            service.subscriptions.subscribe(name, "s0", SubscriptionType.SHARED, ConsumerConfig("c2"))
        consumers[0].close()
        service.subscriptions.subscribe(name, "s0", SubscriptionType.SHARED, ConsumerConfig("c2"))

        service.namespaces.set_topic_policy(name, "maxSubscriptionsPerTopic", 2)
        with pytest.raises(QuotaExceeded, match="maximum number of subscriptions"):
            service.subscriptions.subscribe(name, "s2", SubscriptionType.SHARED, ConsumerConfig("c3"))
        with pytest.raises(QuotaExceeded):
            service.admin.create_subscription(name, "s3", "earliest")
        service.namespaces.set_topic_policy(name, "maxSubscriptionsPerTopic", None)
        service.namespaces.set_policy("public/default", "max_consumers_per_topic", None)
        service.subscriptions.subscribe(name, "s2", SubscriptionType.SHARED, ConsumerConfig("c3"))
    finally:
        service.close()


def test_topics_per_namespace_count_partitions(data_dir: str) -> None:
    service = started(data_dir, FakeClock(), QuotaDefaults(max_topics_per_namespace=4))
    try:
        service.topics.topic(TopicName.parse("one"))
        service.topics.create_partitioned(TopicName.parse("parted"), 2)
        service.topics.topic(TopicName.parse("parted").partition(1))  # a partition was counted with its topic
        with pytest.raises(QuotaExceeded, match="Exceed maximum number of topics in namespace"):
            service.topics.create_partitioned(TopicName.parse("more"), 2)
        service.topics.topic(TopicName.parse("two"))
        with pytest.raises(QuotaExceeded):
            service.topics.topic(TopicName.parse("three"))  # auto-creation
        with pytest.raises(QuotaExceeded):
            service.topics.update_partitioned(TopicName.parse("parted"), 3)
        service.namespaces.set_policy("public/default", "max_topics_per_namespace", 0)  # the namespace: unlimited
        service.topics.topic(TopicName.parse("three"))
    finally:
        service.close()


def test_publishing_over_the_rate_is_stored_and_asks_for_a_pause(data_dir: str) -> None:
    clock = FakeClock()
    service = started(data_dir, clock)
    try:
        name = TopicName.parse("throttled")
        producer = service.topics.producer(name, "p")
        service.namespaces.set_policy("public/default", "publishMaxMessageRate", {"publishThrottlingRateInMsg": 10})
        for _ in range(15):
            producer.append([entry_of_messages([Message(payload=b"x")])]).result(timeout=WAIT_S)  # never refused
        assert producer.publish_delay_s() == pytest.approx(0.6)  # 5 over, and one token: 6 / 10 per s
        clock.advance(0.6)
        assert producer.publish_delay_s() == 0.0
        service.namespaces.set_policy("public/default", "publishMaxMessageRate", None)
        producer.append(entries_of_messages([Message(payload=b"y")] * 100, [None] * 100)).result(timeout=WAIT_S)
        assert producer.publish_delay_s() == 0.0
    finally:
        service.close()


def _received(consumer: Consumer) -> Callable[[], int]:
    got: list[int] = []

    def count() -> int:
        got.extend(o for run in consumer.poll_all() for o in run.offsets)
        return len(got)
    return count


def test_dispatch_over_the_rate_waits_for_the_clock(data_dir: str) -> None:
    clock = FakeClock()
    service = started(data_dir, clock)
    try:
        name = TopicName.parse("dispatched")
        service.namespaces.set_policy("public/default", "topicDispatchRate", {"dispatchThrottlingRateInMsg": 5})
        consumer = service.subscriptions.subscribe(name, "s", SubscriptionType.SHARED, ConsumerConfig("c"),
                                                   initial="earliest")
        producer = service.topics.producer(name, "p")
        producer.append(entries_of_messages([Message(payload=b"m")] * 12, [None] * 12)).result(timeout=WAIT_S)
        received = _received(consumer)
        consumer.flow(100)
        wait_until(lambda: received() == 5)
        time.sleep(0.2)  # more dispatch rounds run meanwhile: the fake clock has not moved
        assert received() == 5
        clock.advance(1.0)
        consumer.subscription.dispatch()
        wait_until(lambda: received() == 10)
        clock.advance(1.0)
        consumer.subscription.dispatch()
        wait_until(lambda: received() == 12)
    finally:
        service.close()


def test_a_dispatch_byte_rate_lets_one_large_message_through_then_waits(data_dir: str) -> None:
    clock = FakeClock()
    service = started(data_dir, clock)
    try:
        name = TopicName.parse("bytes")
        service.topics.topic(name)
        service.namespaces.set_topic_policy(name, "dispatchRate", {"dispatchThrottlingRateInByte": 1000})
        consumer = service.subscriptions.subscribe(name, "s", SubscriptionType.EXCLUSIVE, ConsumerConfig("c"),
                                                   initial="earliest")
        service.topics.producer(name, "p").append(entries_of_messages([Message(payload=b"z" * 3000)] * 2,
                                                                      [None] * 2)).result(timeout=WAIT_S)
        received = _received(consumer)
        consumer.flow(10)
        wait_until(lambda: received() == 1)
        clock.advance(1.0)  # 2000 bytes still owed
        consumer.subscription.dispatch()
        time.sleep(0.1)
        assert received() == 1
        clock.advance(1.1)
        consumer.subscription.dispatch()
        wait_until(lambda: received() == 2)
    finally:
        service.close()
