"""Redelivery: what waits to be delivered again, how often each message was, and dead letters.

Role: a subscription (``broker/subscription.py``) puts messages back here: negatively
acknowledged ones wait ``negative_ack_redelivery_delay_ms`` (``later``), as do delayed messages
(``deliverAt``/``deliverAfterMs``) until the injected clock reaches their time; messages whose
ack timeout passed and those a departing or deactivated consumer held go straight to ``due``.
Dispatch takes ``due`` first, oldest offset first, an entry at a time (:meth:`pop_entry`), and
reads the entry again (``broker/dispatch_reads.py``): what waits here is positions
(``EntryRef``), never an entry's bytes.

Each message put back counts one redelivery (``counts``; the messages of one delivered run
share a count, and dispatch cuts a run where counts differ). Counts are persisted with the
cursor state, in its properties (``rc:<offset>``, at most ``REDELIVERY_COUNTS_PERSISTED_MAX``),
so they survive a restart (Pulsar loses them). After the highest ``max_redeliver_count`` of the
subscription's consumers, a message due again goes to the dead-letter topic exactly once (the
first consumer's ``dead_letter_topic`` that names one, else ``{topic}-{subscription}-DLQ``) and
is acknowledged on the source.

Invariants: ``due`` is a heap by offset and ``later`` one by (due ms, offset); counts are
written once per change of many messages (a consumer leaving with many messages does not
rewrite them once per message); ``clear`` drops what waits, never the counts. All of it runs
under the subscription's lock.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence

from broker.consumer import Consumer
from broker.cursor import ManagedCursor
from broker.delivery import Delivery, EntryRun
from broker.limits import DEAD_LETTER_ACK_WAIT_S, REDELIVERY_COUNTS_PERSISTED_MAX
from broker.unacked import EntryRef

REDELIVERY_PROPERTY_PREFIX = "rc:"

DeadLetter = Callable[[str, Delivery, str], None]
"""Publishes a message to a dead-letter topic: (topic, message, subscription name)."""


class Redeliveries:
    def __init__(self, topic_name: str, partition: int, cursor: ManagedCursor,
                 dead_letter: DeadLetter | None) -> None:
        self._topic_name = topic_name
        self._partition = partition
        self._cursor = cursor
        self._dead_letter = dead_letter
        self.due: list[tuple[int, EntryRef]] = []
        """Heap by offset: due for redelivery."""
        self.later: list[tuple[int, int, EntryRef]] = []
        """Heap by (due ms, offset): nacked, or delayed until their delivery time."""
        self.counts: dict[int, int] = self._load_counts()
        """Offset -> times delivered again (absent: never)."""
        self._limits: Counter[int] = Counter()
        """Each consumer's ``max_redeliver_count``: the subscription dead-letters past the highest."""
        self._dead_letter_topics: dict[Consumer, str] = {}
        """The consumers that name a dead-letter topic, in the order they joined."""

    # --- consumers ---------------------------------------------------------------------------
    def joined(self, consumer: Consumer) -> None:
        config = consumer.config
        self._limits[config.max_redeliver_count] += 1
        if config.dead_letter_topic:
            self._dead_letter_topics[consumer] = config.dead_letter_topic

    def left(self, consumer: Consumer) -> None:
        limit = consumer.config.max_redeliver_count
        self._dead_letter_topics.pop(consumer, None)
        self._limits[limit] -= 1
        if not self._limits[limit]:
            del self._limits[limit]

    # --- what waits --------------------------------------------------------------------------
    def put(self, offset: int, held: EntryRef) -> None:
        """``offset`` is due for redelivery now."""
        heapq.heappush(self.due, (offset, held))

    def delay(self, due_ms: int, offset: int, held: EntryRef) -> None:
        """``offset`` is due at ``due_ms``."""
        heapq.heappush(self.later, (due_ms, offset, held))

    def pop_entry(self) -> tuple[EntryRef, list[int]]:
        """(There is one.) The oldest offset due, with every other offset of its entry due."""
        due = self.due
        offset, position = heapq.heappop(due)
        offsets = [offset]
        ledger_id, entry_id = position.ledger_id, position.entry_id
        while due and due[0][1].entry_id == entry_id and due[0][1].ledger_id == ledger_id:
            following = heapq.heappop(due)[0]
            if following != offsets[-1]:
                offsets.append(following)
        return position, offsets

    def release_due(self, now_ms: int, load: Callable[[EntryRef], bytes | None]) -> None:
        """What waits for its time and is due by ``now_ms`` becomes due; what is due and was
        delivered too often goes to the dead-letter topic instead (``load`` reads its entry)."""
        later, due = self.later, self.due
        while later and later[0][0] <= now_ms:
            _, offset, position = heapq.heappop(later)
            if self._dead_lettered(offset, position, load):
                continue
            heapq.heappush(due, (offset, position))
        while due and self._dead_lettered(*due[0], load):
            heapq.heappop(due)

    def clear(self) -> None:
        """Drop what waits (the counts stay)."""
        self.due.clear()
        self.later.clear()

    def delayed_unacked(self) -> int:
        """Messages waiting for their nack delay or delivery time and not acknowledged meanwhile
        (an ack leaves the entry in ``later`` until it is due, and dispatch then skips it)."""
        is_acked = self._cursor.is_acked
        return sum(1 for _, offset, _ in self.later if not is_acked(offset))

    # --- counts ------------------------------------------------------------------------------
    def bump(self, offsets: Sequence[int]) -> None:
        """One more redelivery for each of ``offsets``, persisted once for them all (a consumer
        leaving with many messages must not rewrite the counts once per message)."""
        if not offsets:
            return
        counts = self.counts
        for offset in offsets:
            counts[offset] = counts.get(offset, 0) + 1
        self._persist_counts()

    def _load_counts(self) -> dict[int, int]:
        return {int(k[len(REDELIVERY_PROPERTY_PREFIX):]): v for k, v in self._cursor.properties.items()
                if k.startswith(REDELIVERY_PROPERTY_PREFIX)}

    def _persist_counts(self) -> None:
        cursor = self._cursor
        kept = sorted(self.counts.items())[:REDELIVERY_COUNTS_PERSISTED_MAX]
        props = {k: v for k, v in cursor.properties.items() if not k.startswith(REDELIVERY_PROPERTY_PREFIX)}
        props.update({f"{REDELIVERY_PROPERTY_PREFIX}{offset}": count for offset, count in kept})
        cursor.set_properties(props)

    # --- dead letters ------------------------------------------------------------------------
    def _dead_lettered(self, offset: int, position: EntryRef, load: Callable[[EntryRef], bytes | None]) -> bool:
        """Send an over-redelivered message to its dead-letter topic (once) and ack it."""
        limit = max(self._limits, default=0)
        if limit <= 0 or self._dead_letter is None or self.counts.get(offset, 0) <= limit:
            return False
        data = load(position)
        if data is not None:  # else its entry is gone: nothing to move
            dlq = next(iter(self._dead_letter_topics.values()), None)
            subscription = self._cursor.name
            target = dlq or f"{self._topic_name}-{subscription}-DLQ"
            run = EntryRun(self._topic_name, position.ledger_id, position.entry_id, self._partition, data,
                           position.first_offset, position.batch_size, (offset,), self.counts[offset],
                           position.publish_time_ms)
            self._dead_letter(target, run.messages()[0], subscription)
        self.counts.pop(offset, None)
        self._cursor.ack([offset]).result(timeout=DEAD_LETTER_ACK_WAIT_S)
        return True
