"""The broker simulation's model and the stack it drives (``test_broker_simulation.py``).

The model is plain Python: per topic the payload of every acknowledged publish by offset and
the entry boundaries (``TopicModel``); per cursor the set of acknowledged offsets (mark-delete
offset plus the offsets above it), the read offset, and the states whose persistence is not yet
confirmed (``CursorModel``). The stack is the real one: ``LedgerStorage`` with
``StorageConfig.test_min()`` over a ``FaultyFileIO``, ``RocksDBMetadataStore``,
``LedgerManager``, ``ManagedLedgerFactory`` with ``ManagedLedgerConfig.test_min()`` and a
``CursorManager`` per topic (``BrokerStack``).
"""

from __future__ import annotations

import bisect
import contextlib
import random
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from broker.bookkeeper.bookie import BookieClient, LocalBookie
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.cursor import CursorManager, ManagedCursor
from broker.entry_cache import EntryCache
from broker.entry_format import Message, encode_entry
from broker.errors import MagnetarError
from broker.managed_ledger import ManagedLedger
from broker.managed_ledger_adds import AddResult
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.managed_ledger_factory import ManagedLedgerFactory
from broker.metadata import RocksDBMetadataStore
from storage import LedgerStorage, StorageConfig
from storage.fileio import FaultyFileIO
from tests.unit.broker_stack import FakeClock

STORAGE_CONFIG = StorageConfig.test_min()
ML_CONFIG = ManagedLedgerConfig.test_min()
RESULT_TIMEOUT_S = 30.0

CursorState = tuple[int, tuple[tuple[int, int], ...]]
"""(mark-delete offset, acknowledged ranges above it): what a cursor persists."""


# --- the model ----------------------------------------------------------------------------


def to_ranges(offsets: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged half-open ranges of a set of integers."""
    ranges: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if ranges and ranges[-1][1] == offset:
            ranges[-1] = (ranges[-1][0], offset + 1)
        else:
            ranges.append((offset, offset + 1))
    return tuple(ranges)


@dataclass
class CursorModel:
    """One durable cursor: every offset below ``md`` and every offset in ``above`` is acked."""

    name: str
    md: int
    above: set[int] = field(default_factory=set)
    read_offset: int = 0
    delivered: set[int] = field(default_factory=set)
    """Delivered and still unacknowledged: what a consumer would ack next."""
    confirmed: CursorState = (0, ())
    """The newest state known persisted (its ack Future resolved, or it was restored)."""
    unconfirmed: list[tuple[Future[None], CursorState]] = field(default_factory=list)

    @classmethod
    def at(cls, name: str, md: int) -> CursorModel:
        return cls(name, md, read_offset=md, confirmed=(md, ()))

    def is_acked(self, offset: int) -> bool:
        return offset < self.md or offset in self.above

    def state(self) -> CursorState:
        return self.md, to_ranges(self.above)

    def _normalize(self) -> None:
        self.above = {o for o in self.above if o >= self.md}
        while self.md in self.above:
            self.above.remove(self.md)
            self.md += 1
        self.read_offset = max(self.read_offset, self.md)
        self.delivered = {o for o in self.delivered if not self.is_acked(o)}

    def ack(self, offsets: Iterable[int]) -> None:
        self.above.update(o for o in offsets if o >= self.md)
        self._normalize()

    def ack_cumulative(self, offset: int) -> None:
        self.md = max(self.md, offset + 1)
        self._normalize()

    def skip(self, messages: int, next_offset: int) -> None:
        offset = self.md
        while messages > 0 and offset < next_offset:
            if not self.is_acked(offset):
                self.above.add(offset)
                messages -= 1
            offset += 1
        self._normalize()

    def reset(self, offset: int) -> None:
        self.md, self.read_offset = offset, offset
        self.above.clear()
        self._normalize()

    def restored(self, state: CursorState) -> None:
        """Adopt a state read back after a restart; the consumer reconnects from scratch."""
        self.md = state[0]
        self.above = {o for start, end in state[1] for o in range(start, end)}
        self.read_offset = self.md
        self.delivered.clear()
        self.confirmed, self.unconfirmed = state, []

    def track(self, future: Future[None]) -> None:
        self.unconfirmed.append((future, self.state()))

    def absorb_resolved(self, *, healthy: bool) -> None:
        """Move the newest resolved state into ``confirmed``. Futures resolve in order; on a
        healthy stack none may fail."""
        last_ok = -1
        for index, (future, _) in enumerate(self.unconfirmed):
            if not future.done():
                break
            error = future.exception()
            if error is None:
                last_ok = index
            elif healthy:
                raise AssertionError(f"cursor {self.name}: an ack failed on a healthy stack: {error!r}")
        if last_ok >= 0:
            self.confirmed = self.unconfirmed[last_ok][1]
            del self.unconfirmed[: last_ok + 1]

    def candidates(self) -> list[CursorState]:
        """States a crash may leave: the confirmed one or any later one."""
        return [self.confirmed, *(state for _, state in self.unconfirmed)]

    def backlog(self, first_offset: int, next_offset: int) -> int:
        start = max(self.md, first_offset)
        return max(0, next_offset - start - sum(1 for o in self.above if start <= o < next_offset))


@dataclass
class TopicModel:
    name: str
    payloads: list[bytes] = field(default_factory=list)
    """Offset -> payload of every acknowledged publish (trimmed ones included)."""
    entries: list[tuple[int, int]] = field(default_factory=list)
    """(first offset, last offset) of every entry, in order."""
    first_offset: int = 0
    cursors: dict[str, CursorModel] = field(default_factory=dict)
    sequence_id: int = 0

    @property
    def next_offset(self) -> int:
        return len(self.payloads)

    def append(self, payloads: list[bytes]) -> None:
        first = self.next_offset
        self.payloads.extend(payloads)
        self.entries.append((first, self.next_offset - 1))

    def entry_index(self, offset: int) -> int:
        return bisect.bisect_right([first for first, _ in self.entries], offset) - 1

    def entry_is_consumed(self, cursor: CursorModel, index: int) -> bool:
        first, last = self.entries[index]
        return all(cursor.is_acked(o) for o in range(first, last + 1))

    def expected_delivery(self, cursor: CursorModel, max_entries: int) -> tuple[list[int], int]:
        """Indexes of the entries ``read_entries(max_entries)`` delivers, and the new read offset."""
        if cursor.read_offset >= self.next_offset:
            return [], cursor.read_offset
        assert cursor.read_offset >= self.first_offset, f"{cursor.name} reads below the first offset"
        index = self.entry_index(cursor.read_offset)
        delivered: list[int] = []
        while index < len(self.entries) and len(delivered) < max_entries:
            if not self.entry_is_consumed(cursor, index):
                delivered.append(index)
            index += 1
        return delivered, max(cursor.read_offset, self.entries[index - 1][1] + 1)


@dataclass
class InFlightPublish:
    topic: str
    payloads: list[bytes]
    first_offset: int
    future: Future[list[AddResult]]


# --- the stack ----------------------------------------------------------------------------


@dataclass
class BrokerStack:
    fio: FaultyFileIO
    storage: LedgerStorage
    store: RocksDBMetadataStore
    ledgers: LedgerManager
    factory: ManagedLedgerFactory
    topics: dict[str, tuple[ManagedLedger, CursorManager]] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str, clock: FakeClock, fio_seed: int, topic_names: Iterable[str]) -> BrokerStack:
        fio = FaultyFileIO(fio_seed)
        storage = LedgerStorage.open(f"{path}/bookie", STORAGE_CONFIG, fileio=fio)
        store = RocksDBMetadataStore(f"{path}/metadata", clock=clock)
        ledgers = LedgerManager(store, BookieClient([LocalBookie("local", storage)]), clock)
        factory = ManagedLedgerFactory(store, ledgers, EntryCache(1 << 20, clock=clock), clock)
        stack = cls(fio, storage, store, ledgers, factory)
        for name in topic_names:
            ml = factory.open(name, ML_CONFIG)
            stack.topics[name] = (ml, CursorManager(ml, ledgers, store))
        return stack

    def ml(self, topic: str) -> ManagedLedger:
        return self.topics[topic][0]

    def cursor(self, topic: str, name: str) -> ManagedCursor:
        cursor = self.topics[topic][1].get(name)
        assert cursor is not None, f"cursor {name} of {topic} is missing"
        return cursor

    def close_cleanly(self) -> None:
        for _, cursors in self.topics.values():
            cursors.close()
        self.factory.close_all()
        self.store.close()
        self.storage.close()

    def close_after_crash(self) -> None:
        """What a dead process leaves: nothing on the broker side is closed or flushed."""
        self.storage.close()
        self.store.close()


def random_payload(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.05:
        return b""
    if roll < 0.85:
        return rng.randbytes(rng.randint(1, 64))
    return rng.randbytes(rng.randint(65, 3000))


def encode(payloads: list[bytes], sequence_id: int, publish_time_ms: int) -> bytes:
    return encode_entry([Message(payload=p) for p in payloads], producer_name="sim", sequence_id=sequence_id,
                        publish_time_ms=publish_time_ms)


def settle_quietly(futures: Iterable[Future[list[AddResult]] | Future[None]]) -> None:
    """Wait for futures that may legitimately fail (a crash is under way)."""
    for future in futures:
        with contextlib.suppress(MagnetarError):
            future.result(timeout=RESULT_TIMEOUT_S)
