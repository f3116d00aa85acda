"""REST produce, Pulsar's PIP-64 shape: ``POST /topics/persistent/{tenant}/{namespace}/{topic}``.

Body ``{producerName, messages: [{payload, key, properties, eventTime, sequenceId, deliverAt,
deliverAfterMs}]}``; response ``{messagePublishResults: [{messageId: "ledger:entry:partition",
errorCode, errorMsg, offset}], schemaVersion}``. Without a schema the payload is a UTF-8 string,
as in Pulsar. Magnetar extensions: ``payloadEncoding: "base64"`` for binary payloads, each
result's ``offset``, ``expectedOffset`` (the offset the first message must get; 409 and nothing
written on a mismatch), ``eventTime`` as ISO-8601 besides epoch milliseconds, and event streams:
``expectedKeyVersions: {key: n | "exists"}`` (each key's stream must be at that version, checked
with the append: 409 ``key_version_mismatch`` with ``currentKeyVersions`` and nothing written)
and each keyed message's ``keyVersion`` in its result. A conditional request that resends the
producer's last stored entry (same ``producerName`` and ``sequenceId``) is answered with that
entry's results, so a client that timed out can retry. What each
field may hold is the broker's rule (``message_of`` and friends in ``broker/message_fields.py``);
a field this request shape does not know is a 400 naming it.

Quotas: a request is one of its partition's producers while it lasts (409 ``producer_busy``
beyond the topic's ``maxProducers``), and waits before storing while the partition is over its
publish rate (``Producer.publish_delay_s``), as a throttled producer waits for its connection to
be read again.

Invariant: one request is one entry, so it is written whole or not at all; when an entry holds
several messages their ids carry a fourth part, the batch index (``ledger:entry:partition:i``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal, Required

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from typing_extensions import TypedDict

from api.auth import Action, Authorizer, caller_of
from api.errors import validation_problems
from api.limits import MESSAGES_PER_REQUEST_MAX
from api.request_route import RequestRoute
from broker import (
    OFFSET_MAX,
    PAYLOAD_ENCODINGS,
    SEQUENCE_ID_MAX,
    TIME_MS_MAX,
    BrokerService,
    InvalidRequest,
    Message,
    PublishResult,
    TopicName,
    build_message,
    deliver_at_ms,
    entry_of_messages,
    entry_result,
    expected_key_versions_of,
    latest_delivery,
    parse_time_ms,
    payload_of,
)

SequenceId = Annotated[int, Field(ge=0, le=SEQUENCE_ID_MAX)]
TimeMs = Annotated[int, Field(ge=0, le=TIME_MS_MAX)]


class RestMessage(TypedDict, total=False):
    """One message of a request (a TypedDict: validated into plain dicts, no model per message);
    Pulsar's fields, and no other (a misplaced field is a 400 naming it)."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    payload: Required[str]
    key: str | None
    properties: dict[str, str]
    eventTime: str | int | None  # Pulsar's field names
    sequenceId: SequenceId | None
    deliverAt: TimeMs | None
    deliverAfterMs: TimeMs | None
    replicationClusters: list[str] | None
    disableReplication: bool | None


class ProduceRequest(BaseModel):
    """Pulsar's ``ProducerMessages`` and Magnetar's extensions (``payloadEncoding``,
    ``expectedOffset``, ``expectedKeyVersions``); any other field is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")
    producerName: str = "rest-producer"  # noqa: N815 - Pulsar's field name
    messages: list[RestMessage] = Field(min_length=1, max_length=MESSAGES_PER_REQUEST_MAX)
    payloadEncoding: str = "utf-8"  # noqa: N815
    expectedOffset: int | None = Field(default=None, ge=0, le=OFFSET_MAX)  # noqa: N815
    expectedKeyVersions: dict[str, StrictInt | Literal["exists"]] | None = None  # noqa: N815
    schemaVersion: int | None = None  # noqa: N815
    keySchema: Any = None  # noqa: N815
    valueSchema: Any = None  # noqa: N815


def messages_of(request: ProduceRequest) -> list[Message]:
    """The request's messages, built by the broker's rules for each field."""
    encoding = request.payloadEncoding
    if encoding not in PAYLOAD_ENCODINGS:
        raise InvalidRequest(f"payloadEncoding must be 'utf-8' or 'base64', not {encoding!r}",
                             field="payloadEncoding")
    out = []
    for index, m in enumerate(request.messages):
        try:
            out.append(build_message(payload_of(m["payload"], encoding), m.get("key"), m.get("properties") or {},
                                     parse_time_ms(m.get("eventTime"), "eventTime"), m.get("sequenceId")))
        except InvalidRequest as exc:
            raise InvalidRequest(f"messages[{index}].{exc}", field=exc.field) from None
    return out


def _deliver_at_ms(request: ProduceRequest, now_ms: int) -> int | None:
    return latest_delivery(deliver_at_ms(m.get("deliverAt"), m.get("deliverAfterMs"), now_ms)
                           for m in request.messages)


async def parse_request(request: Request) -> ProduceRequest:
    """The body, parsed and validated in one pass (pydantic's JSON parser): a 1000-message request
    never becomes 1000 Python dicts first. Invalid bodies are 400 ``invalid_request``."""
    body = await request.body()
    try:
        return ProduceRequest.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidRequest(validation_problems(exc.errors(), body) or "invalid produce request") from None


_RESULTS_EXAMPLE = {"messagePublishResults": [{"messageId": "2:0:-1", "errorCode": 0, "errorMsg": None, "offset": 0,
                                               "keyVersion": 3}], "schemaVersion": 0}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "One result per message, in order", "content": {"application/json": {
        "example": _RESULTS_EXAMPLE}}}}
_DEFINITION_REF = "#/$defs/"


def inlined_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema with each reference to one of its own definitions replaced by the
    definition: the schema sits inline in the operation (the route reads the raw body), where a
    reference into ``$defs`` or ``components`` would point at nothing (ReDoc failed on it)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(_DEFINITION_REF):
                return inline(definitions[ref.removeprefix(_DEFINITION_REF)])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    inlined: dict[str, Any] = inline(schema)
    return inlined


_BODY_SCHEMA = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": inlined_schema(ProduceRequest)}}}}


def _results_response(result: PublishResult, count: int, schema_version: int) -> Response:
    """Pulsar's ``messagePublishResults`` (plus offsets and key versions), written straight as
    JSON text: one small string per message instead of a dict per message for a serializer."""
    if result.duplicate and not result.count:  # deduplicated: acknowledged, stored once before
        items = ['{"messageId":"-1:-1:-1","errorCode":0,"errorMsg":null,"offset":null}'] * count
    else:
        prefix = f"{result.position.ledger_id}:{result.position.entry_id}:{result.partition}"
        first = result.first_offset
        if result.count == 1:
            items = [f'{{"messageId":"{prefix}","errorCode":0,"errorMsg":null,"offset":{first}}}']
        else:  # a batch: Pulsar's batch index as the id's fourth part
            items = [f'{{"messageId":"{prefix}:{i}","errorCode":0,"errorMsg":null,"offset":{first + i}}}'
                     for i in range(result.count)]
        if result.key_versions:  # each keyed message's version in its stream
            items = [item if version is None else f'{item[:-1]},"keyVersion":{version}}}'
                     for item, version in zip(items, result.key_versions, strict=True)]
        if result.duplicate:  # a conditional resend of the producer's last entry: its first results
            items = [f'{item[:-1]},"duplicate":true}}' for item in items]
    body = f'{{"messagePublishResults":[{",".join(items)}],"schemaVersion":{schema_version}}}'
    return Response(body, media_type="application/json")


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(tags=["produce"])

    async def produce(topic: TopicName, request: ProduceRequest) -> Response:
        """Store the request as one entry (the caller's permission is already checked)."""
        messages = messages_of(request)
        first_sequence_id = request.messages[0].get("sequenceId")
        conditional = request.expectedKeyVersions
        expected = None if conditional is None else expected_key_versions_of(conditional)
        target = service.topics.route(topic, messages[0].key)
        producer = service.topics.producer(target, request.producerName)  # ProducerBusy beyond maxProducers
        try:
            delay_s = producer.publish_delay_s()
            if delay_s > 0:  # the partition is over its publish rate: the request waits, as a throttled client does
                await asyncio.sleep(delay_s)
            entry = entry_of_messages(messages, sequence_id=first_sequence_id,
                                      deliver_at_time_ms=_deliver_at_ms(request, int(service.clock() * 1000)))
            result = await asyncio.wrap_future(entry_result(producer.append(
                [entry], expected_offset=request.expectedOffset, expected_key_versions=expected)))
        finally:
            producer.close()
        return _results_response(result, len(messages), request.schemaVersion or 0)

    async def produce_to_topic(tenant: str, namespace: str, topic: str, request: Request) -> Response:
        caller = caller_of(request)  # first: an unauthenticated caller learns nothing of the name's rules
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.PRODUCE, name)
        return await produce(name, await parse_request(request))

    # the route every producer of an unpartitioned topic takes: FastAPI's parameter resolution skipped
    routes.add_api_route("/topics/persistent/{tenant}/{namespace}/{topic}", produce_to_topic, methods=["POST"],
                         summary="Produce messages (PIP-64)", openapi_extra=_BODY_SCHEMA, responses=_RESPONSES,
                         route_class_override=RequestRoute)

    @routes.post("/topics/persistent/{tenant}/{namespace}/{topic}/partitions/{partition}",
                 summary="Produce messages to one partition (PIP-64)", openapi_extra=_BODY_SCHEMA,
                 responses=_RESPONSES)
    async def produce_to_partition(tenant: str, namespace: str, topic: str, partition: int,
                                   request: Request) -> Response:
        caller = caller_of(request)
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.PRODUCE, name)
        target = service.admin.partition_of(name, partition)
        return await produce(target, await parse_request(request))

    return routes
