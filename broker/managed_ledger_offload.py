"""The offload of a managed ledger's closed ledgers to an object store (Pulsar's
``ManagedLedgerImpl.offloadLoop``).

Role: ``ManagedLedger`` (``broker/managed_ledger.py``) is built on ``ManagedLedgerOffload``. An
offload copies closed ledgers (never the current one), oldest first, through the broker's
``LedgerOffloader`` (``broker/offload/offloader.py``): up to a position (the admin call,
``offload_prefix``), or while the topic's ledgers hold more than ``offload_threshold_bytes``
or are older than ``offload_threshold_seconds`` (``offload_by_threshold``, from the broker's
maintenance pass; after a failed offload, not again before ``OFFLOAD_RETRY_DELAY_MS``). One
offload runs at a time per managed ledger, in its own thread: appends and reads never wait for
the store. Each ledger goes through four steps, each saved in its
``LedgerInfo.offload_context`` in the ledger list (compare-and-set):

1. a new attempt ``OffloadContext(uuid, complete=False)`` is saved (Pulsar's
   ``prepareLedgerInfoForOffloaded``);
2. the ledger is copied under that ``uuid``, outside the managed ledger's lock;
3. ``complete=True`` is saved (``completeLedgerInfoForOffloaded``); from then on the ledger is
   read from the store. On failure the attempt's objects are deleted and its context cleared;
   the status says ERROR and why;
4. ``offload_deletion_lag_ms`` after it completed, ``bookkeeper_deleted=True`` is saved, and
   only then is the ledger deleted from the bookies (``delete_offloaded_locally``).

Invariants (crash safety, each step being one save): a reader trusts a copy only once its
``complete=True`` is saved, which follows the end of its upload; an attempt found incomplete on
open (a crash during step 2, or before step 3's save) has its objects deleted and its context
cleared, so the next offload starts anew under another ``uuid`` (``_cleanup_offload_on_open``);
the bookies' copy is deleted only after the list says so, and a list that says so has the
deletion retried on open (idempotent), so a stored list never calls a ledger local whose
bookie copy may be gone. A copy whose ``complete`` save lost its compare-and-set (another broker
took the topic meanwhile) or whose ledger was trimmed meanwhile is deleted: it is recorded
nowhere. A save that failed without an answer deletes nothing (it may have been applied; the
next owner's open settles it). A ledger that leaves the list (trimming, topic deletion) has its
offloaded copy deleted as well (``LedgerList.pending_offload_deletes``). ``CRASH_POINT_ENV``
lets the kill -9 tests stop the broker between the steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from broker.bookkeeper.ledger_manager import LedgerManager
from broker.errors import AlreadyExists, BadVersion, InvalidRequest, MagnetarError
from broker.ledger_list import LedgerList
from broker.limits import OFFLOAD_RETRY_DELAY_MS
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.managed_ledger_reads import LedgerReads
from broker.message_id import Position
from broker.metadata.store import MetadataStore
from broker.offload.offloader import LedgerOffloader, OffloadContext, OffloadError, ReadHandle
from broker.offload.orphans import record_orphaned_copies
from broker.offset_index import LedgerInfo

log = logging.getLogger(__name__)

NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"
CRASH_POINT_ENV = "MAGNETAR_OFFLOAD_CRASH_AT"
"""Fault injection for the kill -9 tests (``tests/crash/test_offload_kill9.py``): the broker
SIGKILLs itself at the named step (``before-upload``, ``during-upload``, ``after-upload``,
``during-local-delete``)."""


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_POINT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class _CheckedSource:
    """The source of an upload with a check before each read: the check raises to stop the
    upload (``_refuse_if_not_serving``: the topic is no longer served here, so a large ledger is
    not copied on for a copy that will be deleted anyway), or is the ``during-upload`` fault
    point (``_crash_after_first_read``)."""

    def __init__(self, source: ReadHandle, before_read: Callable[[], None]) -> None:
        self._source = source
        self._before_read = before_read
        self.ledger_id = source.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._source.last_add_confirmed

    @property
    def length_bytes(self) -> int:
        return self._source.length_bytes

    def read(self, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        self._before_read()
        return self._source.read(first_entry_id, last_entry_id)


def _crash_after_first_read() -> Callable[[], None]:
    """The ``during-upload`` fault point: SIGKILL the broker once the store holds part of the
    copy (at the second read of the source)."""
    reads = [0]

    def before_read() -> None:
        reads[0] += 1
        if reads[0] > 1:
            _crash_point("during-upload")

    return before_read


@dataclass(frozen=True)
class OffloadStatus:
    """Pulsar's ``OffloadProcessStatus`` of one topic."""

    status: str
    last_error: str
    first_unoffloaded: Position

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "lastError": self.last_error,
                "firstUnoffloadedMessage": {"ledgerId": self.first_unoffloaded.ledger_id,
                                            "entryId": self.first_unoffloaded.entry_id, "partitionIndex": -1}}


@dataclass
class OffloadCounters:
    """What this managed ledger's offloads did since it was loaded."""

    ledgers_offloaded: int = 0
    bytes_offloaded: int = 0
    errors: int = 0
    local_deleted: int = 0


def threshold_candidates(infos: Sequence[LedgerInfo], now_ms: int, *, threshold_bytes: int,
                         threshold_seconds: int) -> list[int]:
    """The closed ledgers not yet offloaded that a threshold asks to offload, oldest first: those
    older than ``threshold_seconds``, and those past the newest ``threshold_bytes`` of the
    topic's ledgers (counted from the newest, as Pulsar's ``maybeOffload``). Never the last."""
    candidates: list[int] = []
    newer_bytes = 0
    for info in reversed(infos):
        newer_bytes += info.size_bytes
        if info is infos[-1] or info.closed_ms == 0 or info.entries == 0 or info.offloaded:
            continue
        over_size = 0 <= threshold_bytes < newer_bytes
        too_old = threshold_seconds >= 0 and now_ms - info.closed_ms >= threshold_seconds * 1000
        if over_size or too_old:
            candidates.append(info.ledger_id)
    return candidates[::-1]


class ManagedLedgerOffload(ABC):
    """The offload; ``ManagedLedger`` sets the state it declares."""

    name: str
    display_name: str
    config: ManagedLedgerConfig
    _lock: threading.RLock
    _list: LedgerList
    _ledgers: LedgerManager
    _reads: LedgerReads
    _offloader: LedgerOffloader | None
    _store: MetadataStore
    _closed: bool
    _taken_over: bool
    _offload_status: str
    _offload_error: str
    _offload_failed_ms: int
    _offload_thread: threading.Thread | None
    offload_counters: OffloadCounters

    @abstractmethod
    def _now_ms(self) -> int: ...

    # --- starting ------------------------------------------------------------------------
    def offload_prefix(self, up_to: Position) -> None:
        """Offload every closed ledger before ``up_to``'s ledger (Pulsar's ``asyncOffloadPrefix``),
        in the background; ``offload_status`` follows it. ``AlreadyExists`` while one runs."""
        self._require_offloader()
        with self._lock:
            candidates = [i.ledger_id for i in self._list.infos[:-1]
                          if i.ledger_id < up_to.ledger_id and i.entries > 0 and not i.offloaded]
        self._start_offload(candidates)

    def offload_by_threshold(self) -> bool:
        """Start an offload of what the thresholds ask (maintenance pass); False if none started."""
        if self._offloader is None or self._offload_running() or self._closed or self._taken_over:
            return False
        if self._offload_status == ERROR and self._now_ms() - self._offload_failed_ms < OFFLOAD_RETRY_DELAY_MS:
            return False
        config = self.config
        if config.offload_threshold_bytes < 0 and config.offload_threshold_seconds < 0:
            return False
        with self._lock:
            candidates = threshold_candidates(self._list.infos, self._now_ms(),
                                              threshold_bytes=config.offload_threshold_bytes,
                                              threshold_seconds=config.offload_threshold_seconds)
        if not candidates:
            return False
        with contextlib.suppress(AlreadyExists):
            self._start_offload(candidates)
            return True
        return False

    def _require_offloader(self) -> LedgerOffloader:
        if self._offloader is None:
            raise InvalidRequest(f"topic {self.display_name} cannot be offloaded: no offload driver is configured "
                                 "(managedLedgerOffloadDriver)")
        return self._offloader

    def _offload_running(self) -> bool:
        return self._offload_thread is not None and self._offload_thread.is_alive()

    def _start_offload(self, ledger_ids: list[int]) -> None:
        with self._lock:
            if self._offload_running():
                raise AlreadyExists(f"an offload of {self.display_name} is already running")
            self._offload_status, self._offload_error = RUNNING, ""
            self._offload_thread = threading.Thread(target=self._offload_loop, args=(ledger_ids,),
                                                    name=f"magnetar-offload-{self.name}", daemon=True)
            self._offload_thread.start()

    def wait_for_offload(self, timeout_s: float) -> bool:
        """Wait for the running offload (tests, shutdown); False if it still runs."""
        thread = self._offload_thread
        if thread is not None:
            thread.join(timeout_s)
        return not self._offload_running()

    # --- the loop --------------------------------------------------------------------------
    def _offload_loop(self, ledger_ids: list[int]) -> None:
        try:
            for ledger_id in ledger_ids:
                self._offload_one(ledger_id)
        except MagnetarError as exc:
            self._offload_failed(exc)
            return
        except Exception as exc:  # a driver's own exception: its type only (its text may hold what
            # a credential provider read), never a dead thread
            log.error("offload of %s failed: %s", self.display_name, type(exc).__name__)
            self._offload_failed(OffloadError(f"the offload failed unexpectedly ({type(exc).__name__})"))
            return
        self._offload_status = SUCCESS
        with contextlib.suppress(MagnetarError):
            self.delete_offloaded_locally()

    def _offload_failed(self, exc: BaseException) -> None:
        self.offload_counters.errors += 1
        self._offload_failed_ms = self._now_ms()
        self._offload_error = str(exc) or type(exc).__name__
        self._offload_status = ERROR
        log.warning("offload of %s failed: %s", self.display_name, self._offload_error)

    def _offload_one(self, ledger_id: int) -> None:
        offloader = self._require_offloader()
        context = self._begin_attempt(ledger_id, offloader)
        if context is None:
            return
        _crash_point("before-upload")
        try:
            # recovery: a ledger whose close failed is still OPEN at the bookies, its LAC one entry
            # behind; recovery closes it at its last durable entry (a closed ledger is just opened)
            source: ReadHandle = _CheckedSource(self._ledgers.open(ledger_id, recovery=True),
                                                self._refuse_if_not_serving)
            self._check_whole(ledger_id, source)
            if os.environ.get(CRASH_POINT_ENV) == "during-upload":
                source = _CheckedSource(source, _crash_after_first_read())
            offloader.offload(source, context.uuid, {"ManagedLedgerName": self.name})
        except BaseException:
            self._abandon_attempt(ledger_id, context)
            raise
        _crash_point("after-upload")
        self._complete_attempt(ledger_id, context)

    def _check_whole(self, ledger_id: int, source: ReadHandle) -> None:
        """The copy will hold every entry the ledger list counts, or the offload stops here (a
        copy short of an entry would be trusted, and the bookies' copy deleted after it)."""
        with self._lock:
            info = self._info(ledger_id)
        if info is not None and source.last_add_confirmed + 1 < info.entries:
            raise OffloadError(f"ledger {ledger_id} of {self.display_name} holds {info.entries} entries but its "
                               f"bookies confirm {source.last_add_confirmed + 1}: not offloaded")

    def _info(self, ledger_id: int) -> LedgerInfo | None:
        return next((i for i in self._list.infos if i.ledger_id == ledger_id), None)

    def _begin_attempt(self, ledger_id: int, offloader: LedgerOffloader) -> OffloadContext | None:
        """Step 1: save a new attempt in the ledger's info; None if the ledger is gone or offloaded."""
        with self._lock:
            self._refuse_if_not_serving()
            info = self._info(ledger_id)
            if info is None or info.offloaded:
                return None
            leftover = info.offload_context
            context = OffloadContext(uuid=str(uuid.uuid4()), driver_name=offloader.driver_name,
                                     driver_metadata=offloader.driver_metadata(), timestamp_ms=self._now_ms())
            self._save_context(info, context)
        if leftover is not None:  # an earlier attempt's objects, never trusted (its clearing failed)
            self._delete_copy(ledger_id, leftover)
        return context

    def _complete_attempt(self, ledger_id: int, context: OffloadContext) -> None:
        """Step 3: the copy is whole; save it complete, and read the ledger from it from now on."""
        with self._lock:
            info = self._info(ledger_id)
            current = info is not None and info.offload_context == context and not (self._closed or self._taken_over)
            if info is not None and current:
                try:
                    self._save_context(info, replace(context, complete=True, timestamp_ms=self._now_ms()))
                except BadVersion:  # another broker serves the topic now: this copy is recorded nowhere
                    self._taken_over = True
                    current = False
            if info is not None and current:
                self.offload_counters.ledgers_offloaded += 1
                self.offload_counters.bytes_offloaded += info.size_bytes
        if not current:  # trimmed, or no longer this writer's meanwhile: the copy is nobody's
            self._delete_or_orphan(ledger_id, context)
            self._refuse_if_not_serving()
            return
        self._reads.forget(ledger_id)

    def _abandon_attempt(self, ledger_id: int, context: OffloadContext) -> None:
        """A failed attempt: its objects go, and so does its context (when still this writer's)."""
        self._delete_or_orphan(ledger_id, context)
        with self._lock:
            info = self._info(ledger_id)
            if info is not None and info.offload_context == context and not (self._closed or self._taken_over):
                with contextlib.suppress(MagnetarError):  # left as is, it is cleared on the next open
                    self._save_context(info, None)

    def _delete_or_orphan(self, ledger_id: int, context: OffloadContext) -> None:
        """Delete a copy no ledger list will name; one the store does not delete now is named
        under ``/offload/orphaned-copies`` for the maintenance sweep (``broker/offload/orphans.py``)."""
        if self._delete_copy(ledger_id, context):
            return
        try:
            record_orphaned_copies(self._store, self.name, [(ledger_id, context)])
        except MagnetarError as exc:
            log.warning("offloaded copy %s of ledger %d of %s neither deleted nor recorded: %s", context.uuid,
                        ledger_id, self.display_name, exc)

    def _save_context(self, info: LedgerInfo, context: OffloadContext | None) -> None:
        before, info.offload_context = info.offload_context, context
        try:
            self._list.save()
        except BaseException:
            info.offload_context = before
            raise

    def _refuse_if_not_serving(self) -> None:
        if self._closed or self._taken_over:
            raise OffloadError(f"topic {self.display_name} is no longer served by this broker: offload stopped")

    def _delete_copy(self, ledger_id: int, context: OffloadContext) -> bool:
        """Delete an offloaded copy; whether it is gone. A failure is logged (the objects are
        never read; a caller that keeps the copy's record tries again later)."""
        if self._offloader is None:
            log.warning("offloaded copy %s of ledger %d of %s not deleted: no offload driver is configured",
                        context.uuid, ledger_id, self.display_name)
            return False
        try:
            self._offloader.delete(ledger_id, context.uuid, context.driver_metadata, context.driver_name)
        except Exception as exc:
            log.warning("offloaded copy %s of ledger %d of %s not deleted: %s", context.uuid, ledger_id,
                        self.display_name, exc)
            return False
        return True

    # --- local deletion ----------------------------------------------------------------------
    def delete_offloaded_locally(self) -> list[int]:
        """Step 4: the bookies' copies of ledgers offloaded ``offload_deletion_lag_ms`` ago go:
        marked deleted in the saved list first, then deleted (retried on open)."""
        with self._lock:
            if self._closed or self._taken_over:
                return []
            cutoff_ms = self._now_ms() - self.config.offload_deletion_lag_ms
            due = [i for i in self._list.infos if i.offload_context is not None and i.offloaded
                   and not i.local_deleted and i.offload_context.timestamp_ms <= cutoff_ms]
            if not due:
                return []
            before = {i.ledger_id: i.offload_context for i in due}
            pending_before = list(self._list.pending_local_deletes)
            for info in due:
                assert info.offload_context is not None
                info.offload_context = replace(info.offload_context, bookkeeper_deleted=True)
            self._list.pending_local_deletes.extend(i.ledger_id for i in due)
            try:
                self._list.save()
            except BaseException:
                for info in due:
                    info.offload_context = before[info.ledger_id]
                self._list.pending_local_deletes = pending_before
                raise
        for info in due:
            self._reads.forget(info.ledger_id)
        gone = self._delete_pending_local(crash_point=True)
        self.offload_counters.local_deleted += len(set(gone) & {i.ledger_id for i in due})
        return [i.ledger_id for i in due]

    def _delete_pending_local(self, *, crash_point: bool = False) -> list[int]:
        """Delete the bookies' copies of the ledgers marked deleted locally and not known gone,
        then save them as gone; returns those deleted. A failure is logged (the ledger stays
        pending: the next open deletes it again)."""
        with self._lock:
            pending = list(self._list.pending_local_deletes)
        gone = []
        for ledger_id in pending:
            if crash_point:
                _crash_point("during-local-delete")
            try:
                self._ledgers.delete(ledger_id)  # a no-op once it is gone
            except MagnetarError as exc:
                log.warning("ledger %d of %s, offloaded, not deleted from the bookies yet: %s", ledger_id,
                            self.display_name, exc)
                continue
            gone.append(ledger_id)
        if not gone:
            return gone
        with self._lock:
            if self._closed or self._taken_over:
                return gone  # the list is not this writer's to save; the next owner deletes them again
            self._list.pending_local_deletes = [i for i in self._list.pending_local_deletes if i not in gone]
            try:
                self._list.save()
            except BadVersion:  # another broker serves the topic now: its list, its pending deletions
                self._taken_over = True
            except MagnetarError as exc:  # still pending in the store: deleted again on open
                log.warning("pending local deletions of %s not saved as done: %s", self.display_name, exc)
        return gone

    def _cleanup_offload_on_open(self) -> None:
        """After a crash: incomplete attempts are deleted and cleared (the next offload starts
        anew), and ledgers marked deleted locally but not known gone are deleted (again): only
        those, not every offloaded ledger, so a load costs no bookie round trip per old ledger."""
        stale = [i for i in self._list.infos if i.offload_context is not None and not i.offloaded]
        for info in stale:
            assert info.offload_context is not None
            if self._offloader is None:
                continue  # kept, never trusted, until an offloader can delete its objects
            self._delete_copy(info.ledger_id, info.offload_context)
            info.offload_context = None
        if any(i.offload_context is None for i in stale):
            self._list.save()
        self._delete_pending_local()

    # --- status ------------------------------------------------------------------------------
    def offload_status(self) -> OffloadStatus:
        with self._lock:
            infos = self._list.infos
            first = next((i for i in infos if not i.offloaded), infos[-1] if infos else None)
            position = Position(first.ledger_id, 0) if first is not None else Position(-1, -1)
            return OffloadStatus(self._offload_status, self._offload_error, position)

    def offloaded_size_bytes(self) -> int:
        """Bytes of this topic's ledgers with a complete offloaded copy (``pulsar_storage_offloaded_size``)."""
        with self._lock:
            return sum(i.size_bytes for i in self._list.infos if i.offloaded)

