"""A consumer: a transport's handle on a subscription, with its permits, outbox and statistics.

Role: every transport (WebSocket, REST pull, the binary protocol) consumes through one
``Consumer`` that ``Subscription.add_consumer`` (``broker/subscription.py``) made. The transport
only calls ``flow``, ``poll`` (``poll_all``, ``take_head``), ``ack``, ``ack_cumulative``,
``nack``, ``withdraw`` and ``close``, and is told through ``listener`` that runs wait; the
subscription's dispatcher decides what the consumer gets and puts it in its ``outbox``.

Flow control: a consumer receives only while it has permits (``receiverQueueSize`` in push
mode, explicit in pull mode), one per message. Its unacknowledged limits (messages, and bytes:
``unacked_bytes_max``, each message counting its share of its entry's bytes) pause delivery at
the limit (a run is cut there, as if the messages were handed one at a time) and resume at
half; a consumer holding nothing always gets one message, however large. A consumer configured
with ``whole_entries`` (the binary protocol's: Pulsar's clients acknowledge a batch as one) gets
the whole rest of an entry in one run, past its permits and limits, as Pulsar's broker delivers.

Memory: runs wait in the outbox until the transport takes them; a consumer whose outbox holds
``consumer_pending_bytes_max`` (its ``footprint``: a run counts its share of its entry's bytes,
a record and a slot per message) gets nothing more until the transport took them, which it does
only while its connection drains: a client that stops reading is held back by TCP, never
buffered. Taking from a full outbox asks for a dispatch. What it holds unacknowledged is kept as
positions (``broker/unacked.py``); a consumer that tracks ids remembers at most
``ENTRIES_REMEMBERED_MAX`` entries it was handed.

Invariants: the consumer's state changes only under its subscription's lock (the subscription
keeps the sum of its consumers' outbox bytes and who has permits as they change, through the
``outbox_bytes`` and ``permits`` setters); a closed consumer has no permits. The consumer
reaches its subscription through the narrow ``ConsumerSubscription`` (the subscription builds
consumers, so naming its class here would close an import circle).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from broker.cursor import ManagedCursor
from broker.delivery import MESSAGE_BYTES, Delivery, EntryRun, footprint
from broker.errors import InvalidRequest
from broker.limits import ENTRIES_REMEMBERED_MAX
from broker.message_id import MessageId
from broker.subscription_stats import ConsumerStats, SubscriptionStats
from broker.subscription_type import SubscriptionType
from broker.unacked import EntryRef, UnackedMessages, UnackedTally


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
    address: str = ""
    """The client's address as Pulsar's ConsumerStats show it (``/host:port``); empty when the
    transport has no lasting connection (REST pull)."""
    track_ids: bool = True
    """Remember the entries handed out (``ENTRIES_REMEMBERED_MAX``) for :meth:`Consumer.offset_of`;
    off for a transport that maps ids to offsets itself (the binary protocol, by entry)."""


class ConsumerSubscription(Protocol):
    """What a consumer asks of its subscription (``broker/subscription.py``'s ``Subscription``),
    and what its transport reaches through ``Consumer.subscription``. The underscored members
    are the subscription's side of the consumer's own operations: only ``Consumer`` calls them."""

    @property
    def type(self) -> SubscriptionType: ...

    @property
    def partition(self) -> int: ...

    @property
    def cursor(self) -> ManagedCursor: ...

    @property
    def consumers(self) -> Mapping[Consumer, None]: ...

    @property
    def unacked_tally(self) -> UnackedTally: ...

    @property
    def _lock(self) -> AbstractContextManager[Any]: ...

    _outbox_bytes_total: int

    def dispatch(self) -> None: ...

    def active_consumer(self) -> Consumer | None: ...

    def statistics(self) -> SubscriptionStats: ...

    def end_of_topic(self) -> bool: ...

    def backlog_messages(self) -> int: ...

    def remove_consumer(self, consumer: Consumer) -> None: ...

    def _permits_changed(self, consumer: Consumer, old: int, new: int) -> None: ...

    def _flow(self, consumer: Consumer, permits: int) -> None: ...

    def _taken(self, was_full: bool) -> None: ...

    def _holds(self, consumer: Consumer, delivery: Delivery) -> bool: ...

    def _ack(self, consumer: Consumer, offsets: list[int]) -> None: ...

    def _ack_cumulative(self, consumer: Consumer, offset: int) -> None: ...

    def _nack(self, consumer: Consumer, offsets: list[int]) -> None: ...

    def _withdraw(self, consumer: Consumer) -> None: ...


def run_footprint(run: EntryRun) -> int:
    """:func:`footprint` of one run waiting in an outbox."""
    count = len(run.offsets)
    return footprint(1, count, count * run.size)


class Consumer:
    """A transport's handle on a subscription."""

    _ids = itertools.count(1)

    def __init__(self, subscription: ConsumerSubscription, config: ConsumerConfig, outbox_bytes_max: int) -> None:
        self.id = next(self._ids)
        self.subscription = subscription
        self.config = config
        self._permits = 0
        self.outbox: deque[EntryRun] = deque()
        self._outbox_bytes = 0
        self._outbox_bytes_max = outbox_bytes_max
        """The subscription's ``consumer_pending_bytes_max``."""
        self.unacked = UnackedMessages(subscription.unacked_tally)
        self._entries: OrderedDict[tuple[int, int], EntryRef] = OrderedDict()
        """(ledger, entry) -> position of the entries last handed to it (``track_ids``), oldest first."""
        self.listener: Callable[[], None] | None = None
        self.unloaded = False
        """Closed because its topic stopped being served here (it moved to another broker): the
        client should look the topic up again, rather than take the subscription as gone."""
        self.closed = False
        self.msg_out = self.bytes_out = self.redelivered = 0
        self.blocked = False
        self.connected_since_ms = int(time.time() * 1000)
        self._rates = (0.0, 0.0, 0.0)  # messages/s out, bytes/s out, redeliveries/s
        self._rate_base: tuple[float | None, int, int, int] = (None, 0, 0, 0)

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
            self.outbox_bytes = self.outbox_bytes - run_footprint(run) if self.outbox else 0
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
                self.outbox_bytes = self.outbox_bytes - run_footprint(run) if self.outbox else 0
                taken = run
            else:
                taken, rest = run._replace(offsets=run.offsets[:count]), run._replace(offsets=run.offsets[count:])
                self.outbox[0] = rest
                self.outbox_bytes = self.outbox_bytes - run_footprint(run) + run_footprint(rest)
        subscription._taken(full)
        return taken

    def holds(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` is still this consumer's to hand over: not acknowledged, timed
        out, nacked or taken back since it was dispatched (a redelivery is a new delivery)."""
        return self.subscription._holds(self, delivery)

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

    def _remember(self, position: EntryRef) -> None:
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

    def update_rates(self, now: float) -> None:
        """(Under the subscription's lock, on its tick, and once when added.) The rates since the
        last call."""
        since, msgs, byte_count, redelivered = self._rate_base
        if since is not None and now > since:
            elapsed = now - since
            self._rates = ((self.msg_out - msgs) / elapsed, (self.bytes_out - byte_count) / elapsed,
                           (self.redelivered - redelivered) / elapsed)
        self._rate_base = (now, self.msg_out, self.bytes_out, self.redelivered)

    def statistics(self) -> ConsumerStats:
        return ConsumerStats(self.name, self.permits, len(self.unacked), self.msg_out, self.bytes_out,
                             self.redelivered, self.blocked, self.config.address, self.connected_since_ms,
                             *self._rates)
