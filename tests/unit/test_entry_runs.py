"""Dispatch hands consumers runs of entries, over a real topic.

Checks: an Exclusive subscription decodes nothing and hands the stored entry itself; the binary
protocol's MESSAGE of a run is the stored entry from its ``0x0e01`` magic on (a lone message in
Pulsar's unbatched form); Shared round-robin cuts an entry at a consumer's permits, each part a
run with the ack set of its messages; Key_Shared splits a batch of several keys between their
consumers, a batch of one key going whole; messages of a run share a redelivery count (a run is
cut where counts differ); a later message of a key never overtakes an earlier one that waits to
be redelivered; a pull takes the head of a run and leaves the rest in the outbox.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import broker.dispatch_reads as dispatch_reads_module
from api.pulsar.consumers import message_of_run
from broker.consumer import Consumer, ConsumerConfig
from broker.delivery import EntryRun
from broker.dispatch_key_shared import key_hash
from broker.entry_format import Message, as_unbatched, decode_entry, decode_messages, delivery_time, split_prefix
from broker.entry_frames import cleared_indexes
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


def subscribe(topic: PersistentTopic, stack: Stack, sub_type: SubscriptionType) -> Subscription:
    cursor = topic.cursors.open("sub", initial="earliest")
    return Subscription(topic.name.full_name, topic.partition, cursor, sub_type, clock=stack.clock)


def batch(topic: PersistentTopic, *keys: str | None) -> None:
    publish(topic, [Message(f"m{i}".encode(), key=key) for i, key in enumerate(keys)], producer_name="p").result(
        timeout=10)


def runs_of(consumer: Consumer) -> list[EntryRun]:
    return consumer.poll_all()


def test_an_exclusive_subscription_hands_the_stored_entry_and_decodes_nothing(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = make_topic(stack, "t/ns/exclusive")
    batch(topic, "a", "b", "c")
    batch(topic, None)
    decoded: list[bytes] = []

    def counted(real: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
        def call(data: bytes) -> Any:
            decoded.append(data)
            return real(data)
        return call

    monkeypatch.setattr(dispatch_reads_module, "decode_messages", counted(decode_messages))
    monkeypatch.setattr(dispatch_reads_module, "delivery_time", counted(delivery_time))
    consumer = subscribe(topic, stack, SubscriptionType.EXCLUSIVE).add_consumer(ConsumerConfig("c"))
    consumer.flow(10)
    runs = runs_of(consumer)
    assert decoded == []
    stored = topic.ml.read_entries(runs[0].message_id(0).position, 2)
    assert [run.data for run in runs] == [entry.data for entry in stored]
    assert [(run.first_offset, run.batch_size, list(run.offsets), run.whole) for run in runs] == \
        [(0, 3, [0, 1, 2], True), (3, 1, [3], True)]
    assert [[d.message.key for d in run.messages()] for run in runs] == [["a", "b", "c"], [None]]
    assert [str(d.message_id) for run in runs for d in run.messages()] == \
        [str(runs[0].message_id(o)) for o in range(3)] + [str(runs[1].message_id(3))]
    assert runs[1].message_id(3).batch_index == -1 and runs[0].message_id(2).batch_index == 2


def test_the_binary_message_of_a_run_is_the_stored_entry(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/frames")
    batch(topic, "a", "b", "c")
    batch(topic, "lone")
    consumer = subscribe(topic, stack, SubscriptionType.EXCLUSIVE).add_consumer(
        ConsumerConfig("c", whole_entries=True, track_ids=False))
    consumer.flow(4)
    batched, lone = runs_of(consumer)
    _header, data = message_of_run(7, batched)
    assert bytes(data) == batched.data[split_prefix(batched.data)[1]:] and batched.ack_set() == ()
    assert bytes(lone.frame_data()) == as_unbatched(lone.data)
    assert decode_entry(bytes(lone.frame_data())).messages[0].key == "lone"


def test_shared_round_robin_cuts_an_entry_at_the_permits_with_ack_sets(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/shared")
    sub = subscribe(topic, stack, SubscriptionType.SHARED)
    first = sub.add_consumer(ConsumerConfig("first"))
    second = sub.add_consumer(ConsumerConfig("second"))
    first.flow(3)
    second.flow(10)
    batch(topic, None, None, None, None, None)
    (head,), (rest,) = runs_of(first), runs_of(second)
    assert (list(head.offsets), list(rest.offsets)) == ([0, 1, 2], [3, 4])
    assert head.data is rest.data and not head.whole
    assert cleared_indexes(head.ack_set(), 5) == [3, 4] and cleared_indexes(rest.ack_set(), 5) == [0, 1, 2]


def test_key_shared_splits_a_batch_of_several_keys_and_keeps_one_of_one_key_whole(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/keys")
    sub = subscribe(topic, stack, SubscriptionType.KEY_SHARED)
    consumers = [sub.add_consumer(ConsumerConfig(f"c{i}")) for i in range(2)]
    keys = [f"k{i}" for i in range(40)]
    assert sub._by_key is not None
    ring = sub._by_key.ring
    owner = {key: ring[next(i for i, p in enumerate(ring) if p[0] >= key_hash(key)) % len(ring)][1] for key in keys}
    mine, theirs = [k for k in keys if owner[k] is consumers[0]][:2], [k for k in keys if owner[k] is consumers[1]][:2]
    for consumer in consumers:
        consumer.flow(100)
    batch(topic, mine[0], theirs[0], mine[1], theirs[1])
    batch(topic, mine[0], mine[0])
    got = {consumer.name: runs_of(consumer) for consumer in consumers}
    assert [list(run.offsets) for run in got["c0"]] == [[0, 2], [4, 5]]
    assert [list(run.offsets) for run in got["c1"]] == [[1, 3]]
    split, whole = got["c0"]
    assert cleared_indexes(split.ack_set(), 4) == [1, 3] and whole.ack_set() == () and whole.whole
    assert [d.message.key for d in split.messages()] == [mine[0], mine[1]]


def test_a_run_holds_one_redelivery_count(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/counts")
    sub = subscribe(topic, stack, SubscriptionType.SHARED)
    consumer = sub.add_consumer(ConsumerConfig("c", negative_ack_redelivery_delay_ms=0))
    consumer.flow(2)
    batch(topic, None, None)
    assert [list(run.offsets) for run in runs_of(consumer)] == [[0, 1]]
    consumer.nack([0])
    consumer.flow(1)
    assert [(list(run.offsets), run.redelivery_count) for run in runs_of(consumer)] == [([0], 1)]
    consumer.nack([0, 1])
    consumer.flow(2)
    assert [(list(run.offsets), run.redelivery_count) for run in runs_of(consumer)] == [([0], 2), ([1], 1)]
    assert consumer.statistics().msg_redeliver_counter == 3


def test_a_later_message_of_a_key_never_overtakes_an_earlier_one_waiting_for_redelivery(stack: Stack) -> None:
    """Its holder left with both; the next consumer's permits end inside the first entry: what is
    left of that entry keeps its place among the redeliveries."""
    topic = make_topic(stack, "t/ns/overtake")
    sub = subscribe(topic, stack, SubscriptionType.KEY_SHARED)
    holder = sub.add_consumer(ConsumerConfig("holder"))
    holder.flow(10)
    batch(topic, "other", "k")  # offsets 0, 1
    batch(topic, "k")  # offset 2
    assert sorted(o for run in runs_of(holder) for o in run.offsets) == [0, 1, 2]
    successor = sub.add_consumer(ConsumerConfig("successor"))
    holder.close()  # all three wait for redelivery; the successor has no permits yet
    order: list[int] = []
    for _ in range(3):
        successor.flow(1)
        order += [o for run in runs_of(successor) for o in run.offsets]
    assert order == [0, 1, 2]


def test_a_pull_takes_the_head_of_a_run_and_leaves_the_rest(stack: Stack) -> None:
    topic = make_topic(stack, "t/ns/pull")
    sub = subscribe(topic, stack, SubscriptionType.SHARED)
    consumer = sub.add_consumer(ConsumerConfig("rest"))
    consumer.flow(4)
    batch(topic, None, None, None, None)
    run = consumer.peek()
    assert run is not None and consumer.outbox_messages == 4
    head = consumer.take_head(run, 3)
    assert head is not None and list(head.offsets) == [0, 1, 2] and consumer.outbox_messages == 1
    assert consumer.take_head(run, 1) is None  # no longer the oldest run: another pull took it
    rest = consumer.poll()
    assert rest is not None and list(rest.offsets) == [3] and consumer.outbox_bytes == 0
    assert [d.message.payload for d in head.messages() + rest.messages()] == [b"m0", b"m1", b"m2", b"m3"]
