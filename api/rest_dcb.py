"""Dynamic consistency boundaries over HTTP (a Magnetar extension): events read by query, appended on a condition.

Role: the DCB edge (``broker/dcb.py`` holds the rules). A DCB event is a message with a type
and tags in a topic of one partition; its position is its offset + 1.

- ``POST /topics/persistent/{tenant}/{namespace}/{topic}/dcb/read`` with ``{items: [{types,
  tags}], after, limit}``: the events matching any item (all events for no items) at positions
  after ``after`` (default 0), in order, at most ``limit``, as ``{events: [{type, tags, data
  (base64), position}], head, nextAfter}``: ``head`` is the position of the topic's last
  message when the read began (null: none), ``nextAfter`` is where to read on when the answer
  stopped early (the limit, ``DCB_READ_EVENTS_MAX``, the byte budget), null when it reached
  ``head``.
- ``POST /topics/persistent/{tenant}/{namespace}/{topic}/dcb/append`` with ``{events: [{type,
  tags, data (base64)}], condition: {failIfEventsMatch: {items}, after}, producerName,
  sequenceId}``: the events stored as one entry, unless an event matching the condition's
  query follows its ``after`` (409 ``dcb_condition_failed`` with that event's ``position``);
  answers ``{position}``, the last event's. ``producerName`` and ``sequenceId`` make a resend
  after a lost answer safe: it is answered with the first append's position (``duplicate``).

Invariants: a body of the wrong shape, too many query items, types or tags, a type or tag over
its byte bound, too many events: a 400 naming the field, before anything is read or written;
a refused append writes nothing; reads are bounded by ``limit`` (at most
``DCB_READ_EVENTS_MAX``) and the edge's read response budget.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from api.auth import Action, Authorizer, Caller
from api.errors import validation_problems
from api.limits import EdgeLimits
from api.rest_produce import inlined_schema
from broker import (
    DCB_READ_EVENTS_MAX,
    OFFSET_MAX,
    SEQUENCE_ID_MAX,
    BrokerService,
    DcbEvent,
    DcbQueryItem,
    DcbRead,
    InvalidRequest,
    TopicName,
)


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    types: list[str] = []
    tags: list[str] = []


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item] = []


class ReadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item] = []
    after: int = Field(default=0, ge=0, le=OFFSET_MAX)
    limit: int = Field(default=DCB_READ_EVENTS_MAX, ge=1, le=DCB_READ_EVENTS_MAX)


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    tags: list[str] = []
    data: str = ""


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    failIfEventsMatch: Query  # noqa: N815 - the specification's name
    after: int = Field(default=0, ge=0, le=OFFSET_MAX)


class AppendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    events: list[Event]
    condition: Condition | None = None
    producerName: str = "dcb-producer"  # noqa: N815
    sequenceId: int | None = Field(default=None, ge=0, le=SEQUENCE_ID_MAX)  # noqa: N815


M = TypeVar("M", bound=BaseModel)


async def _parsed(request: Request, model: type[M]) -> M:
    body = await request.body()
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidRequest(validation_problems(exc.errors(), body) or "invalid DCB request") from None


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The request body's schema in the operation (the route reads the raw body)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inlined_schema(model)}}}}


def items_of(items: list[Item]) -> list[DcbQueryItem]:
    return [DcbQueryItem(tuple(item.types), tuple(item.tags)) for item in items]


def _events(events: list[Event]) -> list[DcbEvent]:
    out = []
    for index, event in enumerate(events):
        try:
            data = base64.b64decode(event.data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"events[{index}].data is not valid base64", field="events") from None
        out.append(DcbEvent(event.type, data, tuple(event.tags)))
    return out


def append_events(service: BrokerService, name: TopicName, asked: AppendRequest) -> dict[str, Any]:
    """Carry out an append request: ``{position}`` (and ``duplicate`` for a resend)."""
    condition = asked.condition
    result = service.streams.dcb.append(name, _events(asked.events),
                                        None if condition is None else items_of(condition.failIfEventsMatch.items),
                                        0 if condition is None else condition.after, asked.producerName,
                                        asked.sequenceId)
    return {"position": result.position, **({"duplicate": True} if result.duplicate else {})}


def read_json(read: DcbRead) -> dict[str, Any]:
    return {"events": [{"type": e.event.type, "tags": list(e.event.tags),
                        "data": base64.b64encode(e.event.data).decode("ascii"), "position": e.position}
                       for e in read.events],
            "head": read.head, "nextAfter": read.next_after}


def router(service: BrokerService, authorizer: Authorizer, limits: EdgeLimits) -> APIRouter:
    routes = APIRouter(tags=["dynamic consistency boundaries"])

    @routes.post("/topics/persistent/{tenant}/{namespace}/{topic}/dcb/read",
                 summary="Read the events matching a query after a position (DCB)",
                 openapi_extra=_body_schema(ReadRequest))
    async def dcb_read(tenant: str, namespace: str, topic: str, request: Request, caller: Caller) -> dict[str, Any]:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        asked = await _parsed(request, ReadRequest)
        budget = limits.read_response_bytes_max * 3 // 4  # base64 in JSON
        read = await run_in_threadpool(service.streams.dcb.read, name, items_of(asked.items), asked.after,
                                       asked.limit, budget)
        return read_json(read)

    @routes.post("/topics/persistent/{tenant}/{namespace}/{topic}/dcb/append",
                 summary="Append events unless an event matching the condition follows its position (DCB)",
                 openapi_extra=_body_schema(AppendRequest))
    async def dcb_append(tenant: str, namespace: str, topic: str, request: Request, caller: Caller) -> dict[str, Any]:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.PRODUCE, name)
        asked = await _parsed(request, AppendRequest)
        # reads entries and waits for the append: off the event loop
        answer: dict[str, Any] = await run_in_threadpool(append_events, service, name, asked)
        return answer

    return routes
