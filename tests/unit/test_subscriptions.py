"""Subscriptions over a real topic: the four types, flow control, redelivery, DLQ, delays.

Checks: Exclusive refuses a second consumer; Failover switches without loss; Shared spreads
load and redelivers a departed consumer's unacked messages; Key_Shared keeps per-key order over
thousands of keyed messages while consumers join and leave; a consumer without permits gets
nothing and unacked limits pause and resume delivery; negative acks and ack timeouts redeliver
with increasing redelivery counts and the dead-letter topic gets a message exactly once;
delayed messages wait for the (injected) clock; a ``whole_entries`` consumer never gets part of
an entry.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator

import pytest

from broker.consumer import Consumer, ConsumerConfig
from broker.delivery import Delivery
from broker.entry_format import Message
from broker.errors import ConsumerBusy, NotAllowed
from broker.subscription import Subscription
from broker.subscription_type import SubscriptionType
from broker.topic import PersistentTopic
from broker.topic_name import TopicName
from tests.publishing import publish
from tests.unit.broker_stack import Stack, open_stack


@pytest.fixture
def stack(data_dir: str) -> Iterator[Stack]:
    opened = open_stack(data_dir)
    yield opened
    opened.close()


def make_topic(stack: Stack, name: str) -> PersistentTopic:
    topic_name = TopicName.parse(name)
    ml, cursors = stack.open(topic_name.managed_ledger_name)
    return PersistentTopic(topic_name, ml, cursors, stack.store, clock=stack.clock)


def subscribe(stack: Stack, topic: PersistentTopic, sub_type: SubscriptionType, name: str = "sub",
              dead: list[tuple[str, Delivery]] | None = None) -> Subscription:
    cursor = topic.cursors.open(name, initial="earliest")
    sink = dead if dead is not None else []
    return Subscription(topic.name.full_name, topic.partition, cursor, sub_type, clock=stack.clock,
                        dead_letter=lambda target, d, _sub: sink.append((target, d)))


def publish_n(topic: PersistentTopic, count: int, *, key_of: dict[int, str] | None = None) -> None:
    for i in range(count):
        key = key_of.get(i) if key_of else None
        publish(topic, [Message(f"m{i}".encode(), key=key)], producer_name="p").result(timeout=10)


def drain(consumer: Consumer) -> list[Delivery]:
    out = []
    while (run := consumer.poll()) is not None:
        out.extend(run.messages())
    return out


def test_exclusive_refuses_a_second_consumer(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/excl")
    sub = subscribe(stack, topic, SubscriptionType.EXCLUSIVE)
    first = sub.add_consumer(ConsumerConfig("a"))
    with pytest.raises(ConsumerBusy):
        sub.add_consumer(ConsumerConfig("b"))
    publish_n(topic, 5)
    first.flow(10)
    got = drain(first)
    assert [d.offset for d in got] == [0, 1, 2, 3, 4]
    first.ack_cumulative(2)
    assert sub.cursor.mark_delete_offset == 3


def test_failover_switches_without_loss(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/failover")
    sub = subscribe(stack, topic, SubscriptionType.FAILOVER)
    b = sub.add_consumer(ConsumerConfig("b"))
    a = sub.add_consumer(ConsumerConfig("a"))  # sorts first by name: becomes active
    publish_n(topic, 10)
    a.flow(100)
    b.flow(100)
    got_a = drain(a)
    assert [d.offset for d in got_a] == list(range(10)) and drain(b) == []
    a.ack([0, 1, 2])
    a.close()
    got_b = drain(b)
    assert sorted(d.offset for d in got_b) == list(range(3, 10))
    assert all(d.redelivery_count == 1 for d in got_b)


def test_shared_spreads_and_redelivers_a_departed_consumers_messages(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/shared")
    sub = subscribe(stack, topic, SubscriptionType.SHARED)
    consumers = [sub.add_consumer(ConsumerConfig(f"c{i}")) for i in range(3)]
    for consumer in consumers:
        consumer.flow(100)
    publish_n(topic, 30)  # tailing: each publish dispatches round-robin
    got = {c.name: drain(c) for c in consumers}
    assert all(len(v) == 10 for v in got.values())
    with pytest.raises(NotAllowed):
        consumers[0].ack_cumulative(5)
    consumers[0].close()
    redelivered = drain(consumers[1]) + drain(consumers[2])
    assert sorted(d.offset for d in redelivered) == sorted(d.offset for d in got["c0"])
    for consumer in consumers[1:]:
        consumer.ack(list(consumer.unacked))
    assert sub.cursor.backlog_messages() == 0


def test_key_shared_keeps_per_key_order_while_consumers_join_and_leave(stack: Stack) -> None:
    rng = random.Random(7)
    topic = make_topic(stack, "t/ns/keyshared")
    sub = subscribe(stack, topic, SubscriptionType.KEY_SHARED)
    keys = [f"key-{k}" for k in range(60)]
    total = 3000
    key_of = {i: rng.choice(keys) for i in range(total)}
    for start in range(0, total, 50):
        batch = [Message(f"m{i}".encode(), key=key_of[i]) for i in range(start, start + 50)]
        publish(topic, batch, producer_name="p").result(timeout=10)
    live: list[Consumer] = []
    holder: dict[str, Consumer] = {}  # key -> consumer holding an unacked message of it
    last_acked: dict[str, int] = defaultdict(lambda: -1)
    acked: set[int] = set()
    for step in range(400):
        if not live or (rng.random() < 0.05 and len(live) < 5):
            consumer = sub.add_consumer(ConsumerConfig(f"c{step}", receiver_queue_size=20))
            consumer.flow(20)
            live.append(consumer)
        if len(live) > 1 and rng.random() < 0.03:
            leaving = live.pop(rng.randrange(len(live)))
            for key in [k for k, c in holder.items() if c is leaving]:
                del holder[key]
            leaving.close()
        for consumer in list(live):
            for delivery in drain(consumer):
                delivered_key = delivery.message.key
                assert delivered_key is not None
                key = delivered_key
                assert holder.get(key, consumer) is consumer, f"{key} delivered to two consumers at once"
                assert delivery.offset > last_acked[key] or delivery.redelivery_count > 0
                holder[key] = consumer
            if consumer.unacked and rng.random() < 0.8:
                ordered = sorted(consumer.unacked.items())
                take = ordered[: rng.randint(1, len(ordered))]
                for offset, _ in take:  # what a consumer holds unacknowledged is positions: keys by offset
                    acked_key = key_of[offset]
                    assert offset > last_acked[acked_key], f"{acked_key} acked out of order"
                    last_acked[acked_key] = offset
                consumer.ack([o for o, _ in take])
                consumer.flow(len(take))
                acked.update(o for o, _ in take)
                for done_key in {key_of[o] for o, _ in take}:
                    if not any(key_of[o] == done_key for o in consumer.unacked):
                        holder.pop(done_key, None)
        if len(acked) == total:
            break
    for consumer in live:  # finish: everything is delivered and acked exactly in key order
        for _ in range(200):
            drain(consumer)
            if not consumer.unacked:
                break
            pending = sorted(consumer.unacked)
            consumer.ack(pending)
            consumer.flow(len(pending))
            acked.update(pending)
    assert len(acked) == total
    assert sub.cursor.backlog_messages() == 0


def test_flow_control_and_unacked_limits(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/flow")
    sub = subscribe(stack, topic, SubscriptionType.SHARED)
    consumer = sub.add_consumer(ConsumerConfig("c", unacked_messages_max=10))
    publish_n(topic, 40)
    assert drain(consumer) == []  # no permits, nothing
    consumer.flow(1000)
    first = drain(consumer)
    assert len(first) == 10  # paused at the unacked limit
    consumer.ack([d.offset for d in first[:4]])
    assert drain(consumer) == []  # 6 unacked > half of 10: still paused
    consumer.ack([first[4].offset])
    assert len(drain(consumer)) == 5  # resumed at half, up to the limit again
    assert consumer.statistics().unacked_messages == 10


def test_whole_entries_are_never_split_between_deliveries(stack: Stack) -> None:
    """A ``whole_entries`` consumer (the binary protocol's) gets an entry's rest with its first
    message past its permits, also when the entry comes back after its consumer left; a plain
    consumer stops at its permits."""
    topic = make_topic(stack, "t/ns/whole")
    for batch in range(3):
        publish(topic, [Message(f"e{batch}-{i}".encode()) for i in range(4)], producer_name="p").result(timeout=10)
    sub = subscribe(stack, topic, SubscriptionType.SHARED)
    plain = sub.add_consumer(ConsumerConfig("plain"))
    plain.flow(3)
    assert [d.message.payload for d in drain(plain)] == [b"e0-0", b"e0-1", b"e0-2"]
    plain.close()
    whole = sub.add_consumer(ConsumerConfig("whole", whole_entries=True))
    whole.flow(1)
    first = drain(whole)
    assert [d.message.payload for d in first] == [b"e0-0", b"e0-1", b"e0-2", b"e0-3"]
    assert whole.statistics().available_permits == -3  # as Pulsar: the batch counts against the permits
    whole.flow(3)
    assert drain(whole) == []  # back at zero permits
    whole.flow(1)
    assert [d.message.payload for d in drain(whole)] == [f"e1-{i}".encode() for i in range(4)]


def test_a_message_waiting_twice_goes_once_in_a_whole_entry(stack: Stack) -> None:
    """After a reposition, an entry read ahead again while its holder still has it unacknowledged
    waits twice once the holder leaves (read ahead, and taken back): a ``whole_entries``
    consumer gets each of its messages once, and its unacknowledged bytes return to zero."""
    topic = make_topic(stack, "t/ns/twice")
    publish(topic, [Message(b"d0"), Message(b"d1")], producer_name="p").result(timeout=10)  # offsets 0, 1
    publish(topic, [Message(b"e0"), Message(b"e1"), Message(b"e2")], producer_name="p").result(timeout=10)  # 2-4
    sub = subscribe(stack, topic, SubscriptionType.SHARED)
    holder = sub.add_consumer(ConsumerConfig("holder", unacked_messages_max=3))
    holder.flow(2)
    assert [d.offset for d in drain(holder)] == [0, 1]
    holder.ack([0, 1])
    holder.flow(3)
    assert [d.offset for d in drain(holder)] == [2, 3, 4]
    sub.reposition(lambda: sub.cursor.reset_to_offset(0))  # the holder keeps 2-4
    holder.flow(10)  # blocked at its unacked limit, but its permits make dispatch read ahead
    whole = sub.add_consumer(ConsumerConfig("whole", whole_entries=True))
    whole.flow(1)
    first = drain(whole)
    assert [d.offset for d in first] == [0, 1]
    holder.close()  # 2-4 come back for redelivery while they also wait read ahead
    whole.flow(2)
    second = drain(whole)
    assert sorted(d.offset for d in second) == [2, 3, 4]
    whole.ack([d.offset for d in first + second])
    assert len(whole.unacked) == 0 and whole.unacked.bytes == 0


def test_nack_and_ack_timeout_redeliver_then_dead_letter_once(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/nack")
    dead: list[tuple[str, Delivery]] = []
    sub = subscribe(stack, topic, SubscriptionType.SHARED, dead=dead)
    consumer = sub.add_consumer(ConsumerConfig("c", negative_ack_redelivery_delay_ms=1000, ack_timeout_ms=5000,
                                               max_redeliver_count=2))
    publish_n(topic, 2)
    consumer.flow(100)
    first = drain(consumer)
    assert [d.redelivery_count for d in first] == [0, 0]
    consumer.ack([1])
    consumer.nack([0])
    assert drain(consumer) == []  # not before the delay
    stack.clock.advance(1.0)
    sub.dispatch()
    second = drain(consumer)
    assert [(d.offset, d.redelivery_count) for d in second] == [(0, 1)]
    stack.clock.advance(5.0)
    sub.tick()  # ack timeout
    third = drain(consumer)
    assert [(d.offset, d.redelivery_count) for d in third] == [(0, 2)]
    consumer.nack([0])
    stack.clock.advance(1.0)
    sub.dispatch()
    assert drain(consumer) == []
    assert [(target, d.offset) for target, d in dead] == [("persistent://t/ns/nack-sub-DLQ", 0)]
    sub.dispatch()
    assert len(dead) == 1
    assert sub.cursor.backlog_messages() == 0


def test_a_nacked_message_acknowledged_before_its_delay_is_no_longer_counted_as_delayed(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/nack-then-ack")
    sub = subscribe(stack, topic, SubscriptionType.SHARED)
    consumer = sub.add_consumer(ConsumerConfig("c", negative_ack_redelivery_delay_ms=60_000))
    publish_n(topic, 2)
    consumer.flow(10)
    assert [d.offset for d in drain(consumer)] == [0, 1]
    consumer.nack([0, 1])
    assert sub.statistics().delayed_messages == 2  # both wait for their nack delay
    consumer.ack([0])
    assert sub.statistics().delayed_messages == 1
    assert sub.statistics().msg_backlog == 1
    stack.clock.advance(60.0)
    sub.dispatch()
    assert [(d.offset, d.redelivery_count) for d in drain(consumer)] == [(1, 1)]  # the acked one stays acked
    assert sub.statistics().delayed_messages == 0


def test_delayed_messages_wait_for_the_clock(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/delay")
    sub = subscribe(stack, topic, SubscriptionType.SHARED)
    consumer = sub.add_consumer(ConsumerConfig("c"))
    now_ms = int(stack.clock() * 1000)
    publish(topic, [Message(b"later")], producer_name="p", deliver_at_time_ms=now_ms + 30_000).result(timeout=10)
    publish(topic, [Message(b"now")], producer_name="p").result(timeout=10)
    consumer.flow(10)
    assert [d.message.payload for d in drain(consumer)] == [b"now"]
    stack.clock.advance(29.9)
    sub.dispatch()
    assert drain(consumer) == []
    stack.clock.advance(0.2)
    sub.dispatch()
    assert [d.message.payload for d in drain(consumer)] == [b"later"]


def test_withdrawn_pull_leftovers_never_count_as_redeliveries(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/pull")
    sub = subscribe(stack, topic, SubscriptionType.SHARED)
    puller = sub.add_consumer(ConsumerConfig("rest", ack_timeout_ms=1000))
    publish_n(topic, 2)
    puller.flow(10)  # a pull for 10 that finds only 2
    assert [d.offset for d in drain(puller)] == [0, 1]
    publish_n(topic, 1)  # reaches the outbox on a leftover permit, but nobody takes it
    puller.withdraw()  # the pull ended: permits and untaken deliveries go back
    assert puller.permits == 0 and not puller.outbox and set(puller.unacked) == {0, 1}
    publish_n(topic, 2)
    assert drain(puller) == []  # no permits: nothing is dispatched to it any more
    stack.clock.advance(5)
    sub.tick()  # the two handed-out messages time out; the others were never handed out
    puller.flow(10)
    again = {d.offset: d.redelivery_count for d in drain(puller)}
    assert again == {0: 1, 1: 1, 2: 0, 3: 0, 4: 0}


def test_each_consumer_reports_its_own_rates_and_connection(stack: Stack) -> None:
    """Pulsar's ConsumerStats: a consumer's msgRateOut counts from when it was added, so one that
    received everything its subscription sent reports the subscription's rate (it once read 0,
    its first tick taken as the start)."""
    topic = make_topic(stack, "t/ns/rates")
    sub = subscribe(stack, topic, SubscriptionType.SHARED)
    consumer = sub.add_consumer(ConsumerConfig("c", address="/10.0.0.7:41000"))
    publish_n(topic, 6)
    stack.clock.advance(2.0)
    consumer.flow(10)
    assert len(drain(consumer)) == 6
    sub.tick()
    stats = sub.statistics()
    (mine,) = stats.consumers
    assert mine.msg_rate_out == pytest.approx(3.0) == stats.msg_rate_out
    assert mine.msg_throughput_out == pytest.approx(stats.msg_throughput_out) and mine.msg_throughput_out > 0
    assert mine.address == "/10.0.0.7:41000" and mine.connected_since_ms > 0
