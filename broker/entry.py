"""An entry of a managed ledger as the broker holds it: where it is, its bytes, its offsets.

Role: what a managed ledger's reads give (``managed_ledger_reads.py``) and what its entry cache
keeps (``entry_cache.py``, filled by the add path), so a read served from the cache hands out the
cached tuples themselves, one dictionary lookup an entry.

Invariants: ``data`` is the entry as stored (the broker's metadata prefix, then Pulsar's
``MessageMetadata`` and payload); ``first_offset..last_offset`` are the offsets of its messages
(one, or a batch's); a tuple, never changed once made.
"""

from __future__ import annotations

from typing import NamedTuple

from broker.message_id import Position


class Entry(NamedTuple):
    """An entry read from a managed ledger, with its offsets and publish time (a tuple: one is
    made per entry read)."""

    position: Position
    data: bytes
    first_offset: int
    last_offset: int
    publish_time_ms: int

    @property
    def message_count(self) -> int:
        return self.last_offset - self.first_offset + 1
