"""Topics: producer dedup (also after restart), message ids, topic names, and compaction.

Checks: a resent (producerName, sequenceId) is acknowledged but stored once, before and after
a restart, and the producer's last sequence id survives; a store that failed frees the
producer's sequence ids, so the resend is stored (one message or a group) instead of being
refused as a duplicate in flight forever; topic names parse as Pulsar's; the
compacted view holds the latest value per key, drops keyless messages and tombstoned keys, and
is followed by the topic's newer messages.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from broker.compaction import Compactor
from broker.entry_format import Message
from broker.errors import InvalidRequest
from broker.topic import PersistentTopic, PublishResult
from broker.topic_name import TopicName
from storage import StorageIOError
from tests.publishing import publish, publish_each
from tests.unit.broker_stack import Stack, open_stack


def open_topic(stack: Stack, name: str) -> PersistentTopic:
    topic_name = TopicName.parse(name)
    ml, cursors = stack.open(topic_name.managed_ledger_name)
    return PersistentTopic(topic_name, ml, cursors, stack.store, clock=stack.clock)


def test_topic_names_follow_pulsar() -> None:
    short = TopicName.parse("orders")
    assert short.full_name == "persistent://public/default/orders"
    part = TopicName.parse("persistent://acme/prod/orders-partition-3")
    assert part.partition_index == 3 and part.base.local_name == "orders"
    assert part.base.partition(1).full_name == "persistent://acme/prod/orders-partition-1"
    assert part.managed_ledger_name == "acme/prod/persistent/orders-partition-3"
    live = TopicName.parse("non-persistent://a/b/c-partition-1")
    assert live.domain == "non-persistent" and not live.persistent and live.partition_index == 1
    assert live.base.full_name == "non-persistent://a/b/c" and TopicName.parse("t/ns/x").persistent
    for bad in ["", "transient://a/b/c", "a/b", "a/b/c/d", "a b/c/d", "t/ns/top?ic"]:
        with pytest.raises(InvalidRequest):
            TopicName.parse(bad)


def test_duplicates_are_acknowledged_but_stored_once_across_restarts(data_dir: str) -> None:
    stack = open_stack(data_dir)
    topic = open_topic(stack, "t/ns/dedup")
    first = publish(topic, [Message(b"a"), Message(b"b")], producer_name="p1", sequence_id=0).result(timeout=10)
    assert first.offsets == (0, 1) and not first.duplicate
    again = publish(topic, [Message(b"a"), Message(b"b")], producer_name="p1", sequence_id=0).result(timeout=10)
    assert again.duplicate and topic.ml.next_offset == 2
    for seq in range(2, 1500):  # crosses a dedup snapshot (every 1000 entries)
        publish(topic, [Message(f"m{seq}".encode())], producer_name="p1", sequence_id=seq).result(timeout=10)
    assert topic.last_sequence_id("p1") == 1499
    stack.close()
    stack = open_stack(data_dir, stack.clock)
    topic = open_topic(stack, "t/ns/dedup")
    assert topic.last_sequence_id("p1") == 1499
    assert publish(topic, [Message(b"late dup")], producer_name="p1", sequence_id=1200).result(timeout=10).duplicate
    assert publish(topic, [Message(b"other producer")], producer_name="p2", sequence_id=0).result(
        timeout=10).offsets == (1500,)
    assert topic.ml.next_offset == 1501
    stack.close()


def fail_next_add(stack: Stack) -> None:
    """The bookie refuses the next add with an I/O error, once."""
    bookie = stack.ledgers.client.bookie("local")
    real_add_entries = bookie.add_entries

    def refused() -> Future[int]:
        bookie.add_entries = real_add_entries  # type: ignore[method-assign]
        failed: Future[int] = Future()
        failed.set_exception(StorageIOError("injected: the journal write failed"))
        return failed

    bookie.add_entries = lambda *args, **kwargs: refused()  # type: ignore[method-assign]


def test_a_failed_store_frees_the_sequence_ids_for_the_resend(data_dir: str) -> None:
    stack = open_stack(data_dir)
    topic = open_topic(stack, "t/ns/resend")
    publish(topic, [Message(b"a")], producer_name="p", sequence_id=0).result(timeout=10)
    fail_next_add(stack)
    with pytest.raises(StorageIOError):
        publish(topic, [Message(b"b")], producer_name="p", sequence_id=1).result(timeout=10)
    resent = publish(topic, [Message(b"b")], producer_name="p", sequence_id=1).result(timeout=10)
    assert not resent.duplicate and resent.offsets == (1,)
    fail_next_add(stack)
    with pytest.raises(StorageIOError):
        publish_each(topic, [Message(b"c"), Message(b"d")], producer_name="p", sequence_ids=[2, 3]).result(timeout=10)
    again = publish_each(topic, [Message(b"c"), Message(b"d")], producer_name="p", sequence_ids=[2, 3]).result(
        timeout=10)
    assert [r.offsets for r in again if isinstance(r, PublishResult)] == [(2,), (3,)]
    assert topic.last_sequence_id("p") == 3 and topic.ml.next_offset == 4
    stack.close()


def test_a_refused_sequence_id_leaves_the_producer_usable(data_dir: str) -> None:
    stack = open_stack(data_dir)
    topic = open_topic(stack, "t/ns/seq")
    publish(topic, [Message(b"a")], producer_name="p", sequence_id=4).result(timeout=10)
    for bad in (2**63, 2**70, -3):
        with pytest.raises(InvalidRequest, match="sequence ids"):  # that entry's refusal, nothing stored
            publish(topic, [Message(b"x")], producer_name="p", sequence_id=bad).result(timeout=10)
    after = publish(topic, [Message(b"b")], producer_name="p").result(timeout=10)
    assert after.offsets == (1,) and topic.last_sequence_id("p") == 5
    stack.close()


def test_message_ids_name_entries_and_batch_indexes(data_dir: str) -> None:
    stack = open_stack(data_dir)
    topic = open_topic(stack, "t/ns/ids-partition-2")
    single = publish(topic, [Message(b"x")], producer_name="p").result(timeout=10)
    batch = publish(topic, [Message(b"y"), Message(b"z")], producer_name="p").result(timeout=10)
    assert single.message_ids[0].batch_index == -1 and single.message_ids[0].partition == 2
    assert [m.batch_index for m in batch.message_ids] == [0, 1]
    assert topic.offset_of(batch.message_ids[1]) == 2
    assert topic.message_id_of_offset(2) == batch.message_ids[1]
    stack.close()


def test_compaction_keeps_the_latest_value_per_key(data_dir: str) -> None:
    stack = open_stack(data_dir)
    topic = open_topic(stack, "t/ns/compact")
    writes = [("k1", b"v1"), ("k2", b"v1"), (None, b"keyless"), ("k1", b"v2"), ("k3", b"v1"), ("k2", b""),
              ("k1", b"v3")]
    for key, value in writes:
        publish(topic, [Message(value, key=key)], producer_name="p").result(timeout=10)
    compactor = Compactor(topic, stack.ledgers, stack.store, stack.clock)
    status = compactor.compact()
    assert status.status == "SUCCESS" and status.horizon_offset == len(writes) and status.messages == 2
    view = compactor.view()
    assert view is not None
    assert [(m.message.key, m.message.payload, m.offset) for m in view.messages_from(0)] == [
        ("k3", b"v1", 4), ("k1", b"v3", 6)]
    assert [m.offset for m in view.messages_from(5)] == [6]
    publish(topic, [Message(b"v2", key="k3")], producer_name="p").result(timeout=10)
    publish(topic, [Message(b"back", key="k2")], producer_name="p").result(timeout=10)
    compactor.compact()
    view = compactor.view()
    assert view is not None
    assert sorted((m.message.key, m.message.payload) for m in view.messages_from(0)) == [
        ("k1", b"v3"), ("k2", b"back"), ("k3", b"v2")]
    stack.close()
