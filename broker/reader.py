"""Readers: non-durable, self-positioned consumption of one topic partition.

A reader starts exactly where asked (``earliest``, ``latest``, a message id inclusive or
exclusive, an offset, or a publish timestamp) and reads forward, keeping its position only in
memory (Pulsar's readers are non-durable cursors). With ``compacted=True`` it first reads the
topic's compacted view (latest message per key) below the compaction horizon, then the topic's
messages after it. A reader hands out messages (its callers are edges that need them): each
entry read is split with ``EntryRun.messages``, the one split every edge uses; a compacted
view's messages, which have no stored entry of their own, come as they are.

Memory: a reader reads ahead at most ``READ_BATCH_ENTRIES`` entries and ``read_bytes_max`` of
entry bytes (one entry always), and holds that read decoded until it has handed out its last
message; the read's footprint (``decoded_footprint``) counts in the broker-wide reads-in-flight budget meanwhile
(``broker/byte_budget.py``). While the budget refuses, a reader reads nothing (it has caught up,
as far as its caller sees) and its listeners are called once the budget admits again.
:meth:`Reader.close` gives back what an abandoned reader still holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from broker.byte_budget import BudgetShare, ByteBudget
from broker.compaction import Compactor
from broker.delivery import Delivery, EntryRun, decoded_footprint
from broker.entry import Entry
from broker.errors import InvalidRequest, MagnetarError
from broker.limits import READ_BATCH_ENTRIES, READER_READ_BYTES_MAX, READER_TRIM_RETRIES_MAX
from broker.message_id import MessageId
from broker.topic import PersistentTopic


@dataclass(frozen=True)
class StartPosition:
    """Where a reader starts: exactly one of the fields is meaningful."""

    kind: str  # earliest | latest | message_id | offset | timestamp
    message_id: MessageId | None = None
    inclusive: bool = False
    offset: int = 0
    timestamp_ms: int = 0

    @classmethod
    def earliest(cls) -> StartPosition:
        return cls("earliest")

    @classmethod
    def latest(cls) -> StartPosition:
        return cls("latest")


class Reader:
    def __init__(self, topic: PersistentTopic, start: StartPosition, *, compactor: Compactor | None = None,
                 budget: ByteBudget | None = None, read_bytes_max: int = READER_READ_BYTES_MAX) -> None:
        self.topic = topic
        self._buffer: deque[Delivery] = deque()
        self._peeked: Delivery | None = None
        self._read_bytes_max = read_bytes_max
        self._buffered_bytes = 0
        """The footprint of the read ``_buffer`` holds, counted in the budget until it is empty."""
        self._listeners: list[Callable[[], None]] = []
        self._budget_share = BudgetShare(budget, self._budget_freed)
        """This reader's account with the reads-in-flight budget (one wake-up left at a time)."""
        self.next_offset = self._resolve(start)
        self._compacted: Iterator[Delivery] | None = None
        if compactor is not None:
            view = compactor.view()
            if view is not None and self.next_offset < view.horizon_offset:
                self._compacted = (Delivery(m.message_id, m.offset, m.message, m.publish_time_ms, 0,
                                            topic.name.full_name, None, m.encryption)
                                   for m in view.messages_from(self.next_offset))
                self.next_offset = view.horizon_offset

    def _resolve(self, start: StartPosition) -> int:
        ml = self.topic.ml
        if start.kind == "earliest":
            return ml.first_offset
        if start.kind == "latest":
            return ml.confirmed_next_offset()
        if start.kind == "offset":
            return max(ml.first_offset, min(start.offset, ml.confirmed_next_offset()))
        if start.kind == "timestamp":
            return ml.time_to_offset(start.timestamp_ms)
        if start.kind == "message_id" and start.message_id is not None:
            offset = self.topic.offset_of(start.message_id)
            return offset if start.inclusive else offset + 1
        raise InvalidRequest(f"unknown start position {start.kind!r}")

    def has_message_available(self) -> bool:
        return self._peeked is not None or bool(self._buffer) or self._compacted is not None or \
            self.next_offset < self.topic.ml.confirmed_next_offset()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (from any thread) whenever the topic confirms an entry, or the
        reads-in-flight budget admits a read this reader had to put off."""
        self._listeners.append(listener)
        self.topic.ml.add_listener(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
        self.topic.ml.remove_listener(listener)

    def close(self) -> None:
        """Give back the budget the messages read ahead hold (the reader is abandoned)."""
        self._buffer.clear()
        self._peeked = None
        self._release()

    def end_of_topic(self) -> bool:
        """The topic is terminated and this reader has read all of it."""
        return self.topic.ml.terminated and not self.has_message_available()

    def read_next(self) -> Delivery | None:
        """The next message, or None when the reader has caught up."""
        peeked, self._peeked = self._peeked, None
        return peeked if peeked is not None else self._read_one()

    def peek_next(self) -> Delivery | None:
        """The message :meth:`read_next` returns next, without consuming it."""
        if self._peeked is None:
            self._peeked = self._read_one()
        return self._peeked

    def _read_one(self) -> Delivery | None:
        if self._compacted is not None:
            item = next(self._compacted, None)
            if item is not None:
                return item
            self._compacted = None
        if not self._buffer:
            self._fill()
        if not self._buffer:
            return None
        delivery = self._buffer.popleft()
        if not self._buffer:
            self._release()
        return delivery

    def _hold(self, footprint_bytes: int) -> None:
        """The read ``_buffer`` now holds ``footprint_bytes``; the budget is told the change."""
        self._buffered_bytes = footprint_bytes
        self._budget_share.tell(self._budget_share.delta(footprint_bytes))

    def _release(self) -> None:
        self._hold(0)

    def _budget_freed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def _fill(self) -> None:
        """Buffer the next entries' messages. Retention may trim what a reader has not read yet
        (a reader holds no durable cursor): it then goes on from the first message still kept."""
        ml = self.topic.ml
        if self._budget_share.must_wait():  # the listeners are called once it admits
            return
        for _ in range(READER_TRIM_RETRIES_MAX):
            self.next_offset = max(self.next_offset, ml.first_offset)
            if self.next_offset >= ml.confirmed_next_offset():
                return
            try:
                position, _ = ml.offset_to_position(self.next_offset)
                entries = ml.read_entries(position, READ_BATCH_ENTRIES, max_bytes=self._read_bytes_max)
            except MagnetarError:
                if self.next_offset >= ml.first_offset:
                    raise
                continue  # trimmed between the check and the read
            self._buffer_entries(entries)
            return

    def _buffer_entries(self, entries: list[Entry]) -> None:
        """Split the entries read into the messages from ``next_offset`` on (each entry is
        decoded once, as an ``EntryRun`` of those messages)."""
        partition = self.topic.partition
        topic = self.topic.name.full_name
        buffered = self._buffer
        read = 0
        for entry in entries:
            first, end = entry.first_offset, entry.last_offset + 1
            start = max(first, self.next_offset)
            self.next_offset = max(self.next_offset, end)
            if start >= end:
                continue
            position = entry.position
            run = EntryRun(topic, position.ledger_id, position.entry_id, partition, entry.data, first, end - first,
                           range(start, end), 0, entry.publish_time_ms)
            messages = run.messages()
            buffered.extend(messages)
            read += decoded_footprint(len(messages), sum(len(d.message.payload) for d in messages))
        if buffered:
            self._hold(self._buffered_bytes + read)
