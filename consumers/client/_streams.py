"""Event streams, client side: append with an expected version, read a stream, follow it.

Role: the calls behind ``append``, ``read_stream`` and ``stream_info`` of both clients (REST:
PIP-64 produce with ``expectedKeyVersions``, and the broker's ``/keys/{key}`` reads) and the
live ``AsyncStreamReader`` (the WebSocket reader with ``?key=&fromKeyVersion=``). An event
stream is the messages with one key in one topic partition; its version is the 0-based number
of its last event (-1: none).

Invariants: an append is one request, so its events are stored together or not at all; a
refused expectation raises ``KeyVersionMismatch`` carrying the stream's current version and
nothing was written; events come back in version order, each with ``key_version``.
"""

from __future__ import annotations

import base64
import contextlib
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection

from consumers.client._calls import Call, HttpRequest, check_range
from consumers.client._consumer import _Receiving
from consumers.client._producer import rest_produce_body
from consumers.client.errors import ConnectionClosed, HttpError, KeyVersionMismatch
from consumers.client.types import AppendResult, Message, MessageIdParts, StreamBatch, StreamInfo, Topic, epoch_ms

EVENTS_PER_APPEND_MAX = 10_000  # the broker's bound on one PIP-64 request
STREAM_READ_MESSAGES_MAX = 10_000
EXISTS = "exists"

StreamInfoFetcher = Callable[[], Awaitable[StreamInfo]]


def key_path(topic: str, key: str) -> str:
    return f"/topics/{Topic.parse(topic).path}/keys/{urllib.parse.quote(key, safe='')}"


def append_body(key: str, events: Sequence[bytes], expected_version: int | str | None, producer_name: str | None,
                sequence_id: int | None, properties: dict[str, str] | None) -> dict[str, Any]:
    """The PIP-64 request of one append: every event keyed ``key``, base64 payloads."""
    if not 1 <= len(events) <= EVENTS_PER_APPEND_MAX:
        raise ValueError(f"an append takes 1..{EVENTS_PER_APPEND_MAX} events")
    if expected_version is not None and expected_version != EXISTS and \
            (isinstance(expected_version, bool) or not isinstance(expected_version, int) or expected_version < -1):
        raise ValueError('expected_version must be an integer >= -1 or "exists"')
    body = rest_produce_body(events, [key] * len(events), properties, producer_name, sequence_id)
    if expected_version is not None:
        body["expectedKeyVersions"] = {key: expected_version}
    return body


def append_result(key: str, answer: dict[str, Any]) -> AppendResult:
    """The answer of one append; a resend of an append whose results the broker no longer has
    (not the producer's last) comes back without versions (-1) and ids."""
    results = answer["messagePublishResults"]
    unknown = str(results[0]["messageId"]).startswith("-1:-1")
    versions = [int(r["keyVersion"]) for r in results if r.get("keyVersion") is not None]
    return AppendResult(key=key, first_version=versions[0] if versions else -1,
                        version=versions[-1] if versions else -1,
                        offsets=[int(r["offset"]) for r in results if r.get("offset") is not None],
                        message_ids=[] if unknown else [MessageIdParts.parse(str(r["messageId"])).to_base64()
                                                        for r in results],
                        duplicate=unknown or any(bool(r.get("duplicate")) for r in results))


def mismatch_of(error: HttpError) -> KeyVersionMismatch | None:
    """The ``KeyVersionMismatch`` a 409 answer stands for (None: another error)."""
    if error.code != KeyVersionMismatch.code:
        return None
    current = error.details.get("currentKeyVersions") or {}
    return KeyVersionMismatch(error.message, current_versions={str(k): int(v) for k, v in current.items()})


def stream_info_of(answer: dict[str, Any]) -> StreamInfo:
    return StreamInfo(key=str(answer["key"]), version=int(answer["version"]), partition=int(answer["partition"]),
                      first_version=int(answer["firstVersion"]), first_offset=answer.get("firstOffset"),
                      last_offset=answer.get("lastOffset"))


def stream_batch_of(topic: str, answer: dict[str, Any]) -> StreamBatch:
    name = Topic.parse(topic)
    messages = [Message(data=base64.b64decode(m["payload"]), message_id=str(m["messageId"]),
                        offset=int(m["offset"]), key=m.get("key"),
                        properties={str(k): str(v) for k, v in (m.get("properties") or {}).items()},
                        publish_time_ms=epoch_ms(m.get("publishTimeMs")), event_time_ms=epoch_ms(m.get("eventTimeMs")),
                        redelivery_count=0, topic=name.partition(int(answer["partition"])).full_name,
                        key_version=int(m["keyVersion"]))
                for m in answer["messages"]]
    return StreamBatch(key=str(answer["key"]), version=int(answer["version"]),
                       first_version=int(answer["firstVersion"]), next_version=int(answer["nextVersion"]),
                       messages=messages)


def append_call(topic: str, key: str, events: Sequence[bytes], expected_version: int | str | None,
                producer_name: str | None, sequence_id: int | None,
                properties: dict[str, str] | None) -> Call[AppendResult]:
    """Append ``events`` to the stream of ``key`` in one request (``KeyVersionMismatch`` when
    the stream is not at ``expected_version``: nothing written)."""
    body = append_body(key, events, expected_version, producer_name, sequence_id, properties)
    try:
        answer = yield HttpRequest("POST", f"/topics/{Topic.parse(topic).path}", json_body=body)
    except HttpError as exc:
        raise mismatch_of(exc) or exc from None
    return append_result(key, answer.json())


def read_stream_call(topic: str, key: str, from_version: int | None, max_messages: int,
                     backward: bool) -> Call[StreamBatch]:
    """Up to ``max_messages`` events of the stream of ``key`` from ``from_version`` on (forward
    from the first version kept, or backward from the last, by default)."""
    check_range("max_messages", max_messages, 1, STREAM_READ_MESSAGES_MAX)
    params: dict[str, Any] = {"maxMessages": max_messages, "direction": "backward" if backward else "forward"}
    if from_version is not None:
        params["fromVersion"] = from_version
    answer = yield HttpRequest("GET", f"{key_path(topic, key)}/messages", params=params)
    return stream_batch_of(topic, answer.json())


def stream_info_call(topic: str, key: str) -> Call[StreamInfo]:
    """Where the stream of ``key`` stands: its version (-1: no event), the first version kept."""
    answer = yield HttpRequest("GET", key_path(topic, key))
    return stream_info_of(answer.json())


class AsyncStreamReader(_Receiving):
    """A live reader of one key's event stream: its events from ``from_version`` on, then each
    new one; create with ``AsyncClient.create_stream_reader``."""

    def __init__(self, ws: ClientConnection, topic: Topic, key: str, from_version: int, receiver_queue_size: int,
                 info: StreamInfoFetcher) -> None:
        self.topic = topic.full_name
        self.key = key
        self.next_version = from_version
        self._info = info
        super().__init__(ws, f"stream reader of {key!r} on {self.topic}", [topic], receiver_queue_size)

    async def read_next(self, timeout_ms: int | None = None) -> Message:
        """The next event; ``ReceiveTimeout`` after ``timeout_ms`` (None: wait until one comes)."""
        message = await self._receive(timeout_ms)
        if message.key_version is not None:
            self.next_version = message.key_version + 1
        with contextlib.suppress(ConnectionClosed):  # the event is good; the next read reports the end
            await self._session.send_json({"messageId": message.message_id})  # returns the flow credit
        return message

    async def has_message_available(self) -> bool:
        """Whether ``read_next`` has an event now or the stream holds one past this reader."""
        return self._queued_messages > 0 or (await self._info()).version >= self.next_version

    async def _next_message(self) -> Message:
        return await self.read_next()
