"""Range reads: the messages of one topic partition from an offset on, as Arrow columns.

Role: the read side of batch and stream processors (the Spark source above all): a client asks
for the messages of one partition from an offset and gets them in offset order as one Arrow
record batch whose columns are the Spark source's (``broker/entry_format/columns.py``), plus the
next offset to ask for and the first offset retention kept. The entries come from the managed
ledger through the ledger's range read, in steps no larger than the read can use (at most
``max_messages`` entries and ``max_bytes`` bytes, and ``READ_STEP_ENTRIES_MAX`` /
``READ_STEP_BYTES``).

Invariants: a read never changes anything (no cursor, no topic creation). Offsets are gap-free,
so the ``offset`` column is ``N, N+1, ...`` (an encrypted entry's rows too: ``encrypted`` and
``carried`` say which hold its ciphertext and which it carries). Asking below the first retained offset is
``DataLost`` (410, naming the first available offset); asking at or beyond the end is an empty
result; a partition of a partitioned topic that nobody wrote to reads as empty.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass, field

import pyarrow as pa

from broker.entry import Entry
from broker.entry_format import EncryptionContext
from broker.entry_format.columns import NATIVE_COLUMNS, collect_entries, new_columns
from broker.errors import DataLost, NoSuchEntry, NoSuchLedger
from broker.limits import READ_STEP_BYTES, READ_STEP_ENTRIES_MAX
from broker.topic import PersistentTopic
from broker.topic_name import TopicName


@dataclass(frozen=True)
class RangeRead:
    batch: pa.RecordBatch
    next_offset: int
    first_offset: int
    """The first offset retention kept."""
    encrypted: Mapping[int, EncryptionContext] = field(default_factory=dict)
    """The rows holding an encrypted entry's payload, by offset (``columns.py``)."""
    carried: Set[int] = frozenset()
    """The offsets of the rows such an entry's first message carries."""


def read_range(topic: PersistentTopic | None, name: TopicName, offset: int, max_messages: int, max_bytes: int, *,
               message_overhead_bytes: int = 0, native: bool = NATIVE_COLUMNS) -> RangeRead:
    """Up to ``max_messages`` messages of ``topic`` (None: a partition never written) from
    ``offset`` on, stopping once their payloads plus ``message_overhead_bytes`` each reach
    ``max_bytes`` (at least one message when any exists)."""
    partition = name.partition_index
    if topic is None:
        columns = new_columns(offset, native=False)
        return RangeRead(columns.record_batch(name.full_name, partition), offset, 0)
    ml = topic.ml
    if offset < ml.first_offset:
        raise _data_lost(topic, offset)
    entries = _entries(topic, offset, max_messages, max_bytes)
    columns = collect_entries(entries, offset, partition, max_messages, max_bytes,
                              message_overhead_bytes=message_overhead_bytes, native=native)
    return RangeRead(columns.record_batch(name.full_name, partition), columns.first_offset + len(columns),
                     ml.first_offset, columns.encrypted, columns.carried)


def _entries(topic: PersistentTopic, offset: int, max_messages: int, max_bytes: int) -> Iterator[Entry]:
    """Every confirmed entry from the one holding ``offset`` on, read in steps of at most
    ``max_messages`` entries (an entry holds at least one message) and ``max_bytes`` bytes (a
    compressed entry may hold more payload than that: the next step is then never read), so a
    read of N messages stored one an entry reads N entries, not a whole step; a trim racing
    the read is reported as the data loss it is."""
    step_entries = max(1, min(READ_STEP_ENTRIES_MAX, max_messages))
    step_bytes = max(1, min(READ_STEP_BYTES, max_bytes))
    return itertools.chain.from_iterable(_steps(topic, offset, step_entries, step_bytes))


def _steps(topic: PersistentTopic, offset: int, step_entries: int, step_bytes: int) -> Iterator[list[Entry]]:
    try:
        yield from topic.entry_steps(offset, step_entries=step_entries, step_bytes=step_bytes)
    except (NoSuchEntry, NoSuchLedger) as exc:
        if offset < topic.ml.first_offset:
            raise _data_lost(topic, offset) from exc
        raise


def _data_lost(topic: PersistentTopic, offset: int) -> DataLost:
    return DataLost(f"offset {offset} of {topic.name} was removed by retention; "
                    f"the first available offset is {topic.ml.first_offset}")
