"""ManagedLedger: one topic partition as an ordered list of ledgers, with gap-free offsets.

Write path: ``append(payloads, message_counts)`` stamps each entry of a group with Pulsar's
BrokerEntryMetadata (broker timestamp, ``index`` = offset of the entry's last message) and
appends the group to the current ledger in one call (a single entry is a group of one).
Offsets are per partition, gap-free and increasing across ledgers. Acknowledgements complete in
order; each confirmed entry goes to the broker-side ``EntryCache`` and wakes tailing readers.
Every append's bytes count in the factory's publish buffer (``broker/byte_budget.py``) from the
moment it is sent until it is stored or failed.

Ledger list: kept in the metadata store at ``/managed-ledgers/{name}`` (compare-and-set on
every change). The current ledger rolls over when it holds ``ledger_entries_max`` entries,
``ledger_size_bytes_max`` bytes or is ``ledger_age_ms_max`` old (never before
``ledger_age_ms_min``, never when empty). After a crash the last ledger is recovered (fenced
and closed at its last durable entry) and a new one is opened. A load that loses its
compare-and-set to another writer ``LOAD_ATTEMPTS`` times in a row fails with
``ServiceUnitNotReady`` and leaves nothing loaded: the factory keeps only fully loaded ledgers.

Offsets and times are found through the sparse index of ``broker/offset_index.py`` (bisect the
ledgers, then their samples, then read forward a bounded number of entries); trimming and TTL
follow ``broker/retention.py``; deleted ledgers go to the bookies' GC. Reads of consecutive
entries go through the ledger's range read, in runs between entries the broker's cache holds.

Invariant: no state lives only in memory; the ledger list and cursor snapshots are in the
metadata store, entries and cursor positions in ledgers. Messages name the topic as users spell
it (``persistent://tenant/ns/topic``).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from broker.bookkeeper.bookie import QuorumConfig
from broker.bookkeeper.ledger_handle import LedgerHandle
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.byte_budget import ByteBudget
from broker.entry_cache import CachedEntry, EntryCache
from broker.entry_format import (
    message_count,
    peek_broker_entry_metadata,
    with_broker_entry_metadata_each,
)
from broker.errors import (
    BadVersion,
    DataLost,
    InvalidRequest,
    LedgerFenced,
    MagnetarError,
    MessageTooLarge,
    NoSuchEntry,
    NotFound,
    OffsetMismatch,
    ServiceUnitNotReady,
    TopicTerminated,
)
from broker.message_id import Position
from broker.metadata.store import MetadataStore
from broker.offset_index import LedgerInfo, PositionHints, SampleStore, ledger_holding
from broker.retention import deletable_ledgers, expiry_cutoff_ms
from broker.topic_name import display_name
from storage import new_future

INCARNATION_PROPERTY = "magnetar.incarnation"
"""The property naming a managed ledger's incarnation: made once, when it is first created, so
what derives from one incarnation of a topic (its key index) is never taken for another's."""

log = logging.getLogger(__name__)

ML_ROOT = "/managed-ledgers"
KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024
READ_HANDLES_MAX = 64
READ_RUN_ENTRIES_MAX = 64
"""Entries fetched from the bookies in one range read."""
READ_RUN_BYTES_MAX = 1 * MiB
"""Bytes one range read fetches at most, at the ledger's average entry size (one entry always):
a lookup that reads forward to an offset or a time holds no more than this at once."""
ADD_TIMEOUT_S = 60.0
LOAD_ATTEMPTS = 3
"""Loads of one managed ledger tried in a row while another writer changes its ledger list."""
EARLIEST = Position(-1, -1)


@dataclass(frozen=True)
class ManagedLedgerConfig:
    ledger_entries_max: int = 50_000
    ledger_size_bytes_max: int = 2 * GiB
    ledger_age_ms_max: int = 240 * 60_000
    ledger_age_ms_min: int = 10 * 60_000
    retention_time_ms: int = 0
    """Keep fully consumed ledgers this long (-1: forever)."""
    retention_size_bytes: int = 0
    """Keep fully consumed ledgers up to this total size (-1: unlimited)."""
    message_ttl_ms: int = 0
    """Messages older than this are expired from every cursor's backlog (0: never)."""
    index_interval_entries: int = 64
    index_interval_bytes: int = 1 * MiB
    """An entry is also sampled once this many bytes of entries since the last sample were
    written: large entries would otherwise make a lookup read up to 63 of them."""
    entry_size_bytes_max: int = 5 * MiB + 64 * KiB
    quorum: QuorumConfig = field(default_factory=QuorumConfig)

    @classmethod
    def test_min(cls) -> ManagedLedgerConfig:
        """Rollover every few entries so ledger boundaries appear in ordinary tests."""
        return cls(ledger_entries_max=5, ledger_size_bytes_max=64 * KiB, ledger_age_ms_max=60_000,
                   ledger_age_ms_min=0, index_interval_entries=2)


class AddResult(NamedTuple):
    position: Position
    first_offset: int
    last_offset: int
    publish_time_ms: int


@dataclass(frozen=True)
class Entry:
    position: Position
    data: bytes
    first_offset: int
    last_offset: int
    publish_time_ms: int

    @property
    def message_count(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclass(frozen=True)
class ManagedLedgerStats:
    name: str
    ledgers: int
    entries_added: int
    bytes_added: int
    messages_added: int
    number_of_entries: int
    total_size_bytes: int
    current_ledger_entries: int
    current_ledger_size_bytes: int
    next_offset: int
    first_offset: int
    last_confirmed: Position
    terminated: bool


class ManagedLedger:
    """Open through :meth:`ManagedLedgerFactory.open`."""

    def __init__(self, factory: ManagedLedgerFactory, name: str, config: ManagedLedgerConfig) -> None:
        self.name = name
        self.config = config
        self._factory = factory
        self._ledgers = factory.ledgers
        self._store = factory.store
        self._cache = factory.cache
        self._publish_buffer = factory.publish_buffer
        self._clock = factory.clock
        self._path = f"{ML_ROOT}/{name}"
        self._lock = threading.RLock()
        self._confirmed = threading.Condition()
        self._infos: list[LedgerInfo] = []
        self._version = -1
        self._current: LedgerHandle | None = None
        self._current_next_entry_id = 0
        self._next_offset = 0
        self._last_publish_ms = 0
        self._last_confirmed = EARLIEST
        self._terminated = False
        self._offset_floor = 0
        """The confirmed end as of the last save: offsets never restart below it, even when
        trimming removed every ledger that held entries."""
        self._pending_deletes: list[int] = []
        """Ledgers dropped from the list but maybe not yet deleted (retried on open)."""
        self.properties: dict[str, str] = {}
        self._failure: MagnetarError | None = None
        self._closed = False
        """Closed or abandoned by this broker (its bundle went elsewhere): no more appends."""
        self._taken_over = False
        """Another broker recovered the topic (fenced its current ledger, or changed the stored
        ledger list under this one): no more appends, and nothing more written for them."""
        self._uncertain: list[dict[str, Any]] | None = None
        """The ledgers of the last list save that failed without an answer (it may have been
        applied); None when the last save was answered."""
        self._read_handles: dict[int, LedgerHandle] = {}
        self._position_hints = PositionHints()
        self._samples = SampleStore(self._store, self._path)
        self.display_name = display_name(name)
        """The topic as users spell it, for every message about it."""
        self._in_flight = 0
        """Adds sent to the current ledger whose outcome is not accounted yet."""
        self._entries_added = self._bytes_added = self._messages_added = 0
        self._listeners: list[Callable[[], None]] = []
        self.cursor_positions: Callable[[], list[int]] = list
        """Set by the cursor registry: mark-delete offsets of every durable cursor."""

    # --- lifecycle ---------------------------------------------------------------------
    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _load(self) -> None:
        stat = self._store.get(self._path)
        if stat is not None:
            obj = json.loads(stat.value)
            self._infos = [LedgerInfo.from_json(i) for i in obj["ledgers"]]
            self._terminated = bool(obj.get("terminated", False))
            self.properties = dict(obj.get("properties", {}))
            self._pending_deletes = [int(i) for i in obj.get("pendingDeletes", [])]
            self._offset_floor = int(obj.get("offsetFloor", 0))
            self._version = stat.version
        self.properties.setdefault(INCARNATION_PROPERTY, uuid.uuid4().hex)  # saved with the list below
        for info in self._infos[:-1]:
            info.sparse_index = self._samples.load(info.ledger_id)
        if self._infos and self._infos[-1].closed_ms == 0:
            self._recover_last_ledger()
        elif self._infos:
            self._infos[-1].sparse_index = self._samples.load(self._infos[-1].ledger_id)
        self._reset_tail_state()
        if not self._terminated:
            self._open_new_ledger()
        else:
            self._save()
        self._delete_pending(saved=list(self._pending_deletes))

    def _reset_tail_state(self) -> None:
        """Continue from the confirmed end: offsets of adds that never confirmed are reused."""
        confirmed = [i for i in self._infos if i.entries > 0]
        if confirmed:
            last = confirmed[-1]
            self._next_offset = last.next_offset
            self._last_publish_ms = max(self._last_publish_ms, last.last_publish_ms)
            self._last_confirmed = Position(last.ledger_id, last.entries - 1)
        else:
            self._next_offset = max(self._offset_floor, self._infos[0].first_offset if self._infos else 0)

    def _recover_last_ledger(self) -> None:
        info = self._infos[-1]
        handle = self._ledgers.open(info.ledger_id, recovery=True)
        info.entries = handle.last_add_confirmed + 1
        info.size_bytes = handle.length_bytes
        info.closed_ms = self._now_ms()
        info.sparse_index, info.messages, info.unsampled_bytes = [], 0, 0
        for entry_id in range(info.entries):
            self._index_entry(info, entry_id, handle.read_entry(entry_id))
        if info.entries == 0:  # dropped from the list; deleted once a list without it is saved
            self._infos.pop()
            self._pending_deletes.append(info.ledger_id)
        else:
            self._samples.save(info)
            self._read_handles[info.ledger_id] = handle

    def _index_entry(self, info: LedgerInfo, entry_id: int, data: bytes) -> None:
        """Account one existing entry into ``info`` (messages, publish times, sparse index)."""
        meta = peek_broker_entry_metadata(data)
        if meta is None:
            raise InvalidRequest(f"entry {info.ledger_id}:{entry_id} of {self.display_name} has no broker metadata")
        count = message_count(data)
        first = meta.index - count + 1
        if entry_id == 0:
            info.first_offset, info.first_publish_ms = first, meta.broker_timestamp_ms
        self._sample(info, entry_id, first, meta.broker_timestamp_ms, len(data))
        info.messages = meta.index + 1 - info.first_offset
        info.last_publish_ms = meta.broker_timestamp_ms

    def _sample(self, info: LedgerInfo, entry_id: int, first_offset: int, publish_ms: int, size_bytes: int) -> None:
        info.sample(entry_id, first_offset, publish_ms, size_bytes, interval_entries=self.config.index_interval_entries,
                    interval_bytes=self.config.index_interval_bytes)

    def _open_new_ledger(self) -> None:
        """Create the next ledger and make it current once the ledger list naming it is saved:
        a ledger missing from the stored list is one no later owner reads, so nothing may be
        appended to it. If the save fails, no append goes to the ledger (the next append tries
        anew). If it failed because another writer changed the list (another broker recovered
        the topic), the ledger is deleted again and this managed ledger takes no more appends;
        after any other failure the save may have been applied, so the ledger stays (empty)."""
        handle = self._ledgers.create(self.config.quorum, {"managed-ledger": self.name})
        info = LedgerInfo(handle.ledger_id, first_offset=self._next_offset, created_ms=self._now_ms())
        self._infos.append(info)
        try:
            self._save()
        except BaseException as exc:
            self._infos.pop()
            if not isinstance(exc, BadVersion):
                raise  # the save may have been applied: the next save finds out
            self._taken_over = True
            with contextlib.suppress(MagnetarError):  # a failed delete leaves it behind, empty and unlisted
                self._ledgers.delete(handle.ledger_id)
            raise LedgerFenced(f"the ledger list of {self.display_name} was changed by another writer: "
                               "another broker serves the topic") from exc
        self._current, self._current_next_entry_id = handle, 0

    def _save(self) -> None:
        """Compare-and-set the ledger list. A save that failed without an answer (the metadata
        store was cut off) may have been applied: the next save first takes the stored version
        if the stored list is exactly the one that save wrote, so a lost answer is not mistaken
        for another writer's change (a ledger that list named and this writer has dropped since,
        empty, is then deleted with the next pending deletions)."""
        if self._uncertain is not None:
            self._adopt_own_list(self._uncertain)
        ledgers = [i.to_json() for i in self._infos]
        try:
            self._put_list(ledgers)
        except BadVersion:
            raise
        except BaseException:
            self._uncertain = ledgers
            raise
        self._uncertain = None

    def _adopt_own_list(self, written: list[dict[str, Any]]) -> None:
        stat = self._store.get(self._path)
        if stat is None or json.loads(stat.value)["ledgers"] != written:
            return  # not applied (the version is still right), or another writer's: the put decides
        self._version = stat.version
        ours = {i.ledger_id for i in self._infos}
        self._pending_deletes.extend(ledger_id for ledger_id in (int(i["ledgerId"]) for i in written)
                                     if ledger_id not in ours and ledger_id not in self._pending_deletes)

    def _put_list(self, ledgers: list[dict[str, Any]]) -> None:
        confirmed = [i for i in self._infos if i.entries > 0]
        if confirmed:
            self._offset_floor = max(self._offset_floor, confirmed[-1].next_offset)
        body = json.dumps({"ledgers": ledgers, "terminated": self._terminated,
                           "properties": self.properties, "pendingDeletes": self._pending_deletes,
                           "offsetFloor": self._offset_floor}, sort_keys=True).encode()
        self._version = self._store.put(self._path, body, self._version).version

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._current is not None and not self._taken_over:
                self._close_current()
                if not self._taken_over:
                    self._save()

    def _close_current(self) -> None:
        """Retire the current ledger: close it at its LAC, wait until every add sent to it has
        been accounted (confirmed or failed), drop it if it holds nothing, and continue offsets
        from the confirmed end (a failed add's offsets are given out again, so no gap)."""
        assert self._current is not None
        handle, self._current = self._current, None
        with contextlib.suppress(MagnetarError):  # after a failed add, whoever recovers the ledger closes it
            try:
                handle.close()
            except LedgerFenced:  # another broker recovered (and closed) it: the topic is its now
                self._taken_over = True
        with self._confirmed:
            self._confirmed.wait_for(lambda: self._in_flight == 0, ADD_TIMEOUT_S)
        if self._taken_over:
            return  # its samples and the list are the new owner's to write
        info = self._infos[-1]
        info.closed_ms = self._now_ms()
        info.drop_samples_past_end()
        if info.entries == 0:  # an empty ledger never stays in the list: deleted once it is out of it
            self._infos.pop()
            self._pending_deletes.append(handle.ledger_id)
        else:
            self._samples.save(info)
            self._read_handles[handle.ledger_id] = handle
        self._reset_tail_state()

    def terminate(self) -> Position:
        """No more writes, ever; returns the last position."""
        with self._lock:
            self._refuse_if_taken_over()
            if self._current is not None:
                self._retire_current()
            self._terminated = True
            self._save()
            return self._last_confirmed

    @property
    def incarnation(self) -> str:
        """Made when this managed ledger was first created (a deleted and recreated topic has another)."""
        return self.properties[INCARNATION_PROPERTY]

    @property
    def terminated(self) -> bool:
        return self._terminated

    # --- writing -------------------------------------------------------------------------
    def append(self, payloads: Sequence[bytes], message_counts: Sequence[int], *,
               expected_offset: int | None = None,
               on_offsets: Sequence[Callable[[int], None] | None] | None = None) -> Future[list[AddResult]]:
        """Append entries (entry ``i`` holds ``message_counts[i]`` messages; a single entry is a
        group of one); one Future resolves to their results, in order, once all are durable, or
        fails for all of them. All are accepted or none (a refusal raises before anything is
        written). The group stays in the current ledger: a rollover due happens before it.

        With ``expected_offset`` the group is appended only if its first offset would be
        exactly that (else ``OffsetMismatch`` and nothing is written). ``on_offsets[i]`` (if
        any) runs with entry ``i``'s first offset, in entry order, under the lock that assigns
        offsets, before anything is written (the key index numbers the entry's keyed messages
        there); if one raises, nothing is written."""
        if not payloads or len(payloads) != len(message_counts) or \
                (on_offsets is not None and len(on_offsets) != len(payloads)):
            raise InvalidRequest("an append needs one message count per entry, at least one entry")
        ledger_future, info, datas, added = self._append(payloads, message_counts, expected_offset, on_offsets)
        result: Future[list[AddResult]] = new_future()
        buffered = self._buffer(datas)
        ledger_future.add_done_callback(lambda f: self._on_added(f, result, info, datas, added, buffered))
        return result

    def _buffer(self, datas: list[bytes]) -> int:
        """Count ``datas`` in the broker's publish buffer until they are stored; their bytes."""
        size = sum(map(len, datas))
        if self._publish_buffer is not None:
            self._publish_buffer.adjust(size)
        return size

    def _append(self, payloads: Sequence[bytes], message_counts: Sequence[int], expected_offset: int | None,
                on_offsets: Sequence[Callable[[int], None] | None] | None,
                ) -> tuple[Future[int], LedgerInfo, list[bytes], list[AddResult]]:
        """Stamp and send entries to the current ledger (see :meth:`append`): the ledger's
        future, the ledger's info, the stamped entries and their results to be."""
        size_max = self.config.entry_size_bytes_max
        for payload, count in zip(payloads, message_counts, strict=True):
            if count < 1:
                raise InvalidRequest("an entry holds at least one message")
            if len(payload) > size_max:
                raise MessageTooLarge(f"entry of {len(payload)} bytes exceeds {size_max}")
        with self._lock:
            try:
                return self._append_locked(payloads, message_counts, expected_offset, on_offsets)
            except LedgerFenced:  # refused, or the ledger was fenced: another broker serves the topic
                self._taken_over = True
                self._factory.count_fenced_append()
                raise

    def _append_locked(self, payloads: Sequence[bytes], message_counts: Sequence[int], expected_offset: int | None,
                       on_offsets: Sequence[Callable[[int], None] | None] | None,
                       ) -> tuple[Future[int], LedgerInfo, list[bytes], list[AddResult]]:
        self._check_writable()
        self._maybe_roll_over()
        if expected_offset is not None and expected_offset != self._next_offset:
            raise OffsetMismatch(
                f"expected offset {expected_offset} but the next offset of {self.display_name} is "
                f"{self._next_offset}",
                expected_offset=expected_offset, next_offset=self._next_offset)
        if on_offsets is not None:
            offset = self._next_offset
            for reserve, count in zip(on_offsets, message_counts, strict=True):
                if reserve is not None:
                    reserve(offset)
                offset += count
        assert self._current is not None
        publish_ms = max(self._now_ms(), self._last_publish_ms)
        info = self._infos[-1]
        entry_id, offset = self._current_next_entry_id, self._next_offset
        added: list[AddResult] = []
        ledger_id = info.ledger_id
        last_offsets: list[int] = []
        for count in message_counts:
            offset += count
            last_offsets.append(offset - 1)
        datas = with_broker_entry_metadata_each(payloads, publish_ms, last_offsets)
        offset = self._next_offset
        sample = self._sample
        for data, last_offset in zip(datas, last_offsets, strict=True):
            sample(info, entry_id, offset, publish_ms, len(data))
            added.append(AddResult(Position(ledger_id, entry_id), offset, last_offset, publish_ms))
            entry_id += 1
            offset = last_offset + 1
        with self._confirmed:
            self._in_flight += 1
        try:
            ledger_future = self._current.append(datas)
        except BaseException:
            with self._confirmed:
                self._in_flight -= 1
            raise
        self._current_next_entry_id = entry_id
        self._next_offset = offset
        self._last_publish_ms = publish_ms
        return ledger_future, info, datas, added

    def _on_added(self, ledger_future: Future[int], result: Future[list[AddResult]], info: LedgerInfo,
                  datas: list[bytes], added: list[AddResult], buffered: int) -> None:
        if self._publish_buffer is not None:
            self._publish_buffer.adjust(-buffered)
        error = ledger_future.exception()
        if error is not None:
            self._add_failed(error, info)
            result.set_exception(error)
            return
        self._confirm(info, datas, added)
        result.set_result(added)

    def _add_failed(self, error: BaseException, info: LedgerInfo) -> None:
        """An add failed. After most failures the next append continues in a new ledger; after
        a fence, whoever fenced the ledger serves the topic now: the next appends are refused
        at once, without closing the ledger, saving its samples or opening another (each a
        write to metadata that belongs to the new owner)."""
        fenced = isinstance(error, LedgerFenced)
        if fenced:
            self._factory.count_fenced_append()
            if self._failure is None and not self._taken_over:
                log.warning("append to ledger %d of %s failed: fenced (another broker recovered it)",
                            info.ledger_id, self.display_name)
        with self._confirmed:
            if fenced:
                self._taken_over = True
            if self._failure is None and isinstance(error, MagnetarError):
                self._failure = error
            self._in_flight -= 1
            self._confirmed.notify_all()

    def _confirm(self, info: LedgerInfo, datas: Sequence[bytes], added: Sequence[AddResult]) -> None:
        """Entries ``added`` (one add call's, in order) are durable: count them, cache them, tell
        the listeners."""
        first, last = added[0], added[-1]
        size_bytes = sum(map(len, datas))
        with self._confirmed:
            self._in_flight -= 1
            info.entries = last.position.entry_id + 1
            info.size_bytes += size_bytes
            info.messages = last.last_offset + 1 - info.first_offset
            if first.position.entry_id == 0:
                info.first_publish_ms = first.publish_time_ms
            info.last_publish_ms = last.publish_time_ms
            self._last_confirmed = last.position
            self._entries_added += len(added)
            self._bytes_added += size_bytes
            self._messages_added += last.last_offset - first.first_offset + 1
            self._confirmed.notify_all()
        insert = self._cache.insert
        for data, add in zip(datas, added, strict=True):
            insert(add.position.ledger_id, add.position.entry_id,
                   CachedEntry(data, add.first_offset, add.last_offset, add.publish_time_ms))
        for listener in list(self._listeners):
            listener()

    @property
    def taken_over(self) -> bool:
        """Another broker recovered the topic: this managed ledger writes nothing more."""
        return self._taken_over

    def abandon(self) -> None:
        """Stop appending without writing anything (this broker lost the topic's bundle with
        its ZooKeeper session): whoever serves the topic next recovers the current ledger by
        fencing it, which also fails any append still in flight here."""
        with self._lock:
            self._closed = True

    def _check_writable(self) -> None:
        if self._closed:
            raise ServiceUnitNotReady(f"topic {self.display_name} is no longer served by this broker")
        if self._terminated:
            raise TopicTerminated(f"topic {self.display_name} is terminated")
        if isinstance(self._failure, LedgerFenced):  # its add failed while the flag was being set
            self._taken_over = True
        self._refuse_if_taken_over()
        if self._failure is not None:
            self._recover_from_failure()
        elif self._current is None:
            self._open_new_ledger()  # the last attempt could not save the ledger list

    def _retire_current(self) -> None:
        """``_close_current``, then ``LedgerFenced`` if closing found the topic taken over (the
        caller must not go on to write anything: the ledger list is the new owner's)."""
        self._close_current()
        self._refuse_if_taken_over()

    def _refuse_if_taken_over(self) -> None:
        if self._taken_over:
            raise LedgerFenced(f"another broker recovered {self.display_name} (fenced its ledger or rewrote its "
                               "ledger list) and serves it now")

    def _recover_from_failure(self) -> None:
        """After a failed add: abandon the ledger at its LAC and continue in a new one."""
        if self._current is not None:
            self._retire_current()
        self._failure = None
        self._open_new_ledger()

    def _maybe_roll_over(self) -> None:
        info = self._infos[-1]
        age_ms = self._now_ms() - info.created_ms
        if self._current_next_entry_id == 0 or age_ms < self.config.ledger_age_ms_min:
            return
        if (self._current_next_entry_id >= self.config.ledger_entries_max
                or info.size_bytes >= self.config.ledger_size_bytes_max
                or age_ms >= self.config.ledger_age_ms_max):
            self._retire_current()
            self._open_new_ledger()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each confirmed entry (on the confirming thread, before the
        publisher hears back; it must only schedule work)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # --- positions and offsets -------------------------------------------------------------
    @property
    def last_confirmed(self) -> Position:
        return self._last_confirmed

    @property
    def next_offset(self) -> int:
        """The offset the next published message will get."""
        return self._next_offset

    @property
    def first_offset(self) -> int:
        """The lowest offset still stored (after trimming); with nothing confirmed yet, the
        first offset the current ledger gives out (never counting adds still in flight)."""
        infos = self._infos
        for info in infos:
            if info.entries > 0:
                return info.first_offset
        return infos[-1].first_offset if infos else self._next_offset

    def confirmed_next_offset(self) -> int:
        """One past the last confirmed offset."""
        for info in reversed(self._infos):
            if info.entries > 0:
                return info.next_offset
        return self.first_offset

    def ledger_infos(self) -> list[LedgerInfo]:
        return list(self._infos)

    def first_position(self) -> Position:
        for info in self._infos:
            if info.entries > 0:
                return Position(info.ledger_id, 0)
        return self.next_position(self._last_confirmed)

    def next_position(self, position: Position) -> Position:
        """The position after ``position`` (crossing to the next ledger at a ledger's end)."""
        for info in self._infos:
            if info.ledger_id < position.ledger_id:
                continue
            if info.ledger_id == position.ledger_id and position.entry_id + 1 < info.entries:
                return Position(info.ledger_id, position.entry_id + 1)
            if info.ledger_id > position.ledger_id and info.entries > 0:
                return Position(info.ledger_id, 0)
        current = self._infos[-1].ledger_id if self._infos else position.ledger_id
        if position.ledger_id == current:
            return Position(current, position.entry_id + 1)
        return Position(current, self._infos[-1].entries if self._infos else 0)

    def _info(self, ledger_id: int) -> LedgerInfo:
        ids = [i.ledger_id for i in self._infos]
        at = bisect.bisect_left(ids, ledger_id)
        if at == len(ids) or ids[at] != ledger_id:
            raise NoSuchEntry(f"ledger {ledger_id} is not part of {self.display_name}")
        return self._infos[at]

    def offset_to_position(self, offset: int) -> tuple[Position, int]:
        """The position of the entry holding ``offset`` and the message's index in it.

        A reader that goes on where its last read stopped asks for the first offset of the entry
        after the last one it read: every read remembers that position (bounded by
        ``POSITION_HINTS_MAX``), so such a lookup reads nothing. Other offsets are found through
        the sparse index, reading forward from its sample."""
        if offset < self.first_offset:
            raise DataLost(f"offset {offset} of {self.display_name} was trimmed; the first offset is "
                           f"{self.first_offset}")
        if offset >= self.confirmed_next_offset():
            raise NoSuchEntry(f"offset {offset} of {self.display_name} is not written yet")
        hinted = self._position_hints.get(offset)
        if hinted is not None:  # entries never change, and a trimmed offset was refused above
            return hinted, 0
        info = ledger_holding(self._infos, offset)
        for entry in self._read_ledger_range(info, info.start_for_offset(offset), info.entries - 1,
                                             stop_after_offset=offset):
            if entry.first_offset <= offset <= entry.last_offset:
                return entry.position, offset - entry.first_offset
        raise NoSuchEntry(f"offset {offset} not found in ledger {info.ledger_id} of {self.display_name}")

    def time_to_offset(self, publish_time_ms: int) -> int:
        """The first offset whose publish time is ``>= publish_time_ms`` (next_offset if none)."""
        for info in self._infos:
            if info.entries == 0 or info.last_publish_ms < publish_time_ms:
                continue
            for entry in self._read_ledger_range(info, info.start_for_time(publish_time_ms), info.entries - 1):
                if entry.publish_time_ms >= publish_time_ms:
                    return entry.first_offset
        return self.confirmed_next_offset()

    # --- reading -------------------------------------------------------------------------
    def read_entry(self, position: Position) -> Entry:
        entries = self.read_entries(position, 1)
        if not entries or entries[0].position != position:
            raise NoSuchEntry(f"no entry at {position} in {self.display_name}")
        return entries[0]

    def read_entries(self, start: Position, max_entries: int, *, max_bytes: int = 5 * MiB) -> list[Entry]:
        """Up to ``max_entries`` confirmed entries from ``start`` on, across ledgers."""
        result: list[Entry] = []
        size = 0
        for info in list(self._infos):
            if info.ledger_id < start.ledger_id or info.entries == 0:
                continue
            first = start.entry_id if info.ledger_id == start.ledger_id else 0
            last = min(info.entries - 1, first + max_entries - len(result) - 1)
            if first > last:
                continue
            for entry in self._read_ledger_range(info, first, last, max_bytes=max_bytes - size):
                result.append(entry)
                size += len(entry.data)
            if size >= max_bytes:
                return result
            if len(result) >= max_entries:
                break
        return result

    def _handle_for(self, ledger_id: int) -> LedgerHandle:
        if self._current is not None and self._current.ledger_id == ledger_id:
            return self._current
        handle = self._read_handles.get(ledger_id)
        if handle is None:
            handle = self._ledgers.open(ledger_id, recovery=False)
            if len(self._read_handles) >= READ_HANDLES_MAX:
                self._read_handles.pop(next(iter(self._read_handles)))
            self._read_handles[ledger_id] = handle
        return handle

    def _read_ledger_range(self, info: LedgerInfo, first: int, last: int, *,
                           stop_after_offset: int | None = None, max_bytes: int | None = None) -> list[Entry]:
        """Entries ``first..last`` of one ledger (fewer when ``max_bytes`` or ``stop_after_offset``
        ends the range early): from the broker's cache where it has them, the rest through the
        ledger's range read, a run of at most ``READ_RUN_ENTRIES_MAX`` (fewer when the ledger's
        average entry would pass ``max_bytes`` or ``READ_RUN_BYTES_MAX``) at a time. Every entry
        after the first is remembered as where the offset after its predecessor lives, and so is
        the entry after the last one read."""
        handle = self._handle_for(info.ledger_id)
        entries: list[Entry] = []
        size = 0
        entry_id = first
        while entry_id <= last:
            if max_bytes is not None and size >= max_bytes:
                break
            known_first = entries[-1].last_offset + 1 if entries else None
            cached = self._cache.get(info.ledger_id, entry_id)
            bytes_left = None if max_bytes is None else max_bytes - size
            run = [Entry(Position(info.ledger_id, entry_id), *cached)] if cached is not None else \
                self._read_run(handle, info, entry_id, last, known_first, bytes_left)
            for entry in run:
                entries.append(entry)
                size += len(entry.data)
                entry_id += 1
                if stop_after_offset is not None and entry.last_offset >= stop_after_offset:
                    entry_id = last + 1
                    break
        if entries:
            self._position_hints.remember(info, entries)
        return entries

    def _read_run(self, handle: LedgerHandle, info: LedgerInfo, first: int, last: int, first_offset: int | None,
                  bytes_left: int | None) -> list[Entry]:
        """Entries from ``first`` on, read from the bookies in one range read. ``first_offset``,
        when the caller knows it, spares parsing the first entry's ``MessageMetadata``; every
        later entry's first offset follows from the one before (offsets have no gaps)."""
        count = min(last - first + 1, READ_RUN_ENTRIES_MAX)
        if info.entries:
            average = max(1, info.size_bytes // info.entries)
            run_bytes = READ_RUN_BYTES_MAX if bytes_left is None else min(bytes_left, READ_RUN_BYTES_MAX)
            count = max(1, min(count, -(-run_bytes // average)))
        run: list[Entry] = []
        for entry_id, data in enumerate(handle.read(first, first + count - 1), start=first):
            meta = peek_broker_entry_metadata(data)
            assert meta is not None
            if first_offset is None:
                first_offset = meta.index - message_count(data) + 1
            run.append(Entry(Position(info.ledger_id, entry_id), data, first_offset, meta.index,
                             meta.broker_timestamp_ms))
            first_offset = meta.index + 1
        return run

    def wait_for_entries(self, after: Position, timeout_s: float) -> bool:
        """Block until an entry after ``after`` is confirmed (tailing reads); False on timeout."""
        with self._confirmed:
            return self._confirmed.wait_for(lambda: self._last_confirmed > after, timeout_s)

    # --- trimming ------------------------------------------------------------------------
    def trim(self) -> list[int]:
        """Delete ledgers every durable cursor has consumed, as far as retention allows (and
        the empty ledgers already dropped from the list)."""
        with self._lock:
            if self._closed or self._taken_over:  # no longer served here: the list is not this writer's to change
                return []
            slowest = min(self.cursor_positions(), default=self._next_offset)
            deletable = deletable_ledgers(self._infos, slowest, self._now_ms(),
                                          time_limit_ms=self.config.retention_time_ms,
                                          size_limit_bytes=self.config.retention_size_bytes)
            if deletable:
                self._infos = self._infos[len(deletable):]
                self._pending_deletes.extend(i.ledger_id for i in deletable)
                self._save()  # the list and the pending deletions change together
            saved = list(self._pending_deletes) if deletable else None
            pending = bool(self._pending_deletes)
        for info in deletable:
            self._read_handles.pop(info.ledger_id, None)
            self._cache.invalidate_ledger(info.ledger_id)
        if pending:
            self._delete_pending(saved=saved)
        return [i.ledger_id for i in deletable]

    def _delete_pending(self, *, saved: list[int] | None = None) -> None:
        """Delete ledgers dropped from the list (idempotent: a crash midway retries on open),
        once a saved list no longer names them: a stored list never names a deleted ledger.
        ``saved``: the pending deletions as the caller has just saved them (no second save
        when nothing was added since)."""
        with self._lock:
            pending = list(self._pending_deletes)
            if not pending:
                return
            if pending != saved:
                self._save()
        for ledger_id in pending:
            with contextlib.suppress(NotFound):
                self._ledgers.delete(ledger_id)
            with contextlib.suppress(NotFound):
                self._store.delete(self._samples.path(ledger_id))
        with self._lock:
            self._pending_deletes = [i for i in self._pending_deletes if i not in pending]
            self._save()

    def expired_offset(self) -> int | None:
        """With a TTL: the first offset that is not yet expired (cursors move past older ones)."""
        cutoff_ms = expiry_cutoff_ms(self._now_ms(), self.config.message_ttl_ms)
        return None if cutoff_ms is None else self.time_to_offset(cutoff_ms)

    def delete(self) -> None:
        with self._lock:
            self._refuse_if_taken_over()  # its ledgers and list are another broker's now
            self._closed = True  # no append may open a ledger for the deleted topic
            if self._current is not None:
                self._retire_current()
            for info in self._infos:
                self._ledgers.delete(info.ledger_id)
            self._infos = []
            self._store.delete_recursive(self._path)

    def messages_per_entry(self) -> int:
        """Messages per stored entry on average (at least 1): entries a reader needs per message."""
        entries = sum(i.entries for i in self._infos)
        return max(1, (self._next_offset - self.first_offset) // max(1, entries))

    def statistics(self) -> ManagedLedgerStats:
        infos = self._infos
        current = infos[-1] if infos else None
        return ManagedLedgerStats(
            name=self.name, ledgers=len(infos), entries_added=self._entries_added, bytes_added=self._bytes_added,
            messages_added=self._messages_added, number_of_entries=sum(i.entries for i in infos),
            total_size_bytes=sum(i.size_bytes for i in infos),
            current_ledger_entries=current.entries if current else 0,
            current_ledger_size_bytes=current.size_bytes if current else 0,
            next_offset=self._next_offset, first_offset=self.first_offset, last_confirmed=self._last_confirmed,
            terminated=self._terminated)


class ManagedLedgerFactory:
    """Opens managed ledgers by name; owns the shared entry cache."""

    def __init__(self, store: MetadataStore, ledgers: LedgerManager, cache: EntryCache,
                 clock: Callable[[], float] = time.time, *, publish_buffer: ByteBudget | None = None) -> None:
        self.store = store
        self.ledgers = ledgers
        self.cache = cache
        self.clock = clock
        self.publish_buffer = publish_buffer
        """Counts the bytes of every append until it is stored (``maxMessagePublishBufferSizeInMB``)."""
        self._open: dict[str, ManagedLedger] = {}
        self._lock = threading.Lock()
        self._appends_fenced = 0
        self._counters_lock = threading.Lock()

    @property
    def appends_fenced(self) -> int:
        """Appends (add calls) of this broker's managed ledgers that failed because another
        broker recovered the topic (fenced its ledger, or rewrote its ledger list): each one was
        refused, never acknowledged."""
        return self._appends_fenced

    def count_fenced_append(self) -> None:
        with self._counters_lock:
            self._appends_fenced += 1

    def open(self, name: str, config: ManagedLedgerConfig | None = None) -> ManagedLedger:
        """The managed ledger ``name``, loaded on first use. Only a fully loaded one is kept:
        a load that fails leaves nothing behind, so the next call loads afresh."""
        with self._lock:
            ml = self._open.get(name)
            if ml is None:
                ml = self._load(name, config or ManagedLedgerConfig())
                self._open[name] = ml
            return ml

    def _load(self, name: str, config: ManagedLedgerConfig) -> ManagedLedger:
        """Load ``name`` anew up to ``LOAD_ATTEMPTS`` times while another writer changes its
        ledger list meanwhile (``BadVersion``, ``LedgerFenced``); then ``ServiceUnitNotReady``
        (retriable: the caller looks the topic up and tries again). Other errors propagate."""
        failure: MagnetarError | None = None
        for _ in range(LOAD_ATTEMPTS):
            ml = ManagedLedger(self, name, config)
            try:
                ml._load()
                return ml
            except (BadVersion, LedgerFenced) as exc:  # another writer changed the list meanwhile: read it again
                ml.abandon()
                failure = exc
        raise ServiceUnitNotReady(
            f"topic {display_name(name)} could not be loaded: its ledger list changed during each of "
            f"{LOAD_ATTEMPTS} attempts (another broker is loading it); retry") from failure

    def exists(self, name: str) -> bool:
        return self.store.exists(f"{ML_ROOT}/{name}")

    def close_all(self) -> None:
        with self._lock:
            for ml in self._open.values():
                ml.close()
            self._open.clear()

    def forget(self, name: str) -> None:
        with self._lock:
            self._open.pop(name, None)
