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
from broker import MESSAGE_ID_TEXT_CHARS_MAX, BrokerService, MessageId, TopicName


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(tags=["read"])

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/offsetOf",
                summary="The partition and offset of a message id (base64 or ledger:entry[:partition[:batch]])")
    def offset_of(tenant: str, namespace: str, topic: str, caller: Caller,
                  message_id: Annotated[str, Query(alias="messageId", min_length=1,
                                                   max_length=MESSAGE_ID_TEXT_CHARS_MAX)]) -> dict[str, Any]:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        parsed = MessageId.parse(message_id)
        target, offset = service.admin.locate(name, parsed)
        return {"topic": target.full_name, "partition": target.partition_index, "offset": offset,
                "messageId": {"ledgerId": parsed.ledger_id, "entryId": parsed.entry_id,
                              "partitionIndex": target.partition_index,
                              "batchIndex": parsed.batch_index}}

    return routes
