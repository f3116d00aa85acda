"""Event streams, read side: one key's messages in one topic partition, by version.

Role: what an event-sourced application reads to rebuild one aggregate. The key index
(``broker/key_index/``) names each version's offset and entry, so a read touches only the
entries holding the key's messages, never the rest of the partition:

- :func:`stream_info`: the key's current version, the first version retention kept, and the
  offsets of its first kept and last messages;
- :func:`read_stream`: up to ``max_messages`` versions from a version on, forwards or
  backwards, as the range reads' Arrow columns plus ``keyVersion`` (entries read once each,
  messages taken out by the range reads' column builders);
- :class:`KeyReader`: a live reader of one stream (the WebSocket reader's ``?key=``), which
  reads what is stored from a version on and then follows new appends of its key.

Invariants: a read never changes anything and sees only durable messages; versions come out
dense and in order; a version retention trimmed is ``DataLost`` (410) naming the first version
kept (a live reader instead goes on from it, as Pulsar's readers do after trimming); a key with
no message reads as empty at version -1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from broker.delivery import Delivery
from broker.entry import Entry
from broker.entry_format import DecodedEntry, decode_entry
from broker.entry_format.columns import ARROW_SCHEMA, NATIVE_COLUMNS, new_columns
from broker.errors import DataLost, MagnetarError
from broker.key_index import PartitionKeys, StreamRow
from broker.limits import LIVE_READ_BYTES_MAX, LIVE_READ_VERSIONS_MAX
from broker.message_id import MessageId, Position
from broker.topic import PersistentTopic
from broker.topic_name import TopicName

KEY_VERSION_COLUMN = "keyVersion"
STREAM_SCHEMA = ARROW_SCHEMA.append(pa.field(KEY_VERSION_COLUMN, pa.int64()))
"""A stream read's columns: the range reads' and each message's version."""


@dataclass(frozen=True)
class StreamInfo:
    key: str
    partition: int
    version: int
    """The key's last durable version (-1: no message)."""
    first_version: int
    """The first version retention kept (``version + 1`` when none is kept)."""
    first_offset: int | None
    """The offset of ``first_version`` (None when none is kept)."""
    last_offset: int | None


@dataclass(frozen=True)
class StreamRead:
    info: StreamInfo
    batch: pa.RecordBatch
    """``STREAM_SCHEMA`` columns, in the order read (descending versions when backwards)."""
    next_version: int
    """The version to ask for next in the same direction (-1 backwards: nothing before)."""


def stream_info(topic: PersistentTopic | None, name: TopicName, key: str) -> StreamInfo:
    """Where the stream of ``key`` stands (``topic`` None: a partition nobody wrote to)."""
    keys = _keys_of(topic)
    head = keys.head(key) if keys is not None else None
    if head is None or topic is None or keys is None:
        return StreamInfo(key, name.partition_index, -1, 0, None, None)
    first = keys.first_row_at_or_after(key, topic.ml.first_offset)
    if first is None:
        return StreamInfo(key, name.partition_index, head[0], head[0] + 1, None, None)
    return StreamInfo(key, name.partition_index, head[0], first.version, first.offset, head[1])


def read_stream(topic: PersistentTopic | None, name: TopicName, key: str, from_version: int | None,
                max_messages: int, max_bytes: int, *, backward: bool = False, message_overhead_bytes: int = 0,
                native: bool = NATIVE_COLUMNS) -> StreamRead:
    """Up to ``max_messages`` messages of the stream of ``key`` from ``from_version`` on
    (forwards: default the first kept version; backwards: default the last), stopping once
    their payloads plus ``message_overhead_bytes`` each reach ``max_bytes`` (at least one)."""
    info = stream_info(topic, name, key)
    if backward:
        start = info.version if from_version is None else min(from_version, info.version)
        wanted = (max(info.first_version, start - max_messages + 1), start)
    else:
        start = info.first_version if from_version is None else from_version
        wanted = (start, min(info.version, start + max_messages - 1))
    if 0 <= start <= info.version and start < info.first_version:
        raise DataLost(f"version {start} of key {key!r} in {name} was removed by retention; the first version kept "
                       f"is {info.first_version}", first_version=info.first_version)
    keys = _keys_of(topic)
    rows = keys.rows(key, *wanted) if keys is not None else []
    if not rows:
        return StreamRead(info, _empty_batch(), -1 if backward else start)
    if backward:
        rows.reverse()
    batch, taken = _columns(topic, name, rows, max_bytes, message_overhead_bytes, native)
    return StreamRead(info, batch, rows[taken - 1].version + (-1 if backward else 1))


def _keys_of(topic: PersistentTopic | None) -> PartitionKeys | None:
    return None if topic is None else topic.streams


def _empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=STREAM_SCHEMA)


def _columns(topic: PersistentTopic | None, name: TopicName, rows: list[StreamRow], max_bytes: int,
             overhead_bytes: int, native: bool) -> tuple[pa.RecordBatch, int]:
    """The messages of ``rows`` (in their order) as ``STREAM_SCHEMA`` columns within the byte
    bound; the batch and how many rows it holds. Consecutive messages of one entry are taken
    together; each entry is read once."""
    assert topic is not None
    columns = new_columns(rows[0].offset, native=native)
    partition = name.partition_index
    entry: Entry | None = None
    at = 0
    while at < len(rows):
        row = rows[at]
        if columns.size_bytes + len(columns) * overhead_bytes >= max_bytes and len(columns):
            break
        run = 1
        while at + run < len(rows) and rows[at + run].position == row.position \
                and rows[at + run].offset == row.offset + run:
            run += 1
        if entry is None or entry.position != row.position:
            entry = _read_entry(topic, name, row)
        columns.add_rows_of(entry, partition, row.offset - entry.first_offset, run)
        at += run
    taken = rows[:len(columns)]
    batch = columns.record_batch(name.full_name, partition)
    arrays = [*batch.columns]
    arrays[ARROW_SCHEMA.get_field_index("offset")] = pa.array([r.offset for r in taken], pa.int64())
    arrays.append(pa.array([r.version for r in taken], pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=STREAM_SCHEMA), len(taken)


def _read_entry(topic: PersistentTopic, name: TopicName, row: StreamRow) -> Entry:
    """The entry holding ``row``; a trim racing the read is the data loss it is."""
    try:
        return topic.ml.read_entry(row.position)
    except MagnetarError as exc:
        if row.offset < topic.ml.first_offset:
            raise DataLost(f"version {row.version} of {name} was removed by retention while it was read") from exc
        raise


class KeyReader:
    """A live reader of one key's stream: the stored versions from ``from_version`` on, then
    each new one as it becomes durable. It quacks like ``broker/reader.py``'s ``Reader`` (what
    the WebSocket reader session drives)."""

    def __init__(self, topic: PersistentTopic, key: str, from_version: int) -> None:
        if topic.streams is None:
            raise DataLost(f"{topic.name} keeps no key index")
        self.topic = topic
        self.key = key
        self._keys: PartitionKeys = topic.streams
        info = stream_info(topic, topic.name, key)
        if from_version < info.first_version and from_version <= info.version:
            raise DataLost(f"version {from_version} of key {key!r} in {topic.name} was removed by retention; the "
                           f"first version kept is {info.first_version}", first_version=info.first_version)
        self.next_version = from_version
        self._buffer: deque[Delivery] = deque()
        self._decoded: tuple[Position, Entry, DecodedEntry] | None = None

    def has_message_available(self) -> bool:
        head = self._keys.head(self.key)
        return bool(self._buffer) or (head is not None and head[0] >= self.next_version)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (from any thread) whenever keyed messages of the partition become durable."""
        self._keys.add_listener(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        self._keys.remove_listener(listener)

    def end_of_topic(self) -> bool:
        return self.topic.ml.terminated and not self.has_message_available()

    def peek_next(self) -> Delivery | None:
        if not self._buffer:
            self._fill()
        return self._buffer[0] if self._buffer else None

    def read_next(self) -> Delivery | None:
        if not self._buffer:
            self._fill()
        return self._buffer.popleft() if self._buffer else None

    def close(self) -> None:
        """Drop what was read ahead (the reader is abandoned)."""
        self._buffer.clear()
        self._decoded = None

    def _fill(self) -> None:
        rows = self._keys.rows(self.key, self.next_version, self.next_version + LIVE_READ_VERSIONS_MAX - 1)
        ml = self.topic.ml
        if rows and (rows[0].version != self.next_version or rows[0].offset < ml.first_offset):
            first = self._keys.first_row_at_or_after(self.key, ml.first_offset)  # trimmed while it waited
            self.next_version = first.version if first is not None else rows[-1].version + 1
            rows = [r for r in rows if r.version >= self.next_version]
        buffered = 0
        for row in rows:
            if buffered >= LIVE_READ_BYTES_MAX:
                break
            try:
                entry, decoded = self._entry(row)
            except DataLost:
                break
            message = decoded.messages[row.offset - entry.first_offset]
            single = len(decoded.messages) == 1
            message_id = MessageId(row.position.ledger_id, row.position.entry_id, self.topic.partition,
                                   -1 if single else message.batch_index)
            self._buffer.append(Delivery(message_id, row.offset, message, entry.publish_time_ms, 0,
                                         self.topic.name.full_name, key_version=row.version))
            self.next_version = row.version + 1
            buffered += len(message.payload)

    def _entry(self, row: StreamRow) -> tuple[Entry, DecodedEntry]:
        cached = self._decoded
        if cached is not None and cached[0] == row.position:
            return cached[1], cached[2]
        entry = _read_entry(self.topic, self.topic.name, row)
        decoded = decode_entry(entry.data)
        self._decoded = (row.position, entry, decoded)
        return entry, decoded
