"""Publishing from tests through the broker's one append path, in the shapes tests read best.

``publish(topic, messages, ...)`` stores ``messages`` as one entry on a ``PersistentTopic`` (a
Future of its result); ``publish_to(service, topic, messages, ...)`` routes them as the REST
edge does (a partitioned topic by the first message's key, else round-robin) and waits;
``publish_each(topic, messages, sequence_ids)`` stores each message as its own entry. Each
builds its entries with ``broker.entry_builder`` and appends them as a transport does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future

from broker import (
    BrokerService,
    Compression,
    ExpectedVersion,
    MagnetarError,
    Message,
    PublishResult,
    TopicName,
    entries_of_messages,
    entry_of_messages,
    entry_result,
)
from broker.producer import check_stream_partition
from broker.topic import PersistentTopic

RESULT_TIMEOUT_S = 60.0


def publish(topic: PersistentTopic, messages: Sequence[Message], *, producer_name: str,
            sequence_id: int | None = None, compression: Compression = Compression.NONE,
            deliver_at_time_ms: int | None = None, expected_offset: int | None = None,
            expected_key_versions: Mapping[str, ExpectedVersion] | None = None) -> Future[PublishResult]:
    """``messages`` as one entry of ``topic``; the Future fails with the entry's refusal."""
    entry = entry_of_messages(messages, sequence_id=sequence_id, compression=compression,
                              deliver_at_time_ms=deliver_at_time_ms)
    return entry_result(topic.append([entry], producer_name=producer_name, expected_offset=expected_offset,
                                     expected_key_versions=expected_key_versions))


def publish_each(topic: PersistentTopic, messages: Sequence[Message], *, producer_name: str,
                 sequence_ids: Sequence[int | None]) -> Future[list[PublishResult | MagnetarError]]:
    """Each of ``messages`` as an entry of its own, in one append."""
    return topic.append(entries_of_messages(messages, sequence_ids), producer_name=producer_name)


def publish_to(service: BrokerService, topic: str | TopicName, messages: Sequence[Message], *, producer_name: str,
               sequence_id: int | None = None, routing_mode: str = "RoundRobinPartition",
               **options: object) -> PublishResult:
    """``messages`` as one entry of ``topic`` (routed by the first message's key when it is
    partitioned), waited for."""
    target = service.topics.route(topic, messages[0].key if messages else None, routing_mode)
    expected = options.get("expected_key_versions")
    if expected is not None:
        assert isinstance(expected, Mapping)
        check_stream_partition(target, [*expected, *(m.key for m in messages if m.key is not None)],
                               service.topics.partitions(target.base))
    return publish(service.topics.topic(target), messages, producer_name=producer_name, sequence_id=sequence_id,
                   **options).result(timeout=RESULT_TIMEOUT_S)  # type: ignore[arg-type]
