"""What a topic's statistics say, as plain values: for admin stats, internal stats and metrics.

Role: the broker's side of every statistics document. :func:`topic_stats` and
:func:`internal_stats` read a topic's managed ledger, cursors, subscriptions and compaction
record once and return frozen values; transports render them (``api/admin.py`` in Pulsar's
``TopicStats`` and ``PersistentTopicInternalStats`` shapes, ``api/metrics.py`` in Prometheus's,
the console through the admin API). Nothing here is kept between calls: every counter is the
components' own ``statistics()``.

Invariants: statistics only read; a subscription deleted while they are gathered is left out
rather than failing them; counters count since the topic was loaded (as Pulsar's do) and rates
are over the broker's last maintenance interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.compaction import CompactionStatus
from broker.cursor import ManagedCursor
from broker.errors import DataLost, NoSuchEntry
from broker.limits import DELETED_RANGES_SHOWN_MAX
from broker.managed_ledger_offload import OffloadStatus
from broker.message_id import Position
from broker.subscription import Subscription
from broker.subscription_stats import SubscriptionStats
from broker.topic import PersistentTopic


@dataclass(frozen=True)
class TopicStats:
    topic: str
    msg_rate_in: float
    msg_throughput_in: float
    bytes_in_counter: int
    msg_in_counter: int
    storage_size_bytes: int
    entries: int
    ledgers: int
    first_offset: int
    next_offset: int
    terminated: bool
    dedup_enabled: bool
    subscriptions: tuple[SubscriptionStats, ...]
    offloaded_size_bytes: int = 0
    """Bytes of the topic's ledgers with a complete copy in the object store."""
    ledgers_offloaded: int = 0
    """Ledgers this broker offloaded since it loaded the topic (likewise the two below)."""
    bytes_offloaded: int = 0
    offload_errors: int = 0
    offload_last_error: str = ""
    """The last offload's error while its status is ERROR; empty otherwise."""

    @property
    def msg_rate_out(self) -> float:
        return sum(s.msg_rate_out for s in self.subscriptions)

    @property
    def msg_throughput_out(self) -> float:
        return sum(s.msg_throughput_out for s in self.subscriptions)

    @property
    def msg_out_counter(self) -> int:
        return sum(s.msg_out_counter for s in self.subscriptions)

    @property
    def bytes_out_counter(self) -> int:
        return sum(s.bytes_out_counter for s in self.subscriptions)

    @property
    def backlog_size_bytes(self) -> int:
        return max((s.backlog_size_bytes for s in self.subscriptions), default=0)


@dataclass(frozen=True)
class LedgerView:
    ledger_id: int
    entries: int
    size_bytes: int
    first_offset: int
    messages: int
    created_ms: int
    offloaded: bool = False
    """A complete copy is in the object store (reads go there)."""
    local_deleted: bool = False
    """The bookies' copy is deleted (after the offload deletion lag)."""


@dataclass(frozen=True)
class CursorView:
    name: str
    mark_delete_position: Position
    read_position: Position
    messages_consumed: int
    cursor_ledger_id: int
    deleted_entry_spans: tuple[tuple[Position, Position], ...]
    """Entries wholly acknowledged above the mark-delete position, as (position before the
    first, last) spans: Pulsar's ``individuallyDeletedMessages`` (at most
    ``DELETED_RANGES_SHOWN_MAX``)."""
    acked_ranges: int
    acked_offset_ranges: tuple[tuple[int, int], ...]
    active: bool
    properties: dict[str, int]
    mark_delete_offset: int
    read_offset: int
    persisted_states: int


@dataclass(frozen=True)
class InternalStats:
    entries_added: int
    number_of_entries: int
    total_size_bytes: int
    current_ledger_entries: int
    current_ledger_size_bytes: int
    last_confirmed: Position
    terminated: bool
    ledgers: tuple[LedgerView, ...]
    cursors: tuple[CursorView, ...]
    first_offset: int
    next_offset: int
    compaction: CompactionStatus
    offload: OffloadStatus | None = None
    """The topic's last offload (``broker/managed_ledger_offload.py``)."""


def topic_stats(topic: PersistentTopic, active: Sequence[Subscription]) -> TopicStats:
    """``topic``'s statistics; ``active`` are its subscriptions with dispatch state (the rest
    are durable cursors nobody attached to since the broker started)."""
    ml = topic.ml.statistics()
    rate_msgs, rate_bytes = topic.publish_rates()
    by_name = {s.name: s for s in active}
    views = []
    for name in sorted(set(topic.cursors.names()) | set(by_name)):
        view = _subscription_view(topic.cursors.get(name), by_name.get(name))
        if view is not None:
            views.append(view)
    counters, status = topic.ml.offload_counters, topic.ml.offload_status()
    return TopicStats(topic.name.full_name, rate_msgs, rate_bytes, ml.bytes_added, ml.messages_added,
                      ml.total_size_bytes, ml.number_of_entries, ml.ledgers, ml.first_offset, ml.next_offset,
                      ml.terminated, topic.dedup is not None, tuple(views), topic.ml.offloaded_size_bytes(),
                      counters.ledgers_offloaded, counters.bytes_offloaded, counters.errors,
                      status.last_error if status.status == "ERROR" else "")


def _subscription_view(cursor: ManagedCursor | None, active: Subscription | None) -> SubscriptionStats | None:
    if active is not None:
        return active.statistics()
    return None if cursor is None else SubscriptionStats.idle(cursor)  # None: deleted meanwhile


def internal_stats(topic: PersistentTopic, active: Sequence[Subscription],
                   compaction: CompactionStatus) -> InternalStats:
    ml = topic.ml
    stats = ml.statistics()
    infos = ml.ledger_infos()
    last = stats.last_confirmed
    if last.ledger_id < 0 and infos:
        last = Position(infos[-1].ledger_id, -1)
    by_name = {s.name: s for s in active}
    cursors = []
    for name in topic.cursors.names():
        cursor = topic.cursors.get(name)
        if cursor is not None:
            subscription = by_name.get(name)
            cursors.append(_cursor_view(topic, cursor, bool(subscription is not None and subscription.consumers)))
    return InternalStats(
        stats.entries_added, stats.number_of_entries, stats.total_size_bytes, stats.current_ledger_entries,
        stats.current_ledger_size_bytes, last, stats.terminated,
        tuple(LedgerView(i.ledger_id, i.entries, i.size_bytes, i.first_offset, i.messages, i.created_ms,
                         i.offloaded, i.local_deleted) for i in infos),
        tuple(cursors), stats.first_offset, stats.next_offset, compaction, ml.offload_status())


def _cursor_view(topic: PersistentTopic, cursor: ManagedCursor, active: bool) -> CursorView:
    stats = cursor.statistics()
    ranges = cursor.acked_ranges()[:DELETED_RANGES_SHOWN_MAX]
    spans = tuple(span for start, end in ranges if (span := _whole_entries(topic, start, end)) is not None)
    return CursorView(cursor.name, cursor.mark_delete_position(), _read_position(topic, stats.read_offset),
                      stats.messages_consumed, stats.cursor_ledger_id, spans, stats.acked_ranges,
                      tuple(ranges), active, dict(cursor.properties), stats.mark_delete_offset, stats.read_offset,
                      stats.persisted_states)


def _read_position(topic: PersistentTopic, read_offset: int) -> Position:
    ml = topic.ml
    if read_offset < ml.confirmed_next_offset():
        return ml.offset_to_position(max(read_offset, ml.first_offset))[0]
    return ml.next_position(ml.last_confirmed)


def _whole_entries(topic: PersistentTopic, start: int, end: int) -> tuple[Position, Position] | None:
    """(position before the first, last) entry whose messages all lie in ``[start, end)``."""
    ml = topic.ml
    try:
        first_position, index = ml.offset_to_position(start)
        first = ml.read_entry(first_position)
        low = start if index == 0 else first.last_offset + 1
        last_position, _ = ml.offset_to_position(end - 1)
        last = ml.read_entry(last_position)
        high = end - 1 if last.last_offset == end - 1 else last.first_offset - 1
        if low > high:
            return None
        low_position = first_position if low == start else ml.offset_to_position(low)[0]
        high_position = last_position if high == end - 1 else ml.offset_to_position(high)[0]
    except (DataLost, NoSuchEntry):  # trimmed meanwhile
        return None
    return Position(low_position.ledger_id, low_position.entry_id - 1), high_position
