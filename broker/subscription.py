"""Subscriptions: a cursor of a topic and its consumers, and the dispatch that feeds them.

A ``Subscription`` owns one durable (or non-durable) cursor of a topic and its consumers
(``broker/consumer.py``). Dispatch reads entries through the cursor (``broker/dispatch_reads.py``)
and hands each consumer runs of entries (``EntryRun``, ``broker/delivery.py``): an entry, or the
part of it the consumer gets, with the entry's stored bytes. It skips acknowledged and
not-yet-due (delayed) messages, and which consumer gets which messages is the dispatcher's of
the subscription's type (``broker/dispatcher.py``): Exclusive and Failover in
``broker/dispatch_single_active.py``, Shared in ``broker/dispatch_shared.py``, Key_Shared in
``broker/dispatch_key_shared.py``. The edges split runs into messages where they need them.
Transports (WebSocket, HTTP pull, the binary protocol) only call ``flow``, ``poll``, ``ack``,
``nack`` and ``close`` on a ``Consumer`` and are told through a listener callback that runs are
waiting.

Limits: besides each consumer's (permits, unacknowledged messages and bytes, its outbox's
bytes: ``broker/consumer.py``), the subscription's unacknowledged limit
(``SubscriptionLimits.unacked_messages_max``) pauses delivery at the limit (a run is cut there)
and resumes at half.

Memory, in bytes (``footprint``: a run counts its share of its entry's bytes, a record and a
slot per message): a read is bounded by ``SubscriptionLimits.read_bytes_max`` and by the room
the outboxes of the consumers that can take have (``broker/dispatch_reads.py``); runs wait in
a consumer's outbox, at most ``consumer_pending_bytes_max`` of them. What a consumer holds
unacknowledged, and what waits for redelivery or its delay, is kept as positions only
(``broker/unacked.py``, ``broker/redelivery.py``) and read again when it is delivered again, so
a consumer that never acknowledges pins no entries. What dispatch holds (read ahead, or in
outboxes) is added to the broker-wide reads-in-flight budget (``broker/byte_budget.py``) at the
end of each dispatch round and each take; while the budget refuses, no read starts and the
subscription waits for a wake-up.

Quotas (``broker/quotas.py``): each consumer holds a consumer slot of its topic partition from
``add_consumer`` to its removal (``ConsumerBusy`` beyond ``maxConsumers``), and a dispatch round
delivers while the topic's dispatch rate has tokens left; when it has none it stops and asks
for another round once it will have (``schedule_after``), as Pulsar's dispatcher backs off.

Redelivery (``broker/redelivery.py``): negative acks (after
``negative_ack_redelivery_delay_ms``), ack timeouts and consumer departures put messages back,
oldest first, with ``redelivery_count`` incremented (the messages of one run share a count: a
run is cut where counts differ). When the last consumer leaves, nothing stays read: what was
read ahead, or waits for redelivery or a delay, is dropped and the cursor rewound, so the next
consumer reads again from the oldest unacknowledged message (a nack's delay ends with its
consumer, as Pulsar's clients keep it). Delayed messages (``deliverAt``/``deliverAfterMs``)
wait for the injected clock.

Cost: a consumer joining or leaving, a flow, a delivery and an acknowledgement cost the same
however many consumers the subscription has: the unacknowledged count (``UnackedTally``), the
permits and who holds them (``_with_permits``, ``_permits_total``) and the consumers' outbox
bytes together (``_outbox_bytes_total``) are kept as they change, and each dispatcher keeps what
its decisions need. A delivery costs one run (one record, one outbox slot) however many messages
of its entry it carries; what stays per message is the bookkeeping acknowledgements need (who
holds each offset unacknowledged).

Administrative cursor moves (reset by time or message id, skip, expiry) go through
:meth:`Subscription.reposition`, so connected consumers get everything unacknowledged from the
new position and never a message the move acknowledged (Pulsar's "clear backlog still
redelivers" complaint).

Invariant: all of a subscription's state, its consumers' and its dispatcher's changes under the
subscription's lock; listeners and the budget are told outside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import repeat

from broker.byte_budget import BudgetShare, ByteBudget
from broker.compaction import CompactedView
from broker.consumer import Consumer, ConsumerConfig
from broker.cursor import ManagedCursor
from broker.delivery import MESSAGE_BYTES, RUN_BYTES, Delivery, EntryRun
from broker.dispatch_key_shared import KeySharedDispatcher, entry_key_hashes
from broker.dispatch_reads import DispatchReads, WaitingEntry
from broker.dispatch_shared import SharedDispatcher
from broker.dispatch_single_active import SingleActiveConsumerDispatcher
from broker.dispatcher import Dispatcher
from broker.errors import InvalidRequest, NotAllowed
from broker.limits import PENDING_MESSAGES_MAX
from broker.quotas import TopicQuotas
from broker.redelivery import DeadLetter, Redeliveries
from broker.subscription_stats import SubscriptionStats
from broker.subscription_type import SubscriptionType
from broker.unacked import EntryRef, UnackedTally, pop_each

_new_run = tuple.__new__
"""``EntryRun(...)`` without the named tuple's Python-level ``__new__``: one is built per run delivered."""


@dataclass(frozen=True)
class SubscriptionLimits:
    unacked_messages_max: int = 200_000
    read_bytes_max: int = 1024 * 1024
    """Entry bytes one read takes at most (Pulsar's ``dispatcherMaxReadSizeBytes``); one entry
    is always read, however large."""
    consumer_pending_bytes_max: int = 1024 * 1024
    """Footprint of runs waiting in one consumer's outbox for its transport; at the bound the
    consumer gets nothing more until the transport took them (one run always goes)."""


class Subscription:
    def __init__(self, topic_name: str, partition: int, cursor: ManagedCursor, sub_type: SubscriptionType, *,
                 clock: Callable[[], float] = time.time, limits: SubscriptionLimits | None = None,
                 dead_letter: DeadLetter | None = None,
                 schedule: Callable[[Callable[[], None]], None] | None = None,
                 budget: ByteBudget | None = None, quotas: TopicQuotas | None = None,
                 schedule_after: Callable[[float, Callable[[], None]], None] | None = None) -> None:
        """``budget``: the broker-wide reads-in-flight budget; ``quotas``: the topic partition's
        (consumer slots, dispatch rate); ``schedule_after`` runs a dispatch later, once a
        throttled one may go on (without it, the next ``tick``)."""
        self.topic_name = topic_name
        self.partition = partition
        self.cursor = cursor
        self.name = cursor.name
        self._clock = clock
        self.limits = limits or SubscriptionLimits()
        self._budget = BudgetShare(budget, lambda: self._schedule(self.dispatch))
        """Its share of the broker-wide reads-in-flight budget (None: unbounded)."""
        self._outbox_bytes_total = 0
        """The consumers' ``outbox_bytes`` together (kept as they change)."""
        self._lock = threading.RLock()
        self.consumers: dict[Consumer, None] = {}
        """In the order they joined (a dict: one leaves at the cost of one joining)."""
        self._timed: dict[Consumer, None] = {}
        """The consumers with an ack timeout, which ``tick`` visits."""
        self.unacked_tally = UnackedTally()
        self._with_permits: dict[Consumer, None] = {}
        """Open consumers with permits, in the order they are served next (round-robin: the one
        served moves to the end), so dispatch never walks the consumers that have none."""
        self._permits_total = 0
        """The positive permits of the open consumers, together."""
        self._redelivery = Redeliveries(topic_name, partition, cursor, dead_letter)
        self._reads = DispatchReads(cursor, self._redelivery, self.limits.read_bytes_max, clock)
        self._owner: dict[int, Consumer] = {}  # offset -> consumer holding it unacked
        self._sent_at: dict[int, float] = {}  # offset -> when sent, to consumers with an ack timeout
        self._blocked = False
        self.msg_out = self.bytes_out = self.redelivered = 0
        self._rates = (0.0, 0.0, 0.0)  # messages/s out, bytes/s out, redeliveries/s
        self._rate_base = (self._clock(), 0, 0, 0)
        self._schedule = schedule or (lambda work: work())
        self._quotas = quotas or TopicQuotas(topic_name, clock)
        self._schedule_after = schedule_after
        self._type = sub_type
        self._by_key: KeySharedDispatcher | None = None
        """The Key_Shared dispatcher, which follows who holds each key (None on the other types)."""
        self._dispatcher = self._new_dispatcher()
        self._on_publish = lambda: self._schedule(self.dispatch)
        cursor.ml.add_listener(self._on_publish)

    @property
    def type(self) -> SubscriptionType:
        return self._type

    @type.setter
    def type(self, sub_type: SubscriptionType) -> None:
        """(While no consumer is connected, or to the same type.) A new type gets its dispatcher."""
        if sub_type is not self._type:
            self._type = sub_type
            self._dispatcher = self._new_dispatcher()

    def _new_dispatcher(self) -> Dispatcher:
        """The dispatcher of the subscription's type; dispatch reads decode what it routes by."""
        sub_type = self._type
        self._by_key = None
        dispatcher: Dispatcher
        if sub_type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            dispatcher = SingleActiveConsumerDispatcher(self.name, self.consumers, self._hand,
                                                        failover=sub_type is SubscriptionType.FAILOVER)
        elif sub_type is SubscriptionType.SHARED:
            dispatcher = SharedDispatcher(self._with_permits, self._hand)
        else:
            dispatcher = self._by_key = KeySharedDispatcher(self._with_permits, self._hand, self._deliver, self._room)
        self._reads.route_by(delayable=sub_type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED),
                             key_hashes=entry_key_hashes if self._by_key is not None else None)
        return dispatcher

    def read_compacted(self, view: Callable[[], CompactedView | None]) -> None:
        """Read the compacted view (``view``: the topic's latest) below its horizon, then the
        topic (a read-compacted consumer subscribed)."""
        with self._lock:
            self._reads.compacted = view

    def end_of_topic(self) -> bool:
        """The topic is terminated and this subscription has acknowledged all of it."""
        return self.cursor.ml.terminated and self.cursor.backlog_messages() == 0

    def backlog_messages(self) -> int:
        """Messages of the topic this subscription has not acknowledged yet."""
        return self.cursor.backlog_messages()

    def detach(self) -> None:
        """Stop following the topic (the subscription is being removed) and give back what it
        holds of the reads-in-flight budget."""
        self.cursor.ml.remove_listener(self._on_publish)
        with self._lock:
            self._reads.clear()
            for consumer in self.consumers:
                self._clear_outbox(consumer)
        self._settle()

    # --- consumers -----------------------------------------------------------------------
    def add_consumer(self, config: ConsumerConfig) -> Consumer:
        if config.receiver_queue_size < 0:
            raise InvalidRequest("receiverQueueSize must be >= 0")
        with self._lock:
            self._dispatcher.admit()  # ConsumerBusy: an Exclusive subscription's second consumer
            self._quotas.add_consumer()  # ConsumerBusy at the topic's maxConsumers
            consumer = Consumer(self, config, self.limits.consumer_pending_bytes_max)
            consumer.update_rates(self._clock())  # its rates count from now
            self.consumers[consumer] = None
            if config.ack_timeout_ms > 0:
                self._timed[consumer] = None
            self._redelivery.joined(consumer)
            lost_activity = self._dispatcher.joined(consumer)
            if lost_activity is not None:
                self._take_back(lost_activity)
        return consumer

    def remove_consumer(self, consumer: Consumer) -> None:
        with self._lock:
            if consumer not in self.consumers:
                return
            consumer.permits = 0
            consumer.closed = True
            del self.consumers[consumer]
            self._quotas.remove_consumer()
            self._timed.pop(consumer, None)
            self._redelivery.left(consumer)
            self._take_back(consumer)
            self._dispatcher.left(consumer)
            if not self.consumers:  # nobody to read for: nothing stays read ahead, all is read again
                self._reads.clear()
                self._redelivery.clear()
                self.cursor.rewind()
        self.dispatch()

    def _take_back(self, consumer: Consumer) -> None:
        """Redeliver everything ``consumer`` holds unacknowledged (it left or lost activity)."""
        taken = sorted(consumer.unacked.items())
        for offset, held in taken:
            self._release(offset, consumer)
            self._redelivery.put(offset, held)
        self._redelivery.bump([offset for offset, _ in taken])
        consumer.unacked.clear()
        self._clear_outbox(consumer)

    def _clear_outbox(self, consumer: Consumer) -> None:
        consumer.outbox.clear()
        consumer.outbox_bytes = 0

    def active_consumer(self) -> Consumer | None:
        """The consumer an Exclusive or Failover subscription delivers to (None: nobody, or
        another type)."""
        with self._lock:
            return self._dispatcher.active()

    def _permits_changed(self, consumer: Consumer, old: int, new: int) -> None:
        """Follow a change of an open consumer's permits (a closed one's count for nothing: it
        loses its permits before it closes)."""
        if consumer.closed:
            return
        self._permits_total += max(new, 0) - max(old, 0)
        if new > 0:
            if old <= 0:
                self._with_permits[consumer] = None
        elif old > 0:
            self._with_permits.pop(consumer, None)

    def _holds(self, consumer: Consumer, delivery: Delivery) -> bool:
        """:meth:`Consumer.holds`."""
        with self._lock:
            return delivery.offset in consumer.unacked and \
                self._redelivery.counts.get(delivery.offset, 0) == delivery.redelivery_count

    # --- flow and delivery ---------------------------------------------------------------
    def _flow(self, consumer: Consumer, permits: int) -> None:
        with self._lock:
            consumer.permits += permits
        self.dispatch()

    def dispatch(self) -> None:
        """Deliver as much as permits, limits, ordering and the reads-in-flight budget allow."""
        notify: dict[Consumer, None] = {}
        with self._lock:
            self._redelivery.release_due(int(self._clock() * 1000), self._reads.load)
            now = self._clock()  # one reading per round: when this round's deliveries were sent
            held: list[WaitingEntry] = []
            held_messages = 0
            quotas, dispatcher = self._quotas, self._dispatcher
            while self._any_can_take():
                if quotas.dispatch is not None and self._throttled(now):
                    break
                waiting = self._next_waiting()
                if waiting is None:
                    break
                offsets = self._undelivered(waiting)
                if not offsets:
                    continue
                left = dispatcher.dispatch(waiting, offsets, now, notify)
                if left is not None:  # no consumer can take these now (their key's is busy)
                    held.append(left)
                    held_messages += len(left.offsets)
                    if held_messages >= PENDING_MESSAGES_MAX:
                        break
            for waiting in reversed(held):  # each back where it came from, so the order holds
                self._reads.put_back(waiting, waiting.offsets)
            self._reads.end_round()
            delta = self._budget.delta(self._held_bytes())
        self._budget.tell(delta)
        for consumer in notify:
            if consumer.listener is not None:
                consumer.listener()

    def _undelivered(self, waiting: WaitingEntry) -> Sequence[int]:
        """The offsets of ``waiting`` to deliver: not acknowledged, nor held by a consumer since
        before a reposition (the checks per message only when some may be)."""
        offsets = waiting.offsets
        cursor, owner = self.cursor, self._owner
        first, end = offsets[0], offsets[-1] + 1
        if first < cursor.mark_delete_offset or (len(cursor.acked) and cursor.acked.count_in(first, end)) \
                or (owner and not owner.keys().isdisjoint(offsets)):
            is_acked = cursor.is_acked
            return [o for o in offsets if not is_acked(o) and o not in owner]
        return offsets

    def _hand(self, consumer: Consumer, waiting: WaitingEntry, offsets: Sequence[int], now: float,
              notify: dict[Consumer, None]) -> None:
        """Give ``consumer`` as much of ``offsets`` as it takes now (all of them for a
        ``whole_entries`` one); the rest goes back to wait at the head."""
        count = len(offsets)
        take = count if count == 1 or consumer.config.whole_entries else \
            min(count, consumer._room(waiting.position.size), self._room())
        if take < count:
            self._deliver(consumer, waiting, offsets[:take], now)
            self._reads.put_back(waiting, offsets[take:])
        else:
            self._deliver(consumer, waiting, offsets, now)
        notify[consumer] = None

    def _room(self) -> int:
        """Messages the subscription's unacknowledged limit lets through (at least one)."""
        return max(self.limits.unacked_messages_max - self.unacked_tally.messages, 1)

    def _throttled(self, now: float) -> bool:
        """The topic's dispatch rate has no token left: another round is asked for once it will."""
        delay_s = self._quotas.dispatch_delay_s(now)
        if delay_s <= 0:
            return False
        if self._schedule_after is not None:
            self._schedule_after(delay_s, self.dispatch)
        return True

    # --- what dispatch holds, in bytes ---------------------------------------------------
    def _held_bytes(self) -> int:
        """(Under the lock.) What dispatch holds: read and not yet delivered, and in outboxes."""
        return max(self._reads.pending_bytes, 0) + self._outbox_bytes_total

    def _settle(self) -> None:
        with self._lock:
            delta = self._budget.delta(self._held_bytes())
        self._budget.tell(delta)

    def _taken(self, was_full: bool) -> None:
        """A transport took runs from a consumer's outbox: they leave the budget, and an
        outbox that was full lets dispatch go on."""
        self._settle()
        if was_full:
            self._schedule(self.dispatch)

    def _any_can_take(self) -> bool:
        total = self.unacked_tally.messages
        limit = self.limits.unacked_messages_max
        if total >= limit:
            self._blocked = True
        elif self._blocked and total <= limit // 2:
            self._blocked = False
        if self._blocked:
            return False
        return self._dispatcher.can_dispatch()

    def _next_waiting(self) -> WaitingEntry | None:
        """The next entry to dispatch: the oldest redelivery first (with every message of its
        entry waiting for redelivery, and what of it waits read ahead: a message waiting in
        both goes once), else what was read ahead, reading more when nothing is."""
        redelivery, reads = self._redelivery, self._reads
        while redelivery.due:
            waiting = reads.again(*redelivery.pop_entry())
            if waiting is not None:
                return waiting
        if not reads.pending and not self._budget.must_wait():
            reads.read_more(self._with_permits, self._permits_total)
        return reads.pending.popleft() if reads.pending else None

    def _run(self, position: EntryRef, data: bytes, offsets: Sequence[int], redelivery_count: int) -> EntryRun:
        return _new_run(EntryRun, (self.topic_name, position.ledger_id, position.entry_id, self.partition, data,
                                   position.first_offset, position.batch_size, offsets, redelivery_count,
                                   position.publish_time_ms))

    def _deliver(self, consumer: Consumer, waiting: WaitingEntry, offsets: Sequence[int], now: float) -> None:
        """Hand ``offsets`` of ``waiting`` to ``consumer`` as one run (a run per redelivery
        count, when they differ): one bookkeeping step per collection, not per message."""
        position = waiting.position
        if self._redelivery.counts:
            runs = self._runs_by_count(position, waiting.data, offsets)
            redelivered = sum(len(run.offsets) for run in runs if run.redelivery_count)
            consumer.redelivered += redelivered
            self.redelivered += redelivered
            consumer.outbox.extend(runs)
            run_count = len(runs)
        else:
            consumer.outbox.append(_new_run(EntryRun, (
                self.topic_name, position.ledger_id, position.entry_id, self.partition, waiting.data,
                position.first_offset, position.batch_size, offsets, 0, position.publish_time_ms)))
            run_count = 1
        count = len(offsets)
        entry_bytes = position.size * count
        run_bytes = entry_bytes + run_count * RUN_BYTES + count * MESSAGE_BYTES  # footprint(), inline
        self._reads.pending_bytes -= run_bytes
        consumer.outbox_bytes += run_bytes
        consumer.permits -= count
        consumer.unacked.add_run(offsets, position)
        config = consumer.config
        if config.track_ids:
            consumer._remember(position)
        consumer.msg_out += count
        consumer.bytes_out += entry_bytes
        self.msg_out += count
        self.bytes_out += entry_bytes
        if self._quotas.dispatch is not None:
            self._quotas.dispatched(count, entry_bytes)
        self._owner.update(zip(offsets, repeat(consumer)))
        if config.ack_timeout_ms > 0:  # only an ack timeout asks when a message was sent
            self._sent_at.update(zip(offsets, repeat(now)))
        if self._by_key is not None:
            self._by_key.hold(consumer, waiting, offsets)

    def _runs_by_count(self, position: EntryRef, data: bytes, offsets: Sequence[int]) -> list[EntryRun]:
        """``offsets`` as runs of one redelivery count each, in order."""
        get = self._redelivery.counts.get
        runs: list[EntryRun] = []
        start = 0
        for index in range(1, len(offsets) + 1):
            if index == len(offsets) or get(offsets[index], 0) != get(offsets[start], 0):
                runs.append(self._run(position, data, offsets[start:index], get(offsets[start], 0)))
                start = index
        return runs
    def _release(self, offset: int, consumer: Consumer) -> None:
        """Forget that ``consumer`` holds ``offset`` (acked, nacked, timed out or taken back)."""
        self._owner.pop(offset, None)
        self._sent_at.pop(offset, None)
        if self._by_key is not None:
            self._by_key.release(offset)

    # --- administrative cursor moves ------------------------------------------------------
    def reposition(self, move: Callable[[], Future[None] | None]) -> Future[None] | None:
        """Apply ``move`` (a cursor reset, skip or expiry) so that dispatch follows it.

        Under the subscription's lock: the move runs; runs in a consumer's outbox (not yet
        taken by its transport) are withdrawn and their permits returned; messages a consumer
        holds unacknowledged stay with it unless the move acknowledged them (then they are
        released, so they are never redelivered); everything read ahead or waiting for
        redelivery is dropped and the cursor rewound. Dispatch then delivers every
        unacknowledged message from the new position on, in order, except those still held.
        A nacked message loses its redelivery delay.
        """
        with self._lock:
            result = move()
            for consumer in self.consumers:
                for run in consumer.outbox:
                    for offset in run.offsets:
                        self._release(offset, consumer)
                        consumer.unacked.pop(offset)
                    consumer.permits += len(run.offsets)
                self._clear_outbox(consumer)
                for offset in [o for o in consumer.unacked if self.cursor.is_acked(o)]:
                    self._release(offset, consumer)
                    consumer.unacked.pop(offset)
            self._reads.clear()
            self._redelivery.clear()
            self.cursor.rewind()
        self.dispatch()
        return result

    def _withdraw(self, consumer: Consumer) -> None:
        with self._lock:
            consumer.permits = 0
            for run in consumer.outbox:
                for offset in run.offsets:
                    self._release(offset, consumer)
                    held = consumer.unacked.pop(offset)
                    if held is not None:
                        self._redelivery.put(offset, held)
            self._clear_outbox(consumer)
        self.dispatch()

    # --- acknowledgement -------------------------------------------------------------------
    def _ack(self, consumer: Consumer, offsets: list[int]) -> None:
        with self._lock:
            counts = self._redelivery.counts
            if self._by_key is not None:
                for offset in offsets:
                    self._release(offset, consumer)
                    consumer.unacked.pop(offset)
                    counts.pop(offset, None)
            else:  # what _release does without a key owner to update, a collection at a time
                for held in (self._owner, self._sent_at, counts):
                    if held:
                        pop_each(held, offsets)
                consumer.unacked.pop_all(offsets)
            future = self.cursor.ack(offsets)
        future.add_done_callback(lambda _f: None)
        self.dispatch()

    def _ack_cumulative(self, consumer: Consumer, offset: int) -> None:
        if self.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED):
            raise NotAllowed(f"cumulative acknowledgement is not allowed on {self.type.value} subscriptions")
        with self._lock:
            for held in [o for o in consumer.unacked if o <= offset]:
                self._release(held, consumer)
                consumer.unacked.pop(held)
                self._redelivery.counts.pop(held, None)
            self.cursor.ack_cumulative(offset)
        self.dispatch()

    def _nack(self, consumer: Consumer, offsets: list[int]) -> None:
        due_ms = int(self._clock() * 1000) + consumer.config.negative_ack_redelivery_delay_ms
        with self._lock:
            nacked = []
            for offset in offsets:
                held = consumer.unacked.get(offset)
                if held is None:
                    continue
                self._release(offset, consumer)
                consumer.unacked.pop(offset)
                nacked.append(offset)
                self._redelivery.delay(due_ms, offset, held)
            self._redelivery.bump(nacked)
        self.dispatch()

    # --- time-driven work ----------------------------------------------------------------
    def tick(self) -> None:
        """Apply ack timeouts, release due nacked/delayed messages and update the rates
        (call periodically)."""
        now = self._clock()
        with self._lock:
            self._update_rates(now)
            for consumer in list(self._timed):
                timeout_ms = consumer.config.ack_timeout_ms
                expired = [o for o in consumer.unacked if now - self._sent_at.get(o, now) >= timeout_ms / 1000.0]
                for offset in expired:
                    self._release(offset, consumer)
                    held = consumer.unacked.pop(offset)
                    assert held is not None
                    self._redelivery.put(offset, held)
                self._redelivery.bump(expired)
        self.dispatch()

    def _update_rates(self, now: float) -> None:
        since, msgs, byte_count, redelivered = self._rate_base
        elapsed = now - since
        if elapsed > 0:
            self._rates = ((self.msg_out - msgs) / elapsed, (self.bytes_out - byte_count) / elapsed,
                           (self.redelivered - redelivered) / elapsed)
            self._rate_base = (now, self.msg_out, self.bytes_out, self.redelivered)
        for consumer in self.consumers:
            consumer.update_rates(now)

    # --- stats ---------------------------------------------------------------------------
    def statistics(self) -> SubscriptionStats:
        with self._lock:
            return SubscriptionStats(
                name=self.name, type=self.type.value, durable=self.cursor.durable,
                msg_backlog=self.cursor.backlog_messages(),
                backlog_size_bytes=self.cursor.backlog_bytes(),
                unacked_messages=sum(len(c.unacked) for c in self.consumers),
                msg_out_counter=self.msg_out, bytes_out_counter=self.bytes_out,
                msg_redeliver_counter=self.redelivered, delayed_messages=self._redelivery.delayed_unacked(),
                msg_rate_out=self._rates[0], msg_throughput_out=self._rates[1], msg_rate_redeliver=self._rates[2],
                mark_delete_offset=self.cursor.mark_delete_offset, read_offset=self.cursor.read_offset,
                consumers=tuple(c.statistics() for c in self.consumers))
