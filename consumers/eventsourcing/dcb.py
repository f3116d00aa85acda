"""Dynamic consistency boundaries (the library's ``eventsourcing.dcb``) over a Magnetar topic.

Select it with ``PERSISTENCE_MODULE=consumers.eventsourcing.dcb`` (the same ``MAGNETAR_*``
environment as ``factory.py``); application ``Courses`` keeps its events in topic
``courses-events``.

Role: ``MagnetarDCBRecorder`` stores DCB events in the broker's own DCB store (the client's
``dcb_read`` and ``dcb_append``: the broker's ``.../dcb/read`` and ``.../dcb/append``,
``broker/dcb.py``). Each event is one message (payload = its data, properties = its type and
its tags); its position is the message's offset + 1. The broker indexes types and tags in its
key index, so a read by tag, and an append's condition, read that tag's rows and the entries
they name, never the topic. A read selects the events after a position matching any query item
(the item's types, if any, include the event's type; its tags are all among the event's tags).
An append with a condition is one request that the broker stores only if no event matching the
condition's query follows the condition's position, checked atomically with the append (a
refusal is the library's ``IntegrityError``). Subscriptions follow the topic live
(``subscription.py``) and select through ``read``.

Invariants: an append is one request, stored whole or not at all, and never stored when an
event matching its condition follows the condition's position; a request carries this
thread's producer name and fresh sequence ids, so a resend after a lost answer is the broker's
duplicate, never stored twice. Bounds (the broker's: ``QUERY_ITEMS_MAX`` items,
``TAG_BYTES_MAX`` bytes a tag, ``EVENTS_PER_APPEND_MAX`` events) are checked here first, as
``DataError``s, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from eventsourcing.dcb.api import (
    DCBAppendCondition,
    DCBEvent,
    DCBQuery,
    DCBReadResponse,
    DCBRecorder,
    DCBSequencedEvent,
)
from eventsourcing.dcb.persistence import DCBInfrastructureFactory
from eventsourcing.persistence import DataError, IntegrityError, OperationalError, ProgrammingError
from eventsourcing.utils import Environment, EnvType

from consumers.client import ClientError, DcbConditionFailed, DcbEvent, DcbQueryItem, DcbReadResult, HttpError
from consumers.eventsourcing.factory import client_of, topic_of
from consumers.eventsourcing.recorders import NOT_FOUND_CODES, MagnetarRecorder, MagnetarTrackingRecorder
from consumers.eventsourcing.records import persistence_error
from consumers.eventsourcing.subscription import MagnetarDCBSubscription

QUERY_ITEMS_MAX = 32
"""The broker's ``DCB_QUERY_ITEMS_MAX``."""
TAG_BYTES_MAX = 256
"""The broker's ``DCB_TAG_BYTES_MAX``."""
TAGS_PER_EVENT_MAX = 32
"""The broker's ``DCB_TAGS_PER_EVENT_MAX``."""
EVENTS_PER_APPEND_MAX = 1000
"""The broker's ``DCB_EVENTS_PER_APPEND_MAX``."""


class MagnetarDCBReadResponse(DCBReadResponse):
    def __init__(self, events: list[DCBSequencedEvent], head: int | None) -> None:
        self._events: Iterator[DCBSequencedEvent] = iter(events)
        self._head = head

    @property
    def head(self) -> int | None:
        return self._head

    def __next__(self) -> DCBSequencedEvent:
        return next(self._events)


class MagnetarDCBRecorder(MagnetarRecorder, DCBRecorder):
    def read(self, query: DCBQuery | None = None, *, after: int | None = None,
             limit: int | None = None) -> DCBReadResponse:
        items = _items(query)
        if limit is not None and limit <= 0:
            return MagnetarDCBReadResponse([], None)
        self._check_unpartitioned()
        try:
            result = self.client.dcb_read(self.topic, items, after=after or 0, limit=limit)
        except HttpError as exc:
            if exc.status == 404 and exc.code in NOT_FOUND_CODES:
                return MagnetarDCBReadResponse([], None)
            raise persistence_error(exc) from exc
        except ClientError as exc:
            raise persistence_error(exc) from exc
        found = _sequenced(result)
        if limit is not None:
            return MagnetarDCBReadResponse(found, found[-1].position if found else None)
        return MagnetarDCBReadResponse(found, result.head)

    def append(self, events: Sequence[DCBEvent], condition: DCBAppendCondition | None = None) -> int:
        if not events:
            raise ProgrammingError("an append takes at least one event")
        if len(events) > EVENTS_PER_APPEND_MAX:
            raise DataError(f"an append takes at most {EVENTS_PER_APPEND_MAX} events")
        sent = [_event(e) for e in events]
        items = None if condition is None else _items(condition.fail_if_events_match)
        self._check_unpartitioned()
        producer = self._producer
        first, producer.next_sequence_id = producer.next_sequence_id, producer.next_sequence_id + len(sent)
        try:
            position = self.client.dcb_append(self.topic, sent, items, after=(condition.after or 0) if condition else 0,
                                              producer_name=producer.name, sequence_id=first)
        except DcbConditionFailed as exc:
            raise IntegrityError(f"event at position {exc.position} matches the append's condition") from exc
        except ClientError as exc:
            raise persistence_error(exc) from exc
        if position is None:
            raise OperationalError(f"append to {self.topic}: stored by an earlier attempt whose answer was lost; "
                                   "its position is unknown (read the topic to find it)")
        return position

    def subscribe(self, query: DCBQuery | None = None, *, after: int | None = None) -> Any:
        _items(query)
        return MagnetarDCBSubscription(self, self.client, self.topic, query=query, after=after)


def _items(query: DCBQuery | None) -> list[DcbQueryItem]:
    """The query's items for the client (``DataError`` beyond the broker's bounds)."""
    if query is None:
        return []
    if len(query.items) > QUERY_ITEMS_MAX:
        raise DataError(f"a query has at most {QUERY_ITEMS_MAX} items, not {len(query.items)}")
    for item in query.items:
        _check_tags(item.tags)
    return [DcbQueryItem(tuple(item.types), tuple(item.tags)) for item in query.items]


def _check_tags(tags: Sequence[str]) -> None:
    if len(tags) > TAGS_PER_EVENT_MAX:
        raise DataError(f"at most {TAGS_PER_EVENT_MAX} tags, not {len(tags)}")
    for tag in tags:
        if len(tag.encode()) > TAG_BYTES_MAX:
            raise DataError(f"tag {tag[:64]!r}... is longer than {TAG_BYTES_MAX} bytes")


def _event(event: DCBEvent) -> DcbEvent:
    _check_tags(event.tags)
    return DcbEvent(event.type, event.data, tuple(event.tags))


def _sequenced(result: DcbReadResult) -> list[DCBSequencedEvent]:
    return [DCBSequencedEvent(event=DCBEvent(type=e.event.type, data=e.event.data, tags=list(e.event.tags)),
                              position=e.position) for e in result.events]


class MagnetarDCBFactory(DCBInfrastructureFactory[MagnetarTrackingRecorder]):
    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        self.client = client_of(self.env)

    def dcb_recorder(self) -> DCBRecorder:
        return MagnetarDCBRecorder(self.client, topic_of(self.env, "events"))

    def close(self) -> None:
        self.client.close()
