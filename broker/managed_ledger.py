"""ManagedLedger: one topic partition as an ordered list of ledgers, with gap-free offsets.

Role: the library below the broker (Pulsar's ``ManagedLedgerImpl``): topics append to it, and
cursors, readers and dispatch read from it. Its parts, each in its own module:

- the add path (``broker/managed_ledger_adds.py``): stamping entries with their offsets,
  sending a group to the current ledger in one call, confirming or failing it;
- the ledger list (``broker/ledger_list.py``): the ledgers, stored at ``/managed-ledgers/{name}``
  by compare-and-set on every change, with the managed ledger's properties (its incarnation,
  the topic's producer epoch: ``property_value``, ``set_property``);
- reads (``broker/managed_ledger_reads.py``): from the entry cache, else by range reads;
- opening by name (``broker/managed_ledger_factory.py``) and the settings
  (``broker/managed_ledger_config.py``).

This module keeps the ledgers' lifecycle. The current ledger rolls over when it holds
``ledger_entries_max`` entries, ``ledger_size_bytes_max`` bytes or is ``ledger_age_ms_max`` old
(never before ``ledger_age_ms_min``, never when empty), and before a group of entries (one
append, never split) that would pass ``ledger_entries_max``, so a ledger holds at most that many
entries unless one group alone is larger; a new ledger takes appends only once
the list naming it is saved. After a crash the last ledger is recovered (fenced and closed at
its last durable entry) and a new one is opened. After a failed add the next append continues
in a new ledger; once another broker recovered the topic (fenced its ledger, or rewrote its
list), nothing more is written. Closed ledgers may be offloaded to an object store
(``broker/managed_ledger_offload.py``) and are then read from it. Offsets and times are found
through the sparse index of ``broker/offset_index.py`` (bisect the ledgers, then their samples,
then read forward a bounded number of entries); trimming and TTL follow ``broker/retention.py``;
deleted ledgers go to the bookies' GC, and their offloaded copies are deleted from the store.

Invariant: no state lives only in memory; the ledger list and cursor snapshots are in the
metadata store, entries and cursor positions in ledgers. Messages name the topic as users spell
it (``persistent://tenant/ns/topic``).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from broker.bookkeeper.ledger_handle import LedgerHandle
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.byte_budget import ByteBudget
from broker.entry import Entry
from broker.entry_cache import EntryCache
from broker.entry_format import message_count, peek_broker_entry_metadata
from broker.errors import (
    BadVersion,
    DataLost,
    InvalidRequest,
    LedgerFenced,
    MagnetarError,
    NoSuchEntry,
    NotFound,
    ServiceUnitNotReady,
    TopicTerminated,
)
from broker.ledger_list import LedgerList
from broker.limits import CLOSE_ADDS_WAIT_S
from broker.managed_ledger_adds import ManagedLedgerAdds
from broker.managed_ledger_config import ManagedLedgerConfig, MiB
from broker.managed_ledger_offload import NOT_RUN, ManagedLedgerOffload, OffloadCounters
from broker.managed_ledger_reads import LedgerReads
from broker.message_id import Position
from broker.metadata.store import MetadataStore
from broker.offload.offloader import LedgerOffloader
from broker.offload.orphans import record_orphaned_copies
from broker.offset_index import LedgerInfo, SampleStore, ledger_holding
from broker.retention import deletable_ledgers, expiry_cutoff_ms
from broker.topic_name import display_name

ML_ROOT = "/managed-ledgers"
INCARNATION_PROPERTY = "magnetar.incarnation"
"""The property naming a managed ledger's incarnation: made once, when it is first created, so
what derives from one incarnation of a topic (its key index) is never taken for another's."""
EARLIEST = Position(-1, -1)


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


class ManagedLedgerServices(Protocol):
    """What a managed ledger uses of the factory that opens it (``broker/managed_ledger_factory.py``)."""

    store: MetadataStore
    ledgers: LedgerManager
    cache: EntryCache
    clock: Callable[[], float]
    publish_buffer: ByteBudget | None
    offloader: LedgerOffloader | None

    def count_fenced_append(self) -> None: ...


class ManagedLedger(ManagedLedgerAdds, ManagedLedgerOffload):
    """Open through :meth:`ManagedLedgerFactory.open`."""

    def __init__(self, factory: ManagedLedgerServices, name: str, config: ManagedLedgerConfig) -> None:
        self.name = name
        self.config = config
        self._count_fenced_append = factory.count_fenced_append
        self._ledgers = factory.ledgers
        self._store = factory.store
        self._cache = factory.cache
        self._publish_buffer = factory.publish_buffer
        self._clock = factory.clock
        self._path = f"{ML_ROOT}/{name}"
        self._lock = threading.RLock()
        self._confirmed = threading.Condition()
        self._list = LedgerList(self._store, self._path)
        self._current: LedgerHandle | None = None
        self._current_next_entry_id = 0
        self._next_offset = 0
        self._last_publish_ms = 0
        self._last_confirmed = EARLIEST
        self._failure: MagnetarError | None = None
        self._closed = False
        """Closed or abandoned by this broker (its bundle went elsewhere): no more appends."""
        self._taken_over = False
        """Another broker recovered the topic (fenced its current ledger, or changed the stored
        ledger list under this one): no more appends, and nothing more written for them."""
        self._offloader = factory.offloader
        self._offload_status, self._offload_error, self._offload_failed_ms = NOT_RUN, "", 0
        self._offload_thread: threading.Thread | None = None
        self.offload_counters = OffloadCounters()
        self._reads = LedgerReads(self._ledgers, self._cache, lambda: self._current, self._offloader)
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
        self._list.load()
        if INCARNATION_PROPERTY not in self._list.properties:  # a new topic (or one from before incarnations)
            self._list.properties[INCARNATION_PROPERTY] = uuid.uuid4().hex
            self._list.save()
        for info in self._list.infos[:-1]:
            info.sparse_index = self._samples.load(info.ledger_id)
        if self._list.infos and self._list.infos[-1].closed_ms == 0:
            self._recover_last_ledger()
        elif self._list.infos:
            self._list.infos[-1].sparse_index = self._samples.load(self._list.infos[-1].ledger_id)
        self._reset_tail_state()
        if not self._list.terminated:
            self._open_new_ledger()
        else:
            self._list.save()
        self._cleanup_offload_on_open()
        self._delete_pending(saved=list(self._list.pending_deletes))

    def _reset_tail_state(self) -> None:
        """Continue from the confirmed end: offsets of adds that never confirmed are reused."""
        confirmed = [i for i in self._list.infos if i.entries > 0]
        if confirmed:
            last = confirmed[-1]
            self._next_offset = last.next_offset
            self._last_publish_ms = max(self._last_publish_ms, last.last_publish_ms)
            self._last_confirmed = Position(last.ledger_id, last.entries - 1)
        else:
            infos = self._list.infos
            self._next_offset = max(self._list.offset_floor, infos[0].first_offset if infos else 0)

    def _recover_last_ledger(self) -> None:
        info = self._list.infos[-1]
        handle = self._ledgers.open(info.ledger_id, recovery=True)
        info.entries = handle.last_add_confirmed + 1
        info.size_bytes = handle.length_bytes
        info.closed_ms = self._now_ms()
        info.sparse_index, info.messages, info.unsampled_bytes = [], 0, 0
        for entry_id in range(info.entries):
            self._index_entry(info, entry_id, handle.read_entry(entry_id))
        if info.entries == 0:  # dropped from the list; deleted once a list without it is saved
            self._list.infos.pop()
            self._list.pending_deletes.append(info.ledger_id)
        else:
            self._samples.save(info)
            self._reads.keep(handle)

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
        self._list.infos.append(info)
        try:
            self._list.save()
        except BaseException as exc:
            self._list.infos.pop()
            if not isinstance(exc, BadVersion):
                raise  # the save may have been applied: the next save finds out
            self._taken_over = True
            with contextlib.suppress(MagnetarError):  # a failed delete leaves it behind, empty and unlisted
                self._ledgers.delete(handle.ledger_id)
            raise LedgerFenced(f"the ledger list of {self.display_name} was changed by another writer: "
                               "another broker serves the topic") from exc
        self._current, self._current_next_entry_id = handle, 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._current is not None and not self._taken_over:
                self._close_current()
                if not self._taken_over:
                    self._list.save()

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
            self._confirmed.wait_for(lambda: self._in_flight == 0, CLOSE_ADDS_WAIT_S)
        if self._taken_over:
            return  # its samples and the list are the new owner's to write
        info = self._list.infos[-1]
        info.closed_ms = self._now_ms()
        info.drop_samples_past_end()
        if info.entries == 0:  # an empty ledger never stays in the list: deleted once it is out of it
            self._list.infos.pop()
            self._list.pending_deletes.append(handle.ledger_id)
        else:
            self._samples.save(info)
            self._reads.keep(handle)
        self._reset_tail_state()

    def terminate(self) -> Position:
        """No more writes, ever; returns the last position."""
        with self._lock:
            self._refuse_if_taken_over()
            if self._current is not None:
                self._retire_current()
            self._list.terminated = True
            self._list.save()
            return self._last_confirmed

    @property
    def terminated(self) -> bool:
        return self._list.terminated

    @property
    def incarnation(self) -> str:
        """Made when this managed ledger was first created (a deleted and recreated topic has another)."""
        return self._list.properties[INCARNATION_PROPERTY]

    def property_value(self, key: str) -> str | None:
        """A property stored with the ledger list (Pulsar's managed-ledger properties)."""
        with self._lock:
            return self._list.properties.get(key)

    def set_property(self, key: str, value: str) -> None:
        """Store ``value`` under ``key`` with the ledger list: durable when this returns (a
        failed store leaves the property as it was)."""
        with self._lock:
            before = self._list.properties.get(key)
            self._list.properties[key] = value
            try:
                self._list.save()
            except BaseException:
                if before is None:
                    del self._list.properties[key]
                else:
                    self._list.properties[key] = before
                raise

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
        if self._list.terminated:
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

    def _maybe_roll_over(self, incoming_entries: int) -> None:
        info = self._list.infos[-1]
        age_ms = self._now_ms() - info.created_ms
        if self._current_next_entry_id == 0 or age_ms < self.config.ledger_age_ms_min:
            return
        if (self._current_next_entry_id + incoming_entries > self.config.ledger_entries_max
                or info.size_bytes >= self.config.ledger_size_bytes_max
                or age_ms >= self.config.ledger_age_ms_max):
            self._retire_current()
            self._open_new_ledger()

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
        infos = self._list.infos
        for info in infos:
            if info.entries > 0:
                return info.first_offset
        return infos[-1].first_offset if infos else self._next_offset

    def confirmed_next_offset(self) -> int:
        """One past the last confirmed offset."""
        for info in reversed(self._list.infos):
            if info.entries > 0:
                return info.next_offset
        return self.first_offset

    def ledger_infos(self) -> list[LedgerInfo]:
        return list(self._list.infos)

    def first_position(self) -> Position:
        for info in self._list.infos:
            if info.entries > 0:
                return Position(info.ledger_id, 0)
        return self.next_position(self._last_confirmed)

    def next_position(self, position: Position) -> Position:
        """The position after ``position`` (crossing to the next ledger at a ledger's end)."""
        for info in self._list.infos:
            if info.ledger_id < position.ledger_id:
                continue
            if info.ledger_id == position.ledger_id and position.entry_id + 1 < info.entries:
                return Position(info.ledger_id, position.entry_id + 1)
            if info.ledger_id > position.ledger_id and info.entries > 0:
                return Position(info.ledger_id, 0)
        current = self._list.infos[-1].ledger_id if self._list.infos else position.ledger_id
        if position.ledger_id == current:
            return Position(current, position.entry_id + 1)
        return Position(current, self._list.infos[-1].entries if self._list.infos else 0)

    def offset_to_position(self, offset: int) -> tuple[Position, int]:
        """The position of the entry holding ``offset`` and the message's index in it.

        A reader that goes on where its last read stopped asks for the first offset of the entry
        after the last one it read: every read remembers that position and those of the entries
        it held (``PositionHints``, bounded), so such a lookup reads nothing, nor does one of an
        entry a recent read held. Other offsets are found through the sparse index, reading
        forward from its sample."""
        if offset < self.first_offset:
            raise DataLost(f"offset {offset} of {self.display_name} was trimmed; the first offset is "
                           f"{self.first_offset}")
        if offset >= self.confirmed_next_offset():
            raise NoSuchEntry(f"offset {offset} of {self.display_name} is not written yet")
        hinted = self._reads.hints.get(offset)
        if hinted is not None:  # entries never change, and a trimmed offset was refused above
            return hinted, 0
        info = ledger_holding(self._list.infos, offset)
        for entry in self._reads.read_range(info, info.start_for_offset(offset), info.entries - 1,
                                             stop_after_offset=offset):
            if entry.first_offset <= offset <= entry.last_offset:
                return entry.position, offset - entry.first_offset
        raise NoSuchEntry(f"offset {offset} not found in ledger {info.ledger_id} of {self.display_name}")

    def time_to_offset(self, publish_time_ms: int) -> int:
        """The first offset whose publish time is ``>= publish_time_ms`` (next_offset if none)."""
        for info in self._list.infos:
            if info.entries == 0 or info.last_publish_ms < publish_time_ms:
                continue
            for entry in self._reads.read_range(info, info.start_for_time(publish_time_ms), info.entries - 1):
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
        return self._reads.read_entries(self._list.infos, start, max_entries, max_bytes=max_bytes)

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
            deletable = deletable_ledgers(self._list.infos, slowest, self._now_ms(),
                                          time_limit_ms=self.config.retention_time_ms,
                                          size_limit_bytes=self.config.retention_size_bytes)
            if deletable:
                self._list.infos = self._list.infos[len(deletable):]
                self._list.pending_deletes.extend(i.ledger_id for i in deletable)
                self._list.pending_offload_deletes.extend(
                    (i.ledger_id, i.offload_context) for i in deletable if i.offload_context is not None)
                self._list.save()  # the list and the pending deletions change together
            saved = list(self._list.pending_deletes) if deletable else None
            pending = bool(self._list.pending_deletes or self._list.pending_offload_deletes)
        for info in deletable:
            self._reads.forget(info.ledger_id)
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
            pending = list(self._list.pending_deletes)
            copies = list(self._list.pending_offload_deletes) if self._offloader is not None else []
            if not pending and not copies:
                return
            if pending and pending != saved:
                self._list.save()
        for ledger_id in pending:
            with contextlib.suppress(NotFound):
                self._ledgers.delete(ledger_id)
            with contextlib.suppress(NotFound):
                self._store.delete(self._samples.path(ledger_id))
        deleted = [(ledger_id, context) for ledger_id, context in copies if self._delete_copy(ledger_id, context)]
        if not pending and not deleted:
            return
        with self._lock:  # a copy the store did not delete stays pending: the next trim or open tries again
            self._list.pending_deletes = [i for i in self._list.pending_deletes if i not in pending]
            self._list.pending_offload_deletes = [c for c in self._list.pending_offload_deletes if c not in deleted]
            self._list.save()

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
            for info in self._list.infos:
                self._ledgers.delete(info.ledger_id)  # a no-op for a ledger deleted locally after its offload
            copies = [(i.ledger_id, i.offload_context) for i in self._list.infos if i.offload_context is not None]
            copies += self._list.pending_offload_deletes
            # a copy the store does not delete now is named where it outlives the topic's metadata
            record_orphaned_copies(self._store, self.name, [(ledger_id, context) for ledger_id, context in copies
                                                             if not self._delete_copy(ledger_id, context)])
            self._list.infos = []
            self._store.delete_recursive(self._path)

    def messages_per_entry(self) -> int:
        """Messages per stored entry on average (at least 1): entries a reader needs per message."""
        entries = sum(i.entries for i in self._list.infos)
        return max(1, (self._next_offset - self.first_offset) // max(1, entries))

    def statistics(self) -> ManagedLedgerStats:
        infos = self._list.infos
        current = infos[-1] if infos else None
        return ManagedLedgerStats(
            name=self.name, ledgers=len(infos), entries_added=self._entries_added, bytes_added=self._bytes_added,
            messages_added=self._messages_added, number_of_entries=sum(i.entries for i in infos),
            total_size_bytes=sum(i.size_bytes for i in infos),
            current_ledger_entries=current.entries if current else 0,
            current_ledger_size_bytes=current.size_bytes if current else 0,
            next_offset=self._next_offset, first_offset=self.first_offset, last_confirmed=self._last_confirmed,
            terminated=self._list.terminated)
