"""A producer, whatever the transport: a name, a topic, a route and the next sequence id.

Role: the second step of the append path (``broker/entry_builder.py`` names it whole). Every
transport's producer (REST, WebSocket, the binary protocol's) opens one ``Producer`` through
``TopicRegistry.producer`` (``service.topics.producer``) and hands it groups of prepared entries
(:meth:`append`). It holds what it asks on every send, the registry's topics (``ProducerTopics``),
not the broker service. The producer:

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

Invariants: an append is one ``append`` per partition it reaches (on a ``PersistentTopic``, durable
when its future completes; on a non-persistent topic, offered to its consumers); a producer's
slots are given back once, however often it is closed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Protocol

from broker.entry_builder import PreparedEntry
from broker.entry_format import Compression
from broker.errors import InvalidRequest, MagnetarError
from broker.key_index.derived import DcbCondition
from broker.message_fields import ExpectedVersion
from broker.quotas import TopicQuotas
from broker.routing import PartitionRouter
from broker.topic import PublishResult
from broker.topic_name import TopicName
from storage import new_future

ROUTING_MODES = ("RoundRobinPartition", "SinglePartition")


class AppendTarget(Protocol):
    """A topic partition a producer appends to: a ``PersistentTopic`` (``broker/topic.py``) or a
    ``NonPersistentTopic`` (``broker/non_persistent_topic.py``)."""

    def append(self, entries: Sequence[PreparedEntry], *, producer_name: str, expected_offset: int | None = None,
               expected_key_versions: Mapping[str, ExpectedVersion] | None = None,
               dcb_condition: DcbCondition | None = None,
               ) -> Future[list[PublishResult | MagnetarError]]: ...

    def last_sequence_id(self, producer: str) -> int: ...


class ProducerTopics(Protocol):
    """What a producer asks of the topic registry (``broker/topic_registry.py``), or of the live
    non-persistent topics (``broker/non_persistent_topic.py``)."""

    def topic(self, name: TopicName) -> AppendTarget: ...

    def partitions(self, name: TopicName) -> int: ...


class Producer:
    def __init__(self, topics: ProducerTopics, topic: TopicName, name: str, *,
                 routing_mode: str = "RoundRobinPartition", compression: Compression = Compression.NONE,
                 initial_sequence_id: int | None = None, slots: Sequence[TopicQuotas] = (),
                 on_close: Callable[[], None] | None = None) -> None:
        """``slots``: the partitions' quotas this producer holds a producer slot of; ``on_close``:
        called once when it closes."""
        if routing_mode not in ROUTING_MODES:
            raise InvalidRequest(f"unknown messageRoutingMode {routing_mode!r}: use {' or '.join(ROUTING_MODES)}",
                                 field="messageRoutingMode")
        self._topics = topics
        self.topic = topic
        self.name = name
        self.routing_mode = routing_mode
        self.compression = compression
        self._sequence_ids = itertools.count(initial_sequence_id + 1) if initial_sequence_id is not None else None
        self._router: PartitionRouter | None = None
        self._slots = list(slots)
        self._on_close = on_close

    def close(self) -> None:
        """Give back the producer slots (the transport's producer went away)."""
        slots, self._slots = self._slots, []
        for quotas in slots:
            quotas.remove_producer()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def publish_delay_s(self) -> float:
        """How long the transport should stop reading from this producer's client: the longest
        wait of a partition whose publish rate was exceeded (0: go on)."""
        return max((quotas.publish_delay_s() for quotas in self._slots if quotas.publish is not None), default=0.0)

    def _partitions(self) -> int:
        return self._topics.partitions(self.topic) if self.topic.partition_index < 0 else 0

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
        return max(self._topics.topic(target).last_sequence_id(self.name) for target in targets)

    def append(self, entries: Sequence[PreparedEntry], *, partition: TopicName | None = None,
               expected_offset: int | None = None, expected_key_versions: Mapping[str, ExpectedVersion] | None = None,
               dcb_condition: DcbCondition | None = None) -> Future[list[PublishResult | MagnetarError]]:
        """Append ``entries`` (``broker/entry_builder.py``) to this producer's topic, each routed
        as :meth:`route` routes its first message's key (or all to ``partition``, which the
        transport chose with :meth:`route` and :meth:`partition_of_key`), in one
        ``PersistentTopic.append`` per partition; the Future's list holds each entry's result or
        the refusal of that entry alone, in order, and a failure to store fails it. A client's
        own entries go to the topic it named (a binary client routes itself). A conditional
        append goes to one partition: the one of its first key, where each of its keys and
        expected keys must route; a DCB condition (``broker/dcb.py``) to a topic of one
        partition (or the partition named)."""
        if not entries:
            raise InvalidRequest("a publish needs at least one message")
        if partition is not None:
            targets = {partition: list(range(len(entries)))}
        elif not self._partitions():
            targets = {self.topic: list(range(len(entries)))}
        elif not entries[0].messages:
            raise InvalidRequest(f"{self.topic} is partitioned: produce to one of its partitions")
        elif dcb_condition is not None:
            raise InvalidRequest(f"{self.topic} is partitioned: a DCB append needs one total order, a topic of one "
                                 "partition")
        elif expected_offset is not None or expected_key_versions is not None:
            targets = {self.route(entries[0].keys[0]): list(range(len(entries)))}
        else:
            targets = {}
            for position, entry in enumerate(entries):
                targets.setdefault(self.route(entry.keys[0]), []).append(position)
        if expected_key_versions is not None:
            (target,) = targets
            keys = [*expected_key_versions, *(k for e in entries for k in e.keys if k is not None)]
            check_stream_partition(target, keys, self._topics.partitions(target.base))
        name = self.name
        if len(targets) == 1:
            (target,) = targets
            return self._topics.topic(target).append(entries, producer_name=name, expected_offset=expected_offset,
                                                     expected_key_versions=expected_key_versions,
                                                     dcb_condition=dcb_condition)
        parts = [(positions, self._topics.topic(target).append([entries[p] for p in positions], producer_name=name))
                 for target, positions in targets.items()]
        return _gathered(parts, len(entries))


def check_stream_partition(target: TopicName, keys: list[str], partitions: int) -> None:
    """A conditional append (one entry) goes to one partition, which must be where each of its
    keys routes among the topic's ``partitions`` (``InvalidRequest`` otherwise): a key's stream
    lives in one partition."""
    if target.partition_index < 0:
        return
    for key in keys:
        home = PartitionRouter.key_partition(key, partitions) if partitions else target.partition_index
        if home != target.partition_index:
            raise InvalidRequest(f"key {key[:64]!r} belongs to partition {home} of {target.base}, not "
                                 f"{target.partition_index}: the keys of a conditional append must share "
                                 "one partition", field="expectedKeyVersions")


def entry_result(appended: Future[list[PublishResult | MagnetarError]]) -> Future[PublishResult]:
    """The result of a one-entry append as its own Future, which fails with the entry's refusal
    (too large, a duplicate still being stored) as it fails with a failure to store."""
    result: Future[PublishResult] = new_future()

    def done(future: Future[list[PublishResult | MagnetarError]]) -> None:
        error = future.exception()
        if error is not None:
            result.set_exception(error)
            return
        outcome = future.result()[0]
        if isinstance(outcome, MagnetarError):
            result.set_exception(outcome)
        else:
            result.set_result(outcome)

    appended.add_done_callback(done)
    return result


def _gathered(parts: list[tuple[list[int], Future[list[PublishResult | MagnetarError]]]],
              total: int) -> Future[list[PublishResult | MagnetarError]]:
    """One Future for several partitions' appends: their outcomes back in entry order."""
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
