"""Admin v2, topics and subscriptions: ``/admin/v2/persistent/{tenant}/{namespace}/...``.

Role: Pulsar's topic administration over ``BrokerService``: topics and partitioned topics
(create, list, grow, delete), subscriptions (create at a position, list, delete), cursor moves
(``resetcursor`` by publish time or message id, ``skip``, ``skip_all``, ``expireMessages``),
reading single messages (peek at a subscription's n-th unacknowledged message,
``examinemessage``), ``lastMessageId``, compaction and ``terminate``. Paths, parameters and
JSON shapes are Pulsar's; every message id in a body or answer is Pulsar's
``{ledgerId, entryId, partitionIndex, batchIndex}``.

Invariants:
- Every route first checks that the caller administers the tenant, then validates names.
- Cursor moves go through ``BrokerService.move_cursor``: an active subscription repositions its
  dispatch, so connected consumers get what the move left unacknowledged and nothing it
  acknowledged. A move returns once the new cursor state is persisted.
- Operations that fan out over a partitioned topic's partitions check every partition before
  changing any, so a refused request changes nothing.
- Magnetar counts messages, not entries: peek and ``examinemessage`` positions name messages
  (one entry may hold a batch of them), and each answer is one message's payload.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import Response
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictBool, StrictInt

from api.admin_namespaces import namespace_name
from api.auth import Authorizer, Caller
from broker.cursor import ManagedCursor
from broker.entry_format import decode_entry
from broker.errors import AlreadyExists, InvalidRequest, NotAllowed, NotFound, PreconditionFailed
from broker.message_id import MessageId, Position
from broker.service import BrokerService
from broker.subscription import REDELIVERY_PROPERTY_PREFIX
from broker.topic import PersistentTopic
from broker.topic_name import TopicName

LATEST_ID = (1 << 63) - 1
"""Pulsar's ``MessageId.latest`` has ledger and entry ``Long.MAX_VALUE``; earliest has -1."""
SUBSCRIPTION_NAME_BYTES_MAX = 256
_SUBSCRIPTION = re.compile(r"^[^\x00-\x1f\x7f/]+$")
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


InitialPosition = Literal["earliest", "latest"] | MessageIdBody
CursorMove = Callable[[ManagedCursor], Future[None] | None]


# --- shared helpers (also used by api/admin.py) -------------------------------------------------
def topic_name(tenant: str, namespace: str, topic: str) -> TopicName:
    return TopicName.of(tenant, namespace, topic)


def iso_time(epoch_ms: int) -> str:
    """Pulsar's admin timestamps: ISO-8601 with milliseconds, here always in UTC."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_id_json(message_id: MessageId, offset: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"ledgerId": message_id.ledger_id, "entryId": message_id.entry_id,
                            "partitionIndex": message_id.partition, "batchIndex": message_id.batch_index}
    if offset is not None:
        body["offset"] = offset  # Magnetar: the message's offset in its partition
    return body


def single_topic(service: BrokerService, name: TopicName, operation: str) -> PersistentTopic:
    """The topic ``name`` for an operation Pulsar allows only on non-partitioned topics or partitions."""
    if name.partition_index < 0 and service.partitions(name) > 0:
        raise NotAllowed(f"{operation} is not allowed on partitioned topic {name}; use its -partition-N topics")
    return service.topic(name, create=False)


def existing_partitions(service: BrokerService, name: TopicName) -> list[TopicName]:
    """The topics a request on ``name`` fans out to: itself, or its partitions that exist."""
    if name.partition_index >= 0 or service.partitions(name) == 0:
        service.topic(name, create=False)  # NotFound for an unknown topic
        return [name]
    return [p for p in service.expand_partitions(name) if service.topic_exists(p)]


def last_message_id(topic: PersistentTopic) -> tuple[MessageId, int | None]:
    """The id (and offset) of the last message; ``{ledger}:-1`` style when there is none."""
    ml = topic.ml
    end = ml.confirmed_next_offset()
    if end > ml.first_offset:
        return topic.message_id_of_offset(end - 1), end - 1
    last = ml.last_confirmed
    if last.ledger_id < 0 and ml.ledger_infos():
        last = Position(ml.ledger_infos()[-1].ledger_id, -1)
    return MessageId(last.ledger_id, last.entry_id, topic.partition), None


def _subscription_name(name: str) -> str:
    if not _SUBSCRIPTION.match(name) or len(name.encode()) > SUBSCRIPTION_NAME_BYTES_MAX or name in (".", ".."):
        raise InvalidRequest(f"invalid subscription name {name!r}: 1..{SUBSCRIPTION_NAME_BYTES_MAX} bytes, "
                             "no '/' or control characters")
    return name


def _offset_of(topic: PersistentTopic, body: MessageIdBody) -> int:
    """The offset a message id body points at (``isExcluded``: the message after it)."""
    if body.ledgerId == -1 and body.entryId == -1:
        return topic.ml.first_offset
    if body.ledgerId == LATEST_ID and body.entryId == LATEST_ID:
        return topic.ml.confirmed_next_offset()
    entry = topic.ml.read_entry(Position(body.ledgerId, body.entryId))
    if body.batchIndex < 0:
        return entry.last_offset + 1 if body.isExcluded else entry.first_offset
    if body.batchIndex >= entry.message_count:
        raise InvalidRequest(f"entry {body.ledgerId}:{body.entryId} holds {entry.message_count} messages, "
                             f"no batchIndex {body.batchIndex}")
    return entry.first_offset + body.batchIndex + (1 if body.isExcluded else 0)


def _initial_offset(topic: PersistentTopic, initial: InitialPosition) -> str | int:
    if isinstance(initial, str):
        return initial
    return _offset_of(topic, initial)


def _parse_message_id_query(text: str) -> InitialPosition:
    if text in ("earliest", "latest"):
        return "earliest" if text == "earliest" else "latest"
    parsed = MessageId.parse(text)
    return MessageIdBody(ledgerId=parsed.ledger_id, entryId=parsed.entry_id, partitionIndex=parsed.partition,
                         batchIndex=parsed.batch_index)


def _header_safe(text: str) -> bool:
    return bool(_HEADER_TEXT.match(text))


def message_response(topic: PersistentTopic, offset: int, redelivery_count: int) -> Response:
    """One stored message as Pulsar's admin API returns it: the raw payload with ``X-Pulsar-*``
    headers (and Magnetar's id with batch index and offset)."""
    position, index = topic.ml.offset_to_position(offset)
    entry = topic.ml.read_entry(position)
    decoded = decode_entry(entry.data)
    message = decoded.messages[index]
    message_id = MessageId(position.ledger_id, position.entry_id, topic.partition,
                           -1 if len(decoded.messages) == 1 else index)
    headers = {"X-Pulsar-Message-ID": f"{position.ledger_id}:{position.entry_id}",
               "X-Magnetar-Message-ID": str(message_id), "X-Magnetar-Offset": str(offset),
               "X-Pulsar-publish-time": iso_time(decoded.publish_time_ms),
               "X-Pulsar-redelivery-count": str(redelivery_count),
               "X-Pulsar-Broker-Entry-METADATA-timestamp": str(entry.publish_time_ms),
               "X-Pulsar-Broker-Entry-METADATA-index": str(entry.last_offset),
               "X-Pulsar-PROPERTY": json.dumps(message.properties, ensure_ascii=True, separators=(",", ":"))}
    if _header_safe(decoded.producer_name):
        headers["X-Pulsar-producer-name"] = decoded.producer_name
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


def _drop_subscriptions(service: BrokerService, name: TopicName) -> None:
    """Delete every subscription of ``name``, disconnecting consumers (forced topic deletion)."""
    for subscription in service.topic(name, create=False).cursors.names():
        service.delete_subscription(name, subscription, force=True)


def _topic_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}", summary="List the namespace's topics (partitions by -partition-N name)")
    def list_topics(tenant: str, namespace: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        name = namespace_name(tenant, namespace)
        service.policies(name)  # NotFound for an unknown namespace
        names = set(service.topics(name))
        for partitioned in service.partitioned_topics(name):
            names.update(p.full_name for p in service.expand_partitions(TopicName.parse(partitioned)))
        return sorted(names)

    @routes.put("/{tenant}/{namespace}/{topic}", status_code=204, summary="Create a non-partitioned topic")
    def create_topic(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.create_topic(topic_name(tenant, namespace, topic))

    @routes.delete("/{tenant}/{namespace}/{topic}", status_code=204,
                   summary="Delete a topic (force: also its subscriptions, disconnecting consumers)")
    def delete_topic(tenant: str, namespace: str, topic: str, caller: Caller, force: bool = False) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        single_topic(service, name, "deleting with this path")
        if force:
            _drop_subscriptions(service, name)
        service.delete_topic(name, force=force)


def _partitioned_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/partitioned", summary="List the namespace's partitioned topics")
    def list_partitioned(tenant: str, namespace: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        name = namespace_name(tenant, namespace)
        service.policies(name)
        return service.partitioned_topics(name)

    @routes.put("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                summary="Create a partitioned topic (body: the number of partitions)")
    def create_partitioned(tenant: str, namespace: str, topic: str, partitions: Annotated[StrictInt, Body()],
                           caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.create_partitioned_topic(topic_name(tenant, namespace, topic), partitions)

    @routes.post("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                 summary="Increase a partitioned topic's partitions (body: the new number)")
    def update_partitioned(tenant: str, namespace: str, topic: str, partitions: Annotated[StrictInt, Body()],
                           caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        service.update_partitioned_topic(topic_name(tenant, namespace, topic), partitions)

    @routes.get("/{tenant}/{namespace}/{topic}/partitions",
                summary="Get the number of partitions (0 for a non-partitioned topic)")
    def get_partitions(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, int]:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        service.policies(name.namespace_name)
        return {"partitions": service.partitions(name)}

    @routes.delete("/{tenant}/{namespace}/{topic}/partitions", status_code=204,
                   summary="Delete a partitioned topic and its partitions")
    def delete_partitioned(tenant: str, namespace: str, topic: str, caller: Caller, force: bool = False) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        if service.partitions(name) == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        partitions = [p for p in service.expand_partitions(name) if service.topic_exists(p)]
        if not force:  # refuse before deleting any partition
            for partition in partitions:
                if service.topic(partition, create=False).cursors.names():
                    raise NotAllowed(f"{partition} has subscriptions; use force")
        for partition in partitions if force else []:
            _drop_subscriptions(service, partition)
        service.delete_partitioned_topic(name, force=force)


def _subscription_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/{topic}/subscriptions", summary="List the topic's subscriptions")
    def list_subscriptions(tenant: str, namespace: str, topic: str, caller: Caller) -> list[str]:
        authorizer.require_tenant_admin(caller, tenant)
        names: set[str] = set()
        for target in existing_partitions(service, topic_name(tenant, namespace, topic)):
            names.update(service.topic(target, create=False).cursors.names())
        return sorted(names)

    @routes.put("/{tenant}/{namespace}/{topic}/subscription/{subscription}", status_code=204,
                summary="Create a durable subscription (body or ?messageId=: earliest, latest or a message id)")
    def create_subscription(tenant: str, namespace: str, topic: str, subscription: str, caller: Caller,
                            initial: Annotated[InitialPosition | None, Body()] = None,
                            message_id: Annotated[str | None, Query(alias="messageId", max_length=256)] = None,
                            ) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name, sub = topic_name(tenant, namespace, topic), _subscription_name(subscription)
        position: InitialPosition = "latest"
        if initial is not None:
            position = initial
        elif message_id is not None:
            position = _parse_message_id_query(message_id)
        count = service.partitions(name) if name.partition_index < 0 else 0
        if count and not isinstance(position, str):
            raise InvalidRequest("a message id names one partition: create the subscription on a -partition-N topic")
        targets = [service.topic(p, create=True) for p in service.expand_partitions(name)] if count else \
            [service.topic(name, create=False)]
        if any(t.cursors.get(sub) is not None for t in targets):
            raise AlreadyExists(f"subscription {sub} already exists on {name}")
        for target in targets:
            target.cursors.open(sub, initial=_initial_offset(target, position))

    @routes.delete("/{tenant}/{namespace}/{topic}/subscription/{subscription}", status_code=204,
                   summary="Delete a subscription (force: disconnect its consumers first)")
    def delete_subscription(tenant: str, namespace: str, topic: str, subscription: str, caller: Caller,
                            force: bool = False) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name, sub = topic_name(tenant, namespace, topic), _subscription_name(subscription)
        targets = _with_subscription(service, name, sub)
        if not force:  # refuse before deleting on any partition
            for target in targets:
                if any(s.consumers for s in service.subscriptions_of(target) if s.name == sub):
                    raise PreconditionFailed(f"subscription {sub} of {target} has connected consumers; use force")
        for target in targets:
            service.delete_subscription(target, sub, force=force)


def _with_subscription(service: BrokerService, name: TopicName, subscription: str) -> list[TopicName]:
    """The topics (``name`` or its partitions) holding ``subscription``; NotFound if none does."""
    targets = [t for t in existing_partitions(service, name)
               if service.topic(t, create=False).cursors.get(subscription) is not None]
    if not targets:
        raise NotFound(f"subscription {subscription} of {name} does not exist")
    return targets


def _everywhere(move: CursorMove) -> Callable[[PersistentTopic], CursorMove]:
    """The same cursor move for every partition."""
    return lambda _topic: move


def _cursor_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    prefix = "/{tenant}/{namespace}/{topic}/subscription/{subscription}"

    def move_all(name: TopicName, sub: str, move_for: Callable[[PersistentTopic], CursorMove]) -> None:
        """Apply a move on ``name`` or on each of its partitions holding the subscription."""
        for target in _with_subscription(service, name, sub):
            service.move_cursor(target, sub, move_for(service.topic(target, create=False)))

    @routes.post(prefix + "/resetcursor/{timestamp}", status_code=204,
                 summary="Reset the subscription to the first message published at or after a time (epoch ms)")
    def reset_to_time(tenant: str, namespace: str, topic: str, subscription: str,
                      timestamp: Annotated[int, Path(ge=0)], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        move_all(topic_name(tenant, namespace, topic), _subscription_name(subscription),
                 _everywhere(lambda cursor: cursor.reset_to_time(timestamp)))

    @routes.post(prefix + "/resetcursor", status_code=204,
                 summary="Reset the subscription to a message id (isExcluded: to the message after it)")
    def reset_to_message(tenant: str, namespace: str, topic: str, subscription: str,
                         body: Annotated[MessageIdBody, Body()], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name, sub = topic_name(tenant, namespace, topic), _subscription_name(subscription)
        count = service.partitions(name) if name.partition_index < 0 else 0
        if count:
            if not 0 <= body.partitionIndex < count:
                raise PreconditionFailed(f"{name} is partitioned: partitionIndex must name one of {count} partitions")
            name = name.partition(body.partitionIndex)
        target = service.topic(name, create=False)
        offset = _offset_of(target, body)
        service.move_cursor(name, sub, lambda cursor: cursor.reset_to_offset(offset))

    @routes.post(prefix + "/skip/{numMessages}", status_code=204,
                 summary="Skip (acknowledge) the next messages of the subscription's backlog")
    def skip(tenant: str, namespace: str, topic: str, subscription: str,
             num_messages: Annotated[int, Path(alias="numMessages", ge=1)], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name, sub = topic_name(tenant, namespace, topic), _subscription_name(subscription)
        single_topic(service, name, "skip")
        service.move_cursor(name, sub, lambda cursor: cursor.skip(num_messages))

    @routes.post(prefix + "/skip_all", status_code=204, summary="Clear the subscription's backlog")
    def skip_all(tenant: str, namespace: str, topic: str, subscription: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        move_all(topic_name(tenant, namespace, topic), _subscription_name(subscription),
                 _everywhere(lambda cursor: cursor.skip_all()))

    def expire_move(expire_s: int) -> Callable[[PersistentTopic], CursorMove]:
        def for_topic(target: PersistentTopic) -> CursorMove:
            cutoff_offset = target.ml.time_to_offset(int(service.clock() * 1000) - expire_s * 1000)
            return lambda cursor: cursor.expire_before(cutoff_offset)
        return for_topic

    @routes.post(prefix + "/expireMessages/{expireTimeInSeconds}", status_code=204,
                 summary="Acknowledge the subscription's messages published longer ago than the given seconds")
    def expire(tenant: str, namespace: str, topic: str, subscription: str,
               expire_s: Annotated[int, Path(alias="expireTimeInSeconds", ge=0)], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        move_all(topic_name(tenant, namespace, topic), _subscription_name(subscription), expire_move(expire_s))

    @routes.post("/{tenant}/{namespace}/{topic}/all_subscription/expireMessages/{expireTimeInSeconds}",
                 status_code=204, summary="Expire old messages on every subscription of the topic")
    def expire_all(tenant: str, namespace: str, topic: str,
                   expire_s: Annotated[int, Path(alias="expireTimeInSeconds", ge=0)], caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        for target in existing_partitions(service, topic_name(tenant, namespace, topic)):
            opened = service.topic(target, create=False)
            for sub in opened.cursors.names():
                service.move_cursor(target, sub, expire_move(expire_s)(opened))


def _message_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/{topic}/subscription/{subscription}/position/{messagePosition}",
                summary="Peek the subscription's n-th unacknowledged message (1-based): payload and X-Pulsar-* headers",
                response_class=Response)
    def peek(tenant: str, namespace: str, topic: str, subscription: str,
             position: Annotated[int, Path(alias="messagePosition", ge=1)], caller: Caller) -> Response:
        authorizer.require_tenant_admin(caller, tenant)
        name, sub = topic_name(tenant, namespace, topic), _subscription_name(subscription)
        target = single_topic(service, name, "peek")
        cursor = target.cursors.get(sub)
        if cursor is None:
            raise NotFound(f"subscription {sub} of {name} does not exist")
        offset = cursor.nth_unacked_offset(position)
        if offset is None:
            raise NotFound(f"subscription {sub} of {name} has no message at position {position}")
        return message_response(target, offset, int(cursor.properties.get(f"{REDELIVERY_PROPERTY_PREFIX}{offset}", 0)))

    @routes.get("/{tenant}/{namespace}/{topic}/examinemessage", response_class=Response,
                summary="Read the n-th message counted from the earliest or the latest (1 = the last)")
    def examine(tenant: str, namespace: str, topic: str, caller: Caller,
                initial_position: Annotated[Literal["earliest", "latest"], Query(alias="initialPosition")] = "latest",
                position: Annotated[int, Query(alias="messagePosition", ge=1)] = 1) -> Response:
        authorizer.require_tenant_admin(caller, tenant)
        target = single_topic(service, topic_name(tenant, namespace, topic), "examinemessage")
        first, end = target.ml.first_offset, target.ml.confirmed_next_offset()
        offset = first + position - 1 if initial_position == "earliest" else end - position
        if not first <= offset < end:
            raise NotFound(f"{target.name} has no message at position {position} from the {initial_position}")
        return message_response(target, offset, 0)


def _lifecycle_routes(routes: APIRouter, service: BrokerService, authorizer: Authorizer) -> None:
    @routes.get("/{tenant}/{namespace}/{topic}/lastMessageId", summary="The id of the topic's last message")
    def get_last_message_id(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        target = single_topic(service, topic_name(tenant, namespace, topic), "lastMessageId")
        return message_id_json(*last_message_id(target))

    @routes.post("/{tenant}/{namespace}/{topic}/terminate",
                 summary="Terminate the topic: no more messages are accepted; returns the last message id")
    def terminate(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        target = single_topic(service, topic_name(tenant, namespace, topic), "terminate")
        target.ml.terminate()
        return message_id_json(*last_message_id(target))

    @routes.put("/{tenant}/{namespace}/{topic}/compaction", status_code=204,
                summary="Start compacting the topic (latest message per key) in the background")
    def trigger_compaction(tenant: str, namespace: str, topic: str, caller: Caller) -> None:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        single_topic(service, name, "compaction")
        service.trigger_compaction(name)

    @routes.get("/{tenant}/{namespace}/{topic}/compaction",
                summary="Compaction status: NOT_RUN, RUNNING, SUCCESS or ERROR (with lastError)")
    def compaction_status(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        single_topic(service, name, "compaction")
        status = service.compaction_status(name)
        return {"status": status.status, "lastError": status.error,
                "compactedLedgerId": status.ledger_id, "horizonOffset": status.horizon_offset,
                "messages": status.messages, "lastRunTimestamp": status.last_run_ms}
