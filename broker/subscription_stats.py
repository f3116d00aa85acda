"""A subscription's and its consumers' counters, as the admin API's topic stats report them.

Role: ``Subscription.statistics`` (``broker/subscription.py``) and ``Consumer.statistics``
(``broker/consumer.py``) take these snapshots under the subscription's lock; the topic's stats
(``broker/topic_stats.py``) gather them. Invariant: a snapshot is immutable, so it is read
without the lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.cursor import ManagedCursor


@dataclass(frozen=True)
class ConsumerStats:
    name: str
    available_permits: int
    unacked_messages: int
    msg_out_counter: int
    bytes_out_counter: int
    msg_redeliver_counter: int
    blocked_on_unacked: bool
    address: str
    connected_since_ms: int
    """Wall-clock time the consumer was added, epoch milliseconds."""
    msg_rate_out: float
    msg_throughput_out: float
    msg_rate_redeliver: float


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
