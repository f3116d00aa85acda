"""Range reads over HTTP (a Magnetar extension; Pulsar has none): messages by offset, and offsets.

Role: the read edge for batch and stream processors, above all the Spark source
(``consumers/spark/source.py``). A client asks for the messages of one topic partition from an
offset on and gets them in offset order (``EventStreams.read_range``), either as an Arrow IPC
stream (``Accept: application/vnd.apache.arrow.stream``) whose columns are the Spark source's,
or as JSON:

- ``GET /topics/persistent/{tenant}/{namespace}/{topic}/messages?offset=N&maxMessages=M&maxBytes=B``
  (and ``.../partitions/{n}/messages``): at most ``M`` messages with offset ``>= N``, stopping
  once the answer holds about ``B`` bytes (payloads plus a per-message allowance for the other
  columns, larger for JSON, whose payloads are base64), and never more than the broker's
  ``read_response_bytes_max`` (``api/limits.py``); always at least one message when any exists.
  Headers ``X-Magnetar-Next-Offset`` (the offset to ask for next) and ``X-Magnetar-First-Offset``
  (the first offset retention kept).
- ``GET /topics/persistent/{tenant}/{namespace}/{topic}/offsets[?timestamp=ms]``: for every
  partition the first retained offset, the next offset to be assigned and, with ``timestamp``,
  the first offset published at or after it.

Invariants: a read never changes anything. Asking below the first retained offset is
``DataLost`` (410 ``data_lost``); asking at or beyond the end is an empty result. JSON messages
carry Pulsar's ISO-8601 ``publishTime`` (and ``eventTime`` when set) like every JSON message
Magnetar writes, with the epoch milliseconds beside them as ``publishTimeMs``/``eventTimeMs``.
Message ids are Pulsar's base64 ``MessageIdData``, as on the WebSocket API. An end-to-end
encrypted entry is one JSON message (its stored ciphertext, with Pulsar's ``encryptionContext``)
at its first offset, as the WebSocket API gives it; an Arrow answer keeps a row per offset.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping, Set
from typing import Annotated, Any

import pyarrow as pa
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from api.auth import Action, Authorizer, Caller, Principal, caller_of
from api.limits import READ_BYTES_DEFAULT, READ_BYTES_MAX, READ_MESSAGES_DEFAULT, READ_MESSAGES_MAX, EdgeLimits
from api.request_route import RequestRoute, query_of, query_parameters
from broker import (
    KEY_VERSION_COLUMN,
    OFFSET_MAX,
    BrokerService,
    EncryptionContext,
    InvalidRequest,
    RangeRead,
    TopicName,
    iso_time,
)

ARROW_MESSAGE_OVERHEAD_BYTES = 64
"""What a message costs an Arrow answer besides its payload (offset, id, times, key, properties)."""
JSON_MESSAGE_OVERHEAD_BYTES = 512
"""What a message costs a JSON answer besides its base64 payload, while the answer is built."""
ARROW_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
NEXT_OFFSET_HEADER = "X-Magnetar-Next-Offset"
FIRST_OFFSET_HEADER = "X-Magnetar-First-Offset"


def arrow_stream(batch: pa.RecordBatch) -> memoryview:
    """The IPC stream of ``batch`` (the schema alone when it is empty), as a view of Arrow's
    buffer: the response body is written from it without another copy."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        if batch.num_rows:
            writer.write_batch(batch)
    return memoryview(sink.getvalue())


def _epoch_ms(column: pa.Array) -> list[int | None]:
    values: list[int | None] = column.cast(pa.int64()).to_pylist()
    return values


def to_json(batch: pa.RecordBatch, encrypted: Mapping[int, EncryptionContext] | None = None,
            carried: Set[int] = frozenset()) -> list[dict[str, Any]]:
    """The messages of a read batch as the JSON answer lists them (with ``keyVersion`` when the
    batch is a stream read's); an encrypted entry as one message with its ``encryptionContext``
    (its carried rows left out), as the WebSocket and REST consumers give it."""
    messages: list[dict[str, Any]] = []
    columns = zip(batch.column("offset").to_pylist(), batch.column("messageId").to_pylist(),
                  batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                  batch.column("properties").to_pylist(), _epoch_ms(batch.column("publishTime")),
                  _epoch_ms(batch.column("eventTime")), strict=True)
    for offset, message_id, key, value, properties, publish_time_ms, event_time_ms in columns:
        if offset in carried:
            continue
        message: dict[str, Any] = {
            "offset": offset,
            "messageId": message_id,
            "payload": base64.b64encode(value).decode("ascii"),
            "properties": dict(properties),
            "publishTime": iso_time(publish_time_ms),
            "publishTimeMs": publish_time_ms,
        }
        if key is not None:
            message["key"] = key.decode(errors="replace")
        if event_time_ms is not None:
            message["eventTime"] = iso_time(event_time_ms)
            message["eventTimeMs"] = event_time_ms
        context = encrypted.get(offset) if encrypted else None
        if context is not None:
            message["encryptionContext"] = context.as_json()
        messages.append(message)
    if KEY_VERSION_COLUMN in batch.schema.names:
        for message, version in zip(messages, batch.column(KEY_VERSION_COLUMN).to_pylist(), strict=True):
            message[KEY_VERSION_COLUMN] = version
    return messages


def wants_arrow(request: Request) -> bool:
    return ARROW_STREAM_MEDIA_TYPE in request.headers.get("accept", "")


class RangeQuery(BaseModel):
    """The query of a range read."""

    offset: Annotated[int, Field(ge=0, le=OFFSET_MAX)]
    maxMessages: Annotated[int, Field(ge=1, le=READ_MESSAGES_MAX)] = READ_MESSAGES_DEFAULT  # noqa: N815
    maxBytes: Annotated[int, Field(ge=1, le=READ_BYTES_MAX)] = READ_BYTES_DEFAULT  # noqa: N815


_RANGE_QUERY = query_parameters(RangeQuery)
_PARTITION_PARAMETER = "partition"


def router(service: BrokerService, authorizer: Authorizer, limits: EdgeLimits) -> APIRouter:
    routes = APIRouter(tags=["read"])

    def read(name: TopicName, query: RangeQuery, arrow: bool) -> Response:
        budget = min(query.maxBytes, limits.read_response_bytes_max)
        if arrow:
            result = service.streams.read_range(name, query.offset, query.maxMessages, budget,
                                                message_overhead_bytes=ARROW_MESSAGE_OVERHEAD_BYTES)
        else:  # base64 makes payloads a third larger
            result = service.streams.read_range(name, query.offset, query.maxMessages, budget * 3 // 4,
                                                message_overhead_bytes=JSON_MESSAGE_OVERHEAD_BYTES)
        return _read_response(arrow, result)

    async def answer(request: Request, caller: Principal, name: TopicName, partition: int | None = None) -> Response:
        """The range read the request asks for (the caller's permission checked on ``name``),
        read and encoded in a worker thread of the event loop's default executor: milliseconds
        of CPU for a large answer, or a wait on an offloaded ledger's object store, which the
        event loop does not spend. (Not Starlette's pool, where FastAPI runs a plain endpoint:
        through its hand-off, reading notifications was slower and varied more from run to run,
        ten interleaved runs each, ``bench/RESULTS.md``.)"""
        authorizer.require(caller, Action.CONSUME, name)
        query = query_of(request, RangeQuery)
        target = name if partition is None else service.admin.partition_of(name, partition)
        return await asyncio.get_running_loop().run_in_executor(None, read, target, query, wants_arrow(request))

    # the routes every range reader takes (the Spark source, a recorder's notifications): FastAPI's
    # parameter resolution skipped
    async def read_topic(tenant: str, namespace: str, topic: str, request: Request) -> Response:
        caller = caller_of(request)  # first: an unauthenticated caller learns nothing of the name's rules
        return await answer(request, caller, TopicName.of(tenant, namespace, topic))

    async def read_partition(tenant: str, namespace: str, topic: str, partition: str, request: Request) -> Response:
        caller = caller_of(request)
        return await answer(request, caller, TopicName.of(tenant, namespace, topic), _partition_number(partition))

    routes.add_api_route("/topics/persistent/{tenant}/{namespace}/{topic}/messages", read_topic, methods=["GET"],
                         summary="Read messages by offset (Arrow IPC stream or JSON)", openapi_extra=_RANGE_QUERY,
                         route_class_override=RequestRoute)
    routes.add_api_route("/topics/persistent/{tenant}/{namespace}/{topic}/partitions/{partition}/messages",
                         read_partition, methods=["GET"], openapi_extra=_RANGE_QUERY, route_class_override=RequestRoute,
                         summary="Read messages of one partition by offset (Arrow IPC stream or JSON)")

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/offsets",
                summary="First, next and by-timestamp offsets of every partition")
    def offsets(tenant: str, namespace: str, topic: str, caller: Caller,
                timestamp: Annotated[int | None, Query(ge=0, le=OFFSET_MAX)] = None) -> dict[str, Any]:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        count = service.topics.partitions(name) if name.partition_index < 0 else 0
        return {"partitions": count, "offsets": service.admin.offsets(name, timestamp)}

    return routes


def _partition_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(f"path.{_PARTITION_PARAMETER}: {text!r} is not a partition number") from None


def _read_response(arrow: bool, result: RangeRead) -> Response:
    headers = {NEXT_OFFSET_HEADER: str(result.next_offset), FIRST_OFFSET_HEADER: str(result.first_offset)}
    if arrow:
        return Response(arrow_stream(result.batch), media_type=ARROW_STREAM_MEDIA_TYPE, headers=headers)
    return JSONResponse({"messages": to_json(result.batch, result.encrypted, result.carried),
                         "nextOffset": result.next_offset,
                         "firstOffset": result.first_offset}, headers=headers)
