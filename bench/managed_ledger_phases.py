"""The managed-ledger benchmark's measurements: the stack, the entries, and each phase.

Role: ``managed_ledger_bench.py`` runs these and reports them against its anchors. Here are the
real broker stack as the standalone broker assembles it (``Stack``), the entries published
(1000 x 100 B messages in Pulsar's batch format, encoded each time or taken from a pool), and
one measuring function per phase with its result type: the interpreter's in-memory ceiling,
pipelined publishing, the cold catch-up read (dispatching entries as they are, or decoding
them) and the tail read behind a publisher.

Invariants: every phase is bounded by its ``Plan``'s duration and message count; a publish
keeps at most ``publish_window_entries`` entries outstanding.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import MB, MiB, drop_page_cache, process_io_bytes, run_threads

from broker.bookkeeper.bookie import BookieClient, LocalBookie
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.cursor import CursorManager, ManagedCursor
from broker.entry import Entry
from broker.entry_cache import EntryCache, EntryCacheStats
from broker.entry_format import DecodedMessage, Message, decode_entry, encode_entry
from broker.managed_ledger import ManagedLedger
from broker.managed_ledger_adds import AddResult
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.managed_ledger_factory import ManagedLedgerFactory
from broker.metadata import RocksDBMetadataStore
from storage import LedgerStorage, StorageConfig, StorageStats

MESSAGE_BYTES = 100
MESSAGES_PER_ENTRY = 1000
READ_BATCH_ENTRIES = 100
ENTRY_CACHE_BYTES = 256 * MiB
PRE_ENCODED_POOL_ENTRIES = 16
ACK_TIMEOUT_S = 60.0
TAIL_WAIT_S = 0.01
PRODUCER_NAME = "bench-producer"
TOPIC = "public/default/bench"
TAIL_TOPIC = "public/default/bench-tail"


@dataclass(frozen=True)
class Plan:
    """The bounds of one run."""

    baseline_duration_s: float
    publish_window_entries: int
    encoding_publish_duration_s: float
    encoding_publish_messages_max: int
    pre_encoded_publish_duration_s: float
    pre_encoded_publish_messages_max: int
    decode_read_duration_s: float
    tail_duration_s: float


# --- the stack ------------------------------------------------------------------------------


@dataclass
class Stack:
    """The real broker stack over one data directory, as the standalone broker assembles it."""

    storage: LedgerStorage
    store: RocksDBMetadataStore
    ledgers: LedgerManager
    cache: EntryCache
    factory: ManagedLedgerFactory

    def open(self, name: str) -> tuple[ManagedLedger, CursorManager]:
        ml = self.factory.open(name, ManagedLedgerConfig())
        return ml, CursorManager(ml, self.ledgers, self.store)

    def close(self) -> None:
        self.factory.close_all()
        self.store.close()
        self.storage.close()


def open_stack(data_dir: Path) -> Stack:
    storage = LedgerStorage.open(str(data_dir / "bookie"), StorageConfig.production())
    store = RocksDBMetadataStore(str(data_dir / "metadata"))
    ledgers = LedgerManager(store, BookieClient([LocalBookie("local", storage)]))
    cache = EntryCache(ENTRY_CACHE_BYTES)
    return Stack(storage, store, ledgers, cache, ManagedLedgerFactory(store, ledgers, cache))


@contextmanager
def stack_at(data_dir: Path) -> Iterator[Stack]:
    stack = open_stack(data_dir)
    try:
        yield stack
    finally:
        stack.close()


# --- messages and entries ---------------------------------------------------------------------


def batch_messages() -> list[Message]:
    """One entry's worth of distinct random 100 B messages (no key, no properties)."""
    source = os.urandom(MESSAGE_BYTES * MESSAGES_PER_ENTRY)
    return [Message(payload=source[i * MESSAGE_BYTES:(i + 1) * MESSAGE_BYTES]) for i in range(MESSAGES_PER_ENTRY)]


def encode(messages: list[Message], sequence_id: int) -> bytes:
    return encode_entry(messages, producer_name=PRODUCER_NAME, sequence_id=sequence_id,
                        publish_time_ms=int(time.time() * 1000))


def pre_encoded_pool() -> list[bytes]:
    return [encode(batch_messages(), i * MESSAGES_PER_ENTRY) for i in range(PRE_ENCODED_POOL_ENTRIES)]


# --- in-memory ceiling ------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryResult:
    messages: int
    build_duration_s: float
    iterate_duration_s: float

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.iterate_duration_s


def build_message_list(messages: int) -> list[bytes]:
    """``messages`` distinct 100 B byte strings (slices of one random buffer)."""
    source = os.urandom(1 * MiB)
    span = len(source) - MESSAGE_BYTES
    return [source[(i * MESSAGE_BYTES) % span:(i * MESSAGE_BYTES) % span + MESSAGE_BYTES] for i in range(messages)]


def iterate_messages(messages: list[bytes]) -> int:
    """Touch every message once (its length): the least a per-message consumer does."""
    total_bytes = 0
    for payload in messages:
        total_bytes += len(payload)
    return total_bytes


def measure_memory_ceiling(messages: int) -> MemoryResult:
    started = time.perf_counter()
    payloads = build_message_list(messages)
    built = time.perf_counter()
    if iterate_messages(payloads) != messages * MESSAGE_BYTES:
        raise AssertionError("in-memory messages have the wrong size")
    iterated = time.perf_counter()
    del payloads
    return MemoryResult(messages, built - started, iterated - built)


# --- publish ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishResult:
    encoding: bool
    window_entries: int
    entries: int
    entry_bytes: int
    duration_s: float
    cpu_s: float
    fsyncs: int

    @property
    def messages(self) -> int:
        return self.entries * MESSAGES_PER_ENTRY

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.duration_s

    @property
    def entries_per_s(self) -> float:
        return self.entries / self.duration_s

    @property
    def mb_per_s(self) -> float:
        return self.entry_bytes / self.duration_s / MB

    @property
    def cpu_us_per_message(self) -> float:
        return self.cpu_s / max(1, self.messages) * 1e6


@dataclass
class PublishTally:
    entries: int = 0
    entry_bytes: int = 0


def settle(future: Future[list[AddResult]], tally: PublishTally) -> None:
    result = future.result(timeout=ACK_TIMEOUT_S)[0]
    if result.last_offset - result.first_offset + 1 != MESSAGES_PER_ENTRY:
        raise AssertionError(f"entry at {result.position} holds the wrong number of messages")
    tally.entries += 1


def pipelined_publish(ml: ManagedLedger, next_entry: Callable[[int], bytes], *, window: int, duration_s: float,
                      entries_max: int, tally: PublishTally) -> None:
    """Publish ``next_entry(i)`` for i = 0, 1, ... until ``duration_s`` or ``entries_max``,
    keeping at most ``window`` futures outstanding; wait for all of them before returning."""
    pending: deque[Future[list[AddResult]]] = deque()
    deadline_s = time.monotonic() + duration_s
    index = 0
    while index < entries_max and time.monotonic() < deadline_s:
        if len(pending) >= window:
            settle(pending.popleft(), tally)
        data = next_entry(index)
        pending.append(ml.append([data], [MESSAGES_PER_ENTRY]))
        tally.entry_bytes += len(data)
        index += 1
    while pending:
        settle(pending.popleft(), tally)


def entry_source(encoding: bool) -> Callable[[int], bytes]:
    """Entries to publish: encoded on the spot (sequence ids continue), or from a pre-encoded pool."""
    if encoding:
        messages = batch_messages()
        return lambda index: encode(messages, index * MESSAGES_PER_ENTRY)
    pool = pre_encoded_pool()
    return lambda index: pool[index % len(pool)]


def measure_publish(stack: Stack, ml: ManagedLedger, plan: Plan, *, encoding: bool) -> PublishResult:
    duration_s = plan.encoding_publish_duration_s if encoding else plan.pre_encoded_publish_duration_s
    messages_max = plan.encoding_publish_messages_max if encoding else plan.pre_encoded_publish_messages_max
    source = entry_source(encoding)
    tally = PublishTally()
    fsyncs_before = stack.storage.statistics().journal.fsync_count
    cpu_before_s = time.process_time()
    started = time.perf_counter()
    pipelined_publish(ml, source, window=plan.publish_window_entries, duration_s=duration_s,
                      entries_max=messages_max // MESSAGES_PER_ENTRY, tally=tally)
    elapsed_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_before_s
    fsyncs = stack.storage.statistics().journal.fsync_count - fsyncs_before
    return PublishResult(encoding, plan.publish_window_entries, tally.entries, tally.entry_bytes, elapsed_s, cpu_s,
                         fsyncs)


# --- cold catch-up ---------------------------------------------------------------------------


@dataclass
class ReadTally:
    entries: int = 0
    messages: int = 0
    entry_bytes: int = 0
    payload_bytes: int = 0
    """Message payload bytes (decoding reads only)."""
    last_ack: Future[None] | None = None


def dispatch_batch(cursor: ManagedCursor, entries: list[Entry], tally: ReadTally) -> None:
    """Forward entries as they are (count their messages from offsets); ack the batch."""
    for entry in entries:
        tally.messages += entry.message_count
        tally.entry_bytes += len(entry.data)
    tally.entries += len(entries)
    tally.last_ack = cursor.ack_cumulative(entries[-1].last_offset)


def touch_messages(messages: list[DecodedMessage]) -> int:
    """Touch every decoded message once (its payload's length), as the in-memory ceiling does."""
    total_bytes = 0
    for message in messages:
        total_bytes += len(message.payload)
    return total_bytes


def decode_batch(cursor: ManagedCursor, entries: list[Entry], tally: ReadTally) -> None:
    """Decode (and verify) every entry, touch every message; ack the batch."""
    for entry in entries:
        messages = decode_entry(entry.data).messages
        if len(messages) != entry.message_count:
            raise AssertionError(f"entry at {entry.position} decodes to the wrong number of messages")
        tally.payload_bytes += touch_messages(messages)
        tally.messages += len(messages)
        tally.entry_bytes += len(entry.data)
    tally.entries += len(entries)
    tally.last_ack = cursor.ack_cumulative(entries[-1].last_offset)


def drain(cursor: ManagedCursor, handle: Callable[[ManagedCursor, list[Entry], ReadTally], None],
          duration_s: float) -> ReadTally:
    """Read batches until the cursor has nothing left or ``duration_s`` passes; wait for the
    last acknowledgement to be persisted."""
    tally = ReadTally()
    deadline_s = time.monotonic() + duration_s
    while time.monotonic() < deadline_s:
        entries = cursor.read_entries(READ_BATCH_ENTRIES)
        if not entries:
            break
        handle(cursor, entries, tally)
    if tally.last_ack is not None:
        tally.last_ack.result(timeout=ACK_TIMEOUT_S)
    return tally


@dataclass(frozen=True)
class CatchUpResult:
    decoding: bool
    entries: int
    messages: int
    entry_bytes: int
    payload_bytes: int
    backlog_messages: int
    duration_s: float
    reopen_duration_s: float
    broker_entry_reads: int
    storage: StorageStats
    disk_read_bytes: int
    page_cache: str

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.duration_s

    @property
    def mb_per_s(self) -> float:
        return self.entry_bytes / self.duration_s / MB

    @property
    def payload_mb_per_s(self) -> float:
        return self.payload_bytes / self.duration_s / MB

    @property
    def broker_reads_per_entry(self) -> float:
        """Entries the managed ledger fetched per entry delivered (1.0 means no re-reads)."""
        return self.broker_entry_reads / max(1, self.entries)

    @property
    def storage_read_cache_hit_ratio(self) -> float:
        path = self.storage.read_path
        lookups = path.read_cache_hits + path.entry_log_reads
        return path.read_cache_hits / max(1, lookups)


def entry_cache_lookups(stats: EntryCacheStats) -> int:
    return stats.hits + stats.misses


def measure_catch_up(data_dir: Path, cursor_name: str, *, decoding: bool, duration_s: float) -> CatchUpResult:
    """Reopen the stack cold and read the topic from the earliest message through a new durable cursor."""
    page_cache = drop_page_cache()
    started = time.perf_counter()
    with stack_at(data_dir) as stack:
        _, cursors = stack.open(TOPIC)
        cursor = cursors.open(cursor_name, initial="earliest")
        reopen_duration_s = time.perf_counter() - started
        backlog_messages = cursor.backlog_messages()
        drop_page_cache()  # reopening read the index and metadata back in
        read_before_bytes, _ = process_io_bytes()
        started = time.perf_counter()
        tally = drain(cursor, decode_batch if decoding else dispatch_batch, duration_s)
        elapsed_s = time.perf_counter() - started
        disk_read_bytes = process_io_bytes()[0] - read_before_bytes
        storage_stats = stack.storage.statistics()
        broker_entry_reads = entry_cache_lookups(stack.cache.statistics())
        cursors.close()
    return CatchUpResult(decoding, tally.entries, tally.messages, tally.entry_bytes,
                         tally.payload_bytes, backlog_messages, elapsed_s,
                         reopen_duration_s, broker_entry_reads, storage_stats, disk_read_bytes, page_cache)


# --- tail read -------------------------------------------------------------------------------


@dataclass
class TailTally:
    messages: int = 0
    lag_messages_max: int = 0
    """Most confirmed-but-unread messages the reader found when it came to read."""
    busy_s: float = 0.0
    """Time spent reading and acknowledging (not waiting for the publisher)."""


@dataclass(frozen=True)
class TailResult:
    read_messages: int
    published_messages: int
    duration_s: float
    entry_cache_hit_ratio: float
    lag_messages_max: int
    busy_s: float

    @property
    def messages_per_s(self) -> float:
        return self.read_messages / self.duration_s

    @property
    def published_messages_per_s(self) -> float:
        return self.published_messages / self.duration_s

    @property
    def messages_per_busy_s(self) -> float:
        """What the reader sustains while it has messages to read (its ceiling)."""
        return self.read_messages / max(self.busy_s, 1e-9)


def follow_tail(ml: ManagedLedger, cursor: ManagedCursor, publisher_done: threading.Event, tally: TailTally,
                deadline_s: float) -> None:
    """Read every entry as it is confirmed, until the publisher is done and the cursor has
    caught up (or the deadline plus a grace second passes)."""
    last_ack: Future[None] | None = None
    while time.monotonic() < deadline_s + 1.0:
        seen = ml.last_confirmed
        started = time.perf_counter()
        lag_messages = ml.confirmed_next_offset() - cursor.read_offset
        entries = cursor.read_entries(READ_BATCH_ENTRIES)
        if entries:
            tally.messages += sum(e.message_count for e in entries)
            tally.lag_messages_max = max(tally.lag_messages_max, lag_messages)
            last_ack = cursor.ack_cumulative(entries[-1].last_offset)
            tally.busy_s += time.perf_counter() - started
            continue
        if publisher_done.is_set() and not cursor.has_more():
            break
        ml.wait_for_entries(seen, TAIL_WAIT_S)
    if last_ack is not None:
        last_ack.result(timeout=ACK_TIMEOUT_S)


def measure_tail(stack: Stack, plan: Plan) -> TailResult:
    ml, cursors = stack.open(TAIL_TOPIC)
    pool = pre_encoded_pool()
    # One confirmed entry first: while a topic has no confirmed entry, ManagedLedger.first_offset
    # counts adds still in flight, and a reader at offset 0 gets DataLost.
    ml.append([pool[0]], [MESSAGES_PER_ENTRY]).result(timeout=ACK_TIMEOUT_S)
    cursor = cursors.open("tail", initial="latest")
    publisher_done = threading.Event()
    publish_tally, read_tally = PublishTally(), TailTally()
    deadline_s = time.monotonic() + plan.tail_duration_s

    def publish() -> None:
        try:
            pipelined_publish(ml, lambda index: pool[index % len(pool)], window=plan.publish_window_entries,
                              duration_s=plan.tail_duration_s, entries_max=2**62, tally=publish_tally)
        finally:
            publisher_done.set()

    cache_before = stack.cache.statistics()
    duration_s = run_threads([publish, lambda: follow_tail(ml, cursor, publisher_done, read_tally, deadline_s)])
    cache_after = stack.cache.statistics()
    cursors.close()
    hits = cache_after.hits - cache_before.hits
    lookups = entry_cache_lookups(cache_after) - entry_cache_lookups(cache_before)
    return TailResult(read_tally.messages, publish_tally.entries * MESSAGES_PER_ENTRY, duration_s,
                      hits / max(1, lookups), read_tally.lag_messages_max, read_tally.busy_s)
