"""What consumers hold unacknowledged, kept as positions of entries without their bytes.

Role: a subscription's dispatch (``broker/subscription.py``) records each run it hands a
consumer in the consumer's ``UnackedMessages``: offset -> the ``EntryRef`` of the run's entry,
one record shared by the run's offsets. Acknowledgements, negative acknowledgements, ack
timeouts and departures take offsets out again. An ``EntryRef`` is also what waits for
redelivery or for its delay (``broker/redelivery.py``): the entry is read again from the
managed ledger when its messages are delivered again, so a consumer that never acknowledges
pins no entries.

Invariants: ``UnackedMessages.bytes`` is the sum of ``EntryRef.size`` over the offsets held, so
it goes back to exactly zero; the ``UnackedTally`` a subscription's consumers share counts the
offsets they hold together, so the subscription's limit costs one read, not a sum. Neither
locks: the subscription's lock guards both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any, NamedTuple


class EntryRef(NamedTuple):
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


def pop_each(held: dict[int, Any], offsets: Sequence[int]) -> None:
    """``held.pop(offset, None)`` for each offset, the loop run by the interpreter's C code."""
    deque(map(held.pop, offsets, repeat(None)), maxlen=0)


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
        self._by_offset: dict[int, EntryRef] = {}
        self.bytes = 0
        self._tally = tally or UnackedTally()

    def add_run(self, offsets: Sequence[int], held: EntryRef) -> None:
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

    def pop_all(self, offsets: list[int]) -> list[EntryRef | None]:
        """``pop`` each of ``offsets``: what was held of each (None: nothing), in order."""
        popped = list(map(self._by_offset.pop, offsets, repeat(None)))
        held = [h for h in popped if h is not None]
        self.bytes -= sum(h.size for h in held)
        self._tally.messages -= len(held)
        return popped

    def pop(self, offset: int) -> EntryRef | None:
        held = self._by_offset.pop(offset, None)
        if held is not None:
            self.bytes -= held.size
            self._tally.messages -= 1
        return held

    def clear(self) -> None:
        self._tally.messages -= len(self._by_offset)
        self._by_offset.clear()
        self.bytes = 0

    def get(self, offset: int) -> EntryRef | None:
        return self._by_offset.get(offset)

    def items(self) -> Iterable[tuple[int, EntryRef]]:
        return self._by_offset.items()

    def __contains__(self, offset: object) -> bool:
        return offset in self._by_offset

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_offset)

    def __len__(self) -> int:
        return len(self._by_offset)
