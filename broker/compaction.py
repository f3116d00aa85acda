"""Topic compaction: the latest message of every key, readable as the topic's compacted view.

Pass 1 reads the previous compacted view and the topic up to the *horizon* (the confirmed end
when compaction starts) and finds, per key, the offset of its latest message; a message with an
empty payload is a tombstone that removes the key, and messages without a key are dropped.
Pass 2 writes the surviving messages, in offset order, one per entry, to a new ledger, each
prefixed with its original message id (Pulsar's compacted ledgers keep original ids too):
``[ledger u64][entry u64][batch_index i32]`` + a one-message Pulsar entry whose
BrokerEntryMetadata index is the message's original offset. An end-to-end encrypted entry
cannot be split (Pulsar's compactor keeps such a batch whole too): it is one message of its
clear key at its last offset, kept as the stored entry (re-prefixed, index its last offset).
Then the compaction record at ``/managed-ledgers/{name}/compaction`` is swapped (compare-and-set) and the old compacted
ledger deleted. Readers of the compacted view read it up to the horizon, then the topic:
``Reader`` (REST, WebSocket) as decoded messages, a read-compacted subscription (the binary
protocol's ``read_compacted``) as entries (``compacted_entries``: each message's stored bytes
with the id it had in the topic, nothing decoded).

``Compactions`` (``BrokerService.compactions``) keeps one ``Compactor`` per loaded topic and
runs triggered compactions on one background thread, one per topic at a time.

Invariant: the compacted view never changes while it is read: a new compaction publishes a new
ledger and the record switch is atomic.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import json
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from broker.bookkeeper.ledger_handle import LedgerHandle
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.entry import Entry
from broker.entry_format import (
    DecodedMessage,
    EncryptionContext,
    Message,
    decode_entry,
    encode_entry,
    peek_broker_entry_metadata,
    with_broker_entry_metadata,
)
from broker.errors import CompactionInProgress, MagnetarError, NotFound
from broker.limits import COMPACTION_APPEND_ENTRIES
from broker.message_id import MessageId
from broker.metadata.store import MetadataStore
from broker.topic import PersistentTopic
from broker.topic_name import TopicName

log = logging.getLogger(__name__)

_ORIGINAL_ID = struct.Struct(">QQi")


@dataclass(frozen=True)
class CompactedMessage:
    offset: int
    message_id: MessageId
    publish_time_ms: int
    message: DecodedMessage
    entry_data: bytes | None = None
    """An end-to-end encrypted entry's stored bytes: compacted as a whole, kept as it is."""
    encryption: EncryptionContext | None = None
    """Its encryption context, when the view is read back."""


@dataclass(frozen=True)
class CompactionStatus:
    status: str  # NOT_RUN | RUNNING | SUCCESS | ERROR
    ledger_id: int
    horizon_offset: int
    messages: int
    last_run_ms: int
    error: str


class CompactedView:
    """The compacted messages below ``horizon_offset``, searchable by offset."""

    def __init__(self, handle: LedgerHandle, horizon_offset: int) -> None:
        self.handle = handle
        self.horizon_offset = horizon_offset

    def _offset_at(self, entry_id: int) -> int:
        meta = peek_broker_entry_metadata(self.handle.read_entry(entry_id)[_ORIGINAL_ID.size :])
        assert meta is not None
        return meta.index

    def messages_from(self, offset: int) -> Iterator[CompactedMessage]:
        last = self.handle.last_add_confirmed
        start = bisect.bisect_left(range(last + 1), offset, key=self._offset_at)
        for entry_id in range(start, last + 1):
            yield decode_compacted(self.handle.read_entry(entry_id))


@dataclass(frozen=True)
class CompactedEntry:
    """One message of the compacted view as an entry a consumer is sent: ``data`` in the
    topic's own stored format (its broker entry metadata's index being the message's
    ``offset``), with the id the message had in the topic."""

    offset: int
    ledger_id: int
    entry_id: int
    batch_index: int
    publish_time_ms: int
    data: bytes


def compacted_entries(view: CompactedView, offset: int) -> Iterator[CompactedEntry]:
    """The compacted view's messages from ``offset`` on, as entries, without decoding them."""
    handle = view.handle
    last = handle.last_add_confirmed
    start = bisect.bisect_left(range(last + 1), offset, key=view._offset_at)
    for entry_id in range(start, last + 1):
        raw = handle.read_entry(entry_id)
        ledger_id, original_entry, batch_index = _ORIGINAL_ID.unpack_from(raw)
        data = raw[_ORIGINAL_ID.size :]
        meta = peek_broker_entry_metadata(data)
        assert meta is not None
        yield CompactedEntry(meta.index, ledger_id, original_entry, batch_index, meta.broker_timestamp_ms, data)


def decode_compacted(raw: bytes) -> CompactedMessage:
    ledger_id, entry_id, batch_index = _ORIGINAL_ID.unpack_from(raw)
    decoded = decode_entry(raw[_ORIGINAL_ID.size :])
    assert decoded.index is not None and decoded.broker_timestamp_ms is not None
    original = decoded.messages[0]
    return CompactedMessage(decoded.index, MessageId(ledger_id, entry_id, -1, batch_index),
                            decoded.broker_timestamp_ms, original._replace(offset=decoded.index),
                            encryption=decoded.encryption)


class Compactor:
    def __init__(self, topic: PersistentTopic, ledgers: LedgerManager, store: MetadataStore,
                 clock: Callable[[], float] = time.time) -> None:
        self._topic = topic
        self._ledgers = ledgers
        self._store = store
        self._clock = clock
        self._path = f"/managed-ledgers/{topic.ml.name}/compaction"
        self._lock = threading.Lock()
        self._running = False
        self._error = ""

    def _record(self) -> tuple[dict[str, int], int] | None:
        stat = self._store.get(self._path)
        return None if stat is None else (json.loads(stat.value), stat.version)

    def view(self) -> CompactedView | None:
        record = self._record()
        if record is None:
            return None
        return CompactedView(self._ledgers.open(record[0]["ledgerId"]), record[0]["horizonOffset"])

    def status(self) -> CompactionStatus:
        record = self._record()
        if self._running:
            state = "RUNNING"
        elif self._error:
            state = "ERROR"
        else:
            state = "SUCCESS" if record is not None else "NOT_RUN"
        obj = record[0] if record is not None else {}
        return CompactionStatus(state, obj.get("ledgerId", -1), obj.get("horizonOffset", 0),
                                obj.get("messages", 0), obj.get("lastRunMs", 0), self._error)

    def compact(self) -> CompactionStatus:
        with self._lock:
            self._running, self._error = True, ""
            try:
                self._compact()
            except MagnetarError as exc:
                self._error = str(exc)
                raise
            finally:
                self._running = False
        return self.status()

    def _sources(self, previous: CompactedView | None, horizon: int) -> Iterator[CompactedMessage]:
        start = self._topic.ml.first_offset
        if previous is not None:
            yield from previous.messages_from(0)
            start = max(start, previous.horizon_offset)
        for entry in self._topic.entries_from(start) if start < horizon else iter(()):
            decoded = decode_entry(entry.data)
            if decoded.encryption is not None:
                if start <= entry.last_offset < horizon:
                    yield self._opaque(entry, decoded.messages[0])
                continue
            for message in decoded.messages:
                assert message.offset is not None
                if start <= message.offset < horizon:
                    yield CompactedMessage(message.offset, MessageId(entry.position.ledger_id, entry.position.entry_id,
                                           self._topic.partition, message.batch_index),
                                           entry.publish_time_ms, message)

    def _opaque(self, entry: Entry, first: DecodedMessage) -> CompactedMessage:
        """An encrypted entry as one message of its clear key, at its last offset (Pulsar's
        compactor keeps a batch it cannot read whole, by the batch's key)."""
        position = entry.position
        return CompactedMessage(entry.last_offset, MessageId(position.ledger_id, position.entry_id,
                                                             self._topic.partition, -1),
                                entry.publish_time_ms, first._replace(offset=entry.last_offset), entry.data)

    def _compact(self) -> None:
        horizon = self._topic.ml.confirmed_next_offset()
        record = self._record()
        previous = self.view()
        latest: dict[str, int] = {}
        for item in self._sources(previous, horizon):
            if item.message.key is None:
                continue
            latest[item.message.key] = -1 if not item.message.payload else item.offset
        keep = {offset for offset in latest.values() if offset >= 0}
        handle = self._ledgers.create(self._topic.ml.config.quorum, {"compacted-topic": self._topic.ml.name})
        group: list[bytes] = []
        for item in self._sources(previous, horizon):
            if item.offset in keep:
                group.append(self._encode(item))
            if len(group) >= COMPACTION_APPEND_ENTRIES:
                handle.append(group).result(timeout=60)
                group = []
        if group:
            handle.append(group).result(timeout=60)
        handle.close()
        body = json.dumps({"ledgerId": handle.ledger_id, "horizonOffset": horizon, "messages": len(keep),
                           "lastRunMs": int(self._clock() * 1000)}).encode()
        self._store.put(self._path, body, record[1] if record is not None else -1)
        if previous is not None:
            with contextlib.suppress(NotFound):
                self._ledgers.delete(previous.handle.ledger_id)

    @staticmethod
    def _encode(item: CompactedMessage) -> bytes:
        mid = item.message_id
        if item.entry_data is not None:
            entry = with_broker_entry_metadata(item.entry_data, item.publish_time_ms, item.offset)
            return _ORIGINAL_ID.pack(mid.ledger_id, mid.entry_id, mid.batch_index) + entry
        m = item.message
        entry = encode_entry([Message(payload=m.payload, key=m.key, properties=m.properties,
                                      event_time_ms=m.event_time_ms, sequence_id=m.sequence_id,
                                      ordering_key=m.ordering_key, key_b64_encoded=m.key_b64_encoded)],
                             producer_name="compactor", sequence_id=m.sequence_id or 0,
                             publish_time_ms=item.publish_time_ms, broker_timestamp_ms=item.publish_time_ms,
                             index=item.offset)
        return _ORIGINAL_ID.pack(mid.ledger_id, mid.entry_id, mid.batch_index) + entry


@dataclass(frozen=True)
class CompactionsStats:
    compactors: int
    """Loaded topics with a compactor (one was asked for their compaction)."""
    queued_or_running: int
    """Triggered compactions not finished yet."""


class Compactions:
    """The compactors of the loaded topics and the thread that runs triggered compactions."""

    def __init__(self, topic: Callable[[TopicName], PersistentTopic], ledgers: LedgerManager, store: MetadataStore,
                 clock: Callable[[], float] = time.time) -> None:
        """``topic(name)``: the loaded topic ``name`` (``NotFound`` when it does not exist)."""
        self._topic = topic
        self._ledgers = ledgers
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._compactors: dict[TopicName, Compactor] = {}
        self._compactions: dict[TopicName, Future[None]] = {}
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=1,
                                                                   thread_name_prefix="magnetar-compaction")

    def compactor(self, name: TopicName) -> Compactor:
        topic = self._topic(name)
        with self._lock:
            compactor = self._compactors.get(name)
            if compactor is None:
                compactor = Compactor(topic, self._ledgers, self._store, self._clock)
                self._compactors[name] = compactor
            return compactor

    def trigger(self, name: TopicName) -> None:
        """Compact ``name`` in the background (``CompactionInProgress`` while one is queued or running)."""
        compactor = self.compactor(name)
        pool = self._pool
        if pool is None:
            raise RuntimeError("broker service is not started")
        with self._lock:
            running = self._compactions.get(name)
            if running is not None and not running.done():
                raise CompactionInProgress(f"compaction of {name} is already in progress")
            self._compactions[name] = pool.submit(_compact, compactor)

    def status(self, name: TopicName) -> CompactionStatus:
        """The compactor's status; RUNNING also while a triggered compaction waits to start."""
        status = self.compactor(name).status()
        with self._lock:
            queued = self._compactions.get(name)
        if queued is not None and not queued.done() and status.status != "RUNNING":
            return dataclasses.replace(status, status="RUNNING")
        return status

    def forget(self, names: list[TopicName]) -> None:
        """Drop the compactors of topics no longer loaded (deleted or unloaded), and their
        finished compactions."""
        with self._lock:
            for name in names:
                self._compactors.pop(name, None)
                finished = self._compactions.get(name)
                if finished is not None and finished.done():
                    del self._compactions[name]

    def close(self) -> None:
        """Let a running compaction finish; queued ones never start."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def statistics(self) -> CompactionsStats:
        with self._lock:
            return CompactionsStats(len(self._compactors), sum(1 for f in self._compactions.values() if not f.done()))


def _compact(compactor: Compactor) -> None:
    try:
        compactor.compact()
    except MagnetarError:  # kept as the compactor's ERROR status and lastError
        log.exception("compaction failed")
