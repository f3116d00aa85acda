"""Admin v2, topics and subscriptions: ``/admin/v2/persistent/{tenant}/{namespace}/...``.

Role: Pulsar's topic administration, translated into ``BrokerService.admin`` calls: topics and
partitioned topics (create, list, grow, delete), subscriptions (create at a position, list,
delete), cursor moves (``resetcursor`` by publish time or message id, ``skip``, ``skip_all``,
``expireMessages``), reading single messages (peek at a subscription's n-th unacknowledged
message, ``examinemessage``), ``lastMessageId``, compaction, offload, ``unload`` and ``terminate``. Paths, parameters
and JSON shapes are Pulsar's; every message id in a body or answer is Pulsar's
``{ledgerId, entryId, partitionIndex, batchIndex}``.

Invariants: every route first checks that the caller administers the tenant, but the partitioned
metadata (``GET …/partitions``), which clients read before they produce or consume and so needs
only produce or consume there (Pulsar's ``TopicOperation.LOOKUP``); what an operation
may do (fan-out over partitions, refusals before changes, cursor moves persisted before the
answer) is the broker's rule (``broker/topic_admin.py``).
"""

from __future__ import annotations

import base64
import json
import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import Response
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictBool, StrictInt

from api.admin_namespaces import namespace_name
from api.auth import Authorizer, Caller
from broker import (
    BrokerService,
    InitialPosition,
    MessageId,
    MessagePosition,
    StoredMessage,
    TopicName,
    iso_time,
)

_HEADER_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HEADER_TEXT = re.compile(r"^[\x20-\x7e]*$")


class MessageIdBody(BaseModel):
    """Pulsar's ``ResetCursorData`` / ``MessageIdImpl`` JSON (its Java bean spells the exclusion
    flag ``excluded``; ``isExcluded`` is accepted too)."""

    model_config = ConfigDict(extra="ignore")
    ledgerId: StrictInt  # noqa: N815
    entryId: StrictInt  # noqa: N815
    partitionIndex: StrictInt = -1  # noqa: N815
    batchIndex: StrictInt = -1  # noqa: N815
    isExcluded: StrictBool = Field(default=False, validation_alias=AliasChoices("isExcluded", "excluded"))  # noqa: N815

    def position(self) -> MessagePosition:
        return MessagePosition(self.ledgerId, self.entryId, self.partitionIndex, self.batchIndex, self.isExcluded)


def topic_name(tenant: str, namespace: str, topic: str) -> TopicName:
    return TopicName.of(tenant, namespace, topic)


def message_id_json(message_id: MessageId, offset: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"ledgerId": message_id.ledger_id, "entryId": message_id.entry_id,
                            "partitionIndex": message_id.partition, "batchIndex": message_id.batch_index}
    if offset is not None:
        body["offset"] = offset  # Magnetar: the message's offset in its partition
    return body


def _parse_message_id_query(text: str) -> InitialPosition:
    if text in ("earliest", "latest"):
        return "earliest" if text == "earliest" else "latest"
    return MessagePosition.of(MessageId.parse(text))


def _header_safe(text: str) -> bool:
    return bool(_HEADER_TEXT.match(text))


def message_response(stored: StoredMessage) -> Response:
    """One stored message as Pulsar's admin API returns it: the raw payload with ``X-Pulsar-*``
    headers (and Magnetar's id with batch index and offset)."""
    message, message_id = stored.message, stored.message_id
    headers = {"X-Pulsar-Message-ID": f"{message_id.ledger_id}:{message_id.entry_id}",
               "X-Magnetar-Message-ID": str(message_id), "X-Magnetar-Offset": str(stored.offset),
               "X-Pulsar-publish-time": iso_time(stored.publish_time_ms),
               "X-Pulsar-redelivery-count": str(stored.redelivery_count),
               "X-Pulsar-Broker-Entry-METADATA-timestamp": str(stored.broker_timestamp_ms),
               "X-Pulsar-Broker-Entry-METADATA-index": str(stored.entry_index),
               "X-Pulsar-PROPERTY": json.dumps(message.properties, ensure_ascii=True, separators=(",", ":"))}
    if _header_safe(stored.producer_name):
        headers["X-Pulsar-producer-name"] = stored.producer_name
    if message.sequence_id is not None:
        headers["X-Pulsar-sequence-id"] = str(message.sequence_id)
    if message.event_time_ms is not None:
        headers["X-Pulsar-event-time"] = iso_time(message.event_time_ms)
    if message.null_value:
        headers["X-Pulsar-null-value"] = "true"
    if message.key is not None:
        _key_headers(headers, message.key, message.key_b64_encoded)
    for key, value in message.properties.items():
        if _HEADER_TOKEN.match(key) and _header_safe(value):
            headers[f"X-Pulsar-PROPERTY-{key}"] = value
    return Response(message.payload, media_type="application/octet-stream", headers=headers)


def _key_headers(headers: dict[str, str], key: str, b64_encoded: bool) -> None:
    """``X-Pulsar-partition-key``; a key that cannot travel in a header goes base64-encoded."""
    if _header_safe(key):
        headers["X-Pulsar-partition-key"] = key
        headers["X-Pulsar-partition-key-b64-encoded"] = "true" if b64_encoded else "false"
    else:
        headers["X-Pulsar-partition-key"] = base64.b64encode(key.encode()).decode()
        headers["X-Pulsar-partition-key-b64-encoded"] = "true"


# --- the router ------------------------------------------------------------------------------
def topics_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(prefix="/persistent")
    _topic_routes(routes, service, authorizer)
    _partitioned_routes(routes, service, authorizer)
    _subscription_routes(routes, service, authorizer)
    _cursor_routes(routes, service, authorizer)
    _message_routes(routes, service, authorizer)
    _lifecycle_routes(routes, service, authorizer)
    return routes


def _topic_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}", summary="List the namespace's topics (partitions by -partition-N name)")
    def list_topics(tenant: str, namespace: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.admin.list_topics(namespace_name(tenant, namespace))

    @routes.put("/{tenant}/{namespace}/{topic}", status_code=204, summary="Create a non-partitioned topic")
    def create_topic(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.topics.create(topic_name(tenant, namespace, topic))

    @routes.delete("/{tenant}/{namespace}/{topic}", status_code=204,
                   summary="Delete a topic (force: also its subscriptions, disconnecting consumers)")
    def delete_topic(tenant: str, namespace: str, topic: str, caller: Caller, force: bool = False) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.delete_topic(topic_name(tenant, namespace, topic), force=force)


def _partitioned_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/partitioned", summary="List the namespace's partitioned topics")
    def list_partitioned(tenant: str, namespace: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.admin.list_partitioned(namespace_name(tenant, namespace))

    @routes.put("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                summary="Create a partitioned topic (body: the number of partitions)")
    def create_partitioned(tenant: str, namespace: str, topic: str, partitions: Annotated[StrictInt, Body()],
                           caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.topics.create_partitioned(topic_name(tenant, namespace, topic), partitions)

    @routes.post("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                 summary="Increase a partitioned topic's partitions (body: the new number)")
    def update_partitioned(tenant: str, namespace: str, topic: str, partitions: Annotated[StrictInt, Body()],
                           caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.topics.update_partitioned(topic_name(tenant, namespace, topic), partitions)

    @routes.get("/{tenant}/{namespace}/{topic}/partitions",
                summary="Get the number of partitions (0 for a non-partitioned topic)")
    def get_partitions(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, int]:
        name = topic_name(tenant, namespace, topic)
        authorizer.require_lookup(caller, name)
        return {"partitions": service.admin.partitions(name)}

    @routes.delete("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                   summary="Delete a partitioned topic and its partitions")
    def delete_partitioned(tenant: str, namespace: str, topic: str, caller: Caller, force: bool = False) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.delete_partitioned_topic(topic_name(tenant, namespace, topic), force=force)


def _subscription_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/{topic}/subscriptions", summary="List the topic's subscriptions")
    def list_subscriptions(tenant: str, namespace: str, topic: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.admin.subscriptions(topic_name(tenant, namespace, topic))

    @routes.put("/{tenant}/{namespace}/{topic}/subscription/{subscription}", status_code=204,
                summary="Create a durable subscription (body or ?messageId=: earliest, latest or a message id)")
    def create_subscription(tenant: str, namespace: str, topic: str, subscription: str, caller: Caller,
                            initial: Annotated[Literal["earliest", "latest"] | MessageIdBody | None, Body()] = None,
                            message_id: Annotated[str | None, Query(alias="messageId", max_length=256)] = None,
                            ) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        position: InitialPosition = "latest"
        if isinstance(initial, MessageIdBody):
            position = initial.position()
        elif initial is not None:
            position = initial
        elif message_id is not None:
            position = _parse_message_id_query(message_id)
        service.admin.create_subscription(topic_name(tenant, namespace, topic), subscription, position)

    @routes.delete("/{tenant}/{namespace}/{topic}/subscription/{subscription}", status_code=204,
                   summary="Delete a subscription (force: disconnect its consumers first)")
    def delete_subscription(tenant: str, namespace: str, topic: str, subscription: str, caller: Caller,
                            force: bool = False) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.delete_subscription(topic_name(tenant, namespace, topic), subscription, force=force)


def _cursor_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    prefix = "/{tenant}/{namespace}/{topic}/subscription/{subscription}"

    @routes.post(prefix + "/resetcursor/{timestamp}", status_code=204,
                 summary="Reset the subscription to the first message published at or after a time (epoch ms)")
    def reset_to_time(tenant: str, namespace: str, topic: str, subscription: str,
                      timestamp: Annotated[int, Path(ge=0)], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.reset_to_time(topic_name(tenant, namespace, topic), subscription, timestamp)

    @routes.post(prefix + "/resetcursor", status_code=204,
                 summary="Reset the subscription to a message id (isExcluded: to the message after it)")
    def reset_to_message(tenant: str, namespace: str, topic: str, subscription: str,
                         body: Annotated[MessageIdBody, Body()], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.reset_to_message(topic_name(tenant, namespace, topic), subscription, body.position())

    @routes.post(prefix + "/skip/{numMessages}", status_code=204,
                 summary="Skip (acknowledge) the next messages of the subscription's backlog")
    def skip(tenant: str, namespace: str, topic: str, subscription: str,
             num_messages: Annotated[int, Path(alias="numMessages", ge=1)], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.skip(topic_name(tenant, namespace, topic), subscription, num_messages)

    @routes.post(prefix + "/skip_all", status_code=204, summary="Clear the subscription's backlog")
    def skip_all(tenant: str, namespace: str, topic: str, subscription: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.skip_all(topic_name(tenant, namespace, topic), subscription)

    @routes.post(prefix + "/expireMessages/{expireTimeInSeconds}", status_code=204,
                 summary="Acknowledge the subscription's messages published longer ago than the given seconds")
    def expire(tenant: str, namespace: str, topic: str, subscription: str,
               expire_s: Annotated[int, Path(alias="expireTimeInSeconds", ge=0)], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.expire(topic_name(tenant, namespace, topic), subscription, expire_s)

    @routes.post("/{tenant}/{namespace}/{topic}/all_subscription/expireMessages/{expireTimeInSeconds}",
                 status_code=204, summary="Expire old messages on every subscription of the topic")
    def expire_all(tenant: str, namespace: str, topic: str,
                   expire_s: Annotated[int, Path(alias="expireTimeInSeconds", ge=0)], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.expire_all(topic_name(tenant, namespace, topic), expire_s)


def _message_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/{topic}/subscription/{subscription}/position/{messagePosition}",
                summary="Peek the subscription's n-th unacknowledged message (1-based): payload and X-Pulsar-* headers",
                response_class=Response)
    def peek(tenant: str, namespace: str, topic: str, subscription: str,
             position: Annotated[int, Path(alias="messagePosition", ge=1)], caller: Caller) -> Response:
        authorizer.require_tenant_admin(caller, tenant)
        return message_response(service.admin.peek(topic_name(tenant, namespace, topic), subscription, position))

    @routes.get("/{tenant}/{namespace}/{topic}/examinemessage", response_class=Response,
                summary="Read the n-th message counted from the earliest or the latest (1 = the last)")
    def examine(tenant: str, namespace: str, topic: str, caller: Caller,
                initial_position: Annotated[Literal["earliest", "latest"], Query(alias="initialPosition")] = "latest",
                position: Annotated[int, Query(alias="messagePosition", ge=1)] = 1) -> Response:
        authorizer.require_tenant_admin(caller, tenant)
        return message_response(service.admin.examine(topic_name(tenant, namespace, topic), initial_position,
                                                      position))


def _lifecycle_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/{topic}/lastMessageId", summary="The id of the topic's last message")
    def get_last_message_id(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return message_id_json(*service.admin.last_message_id(topic_name(tenant, namespace, topic)))

    @routes.post("/{tenant}/{namespace}/{topic}/terminate",
                 summary="Terminate the topic: no more messages are accepted; returns the last message id")
    def terminate(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return message_id_json(*service.admin.terminate(topic_name(tenant, namespace, topic)))

    @routes.put("/{tenant}/{namespace}/{topic}/unload", status_code=204,
                summary="Unload the topic: its clients reconnect and it is loaded afresh on next use")
    def unload(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.unload(topic_name(tenant, namespace, topic))

    @routes.put("/{tenant}/{namespace}/{topic}/compaction", status_code=204,
                summary="Start compacting the topic (latest message per key) in the background")
    def trigger_compaction(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.trigger_compaction(topic_name(tenant, namespace, topic))

    @routes.put("/{tenant}/{namespace}/{topic}/offload", status_code=204,
                summary="Offload the topic's closed ledgers before the given message id to the object store")
    def trigger_offload(tenant: str, namespace: str, topic: str, message_id: Annotated[MessageIdBody, Body()],
                        caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.admin.trigger_offload(topic_name(tenant, namespace, topic),
                                      MessageId(message_id.ledgerId, message_id.entryId))

    @routes.get("/{tenant}/{namespace}/{topic}/offload",
                summary="Offload status: NOT_RUN, RUNNING, SUCCESS or ERROR (with lastError), firstUnoffloadedMessage")
    def offload_status(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, object]:
        authorizer.require_tenant_admin(caller, tenant)
        return service.admin.offload_status(topic_name(tenant, namespace, topic)).to_json()

    @routes.get("/{tenant}/{namespace}/{topic}/compaction",
                summary="Compaction status: NOT_RUN, RUNNING, SUCCESS or ERROR (with lastError)")
    def compaction_status(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        status = service.admin.compaction_status(topic_name(tenant, namespace, topic))
        return {"status": status.status, "lastError": status.error,
                "compactedLedgerId": status.ledger_id, "horizonOffset": status.horizon_offset,
                "messages": status.messages, "lastRunTimestamp": status.last_run_ms}
