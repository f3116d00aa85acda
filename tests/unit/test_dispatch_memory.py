"""Dispatch counts bytes: what a subscription reads ahead, what waits in a consumer's outbox, what a
consumer holds unacknowledged, and what the broker-wide reads-in-flight budget admits.

Checks, over a real topic: a consumer whose transport takes nothing gets no more than its
pending bytes (one entry always), whatever its permits, and gets more once its transport took
them; batches of many small messages count a slot per message, not only their bytes; what a
consumer holds unacknowledged, and what waits for redelivery, is positions only, read again
(bytes and key intact) when delivered again; once the last consumer left nothing stays read and
the next reads everything unacknowledged again; a subscription whose read the budget refuses
delivers nothing until another's transport takes its deliveries, then goes on; a reader's read
ahead is counted in the budget until handed out, and given back when it is closed; a reader the
budget refuses reads nothing, leaves one wake-up however often it is asked, and is called back
once the budget admits.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.byte_budget import ByteBudget
from broker.consumer import ConsumerConfig
from broker.delivery import Delivery, EntryRun, decoded_footprint, footprint
from broker.entry_format import Message
from broker.reader import Reader, StartPosition
from broker.subscription import Subscription, SubscriptionLimits
from broker.subscription_type import SubscriptionType
from broker.topic import PersistentTopic
from broker.topic_name import TopicName
from tests.publishing import publish
from tests.unit.broker_stack import Stack, open_stack

KIB = 1024
PENDING_BYTES_MAX = 256 * KIB
LIMITS = SubscriptionLimits(read_bytes_max=PENDING_BYTES_MAX, consumer_pending_bytes_max=PENDING_BYTES_MAX)


@pytest.fixture
def stack(data_dir: str) -> Iterator[Stack]:
    opened = open_stack(data_dir)
    yield opened
    opened.close()


def make_topic(stack: Stack, name: str, entries: int, *, messages: int = 1, payload_bytes: int = 64 * KIB,
               key: str | None = None) -> PersistentTopic:
    topic_name = TopicName.parse(name)
    ml, cursors = stack.open(topic_name.managed_ledger_name)
    topic = PersistentTopic(topic_name, ml, cursors, stack.store, clock=stack.clock)
    for index in range(entries):
        batch = [Message(bytes([index % 256]) * payload_bytes, key=key) for _ in range(messages)]
        publish(topic, batch, producer_name="p").result(timeout=10)
    return topic


def subscribe(stack: Stack, topic: PersistentTopic, name: str = "sub", *, budget: ByteBudget | None = None,
              sub_type: SubscriptionType = SubscriptionType.EXCLUSIVE) -> Subscription:
    cursor = topic.cursors.open(name, initial="earliest")
    return Subscription(topic.name.full_name, topic.partition, cursor, sub_type, clock=stack.clock,
                        limits=LIMITS, budget=budget)


def messages_of(runs: list[EntryRun]) -> list[Delivery]:
    """The messages of runs a transport took, as an edge that needs messages splits them."""
    return [delivery for run in runs for delivery in run.messages()]


def test_a_consumer_whose_transport_takes_nothing_holds_its_pending_bytes_whatever_its_permits(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/idle", entries=40)
    budget = ByteBudget(1 << 40)
    sub = subscribe(stack, topic, budget=budget)
    consumer = sub.add_consumer(ConsumerConfig("c", unacked_bytes_max=1 << 40))
    consumer.flow(1_000_000)
    one_entry = footprint(1, 1, 64 * KIB)
    assert 0 < consumer.outbox_bytes <= PENDING_BYTES_MAX + one_entry
    sent_first = consumer.msg_out
    assert sent_first < 10
    assert budget.statistics().peak_bytes <= PENDING_BYTES_MAX + 2 * one_entry  # read ahead + outbox
    taken = consumer.poll_all()  # the transport took them: dispatch goes on
    assert len(taken) == sent_first and consumer.msg_out > sent_first
    assert consumer.outbox_bytes <= PENDING_BYTES_MAX + one_entry


def test_a_batch_of_many_small_messages_counts_their_objects(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/batches", entries=100, messages=100, payload_bytes=10)
    sub = subscribe(stack, topic)
    consumer = sub.add_consumer(ConsumerConfig("c", whole_entries=True))
    consumer.flow(1_000_000)
    per_entry = footprint(1, 100, 100 * 10)  # the slots dominate: 100 x 48 bytes against 1,000 of payload
    assert consumer.outbox_bytes == footprint(consumer.msg_out // 100, consumer.msg_out, consumer.bytes_out)
    assert consumer.msg_out <= (PENDING_BYTES_MAX // per_entry + 1) * 100 < 100 * 100


def test_what_a_consumer_holds_is_positions_read_again_when_delivered_again(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/again", entries=6, messages=3, payload_bytes=1000, key="k")
    sub = subscribe(stack, topic, sub_type=SubscriptionType.SHARED)
    sub.add_consumer(ConsumerConfig("without-permits"))  # stays: what the first leaves waits for redelivery
    first = sub.add_consumer(ConsumerConfig("first", whole_entries=True))
    first.flow(100)
    delivered = messages_of(first.poll_all())
    assert len(delivered) == 18 and len(first.unacked) == 18
    first.close()  # all of it goes back for redelivery
    waiting = list(sub._redelivery.due)
    assert len(waiting) == 18 and all(not any(isinstance(part, bytes) for part in position) for _, position in waiting)
    second = sub.add_consumer(ConsumerConfig("second", whole_entries=True))
    second.flow(100)
    again = messages_of(second.poll_all())
    assert [(d.offset, d.message.payload, d.message.key, d.message_id) for d in again] == \
        [(d.offset, d.message.payload, d.message.key, d.message_id) for d in delivered]
    assert {d.redelivery_count for d in again} == {1}
    second.ack([d.offset for d in again])
    assert sub.cursor.backlog_messages() == 0


def test_a_read_waits_for_the_budget_and_goes_on_once_another_transport_took_its_deliveries(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/budget", entries=20)
    budget = ByteBudget(PENDING_BYTES_MAX)
    holder = subscribe(stack, topic, "holder", budget=budget)
    holding = holder.add_consumer(ConsumerConfig("holding", unacked_bytes_max=1 << 40))
    holding.flow(1_000_000)  # fills its outbox and the budget, takes nothing
    assert not budget.admits()
    waiter = subscribe(stack, topic, "waiter", budget=budget)
    waiting = waiter.add_consumer(ConsumerConfig("waiting", unacked_bytes_max=1 << 40))
    waiting.flow(1_000_000)
    assert waiting.msg_out == 0 and budget.statistics().waiting == 1
    holding.poll_all()  # taken by its transport: the waiting read is woken and goes on
    assert waiting.msg_out > 0
    assert budget.statistics().waits >= 1


def test_a_reader_counts_its_read_ahead_until_handed_out_and_gives_it_back_when_closed(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/reader", entries=10)
    budget = ByteBudget(1 << 40)
    reader = Reader(topic, StartPosition.earliest(), budget=budget, read_bytes_max=PENDING_BYTES_MAX)
    first = reader.read_next()
    assert first is not None and budget.used_bytes >= decoded_footprint(1, 64 * KIB)
    assert budget.used_bytes <= decoded_footprint(PENDING_BYTES_MAX // (64 * KIB) + 1, PENDING_BYTES_MAX + 64 * KIB)
    reader.close()
    assert budget.used_bytes == 0
    drained = Reader(topic, StartPosition.earliest(), budget=budget, read_bytes_max=PENDING_BYTES_MAX)
    while drained.read_next() is not None:
        pass
    assert budget.used_bytes == 0


def test_when_the_last_consumer_leaves_nothing_stays_decoded_and_the_next_reads_it_all_again(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/last", entries=10, payload_bytes=1000)
    budget = ByteBudget(1 << 40)
    sub = subscribe(stack, topic, budget=budget)
    first = sub.add_consumer(ConsumerConfig("first", unacked_bytes_max=1 << 40))
    first.flow(3)  # three delivered, more read ahead
    assert len(messages_of(first.poll_all())) == 3
    first.ack([0])
    first.close()
    assert budget.used_bytes == 0 and not sub._reads.pending and not sub._redelivery.due
    second = sub.add_consumer(ConsumerConfig("second", unacked_bytes_max=1 << 40))
    got = []
    for _ in range(20):
        second.flow(10)
        got += messages_of(second.poll_all())
    assert [d.offset for d in got] == list(range(1, 10))
    assert [d.redelivery_count for d in got[:2]] == [1, 1] and {d.redelivery_count for d in got[2:]} == {0}


def test_a_reader_refused_by_the_budget_reads_nothing_and_is_called_back_once_it_admits(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/refused", entries=3, payload_bytes=1000)
    budget = ByteBudget(PENDING_BYTES_MAX)
    budget.adjust(PENDING_BYTES_MAX)  # held by others
    reader = Reader(topic, StartPosition.earliest(), budget=budget)
    called: list[int] = []
    reader.add_listener(lambda: called.append(1))
    for _ in range(5):  # asked again and again while refused: one wake-up is left, not five
        assert reader.read_next() is None
    assert budget.statistics().waiting == 1
    budget.adjust(-PENDING_BYTES_MAX)
    assert called == [1]
    assert [d.offset for d in iter(reader.read_next, None)] == [0, 1, 2]
