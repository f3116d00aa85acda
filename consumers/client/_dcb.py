"""Dynamic consistency boundaries, client side: events read by query, appended on a condition.

Role: the calls behind ``dcb_read`` and ``dcb_append`` of both clients (the broker's
``.../dcb/read`` and ``.../dcb/append``, ``api/rest_dcb.py``) and their values. A DCB event has a
type, tags and data; its position is its offset + 1 in a topic of one partition. A query is a
list of items; an event matches an item when its type is one of the item's types (any when
there are none) and it carries all the item's tags.

Invariants: an append is one request, stored whole or not at all; a refused condition raises
``DcbConditionFailed`` with the first matching event's position and nothing was written; a read
follows the broker's ``nextAfter`` until it has ``limit`` events or reached the head it answers.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.client._calls import Call, HttpRequest
from consumers.client.errors import ClientError, HttpError
from consumers.client.types import Topic

READ_EVENTS_MAX = 10_000
"""The broker's bound on the events of one read request (``DCB_READ_EVENTS_MAX``)."""


@dataclass(frozen=True)
class DcbQueryItem:
    types: Sequence[str] = ()
    tags: Sequence[str] = ()


@dataclass(frozen=True)
class DcbEvent:
    type: str
    data: bytes
    tags: Sequence[str] = ()


@dataclass(frozen=True)
class DcbSequencedEvent:
    event: DcbEvent
    position: int


@dataclass(frozen=True)
class DcbReadResult:
    events: list[DcbSequencedEvent] = field(default_factory=list)
    head: int | None = None
    """The position of the topic's last message when the (last request of the) read began."""
    next_after: int | None = None
    """Where to read on (the read stopped at ``limit``); None: the read reached ``head``."""


class DcbConditionFailed(ClientError):
    """A DCB append refused: the event at ``position`` matches its condition. Nothing was written."""

    code = "dcb_condition_failed"

    def __init__(self, message: str, *, position: int) -> None:
        super().__init__(message)
        self.position = position


def dcb_path(topic: str, operation: str) -> str:
    return f"/topics/{Topic.parse(topic).path}/dcb/{operation}"


def items_json(items: Sequence[DcbQueryItem]) -> list[dict[str, list[str]]]:
    return [{"types": list(item.types), "tags": list(item.tags)} for item in items]


def read_body(items: Sequence[DcbQueryItem], after: int, limit: int) -> dict[str, Any]:
    return {"items": items_json(items), "after": after, "limit": min(limit, READ_EVENTS_MAX)}


def read_page(answer: dict[str, Any]) -> DcbReadResult:
    events = [DcbSequencedEvent(DcbEvent(str(e["type"]), base64.b64decode(e["data"]), tuple(e["tags"])),
                                int(e["position"])) for e in answer["events"]]
    return DcbReadResult(events, answer.get("head"), answer.get("nextAfter"))


def append_body(events: Sequence[DcbEvent], condition: Sequence[DcbQueryItem] | None, after: int,
                producer_name: str | None, sequence_id: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"events": [{"type": e.type, "tags": list(e.tags),
                                        "data": base64.b64encode(e.data).decode("ascii")} for e in events]}
    if condition is not None:
        body["condition"] = {"failIfEventsMatch": {"items": items_json(condition)}, "after": after}
    if producer_name is not None:
        body["producerName"] = producer_name
    if sequence_id is not None:
        body["sequenceId"] = sequence_id
    return body


def condition_failed_of(error: HttpError) -> DcbConditionFailed | None:
    """The ``DcbConditionFailed`` a 409 answer stands for (None: another error)."""
    if error.code != DcbConditionFailed.code:
        return None
    return DcbConditionFailed(error.message, position=int(error.details.get("position", 0)))


def read_call(topic: str, items: Sequence[DcbQueryItem], after: int, limit: int | None) -> Call[DcbReadResult]:
    """The events matching any of ``items`` (every event for none) at positions after ``after``,
    in order, at most ``limit`` (None: all, in as many requests as it takes)."""
    found: list[DcbSequencedEvent] = []
    while True:
        wanted = READ_EVENTS_MAX if limit is None else limit - len(found)
        answer = yield HttpRequest("POST", dcb_path(topic, "read"), json_body=read_body(items, after, wanted))
        page = read_page(answer.json())
        found.extend(page.events)
        if page.next_after is None or (limit is not None and len(found) >= limit):
            return DcbReadResult(found, page.head, page.next_after)
        after = page.next_after


def append_call(topic: str, events: Sequence[DcbEvent], condition: Sequence[DcbQueryItem] | None, after: int,
                producer_name: str | None, sequence_id: int | None) -> Call[int | None]:
    """Store ``events`` as one entry unless an event matching ``condition`` follows position
    ``after`` (``DcbConditionFailed``: nothing written); the last event's position (None: a
    resend of an append whose positions the broker no longer has)."""
    body = append_body(events, condition, after, producer_name, sequence_id)
    try:
        answer = yield HttpRequest("POST", dcb_path(topic, "append"), json_body=body)
    except HttpError as exc:
        raise condition_failed_of(exc) or exc from None
    position = answer.json()["position"]
    return None if position is None else int(position)
