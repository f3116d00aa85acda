"""Dynamic consistency boundaries (the library's ``eventsourcing.dcb``) over a Magnetar topic.

Select it with ``PERSISTENCE_MODULE=consumers.eventsourcing.dcb`` (the same ``MAGNETAR_*``
environment as ``factory.py``); application ``Courses`` keeps its events in topic
``courses-events``.

Role: ``MagnetarDCBRecorder`` stores each DCB event as one message (payload = its data,
properties = its type and its tags as a JSON list); its position is the message's offset + 1.
A read selects, from the messages after a position, those matching any query item (the item's
types, if any, include the event's type; its tags are all among the event's tags). An append
with a condition first reads what follows the condition's position up to the topic's end: a
match is an ``IntegrityError`` and nothing is written; otherwise the events are appended with
``expectedOffset`` = that end, so the broker stores them only if nothing came in between (a 409
means someone did: the new messages are read and checked, ``APPEND_ATTEMPTS_MAX`` times).

Invariants: an append is one request, stored whole or not at all, and never stored when a
message matching its condition precedes it after the condition's position. The check reads
the messages after that position; the broker does not yet index types and tags, so a condition
costs a read of what was appended since the position it names (usually the read it follows).
"""

from __future__ import annotations

import base64
import json
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

from consumers.client import ClientError, HttpError
from consumers.eventsourcing.factory import client_of, topic_of
from consumers.eventsourcing.recorders import MagnetarRecorder, MagnetarTrackingRecorder
from consumers.eventsourcing.records import persistence_error
from consumers.eventsourcing.subscription import MagnetarDCBSubscription

TYPE_PROPERTY = "dcb-type"
TAGS_PROPERTY = "dcb-tags"
APPEND_ATTEMPTS_MAX = 16
"""How often one conditional append reads what others appended meanwhile before it gives up."""
READ_PAGE_MESSAGES = 1000
QUERY_ITEMS_MAX = 100
TAG_BYTES_MAX = 1024
EVENTS_PER_APPEND_MAX = 10_000
OFFSET_MISMATCH_CODE = "offset_mismatch"


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
        _check_query(query)
        if limit is not None and limit <= 0:
            return MagnetarDCBReadResponse([], None)
        found, end = self._scan(query, after or 0, limit)
        if limit is not None:
            return MagnetarDCBReadResponse(found, found[-1].position if found else None)
        return MagnetarDCBReadResponse(found, end or None)

    def append(self, events: Sequence[DCBEvent], condition: DCBAppendCondition | None = None) -> int:
        if not events:
            raise ProgrammingError("an append takes at least one event")
        if len(events) > EVENTS_PER_APPEND_MAX:
            raise DataError(f"an append takes at most {EVENTS_PER_APPEND_MAX} events")
        body: dict[str, Any] = {"messages": [_message(e) for e in events], "payloadEncoding": "base64"}
        self._check_unpartitioned()
        if condition is None:
            return self._post(body)
        _check_query(condition.fail_if_events_match)
        position = condition.after or 0
        for _ in range(APPEND_ATTEMPTS_MAX):
            found, position = self._scan(condition.fail_if_events_match, position, 1)
            if found:
                raise IntegrityError(f"event at position {found[0].position} matches the append's condition")
            try:
                return self._post({**body, "expectedOffset": position})
            except HttpError as exc:
                if exc.code != OFFSET_MISMATCH_CODE:
                    raise persistence_error(exc) from exc
        raise OperationalError(f"append to {self.topic}: the topic kept growing ({APPEND_ATTEMPTS_MAX} attempts)")

    def subscribe(self, query: DCBQuery | None = None, *, after: int | None = None) -> Any:
        _check_query(query)
        return MagnetarDCBSubscription(self, self.client, self.topic, query=query, after=after)

    def _post(self, body: dict[str, Any]) -> int:
        """The position of the last event of one stored request (``HttpError`` for a 409). The
        request carries this thread's producer name and fresh sequence ids (as the recorders'
        inserts do): a resend after a timed-out answer is the broker's duplicate, never stored
        twice; a conditional one is answered with the first attempt's positions, an
        unconditional one with none (an ``OperationalError``: stored, position unknown)."""
        body = {**body, **self._producer.stamp(body["messages"])}
        try:
            results = self.client.request("POST", self._path, json_body=body).json()["messagePublishResults"]
        except HttpError as exc:
            if exc.code == OFFSET_MISMATCH_CODE:
                raise
            raise persistence_error(exc) from exc
        except ClientError as exc:
            raise persistence_error(exc) from exc
        last_offset = results[-1]["offset"]
        if last_offset is None or int(last_offset) < 0:
            raise OperationalError(f"append to {self.topic}: stored by an earlier attempt whose answer was lost; "
                                   "its position is unknown (read the topic to find it)")
        return int(last_offset) + 1

    def _scan(self, query: DCBQuery | None, offset: int, limit: int | None) -> tuple[list[DCBSequencedEvent], int]:
        """The events matching ``query`` from ``offset`` on (at most ``limit``), and the offset
        where the reading stopped (the topic's end when fewer than ``limit`` matched)."""
        found: list[DCBSequencedEvent] = []
        while True:
            messages, next_offset = self._read_range(offset, READ_PAGE_MESSAGES)
            if not messages:
                return found, offset
            for answer in messages:
                event = _sequenced(answer)
                if _matches(query, event.event):
                    found.append(event)
                    if limit is not None and len(found) >= limit:
                        return found, event.position
            offset = next_offset


def _check_query(query: DCBQuery | None) -> None:
    if query is not None and len(query.items) > QUERY_ITEMS_MAX:
        raise DataError(f"a query has at most {QUERY_ITEMS_MAX} items, not {len(query.items)}")


def _message(event: DCBEvent) -> dict[str, Any]:
    for tag in event.tags:
        if len(tag.encode()) > TAG_BYTES_MAX:
            raise DataError(f"tag {tag[:64]!r}... is longer than {TAG_BYTES_MAX} bytes")
    return {"payload": base64.b64encode(event.data).decode("ascii"),
            "properties": {TYPE_PROPERTY: event.type, TAGS_PROPERTY: json.dumps(list(event.tags))}}


def _sequenced(answer: dict[str, Any]) -> DCBSequencedEvent:
    properties = answer["properties"]
    event = DCBEvent(type=properties.get(TYPE_PROPERTY, ""), data=base64.b64decode(answer["payload"]),
                     tags=list(json.loads(properties.get(TAGS_PROPERTY, "[]"))))
    return DCBSequencedEvent(event=event, position=int(answer["offset"]) + 1)


def _matches(query: DCBQuery | None, event: DCBEvent) -> bool:
    if query is None or not query.items:
        return True
    tags = set(event.tags)
    return any((not item.types or event.type in item.types) and tags.issuperset(item.tags) for item in query.items)


class MagnetarDCBFactory(DCBInfrastructureFactory[MagnetarTrackingRecorder]):
    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        self.client = client_of(self.env)

    def dcb_recorder(self) -> DCBRecorder:
        return MagnetarDCBRecorder(self.client, topic_of(self.env, "events"))

    def close(self) -> None:
        self.client.close()
