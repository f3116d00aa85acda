"""Where a message id points: ``GET /topics/persistent/{tenant}/{namespace}/{topic}/offsetOf?messageId=``.

Role: a Magnetar extension beside the range reads (``api/rest_read.py``), which speak offsets:
it turns a message id, as a client saw it, into the partition and offset a range read starts
from (the web console browses "from a message id" this way, and resolves the ids a user types
for a cursor reset). Ids are accepted in every form the APIs hand out: Pulsar's base64
``MessageIdData`` (WebSocket), ``ledger:entry``, ``ledger:entry:partition`` (REST produce) and
``ledger:entry:partition:batchIndex``.

Invariants: a lookup reads one entry and changes nothing. It needs the ``consume`` permission,
as range reads do. A malformed id is a 400 saying what is wrong with it; an id whose partition
does not fit the topic (a partition id on a plain topic, none or a missing one on a partitioned
topic) is a 400; an entry the topic does not hold (never written, or trimmed by retention) is a
404; a batch index past the entry's messages is a 400.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.auth import Action, Authorizer, Caller
from broker.errors import InvalidRequest
from broker.message_id import MessageId
from broker.service import BrokerService
from broker.topic_name import TopicName

MESSAGE_ID_TEXT_MAX = 256


def _partition_topic(service: BrokerService, name: TopicName, message_id: MessageId) -> TopicName:
    """The topic (partition) the id belongs to."""
    partitions = service.partitions(name) if name.partition_index < 0 else 0
    if partitions:
        if not 0 <= message_id.partition < partitions:
            raise InvalidRequest(f"{name} has {partitions} partitions: the message id must name one "
                                 f"(ledger:entry:partition), not partition {message_id.partition}")
        return name.partition(message_id.partition)
    if message_id.partition not in (-1, name.partition_index):
        raise InvalidRequest(f"{name} is not partitioned: message id {message_id} names partition "
                             f"{message_id.partition}")
    return name


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(tags=["read"])

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/offsetOf",
                summary="The partition and offset of a message id (base64 or ledger:entry[:partition[:batch]])")
    def offset_of(tenant: str, namespace: str, topic: str, caller: Caller,
                  message_id: Annotated[str, Query(alias="messageId", min_length=1,
                                                   max_length=MESSAGE_ID_TEXT_MAX)]) -> dict[str, Any]:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        parsed = MessageId.parse(message_id)
        target = _partition_topic(service, name, parsed)
        entry = service.topic(target, create=False).ml.read_entry(parsed.position)
        if parsed.batch_index >= entry.message_count:
            raise InvalidRequest(f"entry {parsed.position} holds {entry.message_count} messages, "
                                 f"no batch index {parsed.batch_index}")
        return {"topic": target.full_name, "partition": target.partition_index,
                "offset": entry.first_offset + max(parsed.batch_index, 0),
                "messageId": {"ledgerId": parsed.ledger_id, "entryId": parsed.entry_id,
                              "partitionIndex": target.partition_index,
                              "batchIndex": parsed.batch_index}}

    return routes
