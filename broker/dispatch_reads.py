"""What a subscription's dispatcher reads: entries ahead of its consumers, and entries again.

Role: dispatch (``broker/subscription.py``) takes the next entry to hand out from here: an
entry read again for redelivery (:meth:`DispatchReads.again`, its messages having waited as
positions in ``broker/redelivery.py``), else the oldest entry read ahead (``pending``), reading
more through the cursor when none is (:meth:`DispatchReads.read_more`). Per entry, only what
routing needs is decoded: nothing on Exclusive and Failover subscriptions, an entry's delivery
time (from its metadata) on Shared ones, and on Key_Shared ones also each message's key hash
(:meth:`DispatchReads.route_by`). An entry not yet due waits as positions, with the delayed
messages. A read-compacted subscription (``compacted``) below the compaction horizon reads the
topic's compacted view instead, each message with its original id and offset (a batch's as
its original entry with an ack set); past the view the cursor moves to the horizon and the
topic's entries follow.

A read takes as many entries as the consumers' permits need, at the topic's average entry size
in messages, at most ``READ_BATCH_ENTRIES`` and ``read_bytes_max`` of entry bytes, and no more
than the outboxes of the consumers that can take have room for: the dispatcher reads at most
one entry beyond what it can send, and always one entry, however large.

Invariants: ``pending_bytes`` is the footprint (``broker/delivery.py``) of what was read or read
again and not yet delivered, zero once ``pending`` is empty at the end of a round; an entry is
read again at most once a round however its messages come back; what of an entry cannot go
now waits where it came from (:meth:`DispatchReads.put_back`: at the head of what was read
ahead, or with the redeliveries), so a later message never overtakes an earlier one. All of it
runs under the subscription's lock.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence

from broker.compaction import CompactedEntry, CompactedView, compacted_entries
from broker.consumer import Consumer
from broker.cursor import ManagedCursor
from broker.delivery import footprint
from broker.entry_format import DecodedMessage, decode_messages, delivery_time, message_count
from broker.errors import MagnetarError, NoSuchEntry, NotFound
from broker.limits import PENDING_MESSAGES_MAX, READ_BATCH_ENTRIES
from broker.message_id import Position
from broker.redelivery import Redeliveries
from broker.unacked import EntryRef

KeyHashes = int | list[int] | None
"""Key_Shared: the key hash of every message of an entry (an ``int``), or of each by batch
index (a list); None on the other types."""
KeyHasher = Callable[[list[DecodedMessage]], int | list[int]]
"""The key hashes of an entry's messages (``broker/dispatch_key_shared.py``)."""

_new_ref = tuple.__new__
"""``EntryRef(...)`` without the named tuple's Python-level ``__new__``: one is built per entry read."""


class WaitingEntry:
    """An entry read (or read again) for dispatch, with the offsets of it still to deliver."""

    __slots__ = ("data", "hashes", "offsets", "position", "redelivery")

    def __init__(self, position: EntryRef, data: bytes, offsets: Sequence[int], hashes: KeyHashes,
                 redelivery: bool) -> None:
        self.position = position
        self.data = data
        self.offsets = offsets
        """Ascending; a ``range`` while it is the whole entry."""
        self.hashes = hashes
        self.redelivery = redelivery
        """Read again for redelivery: what is left of it goes back to wait for redelivery."""


class DispatchReads:
    def __init__(self, cursor: ManagedCursor, redelivery: Redeliveries, read_bytes_max: int,
                 clock: Callable[[], float]) -> None:
        self._cursor = cursor
        self._redelivery = redelivery
        self._read_bytes_max = read_bytes_max
        self._clock = clock
        self.pending: deque[WaitingEntry] = deque()
        """Entries read ahead, oldest first."""
        self.pending_bytes = 0
        """Footprint of what was read or read again and not yet delivered (``pending``, and a
        redelivery being delivered); zero once ``pending`` is empty at the end of a round."""
        self._loaded: tuple[tuple[int, int], bytes] | None = None
        """The entry last read again for a redelivery (its position and bytes), kept for the
        round, so an entry is read once however its messages come back."""
        self._delayable = False
        self._key_hashes: KeyHasher | None = None
        self.compacted: Callable[[], CompactedView | None] | None = None
        """A read-compacted subscription's compacted view (the topic's latest, asked each read)."""

    def route_by(self, *, delayable: bool, key_hashes: KeyHasher | None) -> None:
        """What routing needs decoded: delivery times (``delayable``: Shared and Key_Shared) and
        the messages' key hashes (Key_Shared's ``key_hashes``)."""
        self._delayable = delayable
        self._key_hashes = key_hashes

    def again(self, position: EntryRef, offsets: list[int]) -> WaitingEntry | None:
        """The entry at ``position`` read again to redeliver ``offsets`` (with what of it waits
        read ahead: a message waiting in both goes once); None when it is gone."""
        pending = self.pending
        if pending and pending[0].position.entry_id == position.entry_id \
                and pending[0].position.ledger_id == position.ledger_id:
            offsets = sorted({*offsets, *pending.popleft().offsets})
        data = self.load(position, offsets)
        if data is None:
            return None
        self.pending_bytes += footprint(1, len(offsets), position.size * len(offsets))
        key_hashes = self._key_hashes
        hashes = key_hashes(decode_messages(data)[0]) if key_hashes is not None else None
        return WaitingEntry(position, data, offsets, hashes, True)

    def load(self, position: EntryRef, offsets: Sequence[int] = ()) -> bytes | None:
        """Read the entry at ``position`` again (its messages were held as positions): None when
        it is gone (trimmed, its ledger deleted), so there is nothing to deliver. Any other
        failure puts ``offsets`` back for redelivery and propagates."""
        key = (position.ledger_id, position.entry_id)
        loaded = self._loaded
        if loaded is not None and loaded[0] == key:
            return loaded[1]
        try:
            entry = self._cursor.ml.read_entry(Position(position.ledger_id, position.entry_id))
        except (NoSuchEntry, NotFound):
            return None
        except MagnetarError:
            for offset in offsets:
                self._redelivery.put(offset, position)
            raise
        self._loaded = (key, entry.data)
        return entry.data

    def put_back(self, waiting: WaitingEntry, offsets: Sequence[int]) -> None:
        """What is left of an entry waits again where it came from: at the head of what was
        read, or (read again for redelivery) with the redeliveries, as positions."""
        if waiting.redelivery:
            position = waiting.position
            due = self._redelivery.due
            for offset in offsets:
                heapq.heappush(due, (offset, position))
        else:
            waiting.offsets = offsets
            self.pending.appendleft(waiting)

    def end_round(self) -> None:
        """A dispatch round ended: the entry read again is not kept for the next."""
        self._loaded = None
        if not self.pending:
            self.pending_bytes = 0

    def clear(self) -> None:
        """Nothing stays read ahead."""
        self.pending.clear()
        self.pending_bytes = 0

    def _read_size(self, with_permits: dict[Consumer, None], permits_total: int) -> tuple[int, int]:
        """(entries, entry bytes) for the next read: enough entries for the permits consumers
        have left, at the topic's average entry size in messages, and no more bytes than
        ``read_bytes_max`` nor than the outboxes of the consumers that can take have room for:
        the dispatcher reads at most one entry beyond what it can send. The room is summed over
        the consumers with permits only until it covers a whole read, so a read costs the same
        however many consumers there are."""
        read_bytes_max = self._read_bytes_max
        room = 0
        for consumer in with_permits:
            room += max(consumer._outbox_bytes_max - consumer.outbox_bytes, 0)
            if room >= read_bytes_max:
                break
        wanted = min(PENDING_MESSAGES_MAX, permits_total)
        entries = max(1, min(READ_BATCH_ENTRIES, wanted // self._cursor.ml.messages_per_entry()))
        return entries, max(1, min(read_bytes_max, room))

    def read_more(self, with_permits: dict[Consumer, None], permits_total: int) -> None:
        """Read the next entries for dispatch, sized for ``with_permits`` (the open consumers
        with permits, ``permits_total`` of them together). Per entry, only what routing needs
        is decoded; an entry not yet due waits as positions. A read-compacted subscription
        below the compaction horizon reads the compacted view instead (``_read_compacted``)."""
        if self.compacted is not None and self._read_compacted(self.compacted(), with_permits, permits_total):
            return
        cursor = self._cursor
        pending, later = self.pending, self._redelivery.later
        delayable, key_hashes = self._delayable, self._key_hashes
        now_ms = int(self._clock() * 1000)
        read_bytes = 0
        for entry in cursor.read_entries(*self._read_size(with_permits, permits_total)):
            first, end = entry.first_offset, entry.last_offset + 1
            offsets: Sequence[int] = range(first, end)
            if first < cursor.mark_delete_offset or (len(cursor.acked) and cursor.acked.count_in(first, end)):
                offsets = [o for o in offsets if not cursor.is_acked(o)]
            data = entry.data
            count = end - first
            position = _new_ref(EntryRef, (entry.position.ledger_id, entry.position.entry_id, first, count,
                                           entry.publish_time_ms, len(data) // count))
            hashes = None
            if delayable:
                if key_hashes is not None:
                    messages, due = decode_messages(data)
                    hashes = key_hashes(messages)
                else:
                    due = delivery_time(data)
                if due is not None and due > now_ms:  # held as positions until due, then read again
                    for offset in offsets:
                        heapq.heappush(later, (due, offset, position))
                    continue
            pending.append(WaitingEntry(position, data, offsets, hashes, False))
            read_bytes += footprint(1, len(offsets), position.size * len(offsets))
        self.pending_bytes += read_bytes

    def _read_compacted(self, view: CompactedView | None, with_permits: dict[Consumer, None],
                        permits_total: int) -> bool:
        """Read the compacted view's next messages while the cursor is below the view's
        horizon; past the last of them the cursor moves to the horizon, where the topic's own
        entries follow. False when there is no view below the cursor (the topic is read as
        usual). Each message goes with the id it had in the topic (``_compacted_entry``)."""
        cursor = self._cursor
        if view is None or cursor.read_offset >= view.horizon_offset:
            return False
        count, _ = self._read_size(with_permits, permits_total)
        read_bytes = 0
        next_offset = view.horizon_offset
        for entry in compacted_entries(view, cursor.read_offset):
            if count <= 0 or read_bytes >= self._read_bytes_max:
                next_offset = entry.offset
                break
            count -= 1
            if cursor.is_acked(entry.offset):
                continue
            waiting = self._compacted_entry(entry)
            last = self.pending[-1] if self.pending else None
            if last is not None and last.position[:3] == waiting.position[:3] and waiting.position.batch_size > 1:
                last.offsets = [*last.offsets, entry.offset]  # the same batch: one MESSAGE, its ack set
            else:
                self.pending.append(waiting)
            read_bytes += footprint(1, 1, waiting.position.size)
        cursor.seek(next_offset)
        self.pending_bytes += read_bytes
        return True

    def _compacted_entry(self, entry: CompactedEntry) -> WaitingEntry:
        """A compacted message to deliver: a message of a batch as its original entry with only
        it to deliver (the client numbers it by its batch index and skips the rest by the ack
        set), else (a lone message, a batch trimmed from the topic since, or an encrypted batch,
        which compaction keeps whole) the compacted entry itself."""
        if entry.batch_index >= 0:
            try:
                original = self._cursor.ml.read_entry(Position(entry.ledger_id, entry.entry_id))
            except (NoSuchEntry, NotFound):
                original = None
            if original is not None and original.last_offset > original.first_offset:
                first, count = original.first_offset, original.last_offset + 1 - original.first_offset
                position = _new_ref(EntryRef, (entry.ledger_id, entry.entry_id, first, count,
                                               original.publish_time_ms, len(original.data) // count))
                return WaitingEntry(position, original.data, [entry.offset], None, False)
        count = message_count(entry.data)  # 1, or an encrypted batch kept whole (compaction.py): all of it
        first = entry.offset - count + 1
        position = _new_ref(EntryRef, (entry.ledger_id, entry.entry_id, first, count, entry.publish_time_ms,
                                       len(entry.data) // count))
        return WaitingEntry(position, entry.data, range(first, entry.offset + 1), None, False)
