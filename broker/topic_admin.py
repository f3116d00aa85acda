"""Topic administration, transport-independent: what the admin API, the console and REST
consumers ask of topics beyond producing and consuming.

Role: ``BrokerService.admin`` is a ``TopicAdmin``. It creates, lists and deletes topics and
partitioned topics; creates subscriptions at a position, lists and deletes them; moves cursors
(reset by time or message id, skip, clear the backlog, expire old messages); reads single
messages (a subscription's n-th unacknowledged one, or the n-th from either end); answers the
last message id, terminates, compacts, offloads (and says how the offload goes); gathers
statistics (``broker/topic_stats.py``); turns message ids into offsets and acknowledges offsets
durably for REST consumers. Transports render
the answers in their own shapes; no transport reaches a managed ledger or a cursor itself.

It stands on narrow protocols, not on the broker service: ``AdminTopics`` (the topic registry,
``broker/topic_registry.py``), ``AdminSubscriptions`` (``broker/subscriptions.py``),
``AdminCompactions`` (``broker/compaction.py``), a namespace's policies and the clock.

Invariants:
- Operations that fan out over a partitioned topic's partitions check every partition before
  changing any, so a refused request changes nothing.
- Cursor moves go through ``Subscriptions.move_cursor``: an active subscription repositions its
  dispatch, so connected consumers get what the move left unacknowledged and nothing it
  acknowledged. A move returns once the new cursor state is persisted.
- Magnetar counts messages, not entries: message positions (peek, examine) name messages, one
  entry may hold a batch of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from broker.compaction import CompactionStatus
from broker.consumer import Consumer
from broker.cursor import ManagedCursor
from broker.entry_format import DecodedMessage, decode_entry
from broker.errors import AlreadyExists, InvalidRequest, NotAllowed, NotFound, PreconditionFailed
from broker.limits import ACK_PERSIST_TIMEOUT_S, UNKNOWN_IDS_REPORTED_MAX
from broker.managed_ledger_offload import OffloadStatus
from broker.message_id import MessageId, Position
from broker.redelivery import REDELIVERY_PROPERTY_PREFIX
from broker.subscription import Subscription
from broker.topic import PersistentTopic
from broker.topic_name import TopicName, check_namespace, check_subscription_name
from broker.topic_stats import InternalStats, TopicStats, internal_stats, topic_stats

LATEST_ID = (1 << 63) - 1
"""Pulsar's ``MessageId.latest`` has ledger and entry ``Long.MAX_VALUE``; earliest has -1."""


@dataclass(frozen=True)
class MessagePosition:
    """A message id as an administrator gives it (Pulsar's ``MessageIdImpl``/``ResetCursorData``):
    ``excluded`` points at the message after it."""

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1
    excluded: bool = False

    @classmethod
    def of(cls, message_id: MessageId) -> MessagePosition:
        return cls(message_id.ledger_id, message_id.entry_id, message_id.partition, message_id.batch_index)


InitialPosition = Literal["earliest", "latest"] | MessagePosition
CursorMove = Callable[[ManagedCursor], Future[None] | None]


@dataclass(frozen=True)
class StoredMessage:
    """One stored message with where it sits and how it was stored."""

    offset: int
    message_id: MessageId
    message: DecodedMessage
    producer_name: str
    publish_time_ms: int
    broker_timestamp_ms: int
    entry_index: int
    """The entry's broker index: the offset of its last message."""
    redelivery_count: int


class AdminTopics(Protocol):
    """What administration asks of the topic registry."""

    def topic(self, name: TopicName, *, create: bool | None = None) -> PersistentTopic: ...

    def exists(self, name: TopicName) -> bool: ...

    def partitions(self, name: TopicName) -> int: ...

    def expand_partitions(self, name: TopicName) -> list[TopicName]: ...

    def names(self, namespace: str) -> list[str]: ...

    def partitioned_names(self, namespace: str) -> list[str]: ...

    def delete(self, name: TopicName, *, force: bool = False) -> None: ...

    def delete_partitioned(self, name: TopicName, *, force: bool = False) -> None: ...

    def unload(self, contains: Callable[[TopicName], bool], graceful: bool) -> list[TopicName]: ...


class AdminSubscriptions(Protocol):
    """What administration asks of the open subscriptions."""

    def of(self, topic_name: TopicName) -> list[Subscription]: ...

    def delete(self, topic_name: TopicName, name: str, *, force: bool = False) -> None: ...

    def move_cursor(self, topic_name: TopicName, name: str, move: CursorMove) -> None: ...

    def check_room(self, name: TopicName, subscription: str) -> None: ...


class AdminCompactions(Protocol):
    def trigger(self, name: TopicName) -> None: ...

    def status(self, name: TopicName) -> CompactionStatus: ...


class TopicAdmin:
    def __init__(self, topics: AdminTopics, subscriptions: AdminSubscriptions, compactions: AdminCompactions,
                 policies: Callable[[str], dict[str, Any]], clock: Callable[[], float]) -> None:
        """``policies(namespace)``: the namespace's policies (``NotFound`` for an unknown one)."""
        self._topics = topics
        self._subscriptions = subscriptions
        self._compactions = compactions
        self._policies = policies
        self._clock = clock

    # --- looking topics up --------------------------------------------------------------
    def single_topic(self, name: TopicName, operation: str) -> PersistentTopic:
        """The topic for an operation Pulsar allows only on non-partitioned topics or partitions."""
        if name.partition_index < 0 and self._topics.partitions(name) > 0:
            raise NotAllowed(f"{operation} is not allowed on partitioned topic {name}; use its -partition-N topics")
        return self._topics.topic(name, create=False)

    def existing_partitions(self, name: TopicName) -> list[TopicName]:
        """The topics a request on ``name`` fans out to: itself, or its partitions that exist."""
        if name.partition_index >= 0 or self._topics.partitions(name) == 0:
            self._topics.topic(name, create=False)  # NotFound for an unknown topic
            return [name]
        return [p for p in self._topics.expand_partitions(name) if self._topics.exists(p)]

    def partition_of(self, name: TopicName, partition: int) -> TopicName:
        """Partition ``partition`` of ``name``; partition 0 of an unpartitioned topic is the topic."""
        count = self._topics.partitions(name)
        if partition < 0 or partition >= max(count, 1):
            raise InvalidRequest(f"{name} has no partition {partition}", field="partition")
        return name.partition(partition) if count else name

    # --- topics --------------------------------------------------------------------------
    def list_topics(self, namespace: str) -> list[str]:
        """Every topic of the namespace, partitioned ones as their -partition-N topics."""
        self._policies(namespace)  # NotFound for an unknown namespace
        names = set(self._topics.names(namespace))
        for partitioned in self._topics.partitioned_names(namespace):
            names.update(p.full_name for p in self._topics.expand_partitions(TopicName.parse(partitioned)))
        return sorted(names)

    def list_partitioned(self, namespace: str) -> list[str]:
        self._policies(namespace)
        return self._topics.partitioned_names(namespace)

    def partitions(self, name: TopicName) -> int:
        self._policies(name.namespace_name)
        return self._topics.partitions(name)

    def delete_topic(self, name: TopicName, *, force: bool = False) -> None:
        self.single_topic(name, "deleting with this path")
        if force:
            self._drop_subscriptions(name)
        self._topics.delete(name, force=force)

    def delete_partitioned_topic(self, name: TopicName, *, force: bool = False) -> None:
        if self._topics.partitions(name) == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        partitions = [p for p in self._topics.expand_partitions(name) if self._topics.exists(p)]
        if not force:  # refuse before deleting any partition
            for partition in partitions:
                if self._topics.topic(partition, create=False).cursors.names():
                    raise NotAllowed(f"{partition} has subscriptions; use force")
        for partition in partitions if force else []:
            self._drop_subscriptions(partition)
        self._topics.delete_partitioned(name, force=force)

    def _drop_subscriptions(self, name: TopicName) -> None:
        """Delete every subscription of ``name``, disconnecting consumers (forced deletion)."""
        for subscription in self._topics.topic(name, create=False).cursors.names():
            self._subscriptions.delete(name, subscription, force=True)

    # --- statistics ----------------------------------------------------------------------
    def stats(self, name: TopicName) -> TopicStats:
        topic = self.single_topic(name, "stats")
        return topic_stats(topic, self._subscriptions.of(topic.name))

    def partitioned_stats(self, name: TopicName) -> dict[str, TopicStats]:
        """Each existing partition's statistics, by partition name."""
        if self._topics.partitions(name) == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        return {p.full_name: topic_stats(self._topics.topic(p, create=False), self._subscriptions.of(p))
                for p in self._topics.expand_partitions(name) if self._topics.exists(p)}

    def internal_stats(self, name: TopicName) -> InternalStats:
        topic = self.single_topic(name, "internalStats")
        return internal_stats(topic, self._subscriptions.of(topic.name),
                              self._compactions.status(topic.name))

    # --- subscriptions -------------------------------------------------------------------
    def subscriptions(self, name: TopicName) -> list[str]:
        names: set[str] = set()
        for target in self.existing_partitions(name):
            names.update(self._topics.topic(target, create=False).cursors.names())
        return sorted(names)

    def create_subscription(self, name: TopicName, subscription: str, position: InitialPosition) -> None:
        """A durable subscription at ``position`` on the topic or on every partition (auto-creating
        a partition nobody wrote to yet, as a subscribe does)."""
        check_subscription_name(subscription)
        count = self._topics.partitions(name) if name.partition_index < 0 else 0
        if count and isinstance(position, MessagePosition):
            raise InvalidRequest("a message id names one partition: create the subscription on a -partition-N topic")
        targets = [self._topics.topic(p, create=True) for p in self._topics.expand_partitions(name)] if count else \
            [self._topics.topic(name)]
        if any(t.cursors.get(subscription) is not None for t in targets):
            raise AlreadyExists(f"subscription {subscription} already exists on {name}")
        for target in targets:
            self._subscriptions.check_room(target.name, subscription)  # QuotaExceeded: maxSubscriptionsPerTopic
        for target in targets:
            initial = position if isinstance(position, str) else _offset_of(target, position)
            target.cursors.open(subscription, initial=initial)

    def delete_subscription(self, name: TopicName, subscription: str, *, force: bool = False) -> None:
        """Delete it everywhere it exists (force: disconnect its consumers first); refused
        before anything is deleted while consumers are connected and ``force`` is off."""
        targets = self._with_subscription(name, subscription)
        if not force:
            for target in targets:
                if any(s.consumers for s in self._subscriptions.of(target) if s.name == subscription):
                    raise PreconditionFailed(f"subscription {subscription} of {target} has connected consumers; "
                                             "use force")
        for target in targets:
            self._subscriptions.delete(target, subscription, force=force)

    def _with_subscription(self, name: TopicName, subscription: str) -> list[TopicName]:
        """The topics (``name`` or its partitions) holding ``subscription``; NotFound if none does."""
        check_subscription_name(subscription)
        targets = [t for t in self.existing_partitions(name)
                   if self._topics.topic(t, create=False).cursors.get(subscription) is not None]
        if not targets:
            raise NotFound(f"subscription {subscription} of {name} does not exist")
        return targets

    # --- cursor moves --------------------------------------------------------------------
    def _move_all(self, name: TopicName, subscription: str,
                  move_for: Callable[[PersistentTopic], CursorMove]) -> None:
        for target in self._with_subscription(name, subscription):
            self._subscriptions.move_cursor(target, subscription, move_for(self._topics.topic(target, create=False)))

    def reset_to_time(self, name: TopicName, subscription: str, timestamp_ms: int) -> None:
        self._move_all(name, subscription, lambda _: lambda cursor: cursor.reset_to_time(timestamp_ms))

    def reset_to_message(self, name: TopicName, subscription: str, position: MessagePosition) -> None:
        count = self._topics.partitions(name) if name.partition_index < 0 else 0
        if count:
            if not 0 <= position.partition < count:
                raise PreconditionFailed(f"{name} is partitioned: partitionIndex must name one of {count} partitions")
            name = name.partition(position.partition)
        check_subscription_name(subscription)
        offset = _offset_of(self._topics.topic(name, create=False), position)
        self._subscriptions.move_cursor(name, subscription, lambda cursor: cursor.reset_to_offset(offset))

    def skip(self, name: TopicName, subscription: str, messages: int) -> None:
        self.single_topic(name, "skip")
        check_subscription_name(subscription)
        self._subscriptions.move_cursor(name, subscription, lambda cursor: cursor.skip(messages))

    def skip_all(self, name: TopicName, subscription: str) -> None:
        self._move_all(name, subscription, lambda _: lambda cursor: cursor.skip_all())

    def _expiry(self, expire_s: int) -> Callable[[PersistentTopic], CursorMove]:
        def for_topic(target: PersistentTopic) -> CursorMove:
            cutoff_offset = target.ml.time_to_offset(int(self._clock() * 1000) - expire_s * 1000)
            return lambda cursor: cursor.expire_before(cutoff_offset)
        return for_topic

    def expire(self, name: TopicName, subscription: str, expire_s: int) -> None:
        """Acknowledge the messages published longer than ``expire_s`` ago."""
        self._move_all(name, subscription, self._expiry(expire_s))

    def expire_all(self, name: TopicName, expire_s: int) -> None:
        for target in self.existing_partitions(name):
            opened = self._topics.topic(target, create=False)
            for subscription in opened.cursors.names():
                self._subscriptions.move_cursor(target, subscription, self._expiry(expire_s)(opened))

    # --- single messages -----------------------------------------------------------------
    def peek(self, name: TopicName, subscription: str, position: int) -> StoredMessage:
        """The subscription's ``position``-th unacknowledged message (1-based)."""
        target = self.single_topic(name, "peek")
        check_subscription_name(subscription)
        cursor = target.cursors.get(subscription)
        if cursor is None:
            raise NotFound(f"subscription {subscription} of {name} does not exist")
        offset = cursor.nth_unacked_offset(position)
        if offset is None:
            raise NotFound(f"subscription {subscription} of {name} has no message at position {position}")
        redeliveries = int(cursor.properties.get(f"{REDELIVERY_PROPERTY_PREFIX}{offset}", 0))
        return _stored_message(target, offset, redeliveries)

    def examine(self, name: TopicName, initial: Literal["earliest", "latest"], position: int) -> StoredMessage:
        """The ``position``-th message counted from the earliest or the latest (1 = the last)."""
        target = self.single_topic(name, "examinemessage")
        first, end = target.ml.first_offset, target.ml.confirmed_next_offset()
        offset = first + position - 1 if initial == "earliest" else end - position
        if not first <= offset < end:
            raise NotFound(f"{target.name} has no message at position {position} from the {initial}")
        return _stored_message(target, offset, 0)

    def last_message_id(self, name: TopicName) -> tuple[MessageId, int | None]:
        """The id (and offset) of the last message; ``{ledger}:-1`` style when there is none."""
        topic = self.single_topic(name, "lastMessageId")
        ml = topic.ml
        end = ml.confirmed_next_offset()
        if end > ml.first_offset:
            return topic.message_id_of_offset(end - 1), end - 1
        last = ml.last_confirmed
        if last.ledger_id < 0 and ml.ledger_infos():
            last = Position(ml.ledger_infos()[-1].ledger_id, -1)
        return MessageId(last.ledger_id, last.entry_id, topic.partition), None

    def terminate(self, name: TopicName) -> tuple[MessageId, int | None]:
        """No message is accepted after this; the id of the last one."""
        self.single_topic(name, "terminate").ml.terminate()
        return self.last_message_id(name)

    def unload(self, name: TopicName) -> None:
        """Close the topic (every partition of a partitioned one) gracefully: its clients are
        disconnected and reconnect, and the next use loads it afresh, on a new ledger."""
        targets = set(self.existing_partitions(name))
        self._topics.unload(targets.__contains__, graceful=True)

    def trigger_compaction(self, name: TopicName) -> None:
        self.single_topic(name, "compaction")
        self._compactions.trigger(name)

    def compaction_status(self, name: TopicName) -> CompactionStatus:
        self.single_topic(name, "compaction")
        return self._compactions.status(name)

    def trigger_offload(self, name: TopicName, up_to: MessageId) -> None:
        """Offload the topic's closed ledgers before ``up_to``'s ledger, in the background
        (Pulsar's ``triggerOffload``); ``AlreadyExists`` (409) while one runs."""
        self.single_topic(name, "offload").ml.offload_prefix(Position(up_to.ledger_id, up_to.entry_id))

    def offload_status(self, name: TopicName) -> OffloadStatus:
        return self.single_topic(name, "offload").ml.offload_status()

    # --- ids, offsets and acknowledgements -------------------------------------------------
    def locate(self, name: TopicName, message_id: MessageId) -> tuple[TopicName, int]:
        """The partition and offset of ``message_id`` in ``name`` (a partitioned topic's id must
        name one of its partitions)."""
        partitions = self._topics.partitions(name) if name.partition_index < 0 else 0
        if partitions:
            if not 0 <= message_id.partition < partitions:
                raise InvalidRequest(f"{name} has {partitions} partitions: the message id must name one "
                                     f"(ledger:entry:partition), not partition {message_id.partition}")
            target = name.partition(message_id.partition)
        elif message_id.partition not in (-1, name.partition_index):
            raise InvalidRequest(f"{name} is not partitioned: message id {message_id} names partition "
                                 f"{message_id.partition}")
        else:
            target = name
        entry = self._topics.topic(target, create=False).ml.read_entry(message_id.position)
        if message_id.batch_index >= entry.message_count:
            raise InvalidRequest(f"entry {message_id.position} holds {entry.message_count} messages, "
                                 f"no batch index {message_id.batch_index}")
        return target, entry.first_offset + max(message_id.batch_index, 0)

    def entry_offsets(self, name: TopicName, ledger_id: int, entry_id: int) -> tuple[int, int] | None:
        """The first and last offsets of the stored entry ``ledger_id:entry_id`` of one topic
        partition, or None when it holds no such entry (a binary client's acks and start ids
        name entries)."""
        topic = self._topics.topic(name, create=False)
        if not any(info.ledger_id == ledger_id and 0 <= entry_id < info.entries for info in topic.ml.ledger_infos()):
            return None
        entry = topic.ml.read_entry(Position(ledger_id, entry_id))
        return entry.first_offset, entry.last_offset

    def acknowledgeable(self, name: TopicName, message_ids: Sequence[tuple[str, MessageId]], offsets: Sequence[int],
                        holder: Consumer | None) -> list[int]:
        """Every offset the ids (each with the text the client gave) and offsets name, checked
        against the topic before anything is acknowledged (``InvalidRequest`` naming the first
        unknown ones as the client wrote them; nothing acknowledged). An id without a batch
        index names its whole entry; ``holder``, when given, knows the ids it was handed."""
        topic = self._topics.topic(name, create=False)
        found: set[int] = set()
        unknown: list[str] = []
        for text, message_id in message_ids:
            held = holder.offset_of(message_id) if holder is not None else None
            named = [held] if held is not None else _stored_offsets(topic, message_id)
            if named is None:
                unknown.append(text)
            else:
                found.update(named)
        first, end = topic.ml.first_offset, topic.ml.confirmed_next_offset()
        for offset in offsets:
            if first <= offset < end:
                found.add(offset)
            else:
                unknown.append(f"offset {offset}")
        if unknown:
            shown = ", ".join(unknown[:UNKNOWN_IDS_REPORTED_MAX])
            more = f" and {len(unknown) - UNKNOWN_IDS_REPORTED_MAX} more" if len(unknown) > UNKNOWN_IDS_REPORTED_MAX \
                else ""
            raise InvalidRequest(f"no such message in {topic.name} (stored offsets are {first}..{end - 1}): "
                                 f"{shown}{more}; nothing was acknowledged")
        return sorted(found)

    def acknowledge(self, name: TopicName, subscription: str, offsets: Sequence[int]) -> None:
        """Acknowledge ``offsets`` on the subscription's cursor and wait until it persisted them
        (``offsets`` empty: wait for what is pending)."""
        cursor = self.cursor(name, subscription)
        if offsets:
            cursor.ack(list(offsets)).result(timeout=ACK_PERSIST_TIMEOUT_S)
        else:
            cursor.flush()

    def cursor(self, name: TopicName, subscription: str) -> ManagedCursor:
        check_subscription_name(subscription)
        cursor = self._topics.topic(name, create=False).cursors.get(subscription)
        if cursor is None:
            raise NotFound(f"subscription {subscription} of {name} does not exist")
        return cursor

    def offsets(self, name: TopicName, timestamp_ms: int | None) -> dict[str, dict[str, int]]:
        """For every partition (every one of a partitioned topic, so a poller discovers new
        ones) the first retained offset, the next offset and, with ``timestamp_ms``, the first
        offset published at or after it."""
        count = self._topics.partitions(name) if name.partition_index < 0 else 0
        partitions = [name.partition(i) for i in range(count)] if count else [name]
        if not count and not self._topics.exists(name):
            raise NotFound(f"topic {name} does not exist")
        return {p.full_name: self._offsets_of(p, timestamp_ms) for p in partitions}

    def _offsets_of(self, name: TopicName, timestamp_ms: int | None) -> dict[str, int]:
        if not self._topics.exists(name):  # a partition nobody wrote to yet
            found = {"first": 0, "next": 0}
            return found if timestamp_ms is None else {**found, "atTimestamp": 0}
        ml = self._topics.topic(name, create=False).ml
        found = {"first": ml.first_offset, "next": ml.confirmed_next_offset()}
        return found if timestamp_ms is None else {**found, "atTimestamp": ml.time_to_offset(timestamp_ms)}

    def check_namespace(self, namespace: str) -> str:
        check_namespace(namespace)
        self._policies(namespace)
        return namespace


def _offset_of(topic: PersistentTopic, position: MessagePosition) -> int:
    """The offset a message position points at (``excluded``: the message after it)."""
    if position.ledger_id == -1 and position.entry_id == -1:
        return topic.ml.first_offset
    if position.ledger_id == LATEST_ID and position.entry_id == LATEST_ID:
        return topic.ml.confirmed_next_offset()
    entry = topic.ml.read_entry(Position(position.ledger_id, position.entry_id))
    if position.batch_index < 0:
        return entry.last_offset + 1 if position.excluded else entry.first_offset
    if position.batch_index >= entry.message_count:
        raise InvalidRequest(f"entry {position.ledger_id}:{position.entry_id} holds {entry.message_count} messages, "
                             f"no batchIndex {position.batch_index}")
    return entry.first_offset + position.batch_index + (1 if position.excluded else 0)


def _stored_offsets(topic: PersistentTopic, message_id: MessageId) -> list[int] | None:
    """The offsets ``message_id`` names in ``topic`` (a whole batch without a batch index), or
    None when it names no stored message of it."""
    if message_id.partition != topic.partition:
        return None
    if not any(info.ledger_id == message_id.ledger_id and 0 <= message_id.entry_id < info.entries
               for info in topic.ml.ledger_infos()):
        return None
    entry = topic.ml.read_entry(message_id.position)
    if message_id.batch_index < 0:
        return list(range(entry.first_offset, entry.last_offset + 1))
    if message_id.batch_index >= entry.message_count:
        return None
    return [entry.first_offset + message_id.batch_index]


def _stored_message(topic: PersistentTopic, offset: int, redelivery_count: int) -> StoredMessage:
    position, index = topic.ml.offset_to_position(offset)
    entry = topic.ml.read_entry(position)
    decoded = decode_entry(entry.data)
    message_id = MessageId(position.ledger_id, position.entry_id, topic.partition,
                           -1 if len(decoded.messages) == 1 else index)
    return StoredMessage(offset, message_id, decoded.messages[index], decoded.producer_name, decoded.publish_time_ms,
                         entry.publish_time_ms, entry.last_offset, redelivery_count)
