"""Key_Shared subscriptions: each key's messages go to one consumer, chosen on a hash ring.

Role: the dispatcher (``broker/dispatcher.py``) of Key_Shared subscriptions, Pulsar's
``PersistentStickyKeyDispatcherMultipleConsumers`` with its consistent-hashing consumer
selector. A message's sticky key (its ordering key, else its key) hashes as Pulsar's does,
``murmur3_32(key) & 0x7fffffff % 65536``; each consumer sits at ``POINTS_PER_CONSUMER`` points of
a ring over that range, and a hash belongs to the consumer at the first point at or after it.
An entry of one key goes to that key's consumer; an entry whose messages have different keys is
split between their consumers (a ``whole_entries`` consumer of its first message takes it
all, as Pulsar routes an entry by its key). Messages without a key spread round-robin, as on
Shared (``broker/dispatch_shared.py``). Routing decodes each entry's messages for their keys.

Per-key order holds while consumers join and leave, by a stronger rule than Pulsar's "recently
joined consumers": a message is never handed to one consumer while an earlier message of its
key is unacknowledged at another; it waits (other keys flow on) until that one is acknowledged
or redelivered.

Invariants: the ring stays sorted by hash (ties in the order consumers joined), and a consumer's
points go in and out of it without rebuilding it; ``key_owner`` holds, for each key hash with
messages unacknowledged, the one consumer holding them and how many (``held_keys`` the key hash
of each such offset).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import mmh3

from broker.consumer import Consumer
from broker.dispatch_reads import WaitingEntry
from broker.dispatch_shared import SharedDispatcher
from broker.dispatcher import Hand
from broker.entry_format import DecodedMessage

KEY_HASH_RANGE = 65536
POINTS_PER_CONSUMER = 100

Deliver = Callable[[Consumer, WaitingEntry, Sequence[int], float], None]
"""The subscription's ``_deliver(consumer, waiting, offsets, now)``: hand ``consumer`` exactly
``offsets`` of ``waiting``."""


def key_hash(key: str | bytes) -> int:
    """Pulsar's sticky-key hash: Murmur3-32 made non-negative, in 0..65535."""
    data = key.encode() if isinstance(key, str) else key
    return (mmh3.hash(data, 0, signed=True) & 0x7FFFFFFF) % KEY_HASH_RANGE


def entry_key_hashes(messages: list[DecodedMessage]) -> int | list[int]:
    """The sticky-key hash of each message of an entry (of its ordering key, else its key; -1 for
    neither), one ``int`` when they are all the same."""
    hashes = [key_hash(key) if (key := m.ordering_key if m.ordering_key is not None else m.key) is not None else -1
              for m in messages]
    first = hashes[0]
    return first if hashes.count(first) == len(hashes) else hashes


def ring_points(consumer: Consumer) -> list[int]:
    """Where a Key_Shared consumer sits on the hash ring (``POINTS_PER_CONSUMER`` points)."""
    return [key_hash(f"{consumer.name}{consumer.id}-{point}") for point in range(POINTS_PER_CONSUMER)]


def _ring_hash(pair: tuple[int, Consumer]) -> int:
    return pair[0]


class KeySharedDispatcher(SharedDispatcher):
    def __init__(self, with_permits: dict[Consumer, None], hand: Hand, deliver: Deliver,
                 room: Callable[[], int]) -> None:
        """``deliver``: hand a consumer exactly the offsets given; ``room``: the messages the
        subscription's unacknowledged limit lets through now (at least one)."""
        super().__init__(with_permits, hand)
        self._deliver = deliver
        self._room = room
        self.ring: list[tuple[int, Consumer]] = []
        """(point, consumer), sorted by point."""
        self._key_owner: dict[int, tuple[Consumer, int]] = {}
        """Key hash -> (the consumer holding its messages unacknowledged, how many)."""
        self._held_keys: dict[int, int] = {}
        """Offset held unacknowledged -> its key hash."""

    # --- the ring ----------------------------------------------------------------------------
    def joined(self, consumer: Consumer) -> Consumer | None:
        """Put ``consumer``'s points on the hash ring (after the points of equal hash already
        there: the ring stays sorted by hash, ties in the order consumers joined)."""
        for point in ring_points(consumer):
            bisect.insort_right(self.ring, (point, consumer), key=_ring_hash)
        return None

    def left(self, consumer: Consumer) -> None:
        ring = self.ring
        for point in ring_points(consumer):
            index = bisect.bisect_left(ring, point, key=_ring_hash)
            while ring[index][1] is not consumer:
                index += 1
            del ring[index]

    def _choose_by_hash(self, hashed: int) -> Consumer | None:
        """The consumer of a message with key hash ``hashed``, if it can take it now."""
        if not self.ring:
            return None
        if hashed < 0:  # keyless messages spread like Shared
            return self.next_in_turn()
        owner = self._key_owner.get(hashed)
        target = self.ring[bisect.bisect_left(self.ring, hashed, key=_ring_hash) % len(self.ring)][1]
        if owner is not None and owner[0] is not target:
            return None  # an earlier message of this key is still unacked elsewhere: keep order
        return target if target._can_take() else None

    # --- dispatch ----------------------------------------------------------------------------
    def dispatch(self, waiting: WaitingEntry, offsets: Sequence[int], now: float,
                 notify: dict[Consumer, None]) -> WaitingEntry | None:
        """An entry of one key goes to that key's consumer; one of several keys is split between
        theirs (a ``whole_entries`` consumer of its first message takes it all, as Pulsar routes
        an entry by its key). What cannot go now is returned, to wait."""
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

    # --- key ownership -----------------------------------------------------------------------
    def hold(self, consumer: Consumer, waiting: WaitingEntry, offsets: Sequence[int]) -> None:
        """``consumer`` now holds these messages' keys (their order waits on it)."""
        hashes, first = waiting.hashes, waiting.position.first_offset
        key_owner, held_keys = self._key_owner, self._held_keys
        for offset in offsets:
            hashed = hashes if isinstance(hashes, int) else -1 if hashes is None else hashes[offset - first]
            if hashed >= 0:
                holder = key_owner.get(hashed)
                key_owner[hashed] = (consumer, (holder[1] if holder else 0) + 1)
                held_keys[offset] = hashed

    def release(self, offset: int) -> None:
        """``offset`` is no longer held (acked, nacked, timed out or taken back)."""
        hashed = self._held_keys.pop(offset, None) if self._held_keys else None
        if hashed is None:
            return
        holder = self._key_owner.get(hashed)
        if holder is not None:
            if holder[1] <= 1:
                del self._key_owner[hashed]
            else:
                self._key_owner[hashed] = (holder[0], holder[1] - 1)
