"""The key index and event streams, on a real broker (embedded storage, RocksDB metadata and index).

Versions are dense per key and per partition, checked with the append under the offset lock
(all keys of an entry together), withdrawn when an append fails, kept across restarts and
rebuilt from the entries when its checkpoint record is lost; reads go forwards and backwards by version
across ledger rollovers and partitions; retention makes old versions ``DataLost`` without ever
renumbering them; a conditional resend is answered with its first results; a live key reader
sees its key only, in version order. The default retention keeps everything.
"""

from __future__ import annotations

import dataclasses
import os
from typing import NoReturn

import pytest

from broker.bookkeeper.bookie import BookieUnavailable
from broker.entry_format import Message
from broker.errors import DataLost, InvalidRequest, KeyIndexBusy, KeyVersionMismatch, ServiceUnitNotReady
from broker.key_index import partition as key_partition
from broker.key_index.checkpoint import CheckpointStore
from broker.limits import KEY_BYTES_MAX
from broker.metadata.rocksdb import RocksDBMetadataStore
from broker.reader import StartPosition
from broker.service import BrokerConfig, BrokerService
from broker.topic_name import TopicName
from tests.publishing import publish_to
from tests.unit.broker_stack import FakeClock

TOPIC = TopicName.parse("events")
KEEP_NOTHING = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}


def started(data_dir: str, clock: FakeClock | None = None, **config: object) -> BrokerService:
    settings = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000, **config)  # type: ignore[arg-type]
    service = BrokerService(data_dir, settings, clock or FakeClock())
    service.start()
    return service


def append(service: BrokerService, key: str, *payloads: bytes, expected: int | str | None = None,
           topic: TopicName = TOPIC, producer: str = "p", sequence_id: int | None = None) -> tuple[int | None, ...]:
    conditional = None if expected is None else {key: expected}
    result = publish_to(service, topic, [Message(p, key=key) for p in payloads], producer_name=producer,
                             sequence_id=sequence_id, expected_key_versions=conditional)
    return result.key_versions


def stream(service: BrokerService, key: str, start: int | None = None, count: int = 1000, *,
           backward: bool = False, topic: TopicName = TOPIC) -> list[tuple[int, bytes]]:
    read = service.streams.read_stream(topic, key, start, count, 1 << 30, backward=backward)
    return list(zip(read.batch.column("keyVersion").to_pylist(), read.batch.column("value").to_pylist(), strict=True))


def test_each_key_is_numbered_densely_and_results_carry_versions(data_dir: str) -> None:
    service = started(data_dir)
    try:
        result = publish_to(service, TOPIC, [Message(b"a0", key="a"), Message(b"none"), Message(b"b0", key="b"),
                                         Message(b"a1", key="a")], producer_name="p")
        assert result.key_versions == (0, None, 0, 1)
        assert append(service, "a", b"a2", b"a3") == (2, 3)
        assert publish_to(service, TOPIC, [Message(b"keyless")], producer_name="p").key_versions == ()
        assert stream(service, "a") == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"a3")]
        info = service.streams.stream_info(TOPIC, "a")
        assert (info.version, info.first_version, info.first_offset, info.last_offset) == (3, 0, 0, 5)
        assert service.streams.stream_info(TOPIC, "nobody").version == -1
    finally:
        service.close()


def test_a_conditional_append_checks_all_its_keys_and_writes_nothing_on_a_mismatch(data_dir: str) -> None:
    service = started(data_dir)
    try:
        assert append(service, "a", b"a0", expected=-1) == (0,)
        with pytest.raises(KeyVersionMismatch) as refused:
            append(service, "a", b"again", expected=-1)
        assert refused.value.current_key_versions == {"a": 0}
        assert append(service, "a", b"a1", expected="exists") == (1,)
        with pytest.raises(KeyVersionMismatch):
            append(service, "new", b"x", expected="exists")
        next_offset = service.topics.topic(TOPIC).ml.next_offset
        both = [Message(b"a2", key="a"), Message(b"b0", key="b")]
        with pytest.raises(KeyVersionMismatch) as refused:  # a is right, b is wrong: neither is written
            publish_to(service, TOPIC, both, producer_name="p", expected_key_versions={"a": 1, "b": 3})
        assert refused.value.current_key_versions == {"a": 1, "b": -1}
        assert service.topics.topic(TOPIC).ml.next_offset == next_offset
        assert service.streams.stream_info(TOPIC, "b").version == -1
        assert service.streams.stream_info(TOPIC, "a").version == 1
        assert publish_to(service, TOPIC, both, producer_name="p",
                               expected_key_versions={"a": 1, "b": -1}).key_versions == (2, 0)
        assert service.key_index.statistics().version_mismatches == 3
    finally:
        service.close()


def test_versions_survive_a_restart_and_a_lost_index_is_rebuilt_from_the_entries(data_dir: str) -> None:
    service = started(data_dir)
    for round_index in range(12):  # several ledgers (test_min rolls every 5 entries)
        append(service, f"k{round_index % 3}", f"v{round_index}".encode(), expected=round_index // 3 - 1)
    before = {key: stream(service, key) for key in ("k0", "k1", "k2")}
    service.close()
    service = started(data_dir)
    try:
        assert {key: stream(service, key) for key in ("k0", "k1", "k2")} == before
        assert service.key_index.statistics().entries_replayed == 0  # a clean close left nothing to read again
    finally:
        name = service.topics.topic(TOPIC).ml.name
    service.close()
    store = RocksDBMetadataStore(os.path.join(data_dir, "metadata"))
    try:  # the checkpoint record is lost: the segments it named are no longer known
        CheckpointStore(store, name).delete()
    finally:
        store.close()
    service = started(data_dir)
    try:
        assert {key: stream(service, key) for key in ("k0", "k1", "k2")} == before
        assert service.key_index.statistics().entries_replayed == 12
        assert append(service, "k0", b"next", expected=3) == (4,)
    finally:
        service.close()


def test_a_failed_append_gives_its_versions_back(data_dir: str) -> None:
    service = started(data_dir)
    try:
        topic = service.topics.topic(TOPIC)
        keys = topic.streams
        assert keys is not None
        append(service, "k", b"v0")
        failed = keys.reservation_of_keys(["k"])
        assert failed is not None
        failed(topic.ml.next_offset)
        assert failed.versions == [1]
        failed.failed()
        again = keys.reservation_of_keys(["k"])
        assert again is not None
        again(topic.ml.next_offset)
        assert again.versions == [1]
        # the managed ledger gives the same offsets out again (after a failed add): what was
        # reserved there failed, even before its failure is reported
        reused = keys.reservation_of_keys(["k"], {"k": 0})
        assert reused is not None
        reused(topic.ml.next_offset)
        assert reused.versions == [1]
        reused.failed()
        assert append(service, "k", b"v1", expected=0) == (1,)
        assert stream(service, "k") == [(0, b"v0"), (1, b"v1")]
    finally:
        service.close()


def test_reads_go_both_ways_with_limits_across_rollovers_and_partitions(data_dir: str) -> None:
    service = started(data_dir)
    try:
        service.topics.create_partitioned(TopicName.parse("orders"), 3)
        orders = TopicName.parse("orders")
        for version in range(20):
            for key in ("x", "y"):
                append(service, key, f"{key}{version}".encode(), expected=version - 1, topic=orders)
        home = service.streams.stream_partition(orders, "x")
        assert service.topics.topic(home).ml.statistics().ledgers > 3
        assert stream(service, "x", 5, 4, topic=orders) == [(v, f"x{v}".encode()) for v in range(5, 9)]
        assert stream(service, "x", None, 3, backward=True, topic=orders) == [(v, f"x{v}".encode())
                                                                              for v in (19, 18, 17)]
        assert stream(service, "y", 2, 3, backward=True, topic=orders) == [(2, b"y2"), (1, b"y1"), (0, b"y0")]
        read = service.streams.read_stream(orders, "x", 18, 100, 1 << 20)
        assert read.batch.column("keyVersion").to_pylist() == [18, 19] and read.next_version == 20
        assert read.batch.column("partition").to_pylist() == [home.partition_index] * 2
        assert service.streams.read_stream(orders, "x", 25, 10, 1 << 20).batch.num_rows == 0
        assert service.streams.read_stream(orders, "x", 0, 1, 1 << 20, backward=True).next_version == -1
        one = service.streams.read_stream(orders, "x", 0, 100, 1)  # a byte bound still gives one message
        assert one.batch.num_rows == 1 and one.next_version == 1
        offsets = service.streams.read_stream(orders, "y", 0, 100, 1 << 20).batch.column("offset").to_pylist()
        assert offsets == sorted(offsets) and len(set(offsets)) == 20
    finally:
        service.close()


def test_retention_makes_old_versions_data_lost_and_never_renumbers_them(data_dir: str) -> None:
    clock = FakeClock()
    service = started(data_dir, clock)
    try:
        service.namespaces.set_policy("public/default", "retention_policies", KEEP_NOTHING)
        for version in range(15):
            append(service, "k", f"v{version}".encode(), expected=version - 1)
            append(service, "other", b"o")
        service.key_index.flush()
        service.maintenance.run()  # no subscription, no retention: every ledger but the last goes
        ml = service.topics.topic(TOPIC).ml
        assert ml.first_offset > 0
        info = service.streams.stream_info(TOPIC, "k")
        assert info.version == 14 and 0 < info.first_version <= 14
        assert info.first_offset is not None and info.first_offset >= ml.first_offset
        with pytest.raises(DataLost) as lost:
            service.streams.read_stream(TOPIC, "k", 0, 10, 1 << 20)
        assert lost.value.details() == {"firstVersion": info.first_version}
        kept = stream(service, "k")
        assert [v for v, _ in kept] == list(range(info.first_version, 15))
        assert kept[0][1] == f"v{info.first_version}".encode()
        assert service.key_index.statistics().rows_cleaned >= info.first_version
        assert append(service, "k", b"v15", expected=14) == (15,)
    finally:
        service.close()
    service = started(data_dir, clock)
    try:
        assert service.streams.stream_info(TOPIC, "k").version == 15
        assert append(service, "k", b"v16", expected=15) == (16,)
    finally:
        service.close()


def test_a_conditional_resend_is_answered_with_its_first_results(data_dir: str) -> None:
    service = started(data_dir)
    try:
        messages = [Message(b"e0", key="k"), Message(b"e1", key="k")]
        first = publish_to(service, TOPIC, messages, producer_name="writer", sequence_id=7,
                                expected_key_versions={"k": -1})
        again = publish_to(service, TOPIC, messages, producer_name="writer", sequence_id=7,
                                expected_key_versions={"k": -1})
        assert again.duplicate and (again.key_versions, again.offsets, again.message_ids) == \
            (first.key_versions, first.offsets, first.message_ids) == ((0, 1), (0, 1), first.message_ids)
        plain = publish_to(service, TOPIC, messages, producer_name="writer", sequence_id=7)
        assert plain.duplicate and plain.count == 0  # Pulsar's answer without a condition
        assert stream(service, "k") == [(0, b"e0"), (1, b"e1")]
    finally:
        service.close()


def test_a_key_reader_catches_up_then_follows_its_key_only(data_dir: str) -> None:
    service = started(data_dir)
    try:
        for version in range(4):
            append(service, "k", f"k{version}".encode())
            append(service, "other", b"o")
        reader = service.streams.stream_reader(TOPIC, "k", 1)
        woken: list[int] = []
        reader.add_listener(lambda: woken.append(1))
        caught_up = []
        while (delivery := reader.read_next()) is not None:
            caught_up.append((delivery.key_version, delivery.message.payload))
        assert caught_up == [(1, b"k1"), (2, b"k2"), (3, b"k3")]
        assert not reader.has_message_available()
        append(service, "other", b"o")
        assert reader.read_next() is None
        append(service, "k", b"k4")
        assert woken and reader.has_message_available()
        delivery = reader.read_next()
        assert delivery is not None and (delivery.key_version, delivery.message.payload) == (4, b"k4")
        assert delivery.offset == service.streams.stream_info(TOPIC, "k").last_offset
    finally:
        service.close()


def test_the_default_retention_keeps_what_no_subscription_holds(data_dir: str) -> None:
    service = started(data_dir)
    try:
        assert service.namespaces.policies("public/default")["retention_policies"] is None
        for index in range(30):
            append(service, "k", f"v{index}".encode())
        service.key_index.flush()
        service.maintenance.run()
        ml = service.topics.topic(TOPIC).ml
        assert ml.first_offset == 0 and ml.statistics().ledgers > 2
    finally:
        service.close()
    service = started(data_dir, default_retention_time_minutes=0, default_retention_size_mb=0)  # Pulsar's
    try:
        service.topics.topic(TOPIC)
        service.maintenance.run()
        assert service.topics.topic(TOPIC).ml.first_offset == 30  # the restart closed the last ledger: all of it went
        assert service.subscriptions.reader(TOPIC, StartPosition.earliest()).read_next() is None
        assert service.streams.stream_info(TOPIC, "k").version == 29  # the versions were not forgotten
    finally:
        service.close()


def test_keys_are_bounded_and_the_index_pushes_back_when_far_behind(data_dir: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    service = started(data_dir)
    try:
        with pytest.raises(InvalidRequest):
            append(service, "k" * (KEY_BYTES_MAX + 1), b"x")
        assert append(service, "é" * (KEY_BYTES_MAX // 2), b"x") == (0,)
        assert service.topics.topic(TOPIC).ml.next_offset == 1
        monkeypatch.setattr(key_partition, "PENDING_ROWS_MAX", 3)
        with pytest.raises(KeyIndexBusy):
            publish_to(service, TOPIC, [Message(b"x", key=f"k{i}") for i in range(4)], producer_name="p")
        assert service.topics.topic(TOPIC).ml.next_offset == 1
    finally:
        service.close()


def test_a_deleted_topic_leaves_no_versions_to_its_successor(data_dir: str) -> None:
    service = started(data_dir)
    try:
        append(service, "k", b"old", b"older")
        service.topics.delete(TOPIC, force=True)
        assert append(service, "k", b"new") == (0,)
        # a crash between deleting the ledgers and the index leaves the old index behind: unused
        topic = service.topics.topic(TOPIC)
        service.key_index.flush()
        topic.ml.delete()
    finally:
        service.close()
    service = started(data_dir)
    try:
        assert append(service, "k", b"newest") == (0,)
        assert stream(service, "k") == [(0, b"newest")]
    finally:
        service.close()


def test_a_broker_that_lost_the_topic_writes_no_segment_nobody_knows(data_dir: str) -> None:
    service = started(data_dir)
    try:
        append(service, "k", b"v0")
        topic = service.topics.topic(TOPIC)
        keys = topic.streams
        assert keys is not None
        other = CheckpointStore(service.key_index.store, topic.ml.name)  # another broker took the topic over
        found = other.load()
        assert found is not None
        other.save(found)
        ledgers_before = set(service.key_index.store.children("/ledgers"))
        append(service, "k", b"v1")
        assert keys.checkpoint() == 0 and keys.taken_over
        assert set(service.key_index.store.children("/ledgers")) == ledgers_before  # no segment ledger was made
    finally:
        service.close()


def test_a_checkpoint_racing_an_append_covers_the_rows_it_writes(data_dir: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An append confirmed after a checkpoint read the topic's end but before it took the
    confirmed rows: the record's ``indexedTo`` must cover that row, or the next opening numbers
    the entry again (its key's versions would run twice through it)."""
    service = started(data_dir)
    try:
        append(service, "k", b"v0")
        topic = service.topics.topic(TOPIC)
        keys = topic.streams
        assert keys is not None
        read_end = topic.ml.confirmed_next_offset
        racing = [b"v1"]

        def end_then_an_append() -> int:
            end = read_end()
            while racing:  # the append lands between the end read and the rows taken
                append(service, "k", racing.pop())
            return end

        monkeypatch.setattr(topic.ml, "confirmed_next_offset", end_then_an_append)
        assert keys.checkpoint() == 2
        monkeypatch.undo()
        service.topics.unload(lambda name: name == TOPIC, False)  # the next owner opens what the record says
        assert stream(service, "k") == [(0, b"v0"), (1, b"v1")]
        assert append(service, "k", b"v2", expected=1) == (2,)
    finally:
        service.close()


def test_segments_that_cannot_be_read_now_fail_the_opening_rather_than_rebuild_it(
        data_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = started(data_dir)
    for version in range(3):
        append(service, "k", f"v{version}".encode(), expected=version - 1)
    service.close()  # a last checkpoint: the rows are in a segment
    service = started(data_dir)
    try:
        def bookies_away(ledger_id: int) -> NoReturn:
            raise BookieUnavailable(f"no bookie of ledger {ledger_id} answers")

        monkeypatch.setattr(service.key_index, "open_segment", bookies_away)
        with pytest.raises(ServiceUnitNotReady):  # retriable: retention may no longer hold what a rebuild needs
            service.topics.topic(TOPIC)
        monkeypatch.undo()
        assert stream(service, "k") == [(0, b"v0"), (1, b"v1"), (2, b"v2")]
        assert service.key_index.statistics().entries_replayed == 0  # the checkpoint was used, not rebuilt
        assert append(service, "k", b"v3", expected=2) == (3,)
    finally:
        service.close()
