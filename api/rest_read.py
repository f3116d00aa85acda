"""Range reads over HTTP (a Magnetar extension; Pulsar has none): messages by offset, and offsets.

Role: the read edge for batch and stream processors, above all the Spark source
(``consumers/spark.py``). A client asks for the messages of one topic partition from an offset
on and gets them in offset order, either as an Arrow IPC stream (``Accept:
application/vnd.apache.arrow.stream``) whose columns are the Spark source's, or as JSON:

- ``GET /topics/persistent/{tenant}/{namespace}/{topic}/messages?offset=N&maxMessages=M&maxBytes=B``
  (and ``.../partitions/{n}/messages``): at most ``M`` messages with offset ``>= N``, stopping
  once about ``B`` payload bytes are collected (always at least one message when any exists).
  Headers ``X-Magnetar-Next-Offset`` (the offset to ask for next) and ``X-Magnetar-First-Offset``
  (the first offset retention kept).
- ``GET /topics/persistent/{tenant}/{namespace}/{topic}/offsets[?timestamp=ms]``: for every
  partition (every one of a partitioned topic, so a poller discovers new partitions) the first
  retained offset, the next offset to be assigned and, with ``timestamp``, the first offset
  published at or after it.

Invariants: a read never changes anything (no cursor, no topic creation). Offsets are gap-free,
so the ``offset`` column of a response is ``N, N+1, ...``. Asking below the first retained
offset is ``DataLost`` (410 ``data_lost``, naming the first available offset); asking at or
beyond the end is an empty result, not an error. Every response is bounded by
``READ_MESSAGES_MAX`` messages and ``READ_BYTES_MAX`` payload bytes. Message ids are Pulsar's
base64 ``MessageIdData``, as on the WebSocket API. Times are epoch milliseconds (UTC).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import pyarrow as pa
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from api.auth import Action, Authorizer, Caller
from broker.entry_format import decode_entry, encode_varint
from broker.errors import DataLost, InvalidRequest, NoSuchEntry, NoSuchLedger, NotFound
from broker.managed_ledger import Entry, ManagedLedger
from broker.message_id import MessageId
from broker.service import BrokerService
from broker.topic import PersistentTopic
from broker.topic_name import TopicName

READ_MESSAGES_DEFAULT = 1000
READ_MESSAGES_MAX = 100_000
READ_BYTES_DEFAULT = 8 * 1024 * 1024
READ_BYTES_MAX = 64 * 1024 * 1024
ARROW_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
NEXT_OFFSET_HEADER = "X-Magnetar-Next-Offset"
FIRST_OFFSET_HEADER = "X-Magnetar-First-Offset"

_TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")
_PROPERTIES = pa.map_(pa.string(), pa.string())
ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("messageId", pa.string()),
    pa.field("publishTime", _TIMESTAMP_MS),
    pa.field("eventTime", _TIMESTAMP_MS),
    pa.field("properties", _PROPERTIES),
])
"""The columns of an Arrow range read; the Spark source's schema, with times in milliseconds."""

_BATCH_INDEX_TAG = b"\x20"  # MessageIdData field 4 (batch_index), varint


@dataclass
class ReadColumns:
    """Messages collected column by column (no per-message objects survive the loop)."""

    first_offset: int
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    message_ids: list[bytes] = field(default_factory=list)
    """ASCII base64, kept as bytes (Arrow takes them as strings without a decode each)."""
    publish_times_ms: list[int] = field(default_factory=list)
    event_times_ms: list[int | None] = field(default_factory=list)
    property_offsets: list[int] = field(default_factory=lambda: [0])
    property_keys: list[str] = field(default_factory=list)
    property_values: list[str] = field(default_factory=list)
    size_bytes: int = 0

    def __len__(self) -> int:
        return len(self.values)

    @property
    def next_offset(self) -> int:
        return self.first_offset + len(self.values)


_BATCH_INDEX_SUFFIXES: list[bytes] = []
"""``MessageIdData`` field 4 (batch_index) for index ``i``, built once per index ever needed."""


def _batch_index_suffixes(stop: int) -> list[bytes]:
    suffixes = _BATCH_INDEX_SUFFIXES
    if len(suffixes) < stop:  # appends only: a concurrent reader sees a valid prefix of the table
        suffixes.extend(_BATCH_INDEX_TAG + encode_varint(i) for i in range(len(suffixes), stop))
    return suffixes


def message_ids_of_entry(ledger_id: int, entry_id: int, partition: int, count: int, start: int = 0,
                         stop: int | None = None) -> list[bytes]:
    """Base64 ``MessageIdData`` (ASCII bytes) of messages ``start..stop`` of one entry of ``count``
    messages, equal to ``MessageId.to_base64()``.

    The entry's fields are serialized once; batch index is the last field written, so each
    message's id is that prefix plus its batch index (a lone message has none, as in Pulsar).
    """
    prefix = MessageId(ledger_id, entry_id, partition).to_bytes()
    if count == 1:
        return [binascii.b2a_base64(prefix, newline=False)]
    stop = count if stop is None else stop
    b2a = binascii.b2a_base64
    return [b2a(prefix + suffix, newline=False) for suffix in _batch_index_suffixes(stop)[start:stop]]


def _key_bytes(key: str | None, b64_encoded: bool) -> bytes | None:
    if key is None:
        return None
    return base64.b64decode(key) if b64_encoded else key.encode()


_PAYLOAD = operator.itemgetter(2)
_KEY = operator.itemgetter(3)
_PROPERTIES_OF = operator.itemgetter(4)
_EVENT_TIME = operator.itemgetter(5)


def _add_entry(columns: ReadColumns, entry: Entry, partition: int, skip: int, take: int) -> None:
    """Append messages ``skip..skip+take`` of ``entry``, a column at a time."""
    decoded = decode_entry(entry.data)
    messages = decoded.messages[skip:skip + take]
    count = len(messages)
    columns.message_ids.extend(message_ids_of_entry(entry.position.ledger_id, entry.position.entry_id, partition,
                                                    decoded.num_messages, skip, skip + count))
    columns.publish_times_ms.extend(itertools.repeat(entry.publish_time_ms, count))
    payloads = list(map(_PAYLOAD, messages))
    columns.values.extend(payloads)
    columns.size_bytes += sum(map(len, payloads))
    columns.event_times_ms.extend(map(_EVENT_TIME, messages))
    if any(map(_KEY, messages)):
        columns.keys.extend(_key_bytes(m.key, m.key_b64_encoded) for m in messages)
    else:
        columns.keys.extend(itertools.repeat(None, count))
    if any(map(_PROPERTIES_OF, messages)):
        for message in messages:
            columns.property_keys.extend(message.properties.keys())
            columns.property_values.extend(message.properties.values())
            columns.property_offsets.append(len(columns.property_keys))
    else:
        columns.property_offsets.extend(itertools.repeat(len(columns.property_keys), count))


def _entries(topic: PersistentTopic, offset: int) -> Iterator[Entry]:
    """``entries_from`` with a trim racing the read reported as the data loss it is."""
    ml = topic.ml
    try:
        yield from topic.entries_from(offset)
    except (NoSuchEntry, NoSuchLedger) as exc:
        if offset < ml.first_offset:
            raise _data_lost(topic.name, offset, ml) from exc
        raise


def _data_lost(name: TopicName, offset: int, ml: ManagedLedger) -> DataLost:
    return DataLost(f"offset {offset} of {name} was removed by retention; "
                    f"the first available offset is {ml.first_offset}")


def collect(topic: PersistentTopic, offset: int, max_messages: int, max_bytes: int) -> ReadColumns:
    """Up to ``max_messages`` messages from ``offset`` on, stopping once ``max_bytes`` of payload
    are collected. Raises ``DataLost`` when ``offset`` was trimmed."""
    ml = topic.ml
    if offset < ml.first_offset:
        raise _data_lost(topic.name, offset, ml)
    columns = ReadColumns(first_offset=offset)
    for entry in _entries(topic, offset):
        skip = max(0, offset - entry.first_offset)
        take = min(entry.message_count - skip, max_messages - len(columns))
        _add_entry(columns, entry, topic.partition, skip, take)
        if len(columns) >= max_messages or columns.size_bytes >= max_bytes:
            break
    return columns


def to_record_batch(columns: ReadColumns, topic_name: str, partition: int) -> pa.RecordBatch:
    count = len(columns)
    properties = pa.MapArray.from_arrays(pa.array(columns.property_offsets, pa.int32()),
                                         pa.array(columns.property_keys, pa.string()),
                                         pa.array(columns.property_values, pa.string()))
    arrays = [
        pa.array(columns.keys, pa.binary()),
        pa.array(columns.values, pa.binary()),
        pa.repeat(pa.scalar(topic_name, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.array(range(columns.first_offset, columns.next_offset), pa.int64()),
        pa.array(columns.message_ids, pa.string()),
        pa.array(columns.publish_times_ms, _TIMESTAMP_MS),
        pa.array(columns.event_times_ms, _TIMESTAMP_MS),
        properties.cast(_PROPERTIES),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def arrow_stream(batch: pa.RecordBatch | None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ARROW_SCHEMA) as writer:
        if batch is not None and batch.num_rows:
            writer.write_batch(batch)
    stream: bytes = sink.getvalue().to_pybytes()
    return stream


def to_json(columns: ReadColumns) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    starts, ends = columns.property_offsets[:-1], columns.property_offsets[1:]
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        key = columns.keys[i]
        event_time_ms = columns.event_times_ms[i]
        message: dict[str, Any] = {
            "offset": columns.first_offset + i,
            "messageId": columns.message_ids[i].decode("ascii"),
            "payload": base64.b64encode(columns.values[i]).decode("ascii"),
            "properties": dict(zip(columns.property_keys[start:end], columns.property_values[start:end],
                                   strict=True)),
            "publishTime": columns.publish_times_ms[i],
        }
        if key is not None:
            message["key"] = key.decode(errors="replace")
        if event_time_ms is not None:
            message["eventTime"] = event_time_ms
        messages.append(message)
    return messages


def _wants_arrow(request: Request) -> bool:
    return ARROW_STREAM_MEDIA_TYPE in request.headers.get("accept", "")


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(tags=["read"])

    def readable(name: TopicName) -> PersistentTopic | None:
        """The topic to read; None for a partition that exists but was never written."""
        if name.partition_index < 0 and service.partitions(name) > 0:
            raise InvalidRequest(f"{name} is a partitioned topic; read one partition: "
                                 f".../{name.local_name}/partitions/{{n}}/messages")
        if service.topic_exists(name):
            return service.topic(name, create=False)
        if 0 <= name.partition_index < service.partitions(name.base):
            return None
        raise NotFound(f"topic {name} does not exist")

    def read(name: TopicName, offset: int, max_messages: int, max_bytes: int, request: Request) -> Response:
        topic = readable(name)
        partition = name.partition_index
        if topic is None:
            return _read_response(request, ReadColumns(offset), name.full_name, partition, 0)
        columns = collect(topic, offset, max_messages, max_bytes)
        return _read_response(request, columns, name.full_name, partition, topic.ml.first_offset)

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/messages",
                summary="Read messages by offset (Arrow IPC stream or JSON)")
    def read_topic(tenant: str, namespace: str, topic: str, request: Request, caller: Caller,
                   offset: Annotated[int, Query(ge=0)],
                   maxMessages: Annotated[int, Query(ge=1, le=READ_MESSAGES_MAX)] = READ_MESSAGES_DEFAULT,  # noqa: N803
                   maxBytes: Annotated[int, Query(ge=1, le=READ_BYTES_MAX)] = READ_BYTES_DEFAULT,  # noqa: N803
                   ) -> Response:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        return read(name, offset, maxMessages, maxBytes, request)

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/partitions/{partition}/messages",
                summary="Read messages of one partition by offset (Arrow IPC stream or JSON)")
    def read_partition(tenant: str, namespace: str, topic: str, partition: int, request: Request, caller: Caller,
                       offset: Annotated[int, Query(ge=0)],
                       maxMessages: Annotated[int, Query(ge=1, le=READ_MESSAGES_MAX)] = READ_MESSAGES_DEFAULT,  # noqa: N803
                       maxBytes: Annotated[int, Query(ge=1, le=READ_BYTES_MAX)] = READ_BYTES_DEFAULT,  # noqa: N803
                       ) -> Response:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        return read(_partition_of(service, name, partition), offset, maxMessages, maxBytes, request)

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/offsets",
                summary="First, next and by-timestamp offsets of every partition")
    def offsets(tenant: str, namespace: str, topic: str, caller: Caller,
                timestamp: Annotated[int | None, Query(ge=0)] = None) -> dict[str, Any]:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        count = service.partitions(name) if name.partition_index < 0 else 0
        partitions = [name.partition(i) for i in range(count)] if count else [name]
        if not count and not service.topic_exists(name):
            raise NotFound(f"topic {name} does not exist")
        return {"partitions": count,
                "offsets": {p.full_name: _offsets_of(service, p, timestamp) for p in partitions}}

    return routes


def _partition_of(service: BrokerService, name: TopicName, partition: int) -> TopicName:
    """Partition ``partition`` of ``name``; partition 0 of an unpartitioned topic is the topic (as
    REST produce has it)."""
    count = service.partitions(name)
    if partition < 0 or partition >= max(count, 1):
        raise InvalidRequest(f"{name} has no partition {partition}")
    return name.partition(partition) if count else name


def _offsets_of(service: BrokerService, name: TopicName, timestamp_ms: int | None) -> dict[str, int]:
    if not service.topic_exists(name):  # a partition nobody wrote to yet
        found = {"first": 0, "next": 0}
        return found if timestamp_ms is None else {**found, "atTimestamp": 0}
    ml = service.topic(name, create=False).ml
    found = {"first": ml.first_offset, "next": ml.confirmed_next_offset()}
    return found if timestamp_ms is None else {**found, "atTimestamp": ml.time_to_offset(timestamp_ms)}


def _read_response(request: Request, columns: ReadColumns, topic_name: str, partition: int,
                   first_offset: int) -> Response:
    headers = {NEXT_OFFSET_HEADER: str(columns.next_offset), FIRST_OFFSET_HEADER: str(first_offset)}
    if _wants_arrow(request):
        batch = to_record_batch(columns, topic_name, partition) if len(columns) else None
        return Response(arrow_stream(batch), media_type=ARROW_STREAM_MEDIA_TYPE, headers=headers)
    return JSONResponse({"messages": to_json(columns), "nextOffset": columns.next_offset,
                         "firstOffset": first_offset}, headers=headers)
