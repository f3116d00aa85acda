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
``unacked_bytes_max``) and per subscription pause delivery at the limit and resume at half; a
consumer holding nothing always gets one message, however large. A consumer configured with
``whole_entries`` (the binary protocol's: Pulsar's clients acknowledge a batch as one) gets the
rest of an entry with its first message, past its permits, as Pulsar's broker delivers.

Memory, in bytes (``footprint``: a decoded message costs its payload twice, as stored entry and
as copy, plus ``DECODED_MESSAGE_BYTES`` of objects, so a batch of many small messages counts
truly):

- A read takes as many entries as the consumers' permits need, at most ``READ_BATCH_ENTRIES``
  and ``SubscriptionLimits.read_bytes_max`` of entry bytes, and no more than the consumers that
  can take have room for; it always takes one entry, however large.
- Deliveries wait in a consumer's outbox until its transport takes them (``poll``/``poll_all``);
  a consumer whose outbox holds ``consumer_pending_bytes_max`` gets nothing more until the
  transport took them, which it does only while its connection drains: a client that stops
  reading is held back by TCP, never buffered. Taking from a full outbox asks for a dispatch.
- What a consumer holds unacknowledged is kept as positions only (one ``_Held`` record per
  delivered run, shared by its offsets), and so is what waits for redelivery or for its delay
  (an ``_Item`` without message or entry bytes); it is read again from the managed ledger when it
  is delivered again, so a consumer that never acknowledges pins no payloads.
- What the dispatcher holds decoded (read ahead, or in outboxes) is added to the broker-wide
  reads-in-flight budget (``broker/byte_budget.py``) at the end of each dispatch round and each
  take; while the budget refuses, no read starts and the subscription waits for a wake-up.

Quotas (``broker/quotas.py``): each consumer holds a consumer slot of its topic partition from
``add_consumer`` to its removal (``ConsumerBusy`` beyond ``maxConsumers``), and a dispatch round
delivers while the topic's dispatch rate has tokens left; when it has none it stops and asks
for another round once it will have (``schedule_after``), as Pulsar's dispatcher backs off.

Redelivery: negative acks (after ``negative_ack_redelivery_delay_ms``), ack timeouts and
consumer departures put messages back, oldest first, with ``redelivery_count`` incremented.
When the last consumer leaves, nothing stays decoded: what was read ahead, or waits for
redelivery or a delay, is dropped and the cursor rewound, so the next consumer reads again from
the oldest unacknowledged message (a nack's delay ends with its consumer, as Pulsar's clients
keep it).
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
from operator import itemgetter
from typing import Any, NamedTuple

import mmh3

from broker.byte_budget import ByteBudget
from broker.cursor import ManagedCursor
from broker.entry_format import DecodedMessage, decode_messages
from broker.errors import ConsumerBusy, InvalidRequest, MagnetarError, NoSuchEntry, NotAllowed, NotFound
from broker.message_id import MessageId
from broker.quotas import TopicQuotas

KEY_HASH_RANGE = 65536
POINTS_PER_CONSUMER = 100
READ_BATCH_ENTRIES = 100
DECODED_MESSAGE_BYTES = 640
"""What one decoded message holds beside its payload: its ``DecodedMessage``, dispatch item,
delivery and message id (about 600 bytes measured with tracemalloc)."""
_PAYLOAD = itemgetter(2)
"""``DecodedMessage.payload`` (a named tuple's third field), for ``map``."""
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


def footprint(messages: int, payload_bytes: int) -> int:
    """The memory ``messages`` decoded messages with ``payload_bytes`` of payloads hold: each
    payload twice (in the stored entry and as the message's copy) and each message's objects.
    Linear, so a run's footprint is the sum of its messages'."""
    return 2 * payload_bytes + messages * DECODED_MESSAGE_BYTES


def footprint_of(messages: list[DecodedMessage]) -> int:
    """:func:`footprint` of decoded ``messages`` (one entry's, say)."""
    return footprint(len(messages), sum(map(len, map(_PAYLOAD, messages))))


@dataclass(frozen=True)
class SubscriptionLimits:
    unacked_messages_max: int = 200_000
    read_bytes_max: int = 1024 * 1024
    """Entry bytes one read takes at most (Pulsar's ``dispatcherMaxReadSizeBytes``); one entry
    is always read, however large."""
    consumer_pending_bytes_max: int = 1024 * 1024
    """Footprint of deliveries waiting in one consumer's outbox for its transport; at the bound
    the consumer gets nothing more until the transport took them (one run always goes)."""


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
    """A message of the subscription (ordered by offset): decoded while it waits for dispatch;
    a position only (``message`` and ``entry_data`` None) while a consumer holds it
    unacknowledged or it waits for redelivery or its delay, read again when delivered again."""

    offset: int
    message_id: MessageId = field(compare=False)
    message: DecodedMessage | None = field(compare=False)
    publish_time_ms: int = field(compare=False)
    key_hash: int = field(compare=False)
    deliver_at_ms: int = field(compare=False, default=0)
    entry_data: bytes | None = field(compare=False, default=None)
    size: int = field(compare=False, default=0)
    """The payload's length in bytes; for a message of a batch, the batch's average (counted once
    per entry, not per message)."""

    def id_of(self, offset: int) -> MessageId:
        """Its id (the ``_Held`` interface: a consumer holding one message holds its item)."""
        return self.message_id

    def item(self, offset: int) -> _Item:
        return self


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


_new_delivery = _new_held = tuple.__new__
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


class _Held(NamedTuple):
    """Messages of one entry delivered together to one consumer and not yet acknowledged, as a
    position: one record shared by their offsets in ``UnackedMessages``, so a batch of many
    messages costs a dict slot per message, not an object (a named tuple: one is built per
    delivered run, without ``__init__``). A consumer holding a single message holds its
    ``_Item`` instead, without its bytes (it has the same interface)."""

    first_id: MessageId
    """The id of the run's first message (kept: a run of one is most runs, and its id is asked
    for by every acknowledgement of a consumer that tracks ids)."""
    ledger_id: int
    entry_id: int
    partition: int
    entry_first_offset: int
    """The offset of the entry's batch index 0; -1 for a lone message (its id has no batch index)."""
    publish_time_ms: int
    size: int
    """Payload bytes counted for each message: the run's average (so that ``UnackedMessages.bytes``
    goes back to exactly zero)."""

    def id_of(self, offset: int) -> MessageId:
        first = self.entry_first_offset
        if first < 0 or offset - first == self.first_id.batch_index:
            return self.first_id
        return MessageId.of_stored(self.ledger_id, self.entry_id, self.partition, offset - first)

    def item(self, offset: int) -> _Item:
        """The message at ``offset`` as a dispatch item again, a position: read again (and its
        key hashed again) when it is delivered again."""
        return _Item(offset, self.id_of(offset), None, self.publish_time_ms, -1, 0, None, self.size)


_HeldMessages = _Held | _Item
"""What a consumer holds of a delivered run: a ``_Held`` record, or the one message's ``_Item``."""


class UnackedMessages:
    """A consumer's messages delivered and not yet acknowledged: offset -> what it holds of the
    run it came in, with the payload bytes counted for them; its count is also in its
    subscription's ``tally``."""

    __slots__ = ("_by_offset", "_tally", "bytes")

    def __init__(self, tally: UnackedTally | None = None) -> None:
        self._by_offset: dict[int, _HeldMessages] = {}
        self.bytes = 0
        self._tally = tally or UnackedTally()

    def add_run(self, offsets: list[int], held: _HeldMessages) -> None:
        by_offset = self._by_offset
        new = len(offsets)
        if not by_offset.keys().isdisjoint(offsets):  # redelivered to the holder itself: rare
            for offset in offsets:
                previous = by_offset.get(offset)
                if previous is not None:
                    self.bytes -= previous.size
                    new -= 1
        by_offset.update(zip(offsets, repeat(held)))
        self.bytes += held.size * len(offsets)
        self._tally.messages += new

    def pop_all(self, offsets: list[int]) -> list[_HeldMessages | None]:
        """``pop`` each of ``offsets``: what was held of each (None: nothing), in order."""
        popped = list(map(self._by_offset.pop, offsets, repeat(None)))
        held = [h for h in popped if h is not None]
        self.bytes -= sum(h.size for h in held)
        self._tally.messages -= len(held)
        return popped

    def pop(self, offset: int) -> _HeldMessages | None:
        held = self._by_offset.pop(offset, None)
        if held is not None:
            self.bytes -= held.size
            self._tally.messages -= 1
        return held

    def clear(self) -> None:
        self._tally.messages -= len(self._by_offset)
        self._by_offset.clear()
        self.bytes = 0

    def get(self, offset: int) -> _HeldMessages | None:
        return self._by_offset.get(offset)

    def items(self) -> Iterable[tuple[int, _HeldMessages]]:
        return self._by_offset.items()

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
        self._outbox_bytes = 0
        self._outbox_bytes_max = subscription.limits.consumer_pending_bytes_max
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
    def outbox_bytes(self) -> int:
        """The footprint of the deliveries in ``outbox``."""
        return self._outbox_bytes

    @outbox_bytes.setter
    def outbox_bytes(self, value: int) -> None:
        """(Under the subscription's lock.) The subscription keeps the sum over its consumers."""
        self.subscription._outbox_bytes_total += value - self._outbox_bytes
        self._outbox_bytes = value

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
        subscription = self.subscription
        with subscription._lock:
            if not self.outbox:
                return None
            delivery = self.outbox.popleft()
            full = self.outbox_bytes >= self._outbox_bytes_max
            self.outbox_bytes = self.outbox_bytes - footprint(1, len(delivery.message.payload)) if self.outbox else 0
        subscription._taken(full)
        return delivery

    def poll_all(self) -> list[Delivery]:
        """Everything :meth:`poll` would return one by one, in order, taken at once."""
        subscription = self.subscription
        with subscription._lock:
            taken = list(self.outbox)
            self.outbox.clear()
            freed, self.outbox_bytes = self.outbox_bytes, 0
        if freed:
            subscription._taken(freed >= self._outbox_bytes_max)
        return taken

    def holds(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` is still this consumer's to hand over: not acknowledged, timed
        out, nacked or taken back since it was dispatched (a redelivery is a new delivery)."""
        subscription = self.subscription
        with subscription._lock:
            return delivery.offset in self.unacked and \
                subscription._counts.get(delivery.offset, 0) == delivery.redelivery_count

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

    def end_of_topic(self) -> bool:
        """The topic is terminated and the subscription has acknowledged all of it."""
        return self.subscription.end_of_topic()

    def backlog_messages(self) -> int:
        """Messages of the topic the subscription has not acknowledged yet."""
        return self.subscription.backlog_messages()

    def _can_take(self) -> bool:
        if self.closed or self.permits <= 0 or self.outbox_bytes >= self._outbox_bytes_max:
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
                 budget: ByteBudget | None = None, quotas: TopicQuotas | None = None,
                 schedule_after: Callable[[float, Callable[[], None]], None] | None = None) -> None:
        """``budget``: the broker-wide reads-in-flight budget; ``quotas``: the topic partition's
        (consumer slots, dispatch rate); ``schedule_after`` runs a dispatch later, once a
        throttled one may go on (without it, the next ``tick``)."""
        self.topic_name = topic_name
        self.partition = partition
        self.cursor = cursor
        self.type = sub_type
        self.name = cursor.name
        self._clock = clock
        self.limits = limits or SubscriptionLimits()
        self._budget = budget
        """The broker-wide reads-in-flight budget (None: unbounded)."""
        self._waiting_for_budget = False
        self._pending_bytes = 0
        """Footprint of what was read or read again and not yet delivered (``_pending``, and a
        redelivery being delivered); zero once ``_pending`` is empty at the end of a round."""
        self._budgeted = 0
        """What the budget was last told this subscription holds."""
        self._outbox_bytes_total = 0
        """The consumers' ``outbox_bytes`` together (kept as they change)."""
        self._loaded: tuple[tuple[int, int], int, bytes, list[DecodedMessage]] | None = None
        """The entry last read again for a redelivery (its position, first offset, bytes and
        messages), kept for the round, so the messages of one entry are read once."""
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
        self._held_keys: dict[int, int] = {}  # Key_Shared: offset held unacked -> its key hash
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

    def backlog_messages(self) -> int:
        """Messages of the topic this subscription has not acknowledged yet."""
        return self.cursor.backlog_messages()

    def detach(self) -> None:
        """Stop following the topic (the subscription is being removed) and give back what it
        holds of the reads-in-flight budget."""
        self.cursor.ml.remove_listener(self._on_publish)
        with self._lock:
            self._pending.clear()
            self._pending_bytes = 0
            for consumer in self.consumers:
                self._clear_outbox(consumer)
        self._settle()

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
            self._take_back(consumer)
            if self.type is SubscriptionType.KEY_SHARED:
                self._leave_ring(consumer)
            if not self.consumers:  # nobody to read for: nothing stays decoded, all is read again
                self._pending.clear()
                self._redeliver.clear()
                self._later.clear()
                self._pending_bytes = 0
                self.cursor.rewind()
        self.dispatch()

    def _take_back(self, consumer: Consumer) -> None:
        """Redeliver everything ``consumer`` holds unacknowledged (it left or lost activity)."""
        taken = sorted(consumer.unacked.items())
        for offset, held in taken:
            self._release(offset, consumer)
            heapq.heappush(self._redeliver, held.item(offset))
        self._bump_counts([offset for offset, _ in taken])
        consumer.unacked.clear()
        self._clear_outbox(consumer)

    def _clear_outbox(self, consumer: Consumer) -> None:
        consumer.outbox.clear()
        consumer.outbox_bytes = 0

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
        """Deliver as much as permits, limits, ordering and the reads-in-flight budget allow."""
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
                    quotas.dispatched(len(items), sum(i.size for i in items))
                notify.add(consumer)
            for item in reversed(held):
                self._pending.appendleft(item)
            self._loaded = None
            if not self._pending:
                self._pending_bytes = 0
            delta = self._budget_delta()
        self._tell_budget(delta)
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
    # --- what dispatch holds, in bytes ---------------------------------------------------
    def _budget_delta(self) -> int:
        """(Under the lock.) How much more (or less) this subscription holds than the budget was
        last told, now taken as told."""
        if self._budget is None:
            return 0
        held = max(self._pending_bytes, 0) + self._outbox_bytes_total
        delta, self._budgeted = held - self._budgeted, held
        return delta

    def _tell_budget(self, delta: int) -> None:
        """(Outside the lock: a release may run other subscriptions' wake-ups.)"""
        if delta and self._budget is not None:
            self._budget.adjust(delta)

    def _settle(self) -> None:
        with self._lock:
            delta = self._budget_delta()
        self._tell_budget(delta)

    def _taken(self, was_full: bool) -> None:
        """A transport took deliveries from a consumer's outbox: they leave the budget, and an
        outbox that was full lets dispatch go on."""
        self._settle()
        if was_full:
            self._schedule(self.dispatch)

    def _must_wait_for_budget(self) -> bool:
        """Whether a read has to wait for the reads-in-flight budget (a wake-up is left then)."""
        budget = self._budget
        if budget is None or self._waiting_for_budget:
            return self._waiting_for_budget
        if budget.admits():
            return False
        self._waiting_for_budget = True  # before the wake-up is left: it may run at once
        if budget.wait(self._budget_freed):
            return True
        self._waiting_for_budget = False
        return False

    def _budget_freed(self) -> None:
        self._waiting_for_budget = False
        self._schedule(self.dispatch)

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
                    and not (any_acked and offset in acked) \
                    and (following.message is not None or self._load(following)):  # (is_acked, inline)
                run.append(following)
                taken.add(offset)

    def _any_can_take(self) -> bool:
        total = self.unacked_tally.messages
        limit = self.limits.unacked_messages_max
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
        redeliver = self._redeliver
        while redeliver:
            item = heapq.heappop(redeliver)
            if item.message is not None or self.cursor.is_acked(item.offset) or self._load(item):
                return item
        if not self._pending and not self._must_wait_for_budget():
            self._read_more()
        return self._pending.popleft() if self._pending else None

    def _load(self, item: _Item) -> bool:
        """Read ``item``'s message again (it was held as a position): False when its entry is
        gone (trimmed, its ledger deleted), so there is nothing to deliver. Any other failure
        puts the item back for redelivery and propagates."""
        message_id = item.message_id
        key = (message_id.ledger_id, message_id.entry_id)
        loaded = self._loaded
        if loaded is None or loaded[0] != key:
            try:
                entry = self.cursor.ml.read_entry(message_id.position)
            except (NoSuchEntry, NotFound):
                return False
            except MagnetarError:
                heapq.heappush(self._redeliver, item)
                raise
            loaded = self._loaded = (key, entry.first_offset, entry.data, decode_messages(entry.data)[0])
        _, first_offset, data, messages = loaded
        index = item.offset - first_offset
        if not 0 <= index < len(messages):
            return False
        message = messages[index]
        item.message, item.entry_data, item.key_hash = message, data, _hash_of(message)
        self._pending_bytes += footprint(1, item.size)
        return True

    def _read_size(self) -> tuple[int, int]:
        """(entries, entry bytes) for the next read: enough entries for the permits consumers
        have left, at the topic's average entry size in messages, and no more bytes than
        ``read_bytes_max`` nor than the outboxes of the consumers that can take have room for
        (a decoded entry holds about twice its bytes): the dispatcher decodes at most one entry
        beyond what it can send. The room is summed over the consumers with permits only until
        it covers a whole read, so a read costs the same however many consumers there are."""
        read_bytes_max = self.limits.read_bytes_max
        room = 0
        for consumer in self._with_permits:
            room += max(consumer._outbox_bytes_max - consumer.outbox_bytes, 0)
            if room >= 2 * read_bytes_max:
                break
        wanted = min(PENDING_MESSAGES_MAX, self._permits_total)
        entries = max(1, min(READ_BATCH_ENTRIES, wanted // self.cursor.ml.messages_per_entry()))
        return entries, max(1, min(read_bytes_max, room // 2))

    def _read_more(self) -> None:
        now_ms = int(self._clock() * 1000)
        cursor = self.cursor
        partition, pending, of_stored = self.partition, self._pending, MessageId.of_stored
        delayable = self.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)
        read_bytes = 0
        for entry in cursor.read_entries(*self._read_size()):
            messages, deliver_at_ms = decode_messages(entry.data)
            if cursor.acked.count_in(entry.first_offset, entry.last_offset + 1) or \
                    entry.first_offset < cursor.mark_delete_offset:
                messages = [m for m in messages if not cursor.is_acked(m.offset)]  # type: ignore[arg-type]
            due = deliver_at_ms if delayable and deliver_at_ms is not None and deliver_at_ms > now_ms else 0
            count = len(messages)
            payload_bytes = len(messages[0].payload) if count == 1 else sum(map(len, map(_PAYLOAD, messages)))
            read_bytes += 2 * payload_bytes + count * DECODED_MESSAGE_BYTES  # footprint(), inline
            size = payload_bytes // (count or 1)  # a batch's messages count its average: no list per entry
            ledger_id, entry_id = entry.position.ledger_id, entry.position.entry_id
            data, publish_ms = entry.data, entry.publish_time_ms
            lone = entry.first_offset == entry.last_offset  # a lone message's id has no batch index
            items = [_Item(m.offset, of_stored(ledger_id, entry_id, partition, -1 if lone else m.batch_index),  # type: ignore[arg-type]
                           m, publish_ms, _hash_of(m), due, data, size) for m in messages]
            if due:  # held as positions until due, then read again
                for item in items:
                    item.message = item.entry_data = None
                    heapq.heappush(self._later, (due, item.offset, item))
            else:
                pending.extend(items)
        self._pending_bytes += read_bytes

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
        count = len(items)
        first = items[0]
        payload_bytes = first.size * count  # the items of one entry: each counts the entry's average
        run_bytes = 2 * payload_bytes + count * DECODED_MESSAGE_BYTES  # footprint(), inline: once per run
        self._pending_bytes -= run_bytes
        consumer.outbox_bytes += run_bytes
        consumer.permits -= count
        consumer.outbox.extend(deliveries)
        if count == 1:  # from here on the consumer holds them as a position: one message, its item
            first.message = first.entry_data = None
            consumer.unacked.add_run(offsets, first)
        else:
            first_id = first.message_id
            batch_index = first_id.batch_index
            consumer.unacked.add_run(offsets, _new_held(_Held, (
                first_id, first_id.ledger_id, first_id.entry_id, self.partition,
                -1 if batch_index < 0 else first.offset - batch_index, first.publish_time_ms, first.size)))
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
            key_owner, held_keys = self._key_owner, self._held_keys
            for item in items:
                if item.key_hash >= 0:
                    holder = key_owner.get(item.key_hash)
                    key_owner[item.key_hash] = (consumer, (holder[1] if holder else 0) + 1)
                    held_keys[item.offset] = item.key_hash

    def _release(self, offset: int, consumer: Consumer) -> None:
        """Forget that ``consumer`` holds ``offset`` (acked, nacked, timed out or taken back)."""
        self._owner.pop(offset, None)
        self._sent_at.pop(offset, None)
        held = consumer.unacked.get(offset)
        if held is None:
            return
        if consumer.offsets_by_id:
            consumer.offsets_by_id.pop(held.id_of(offset), None)
        hashed = self._held_keys.pop(offset, None) if self._held_keys else None
        if hashed is None:
            return
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
                    consumer.unacked.pop(delivery.offset)
                    consumer.permits += 1
                self._clear_outbox(consumer)
                for offset in [o for o in consumer.unacked if self.cursor.is_acked(o)]:
                    self._release(offset, consumer)
                    consumer.unacked.pop(offset)
            self._pending.clear()
            self._pending_bytes = 0
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
                held = consumer.unacked.pop(delivery.offset)
                if held is not None:
                    heapq.heappush(self._redeliver, held.item(delivery.offset))
            self._clear_outbox(consumer)
        self.dispatch()

    # --- acknowledgement -------------------------------------------------------------------
    def _ack(self, consumer: Consumer, offsets: list[int]) -> None:
        with self._lock:
            if self.type is SubscriptionType.KEY_SHARED:
                for offset in offsets:
                    self._release(offset, consumer)
                    consumer.unacked.pop(offset)
                    self._counts.pop(offset, None)
            else:  # what _release does without a key owner to update, a collection at a time
                for held in (self._owner, self._sent_at, self._counts):
                    if held:
                        _pop_each(held, offsets)
                popped = consumer.unacked.pop_all(offsets)
                if consumer.offsets_by_id:
                    by_id_pop = consumer.offsets_by_id.pop
                    for offset, run in zip(offsets, popped, strict=True):
                        if run is not None:
                            by_id_pop(run.id_of(offset), None)
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
                self._counts.pop(held, None)
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
                heapq.heappush(self._later, (due_ms, offset, held.item(offset)))
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
                    self._release(offset, consumer)
                    held = consumer.unacked.pop(offset)
                    assert held is not None
                    heapq.heappush(self._redeliver, held.item(offset))
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
        if item.message is not None or self._load(item):  # else its entry is gone: nothing to move
            assert item.message is not None
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
