"""Subscriptions and dispatch: Exclusive, Failover, Shared and Key_Shared, independent of transport.

A ``Subscription`` owns one durable (or non-durable) cursor of a topic and its consumers. The
dispatcher reads entries through the cursor and hands each consumer runs of entries
(``EntryRun``, ``broker/delivery.py``): an entry, or the part of it the consumer gets, with the
entry's stored bytes. It skips acknowledged and not-yet-due (delayed) messages and chooses
consumers by the subscription type, and it decodes only what routing needs: nothing on
Exclusive and Failover subscriptions, an entry's delivery time (from its metadata) on Shared
ones, and on Key_Shared ones also each message's key hash. The edges split runs into messages
where they need them. Transports (WebSocket, HTTP pull, the binary protocol) only call
``flow``, ``poll``, ``ack``, ``nack`` and ``close`` on a ``Consumer`` and are told through a
listener callback that runs are waiting.

- **Exclusive**: one consumer; a second is refused with ``ConsumerBusy``.
- **Failover**: the active consumer is the first by (priority level, name); on a switch its
  unacknowledged messages are redelivered to the new active one.
- **Shared**: round-robin among consumers with permits, an entry at a time: a consumer gets as
  much of an entry as its permits and limits allow, the next one the rest; a departing
  consumer's unacknowledged messages go to the others.
- **Key_Shared**: ``murmur3_32(key) & 0x7fffffff % 65536`` is split into ranges by consistent
  hashing (100 points per consumer); an entry whose messages have different keys is split
  between their consumers. Per-key order holds while consumers join and leave: a message is
  never handed to one consumer while an earlier message of its key is unacknowledged at
  another; it waits (other keys flow on) until that one is acked or redelivered.

Flow control: a consumer receives only while it has permits (``receiverQueueSize`` in push
mode, explicit in pull mode), one per message. Unacknowledged limits per consumer (messages,
and bytes: ``unacked_bytes_max``, each message counting its share of its entry's bytes) and per
subscription pause delivery at the limit (a run is cut there) and resume at half; a consumer
holding nothing always gets one message, however large. A consumer configured with
``whole_entries`` (the binary protocol's: Pulsar's clients acknowledge a batch as one) gets the
whole rest of an entry in one run, past its permits and limits, as Pulsar's broker delivers.

Memory, in bytes (``footprint``: a run counts its share of its entry's bytes, a record and a
slot per message):

- A read takes as many entries as the consumers' permits need, at most ``READ_BATCH_ENTRIES``
  and ``SubscriptionLimits.read_bytes_max`` of entry bytes, and no more than the consumers that
  can take have room for; it always takes one entry, however large.
- Runs wait in a consumer's outbox until its transport takes them (``poll``/``poll_all``); a
  consumer whose outbox holds ``consumer_pending_bytes_max`` gets nothing more until the
  transport took them, which it does only while its connection drains: a client that stops
  reading is held back by TCP, never buffered. Taking from a full outbox asks for a dispatch.
- What a consumer holds unacknowledged is kept as positions only (one ``_Position`` record per
  delivered run, shared by its offsets), and so is what waits for redelivery or for its delay
  (each offset beside its entry's position, without the entry's bytes); it is read again from
  the managed ledger when it is delivered again, so a consumer that never acknowledges pins no
  entries.
- What the dispatcher holds (read ahead, or in outboxes) is added to the broker-wide
  reads-in-flight budget (``broker/byte_budget.py``) at the end of each dispatch round and each
  take; while the budget refuses, no read starts and the subscription waits for a wake-up.

Quotas (``broker/quotas.py``): each consumer holds a consumer slot of its topic partition from
``add_consumer`` to its removal (``ConsumerBusy`` beyond ``maxConsumers``), and a dispatch round
delivers while the topic's dispatch rate has tokens left; when it has none it stops and asks
for another round once it will have (``schedule_after``), as Pulsar's dispatcher backs off.

Redelivery: negative acks (after ``negative_ack_redelivery_delay_ms``), ack timeouts and
consumer departures put messages back, oldest first, with ``redelivery_count`` incremented
(the messages of one run share a count: a run is cut where counts differ).
When the last consumer leaves, nothing stays read: what was read ahead, or waits for
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
of the sorted ring without rebuilding it. A delivery costs one run (one record, one outbox
slot) however many messages of its entry it carries; what stays per message is the
bookkeeping acknowledgements need (who holds each offset unacknowledged).

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
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from itertools import repeat
from typing import Any, NamedTuple

import mmh3

from broker.byte_budget import ByteBudget
from broker.cursor import ManagedCursor
from broker.delivery import MESSAGE_BYTES, RUN_BYTES, Delivery, EntryRun, footprint
from broker.entry_format import DecodedMessage, decode_messages, delivery_time
from broker.errors import ConsumerBusy, InvalidRequest, MagnetarError, NoSuchEntry, NotAllowed, NotFound
from broker.message_id import MessageId, Position
from broker.quotas import TopicQuotas

KEY_HASH_RANGE = 65536
POINTS_PER_CONSUMER = 100
READ_BATCH_ENTRIES = 100
PENDING_MESSAGES_MAX = 10_000
REDELIVERY_COUNTS_PERSISTED_MAX = 10_000
REDELIVERY_PROPERTY_PREFIX = "rc:"
ENTRIES_REMEMBERED_MAX = 4096
"""Entries a consumer that tracks ids remembers it was handed (their positions), to turn the ids
it is acked with into offsets without reading the entry again (the oldest are forgotten)."""


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
    """Bytes delivered and not yet acknowledged before delivery pauses (resumes at half), each
    message counting its share of its stored entry (payload and metadata, as Pulsar's dispatch
    counts bytes)."""
    whole_entries: bool = False
    """Deliver the rest of an entry with its first message, past the permits (which go negative)
    and the unacknowledged limits,
    as Pulsar's broker does: Pulsar's clients acknowledge a batch only once every message of it
    arrived, so a batch split between deliveries would never be acknowledged."""
    track_ids: bool = True
    """Remember the entries handed out (``ENTRIES_REMEMBERED_MAX``) for :meth:`Consumer.offset_of`;
    off for a transport that maps ids to offsets itself (the binary protocol, by entry)."""


@dataclass(frozen=True)
class SubscriptionLimits:
    unacked_messages_max: int = 200_000
    read_bytes_max: int = 1024 * 1024
    """Entry bytes one read takes at most (Pulsar's ``dispatcherMaxReadSizeBytes``); one entry
    is always read, however large."""
    consumer_pending_bytes_max: int = 1024 * 1024
    """Footprint of runs waiting in one consumer's outbox for its transport; at the bound the
    consumer gets nothing more until the transport took them (one run always goes)."""


class _Position(NamedTuple):
    """Where messages of one entry are, without its bytes: what a consumer holds of a delivered
    run (one record shared by its offsets in ``UnackedMessages``), and what waits for
    redelivery or its delay beside each offset; the entry is read again when they are
    delivered again (a named tuple: one is built per entry read, without ``__init__``)."""

    ledger_id: int
    entry_id: int
    first_offset: int
    """The offset of the entry's batch index 0."""
    batch_size: int
    publish_time_ms: int
    size: int
    """Bytes counted for each message: the entry's bytes over its messages (so that
    ``UnackedMessages.bytes`` goes back to exactly zero)."""

    def id_of(self, offset: int, partition: int) -> MessageId:
        """The id of the message at ``offset`` (a batch index only in an entry of several)."""
        return MessageId.of_stored(self.ledger_id, self.entry_id, partition,
                                   -1 if self.batch_size == 1 else offset - self.first_offset)


_new_position = _new_run = tuple.__new__
"""``_Position(...)``, ``EntryRun(...)`` without the named tuple's Python-level ``__new__``: one
is built per entry read and per run delivered."""


class _Waiting:
    """An entry read (or read again) for dispatch, with the offsets of it still to deliver."""

    __slots__ = ("data", "hashes", "offsets", "position", "redelivery")

    def __init__(self, position: _Position, data: bytes, offsets: Sequence[int], hashes: int | list[int] | None,
                 redelivery: bool) -> None:
        self.position = position
        self.data = data
        self.offsets = offsets
        """Ascending; a ``range`` while it is the whole entry."""
        self.hashes = hashes
        """Key_Shared: the key hash of every message of the entry (an ``int``), or of each by
        batch index (a list); None on the other types."""
        self.redelivery = redelivery
        """Read again for redelivery: what is left of it goes back to wait for redelivery."""


def _failover_rank(consumer: Consumer) -> tuple[int, str, int]:
    """A Failover subscription's active consumer is the first by this."""
    return consumer.config.priority_level, consumer.name, consumer.id


def _ring_points(consumer: Consumer) -> list[int]:
    """Where a Key_Shared consumer sits on the hash ring (``POINTS_PER_CONSUMER`` points)."""
    return [key_hash(f"{consumer.name}{consumer.id}-{point}") for point in range(POINTS_PER_CONSUMER)]


def _ring_hash(pair: tuple[int, Consumer]) -> int:
    return pair[0]


def _key_hashes(messages: list[DecodedMessage]) -> int | list[int]:
    """The sticky-key hash of each message of an entry (of its ordering key, else its key; -1 for
    neither), one ``int`` when they are all the same."""
    hashes = [key_hash(key) if (key := m.ordering_key if m.ordering_key is not None else m.key) is not None else -1
              for m in messages]
    first = hashes[0]
    return first if hashes.count(first) == len(hashes) else hashes


def _pop_each(held: dict[int, Any], offsets: Sequence[int]) -> None:
    """``held.pop(offset, None)`` for each offset, the loop run by the interpreter's C code."""
    deque(map(held.pop, offsets, repeat(None)), maxlen=0)


def _run_footprint(run: EntryRun) -> int:
    """:func:`footprint` of one run waiting in an outbox."""
    count = len(run.offsets)
    return footprint(1, count, count * run.size)


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
    """A consumer's messages delivered and not yet acknowledged: offset -> the position of the
    run it came in, with the bytes counted for them; its count is also in its subscription's
    ``tally``."""

    __slots__ = ("_by_offset", "_tally", "bytes")

    def __init__(self, tally: UnackedTally | None = None) -> None:
        self._by_offset: dict[int, _Position] = {}
        self.bytes = 0
        self._tally = tally or UnackedTally()

    def add_run(self, offsets: Sequence[int], held: _Position) -> None:
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

    def pop_all(self, offsets: list[int]) -> list[_Position | None]:
        """``pop`` each of ``offsets``: what was held of each (None: nothing), in order."""
        popped = list(map(self._by_offset.pop, offsets, repeat(None)))
        held = [h for h in popped if h is not None]
        self.bytes -= sum(h.size for h in held)
        self._tally.messages -= len(held)
        return popped

    def pop(self, offset: int) -> _Position | None:
        held = self._by_offset.pop(offset, None)
        if held is not None:
            self.bytes -= held.size
            self._tally.messages -= 1
        return held

    def clear(self) -> None:
        self._tally.messages -= len(self._by_offset)
        self._by_offset.clear()
        self.bytes = 0

    def get(self, offset: int) -> _Position | None:
        return self._by_offset.get(offset)

    def items(self) -> Iterable[tuple[int, _Position]]:
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
        self.outbox: deque[EntryRun] = deque()
        self._outbox_bytes = 0
        self._outbox_bytes_max = subscription.limits.consumer_pending_bytes_max
        self.unacked = UnackedMessages(subscription.unacked_tally)
        self._entries: OrderedDict[tuple[int, int], _Position] = OrderedDict()
        """(ledger, entry) -> position of the entries last handed to it (``track_ids``), oldest first."""
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
        """The footprint of the runs in ``outbox``."""
        return self._outbox_bytes

    @outbox_bytes.setter
    def outbox_bytes(self, value: int) -> None:
        """(Under the subscription's lock.) The subscription keeps the sum over its consumers."""
        self.subscription._outbox_bytes_total += value - self._outbox_bytes
        self._outbox_bytes = value

    @property
    def outbox_messages(self) -> int:
        """The messages of the runs in ``outbox``."""
        with self.subscription._lock:
            return sum(len(run.offsets) for run in self.outbox)

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

    def poll(self) -> EntryRun | None:
        """The oldest run waiting in the outbox, taken."""
        subscription = self.subscription
        with subscription._lock:
            if not self.outbox:
                return None
            run = self.outbox.popleft()
            full = self.outbox_bytes >= self._outbox_bytes_max
            self.outbox_bytes = self.outbox_bytes - _run_footprint(run) if self.outbox else 0
        subscription._taken(full)
        return run

    def poll_all(self) -> list[EntryRun]:
        """Everything :meth:`poll` would return one by one, in order, taken at once."""
        subscription = self.subscription
        with subscription._lock:
            taken = list(self.outbox)
            self.outbox.clear()
            freed, self.outbox_bytes = self.outbox_bytes, 0
        if freed:
            subscription._taken(freed >= self._outbox_bytes_max)
        return taken

    def take_head(self, run: EntryRun, count: int) -> EntryRun | None:
        """The first ``count`` messages of ``run``, taken, if ``run`` is still the oldest in the
        outbox (the rest stays there as a run); None when it is not (another taker was first)."""
        subscription = self.subscription
        with subscription._lock:
            if not self.outbox or self.outbox[0] is not run:
                return None
            full = self.outbox_bytes >= self._outbox_bytes_max
            if count >= len(run.offsets):
                self.outbox.popleft()
                self.outbox_bytes = self.outbox_bytes - _run_footprint(run) if self.outbox else 0
                taken = run
            else:
                taken, rest = run._replace(offsets=run.offsets[:count]), run._replace(offsets=run.offsets[count:])
                self.outbox[0] = rest
                self.outbox_bytes = self.outbox_bytes - _run_footprint(run) + _run_footprint(rest)
        subscription._taken(full)
        return taken

    def holds(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` is still this consumer's to hand over: not acknowledged, timed
        out, nacked or taken back since it was dispatched (a redelivery is a new delivery)."""
        subscription = self.subscription
        with subscription._lock:
            return delivery.offset in self.unacked and \
                subscription._counts.get(delivery.offset, 0) == delivery.redelivery_count

    def peek(self) -> EntryRun | None:
        """The run :meth:`poll` would return next, left in the outbox."""
        with self.subscription._lock:
            return self.outbox[0] if self.outbox else None

    def offset_of(self, message_id: MessageId) -> int | None:
        """The offset of a message this consumer holds, by the id it was delivered with (None:
        not held, or of an entry it no longer remembers)."""
        position = self._entries.get((message_id.ledger_id, message_id.entry_id))
        if position is None or message_id.partition != self.subscription.partition:
            return None
        index = message_id.batch_index
        if (index >= 0) if position.batch_size == 1 else not 0 <= index < position.batch_size:
            return None
        offset = position.first_offset + max(index, 0)
        return offset if offset in self.unacked else None

    def locate(self, message_id: MessageId) -> int:
        """The offset of ``message_id`` in this consumer's topic, held or not."""
        held = self.offset_of(message_id)
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
    def _remember(self, position: _Position) -> None:
        """(Under the lock.) Keep the position of an entry handed to it (``track_ids``)."""
        entries = self._entries
        entries[(position.ledger_id, position.entry_id)] = position
        if len(entries) > ENTRIES_REMEMBERED_MAX:
            entries.popitem(last=False)

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

    def _room(self, size: int) -> int:
        """(It can take.) How many messages of ``size`` bytes each it takes now: up to its
        permits and until a limit is reached (at least one), as if handed one at a time."""
        config = self.config
        room = min(self.permits, config.unacked_messages_max - len(self.unacked),
                   -(-(config.unacked_bytes_max - self.unacked.bytes) // max(size, 1)),
                   -(-(self._outbox_bytes_max - self.outbox_bytes) // (size + MESSAGE_BYTES)))
        return max(room, 1)

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
        self._loaded: tuple[tuple[int, int], bytes] | None = None
        """The entry last read again for a redelivery (its position and bytes), kept for the
        round, so an entry is read once however its messages come back."""
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
        self._pending: deque[_Waiting] = deque()
        self._redeliver: list[tuple[int, _Position]] = []  # heap by offset: due for redelivery
        self._later: list[tuple[int, int, _Position]] = []  # heap (due ms, offset): nacked / delayed
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
            if not self.consumers:  # nobody to read for: nothing stays read ahead, all is read again
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
            heapq.heappush(self._redeliver, (offset, held))
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
        notify: dict[Consumer, None] = {}
        with self._lock:
            self._release_due()
            now = self._clock()  # one reading per round: when this round's deliveries were sent
            held: list[_Waiting] = []
            held_messages = 0
            quotas = self._quotas
            by_key = self.type is SubscriptionType.KEY_SHARED
            while self._any_can_take():
                if quotas.dispatch is not None and self._throttled(now):
                    break
                waiting = self._next_waiting()
                if waiting is None:
                    break
                offsets = self._undelivered(waiting)
                if not offsets:
                    continue
                left = self._dispatch_by_key(waiting, offsets, now, notify) if by_key else \
                    self._dispatch_entry(waiting, offsets, now, notify)
                if left is not None:  # no consumer can take these now (their key's is busy)
                    held.append(left)
                    held_messages += len(left.offsets)
                    if held_messages >= PENDING_MESSAGES_MAX:
                        break
            for waiting in reversed(held):  # each back where it came from, so the order holds
                self._put_back(waiting, waiting.offsets)
            self._loaded = None
            if not self._pending:
                self._pending_bytes = 0
            delta = self._budget_delta()
        self._tell_budget(delta)
        for consumer in notify:
            if consumer.listener is not None:
                consumer.listener()

    def _undelivered(self, waiting: _Waiting) -> Sequence[int]:
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

    def _dispatch_entry(self, waiting: _Waiting, offsets: Sequence[int], now: float,
                        notify: dict[Consumer, None]) -> _Waiting | None:
        """Exclusive, Failover and Shared: the consumer whose turn it is takes what it can of the
        entry; the rest waits at the head for the next round of the loop."""
        consumer = self._next_in_turn() if self.type is SubscriptionType.SHARED else self._active()
        if consumer is None:
            waiting.offsets = offsets
            return waiting
        self._hand(consumer, waiting, offsets, now, notify)
        return None

    def _hand(self, consumer: Consumer, waiting: _Waiting, offsets: Sequence[int], now: float,
              notify: dict[Consumer, None]) -> None:
        """Give ``consumer`` as much of ``offsets`` as it takes now (all of them for a
        ``whole_entries`` one); the rest goes back to wait at the head."""
        count = len(offsets)
        take = count if count == 1 or consumer.config.whole_entries else \
            min(count, consumer._room(waiting.position.size), self._room())
        if take < count:
            self._deliver(consumer, waiting, offsets[:take], now)
            self._put_back(waiting, offsets[take:])
        else:
            self._deliver(consumer, waiting, offsets, now)
        notify[consumer] = None

    def _room(self) -> int:
        """Messages the subscription's unacknowledged limit lets through (at least one)."""
        return max(self.limits.unacked_messages_max - self.unacked_tally.messages, 1)

    def _put_back(self, waiting: _Waiting, offsets: Sequence[int]) -> None:
        """What is left of an entry waits again where it came from: at the head of what was
        read, or (read again for redelivery) with the redeliveries, as positions."""
        if waiting.redelivery:
            position = waiting.position
            for offset in offsets:
                heapq.heappush(self._redeliver, (offset, position))
        else:
            waiting.offsets = offsets
            self._pending.appendleft(waiting)

    def _dispatch_by_key(self, waiting: _Waiting, offsets: Sequence[int], now: float,
                         notify: dict[Consumer, None]) -> _Waiting | None:
        """Key_Shared: an entry of one key goes to that key's consumer; one of several keys is
        split between theirs (a ``whole_entries`` consumer of its first message takes it all, as
        Pulsar routes an entry by its key). What cannot go now is returned, to wait."""
        hashes = waiting.hashes
        if isinstance(hashes, int) or hashes is None:
            consumer = self._choose_by_hash(-1 if hashes is None else hashes)
            if consumer is None:
                waiting.offsets = offsets
                return waiting
            self._hand(consumer, waiting, offsets, now, notify)
            return None
        first = waiting.position.first_offset
        lead = self._choose_by_hash(hashes[offsets[0] - first])
        if lead is not None and lead.config.whole_entries:
            self._hand(lead, waiting, offsets, now, notify)
            return None
        groups: dict[Consumer, list[int]] = {}
        rooms: dict[Consumer, int] = {}
        left: list[int] = []
        size, room = waiting.position.size, self._room()
        for offset in offsets:
            consumer = self._choose_by_hash(hashes[offset - first]) if room else None
            if consumer is None:
                left.append(offset)
                continue
            group = groups.get(consumer)
            if group is None:
                group = groups[consumer] = []
                rooms[consumer] = len(offsets) if consumer.config.whole_entries else consumer._room(size)
            if len(group) < rooms[consumer]:
                group.append(offset)
                room -= 1
            else:
                left.append(offset)
        for consumer, group in groups.items():
            self._deliver(consumer, waiting, group, now)
            notify[consumer] = None
        if not left:
            return None
        waiting.offsets = left
        return waiting

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
        """A transport took runs from a consumer's outbox: they leave the budget, and an
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

    def _next_waiting(self) -> _Waiting | None:
        """The next entry to dispatch: the oldest redelivery first (with every message of its
        entry waiting for redelivery, and what of it waits read ahead: a message waiting in
        both goes once), else what was read ahead, reading more when nothing is."""
        redeliver = self._redeliver
        while redeliver:
            offset, position = heapq.heappop(redeliver)
            offsets = [offset]
            ledger_id, entry_id = position.ledger_id, position.entry_id
            while redeliver and redeliver[0][1].entry_id == entry_id and redeliver[0][1].ledger_id == ledger_id:
                following = heapq.heappop(redeliver)[0]
                if following != offsets[-1]:
                    offsets.append(following)
            pending = self._pending
            if pending and pending[0].position.entry_id == entry_id and pending[0].position.ledger_id == ledger_id:
                offsets = sorted({*offsets, *pending.popleft().offsets})
            data = self._load(position, offsets)
            if data is None:
                continue
            self._pending_bytes += footprint(1, len(offsets), position.size * len(offsets))
            hashes = _key_hashes(decode_messages(data)[0]) if self.type is SubscriptionType.KEY_SHARED else None
            return _Waiting(position, data, offsets, hashes, True)
        if not self._pending and not self._must_wait_for_budget():
            self._read_more()
        return self._pending.popleft() if self._pending else None

    def _load(self, position: _Position, offsets: Sequence[int] = ()) -> bytes | None:
        """Read the entry at ``position`` again (its messages were held as positions): None when
        it is gone (trimmed, its ledger deleted), so there is nothing to deliver. Any other
        failure puts ``offsets`` back for redelivery and propagates."""
        key = (position.ledger_id, position.entry_id)
        loaded = self._loaded
        if loaded is not None and loaded[0] == key:
            return loaded[1]
        try:
            entry = self.cursor.ml.read_entry(Position(position.ledger_id, position.entry_id))
        except (NoSuchEntry, NotFound):
            return None
        except MagnetarError:
            for offset in offsets:
                heapq.heappush(self._redeliver, (offset, position))
            raise
        self._loaded = (key, entry.data)
        return entry.data

    def _read_size(self) -> tuple[int, int]:
        """(entries, entry bytes) for the next read: enough entries for the permits consumers
        have left, at the topic's average entry size in messages, and no more bytes than
        ``read_bytes_max`` nor than the outboxes of the consumers that can take have room for:
        the dispatcher reads at most one entry beyond what it can send. The room is summed over
        the consumers with permits only until it covers a whole read, so a read costs the same
        however many consumers there are."""
        read_bytes_max = self.limits.read_bytes_max
        room = 0
        for consumer in self._with_permits:
            room += max(consumer._outbox_bytes_max - consumer.outbox_bytes, 0)
            if room >= read_bytes_max:
                break
        wanted = min(PENDING_MESSAGES_MAX, self._permits_total)
        entries = max(1, min(READ_BATCH_ENTRIES, wanted // self.cursor.ml.messages_per_entry()))
        return entries, max(1, min(read_bytes_max, room))

    def _read_more(self) -> None:
        """Read the next entries for dispatch. Per entry, only what routing needs is decoded:
        its delivery time on Shared and Key_Shared subscriptions, and on Key_Shared ones its
        messages' key hashes; an entry not yet due waits as positions."""
        cursor = self.cursor
        pending, later = self._pending, self._later
        delayable = self.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)
        keyed = self.type is SubscriptionType.KEY_SHARED
        now_ms = int(self._clock() * 1000)
        read_bytes = 0
        for entry in cursor.read_entries(*self._read_size()):
            first, end = entry.first_offset, entry.last_offset + 1
            offsets: Sequence[int] = range(first, end)
            if first < cursor.mark_delete_offset or (len(cursor.acked) and cursor.acked.count_in(first, end)):
                offsets = [o for o in offsets if not cursor.is_acked(o)]
            data = entry.data
            count = end - first
            position = _new_position(_Position, (entry.position.ledger_id, entry.position.entry_id, first, count,
                                                 entry.publish_time_ms, len(data) // count))
            hashes = None
            if delayable:
                if keyed:
                    messages, due = decode_messages(data)
                    hashes = _key_hashes(messages)
                else:
                    due = delivery_time(data)
                if due is not None and due > now_ms:  # held as positions until due, then read again
                    for offset in offsets:
                        heapq.heappush(later, (due, offset, position))
                    continue
            pending.append(_Waiting(position, data, offsets, hashes, False))
            read_bytes += footprint(1, len(offsets), position.size * len(offsets))
        self._pending_bytes += read_bytes

    def _next_in_turn(self) -> Consumer | None:
        """Round-robin among the consumers with permits: the first that can take, which then
        goes to the end of the turn."""
        with_permits = self._with_permits
        consumer = next((c for c in with_permits if c._can_take()), None)
        if consumer is not None:
            del with_permits[consumer]
            with_permits[consumer] = None
        return consumer

    def _choose_by_hash(self, hashed: int) -> Consumer | None:
        """The Key_Shared consumer of a message with key hash ``hashed``, if it can take it now."""
        if not self._ring:
            return None
        if hashed < 0:  # keyless messages spread like Shared
            return self._next_in_turn()
        owner = self._key_owner.get(hashed)
        target = self._ring[bisect.bisect_left(self._ring, hashed, key=_ring_hash) % len(self._ring)][1]
        if owner is not None and owner[0] is not target:
            return None  # an earlier message of this key is still unacked elsewhere: keep order
        return target if target._can_take() else None

    def _run(self, position: _Position, data: bytes, offsets: Sequence[int], redelivery_count: int) -> EntryRun:
        return _new_run(EntryRun, (self.topic_name, position.ledger_id, position.entry_id, self.partition, data,
                                   position.first_offset, position.batch_size, offsets, redelivery_count,
                                   position.publish_time_ms))

    def _deliver(self, consumer: Consumer, waiting: _Waiting, offsets: Sequence[int], now: float) -> None:
        """Hand ``offsets`` of ``waiting`` to ``consumer`` as one run (a run per redelivery
        count, when they differ): one bookkeeping step per collection, not per message."""
        position = waiting.position
        if self._counts:
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
        self._pending_bytes -= run_bytes
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
        if self.type is SubscriptionType.KEY_SHARED:
            self._hold_keys(consumer, waiting, offsets)

    def _runs_by_count(self, position: _Position, data: bytes, offsets: Sequence[int]) -> list[EntryRun]:
        """``offsets`` as runs of one redelivery count each, in order."""
        get = self._counts.get
        runs: list[EntryRun] = []
        start = 0
        for index in range(1, len(offsets) + 1):
            if index == len(offsets) or get(offsets[index], 0) != get(offsets[start], 0):
                runs.append(self._run(position, data, offsets[start:index], get(offsets[start], 0)))
                start = index
        return runs

    def _hold_keys(self, consumer: Consumer, waiting: _Waiting, offsets: Sequence[int]) -> None:
        """Key_Shared: ``consumer`` now holds these messages' keys (their order waits on it)."""
        hashes, first = waiting.hashes, waiting.position.first_offset
        key_owner, held_keys = self._key_owner, self._held_keys
        for offset in offsets:
            hashed = hashes if isinstance(hashes, int) else -1 if hashes is None else hashes[offset - first]
            if hashed >= 0:
                holder = key_owner.get(hashed)
                key_owner[hashed] = (consumer, (holder[1] if holder else 0) + 1)
                held_keys[offset] = hashed

    def _release(self, offset: int, consumer: Consumer) -> None:
        """Forget that ``consumer`` holds ``offset`` (acked, nacked, timed out or taken back)."""
        self._owner.pop(offset, None)
        self._sent_at.pop(offset, None)
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
            for run in consumer.outbox:
                for offset in run.offsets:
                    self._release(offset, consumer)
                    held = consumer.unacked.pop(offset)
                    if held is not None:
                        heapq.heappush(self._redeliver, (offset, held))
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
                heapq.heappush(self._later, (due_ms, offset, held))
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
                    heapq.heappush(self._redeliver, (offset, held))
                self._bump_counts(expired)
        self.dispatch()

    def _release_due(self) -> None:
        now_ms = int(self._clock() * 1000)
        while self._later and self._later[0][0] <= now_ms:
            _, offset, position = heapq.heappop(self._later)
            if self._dead_lettered(offset, position):
                continue
            heapq.heappush(self._redeliver, (offset, position))
        while self._redeliver and self._dead_lettered(*self._redeliver[0]):
            heapq.heappop(self._redeliver)

    def _dead_lettered(self, offset: int, position: _Position) -> bool:
        """Send an over-redelivered message to its dead-letter topic (once) and ack it."""
        limit = max(self._redeliver_limits, default=0)
        if limit <= 0 or self._dead_letter is None or self._counts.get(offset, 0) <= limit:
            return False
        data = self._load(position)
        if data is not None:  # else its entry is gone: nothing to move
            dlq = next((c.config.dead_letter_topic for c in self.consumers if c.config.dead_letter_topic), None)
            target = dlq or f"{self.topic_name}-{self.name}-DLQ"
            run = self._run(position, data, (offset,), self._counts[offset])
            self._dead_letter(target, run.messages()[0], self.name)
        self._counts.pop(offset, None)
        self.cursor.ack([offset]).result(timeout=60)
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
