"""Non-persistent topics without a broker process: what a publish offers, to whom, and what is dropped."""

from __future__ import annotations

from broker.consumer import ConsumerConfig
from broker.entry_builder import entry_of_messages
from broker.entry_format import Message
from broker.non_persistent_topic import LEDGER_ID, NonPersistentTopic
from broker.subscription_type import SubscriptionType
from broker.topic_name import TopicName

OUTBOX_BYTES_MAX = 64 * 1024


def _topic(idle: list[NonPersistentTopic] | None = None) -> NonPersistentTopic:
    return NonPersistentTopic(TopicName.parse("non-persistent://t/ns/np"),
                              on_idle=(idle.append if idle is not None else lambda _: None))


def _publish(topic: NonPersistentTopic, *payloads: bytes, key: str | None = None) -> list[int]:
    entries = [entry_of_messages([Message(p, key=key)]) for p in payloads]
    results = topic.append(entries, producer_name="p").result(timeout=1)
    return [r.position.entry_id for r in results]  # type: ignore[union-attr]


def test_a_message_goes_to_a_consumer_with_permits_and_is_dropped_without() -> None:
    topic = _topic()
    consumer = topic.subscribe("s", SubscriptionType.EXCLUSIVE, ConsumerConfig("c"), outbox_bytes_max=OUTBOX_BYTES_MAX)
    assert _publish(topic, b"no permits") == [0]
    consumer.flow(2)
    assert _publish(topic, b"a", b"b", b"c") == [1, 2, 3]
    runs = consumer.poll_all()
    assert [r.ledger_id for r in runs] == [LEDGER_ID, LEDGER_ID] and [r.entry_id for r in runs] == [1, 2]
    (subscription,) = topic.subscriptions()
    assert subscription.drops.total == 2 and consumer.permits == 0
    assert topic.stats()["subscriptions"]["s"]["msgDropCounter"] == 2


def test_a_full_outbox_drops_rather_than_grows() -> None:
    topic = _topic()
    consumer = topic.subscribe("s", SubscriptionType.EXCLUSIVE, ConsumerConfig("c"), outbox_bytes_max=4096)
    consumer.flow(1000)
    _publish(topic, *[b"x" * 1000 for _ in range(20)])
    assert consumer.outbox_bytes <= 4096 + 1000 + 1024  # at most one entry beyond the bound
    assert len(consumer.poll_all()) + topic.subscriptions()[0].drops.total == 20


def test_shared_spreads_and_the_topic_goes_idle_with_its_last_consumer() -> None:
    idle: list[NonPersistentTopic] = []
    topic = _topic(idle)
    consumers = [topic.subscribe("s", SubscriptionType.SHARED, ConsumerConfig(f"c{i}"),
                                 outbox_bytes_max=OUTBOX_BYTES_MAX) for i in range(2)]
    for consumer in consumers:
        consumer.flow(10)
    _publish(topic, *[b"m" for _ in range(10)])
    assert [len(c.poll_all()) for c in consumers] == [5, 5]
    consumers[0].close()
    assert not idle
    consumers[1].close()
    assert idle == [topic] and topic.subscriptions() == []
