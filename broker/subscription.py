"""Subscriptions and dispatch: Exclusive, Failover, Shared and Key_Shared, independent of transport.

A ``Subscription`` owns one durable (or non-durable) cursor of a topic and its consumers. The
dispatcher reads entries through the cursor, decodes them into messages, skips acknowledged and
not-yet-due (delayed) ones, and hands each message to one consumer chosen by the subscription
type. Transports (WebSocket, HTTP pull, a future binary protocol) only call ``flow``, ``poll``,
``ack``, ``nack`` and ``close`` on a ``Consumer`` and are told through a listener callback that
messages are waiting.

- **Exclusive**: one consumer; a second is refused with ``ConsumerBusy``.
- **Failover**: the active consumer is the first by (priority level, name); on a switch its
  unacknowledged messages are redelivered to the new active one.
- **Shared**: round-robin among consumers with permits; a departing consumer's unacknowledged
  messages go to the others.
- **Key_Shared**: ``murmur3_32(key) & 0x7fffffff % 65536`` is split into ranges by consistent
  hashing (100 points per consumer). Per-key order holds while consumers join and leave: a
  message is never handed to one consumer while an earlier message of its key is unacknowledged
  at another; it waits (other keys flow on) until that one is acked or redelivered.

Flow control: a consumer receives only while it has permits (``receiverQueueSize`` in push
mode, explicit in pull mode). Unacknowledged limits per consumer (messages, and payload bytes:
``unacked_bytes_max``, so large messages cannot pin gigabytes in one slow consumer) and per
subscription pause delivery at the limit and resume at half; a consumer holding nothing
always gets one message, however large. A consumer configured with ``whole_entries`` (the
binary protocol's: Pulsar's clients acknowledge a batch as one) gets the rest of an entry with
its first message, past its permits, as Pulsar's broker delivers. The dispatcher reads only as many entries as the
consumers' permits need and holds at most one entry beyond them, so a slow consumer never makes
the broker buffer without bound.

Quotas (``broker/quotas.py``): each consumer holds a consumer slot of its topic partition from
``add_consumer`` to its removal (``ConsumerBusy`` beyond ``maxConsumers``), and a dispatch round
delivers while the topic's dispatch rate has tokens left; when it has none it stops and asks
for another round once it will have (``schedule_after``), as Pulsar's dispatcher backs off.

Redelivery: negative acks (after ``negative_ack_redelivery_delay_ms``), ack timeouts and
consumer departures put messages back, oldest first, with ``redelivery_count`` incremented.
Counts are persisted with the cursor state (Pulsar loses them on restart). After
``max_redeliver_count`` a message goes to the dead-letter topic exactly once and is acked on
the source. Delayed messages (``deliverAt``/``deliverAfterMs``) wait for the injected clock.

Cost: a consumer joining or leaving, a flow, a delivery and an acknowledgement cost the same
however many consumers the subscription has: the unacknowledged count (``UnackedTally``), the
permits and who holds them are kept as they change (the Shared round-robin walks only the
consumers with permits: the one served goes to the end of the turn), the active consumer is
worked out once per change of the consumers, and a Key_Shared consumer's points go in and out
of the sorted ring without rebuilding it.

Administrative cursor moves (reset by time or message id, skip, expiry) go through
:meth:`Subscription.reposition`, so connected consumers get everything unacknowledged from the
new position and never a message the move acknowledged (Pulsar's "clear backlog still
redelivers" complaint).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import repeat
from typing import Any, NamedTuple

import mmh3

from broker.cursor import ManagedCursor
from broker.entry_format import DecodedMessage, decode_messages
from broker.errors import ConsumerBusy, InvalidRequest, NotAllowed
from broker.message_id import MessageId
from broker.quotas import TopicQuotas

KEY_HASH_RANGE = 65536
POINTS_PER_CONSUMER = 100
READ_BATCH_ENTRIES = 100
PENDING_MESSAGES_MAX = 10_000
REDELIVERY_COUNTS_PERSISTED_MAX = 10_000
REDELIVERY_PROPERTY_PREFIX = "rc:"


class SubscriptionType(StrEnum):
    EXCLUSIVE = "Exclusive"
    FAILOVER = "Failover"
    SHARED = "Shared"
    KEY_SHARED = "Key_Shared"

    @classmethod
    def parse(cls, value: str) -> SubscriptionType:
        for member in cls:
            if member.value.lower() == value.lower():
                return member
        raise InvalidRequest(f"unknown subscription type {value!r}: use Exclusive, Failover, Shared or Key_Shared")


def key_hash(key: str | bytes) -> int:
    """Pulsar's sticky-key hash: Murmur3-32 made non-negative, in 0..65535."""
    data = key.encode() if isinstance(key, str) else key
    return (mmh3.hash(data, 0, signed=True) & 0x7FFFFFFF) % KEY_HASH_RANGE


@dataclass(frozen=True)
class ConsumerConfig:
    name: str
    receiver_queue_size: int = 1000
    priority_level: int = 0
    ack_timeout_ms: int = 0
    negative_ack_redelivery_delay_ms: int = 60_000
    max_redeliver_count: int = 0
    """0: never dead-letter."""
    dead_letter_topic: str | None = None
    unacked_messages_max: int = 50_000
    unacked_bytes_max: int = 16 * 1024 * 1024
    """Payload bytes delivered and not yet acknowledged before delivery pauses (resumes at half)."""
    whole_entries: bool = False
    """Deliver the rest of an entry with its first message, past the permits (which go negative),
    as Pulsar's broker does: Pulsar's clients acknowledge a batch only once every message of it
    arrived, so a batch split between deliveries would never be acknowledged."""
    track_ids: bool = True
    """Keep each delivered message's id for :meth:`Consumer.offset_of`; off for a transport that
    maps ids to offsets itself (the binary protocol, by entry), saving a map entry per message."""


@dataclass(frozen=True)
class SubscriptionLimits:
    unacked_messages_max: int = 200_000


class Delivery(NamedTuple):
    """One message handed to one consumer (a named tuple: one is built per message delivered)."""

    message_id: MessageId
    offset: int
    message: DecodedMessage
    publish_time_ms: int
    redelivery_count: int
    topic: str
    key_version: int | None = None
    """The message's version in its key's stream, when a key reader delivers it."""
    entry_data: bytes | None = None
    """The stored entry the message came from, byte for byte (broker prefix included), so a
    transport can forward the entry untouched (the binary protocol); None where there is no
    such entry (a compacted view)."""


@dataclass(order=True, slots=True)
class _Item:
    """A message waiting for dispatch (ordered by offset)."""

    offset: int
    message_id: MessageId = field(compare=False)
    message: DecodedMessage = field(compare=False)
    publish_time_ms: int = field(compare=False)
    key_hash: int = field(compare=False)
    deliver_at_ms: int = field(compare=False, default=0)
    entry_data: bytes | None = field(compare=False, default=None)


def _failover_rank(consumer: Consumer) -> tuple[int, str, int]:
    """A Failover subscription's active consumer is the first by this."""
    return consumer.config.priority_level, consumer.name, consumer.id


def _ring_points(consumer: Consumer) -> list[int]:
    """Where a Key_Shared consumer sits on the hash ring (``POINTS_PER_CONSUMER`` points)."""
    return [key_hash(f"{consumer.name}{consumer.id}-{point}") for point in range(POINTS_PER_CONSUMER)]


def _ring_hash(pair: tuple[int, Consumer]) -> int:
    return pair[0]


def _hash_of(message: DecodedMessage) -> int:
    """The sticky-key hash of a message's ordering key (else its key), -1 for neither."""
    key = message.ordering_key if message.ordering_key is not None else message.key
    return key_hash(key) if key is not None else -1


def _pop_each(held: dict[int, Any], offsets: list[int]) -> None:
    """``held.pop(offset, None)`` for each offset, the loop run by the interpreter's C code."""
    deque(map(held.pop, offsets, repeat(None)), maxlen=0)


_new_delivery = tuple.__new__
"""``Delivery(...)`` without the named tuple's Python-level ``__new__``: one is built per message
delivered, from values that are already a delivery's."""


@dataclass(frozen=True)
class ConsumerStats:
    name: str
    available_permits: int
    unacked_messages: int
    msg_out_counter: int
    bytes_out_counter: int
    msg_redeliver_counter: int
    blocked_on_unacked: bool


@dataclass(frozen=True)
class SubscriptionStats:
    """One subscription's counters; also the shape of a durable cursor nobody attached to since
    the broker started (``type`` None, dispatch counters zero: :meth:`idle`)."""

    name: str
    type: str | None
    durable: bool
    msg_backlog: int
    backlog_size_bytes: int
    unacked_messages: int
    msg_out_counter: int
    bytes_out_counter: int
    msg_redeliver_counter: int
    delayed_messages: int
    msg_rate_out: float
    msg_throughput_out: float
    msg_rate_redeliver: float
    mark_delete_offset: int
    read_offset: int
    consumers: tuple[ConsumerStats, ...]

    @classmethod
    def idle(cls, cursor: ManagedCursor) -> SubscriptionStats:
        return cls(cursor.name, None, cursor.durable, cursor.backlog_messages(), cursor.backlog_bytes(),
                   0, 0, 0, 0, 0, 0.0, 0.0, 0.0, cursor.mark_delete_offset, cursor.read_offset, ())


class UnackedTally:
    """Messages delivered and not acknowledged across a subscription's consumers (kept by their
    ``UnackedMessages``, so the subscription's limit costs one read, not a sum)."""

    __slots__ = ("messages",)

    def __init__(self) -> None:
        self.messages = 0


class UnackedMessages:
    """A consumer's deliveries not yet acknowledged, by offset, with their payload bytes; its
    count is also in its subscription's ``tally``."""

    __slots__ = ("_by_offset", "_tally", "bytes")

    def __init__(self, tally: UnackedTally | None = None) -> None:
        self._by_offset: dict[int, Delivery] = {}
        self.bytes = 0
        self._tally = tally or UnackedTally()

    def add(self, offset: int, delivery: Delivery) -> None:
        previous = self._by_offset.get(offset)
        if previous is not None:
            self.bytes -= len(previous.message.payload)
        else:
            self._tally.messages += 1
        self._by_offset[offset] = delivery
        self.bytes += len(delivery.message.payload)

    def add_run(self, offsets: list[int], deliveries: list[Delivery], payload_bytes: int) -> None:
        """``add`` for each pair, with ``payload_bytes`` the deliveries' payloads together."""
        by_offset = self._by_offset
        if not by_offset.keys().isdisjoint(offsets):  # redelivered to the holder itself: rare
            for offset, delivery in zip(offsets, deliveries, strict=True):
                self.add(offset, delivery)
            return
        by_offset.update(zip(offsets, deliveries, strict=True))
        self.bytes += payload_bytes
        self._tally.messages += len(offsets)

    def pop_all(self, offsets: list[int]) -> list[Delivery]:
        """``pop`` each of ``offsets``; the deliveries that were held, in order."""
        popped = [d for d in map(self._by_offset.pop, offsets, repeat(None)) if d is not None]
        self.bytes -= sum(len(d.message.payload) for d in popped)
        self._tally.messages -= len(popped)
        return popped

    def pop(self, offset: int, default: Delivery | None = None) -> Delivery | None:
        delivery = self._by_offset.pop(offset, None)
        if delivery is None:
            return default
        self.bytes -= len(delivery.message.payload)
        self._tally.messages -= 1
        return delivery

    def clear(self) -> None:
        self._tally.messages -= len(self._by_offset)
        self._by_offset.clear()
        self.bytes = 0

    def get(self, offset: int) -> Delivery | None:
        return self._by_offset.get(offset)

    def items(self) -> Iterable[tuple[int, Delivery]]:
        return self._by_offset.items()

    def values(self) -> Iterable[Delivery]:
        return self._by_offset.values()

    def __contains__(self, offset: object) -> bool:
        return offset in self._by_offset

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_offset)

    def __len__(self) -> int:
        return len(self._by_offset)


class Consumer:
    """A transport's handle on a subscription."""

    _ids = itertools.count(1)

    def __init__(self, subscription: Subscription, config: ConsumerConfig) -> None:
        self.id = next(self._ids)
        self.subscription = subscription
        self.config = config
        self._permits = 0
        self.outbox: deque[Delivery] = deque()
        self.unacked = UnackedMessages(subscription.unacked_tally)
        self.offsets_by_id: dict[MessageId, int] = {}
        self.listener: Callable[[], None] | None = None
        self.unloaded = False
        """Closed because its topic stopped being served here (it moved to another broker): the
        client should look the topic up again, rather than take the subscription as gone."""
        self.closed = False
        self.msg_out = self.bytes_out = self.redelivered = 0
        self.blocked = False

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def permits(self) -> int:
        return self._permits

    @permits.setter
    def permits(self, value: int) -> None:
        """(Under the subscription's lock.) The subscription follows who has permits."""
        self.subscription._permits_changed(self, self._permits, value)
        self._permits = value

    def flow(self, permits: int) -> None:
        """Allow ``permits`` more messages to be delivered (Pulsar's flow command)."""
        if permits < 0:
            raise InvalidRequest("permits must be >= 0")
        self.subscription._flow(self, permits)

    def poll(self) -> Delivery | None:
        with self.subscription._lock:
            return self.outbox.popleft() if self.outbox else None

    def poll_all(self) -> list[Delivery]:
        """Everything :meth:`poll` would return one by one, in order, taken at once."""
        with self.subscription._lock:
            taken = list(self.outbox)
            self.outbox.clear()
            return taken

    def peek(self) -> Delivery | None:
        """The delivery :meth:`poll` would return next, left in the outbox."""
        with self.subscription._lock:
            return self.outbox[0] if self.outbox else None

    def offset_of(self, message_id: MessageId) -> int | None:
        """The offset of a message this consumer holds, by the id it was delivered with."""
        return self.offsets_by_id.get(message_id)

    def locate(self, message_id: MessageId) -> int:
        """The offset of ``message_id`` in this consumer's topic, held or not."""
        held = self.offsets_by_id.get(message_id)
        if held is not None:
            return held
        entry = self.subscription.cursor.ml.read_entry(message_id.position)
        return entry.first_offset + max(message_id.batch_index, 0)

    def ack(self, offsets: Iterable[int]) -> None:
        self.subscription._ack(self, list(offsets))

    def ack_cumulative(self, offset: int) -> None:
        self.subscription._ack_cumulative(self, offset)

    def nack(self, offsets: Iterable[int]) -> None:
        self.subscription._nack(self, list(offsets))

    def withdraw(self) -> None:
        """Give back unused permits and what reached the outbox but was never taken: a pull
        transport's leftovers, so an ack timeout never counts a message nobody received."""
        self.subscription._withdraw(self)

    def close(self) -> None:
        self.subscription.remove_consumer(self)

    def _can_take(self) -> bool:
        if self.closed or self.permits <= 0:
            return False
        held, held_bytes = len(self.unacked), self.unacked.bytes
        limit, bytes_limit = self.config.unacked_messages_max, self.config.unacked_bytes_max
        if held and (held >= limit or held_bytes >= bytes_limit):
            self.blocked = True
        elif self.blocked and (held <= limit // 2 and held_bytes <= bytes_limit // 2):
            self.blocked = False
        return not self.blocked

    def statistics(self) -> ConsumerStats:
        return ConsumerStats(self.name, self.permits, len(self.unacked), self.msg_out, self.bytes_out,
                             self.redelivered, self.blocked)


class Subscription:
    def __init__(self, topic_name: str, partition: int, cursor: ManagedCursor, sub_type: SubscriptionType, *,
                 clock: Callable[[], float] = time.time, limits: SubscriptionLimits | None = None,
                 dead_letter: Callable[[str, Delivery, str], None] | None = None,
                 schedule: Callable[[Callable[[], None]], None] | None = None,
                 quotas: TopicQuotas | None = None,
                 schedule_after: Callable[[float, Callable[[], None]], None] | None = None) -> None:
        """``quotas``: the topic partition's (consumer slots, dispatch rate); ``schedule_after``
        runs a dispatch later, once a throttled one may go on (without it, the next ``tick``)."""
        self.topic_name = topic_name
        self.partition = partition
        self.cursor = cursor
        self.type = sub_type
        self.name = cursor.name
        self._clock = clock
        self._limits = limits or SubscriptionLimits()
        self._dead_letter = dead_letter
        self._lock = threading.RLock()
        self.consumers: dict[Consumer, None] = {}
        """In the order they joined (a dict: one leaves at the cost of one joining)."""
        self._timed: dict[Consumer, None] = {}
        """The consumers with an ack timeout, which ``tick`` visits."""
        self._redeliver_limits: Counter[int] = Counter()
        """Each consumer's ``max_redeliver_count``: the subscription dead-letters past the highest."""
        self.unacked_tally = UnackedTally()
        self._with_permits: dict[Consumer, None] = {}
        """Open consumers with permits, in the order they are served next (round-robin: the one
        served moves to the end), so dispatch never walks the consumers that have none."""
        self._permits_total = 0
        """The positive permits of the open consumers, together."""
        self._active_cached: tuple[Consumer | None] | None = None
        """The Exclusive or Failover subscription's active consumer, until the consumers change."""
        self._pending: deque[_Item] = deque()
        self._redeliver: list[_Item] = []  # heap by offset: due for redelivery
        self._later: list[tuple[int, int, _Item]] = []  # heap (due ms, offset): nacked / delayed
        self._owner: dict[int, Consumer] = {}  # offset -> consumer holding it unacked
        self._key_owner: dict[int, tuple[Consumer, int]] = {}  # key hash -> (consumer, unacked count)
        self._counts: dict[int, int] = self._load_counts()
        self._sent_at: dict[int, float] = {}  # offset -> when sent, to consumers with an ack timeout
        self._ring: list[tuple[int, Consumer]] = []
        self._blocked = False
        self.msg_out = self.bytes_out = self.redelivered = 0
        self._rates = (0.0, 0.0, 0.0)  # messages/s out, bytes/s out, redeliveries/s
        self._rate_base = (self._clock(), 0, 0, 0)
        self._schedule = schedule or (lambda work: work())
        self._quotas = quotas or TopicQuotas(topic_name, clock)
        self._schedule_after = schedule_after
        self._on_publish = lambda: self._schedule(self.dispatch)
        cursor.ml.add_listener(self._on_publish)

    def end_of_topic(self) -> bool:
        """The topic is terminated and this subscription has acknowledged all of it."""
        return self.cursor.ml.terminated and self.cursor.backlog_messages() == 0

    def detach(self) -> None:
        """Stop following the topic (the subscription is being removed)."""
        self.cursor.ml.remove_listener(self._on_publish)

    # --- consumers -----------------------------------------------------------------------
    def add_consumer(self, config: ConsumerConfig) -> Consumer:
        if config.receiver_queue_size < 0:
            raise InvalidRequest("receiverQueueSize must be >= 0")
        with self._lock:
            if self.type is SubscriptionType.EXCLUSIVE and self.consumers:
                raise ConsumerBusy(f"subscription {self.name} is Exclusive and already has a consumer")
            self._quotas.add_consumer()  # ConsumerBusy at the topic's maxConsumers
            consumer = Consumer(self, config)
            self.consumers[consumer] = None
            if config.ack_timeout_ms > 0:
                self._timed[consumer] = None
            self._redeliver_limits[config.max_redeliver_count] += 1
            if self.type is SubscriptionType.KEY_SHARED:
                self._join_ring(consumer)
            if self.type is SubscriptionType.FAILOVER:
                previous_active = self._active()
                active = consumer if previous_active is None else min(previous_active, consumer, key=_failover_rank)
                self._active_cached = (active,)
                if previous_active not in (None, active):
                    assert previous_active is not None
                    self._take_back(previous_active)
            else:
                self._active_cached = None
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
            self._redeliver_limits[consumer.config.max_redeliver_count] -= 1
            if not self._redeliver_limits[consumer.config.max_redeliver_count]:
                del self._redeliver_limits[consumer.config.max_redeliver_count]
            if self._active_cached is not None and self._active_cached[0] is consumer:
                self._active_cached = None
            consumer.outbox.clear()
            self._take_back(consumer)
            if self.type is SubscriptionType.KEY_SHARED:
                self._leave_ring(consumer)
        self.dispatch()

    def _take_back(self, consumer: Consumer) -> None:
        """Redeliver everything ``consumer`` holds unacknowledged (it left or lost activity)."""
        taken = sorted(consumer.unacked.items())
        for offset, delivery in taken:
            self._release(offset, consumer)
            heapq.heappush(self._redeliver, self._item_of(delivery))
        self._bump_counts([offset for offset, _ in taken])
        consumer.unacked.clear()
        consumer.outbox.clear()

    def active_consumer(self) -> Consumer | None:
        """The consumer an Exclusive or Failover subscription delivers to (None: nobody, or
        another type)."""
        if self.type not in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            return None
        with self._lock:
            return self._active()

    def _active(self) -> Consumer | None:
        """(Worked out once per change of the consumers: dispatch asks for it per message.)"""
        cached = self._active_cached
        if cached is not None:
            return cached[0]
        live = [c for c in self.consumers if not c.closed]
        if not live:
            active = None
        elif self.type is SubscriptionType.FAILOVER:
            active = min(live, key=_failover_rank)
        else:
            active = live[0]
        self._active_cached = (active,)
        return active

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

    def _join_ring(self, consumer: Consumer) -> None:
        """Put ``consumer``'s points on the hash ring (after the points of equal hash already
        there: the ring stays sorted by hash, ties in the order consumers joined)."""
        for point in _ring_points(consumer):
            bisect.insort_right(self._ring, (point, consumer), key=_ring_hash)

    def _leave_ring(self, consumer: Consumer) -> None:
        ring = self._ring
        for point in _ring_points(consumer):
            index = bisect.bisect_left(ring, point, key=_ring_hash)
            while ring[index][1] is not consumer:
                index += 1
            del ring[index]

    # --- flow and delivery ---------------------------------------------------------------
    def _flow(self, consumer: Consumer, permits: int) -> None:
        with self._lock:
            consumer.permits += permits
        self.dispatch()

    def dispatch(self) -> None:
        """Deliver as much as permits, limits and ordering allow."""
        notify: set[Consumer] = set()
        with self._lock:
            self._release_due()
            now = self._clock()  # one reading per round: when this round's deliveries were sent
            held: list[_Item] = []
            quotas = self._quotas
            while self._any_can_take():
                if quotas.dispatch is not None and self._throttled(now):
                    break
                item = self._next_item()
                if item is None:
                    break
                if self.cursor.is_acked(item.offset) or item.offset in self._owner:
                    continue  # acknowledged, or held by a consumer since before a reposition
                consumer = self._choose(item)
                if consumer is None:
                    held.append(item)
                    if len(held) >= PENDING_MESSAGES_MAX:
                        break
                    continue
                run = self._rest_of_entry(item) if consumer.config.whole_entries else None
                items = [item, *run] if run else [item]
                self._deliver(consumer, items, now)
                if quotas.dispatch is not None:
                    quotas.dispatched(len(items), sum(len(i.message.payload) for i in items))
                notify.add(consumer)
            for item in reversed(held):
                self._pending.appendleft(item)
        for consumer in notify:
            if consumer.listener is not None:
                consumer.listener()

    def _throttled(self, now: float) -> bool:
        """The topic's dispatch rate has no token left: another round is asked for once it will."""
        delay_s = self._quotas.dispatch_delay_s(now)
        if delay_s <= 0:
            return False
        if self._schedule_after is not None:
            self._schedule_after(delay_s, self.dispatch)
        return True

    def _rest_of_entry(self, item: _Item) -> list[_Item]:
        """The messages of ``item``'s entry waiting right behind it, taken from the queues
        (acknowledged or held ones dropped, and a message waiting in both queues taken once:
        after a reposition, one read ahead again can also come back from a departed holder):
        they go to the same consumer with it."""
        entry_id, ledger_id = item.message_id.entry_id, item.message_id.ledger_id
        redeliver, pending, owner = self._redeliver, self._pending, self._owner
        cursor = self.cursor
        acked, mark_delete = cursor.acked, cursor.mark_delete_offset
        any_acked = len(acked) > 0
        run: list[_Item] = []
        taken = {item.offset}
        while True:
            if redeliver and redeliver[0].message_id.entry_id == entry_id \
                    and redeliver[0].message_id.ledger_id == ledger_id:
                following = heapq.heappop(redeliver)
            elif pending and pending[0].message_id.entry_id == entry_id \
                    and pending[0].message_id.ledger_id == ledger_id:
                following = pending.popleft()
            else:
                return run
            offset = following.offset
            if offset >= mark_delete and offset not in owner and offset not in taken \
                    and not (any_acked and offset in acked):  # (cursor.is_acked, inline: once per message)
                run.append(following)
                taken.add(offset)

    def _any_can_take(self) -> bool:
        total = self.unacked_tally.messages
        limit = self._limits.unacked_messages_max
        if total >= limit:
            self._blocked = True
        elif self._blocked and total <= limit // 2:
            self._blocked = False
        if self._blocked:
            return False
        if self.type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            active = self._active()
            return active is not None and active._can_take()
        return any(c._can_take() for c in self._with_permits)

    def _next_item(self) -> _Item | None:
        if self._redeliver:
            return heapq.heappop(self._redeliver)
        if not self._pending:
            self._read_more()
        return self._pending.popleft() if self._pending else None

    def _entries_to_read(self) -> int:
        """Enough entries for the permits consumers have left, at the topic's average entry
        size in messages: the dispatcher decodes at most one entry beyond what it can send."""
        wanted = min(PENDING_MESSAGES_MAX, self._permits_total)
        return max(1, min(READ_BATCH_ENTRIES, wanted // self.cursor.ml.messages_per_entry()))

    def _read_more(self) -> None:
        now_ms = int(self._clock() * 1000)
        cursor = self.cursor
        partition, pending = self.partition, self._pending
        delayable = self.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)
        of_stored = MessageId.of_stored
        for entry in cursor.read_entries(self._entries_to_read()):
            messages, deliver_at_ms = decode_messages(entry.data)
            ledger_id, entry_id = entry.position.ledger_id, entry.position.entry_id
            data, publish_ms = entry.data, entry.publish_time_ms
            if cursor.acked.count_in(entry.first_offset, entry.last_offset + 1) or \
                    entry.first_offset < cursor.mark_delete_offset:
                messages = [m for m in messages if not cursor.is_acked(m.offset)]  # type: ignore[arg-type]
            due = deliver_at_ms if delayable and deliver_at_ms is not None and deliver_at_ms > now_ms else 0
            lone = entry.first_offset == entry.last_offset  # a lone message's id has no batch index
            items = [_Item(m.offset, of_stored(ledger_id, entry_id, partition, -1 if lone else m.batch_index),  # type: ignore[arg-type]
                           m, publish_ms, _hash_of(m), due, data) for m in messages]
            if due:
                for item in items:
                    heapq.heappush(self._later, (due, item.offset, item))
            else:
                pending.extend(items)

    def _choose(self, item: _Item) -> Consumer | None:
        if self.type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            active = self._active()
            return active if active is not None and active._can_take() else None
        if self.type is SubscriptionType.SHARED:
            return self._next_in_turn()
        return self._choose_by_key(item)

    def _next_in_turn(self) -> Consumer | None:
        """Round-robin among the consumers with permits: the first that can take, which then
        goes to the end of the turn."""
        with_permits = self._with_permits
        consumer = next((c for c in with_permits if c._can_take()), None)
        if consumer is not None:
            del with_permits[consumer]
            with_permits[consumer] = None
        return consumer

    def _choose_by_key(self, item: _Item) -> Consumer | None:
        if not self._ring:
            return None
        if item.key_hash < 0:  # keyless messages spread like Shared
            return self._next_in_turn()
        owner = self._key_owner.get(item.key_hash)
        target = self._ring[bisect.bisect_left(self._ring, item.key_hash, key=lambda p: p[0]) % len(self._ring)][1]
        if owner is not None and owner[0] is not target:
            return None  # an earlier message of this key is still unacked elsewhere: keep order
        return target if target._can_take() else None

    def _deliver(self, consumer: Consumer, items: list[_Item], now: float) -> None:
        """Hand ``items`` to ``consumer`` (one message, or the run of one entry): one bookkeeping
        step per collection, not per message."""
        counts, topic = self._counts, self.topic_name
        deliveries = [_new_delivery(Delivery, (i.message_id, i.offset, i.message, i.publish_time_ms,
                                               counts.get(i.offset, 0), topic, None, i.entry_data)) for i in items]
        if counts:
            redelivered = sum(1 for d in deliveries if d.redelivery_count)
            consumer.redelivered += redelivered
            self.redelivered += redelivered
        offsets = [i.offset for i in items]
        payload_bytes = sum(len(i.message.payload) for i in items)
        count = len(items)
        consumer.permits -= count
        consumer.outbox.extend(deliveries)
        consumer.unacked.add_run(offsets, deliveries, payload_bytes)
        if consumer.config.track_ids:
            consumer.offsets_by_id.update(zip([i.message_id for i in items], offsets, strict=True))
        consumer.msg_out += count
        consumer.bytes_out += payload_bytes
        self.msg_out += count
        self.bytes_out += payload_bytes
        self._owner.update(zip(offsets, repeat(consumer)))
        if consumer.config.ack_timeout_ms > 0:  # only an ack timeout asks when a message was sent
            self._sent_at.update(zip(offsets, repeat(now)))
        if self.type is SubscriptionType.KEY_SHARED:
            key_owner = self._key_owner
            for item in items:
                if item.key_hash >= 0:
                    holder = key_owner.get(item.key_hash)
                    key_owner[item.key_hash] = (consumer, (holder[1] if holder else 0) + 1)

    def _item_of(self, delivery: Delivery) -> _Item:
        """A delivered message as a dispatch item again (taken back, nacked or timed out)."""
        return _Item(delivery.offset, delivery.message_id, delivery.message, delivery.publish_time_ms,
                     _hash_of(delivery.message), entry_data=delivery.entry_data)

    def _release(self, offset: int, consumer: Consumer) -> None:
        """Forget that ``consumer`` holds ``offset`` (acked, nacked, timed out or taken back)."""
        self._owner.pop(offset, None)
        self._sent_at.pop(offset, None)
        delivery = consumer.unacked.get(offset)
        if delivery is not None:
            consumer.offsets_by_id.pop(delivery.message_id, None)
        if delivery is None or self.type is not SubscriptionType.KEY_SHARED:
            return
        hashed = _hash_of(delivery.message)
        holder = self._key_owner.get(hashed)
        if holder is not None:
            if holder[1] <= 1:
                del self._key_owner[hashed]
            else:
                self._key_owner[hashed] = (holder[0], holder[1] - 1)

    # --- administrative cursor moves ------------------------------------------------------
    def reposition(self, move: Callable[[], Future[None] | None]) -> Future[None] | None:
        """Apply ``move`` (a cursor reset, skip or expiry) so that dispatch follows it.

        Under the subscription's lock: the move runs; messages in a consumer's outbox (not yet
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
                for delivery in consumer.outbox:
                    self._release(delivery.offset, consumer)
                    consumer.unacked.pop(delivery.offset, None)
                    consumer.permits += 1
                consumer.outbox.clear()
                for offset in [o for o in consumer.unacked if self.cursor.is_acked(o)]:
                    self._release(offset, consumer)
                    consumer.unacked.pop(offset)
            self._pending.clear()
            self._redeliver.clear()
            self._later.clear()
            self.cursor.rewind()
        self.dispatch()
        return result

    def _withdraw(self, consumer: Consumer) -> None:
        with self._lock:
            consumer.permits = 0
            for delivery in consumer.outbox:
                self._release(delivery.offset, consumer)
                consumer.unacked.pop(delivery.offset, None)
                heapq.heappush(self._redeliver, self._item_of(delivery))
            consumer.outbox.clear()
        self.dispatch()

    # --- acknowledgement -------------------------------------------------------------------
    def _ack(self, consumer: Consumer, offsets: list[int]) -> None:
        with self._lock:
            if self.type is SubscriptionType.KEY_SHARED:
                for offset in offsets:
                    self._release(offset, consumer)
                    consumer.unacked.pop(offset, None)
                    self._counts.pop(offset, None)
            else:  # what _release does without a key owner to update, a collection at a time
                for held in (self._owner, self._sent_at, self._counts):
                    if held:
                        _pop_each(held, offsets)
                popped = consumer.unacked.pop_all(offsets)
                if consumer.offsets_by_id:
                    by_id_pop = consumer.offsets_by_id.pop
                    for delivery in popped:
                        by_id_pop(delivery.message_id, None)
            future = self.cursor.ack(offsets)
        future.add_done_callback(lambda _f: None)
        self.dispatch()

    def _ack_cumulative(self, consumer: Consumer, offset: int) -> None:
        if self.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED):
            raise NotAllowed(f"cumulative acknowledgement is not allowed on {self.type.value} subscriptions")
        with self._lock:
            for held in [o for o in consumer.unacked if o <= offset]:
                self._release(held, consumer)
                consumer.unacked.pop(held, None)
                self._counts.pop(held, None)
            self.cursor.ack_cumulative(offset)
        self.dispatch()

    def _nack(self, consumer: Consumer, offsets: list[int]) -> None:
        due_ms = int(self._clock() * 1000) + consumer.config.negative_ack_redelivery_delay_ms
        with self._lock:
            nacked = []
            for offset in offsets:
                delivery = consumer.unacked.get(offset)
                if delivery is None:
                    continue
                self._release(offset, consumer)
                consumer.unacked.pop(offset)
                nacked.append(offset)
                heapq.heappush(self._later, (due_ms, offset, self._item_of(delivery)))
            self._bump_counts(nacked)
        self.dispatch()

    def _bump_counts(self, offsets: list[int]) -> None:
        """One more redelivery for each of ``offsets``, persisted once for them all (a consumer
        leaving with many messages must not rewrite the counts once per message)."""
        if not offsets:
            return
        for offset in offsets:
            self._counts[offset] = self._counts.get(offset, 0) + 1
        self._persist_counts()

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
                    delivery = consumer.unacked.pop(offset)
                    assert delivery is not None
                    self._release(offset, consumer)
                    heapq.heappush(self._redeliver, self._item_of(delivery))
                self._bump_counts(expired)
        self.dispatch()

    def _release_due(self) -> None:
        now_ms = int(self._clock() * 1000)
        while self._later and self._later[0][0] <= now_ms:
            _, _, item = heapq.heappop(self._later)
            if self._dead_lettered(item):
                continue
            heapq.heappush(self._redeliver, item)
        while self._redeliver and self._dead_lettered(self._redeliver[0]):
            heapq.heappop(self._redeliver)

    def _dead_lettered(self, item: _Item) -> bool:
        """Send an over-redelivered message to its dead-letter topic (once) and ack it."""
        limit = max(self._redeliver_limits, default=0)
        if limit <= 0 or self._dead_letter is None or self._counts.get(item.offset, 0) <= limit:
            return False
        dlq = next((c.config.dead_letter_topic for c in self.consumers if c.config.dead_letter_topic), None)
        target = dlq or f"{self.topic_name}-{self.name}-DLQ"
        delivery = Delivery(item.message_id, item.offset, item.message, item.publish_time_ms,
                            self._counts[item.offset], self.topic_name, entry_data=item.entry_data)
        self._dead_letter(target, delivery, self.name)
        self._counts.pop(item.offset, None)
        self.cursor.ack([item.offset]).result(timeout=60)
        return True

    def _update_rates(self, now: float) -> None:
        since, msgs, byte_count, redelivered = self._rate_base
        elapsed = now - since
        if elapsed > 0:
            self._rates = ((self.msg_out - msgs) / elapsed, (self.bytes_out - byte_count) / elapsed,
                           (self.redelivered - redelivered) / elapsed)
            self._rate_base = (now, self.msg_out, self.bytes_out, self.redelivered)

    # --- redelivery counts survive restarts -----------------------------------------------
    def _load_counts(self) -> dict[int, int]:
        return {int(k[len(REDELIVERY_PROPERTY_PREFIX):]): v for k, v in self.cursor.properties.items()
                if k.startswith(REDELIVERY_PROPERTY_PREFIX)}

    def _persist_counts(self) -> None:
        kept = sorted(self._counts.items())[:REDELIVERY_COUNTS_PERSISTED_MAX]
        props = {k: v for k, v in self.cursor.properties.items() if not k.startswith(REDELIVERY_PROPERTY_PREFIX)}
        props.update({f"{REDELIVERY_PROPERTY_PREFIX}{offset}": count for offset, count in kept})
        self.cursor.set_properties(props)

    # --- stats ---------------------------------------------------------------------------
    def _delayed_unacked(self) -> int:
        """Messages waiting for their nack delay or delivery time and not acknowledged meanwhile
        (an ack leaves the entry in ``_later`` until it is due, and dispatch then skips it)."""
        return sum(1 for _, offset, _ in self._later if not self.cursor.is_acked(offset))

    def statistics(self) -> SubscriptionStats:
        with self._lock:
            return SubscriptionStats(
                name=self.name, type=self.type.value, durable=self.cursor.durable,
                msg_backlog=self.cursor.backlog_messages(),
                backlog_size_bytes=self.cursor.backlog_bytes(),
                unacked_messages=sum(len(c.unacked) for c in self.consumers),
                msg_out_counter=self.msg_out, bytes_out_counter=self.bytes_out,
                msg_redeliver_counter=self.redelivered, delayed_messages=self._delayed_unacked(),
                msg_rate_out=self._rates[0], msg_throughput_out=self._rates[1], msg_rate_redeliver=self._rates[2],
                mark_delete_offset=self.cursor.mark_delete_offset, read_offset=self.cursor.read_offset,
                consumers=tuple(c.statistics() for c in self.consumers))
