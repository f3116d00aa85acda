"""REST produce, Pulsar's PIP-64 shape: ``POST /topics/persistent/{tenant}/{namespace}/{topic}``.

Body ``{producerName, messages: [{payload, key, properties, eventTime, sequenceId, deliverAt,
deliverAfterMs}]}``; response ``{messagePublishResults: [{messageId: "ledger:entry:partition",
errorCode, errorMsg, offset}], schemaVersion}``. Without a schema the payload is a UTF-8 string,
as in Pulsar. Magnetar extensions: ``payloadEncoding: "base64"`` for binary payloads, each
result's ``offset``, and ``expectedOffset`` (the offset the first message must get; 409 and
nothing written on a mismatch).

Invariant: one request is one entry, so it is written whole or not at all; when an entry holds
several messages their ids carry a fourth part, the batch index (``ledger:entry:partition:i``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Annotated, Any, Required

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import TypedDict

from api.auth import Action, Authorizer, Caller
from broker.entry_format import Message
from broker.errors import InvalidRequest
from broker.service import BrokerService
from broker.topic import PublishResult
from broker.topic_name import TopicName

MESSAGES_PER_REQUEST_MAX = 10_000
_NO_PROPERTIES: dict[str, str] = {}


def _new_message(fields: tuple[Any, ...]) -> Message:
    """``Message(*fields)`` without the keyword-defaults constructor (all ten fields given)."""
    message: Message = tuple.__new__(Message, fields)
    return message


NonNegative = Annotated[int, Field(ge=0)]


class RestMessage(TypedDict, total=False):
    """One message of a request (a TypedDict: validated into plain dicts, no model per message)."""

    payload: Required[str]
    key: str | None
    properties: dict[str, str]
    eventTime: str | int | None  # Pulsar's field names
    sequenceId: NonNegative | None
    deliverAt: NonNegative | None
    deliverAfterMs: NonNegative | None


class ProduceRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    producerName: str = "rest-producer"  # noqa: N815 - Pulsar's field name
    messages: list[RestMessage] = Field(min_length=1, max_length=MESSAGES_PER_REQUEST_MAX)
    payloadEncoding: str = "utf-8"  # noqa: N815
    expectedOffset: int | None = Field(default=None, ge=0)  # noqa: N815
    schemaVersion: int | None = None  # noqa: N815


def _payload(message: RestMessage, encoding: str, index: int) -> bytes:
    if encoding == "base64":
        try:
            return base64.b64decode(message["payload"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequest(f"messages[{index}].payload is not valid base64") from exc
    if encoding in ("utf-8", "utf8", "string"):
        return message["payload"].encode()
    raise InvalidRequest(f"payloadEncoding must be 'utf-8' or 'base64', not {encoding!r}")


def _event_time_ms(message: RestMessage, index: int) -> int | None:
    raw = message.get("eventTime")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise InvalidRequest(f"messages[{index}].eventTime must be epoch milliseconds") from exc
    if value < 0:
        raise InvalidRequest(f"messages[{index}].eventTime must not be negative")
    return value


def _deliver_at_ms(request: ProduceRequest, now_ms: int) -> int | None:
    """One entry has one delivery time: the latest any of its messages asks for."""
    times: list[int] = []
    for message in request.messages:
        deliver_at, deliver_after = message.get("deliverAt"), message.get("deliverAfterMs")
        if deliver_at is not None:
            times.append(deliver_at)
        elif deliver_after is not None:
            times.append(now_ms + deliver_after)
    return max(times) if times else None


async def parse_request(request: Request) -> ProduceRequest:
    """The body, parsed and validated in one pass (pydantic's JSON parser): a 1000-message request
    never becomes 1000 Python dicts first. Invalid bodies are 400 ``invalid_request``."""
    body = await request.body()
    try:
        return ProduceRequest.model_validate_json(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:10])
        raise InvalidRequest(problems or "invalid produce request") from None


_RESULTS_EXAMPLE = {"messagePublishResults": [{"messageId": "2:0:-1", "errorCode": 0, "errorMsg": None, "offset": 0}],
                    "schemaVersion": 0}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "One result per message, in order", "content": {"application/json": {
        "example": _RESULTS_EXAMPLE}}}}
_BODY_SCHEMA = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": ProduceRequest.model_json_schema(ref_template="#/components/schemas/{model}")}}}}


def _results_response(result: PublishResult, count: int, schema_version: int) -> Response:
    """Pulsar's ``messagePublishResults`` (plus offsets), written straight as JSON text: one
    small string per message instead of a dict per message for a serializer to walk."""
    if result.duplicate:  # deduplicated: acknowledged, stored once before
        items = ['{"messageId":"-1:-1:-1","errorCode":0,"errorMsg":null,"offset":null}'] * count
    else:
        prefix = f"{result.position.ledger_id}:{result.position.entry_id}:{result.partition}"
        first = result.first_offset
        if result.count == 1:
            items = [f'{{"messageId":"{prefix}","errorCode":0,"errorMsg":null,"offset":{first}}}']
        else:  # a batch: Pulsar's batch index as the id's fourth part
            items = [f'{{"messageId":"{prefix}:{i}","errorCode":0,"errorMsg":null,"offset":{first + i}}}'
                     for i in range(result.count)]
    body = f'{{"messagePublishResults":[{",".join(items)}],"schemaVersion":{schema_version}}}'
    return Response(body, media_type="application/json")


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(tags=["produce"])

    async def produce(topic: TopicName, request: ProduceRequest) -> Response:
        """Store the request as one entry (the caller's permission is already checked)."""
        encoding = request.payloadEncoding
        messages = [_new_message((_payload(m, encoding, i), m.get("key"), m.get("properties") or _NO_PROPERTIES,
                                  _event_time_ms(m, i), None, None, False, False, False, False))
                    for i, m in enumerate(request.messages)]
        first_sequence_id = request.messages[0].get("sequenceId")
        result = await asyncio.wrap_future(service.publish_async(
            topic, messages, producer_name=request.producerName, sequence_id=first_sequence_id,
            expected_offset=request.expectedOffset,
            deliver_at_time_ms=_deliver_at_ms(request, int(service.clock() * 1000))))
        return _results_response(result, len(messages), request.schemaVersion or 0)

    @routes.post("/topics/persistent/{tenant}/{namespace}/{topic}", summary="Produce messages (PIP-64)",
                 openapi_extra=_BODY_SCHEMA, responses=_RESPONSES)
    async def produce_to_topic(tenant: str, namespace: str, topic: str, request: Request,
                               caller: Caller) -> Response:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.PRODUCE, name)
        return await produce(name, await parse_request(request))

    @routes.post("/topics/persistent/{tenant}/{namespace}/{topic}/partitions/{partition}",
                 summary="Produce messages to one partition (PIP-64)", openapi_extra=_BODY_SCHEMA,
                 responses=_RESPONSES)
    async def produce_to_partition(tenant: str, namespace: str, topic: str, partition: int,
                                   request: Request, caller: Caller) -> Response:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.PRODUCE, name)
        partitions = service.partitions(name)
        if partition < 0 or partition >= max(partitions, 1):
            raise InvalidRequest(f"{name} has no partition {partition}")
        parsed = await parse_request(request)
        return await produce(name.partition(partition) if partitions else name, parsed)

    return routes
