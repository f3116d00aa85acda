"""Dynamic consistency boundaries: events with a type and tags, read by query and appended on a condition.

Role: the broker's side of the DCB specification (the ``eventsourcing`` library's ``dcb``
package, UmaDB, EventSourcingDB). A DCB event is a message of a topic of one partition whose
properties name its type (``dcb-type``) and its tags (``dcb-tags``, a JSON list); its
*position* is its offset + 1. A query is a list of items; an event matches an item when its
type is one of the item's types (any, when it names none) and it carries all the item's tags;
it matches the query when it matches any item (every event, for a query of no items).

- :meth:`DcbEvents.read`: the events matching a query after a position, in order, up to a
  limit, with the topic's head and, when the answer stopped early, where to go on;
- :meth:`DcbEvents.append`: events stored as one entry (whole or not at all), on the condition
  that no event matching a query follows a position, checked atomically with the append.

Both go through the key index's derived streams (``broker/key_index/derived.py``): a tag's or a
type's rows after the position, found by bisecting segments (``PartitionKeys.rows_from_offset``),
never by reading the partition. An item's rows come from its rarest tag (or the union of its
types when that is smaller); only the entries those rows name are read, to check the rest of
the item and to answer the events. An item that names nothing matches every event: it reads
the partition from the position on (what was asked is every event) and, as a condition, asks
only whether the partition has grown past the position.

A condition is checked in two steps: before the offset lock against the segments as they stand
(reads of rows and entries, never under a lock), then under it, in ``PartitionKeys._reserve``,
against the tail of rows not yet in a segment (in flight or durable: an append in flight before
this one fails it too). A checkpoint that moved rows from the tail into a segment between the
two is ``DcbIndexMoved``: the condition is checked again, ``DCB_APPEND_ATTEMPTS_MAX`` times.

Invariants: a refused append (``DcbConditionFailed``, 409, with the first matching event's
position; a bound, 400) writes nothing; a read never changes anything and sees only durable
events; every answer is bounded (``DCB_READ_EVENTS_MAX`` events, a byte budget,
``DCB_READ_ROWS_MAX`` index rows examined, ``DCB_READ_ENTRY_BYTES_MAX`` bytes of entries read
to look at them; a condition past either of the last two is refused); every bound of a query or an event is checked
before anything is read or written.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from broker.entry import Entry
from broker.entry_builder import entry_of_messages
from broker.entry_format import decode_entry
from broker.entry_format.model import DecodedMessage
from broker.errors import DcbConditionFailed, DcbIndexMoved, InvalidRequest, MagnetarError
from broker.key_index import PartitionKeys, StreamRow
from broker.key_index.checkpoint import SegmentInfo
from broker.key_index.derived import (
    TAGS_PROPERTY,
    TYPE_PROPERTY,
    DcbCondition,
    DcbItem,
    derived_keys,
    tag_key,
    tags_of,
    type_key,
)
from broker.key_index.segment import Segment
from broker.limits import (
    DCB_APPEND_ATTEMPTS_MAX,
    DCB_EVENTS_PER_APPEND_MAX,
    DCB_INDEX_ROWS_PER_PAGE,
    DCB_ITEM_TERMS_MAX,
    DCB_QUERY_ITEMS_MAX,
    DCB_READ_ENTRY_BYTES_MAX,
    DCB_READ_EVENTS_MAX,
    DCB_READ_ROWS_MAX,
    DCB_TAG_BYTES_MAX,
    DCB_TAGS_PER_EVENT_MAX,
    DCB_TYPE_BYTES_MAX,
)
from broker.message_fields import build_message
from broker.message_id import Position
from broker.topic import PersistentTopic, PublishResult
from broker.topic_name import TopicName
from broker.topic_registry import TopicRegistry

Segments = list[tuple[SegmentInfo, Segment]]


@dataclass(frozen=True)
class QueryItem:
    types: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class DcbEvent:
    type: str
    data: bytes
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class SequencedEvent:
    event: DcbEvent
    position: int


@dataclass(frozen=True)
class DcbRead:
    events: list[SequencedEvent]
    head: int | None
    """The position of the topic's last message when the read began (None: it has none)."""
    next_after: int | None
    """Where to go on when the answer stopped before ``head`` (a limit or a bound): every
    matching event up to this position is in ``events``; None: the read reached ``head``."""


@dataclass(frozen=True)
class AppendResult:
    position: int | None
    """The last event's position (None: a resend of an append whose positions are unknown)."""
    duplicate: bool


def _check_bytes(text: str, bound: int, what: str, field: str) -> None:
    try:
        size = len(text.encode())
    except UnicodeEncodeError:  # a lone surrogate: stored, it could never be answered as UTF-8
        raise InvalidRequest(f"{what} {text[:64]!r} is not valid Unicode text", field=field) from None
    if size > bound:
        raise InvalidRequest(f"{what} {text[:64]!r}... is longer than {bound} bytes", field=field)


def check_query(items: Sequence[QueryItem], field: str = "items") -> list[DcbItem]:
    """The items as derived streams, every bound checked (``InvalidRequest`` naming the field)."""
    if len(items) > DCB_QUERY_ITEMS_MAX:
        raise InvalidRequest(f"a query has at most {DCB_QUERY_ITEMS_MAX} items, not {len(items)}", field=field)
    derived = []
    for index, item in enumerate(items):
        where = f"{field}[{index}]"
        if len(item.types) > DCB_ITEM_TERMS_MAX or len(item.tags) > DCB_ITEM_TERMS_MAX:
            raise InvalidRequest(f"{where} names at most {DCB_ITEM_TERMS_MAX} types and {DCB_ITEM_TERMS_MAX} tags",
                                 field=field)
        for event_type in item.types:
            _check_bytes(event_type, DCB_TYPE_BYTES_MAX, "type", field)
        for tag in item.tags:
            _check_bytes(tag, DCB_TAG_BYTES_MAX, "tag", field)
        derived.append(DcbItem(frozenset(map(type_key, item.types)), frozenset(map(tag_key, item.tags))))
    return derived


def check_events(events: Sequence[DcbEvent]) -> None:
    if not 1 <= len(events) <= DCB_EVENTS_PER_APPEND_MAX:
        raise InvalidRequest(f"an append holds 1..{DCB_EVENTS_PER_APPEND_MAX} events, not {len(events)}",
                             field="events")
    for event in events:
        _check_bytes(event.type, DCB_TYPE_BYTES_MAX, "type", "events")
        if len(event.tags) > DCB_TAGS_PER_EVENT_MAX:
            raise InvalidRequest(f"an event has at most {DCB_TAGS_PER_EVENT_MAX} tags, not {len(event.tags)}",
                                 field="events")
        for tag in event.tags:
            _check_bytes(tag, DCB_TAG_BYTES_MAX, "tag", "events")


def event_of(message: DecodedMessage, offset: int) -> SequencedEvent:
    properties = message.properties
    tags = tags_of(properties.get(TAGS_PROPERTY)) or []
    return SequencedEvent(DcbEvent(properties.get(TYPE_PROPERTY, ""), message.payload, tuple(tags)), offset + 1)


def _event_bytes(event: SequencedEvent) -> int:
    """What an event adds to an answer, for its byte budget: its payload, and its type and tags
    in UTF-8 bytes (counted, never refused here)."""
    e = event.event
    return len(e.data) + sum(len(text.encode("utf-8", "surrogatepass")) for text in (e.type, *e.tags))


class _Entries:
    """The entries a read or a check looks at, each read and decoded once (the last one kept);
    ``read_bytes`` counts what was read, for ``DCB_READ_ENTRY_BYTES_MAX``."""

    def __init__(self, topic: PersistentTopic, keys: PartitionKeys) -> None:
        self.topic = topic
        self.keys = keys
        self.read_bytes = 0
        self._last: tuple[Position, Entry, list[DecodedMessage]] | None = None

    def message(self, row: StreamRow) -> DecodedMessage:
        last = self._last
        if last is None or last[0] != row.position:
            entry = self.topic.ml.read_entry(row.position)
            self.read_bytes += len(entry.data)
            last = self._last = (row.position, entry, decode_entry(entry.data).messages)
            self.keys.count_dcb_entries_read(1)
        return last[2][row.offset - last[1].first_offset]


def _source_keys(keys: PartitionKeys, item: DcbItem) -> list[bytes]:
    """The derived streams an item's candidates come from: its rarest tag's, or its types' when
    they hold fewer rows together (sizes are the streams' head versions)."""
    sizes = {key: _size(keys, key) for key in item.tags | item.types}
    if not item.tags:
        return sorted(item.types)
    rarest = min(item.tags, key=sizes.__getitem__)
    if item.types and sum(sizes[t] for t in item.types) < sizes[rarest]:
        return sorted(item.types)
    return [rarest]


def _size(keys: PartitionKeys, key: bytes) -> int:
    head = keys.head(key)
    return 0 if head is None else head[0] + 1


def _rows(keys: PartitionKeys, key: bytes, offset: int, segments: Segments | None) -> Iterator[StreamRow]:
    while True:
        page = keys.rows_from_offset(key, offset, DCB_INDEX_ROWS_PER_PAGE, segments)
        yield from page
        if len(page) < DCB_INDEX_ROWS_PER_PAGE:
            return
        offset = page[-1].offset + 1


def candidates(keys: PartitionKeys, items: Sequence[DcbItem], offset: int,
               segments: Segments | None = None) -> Iterator[StreamRow]:
    """The rows of the items' source streams at offsets ``>= offset``, merged in offset order,
    each offset once (only segments' rows with ``segments``)."""
    streams = {key for item in items for key in _source_keys(keys, item)}
    merged = heapq.merge(*(_rows(keys, key, offset, segments) for key in sorted(streams)), key=lambda r: r.offset)
    last = -1
    for row in merged:
        if row.offset != last:
            last = row.offset
            yield row


class DcbEvents:
    def __init__(self, topics: TopicRegistry) -> None:
        self._topics = topics

    def _topic(self, name: TopicName, *, create: bool) -> PersistentTopic | None:
        if name.partition_index < 0 and self._topics.partitions(name) > 0:
            raise InvalidRequest(f"{name} is partitioned: DCB events need one total order, a topic of one partition")
        return self._topics.topic(name) if create else self._topics.stored(name)

    # --- reading ----------------------------------------------------------------------------
    def read(self, name: TopicName, items: Sequence[QueryItem], after: int, limit: int, max_bytes: int) -> DcbRead:
        """The events matching ``items`` at positions after ``after``: at most ``limit`` (and
        ``DCB_READ_EVENTS_MAX``), their payloads, types and tags at most ``max_bytes`` (at least
        one event). A query by type or tag of a topic that keeps no key index is
        ``InvalidRequest``, as an append to it is."""
        derived = check_query(items)
        topic = self._topic(name, create=False)
        if topic is None:
            return DcbRead([], None, None)
        end = topic.ml.confirmed_next_offset()
        start = max(after, topic.ml.first_offset)
        limit = min(limit, DCB_READ_EVENTS_MAX)
        if not derived or any(item.matches_all for item in derived):
            return self._scan(topic, start, end, limit, max_bytes)
        if topic.streams is None:  # as an append to it is refused: no index, no answer by type or tag
            raise InvalidRequest(f"{name} keeps no key index: DCB events need one")
        # the head this read reports covers only entries whose index rows it could see: a
        # condition "after the head" must still see an event confirmed but not yet indexed
        end = topic.streams.readable_end(end)
        entries = _Entries(topic, topic.streams)
        found: list[SequencedEvent] = []
        size = 0
        for examined, row in enumerate(candidates(topic.streams, derived, start)):
            if row.offset >= end:
                break
            if (len(found) >= limit or (found and size >= max_bytes) or examined >= DCB_READ_ROWS_MAX
                    or entries.read_bytes >= DCB_READ_ENTRY_BYTES_MAX):
                return DcbRead(found, end or None, row.offset)  # every match before this row is in found
            message = entries.message(row)
            if any(item.matches(derived_keys(message.properties)) for item in derived):
                found.append(event_of(message, row.offset))
                size += _event_bytes(found[-1])
        return DcbRead(found, end or None, None)

    def _scan(self, topic: PersistentTopic, start: int, end: int, limit: int, max_bytes: int) -> DcbRead:
        """Every event from offset ``start`` on (a query matching every event)."""
        found: list[SequencedEvent] = []
        size = 0
        if start >= end:
            return DcbRead(found, end or None, None)
        for entry in topic.entries_from(start):
            for index, message in enumerate(decode_entry(entry.data).messages):
                offset = entry.first_offset + index
                if offset < start:
                    continue
                if offset >= end:
                    return DcbRead(found, end or None, None)
                if len(found) >= limit or (found and size >= max_bytes):
                    return DcbRead(found, end or None, offset)
                found.append(event_of(message, offset))
                size += _event_bytes(found[-1])
        return DcbRead(found, end or None, None)

    # --- appending --------------------------------------------------------------------------
    def append(self, name: TopicName, events: Sequence[DcbEvent], condition: Sequence[QueryItem] | None,
               after: int, producer_name: str, sequence_id: int | None = None) -> AppendResult:
        """Store ``events`` as one entry unless an event matching ``condition`` (None: no
        condition) follows position ``after`` (``DcbConditionFailed``: nothing written). A
        resend of the producer's last append (same ``producer_name`` and ``sequence_id``) is
        answered with its first positions (its condition met by its own events is no refusal)."""
        check_events(events)
        derived = None if condition is None else check_query(condition, "condition.failIfEventsMatch.items")
        if derived == []:  # a query of no items matches every event
            derived = [DcbItem(frozenset(), frozenset())]
        messages = [build_message(e.data, None, {TYPE_PROPERTY: e.type, TAGS_PROPERTY: json.dumps(list(e.tags))})
                    for e in events]
        producer = self._topics.producer(name, producer_name)  # ProducerBusy beyond maxProducers
        try:
            topic = self._topic(name, create=True)
            assert topic is not None
            if topic.streams is None:
                raise InvalidRequest(f"{name} keeps no key index: DCB events need one")
            delay_s = producer.publish_delay_s()
            if delay_s > 0:  # the topic is over its publish rate: the request waits, as a throttled client does
                time.sleep(delay_s)
            highest = None if sequence_id is None else sequence_id + len(events) - 1
            for _ in range(DCB_APPEND_ATTEMPTS_MAX):
                checked = None if derived is None else self._checked_or_resent(topic, derived, after, producer_name,
                                                                               highest)
                entry = entry_of_messages(messages, sequence_id=sequence_id)
                try:
                    stored = producer.append([entry], dcb_condition=checked)
                except DcbIndexMoved:
                    continue
                return _append_result(stored)
            raise DcbIndexMoved(f"the key index of {name} kept moving while the condition was checked; retry")
        finally:
            producer.close()

    def _checked_or_resent(self, topic: PersistentTopic, items: list[DcbItem], after: int, producer_name: str,
                           highest_sequence_id: int | None) -> DcbCondition:
        """The condition checked against the segments; when it fails there but the append
        resends the producer's stored last one (a lost answer), a condition the append never
        checks: the topic answers the duplicate with its first results before any check (and
        were it no duplicate, its unset segments fail the check as ``DcbIndexMoved``)."""
        assert topic.streams is not None
        try:
            return self._checked(topic, topic.streams, items, after)
        except DcbConditionFailed:
            if highest_sequence_id is None or highest_sequence_id > topic.last_sequence_id(producer_name):
                raise
            return DcbCondition(items, after, None)

    def _checked(self, topic: PersistentTopic, keys: PartitionKeys, items: list[DcbItem], after: int) -> DcbCondition:
        """The condition, checked against the segments as they stand (``DcbConditionFailed``
        for a match there), to be checked against the tail under the offset lock."""
        segments = keys.durable_segments()
        indexed = [item for item in items if not item.matches_all]
        if indexed:
            entries = _Entries(topic, keys)
            examined = 0
            one_tag = len(indexed) == 1 and not indexed[0].types and len(indexed[0].tags) == 1  # every row matches
            for row in candidates(keys, indexed, after, segments):
                if row.offset < topic.ml.first_offset:
                    continue  # trimmed by retention: no longer an event of the topic
                examined += 1
                if examined > DCB_READ_ROWS_MAX:
                    raise InvalidRequest(f"the condition's query has more than {DCB_READ_ROWS_MAX} candidate "
                                         "events after its position; name a rarer tag", field="condition")
                if entries.read_bytes >= DCB_READ_ENTRY_BYTES_MAX:  # one more candidate to look at, no budget left
                    raise InvalidRequest(f"the condition's candidate events after its position are in more than "
                                         f"{DCB_READ_ENTRY_BYTES_MAX} bytes of entries; name a rarer tag",
                                         field="condition")
                if one_tag or any(
                        i.matches(derived_keys(entries.message(row).properties)) for i in indexed):
                    raise DcbConditionFailed(f"the event at position {row.offset + 1} of {topic.name} matches the "
                                             f"append's condition (after position {after})", position=row.offset + 1)
        return DcbCondition(items, after, segments)


def _append_result(stored: Future[list[PublishResult | MagnetarError]]) -> AppendResult:
    (outcome,) = stored.result()
    if isinstance(outcome, MagnetarError):
        raise outcome
    if outcome.duplicate and not outcome.count:
        return AppendResult(None, True)
    return AppendResult(outcome.first_offset + outcome.count, outcome.duplicate)
