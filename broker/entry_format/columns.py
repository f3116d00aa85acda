"""Range-read columns: the messages of consecutive entries as one Arrow record batch.

Role: a range read (``broker/range_read.py``) hands the entries that hold the offsets asked for
to :func:`collect_entries`, which appends them column by column (the Spark source's schema,
``ARROW_SCHEMA``) within a message count and a byte budget. Two builders give the same result
(the same values and nulls, and ``CorruptEntry`` for the same bytes): :class:`ReadColumns`, the
reference, in Python over ``decode_entry``; and, when the optional C extension
``_range_columns.c`` was built (``pip install`` with a C compiler), :class:`NativeColumns`,
which takes each entry's verified, decompressed payload (``decode_entry_payload``) straight
into Arrow buffers and hands the rare entry it cannot take exactly (not batched, a key marked
base64 that is not canonical, ...) to the reference decoder. ``NATIVE_COLUMNS`` says which one
serves reads.

Invariant: offsets are gap-free, so the ``offset`` column is ``first_offset, first_offset + 1,
...``; at least one message is taken when any is offered, whatever the byte budget. An
end-to-end encrypted entry is opaque (``model.py``): its first row holds the stored ciphertext,
the rows it carries none; ``encrypted`` and ``carried`` name those rows' offsets for the edges
that show such an entry as one message.
"""

from __future__ import annotations

import base64
import itertools
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from broker.entry_format.common_entry import common_batch_of_bytes, common_batch_payload
from broker.entry_format.decode import decode_entry, decode_entry_payload
from broker.entry_format.model import DecodedEntry, EncryptionContext
from broker.entry_format.wire import INT64_MAX
from broker.errors import CorruptEntry
from broker.message_id import Position, message_id_bytes, message_ids_of_entry

try:
    from broker.entry_format._range_columns import MalformedBatch, RangeColumns
except ImportError:  # installed without a C compiler: the Python columns serve every read
    NATIVE_COLUMNS = False
else:
    NATIVE_COLUMNS = True
"""Whether range reads build their columns with the native accelerator (``_range_columns.c``)."""


class StoredEntry(Protocol):
    """What the columns need of an entry read from a managed ledger."""

    @property
    def position(self) -> Position: ...
    @property
    def data(self) -> bytes: ...
    @property
    def first_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def publish_time_ms(self) -> int: ...
    @property
    def message_count(self) -> int: ...


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



class Columns(Protocol):
    """The messages of one read, column by column (no per-message objects survive a read)."""

    first_offset: int
    encrypted: dict[int, EncryptionContext]
    """The offset of each row holding an encrypted entry's payload, with its context."""
    carried: set[int]
    """The offsets of the rows an encrypted entry's first message carries (no payload)."""

    def __len__(self) -> int: ...

    @property
    def size_bytes(self) -> int:
        """Payload bytes collected so far (what ``maxBytes`` bounds)."""
        ...

    def add_rows_of(self, entry: StoredEntry, partition: int, skip: int, take: int) -> None:
        """Append messages ``skip..skip+take`` of ``entry`` (fewer when the entry holds fewer)."""

    def record_batch(self, topic_name: str, partition: int) -> pa.RecordBatch:
        """The columns as one ``ARROW_SCHEMA`` batch; call once, after the last ``add_rows_of``."""
        ...


def _note_encrypted(columns: Columns, decoded: DecodedEntry, first_offset: int, skip: int, count: int) -> None:
    """Name the rows ``skip..skip+count`` of the encrypted entry ``decoded`` in ``columns``."""
    if decoded.encryption is None or not count:
        return
    if skip == 0:
        columns.encrypted[first_offset] = decoded.encryption
    columns.carried.update(range(first_offset + max(skip, 1), first_offset + skip + count))


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
    encrypted: dict[int, EncryptionContext] = field(default_factory=dict)
    carried: set[int] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.values)

    def add_rows_of(self, entry: StoredEntry, partition: int, skip: int, take: int) -> None:
        """Append messages ``skip..skip+take`` of ``entry``, a column at a time."""
        decoded = decode_entry(entry.data)
        messages = decoded.messages[skip:skip + take]
        count = len(messages)
        _note_encrypted(self, decoded, entry.first_offset, skip, count)
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
    """Columns built by ``_range_columns.c``: each entry's batch payload goes straight into
    Arrow buffers, wrapped without a copy. An entry the extension cannot take exactly is decoded
    by ``decode_entry`` and appended row by row, so the result is always the reference's."""

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self._columns = RangeColumns(first_offset)
        self.encrypted: dict[int, EncryptionContext] = {}
        self.carried: set[int] = set()
        self.decoded_entries = 0
        """Entries split into messages in Python (not batched, or beyond the extension's rules)."""
        self.handed_back = 0
        """Entries ``add_entries`` left to Python (not a common uncompressed batch, or beyond the
        extension's rules)."""

    def __len__(self) -> int:
        return self._columns.rows

    @property
    def size_bytes(self) -> int:
        return self._columns.value_bytes

    def add_rows_of(self, entry: StoredEntry, partition: int, skip: int, take: int) -> None:
        common = common_batch_payload(entry.data)  # the broker's usual entry, verified without protobuf
        payload: bytes | memoryview
        if common is not None:
            payload, count = common
            is_batched = True
        else:
            verified = decode_entry_payload(entry.data)
            payload, count, is_batched = verified.payload, verified.num_messages, verified.is_batched
            is_batched = is_batched and verified.encryption is None  # an encrypted payload is not split
        skip = min(skip, count)
        take = min(take, count - skip)  # as slicing the decoded messages would
        if is_batched:
            id_prefix = message_id_bytes(entry.position.ledger_id, entry.position.entry_id, partition)
            try:
                if self._columns.add_batch(payload, count, skip, take, entry.publish_time_ms, id_prefix):
                    return
            except MalformedBatch as exc:
                raise CorruptEntry(str(exc)) from None
        self._add_decoded(entry, decode_entry(entry.data), partition, skip, take)

    def add_entries(self, entries: Iterator[StoredEntry], offset: int, partition: int, max_messages: int,
                    max_bytes: int, message_overhead_bytes: int) -> tuple[StoredEntry, int, int] | None:
        """:func:`collect_entries`' loop in C while each entry is a common batch the extension
        takes: None when the read is done, else the entry (with its skip and take) to append here."""
        try:
            left = self._columns.add_entries(entries, offset, partition, max_messages, max_bytes,
                                             message_overhead_bytes, common_batch_of_bytes)
        except MalformedBatch as exc:
            raise CorruptEntry(str(exc)) from None
        self.handed_back += left is not None
        return left

    def _add_decoded(self, entry: StoredEntry, decoded: DecodedEntry, partition: int, skip: int, take: int) -> None:
        self.decoded_entries += 1
        messages = decoded.messages[skip:skip + take]
        _note_encrypted(self, decoded, entry.first_offset, skip, len(messages))
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
        raise RuntimeError("the native range-read columns (broker/entry_format/_range_columns.c) were not built")
    return NativeColumns(first_offset) if native else ReadColumns(first_offset)



_INT32_MAX = (1 << 31) - 1
"""``add_entries`` takes bounds as 64-bit integers (larger ones, which no read reaches, are cut to
``INT64_MAX``) and an overhead up to this (others, never asked for, take the Python loop)."""


def collect_entries(entries: Iterable[StoredEntry], offset: int, partition: int, max_messages: int, max_bytes: int, *,
                    message_overhead_bytes: int = 0, native: bool = NATIVE_COLUMNS) -> Columns:
    """Up to ``max_messages`` messages from ``offset`` on out of ``entries`` (in order, the first
    holding ``offset``), stopping once their payloads plus ``message_overhead_bytes`` each
    reach ``max_bytes`` (a batch entry is taken in part when the whole would pass the bound).
    Native columns run this loop in ``_range_columns.c`` (``add_entries``), handing back only
    the entries they cannot take."""
    columns = new_columns(offset, native=native)
    entries = iter(entries)
    if isinstance(columns, NativeColumns) and 0 <= message_overhead_bytes <= _INT32_MAX:
        max_messages, max_bytes = min(max_messages, INT64_MAX), min(max_bytes, INT64_MAX)
        while (left := columns.add_entries(entries, offset, partition, max_messages, max_bytes,
                                           message_overhead_bytes)) is not None:
            entry, skip, take = left
            if not _add_and_go_on(columns, entry, partition, skip, take, max_messages, max_bytes,
                                  message_overhead_bytes):
                break
        return columns
    for entry in entries:  # the hot loop of a range read: each value worked out once an entry
        count = entry.message_count
        skip = max(offset - entry.first_offset, 0)
        used = columns.size_bytes + len(columns) * message_overhead_bytes
        per_message = len(entry.data) // (count or 1) + message_overhead_bytes
        affordable = (max_bytes - used) // (per_message or 1)
        take = min(count - skip, max_messages - len(columns), affordable if affordable > 1 else 1)
        if not _add_and_go_on(columns, entry, partition, skip, take, max_messages, max_bytes, message_overhead_bytes):
            break
    return columns


def _add_and_go_on(columns: Columns, entry: StoredEntry, partition: int, skip: int, take: int, max_messages: int,
                   max_bytes: int, message_overhead_bytes: int) -> bool:
    """Append rows ``skip..skip+take`` of ``entry``; whether the read goes on to the next entry."""
    columns.add_rows_of(entry, partition, skip, take)
    rows = len(columns)
    used = columns.size_bytes + rows * message_overhead_bytes
    return not (rows >= max_messages or used >= max_bytes or take < entry.message_count - skip)
