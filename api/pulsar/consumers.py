"""The consumer half of a binary-protocol connection: SUBSCRIBE, FLOW, MESSAGE, ACK and the rest.

Role: each client consumer (one per topic partition; the client merges partitions itself) is
one broker ``Consumer`` (``broker/consumer.py``), so dispatch, permits, Key_Shared order,
redelivery counts and delayed delivery are the ones every transport shares. The broker consumer
hands out runs of entries (``EntryRun``); each leaves as one MESSAGE frame that forwards the
stored entry (``message_of_run``), with Pulsar's ``ack_set`` when the run is only part of it.
Acknowledgements name entries (and batch indexes through ack sets); they are turned back into
offsets from what was sent (``_SentEntries``) or, for entries this consumer never received, from
the topic.

Pulsar's clients do ack timeouts, negative-ack delays and dead-lettering themselves, so broker
consumers here have no ack timeout, no nack delay and no dead-letter limit: the client's
REDELIVER_UNACKNOWLEDGED_MESSAGES is a nack due at once, and the broker supplies the
(persisted) ``redelivery_count`` the client's dead-letter policy counts.

Invariants: a consumer receives only against FLOW permits (one per message, but an entry is
never split between deliveries: its rest follows its first message past the permits, as
Pulsar's broker sends whole batches, because the clients acknowledge a batch only once they
hold all of it); nothing is written while the connection is congested: the deliveries wait in
the broker consumer's outbox, which takes no more than ``dispatcherMaxPendingBytesPerConsumer``
(so a client that stops reading is held back by TCP and costs the broker that and its
connection's ``write_buffer_bytes_max``, at most one entry beyond each); a consumer closed by
the broker (a forced subscription delete, its topic moving to another broker, or its role
losing the right to consume there) is told with
CLOSE_CONSUMER; a SUBSCRIBE for a topic this broker does not serve is refused with
ServiceNotReady before anything is created; a non-durable subscription (a reader's) ends with
its consumer. On a non-persistent topic acknowledgements change nothing and a seek is refused
with NotAllowed (nothing is stored), as in Pulsar.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from api.auth import Action
from api.limits import FLOW_PERMITS_MAX
from api.pulsar import commands
from api.pulsar.context import ConnectionContext
from api.pulsar.hot_commands import AckCommand, AckedId, FlowCommand
from api.pulsar.proto import pulsar_api_pb2 as pb
from api.pulsar.schemas import ProtocolSchemas
from api.wakeup import LoopSignal
from broker import Consumer as BrokerConsumer
from broker import (
    ConsumerBusy,
    ConsumerConfig,
    EntryRun,
    InvalidRequest,
    MagnetarError,
    NotAllowed,
    NotFound,
    SubscriptionType,
    TopicName,
    cleared_indexes,
)

log = logging.getLogger(__name__)

SUB_TYPES = {pb.CommandSubscribe.Exclusive: SubscriptionType.EXCLUSIVE,
             pb.CommandSubscribe.Shared: SubscriptionType.SHARED,
             pb.CommandSubscribe.Failover: SubscriptionType.FAILOVER,
             pb.CommandSubscribe.Key_Shared: SubscriptionType.KEY_SHARED}
EARLIEST_ID = (1 << 64) - 1
"""``MessageId.earliest`` on the wire: ledger and entry -1 as uint64."""
LATEST_ID = (1 << 63) - 1
MessageIdLike = pb.MessageIdData | AckedId
"""An acknowledged id as protobuf read it or as ``hot_commands`` did (the same fields)."""


def message_of_run(consumer_id: int, run: EntryRun) -> tuple[bytes, bytes | memoryview]:
    """The MESSAGE frame of ``run``: its stored entry as the consumer receives it, with the ack
    set of the run's messages when it is only part of the entry."""
    return commands.message(consumer_id, run.ledger_id, run.entry_id, run.partition, run.redelivery_count,
                            run.ack_set(), run.frame_data())


@dataclass
class _Sent:
    first_offset: int
    batch_size: int
    offsets: Sequence[int]
    """Delivered and not yet acknowledged, ascending (a run's own sequence: a ``range`` for a
    whole entry, else a slot per message, where a set would cost a hash table per entry)."""


class _SentEntries:
    """Entries delivered to one consumer and not yet fully acknowledged (bounded, oldest go)."""

    def __init__(self, bound: int) -> None:
        self._entries: OrderedDict[tuple[int, int], _Sent] = OrderedDict()
        self._bound = bound

    def add(self, run: EntryRun) -> None:
        key = (run.ledger_id, run.entry_id)
        sent = self._entries.get(key)
        if sent is None:
            self._entries[key] = _Sent(run.first_offset, run.batch_size, run.offsets)
            if len(self._entries) > self._bound:
                self._entries.popitem(last=False)
        else:  # the rest of an entry, or part of it again (redelivered)
            sent.offsets = tuple(sorted({*sent.offsets, *run.offsets}))

    def get(self, ledger_id: int, entry_id: int) -> _Sent | None:
        return self._entries.get((ledger_id, entry_id))

    def forget(self, ledger_id: int, entry_id: int, offsets: Iterable[int]) -> None:
        sent = self._entries.get((ledger_id, entry_id))
        if sent is not None:
            gone = set(offsets)
            sent.offsets = tuple(o for o in sent.offsets if o not in gone)
            if not sent.offsets:
                del self._entries[(ledger_id, entry_id)]

    def forget_through(self, offset: int) -> None:
        for key in [k for k, s in self._entries.items() if s.first_offset + s.batch_size - 1 <= offset]:
            del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()


@dataclass(eq=False)
class _ClientConsumer:
    consumer_id: int
    topic: TopicName
    subscription: str
    sub_type: SubscriptionType
    durable: bool
    config: ConsumerConfig
    consumer: BrokerConsumer
    sent: _SentEntries
    signal: LoopSignal | None = None
    end_of_topic_sent: bool = False
    closed: bool = False
    extra: dict[str, object] = field(default_factory=dict)


class ConsumerHalf:
    """Every consumer of one connection."""

    def __init__(self, context: ConnectionContext, schemas: ProtocolSchemas) -> None:
        self._context = context
        self._schemas = schemas
        self._consumers: dict[int, _ClientConsumer] = {}
        self._moved_readers: set[tuple[TopicName, str]] = set()
        """Reader subscriptions moved by a seek, kept for the client's subscribe that follows."""

    def __len__(self) -> int:
        return len(self._consumers)

    def _get(self, consumer_id: int) -> _ClientConsumer | None:
        state = self._consumers.get(consumer_id)
        return None if state is None or state.closed else state

    def _requested(self, consumer_id: int, request_id: int) -> _ClientConsumer | None:
        """The open consumer a request names; None once the request was answered NotFound."""
        state = self._get(consumer_id)
        if state is None:
            self._context.out.write([commands.error(request_id, NotFound(f"consumer {consumer_id} is not open"))])
        return state

    # --- SUBSCRIBE ---------------------------------------------------------------------
    def subscribe(self, command: pb.CommandSubscribe) -> None:
        out = self._context.out
        if command.consumer_id in self._consumers:
            out.write([commands.error(command.request_id, ConsumerBusy(
                f"consumer id {command.consumer_id} is already in use on this connection"))])
            return
        try:
            state = self._open(command)
        except MagnetarError as exc:
            out.write([commands.error(command.request_id, exc)])
            return
        self._consumers[command.consumer_id] = state
        self._moved_readers.discard((state.topic, state.subscription))
        out.write([commands.success(command.request_id)])
        if state.sub_type is SubscriptionType.FAILOVER:
            self._announce_active(state)
        self._context.count("consumers_opened")
        assert state.signal is not None
        state.signal.notify()

    def _open(self, command: pb.CommandSubscribe) -> _ClientConsumer:
        context = self._context
        service = context.service
        topic = TopicName.parse(command.topic)
        context.authorize(Action.CONSUME, topic)
        service.namespaces.check_served_here(topic)  # ServiceNotReady elsewhere: the client looks it up again
        sub_type = SUB_TYPES.get(command.subType)
        if sub_type is None:
            raise InvalidRequest(f"unknown subscription type {command.subType}")
        if not command.force_topic_creation and topic.persistent and not service.topics.exists(topic):
            raise NotFound(f"topic {topic} does not exist")
        self._schemas.for_consumer(topic, command.schema if command.HasField("schema") else None)
        config = ConsumerConfig(name=command.consumer_name or f"consumer-{command.consumer_id}",
                                receiver_queue_size=0, priority_level=command.priority_level,
                                negative_ack_redelivery_delay_ms=0, whole_entries=True, track_ids=False,
                                address=context.address)
        durable = command.durable
        initial = self._initial(command, topic)
        consumer = service.subscriptions.subscribe(topic, command.subscription, sub_type, config, initial=initial,
                                                   durable=durable, compacted=command.read_compacted)
        state = _ClientConsumer(command.consumer_id, topic, command.subscription, sub_type, durable, config,
                                consumer, _SentEntries(context.settings.entries_remembered_max))
        self._bind(state)
        return state

    def _initial(self, command: pb.CommandSubscribe, topic: TopicName) -> str | int:
        """Where a new subscription starts: its initial position, or for a reader (non-durable)
        its start message id, as Pulsar's broker reads it: at that id's entry, whose messages
        up to the start (or before it, for an inclusive reader) the client skips itself."""
        earliest = command.initialPosition == pb.CommandSubscribe.Earliest
        if command.durable or not command.HasField("start_message_id"):
            return "earliest" if earliest else "latest"
        start = command.start_message_id
        if EARLIEST_ID in (start.ledgerId, start.entryId):
            return "earliest"
        if start.ledgerId >= LATEST_ID:
            return "latest"
        if not self._context.service.topics.exists(topic):
            return "earliest"
        found = self._context.service.admin.entry_offsets(topic, start.ledgerId, start.entryId)
        if found is None:
            return "earliest"
        return found[0]

    def _bind(self, state: _ClientConsumer) -> None:
        state.signal = LoopSignal(self._context.loop, lambda: self.deliver(state), direct_on_loop=True)
        state.consumer.listener = state.signal.notify

    def _announce_active(self, state: _ClientConsumer) -> None:
        """Tell every Failover consumer of this subscription on this connection whether it is active."""
        subscription = state.consumer.subscription
        active = subscription.active_consumer()
        for other in self._consumers.values():
            if other.consumer.subscription is subscription and not other.closed:
                self._context.out.write([commands.active_consumer_change(other.consumer_id,
                                                                         other.consumer is active)])

    # --- delivery ----------------------------------------------------------------------
    def deliver(self, state: _ClientConsumer) -> None:
        """Send what the broker consumer holds for the client (runs on the loop when it has news)."""
        if state.closed:
            return
        if state.consumer.closed:  # the broker closed it (forced subscription delete)
            self._drop(state)
            self._context.out.write([commands.close_consumer(state.consumer_id, 0)])
            return
        if self._context.out.congested:
            return
        runs = state.consumer.poll_all()
        if runs:
            buffers: list[bytes | memoryview] = []
            messages = 0
            for run in runs:
                state.sent.add(run)
                buffers.extend(message_of_run(state.consumer_id, run))
                messages += len(run.offsets)
            self._context.out.write(buffers)
            self._context.count("messages_out", messages)
        self._check_end_of_topic(state)

    def deliver_all(self) -> None:
        """The connection drained: send what waited meanwhile."""
        for state in list(self._consumers.values()):
            self.deliver(state)

    def _check_end_of_topic(self, state: _ClientConsumer) -> None:
        if not state.end_of_topic_sent and state.consumer.end_of_topic():
            state.end_of_topic_sent = True
            self._context.out.write([commands.reached_end_of_topic(state.consumer_id)])

    def flow(self, command: pb.CommandFlow | FlowCommand) -> None:
        state = self._get(command.consumer_id)
        if state is None:
            return  # a flow racing a close: Pulsar ignores it too
        state.consumer.flow(min(command.messagePermits, FLOW_PERMITS_MAX))

    # --- acknowledgement ---------------------------------------------------------------
    def ack(self, command: pb.CommandAck | AckCommand) -> None:
        state = self._get(command.consumer_id)
        failure: BaseException | None = None
        if state is None:
            failure = NotFound(f"consumer {command.consumer_id} is not open on this connection")
        elif not state.topic.persistent:
            state.sent.clear()  # a non-persistent topic stores nothing to acknowledge
        else:
            try:
                if command.ack_type == pb.CommandAck.Cumulative:
                    self._ack_cumulative(state, command.message_id)
                else:
                    self._ack_individual(state, command.message_id)
            except MagnetarError as exc:
                failure = exc
        request_id = command.request_id if isinstance(command, AckCommand) or command.HasField("request_id") \
            else None
        if request_id is not None:
            self._context.out.write([commands.ack_response(command.consumer_id, request_id, failure)])
        elif failure is not None and state is not None:
            log.warning("acknowledgement on %s refused: %s", state.topic, failure)

    def _ack_individual(self, state: _ClientConsumer, ids: Iterable[MessageIdLike]) -> None:
        offsets: list[int] = []
        for mid in ids:
            found = self._offsets_of(state, mid)
            offsets.extend(found)
            state.sent.forget(mid.ledgerId, mid.entryId, found)
        if offsets:
            state.consumer.ack(offsets)
            self._context.count("acks", len(offsets))
            self._check_end_of_topic(state)

    def _offsets_of(self, state: _ClientConsumer, mid: MessageIdLike) -> list[int]:
        """The offsets an acknowledged (or redelivered) id names: with an ack set the batch
        indexes whose bits are clear, else every message of the entry this consumer received
        (or, for an entry it never received, the whole entry)."""
        sent = state.sent.get(mid.ledgerId, mid.entryId)
        held: Sequence[int]
        if sent is not None:
            first, size, held = sent.first_offset, sent.batch_size, sent.offsets
        else:
            found = self._entry_offsets(state, mid.ledgerId, mid.entryId)
            if found is None:
                return []
            first, size = found[0], found[1] - found[0] + 1
            held = range(found[0], found[1] + 1)
        if len(mid.ack_set):
            holding = set(held)
            return [first + i for i in cleared_indexes(mid.ack_set, size) if first + i in holding]
        return list(held)

    def _entry_offsets(self, state: _ClientConsumer, ledger_id: int, entry_id: int) -> tuple[int, int] | None:
        if ledger_id >= LATEST_ID or entry_id >= LATEST_ID:
            return None
        return self._context.service.admin.entry_offsets(state.topic, ledger_id, entry_id)

    def _ack_cumulative(self, state: _ClientConsumer, ids: Iterable[MessageIdLike]) -> None:
        for mid in ids:
            offset = self._cumulative_offset(state, mid)
            if offset is None or offset < 0:
                continue
            state.consumer.ack_cumulative(offset)
            state.sent.forget_through(offset)
            self._context.count("acks")
        self._check_end_of_topic(state)

    def _cumulative_offset(self, state: _ClientConsumer, mid: MessageIdLike) -> int | None:
        """The last offset a cumulative ack covers. Clients that cannot ack part of a batch ack
        the entry before it, which may be ``ledger:-1``: then everything before the next entry."""
        sent = state.sent.get(mid.ledgerId, mid.entryId)
        found = (sent.first_offset, sent.first_offset + sent.batch_size - 1) if sent is not None else \
            self._entry_offsets(state, mid.ledgerId, mid.entryId)
        if found is None:
            following = state.sent.get(mid.ledgerId, mid.entryId + 1)
            if following is not None:
                return following.first_offset - 1
            after = self._entry_offsets(state, mid.ledgerId, mid.entryId + 1)
            return None if after is None else after[0] - 1
        first, last = found
        if len(mid.ack_set):
            cleared = set(cleared_indexes(mid.ack_set, last - first + 1))
            leading = 0
            while leading in cleared:
                leading += 1
            return first + leading - 1
        if mid.batch_index >= 0:
            return min(first + mid.batch_index, last)
        return last

    def redeliver(self, command: pb.CommandRedeliverUnacknowledgedMessages) -> None:
        state = self._get(command.consumer_id)
        if state is None:
            return
        if len(command.message_ids):
            offsets = [o for mid in command.message_ids for o in self._offsets_of(state, mid)
                       if o in state.consumer.unacked]
        else:
            offsets = list(state.consumer.unacked)
        if offsets:
            state.consumer.nack(offsets)
            self._context.count("redelivered", len(offsets))

    # --- seek, last message id ------------------------------------------------------------
    def seek(self, command: pb.CommandSeek) -> None:
        """Move the subscription, as Pulsar's broker does: the consumer is closed first (what it
        held comes back), the cursor moved, the client told with CLOSE_CONSUMER, then SUCCESS;
        the client subscribes again and reads from the new position."""
        state = self._requested(command.consumer_id, command.request_id)
        if state is None:
            return
        out = self._context.out
        try:
            if not state.topic.persistent:
                raise NotAllowed(f"{state.topic} is non-persistent: nothing is stored to seek in")
            move = self._seek_move(state, command)
        except MagnetarError as exc:
            out.write([commands.error(command.request_id, exc)])
            return
        self._drop(state)
        try:
            self._context.service.subscriptions.move_cursor(state.topic, state.subscription, move)
        except MagnetarError as exc:
            out.write([commands.close_consumer(state.consumer_id, 0), commands.error(command.request_id, exc)])
            self._end_non_durable(state)
            return
        if not state.durable:
            self._moved_readers.add((state.topic, state.subscription))
        out.write([commands.close_consumer(state.consumer_id, 0), commands.success(command.request_id)])

    def _seek_move(self, state: _ClientConsumer, command: pb.CommandSeek):  # type: ignore[no-untyped-def]
        if command.HasField("message_publish_time"):
            timestamp_ms = command.message_publish_time
            return lambda cursor: cursor.reset_to_time(timestamp_ms)
        if not command.HasField("message_id"):
            raise InvalidRequest("SEEK needs a message id or a publish time")
        mid = command.message_id
        ml_topic = state.topic
        if EARLIEST_ID in (mid.ledgerId, mid.entryId):
            offset = self._context.service.admin.offsets(ml_topic, None)[ml_topic.full_name]["first"]
        elif mid.ledgerId >= LATEST_ID:
            offset = self._context.service.admin.offsets(ml_topic, None)[ml_topic.full_name]["next"]
        else:
            found = self._entry_offsets(state, mid.ledgerId, mid.entryId)
            if found is None:
                raise NotFound(f"{state.topic} holds no message {mid.ledgerId}:{mid.entryId}")
            offset = found[0] + max(mid.batch_index, 0) if mid.batch_index >= 0 else found[0]
        return lambda cursor: cursor.reset_to_offset(offset)

    def last_message_id(self, command: pb.CommandGetLastMessageId) -> None:
        state = self._requested(command.consumer_id, command.request_id)
        if state is None:
            return
        out = self._context.out
        try:
            message_id, _ = self._context.service.admin.last_message_id(state.topic)
            mark_delete = state.consumer.subscription.cursor.mark_delete_position()
        except MagnetarError as exc:
            out.write([commands.error(command.request_id, exc)])
            return
        out.write([commands.last_message_id(command.request_id, message_id.ledger_id, message_id.entry_id,
                                            state.topic.partition_index, message_id.batch_index,
                                            (mark_delete.ledger_id, mark_delete.entry_id))])

    def stats(self, command: pb.CommandConsumerStats) -> None:
        state = self._requested(command.consumer_id, command.request_id)
        if state is None:
            return
        stats = state.consumer.statistics()
        backlog = state.consumer.backlog_messages()
        self._context.out.write([commands.consumer_stats(command.request_id, stats.name, stats.available_permits,
                                                         stats.unacked_messages, stats.blocked_on_unacked,
                                                         state.sub_type.value, backlog)])

    # --- UNSUBSCRIBE, CLOSE_CONSUMER, connection end ------------------------------------------
    def unsubscribe(self, command: pb.CommandUnsubscribe) -> None:
        state = self._requested(command.consumer_id, command.request_id)
        if state is None:
            return
        out = self._context.out
        subscription = state.consumer.subscription
        others = [c for c in subscription.consumers if c is not state.consumer]
        if others and not command.force:
            out.write([commands.error(command.request_id, ConsumerBusy(
                f"subscription {state.subscription} has other consumers"))])
            return
        for other in others:
            other.close()
            if other.listener is not None:
                other.listener()
        self._drop(state)
        try:
            self._context.service.subscriptions.unsubscribe(state.topic, state.subscription)
        except (NotFound, NotAllowed) as exc:
            out.write([commands.error(command.request_id, exc)])
            return
        except MagnetarError as exc:
            out.write([commands.error(command.request_id, exc)])
            return
        out.write([commands.success(command.request_id)])

    def close(self, command: pb.CommandCloseConsumer) -> None:
        state = self._consumers.get(command.consumer_id)
        if state is not None:
            self._drop(state)
            self._end_non_durable(state)
        self._context.out.write([commands.success(command.request_id)])

    def unloaded(self, names: set[TopicName]) -> None:
        """The topics stopped being served here: their consumers are closed (the broker's
        already are) and the client told with CLOSE_CONSUMER, so it looks the topic up again and
        subscribes at the new owner, where the subscription resumes from its acknowledged
        position."""
        for state in list(self._consumers.values()):
            if state.topic in names and not state.closed:
                self._drop(state)
                self._context.out.write([commands.close_consumer(state.consumer_id, 0)])

    def revoked(self, names: set[TopicName]) -> None:
        """The role may no longer consume from these topics: their consumers are closed (what
        they held unacknowledged goes back to the subscription) and the client told with
        CLOSE_CONSUMER; a reader's subscription ends with its consumer."""
        for state in [s for s in self._consumers.values() if s.topic in names and not s.closed]:
            self._drop(state)
            self._end_non_durable(state)
            self._context.out.write([commands.close_consumer(state.consumer_id, 0)])
            self._context.count("consumers_revoked")

    def topics(self) -> set[TopicName]:
        """The topics of the consumers open here."""
        return {state.topic for state in self._consumers.values() if not state.closed}

    def topic_of(self, consumer_id: int) -> TopicName | None:
        """The topic of the open consumer ``consumer_id`` (None: none is open under that id)."""
        state = self._get(consumer_id)
        return None if state is None else state.topic

    def _drop(self, state: _ClientConsumer) -> None:
        self._consumers.pop(state.consumer_id, None)
        if state.closed:
            return
        state.closed = True
        state.consumer.listener = None
        state.consumer.close()

    def _end_non_durable(self, state: _ClientConsumer) -> None:
        if state.durable or state.consumer.subscription.consumers:
            return
        try:
            self._context.service.subscriptions.unsubscribe(state.topic, state.subscription)
        except MagnetarError as exc:
            log.debug("reader subscription %s of %s already gone: %s", state.subscription, state.topic, exc)

    def close_all(self) -> None:
        for state in list(self._consumers.values()):
            self._drop(state)
            self._end_non_durable(state)
        for topic, name in self._moved_readers:
            try:
                self._context.service.subscriptions.unsubscribe(topic, name)
            except MagnetarError as exc:
                log.debug("reader subscription %s of %s already gone: %s", name, topic, exc)
        self._moved_readers.clear()
