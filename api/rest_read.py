"""Range reads over HTTP (a Magnetar extension; Pulsar has none): messages by offset, and offsets.

Role: the read edge for batch and stream processors, above all the Spark source
(``consumers/spark/source.py``). A client asks for the messages of one topic partition from an offset
on and gets them in offset order, either as an Arrow IPC stream (``Accept:
application/vnd.apache.arrow.stream``) whose columns are the Spark source's, or as JSON:

- ``GET /topics/persistent/{tenant}/{namespace}/{topic}/messages?offset=N&maxMessages=M&maxBytes=B``
  (and ``.../partitions/{n}/messages``): at most ``M`` messages with offset ``>= N``, stopping
  once the answer holds about ``B`` bytes (payloads plus a per-message allowance for the other
  columns, larger for JSON, whose payloads are base64), and never more than the broker's
  ``read_response_bytes_max`` (``api/limits.py``); always at least one message when any exists.
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
``READ_MESSAGES_MAX`` messages and ``read_response_bytes_max`` bytes. Message ids are Pulsar's
base64 ``MessageIdData``, as on the WebSocket API. Times are epoch milliseconds (UTC). A message
without a key has a null key; an empty key is an empty key.

Columns: :func:`collect` builds a read's columns in one of two ways with the same result (the
same ``ARROW_SCHEMA``, values and nulls, and ``CorruptEntry`` for the same bytes). The
reference is :class:`ReadColumns`, in Python over ``decode_entry``. When the optional C
extension ``api/_range_columns.c`` was built (``pip install`` with a C compiler),
:class:`NativeColumns` takes each entry's verified, decompressed payload
(``decode_entry_payload``) straight into Arrow buffers, and hands the rare entry it cannot take
exactly (not batched, a key marked base64 that is not canonical base64, ...) to the reference
decoder. ``NATIVE_COLUMNS`` says which one serves reads. JSON answers are rendered from the same
record batch as Arrow answers.

Storage: a read takes entries from the managed ledger in steps of ``READ_STEP_BYTES``; the
managed ledger finds the entry holding the first offset (without reading anything when a read
goes on where the last one stopped, as the Spark source's chunks do).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import pyarrow as pa
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from api.auth import Action, Authorizer, Caller
from api.limits import EdgeLimits
from broker.entry_format import DecodedEntry, decode_entry, decode_entry_payload, encode_varint, split_entry_payload
from broker.errors import CorruptEntry, DataLost, InvalidRequest, NoSuchEntry, NoSuchLedger, NotFound
from broker.managed_ledger import Entry, ManagedLedger
from broker.message_id import message_id_bytes
from broker.service import BrokerService
from broker.topic import PersistentTopic
from broker.topic_name import TopicName

try:
    from api._range_columns import MalformedBatch, RangeColumns
except ImportError:  # installed without a C compiler: the Python columns serve every read
    NATIVE_COLUMNS = False
else:
    NATIVE_COLUMNS = True
"""Whether range reads build their columns with the native accelerator (``api/_range_columns.c``)."""

READ_MESSAGES_DEFAULT = 1000
READ_MESSAGES_MAX = 100_000
READ_BYTES_DEFAULT = 8 * 1024 * 1024
READ_BYTES_MAX = 64 * 1024 * 1024
READ_STEP_BYTES = 1024 * 1024
ARROW_MESSAGE_OVERHEAD_BYTES = 64
"""What a message costs an Arrow answer besides its payload (offset, id, times, key, properties)."""
JSON_MESSAGE_OVERHEAD_BYTES = 512
"""What a message costs a JSON answer besides its base64 payload, while the answer is built."""
OFFSET_MAX = (1 << 63) - 1
"""Offsets and timestamps are 64-bit signed, as Kafka's and Pulsar's are; larger ones are a 400."""
"""Entries read from storage per step, by size: a read stops once it has its messages, and the
rest of its last step was read for nothing, so steps stay small."""
READ_STEP_ENTRIES_MAX = 1000
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


class Columns(Protocol):
    """The messages of one read, column by column (no per-message objects survive a read)."""

    first_offset: int

    def __len__(self) -> int: ...

    @property
    def size_bytes(self) -> int:
        """Payload bytes collected so far (what ``maxBytes`` bounds)."""
        ...

    def add_entry(self, entry: Entry, partition: int, skip: int, take: int) -> None:
        """Append messages ``skip..skip+take`` of ``entry`` (fewer when the entry holds fewer)."""

    def record_batch(self, topic_name: str, partition: int) -> pa.RecordBatch:
        """The columns as one ``ARROW_SCHEMA`` batch; call once, after the last ``add_entry``."""
        ...


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
    prefix = message_id_bytes(ledger_id, entry_id, partition)
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


@dataclass
class ReadColumns:
    """The reference columns: every entry decoded by ``decode_entry``, kept as Python lists."""

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

    def add_entry(self, entry: Entry, partition: int, skip: int, take: int) -> None:
        """Append messages ``skip..skip+take`` of ``entry``, a column at a time."""
        decoded = decode_entry(entry.data)
        messages = decoded.messages[skip:skip + take]
        count = len(messages)
        self.message_ids.extend(message_ids_of_entry(entry.position.ledger_id, entry.position.entry_id, partition,
                                                     decoded.num_messages, skip, skip + count))
        self.publish_times_ms.extend(itertools.repeat(entry.publish_time_ms, count))
        payloads = list(map(_PAYLOAD, messages))
        self.values.extend(payloads)
        self.size_bytes += sum(map(len, payloads))
        self.event_times_ms.extend(map(_EVENT_TIME, messages))
        if any(key is not None for key in map(_KEY, messages)):
            self.keys.extend(_key_bytes(m.key, m.key_b64_encoded) for m in messages)
        else:
            self.keys.extend(itertools.repeat(None, count))
        if any(map(_PROPERTIES_OF, messages)):
            for message in messages:
                self.property_keys.extend(message.properties.keys())
                self.property_values.extend(message.properties.values())
                self.property_offsets.append(len(self.property_keys))
        else:
            self.property_offsets.extend(itertools.repeat(len(self.property_keys), count))

    def record_batch(self, topic_name: str, partition: int) -> pa.RecordBatch:
        count = len(self)
        properties = pa.MapArray.from_arrays(pa.array(self.property_offsets, pa.int32()),
                                             pa.array(self.property_keys, pa.string()),
                                             pa.array(self.property_values, pa.string()))
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(topic_name, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            pa.array(range(self.first_offset, self.first_offset + count), pa.int64()),
            pa.array(self.message_ids, pa.string()),
            pa.array(self.publish_times_ms, _TIMESTAMP_MS),
            pa.array(self.event_times_ms, _TIMESTAMP_MS),
            properties.cast(_PROPERTIES),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


class NativeColumns:
    """Columns built by ``api/_range_columns.c``: each entry's batch payload goes straight into
    Arrow buffers, wrapped without a copy. An entry the extension cannot take exactly is decoded
    by ``decode_entry`` and appended row by row, so the result is always the reference's."""

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self._columns = RangeColumns(first_offset)
        self.decoded_entries = 0
        """Entries split into messages in Python (not batched, or beyond the extension's rules)."""

    def __len__(self) -> int:
        return self._columns.rows

    @property
    def size_bytes(self) -> int:
        return self._columns.value_bytes

    def add_entry(self, entry: Entry, partition: int, skip: int, take: int) -> None:
        verified = decode_entry_payload(entry.data)
        count = verified.num_messages
        skip = min(skip, count)
        take = min(take, count - skip)  # as slicing the decoded messages would
        if verified.is_batched:
            id_prefix = message_id_bytes(entry.position.ledger_id, entry.position.entry_id, partition)
            try:
                if self._columns.add_batch(verified.payload, count, skip, take, entry.publish_time_ms, id_prefix):
                    return
            except MalformedBatch as exc:
                raise CorruptEntry(str(exc)) from None
        self._add_decoded(entry, split_entry_payload(verified), partition, skip, take)

    def _add_decoded(self, entry: Entry, decoded: DecodedEntry, partition: int, skip: int, take: int) -> None:
        self.decoded_entries += 1
        messages = decoded.messages[skip:skip + take]
        ids = message_ids_of_entry(entry.position.ledger_id, entry.position.entry_id, partition,
                                   decoded.num_messages, skip, skip + len(messages))
        for message, message_id in zip(messages, ids, strict=True):
            self._columns.add_row(_key_bytes(message.key, message.key_b64_encoded), message.payload,
                                  entry.publish_time_ms, message.event_time_ms, message.properties, message_id)

    def record_batch(self, topic_name: str, partition: int) -> pa.RecordBatch:
        columns = self._columns
        count, property_count = columns.rows, columns.property_count
        key_nulls, event_time_nulls = columns.key_null_count, columns.event_time_null_count
        buffers = {name: None if data is None else pa.py_buffer(data) for name, data in columns.finish().items()}

        def array(kind: pa.DataType, length: int, *names: str | None, null_count: int = 0,
                  children: list[pa.Array] | None = None) -> pa.Array:
            """An array over the named buffers (None: no validity bitmap)."""
            return pa.Array.from_buffers(kind, length, [None if n is None else buffers[n] for n in names],
                                         null_count=null_count, children=children)

        entries = pa.StructArray.from_arrays(
            [array(pa.string(), property_count, None, "property_name_offsets", "property_name_data"),
             array(pa.string(), property_count, None, "property_value_offsets", "property_value_data")],
            fields=[_PROPERTIES.key_field, _PROPERTIES.item_field])
        arrays = [
            array(pa.binary(), count, "key_validity", "key_offsets", "key_data", null_count=key_nulls),
            array(pa.binary(), count, None, "value_offsets", "value_data"),
            pa.repeat(pa.scalar(topic_name, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            array(pa.int64(), count, None, "offsets"),
            array(pa.string(), count, None, "message_id_offsets", "message_id_data"),
            array(_TIMESTAMP_MS, count, None, "publish_times_ms"),
            array(_TIMESTAMP_MS, count, "event_time_validity", "event_times_ms", null_count=event_time_nulls),
            array(_PROPERTIES, count, None, "property_offsets", children=[entries]),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def new_columns(first_offset: int, *, native: bool = NATIVE_COLUMNS) -> Columns:
    """Empty columns for a read from ``first_offset``: native when asked for and built."""
    if native and not NATIVE_COLUMNS:
        raise RuntimeError("the native range-read columns (api/_range_columns.c) were not built")
    return NativeColumns(first_offset) if native else ReadColumns(first_offset)


def _entries(topic: PersistentTopic, offset: int) -> Iterator[Entry]:
    """Every confirmed entry from the one holding ``offset`` on, read in steps of about
    ``READ_STEP_BYTES``; a trim racing the read is reported as the data loss it is."""
    try:
        yield from topic.entries_from(offset, step_entries=READ_STEP_ENTRIES_MAX, step_bytes=READ_STEP_BYTES)
    except (NoSuchEntry, NoSuchLedger) as exc:
        if offset < topic.ml.first_offset:
            raise _data_lost(topic.name, offset, topic.ml) from exc
        raise


def _data_lost(name: TopicName, offset: int, ml: ManagedLedger) -> DataLost:
    return DataLost(f"offset {offset} of {name} was removed by retention; "
                    f"the first available offset is {ml.first_offset}")


def collect_entries(entries: Iterable[Entry], offset: int, partition: int, max_messages: int, max_bytes: int, *,
                    message_overhead_bytes: int = 0, native: bool = NATIVE_COLUMNS) -> Columns:
    """Up to ``max_messages`` messages from ``offset`` on out of ``entries`` (in order, the first
    holding ``offset``), stopping once their payloads plus ``message_overhead_bytes`` each
    reach ``max_bytes`` (a batch entry is taken in part when the whole would pass the bound)."""
    columns = new_columns(offset, native=native)
    for entry in entries:
        skip = max(0, offset - entry.first_offset)
        used = columns.size_bytes + len(columns) * message_overhead_bytes
        per_message = len(entry.data) // max(entry.message_count, 1) + message_overhead_bytes
        affordable = max(1, (max_bytes - used) // max(per_message, 1))
        take = min(entry.message_count - skip, max_messages - len(columns), affordable)
        columns.add_entry(entry, partition, skip, take)
        used = columns.size_bytes + len(columns) * message_overhead_bytes
        if len(columns) >= max_messages or used >= max_bytes or take < entry.message_count - skip:
            break
    return columns


def collect(topic: PersistentTopic, offset: int, max_messages: int, max_bytes: int, *,
            message_overhead_bytes: int = 0, native: bool = NATIVE_COLUMNS) -> Columns:
    """Up to ``max_messages`` messages from ``offset`` on, within ``max_bytes`` (see
    :func:`collect_entries`). Raises ``DataLost`` when ``offset`` was trimmed."""
    ml = topic.ml
    if offset < ml.first_offset:
        raise _data_lost(topic.name, offset, ml)
    return collect_entries(_entries(topic, offset), offset, topic.partition, max_messages, max_bytes,
                           message_overhead_bytes=message_overhead_bytes, native=native)


def arrow_stream(batch: pa.RecordBatch) -> memoryview:
    """The IPC stream of ``batch`` (the schema alone when it is empty), as a view of Arrow's
    buffer: the response body is written from it without another copy."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ARROW_SCHEMA) as writer:
        if batch.num_rows:
            writer.write_batch(batch)
    return memoryview(sink.getvalue())


def _epoch_ms(column: pa.Array) -> list[int | None]:
    values: list[int | None] = column.cast(pa.int64()).to_pylist()
    return values


def to_json(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The messages of a read batch as the JSON answer lists them."""
    messages: list[dict[str, Any]] = []
    columns = zip(batch.column("offset").to_pylist(), batch.column("messageId").to_pylist(),
                  batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                  batch.column("properties").to_pylist(), _epoch_ms(batch.column("publishTime")),
                  _epoch_ms(batch.column("eventTime")), strict=True)
    for offset, message_id, key, value, properties, publish_time_ms, event_time_ms in columns:
        message: dict[str, Any] = {
            "offset": offset,
            "messageId": message_id,
            "payload": base64.b64encode(value).decode("ascii"),
            "properties": dict(properties),
            "publishTime": publish_time_ms,
        }
        if key is not None:
            message["key"] = key.decode(errors="replace")
        if event_time_ms is not None:
            message["eventTime"] = event_time_ms
        messages.append(message)
    return messages


def _wants_arrow(request: Request) -> bool:
    return ARROW_STREAM_MEDIA_TYPE in request.headers.get("accept", "")


def router(service: BrokerService, authorizer: Authorizer, limits: EdgeLimits) -> APIRouter:
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
        budget = min(max_bytes, limits.read_response_bytes_max)
        if _wants_arrow(request):
            columns = collect(topic, offset, max_messages, budget, message_overhead_bytes=ARROW_MESSAGE_OVERHEAD_BYTES)
        else:  # base64 makes payloads a third larger
            columns = collect(topic, offset, max_messages, budget * 3 // 4,
                              message_overhead_bytes=JSON_MESSAGE_OVERHEAD_BYTES)
        return _read_response(request, columns, name.full_name, partition, topic.ml.first_offset)

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/messages",
                summary="Read messages by offset (Arrow IPC stream or JSON)")
    def read_topic(tenant: str, namespace: str, topic: str, request: Request, caller: Caller,
                   offset: Annotated[int, Query(ge=0, le=OFFSET_MAX)],
                   maxMessages: Annotated[int, Query(ge=1, le=READ_MESSAGES_MAX)] = READ_MESSAGES_DEFAULT,  # noqa: N803
                   maxBytes: Annotated[int, Query(ge=1, le=READ_BYTES_MAX)] = READ_BYTES_DEFAULT,  # noqa: N803
                   ) -> Response:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        return read(name, offset, maxMessages, maxBytes, request)

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/partitions/{partition}/messages",
                summary="Read messages of one partition by offset (Arrow IPC stream or JSON)")
    def read_partition(tenant: str, namespace: str, topic: str, partition: int, request: Request, caller: Caller,
                       offset: Annotated[int, Query(ge=0, le=OFFSET_MAX)],
                       maxMessages: Annotated[int, Query(ge=1, le=READ_MESSAGES_MAX)] = READ_MESSAGES_DEFAULT,  # noqa: N803
                       maxBytes: Annotated[int, Query(ge=1, le=READ_BYTES_MAX)] = READ_BYTES_DEFAULT,  # noqa: N803
                       ) -> Response:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        return read(_partition_of(service, name, partition), offset, maxMessages, maxBytes, request)

    @routes.get("/topics/persistent/{tenant}/{namespace}/{topic}/offsets",
                summary="First, next and by-timestamp offsets of every partition")
    def offsets(tenant: str, namespace: str, topic: str, caller: Caller,
                timestamp: Annotated[int | None, Query(ge=0, le=OFFSET_MAX)] = None) -> dict[str, Any]:
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


def _read_response(request: Request, columns: Columns, topic_name: str, partition: int,
                   first_offset: int) -> Response:
    next_offset = columns.first_offset + len(columns)
    headers = {NEXT_OFFSET_HEADER: str(next_offset), FIRST_OFFSET_HEADER: str(first_offset)}
    batch = columns.record_batch(topic_name, partition)
    if _wants_arrow(request):
        return Response(arrow_stream(batch), media_type=ARROW_STREAM_MEDIA_TYPE, headers=headers)
    return JSONResponse({"messages": to_json(batch), "nextOffset": next_offset, "firstOffset": first_offset},
                        headers=headers)
