"""Event streams over HTTP (a Magnetar extension): one key's messages, read by version.

Role: the read edge of event sourcing. An event stream is the messages with one key in one
topic partition (a partitioned topic routes the key to one partition); its version is the
0-based number of the key's message. Over ``EventStreams.read_stream`` / ``stream_info``:

- ``GET /topics/persistent/{tenant}/{namespace}/{topic}/keys/{key}/messages`` with
  ``fromVersion``, ``maxMessages``, ``maxBytes`` and ``direction`` (forward or backward):
  up to ``maxMessages`` messages of the key from ``fromVersion`` on (forward: default the first
  version kept; backward: default the last version, descending), each with ``keyVersion``,
  ``offset``, ``messageId``, ``payload`` (base64), ``properties``, ``publishTime`` and
  ``eventTime``, as JSON ``{key, partition, version, firstVersion, nextVersion, messages}`` or,
  with ``Accept: application/vnd.apache.arrow.stream``, the range reads' Arrow columns plus
  ``keyVersion`` (headers ``X-Magnetar-Key-Version``, ``X-Magnetar-First-Version``,
  ``X-Magnetar-Next-Version``);
- ``GET /topics/persistent/{tenant}/{namespace}/{topic}/keys/{key}``: ``{key, version,
  partition, firstVersion, firstOffset, lastOffset}`` (version -1: the key has no message).

Invariants: a read never changes anything; versions retention trimmed are 410 ``data_lost``
with the ``firstVersion`` still kept; answers are bounded by ``maxMessages`` (at most
``STREAM_READ_MESSAGES_MAX``) and by bytes as range reads are; a key is at most
``KEY_BYTES_MAX`` bytes (a longer one is a 400). The ``/messages`` route is matched first, so
a key cannot end in ``/messages`` when its stream's state is asked for.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from api.auth import Action, Authorizer, Caller
from api.limits import (
    READ_BYTES_DEFAULT,
    READ_BYTES_MAX,
    STREAM_READ_MESSAGES_DEFAULT,
    STREAM_READ_MESSAGES_MAX,
    EdgeLimits,
)
from api.rest_read import (
    ARROW_MESSAGE_OVERHEAD_BYTES,
    ARROW_STREAM_MEDIA_TYPE,
    JSON_MESSAGE_OVERHEAD_BYTES,
    arrow_stream,
    to_json,
    wants_arrow,
)
from broker import VERSION_MAX, BrokerService, StreamInfo, StreamRead, TopicName, check_key

KEY_VERSION_HEADER = "X-Magnetar-Key-Version"
FIRST_VERSION_HEADER = "X-Magnetar-First-Version"
NEXT_VERSION_HEADER = "X-Magnetar-Next-Version"


def info_json(info: StreamInfo) -> dict[str, Any]:
    return {"key": info.key, "version": info.version, "partition": info.partition, "firstVersion": info.first_version,
            "firstOffset": info.first_offset, "lastOffset": info.last_offset}


def router(service: BrokerService, authorizer: Authorizer, limits: EdgeLimits) -> APIRouter:
    routes = APIRouter(tags=["event streams"])

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/keys/{key:path}/messages",
                summary="Read one key's event stream by version (JSON or Arrow IPC stream)")
    def read_key(tenant: str, namespace: str, topic: str, key: str, request: Request, caller: Caller,
                 fromVersion: Annotated[int | None, Query(ge=0, le=VERSION_MAX)] = None,  # noqa: N803
                 maxMessages: Annotated[int, Query(ge=1, le=STREAM_READ_MESSAGES_MAX)] = STREAM_READ_MESSAGES_DEFAULT,  # noqa: N803
                 maxBytes: Annotated[int, Query(ge=1, le=READ_BYTES_MAX)] = READ_BYTES_DEFAULT,  # noqa: N803
                 direction: Literal["forward", "backward"] = "forward") -> Response:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        check_key(key)
        budget = min(maxBytes, limits.read_response_bytes_max)
        arrow = wants_arrow(request)
        result = service.streams.read_stream(
            name, key, fromVersion, maxMessages, budget if arrow else budget * 3 // 4,
            backward=direction == "backward",
            message_overhead_bytes=ARROW_MESSAGE_OVERHEAD_BYTES if arrow else JSON_MESSAGE_OVERHEAD_BYTES)
        return _stream_response(result, arrow)

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/keys/{key:path}",
                summary="Where one key's event stream stands: version, first version kept, offsets")
    def key_info(tenant: str, namespace: str, topic: str, key: str, caller: Caller) -> dict[str, Any]:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        return info_json(service.streams.stream_info(name, check_key(key)))

    return routes


def _stream_response(result: StreamRead, arrow: bool) -> Response:
    info = result.info
    headers = {KEY_VERSION_HEADER: str(info.version), FIRST_VERSION_HEADER: str(info.first_version),
               NEXT_VERSION_HEADER: str(result.next_version)}
    if arrow:
        return Response(arrow_stream(result.batch), media_type=ARROW_STREAM_MEDIA_TYPE, headers=headers)
    return JSONResponse({**info_json(info), "nextVersion": result.next_version, "messages": to_json(result.batch)},
                        headers=headers)
