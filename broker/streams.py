"""Reads of what is stored, as Arrow columns: a partition by offset, a key's stream by version.

Role: ``BrokerService.streams``, the read side of the event store for REST and WebSocket
readers. ``read_range`` reads one topic partition from an offset on
(``broker/range_read.py``); ``stream_info``, ``read_stream`` and ``stream_reader`` read the
stream of one key (``broker/event_streams.py``), in the partition the key routes to, as a
keyed publish would (``stream_partition``); ``dcb`` reads and appends events with a type and
tags by query (``broker/dcb.py``). Topics come from the topic registry.

Invariants: a read never creates a topic (``NotFound`` for one that does not exist); a
partition of a partitioned topic that nobody wrote to reads as empty; a live stream reader is a
reader like any other and creates its topic when auto-creation allows.
"""

from __future__ import annotations

from broker.dcb import DcbEvents
from broker.errors import InvalidRequest
from broker.event_streams import KeyReader, StreamInfo, StreamRead, read_stream, stream_info
from broker.range_read import RangeRead, read_range
from broker.routing import PartitionRouter
from broker.topic_name import TopicName
from broker.topic_registry import TopicRegistry


class EventStreams:
    def __init__(self, topics: TopicRegistry) -> None:
        self._topics = topics
        self.dcb = DcbEvents(topics)
        """Events with a type and tags, read by query and appended on a condition (``broker/dcb.py``)."""

    def read_range(self, name: TopicName, offset: int, max_messages: int, max_bytes: int, *,
                   message_overhead_bytes: int = 0) -> RangeRead:
        """Messages of one partition from ``offset`` on as Arrow columns (``broker/range_read.py``)."""
        if name.partition_index < 0 and self._topics.partitions(name) > 0:
            raise InvalidRequest(f"{name} is a partitioned topic; read one partition: "
                                 f".../{name.local_name}/partitions/{{n}}/messages")
        return read_range(self._topics.stored(name), name, offset, max_messages, max_bytes,
                          message_overhead_bytes=message_overhead_bytes)

    def stream_partition(self, name: TopicName, key: str) -> TopicName:
        """The partition holding the stream of ``key``: the one a keyed message routes to."""
        partitions = self._topics.partitions(name) if name.partition_index < 0 else 0
        return name.partition(PartitionRouter.key_partition(key, partitions)) if partitions else name

    def stream_info(self, name: TopicName, key: str) -> StreamInfo:
        """Where the stream of ``key`` in topic ``name`` stands."""
        target = self.stream_partition(name, key)
        return stream_info(self._topics.stored(target, asked=name), target, key)

    def read_stream(self, name: TopicName, key: str, from_version: int | None, max_messages: int, max_bytes: int, *,
                    backward: bool = False, message_overhead_bytes: int = 0) -> StreamRead:
        """Messages of the stream of ``key`` by version, as Arrow columns (``broker/event_streams.py``)."""
        target = self.stream_partition(name, key)
        return read_stream(self._topics.stored(target, asked=name), target, key, from_version, max_messages, max_bytes,
                           backward=backward, message_overhead_bytes=message_overhead_bytes)

    def stream_reader(self, name: TopicName, key: str, from_version: int) -> KeyReader:
        """A live reader of the stream of ``key`` from ``from_version`` on (the topic is created
        when auto-creation allows, as for any reader)."""
        return KeyReader(self._topics.topic(self.stream_partition(name, key)), key, from_version)
