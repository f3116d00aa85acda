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

import base64
import binascii
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.auth import Action, Authorizer, Caller, Principal
from broker.entry_format import Message
from broker.errors import InvalidRequest
from broker.service import BrokerService
from broker.topic_name import TopicName

MESSAGES_PER_REQUEST_MAX = 10_000


class RestMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    payload: str
    key: str | None = None
    properties: dict[str, str] = Field(default_factory=dict)
    eventTime: str | int | None = None  # noqa: N815 - Pulsar's field name
    sequenceId: int | None = Field(default=None, ge=0)  # noqa: N815
    deliverAt: int | None = Field(default=None, ge=0)  # noqa: N815
    deliverAfterMs: int | None = Field(default=None, ge=0)  # noqa: N815


class ProduceRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    producerName: str = "rest-producer"  # noqa: N815
    messages: list[RestMessage] = Field(min_length=1, max_length=MESSAGES_PER_REQUEST_MAX)
    payloadEncoding: str = "utf-8"  # noqa: N815
    expectedOffset: int | None = Field(default=None, ge=0)  # noqa: N815
    schemaVersion: int | None = None  # noqa: N815


def _payload(message: RestMessage, encoding: str, index: int) -> bytes:
    if encoding == "base64":
        try:
            return base64.b64decode(message.payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequest(f"messages[{index}].payload is not valid base64") from exc
    if encoding in ("utf-8", "utf8", "string"):
        return message.payload.encode()
    raise InvalidRequest(f"payloadEncoding must be 'utf-8' or 'base64', not {encoding!r}")


def _event_time_ms(message: RestMessage, index: int) -> int | None:
    if message.eventTime is None:
        return None
    try:
        value = int(message.eventTime)
    except ValueError as exc:
        raise InvalidRequest(f"messages[{index}].eventTime must be epoch milliseconds") from exc
    if value < 0:
        raise InvalidRequest(f"messages[{index}].eventTime must not be negative")
    return value


def _deliver_at_ms(request: ProduceRequest, now_ms: int) -> int | None:
    """One entry has one delivery time: the latest any of its messages asks for."""
    times: list[int] = []
    for message in request.messages:
        if message.deliverAt is not None:
            times.append(message.deliverAt)
        elif message.deliverAfterMs is not None:
            times.append(now_ms + message.deliverAfterMs)
    return max(times) if times else None


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(tags=["produce"])

    def produce(topic: TopicName, request: ProduceRequest, caller: Principal) -> dict[str, Any]:
        authorizer.require(caller, Action.PRODUCE, topic)
        messages = [Message(payload=_payload(m, request.payloadEncoding, i), key=m.key, properties=m.properties,
                            event_time_ms=_event_time_ms(m, i))
                    for i, m in enumerate(request.messages)]
        first_sequence_id = request.messages[0].sequenceId
        result = service.publish(topic, messages, producer_name=request.producerName, sequence_id=first_sequence_id,
                                 expected_offset=request.expectedOffset,
                                 deliver_at_time_ms=_deliver_at_ms(request, int(service.clock() * 1000)))
        if result.duplicate:
            results = [{"messageId": "-1:-1:-1", "errorCode": 0, "errorMsg": None, "offset": None}
                       for _ in messages]
        else:
            results = [{"messageId": mid.to_rest() if mid.batch_index < 0 else f"{mid.to_rest()}:{mid.batch_index}",
                        "errorCode": 0, "errorMsg": None, "offset": offset}
                       for mid, offset in zip(result.message_ids, result.offsets, strict=True)]
        return {"messagePublishResults": results, "schemaVersion": request.schemaVersion or 0}

    @routes.post("/topics/persistent/{tenant}/{namespace}/{topic}", summary="Produce messages (PIP-64)")
    def produce_to_topic(tenant: str, namespace: str, topic: str, request: ProduceRequest,
                         caller: Caller) -> dict[str, Any]:
        return produce(TopicName.of(tenant, namespace, topic), request, caller)

    @routes.post("/topics/persistent/{tenant}/{namespace}/{topic}/partitions/{partition}",
                 summary="Produce messages to one partition (PIP-64)")
    def produce_to_partition(tenant: str, namespace: str, topic: str, partition: int,
                             request: ProduceRequest, caller: Caller) -> dict[str, Any]:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.PRODUCE, name)
        if partition < 0 or partition >= max(service.partitions(name), 1):
            raise InvalidRequest(f"{name} has no partition {partition}")
        return produce(name.partition(partition) if service.partitions(name) else name, request, caller)

    return routes
