"""The key index simulation's model and its second broker (``test_key_index_simulation.py``).

The model is plain Python: per stream (a key of a topic, living in one partition) the list of
acknowledged events (version, payload, offset) in version order; per partition the next offset,
the first offset retention kept, and its DCB events (offset → payload and derived streams). What
a correct key index answers follows from it: a key's version is its last event's, the first kept
version is that of its first event at or after the partition's first offset (the next version
when none is kept), and a conditional append is accepted iff every expected key is where it
expects.

``SharedStack`` lets a second ``BrokerService`` stand in for another broker of a cluster: it
serves every topic over the first one's metadata store and ledgers (the embedded bookie of the
first), as a broker taking over a bundle would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from broker.bookkeeper.ledger_manager import LedgerManager
from broker.entry_format import Message
from broker.key_index.derived import derived_keys
from broker.message_fields import EXISTS, ExpectedVersion
from broker.metadata.store import MetadataStore
from broker.topic import PublishResult
from broker.topic_name import TopicName


@dataclass(frozen=True)
class Event:
    version: int
    payload: bytes
    offset: int


@dataclass
class StreamModel:
    key: str
    topic: TopicName
    """The topic the key is written to and read from (partitioned or not)."""
    partition: TopicName
    """The partition that holds it."""
    events: list[Event] = field(default_factory=list)

    @property
    def version(self) -> int:
        return self.events[-1].version if self.events else -1

    def kept(self, first_offset: int) -> list[Event]:
        return [e for e in self.events if e.offset >= first_offset]

    def first_version(self, first_offset: int) -> int:
        kept = self.kept(first_offset)
        return kept[0].version if kept else self.version + 1


@dataclass
class PartitionModel:
    name: TopicName
    next_offset: int = 0
    first_offset: int = 0
    dcb: dict[int, tuple[bytes, frozenset[bytes]]] = field(default_factory=dict)
    """Each DCB event's offset: its payload and derived streams (its type's and tags')."""

    def dcb_kept(self, offset: int) -> list[tuple[int, bytes, frozenset[bytes]]]:
        """The DCB events at ``offset`` or after that retention kept, in offset order."""
        start = max(offset, self.first_offset)
        return [(o, payload, keys) for o, (payload, keys) in sorted(self.dcb.items()) if o >= start]


def meets(current: int, expected: ExpectedVersion) -> bool:
    return current >= 0 if expected == EXISTS else current == expected


@dataclass
class Append:
    """One entry of messages for one partition, with what it expects of its keys."""

    partition: TopicName
    messages: list[Message]
    expected: dict[str, ExpectedVersion] | None
    accepted: bool
    """What the model says of its expectations (judged when it was submitted)."""
    first_offset: int
    """The offset it gets if it is stored (the partition's next one, counting those before it)."""
    versions: tuple[int | None, ...]
    """The versions it gets if it is stored (empty: no keyed message)."""
    current: dict[str, int]
    """The versions of the expected keys when it is checked (what a mismatch reports)."""
    future: Future[PublishResult] | None = None

    def describe(self) -> str:
        keys = [m.key for m in self.messages]
        return (f"append {self.partition.local_name} keys {keys} expecting {self.expected} at {self.first_offset}"
                f" -> {'versions ' + str(self.versions) if self.accepted else 'mismatch'}")


class World:
    """The model of every stream and partition, and what an append would get."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], StreamModel] = {}
        self.partitions: dict[TopicName, PartitionModel] = {}

    def stream(self, topic: TopicName, key: str) -> StreamModel:
        return self.streams[(topic.full_name, key)]

    def stream_of_partition(self, partition: TopicName, key: str) -> StreamModel:
        found = next((s for s in self.streams.values() if s.partition == partition and s.key == key), None)
        assert found is not None, f"no stream {key!r} in {partition}"
        return found

    def plan(self, partition: TopicName, messages: list[Message], expected: dict[str, ExpectedVersion] | None,
             in_flight: list[Append]) -> Append:
        """What ``messages`` get when appended after ``in_flight`` (accepted ones all stored)."""
        current = {s.key: s.version for s in self.streams.values() if s.partition == partition}
        first_offset = self.partitions[partition].next_offset
        for earlier in in_flight:
            if earlier.partition == partition and earlier.accepted:
                first_offset += len(earlier.messages)
                for message, version in zip(earlier.messages, earlier.versions or (), strict=False):
                    if message.key is not None and version is not None:
                        current[message.key] = version
        checked = {key: current.get(key, -1) for key in expected or {}}
        accepted = all(meets(checked[k], v) for k, v in (expected or {}).items())
        versions: list[int | None] = []
        for message in messages:
            if message.key is None:
                versions.append(None)
            else:
                current[message.key] = current.get(message.key, -1) + 1
                versions.append(current[message.key])
        keyed = any(m.key is not None for m in messages)
        return Append(partition, messages, expected, accepted, first_offset, tuple(versions) if keyed else (), checked)

    def stored(self, append: Append) -> None:
        """``append`` is acknowledged (or recovered after a crash): its events join the model."""
        part = self.partitions[append.partition]
        assert append.first_offset == part.next_offset, f"{append.describe()} stored at {part.next_offset}"
        for index, message in enumerate(append.messages):
            derived = derived_keys(message.properties)
            if derived:
                part.dcb[part.next_offset + index] = (message.payload, derived)
            if message.key is not None:
                stream = self.stream_of_partition(append.partition, message.key)
                version = append.versions[index]
                assert version == stream.version + 1
                stream.events.append(Event(version, message.payload, part.next_offset + index))
        part.next_offset += len(append.messages)

    def keys_of(self, partition: TopicName) -> list[StreamModel]:
        return [s for s in self.streams.values() if s.partition == partition]


class _BorrowedStore:
    """The first broker's metadata store, lent: the second broker's ``close`` leaves it open."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def close(self) -> None:
        """The owner closes it."""


class SharedStack:
    """What ``BrokerService(cluster=...)`` asks of a cluster, answered over another broker's
    metadata store and ledgers: this broker serves every topic, and closes nothing it borrowed."""

    ownership = None

    def __init__(self, store: MetadataStore, ledgers: LedgerManager) -> None:
        self._store = store
        self._ledgers = ledgers

    def open(self, clock: Callable[[], float]) -> tuple[MetadataStore, LedgerManager]:
        return _BorrowedStore(self._store), self._ledgers  # type: ignore[return-value]

    def start_serving(self, unload: object, local_load: object) -> None:
        pass

    def stop_serving(self) -> None:
        pass

    def release_bundles(self) -> None:
        pass

    def close(self) -> None:
        pass

    def check_served_here(self, name: TopicName) -> None:
        pass

    def owns(self, name: TopicName) -> bool:
        return True

    def owner_of(self, name: TopicName) -> str | None:
        return None

    def bookies_available(self) -> int:
        return 1


def by_partition(appends: list[Append]) -> Iterator[tuple[TopicName, list[Append]]]:
    names = sorted({a.partition for a in appends}, key=lambda n: n.full_name)
    for name in names:
        yield name, [a for a in appends if a.partition == name]
