"""DCB events in the key index, on a real broker (embedded storage, RocksDB metadata).

A message's derived streams follow from its properties alone, and never name a key's stream;
the rows of a tag after an offset come out of the segments and the tail exactly as a plain
filter of everything would give them, across several checkpoints and many blocks; a condition
whose checked segments a checkpoint replaced before the append is refused as ``DcbIndexMoved``
and writes nothing, and checked again it sees the event the checkpoint moved; a read's byte
budget counts types and tags (in UTF-8 bytes) as well as payloads; a read by type or tag of a topic that keeps no
key index is refused as an append to it is; a read and a condition are bounded in bytes of entries
read as well as in rows.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from broker.dcb import DcbEvent, QueryItem, check_query
from broker.entry_builder import entry_of_messages
from broker.errors import DcbConditionFailed, DcbIndexMoved
from broker.key_index.derived import derived_keys, tag_key, type_key
from broker.key_index.segment import key_bytes
from broker.limits import DCB_TAGS_PER_EVENT_MAX
from broker.message_fields import build_message
from broker.service import BrokerConfig, BrokerService
from broker.topic_name import TopicName
from tests.unit.broker_stack import FakeClock

TOPIC = TopicName.parse("courses")


def started(data_dir: str) -> BrokerService:
    settings = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000)
    service = BrokerService(data_dir, settings, FakeClock())
    service.start()
    return service


def test_derived_streams_follow_from_the_properties_and_never_name_a_key() -> None:
    assert derived_keys({"dcb-type": "Joined", "dcb-tags": '["a", "b"]'}) == {
        type_key("Joined"), tag_key("a"), tag_key("b")}
    assert derived_keys({"other": "x"}) == frozenset()
    assert derived_keys({"dcb-type": "T", "dcb-tags": "not json"}) == {type_key("T")}
    assert derived_keys({"dcb-type": "T", "dcb-tags": '[1]'}) == {type_key("T")}
    too_many = str([f"t{i}" for i in range(DCB_TAGS_PER_EVENT_MAX + 1)]).replace("'", '"')
    assert derived_keys({"dcb-type": "T", "dcb-tags": too_many}) == {type_key("T")}
    for text in ["\u00fft:T", "\udcfft:T", "t:T", "\x00"]:  # no key's bytes start with 0xFF
        assert not key_bytes(text).startswith(b"\xff")
    assert type_key("T").startswith(b"\xff") and tag_key("T").startswith(b"\xff")


def test_a_tags_rows_after_an_offset_come_from_segments_and_tail_as_a_filter_would_give_them(
        data_dir: str) -> None:
    service = started(data_dir)
    rng = random.Random(36)
    try:
        dcb = service.streams.dcb
        tagged: dict[str, list[int]] = {"common": [], "rare": []}
        offset = 0
        for round_ in range(6):
            events = []
            for _ in range(400):
                tags = ["common"] + (["rare"] if rng.random() < 0.05 else [])
                for tag in tags:
                    tagged[tag].append(offset)
                events.append(DcbEvent("E", b"", tuple(tags)))
                offset += 1
            dcb.append(TOPIC, events, None, 0, "p")
            if round_ < 5:
                service.key_index.flush()  # a segment per round; the last round stays in the tail
        keys = service.topics.topic(TOPIC).streams
        assert keys is not None and keys.segments() == 5
        for tag, offsets in tagged.items():
            for start in [0, 1, 399, 400, 1234, 1999, 2000, 2399, 2400]:
                for limit in (1, 7, 3000):
                    rows = keys.rows_from_offset(tag_key(tag), start, limit)
                    assert [r.offset for r in rows] == [o for o in offsets if o >= start][:limit], (tag, start, limit)
        read = dcb.read(TOPIC, [QueryItem(tags=("rare",))], 1000, 10_000, 1 << 30)
        assert [e.position - 1 for e in read.events] == [o for o in tagged["rare"] if o >= 1000]
    finally:
        service.close()


def test_a_condition_whose_segments_moved_before_the_append_is_checked_again(data_dir: str) -> None:
    service = started(data_dir)
    try:
        dcb = service.streams.dcb
        dcb.append(TOPIC, [DcbEvent("Opened", b"")], None, 0, "p")
        topic = service.topics.topic(TOPIC)
        keys = topic.streams
        assert keys is not None
        seat = check_query([QueryItem(types=("SeatBooked",), tags=("seat-1",))])
        condition = dcb._checked(topic, keys, seat, 1)  # nothing booked after position 1 in the segments
        dcb.append(TOPIC, [DcbEvent("SeatBooked", b"ann", ("seat-1",))], None, 0, "p")
        service.key_index.flush()  # ann's row leaves the tail for a segment
        producer = service.topics.producer(TOPIC, "bob")
        try:
            bob = entry_of_messages([build_message(b"bob", None, {"dcb-type": "SeatBooked", "dcb-tags": '["seat-1"]'})])
            with pytest.raises(DcbIndexMoved):
                producer.append([bob], dcb_condition=condition)
        finally:
            producer.close()
        assert topic.ml.confirmed_next_offset() == 2, "a refused append wrote something"
        with pytest.raises(DcbConditionFailed) as refused:
            dcb.append(TOPIC, [DcbEvent("SeatBooked", b"bob", ("seat-1",))], [QueryItem(("SeatBooked",), ("seat-1",))],
                       1, "bob")
        assert refused.value.position == 2
        assert topic.ml.confirmed_next_offset() == 2
    finally:
        service.close()


def test_a_reads_head_never_covers_an_event_whose_rows_it_could_not_see(data_dir: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An event the managed ledger confirmed whose index rows are not confirmed yet: a read by
    its tag does not return it, so its head must stop before it, and a condition after that
    head must refuse a conflicting append (before: the head covered the event, and the
    conflicting append was stored)."""
    from broker.key_index.partition import KeyReservation

    service = started(data_dir)
    try:
        dcb = service.streams.dcb
        dcb.append(TOPIC, [DcbEvent("Opened", b"")], None, 0, "p")
        held: list[tuple[KeyReservation, object]] = []
        confirm = KeyReservation.confirmed
        monkeypatch.setattr(KeyReservation, "confirmed", lambda self, position: held.append((self, position)))
        dcb.append(TOPIC, [DcbEvent("SeatBooked", b"ann", ("seat-1",))], None, 0, "ann")
        monkeypatch.setattr(KeyReservation, "confirmed", confirm)
        assert len(held) == 1, "the test did not hold the index's confirmation it means to"
        seat = [QueryItem(("SeatBooked",), ("seat-1",))]
        read = dcb.read(TOPIC, seat, 0, 100, 1 << 20)
        assert read.events == [] and read.head == 1, read  # ann's position is 2: not covered
        for reservation, position in held:
            confirm(reservation, position)  # type: ignore[arg-type]
        with pytest.raises(DcbConditionFailed):
            dcb.append(TOPIC, [DcbEvent("SeatBooked", b"bob", ("seat-1",))], seat, read.head, "bob")
    finally:
        service.close()


def test_a_tag_utf8_cannot_encode_or_tags_nested_too_deep_break_the_rule_and_are_refused(data_dir: str) -> None:
    """A lone surrogate (JSON's escapes carry one) is no tag: as a property it breaks the rule,
    as an append's tag it is refused with 400 and nothing is written (before: stored, and every
    REST read that returned it failed as it was answered); tags nested past the JSON parser's
    depth break the rule too (before: RecursionError, a 500)."""
    from broker.errors import InvalidRequest

    assert derived_keys({"dcb-type": "T", "dcb-tags": '["\\ud800"]'}) == {type_key("T")}
    assert derived_keys({"dcb-type": "T", "dcb-tags": "[" * 100_000}) == {type_key("T")}
    service = started(data_dir)
    try:
        dcb = service.streams.dcb
        dcb.append(TOPIC, [DcbEvent("Opened", b"")], None, 0, "p")
        with pytest.raises(InvalidRequest):
            dcb.append(TOPIC, [DcbEvent("SeatBooked", b"x", ("\ud800",))], None, 0, "p")
        with pytest.raises(InvalidRequest):
            dcb.read(TOPIC, [QueryItem(("SeatBooked",), ("\ud800",))], 0, 10, 1 << 20)
        assert service.topics.topic(TOPIC).ml.confirmed_next_offset() == 1
    finally:
        service.close()


def test_an_entry_with_more_index_rows_than_one_entry_may_carry_is_refused_not_retried(
        data_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry's rows (keyed messages and DCB tags) past ``KEY_INDEX_ENTRY_ROWS_MAX`` are a
    400, nothing written: such an entry, accepted into an empty tail, could not be replayed
    into a fuller one after a crash (before: accepted, and the topic's load failed on replay
    with key_index_busy). The bound is lowered here to 5 rows."""
    from broker.errors import InvalidRequest
    from broker.key_index import partition

    monkeypatch.setattr(partition, "KEY_INDEX_ENTRY_ROWS_MAX", 5)
    service = started(data_dir)
    try:
        dcb = service.streams.dcb
        dcb.append(TOPIC, [DcbEvent("Opened", b"")], None, 0, "p")
        with pytest.raises(InvalidRequest) as refused:
            dcb.append(TOPIC, [DcbEvent("Many", b"", tuple(f"t{i}" for i in range(8)))], None, 0, "p")
        assert refused.value.retriable is False
        assert service.topics.topic(TOPIC).ml.confirmed_next_offset() == 1
        dcb.append(TOPIC, [DcbEvent("Few", b"", ("a", "b"))], None, 0, "p")  # 3 rows fit
    finally:
        service.close()


def test_a_reads_byte_budget_counts_types_and_tags_not_only_payloads(data_dir: str) -> None:
    """Events with empty payloads and long tags: a read with a budget of one event's tags
    answers one event and says where to go on (before: payloads alone were counted, so every
    event fitted a budget of 1 byte)."""
    service = started(data_dir)
    try:
        dcb = service.streams.dcb
        tags = (*(f"{'t' * 200}-{i}" for i in range(5)), "course")
        for _ in range(3):
            dcb.append(TOPIC, [DcbEvent("Enrolled", b"", tags)], None, 0, "p")
        for query in ([QueryItem(("Enrolled",), ("course",))], []):
            read = dcb.read(TOPIC, query, 0, 100, 1000)
            assert len(read.events) == 1 and read.next_after == 1 and read.head == 3, (query, read)
            assert len(dcb.read(TOPIC, query, 0, 100, 3000).events) == 3
    finally:
        service.close()


def test_a_read_by_type_or_tag_of_a_topic_without_key_index_is_refused_like_an_append(data_dir: str) -> None:
    from broker.errors import InvalidRequest

    service = started(data_dir)
    try:
        dcb = service.streams.dcb
        dcb.append(TOPIC, [DcbEvent("Opened", b"x")], None, 0, "p")
        service.topics.topic(TOPIC).streams = None
        with pytest.raises(InvalidRequest, match="no key index"):
            dcb.read(TOPIC, [QueryItem(("Opened",))], 0, 10, 1 << 20)
        with pytest.raises(InvalidRequest, match="no key index"):
            dcb.append(TOPIC, [DcbEvent("Opened", b"y")], None, 0, "p")
        assert [e.event.data for e in dcb.read(TOPIC, [], 0, 10, 1 << 20).events] == [b"x"]  # every event: a scan
    finally:
        service.close()


def test_a_reads_byte_budget_counts_the_utf8_bytes_of_types_and_tags(data_dir: str) -> None:
    """Each event's tag is 100 characters of two UTF-8 bytes each (its type one byte): a budget
    of 250 bytes answers two events, not three (before: characters were counted, half the
    bytes the answer carries)."""
    service = started(data_dir)
    try:
        dcb = service.streams.dcb
        for _ in range(3):
            dcb.append(TOPIC, [DcbEvent("E", b"", ("é" * 100,))], None, 0, "p")
        for query in ([QueryItem(("E",))], []):
            read = dcb.read(TOPIC, query, 0, 100, 250)
            assert len(read.events) == 2 and read.next_after == 2, (query, read)
    finally:
        service.close()


def test_a_read_and_a_condition_are_bounded_in_bytes_of_entries_read_not_only_in_rows(
        data_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three appends of 50 events each (one entry each) hold one event tagged "rare" and one
    tagged "other": a read by "rare" under a budget of 1 byte of entries reads one entry and
    says where to go on, and going on reads the rest; a condition whose candidates are in more
    bytes of entries than the budget is refused, and writes nothing (before: both were bounded
    only by rows, so one read could read every entry of a topic whose events each sit in an
    entry of many)."""
    import broker.dcb as dcb_module
    from broker.errors import InvalidRequest

    service = started(data_dir)
    try:
        dcb = service.streams.dcb
        for _ in range(3):
            events = [DcbEvent("Filler", b"x" * 100) for _ in range(48)]
            dcb.append(TOPIC, [*events, DcbEvent("Seen", b"r", ("rare",)), DcbEvent("Seen", b"o", ("other",))],
                       None, 0, "p")
        service.key_index.flush()  # the rows leave the tail for a segment: a condition reads their entries
        query = [QueryItem((), ("rare",))]
        assert len(dcb.read(TOPIC, query, 0, 100, 1 << 20).events) == 3
        monkeypatch.setattr(dcb_module, "DCB_READ_ENTRY_BYTES_MAX", 1)
        first = dcb.read(TOPIC, query, 0, 100, 1 << 20)
        assert [e.position for e in first.events] == [49] and first.next_after == 98, first
        rest = dcb.read(TOPIC, query, first.next_after, 100, 1 << 20)
        assert [e.position for e in rest.events] == [99] and rest.next_after == 148, rest
        rest = dcb.read(TOPIC, query, 148, 100, 1 << 20)
        assert [e.position for e in rest.events] == [149] and rest.next_after is None, rest

        both = [QueryItem((), ("rare", "other"))]  # no event has both: every candidate is read, none matches
        with pytest.raises(InvalidRequest, match="bytes of entries"):
            dcb.append(TOPIC, [DcbEvent("Seen", b"n")], both, 0, "p")
        assert dcb.read(TOPIC, [], 0, 1000, 1 << 20).head == 150  # nothing written
        dcb.append(TOPIC, [DcbEvent("Seen", b"m")], both, 100, "p")  # one candidate left: looked at whole, not refused
        assert dcb.read(TOPIC, [], 0, 1000, 1 << 20).head == 151
        monkeypatch.setattr(dcb_module, "DCB_READ_ENTRY_BYTES_MAX", 1 << 20)
        dcb.append(TOPIC, [DcbEvent("Seen", b"n")], both, 0, "p")
        assert dcb.read(TOPIC, [], 0, 1000, 1 << 20).head == 152
    finally:
        service.close()
