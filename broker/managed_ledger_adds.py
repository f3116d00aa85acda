"""The add path of a managed ledger: stamping entries with their offsets, sending them to the
current ledger, and accounting them once the bookies answer (Pulsar's ``OpAddEntry``).

Role: ``ManagedLedger`` (``broker/managed_ledger.py``) is built on ``ManagedLedgerAdds``.
``append(payloads, message_counts)`` stamps each entry of a group with Pulsar's
BrokerEntryMetadata (broker timestamp, ``index`` = offset of the entry's last message) and
appends the group to the current ledger in one call (a single entry is a group of one), after
any rollover due. When the ledger answers, the group is confirmed (counted, put in the broker's
``EntryCache``, listeners told) or failed (the next append continues in a new ledger; after a
fence, none goes on: another broker serves the topic). Every append's bytes count in the
broker's publish buffer (``broker/byte_budget.py``) from the moment it is sent until it is
stored or failed.

Invariants: offsets are gap-free and increasing; they are assigned, and the entries sent, under
the managed ledger's lock, so a group's entries are consecutive in one ledger. Every add sent
is accounted exactly once (``_in_flight``, under ``_confirmed``), confirmed or failed, so a
ledger being closed waits for all of them. All are accepted or none: a refusal raises before
anything is written. The state is the managed ledger's (declared here, set by its constructor).
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import NamedTuple

from broker.bookkeeper.ledger_handle import LedgerHandle
from broker.byte_budget import ByteBudget
from broker.entry import Entry
from broker.entry_cache import EntryCache
from broker.entry_format import with_broker_entry_metadata_each
from broker.errors import InvalidRequest, LedgerFenced, MagnetarError, MessageTooLarge, OffsetMismatch
from broker.ledger_list import LedgerList
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.message_id import Position
from broker.offset_index import LedgerInfo
from storage import new_future

log = logging.getLogger(__name__)


class AddResult(NamedTuple):
    position: Position
    first_offset: int
    last_offset: int
    publish_time_ms: int


class ManagedLedgerAdds(ABC):
    """The add path; ``ManagedLedger`` sets the state and the ledger lifecycle it declares."""

    config: ManagedLedgerConfig
    display_name: str
    _lock: threading.RLock
    _confirmed: threading.Condition
    _list: LedgerList
    _current: LedgerHandle | None
    _current_next_entry_id: int
    _next_offset: int
    _last_publish_ms: int
    _last_confirmed: Position
    _in_flight: int
    _failure: MagnetarError | None
    _taken_over: bool
    _entries_added: int
    _bytes_added: int
    _messages_added: int
    _cache: EntryCache
    _publish_buffer: ByteBudget | None
    _listeners: list[Callable[[], None]]
    _count_fenced_append: Callable[[], None]

    @abstractmethod
    def _check_writable(self) -> None:
        """Refuse (closed, terminated, taken over) or get a current ledger ready."""

    @abstractmethod
    def _maybe_roll_over(self, incoming_entries: int) -> None:
        """Retire the current ledger and open the next, when one of its bounds is reached or
        ``incoming_entries`` (one append, never split across ledgers) would pass its entry bound."""

    @abstractmethod
    def _now_ms(self) -> int: ...

    @abstractmethod
    def _sample(self, info: LedgerInfo, entry_id: int, first_offset: int, publish_ms: int, size_bytes: int) -> None:
        """Account an entry into the ledger's sparse offset index."""

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
                self._count_fenced_append()
                raise

    def _append_locked(self, payloads: Sequence[bytes], message_counts: Sequence[int], expected_offset: int | None,
                       on_offsets: Sequence[Callable[[int], None] | None] | None,
                       ) -> tuple[Future[int], LedgerInfo, list[bytes], list[AddResult]]:
        self._check_writable()
        self._maybe_roll_over(len(payloads))
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
        info = self._list.infos[-1]
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
            self._count_fenced_append()
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
            insert(Entry(add.position, data, add.first_offset, add.last_offset, add.publish_time_ms))
        for listener in list(self._listeners):
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each confirmed entry (on the confirming thread, before the
        publisher hears back; it must only schedule work)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
