"""A producer, whatever the transport: a name, a topic, a route and the next sequence id.

Role: a transport's producer session (a WebSocket producer, later a binary-protocol one) opens
one ``Producer`` through ``BrokerService.producer`` and hands it the messages of each entry.
The producer:

- **routes** each entry of a partitioned topic to one partition: a keyed entry to its key's
  partition (``murmur3_32(key) % partitions``, as Pulsar's clients do), an unkeyed one
  round-robin *per entry* (``RoundRobinPartition``: the counter advances once per batch, so a
  burst of keyless messages batches well, as Pulsar's batching producers do) or always to one
  partition chosen once (``SinglePartition``). A transport that groups messages into an entry
  asks :meth:`route` once for the group and :meth:`partition_of_key` (which moves nothing) to
  see whether a keyed message joins it;
- **identifies** its messages for deduplication: its name and a sequence id per message (the
  caller's, or the next of ``initial_sequence_id + 1, …`` when it gave one, or the topic's next
  for this producer name);
- **appends conditionally** when asked (``expected_offset``: the entry's first offset;
  ``expected_key_versions``: the versions its keys' streams must be at, all of them keys of the
  partition the entry goes to).

It holds a producer slot on each partition it was opened on (``broker/quotas.py``: a topic's
``maxProducers``), given back by :meth:`close`, and tells its transport how long to stop
reading from its client when a partition's publish rate is exceeded (:meth:`publish_delay_s`).

Invariants: one ``send`` is one entry on one partition, durable when its future completes; a
producer's slots are given back once, however often it is closed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from broker.entry_format import Compression, Message
from broker.errors import InvalidRequest, MagnetarError
from broker.message_fields import ExpectedVersion
from broker.quotas import TopicQuotas
from broker.routing import PartitionRouter
from broker.topic import ClientEntrySend, PublishResult
from broker.topic_name import TopicName
from storage import new_future

if TYPE_CHECKING:
    from broker.service import BrokerService

ROUTING_MODES = ("RoundRobinPartition", "SinglePartition")


class Producer:
    def __init__(self, service: BrokerService, topic: TopicName, name: str, *,
                 routing_mode: str = "RoundRobinPartition", compression: Compression = Compression.NONE,
                 initial_sequence_id: int | None = None, slots: Sequence[TopicQuotas] = ()) -> None:
        """``slots``: the partitions' quotas this producer holds a producer slot of."""
        if routing_mode not in ROUTING_MODES:
            raise InvalidRequest(f"unknown messageRoutingMode {routing_mode!r}: use {' or '.join(ROUTING_MODES)}",
                                 field="messageRoutingMode")
        self._service = service
        self.topic = topic
        self.name = name
        self.routing_mode = routing_mode
        self.compression = compression
        self._sequence_ids = itertools.count(initial_sequence_id + 1) if initial_sequence_id is not None else None
        self._router: PartitionRouter | None = None
        self._slots = list(slots)

    def close(self) -> None:
        """Give back the producer slots (the transport's producer went away)."""
        slots, self._slots = self._slots, []
        for quotas in slots:
            quotas.remove_producer()

    def publish_delay_s(self) -> float:
        """How long the transport should stop reading from this producer's client: the longest
        wait of a partition whose publish rate was exceeded (0: go on)."""
        return max((quotas.publish_delay_s() for quotas in self._slots if quotas.publish is not None), default=0.0)

    def _partitions(self) -> int:
        return self._service.partitions(self.topic) if self.topic.partition_index < 0 else 0

    def _current_router(self, partitions: int) -> PartitionRouter:
        router = self._router
        if router is None or router.partitions != partitions:  # the topic grew: route over all of it
            router = self._router = PartitionRouter(partitions, self.routing_mode)
        return router

    def route(self, key: str | None) -> TopicName:
        """The partition of the next entry whose first message has ``key`` (keyless: advances
        round-robin); the topic itself when it is not partitioned."""
        partitions = self._partitions()
        if not partitions:
            return self.topic
        return self.topic.partition(self._current_router(partitions).partition_for(key))

    def partition_of_key(self, key: str) -> TopicName:
        """Where a message with ``key`` goes; moves no round-robin counter."""
        partitions = self._partitions()
        if not partitions:
            return self.topic
        return self.topic.partition(PartitionRouter.key_partition(key, partitions))

    def next_sequence_id(self) -> int | None:
        """The sequence id of this producer's next message, when it numbers them itself."""
        return next(self._sequence_ids) if self._sequence_ids is not None else None

    def last_sequence_id(self) -> int:
        """The highest durable sequence id of this producer's name on its topic (every partition
        of a partitioned one), -1 if none: where a reconnecting producer resumes."""
        partitions = self._partitions()
        targets = [self.topic.partition(i) for i in range(partitions)] if partitions else [self.topic]
        return max(self._service.topic(target).last_sequence_id(self.name) for target in targets)

    def send_entries(self, entries: Sequence[ClientEntrySend]) -> Future[list[PublishResult | MagnetarError]]:
        """Store entries the client encoded (checked by ``check_client_entry``) untouched, each
        its own entry, on this producer's topic, which must be one partition or an unpartitioned
        topic (a binary client routes itself); see ``PersistentTopic.publish_entries``."""
        if self._partitions():
            raise InvalidRequest(f"{self.topic} is partitioned: produce to one of its partitions")
        return self._service.topic(self.topic).publish_entries(entries, producer_name=self.name)

    def send(self, messages: Sequence[Message], *, partition: TopicName | None = None,
             sequence_id: int | None = None, expected_offset: int | None = None,
             deliver_at_ms: int | None = None,
             expected_key_versions: Mapping[str, ExpectedVersion] | None = None) -> Future[PublishResult]:
        """Store ``messages`` as one entry on ``partition`` (default: :meth:`route` of the first
        message's key); the future completes once the entry is durable."""
        if not messages:
            raise InvalidRequest("a publish needs at least one message")
        target = partition if partition is not None else self.route(messages[0].key)
        if expected_key_versions is not None:
            self._service.check_stream_partition(
                target, [*expected_key_versions, *(m.key for m in messages if m.key is not None)])
        return self._service.topic(target).publish(
            messages, producer_name=self.name, sequence_id=sequence_id, compression=self.compression,
            expected_offset=expected_offset, deliver_at_time_ms=deliver_at_ms,
            expected_key_versions=expected_key_versions)

    def send_each(self, messages: Sequence[Message], sequence_ids: Sequence[int | None],
                  ) -> Future[list[PublishResult | MagnetarError]]:
        """Store each message as its own entry, routed as :meth:`send` routes one (a keyless
        message advances round-robin), in one call per partition. The Future's list holds each
        message's result or the broker's refusal of that message alone, in order; a failure to
        store fails the Future."""
        if not messages:
            raise InvalidRequest("a publish needs at least one message")
        if not self._partitions():
            return self._service.topic(self.topic).publish_each(
                messages, producer_name=self.name, sequence_ids=sequence_ids, compression=self.compression)
        groups: dict[TopicName, list[int]] = {}
        for position, message in enumerate(messages):
            groups.setdefault(self.route(message.key), []).append(position)
        parts = [(positions, self._service.topic(target).publish_each(
            [messages[p] for p in positions], producer_name=self.name,
            sequence_ids=[sequence_ids[p] for p in positions], compression=self.compression))
            for target, positions in groups.items()]
        return _gathered(parts, len(messages))


def _gathered(parts: list[tuple[list[int], Future[list[PublishResult | MagnetarError]]]],
              total: int) -> Future[list[PublishResult | MagnetarError]]:
    """One Future for several partitions' ``publish_each``: their outcomes back in message order."""
    result: Future[list[PublishResult | MagnetarError]] = new_future()
    outcomes: list[PublishResult | MagnetarError | None] = [None] * total
    remaining = [len(parts)]
    lock = threading.Lock()

    def one_done(future: Future[list[PublishResult | MagnetarError]], positions: list[int]) -> None:
        error = future.exception()
        with lock:
            if result.done():
                return
            if error is None:
                for position, outcome in zip(positions, future.result(), strict=True):
                    outcomes[position] = outcome
                remaining[0] -= 1
                if remaining[0]:
                    return
        if error is not None:
            result.set_exception(error)
        else:
            result.set_result(outcomes)  # type: ignore[arg-type]  # every position is filled

    for positions, future in parts:
        future.add_done_callback(lambda f, p=positions: one_done(f, p))  # type: ignore[misc]
    return result
