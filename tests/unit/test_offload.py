"""The managed ledger's offload (``broker/managed_ledger_offload.py``) over the real embedded
storage and RocksDB metadata, with a test-only in-memory store (``tests/unit/memory_offloader.py``).

Checks: an offload by position copies every closed ledger before it (never the current one),
saves each as complete, deletes the bookies' copy after the deletion lag, and every read
(entries, offset and time lookups) returns the same bytes from the store after a reopen; a
failed offload deletes its attempt's objects, reports ERROR with the store's message, and keeps
the local data readable; a crash between the upload and the saved ``complete`` leaves an
attempt that the next open deletes and clears (never trusted), and a crash between the saved
``bookkeeper_deleted`` and the bookies' deletion has the deletion done on open; thresholds pick
the oldest closed ledgers; appends go on while an upload is held; trimming and topic deletion
delete offloaded copies, and copies a deleted topic's store refused are named and swept later
(at most once per interval, a bounded number per sweep, stopping at the first refusal and
starting after it the next time); a failed read of a copy raises, never returns other data;
local deletion counts only the ledgers the bookies deleted, and a save of its progress refused
because another broker took the topic marks the topic taken over.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import cast

import pytest

from broker import managed_ledger_offload
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.entry_cache import EntryCache
from broker.entry_format import decode_entry
from broker.errors import AlreadyExists, NoSuchLedger, ServiceUnitNotReady
from broker.limits import OFFLOAD_RETRY_DELAY_MS
from broker.managed_ledger import ML_ROOT, ManagedLedger
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.managed_ledger_factory import ManagedLedgerFactory
from broker.managed_ledger_offload import threshold_candidates
from broker.metadata.store import MetadataStore
from broker.offload.offloader import OffloadContext, OffloadError, OffloadReadError
from broker.offload.orphans import ORPHANS_ROOT, OrphanedCopies, record_orphaned_copies
from broker.offset_index import LedgerInfo
from storage import MetadataStoreUnavailable
from tests.unit.broker_stack import Stack, append_messages, open_stack
from tests.unit.memory_offloader import MemoryOffloader

NAME = "t/ns/persistent/tiered"
LAG_0 = dataclasses.replace(ManagedLedgerConfig.test_min(), offload_deletion_lag_ms=0)


def _fill(stack: Stack, ml: ManagedLedger, messages: int) -> list[int]:
    times = []
    for i in range(messages):
        stack.clock.advance(1.0)
        times.append(append_messages(ml, [f"m{i}".encode()]).publish_time_ms)
    return times


def _offload_all(ml: ManagedLedger) -> None:
    """Offload every closed ledger and wait for SUCCESS."""
    ml.offload_prefix(ml.last_confirmed)
    assert ml.wait_for_offload(10) and ml.offload_status().status == "SUCCESS", ml.offload_status()


def _other_broker(stack: Stack, offloader: MemoryOffloader) -> ManagedLedgerFactory:
    """A second factory over the same metadata and bookies: a broker that loads the topic after a crash."""
    return ManagedLedgerFactory(stack.store, LedgerManager(stack.store, stack.ledgers.client, stack.clock),
                                EntryCache(1 << 20), stack.clock, offloader=offloader)


def _ledger_exists(stack: Stack, ledger_id: int) -> bool:
    try:
        stack.ledgers.metadata(ledger_id)
    except NoSuchLedger:
        return False
    return True


def _check_reads(ml: ManagedLedger, times: list[int]) -> None:
    for offset in range(len(times)):
        position, index = ml.offset_to_position(offset)
        assert decode_entry(ml.read_entry(position).data).messages[index].payload == f"m{offset}".encode()
        assert ml.time_to_offset(times[offset]) == offset


def test_offload_by_position_then_reads_come_from_the_store(data_dir: str) -> None:
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    times = _fill(stack, ml, 32)  # test_min: 5 entries a ledger, so 6 closed ledgers and the current one
    closed = [i.ledger_id for i in ml.ledger_infos()[:-1]]
    assert ml.offload_status().status == "NOT_RUN"
    ml.offload_prefix(ml.last_confirmed)
    assert ml.wait_for_offload(10)
    status = ml.offload_status()
    assert (status.status, status.last_error) == ("SUCCESS", "")
    assert status.first_unoffloaded.ledger_id == ml.ledger_infos()[-1].ledger_id
    assert [i.ledger_id for i in ml.ledger_infos() if i.offloaded] == closed
    assert not ml.ledger_infos()[-1].offloaded
    assert all(not _ledger_exists(stack, ledger_id) for ledger_id in closed)  # lag 0: gone from the bookies
    assert ml.offloaded_size_bytes() == sum(i.size_bytes for i in ml.ledger_infos()[:-1])
    stack.close()
    stack = open_stack(data_dir, stack.clock, offloader=offloader)  # an empty entry cache: reads reach the store
    ml, _ = stack.open(NAME, LAG_0)
    assert [i.ledger_id for i in ml.ledger_infos() if i.local_deleted] == closed
    _check_reads(ml, times)
    assert offloader.reads >= 30
    stack.close()


def test_the_local_copy_stays_until_the_deletion_lag_has_passed(data_dir: str) -> None:
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, dataclasses.replace(LAG_0, offload_deletion_lag_ms=60_000))
    _fill(stack, ml, 12)
    first = ml.ledger_infos()[0].ledger_id
    _offload_all(ml)
    assert ml.delete_offloaded_locally() == [] and _ledger_exists(stack, first)
    stack.clock.advance(61)
    assert first in ml.delete_offloaded_locally()
    assert not _ledger_exists(stack, first)
    stack.close()


def test_a_failed_attempt_the_store_does_not_delete_is_named_for_the_sweep(data_dir: str) -> None:
    """The upload fails and so does the delete of its partial objects (the store is down): the
    attempt is named under ``/offload/orphaned-copies`` (before: its context was cleared and the
    objects were named nowhere), and the sweep deletes them once the store deletes again."""
    offloader = MemoryOffloader()
    offloader.fail_offload = offloader.fail_deletes = True
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    _fill(stack, ml, 12)
    ml.offload_prefix(ml.last_confirmed)
    assert ml.wait_for_offload(10) and ml.offload_status().status == "ERROR"
    assert all(i.offload_context is None for i in ml.ledger_infos())
    (partial,) = offloader.copies
    assert stack.store.children(ORPHANS_ROOT) == [f"{partial[0]}-{partial[1]}"]
    offloader.fail_deletes = False
    assert OrphanedCopies(stack.store, lambda: offloader, stack.clock).sweep(offloader) == 1
    assert offloader.copies == {} and stack.store.children(ORPHANS_ROOT) == []
    stack.close()


def test_a_failed_offload_deletes_its_objects_reports_error_and_keeps_local_data(data_dir: str) -> None:
    offloader = MemoryOffloader()
    offloader.fail_offload = True
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    times = _fill(stack, ml, 12)
    ml.offload_prefix(ml.last_confirmed)
    assert ml.wait_for_offload(10)
    status = ml.offload_status()
    assert status.status == "ERROR" and "the memory store is down" in status.last_error
    assert status.first_unoffloaded.ledger_id == ml.ledger_infos()[0].ledger_id
    assert offloader.copies == {} and len(offloader.deleted) == 1  # the partial copy went
    assert all(i.offload_context is None for i in ml.ledger_infos())
    assert all(_ledger_exists(stack, i.ledger_id) for i in ml.ledger_infos())
    _check_reads(ml, times)
    assert ml.offload_counters.errors == 1
    offloader.fail_offload = False  # the store is back: the next offload succeeds
    _offload_all(ml)
    stack.close()


def test_an_attempt_interrupted_before_its_complete_is_saved_is_deleted_on_open(data_dir: str) -> None:
    """A crash after the upload, before the metadata update: the copy exists, but the list says
    incomplete; the next owner deletes it and the next offload uses another uuid."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    times = _fill(stack, ml, 12)
    first = ml.ledger_infos()[0].ledger_id
    context = ml._begin_attempt(first, offloader)
    assert context is not None
    offloader.offload(stack.ledgers.open(first, recovery=False), context.uuid, {})
    assert (first, context.uuid) in offloader.copies
    other = _other_broker(stack, offloader)
    taken = other.open(NAME, LAG_0)
    assert offloader.copies == {} and taken.ledger_infos()[0].offload_context is None
    _check_reads(taken, times)
    taken.offload_prefix(taken.last_confirmed)
    assert taken.wait_for_offload(10) and taken.offload_status().status == "SUCCESS"
    new_context = taken.ledger_infos()[0].offload_context
    assert new_context is not None and new_context.complete and new_context.uuid != context.uuid
    other.close_all()
    stack.close()


def test_a_ledger_marked_deleted_locally_is_deleted_on_open_and_read_from_the_store(
        data_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash after ``bookkeeper_deleted`` was saved, before the bookies' deletion: the next
    load deletes it, and the load after that deletes nothing (before: every load asked the
    bookies to delete every ledger ever deleted locally)."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, dataclasses.replace(LAG_0, offload_deletion_lag_ms=3_600_000))
    times = _fill(stack, ml, 12)
    _offload_all(ml)
    stack.clock.advance(3601.0)

    class Crash(BaseException):
        pass

    def crash(name: str) -> None:
        if name == "during-local-delete":
            raise Crash

    monkeypatch.setattr(managed_ledger_offload, "_crash_point", crash)
    with pytest.raises(Crash):
        ml.delete_offloaded_locally()
    monkeypatch.undo()
    marked = [i for i in ml.ledger_infos() if i.local_deleted]
    assert marked and all(_ledger_exists(stack, i.ledger_id) for i in marked)
    deletes: list[int] = []
    real_delete = LedgerManager.delete

    def counted_delete(self: LedgerManager, ledger_id: int) -> None:
        deletes.append(ledger_id)
        real_delete(self, ledger_id)

    monkeypatch.setattr(LedgerManager, "delete", counted_delete)
    other = _other_broker(stack, offloader)
    taken = other.open(NAME, LAG_0)
    assert sorted(deletes) == sorted(i.ledger_id for i in marked)
    assert not any(_ledger_exists(stack, i.ledger_id) for i in marked)
    _check_reads(taken, times)
    other.close_all()
    deletes.clear()
    again = _other_broker(stack, offloader)
    _check_reads(again.open(NAME, LAG_0), times)
    assert not set(deletes) & {i.ledger_id for i in marked}, deletes  # (the empty ledger the last owner opened goes)
    again.close_all()
    stack.close()


def test_appends_go_on_while_an_upload_is_held(data_dir: str) -> None:
    offloader = MemoryOffloader()
    offloader.block = threading.Event()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    _fill(stack, ml, 12)
    ml.offload_prefix(ml.last_confirmed)
    assert offloader.started.wait(10)
    assert ml.offload_status().status == "RUNNING"
    with pytest.raises(AlreadyExists):
        ml.offload_prefix(ml.last_confirmed)
    for i in range(10):
        assert append_messages(ml, [f"during {i}".encode()]).first_offset == 12 + i
    offloader.block.set()
    assert ml.wait_for_offload(10) and ml.offload_status().status == "SUCCESS"
    stack.close()


def test_the_threshold_offloads_the_oldest_closed_ledgers(data_dir: str) -> None:
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    assert not ml.offload_by_threshold()  # -1: off
    _fill(stack, ml, 32)
    infos = ml.ledger_infos()
    keep_bytes = sum(i.size_bytes for i in infos[-3:])
    ml.config = dataclasses.replace(LAG_0, offload_threshold_bytes=keep_bytes)
    assert ml.offload_by_threshold()
    assert ml.wait_for_offload(10)
    assert [i.offloaded for i in ml.ledger_infos()] == [True] * (len(infos) - 3) + [False] * 3
    assert not ml.offload_by_threshold()  # nothing more is over it
    stack.close()


def test_threshold_candidates_never_name_the_current_ledger() -> None:
    infos = [LedgerInfo(i, first_offset=i * 10, entries=10, size_bytes=100, messages=10, closed_ms=1000 * i)
             for i in range(1, 5)]
    infos[-1].closed_ms = 0
    assert threshold_candidates(infos, 10_000, threshold_bytes=0, threshold_seconds=-1) == [1, 2, 3]
    assert threshold_candidates(infos, 10_000, threshold_bytes=250, threshold_seconds=-1) == [1, 2]  # 3, 4 stay
    assert threshold_candidates(infos, 10_000, threshold_bytes=-1, threshold_seconds=8) == [1, 2]
    assert threshold_candidates(infos, 10_000, threshold_bytes=-1, threshold_seconds=-1) == []


def test_trimming_and_topic_deletion_delete_offloaded_copies(data_dir: str) -> None:
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, cursors = stack.open(NAME, LAG_0)
    sub = cursors.open("sub", initial="earliest")
    _fill(stack, ml, 22)
    _offload_all(ml)
    copies = len(offloader.copies)
    assert copies == len(ml.ledger_infos()) - 1
    sub.ack_cumulative(9).result(timeout=10)  # the first two ledgers are consumed
    trimmed = ml.trim()
    assert len(trimmed) == 2 and len(offloader.copies) == copies - 2
    assert all(ledger_id not in {k[0] for k in offloader.copies} for ledger_id in trimmed)
    cursors.close()
    ml.delete()
    assert offloader.copies == {}
    stack.close()


def test_a_failed_read_of_a_copy_raises_and_never_returns_other_data(data_dir: str) -> None:
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    _fill(stack, ml, 12)
    ml.offload_prefix(ml.last_confirmed)
    assert ml.wait_for_offload(10)
    stack.close()
    offloader.fail_reads = True
    stack = open_stack(data_dir, stack.clock, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    first = ml.ledger_infos()[0].ledger_id
    with pytest.raises(OffloadReadError, match=f"ledger {first}"):
        ml.read_entries(ml.first_position(), 5)
    stack.close()


def test_an_upload_that_ends_after_another_broker_took_the_topic_leaves_no_copy(data_dir: str) -> None:
    """The new owner cleared the attempt on load; the old owner's ``complete`` save then loses
    its compare-and-set, and the copy it finished is deleted (recorded nowhere, so never read)."""
    offloader = MemoryOffloader()
    offloader.block = threading.Event()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    times = _fill(stack, ml, 12)
    ml.offload_prefix(ml.last_confirmed)
    assert offloader.started.wait(10)
    other = _other_broker(stack, offloader)
    taken = other.open(NAME, LAG_0)
    assert taken.ledger_infos()[0].offload_context is None
    offloader.block.set()
    assert ml.wait_for_offload(10)
    assert len(offloader.copies) == 0
    assert ml.offload_status().status == "ERROR" and ml.taken_over
    assert all(i.offload_context is None for i in taken.ledger_infos())
    _check_reads(taken, times)
    other.close_all()
    stack.close()


def test_an_upload_of_a_topic_closed_here_stops_at_its_next_read(data_dir: str) -> None:
    """The topic is closed (unloaded) while its upload waits: the upload's next read of the
    ledger refuses, so the rest of the ledger is not copied (before: it was read and copied
    whole, then deleted) and no copy is left."""
    offloader = MemoryOffloader()
    offloader.block = threading.Event()
    stack = open_stack(data_dir, offloader=offloader)
    ml, cursors = stack.open(NAME, LAG_0)
    _fill(stack, ml, 12)
    ml.offload_prefix(ml.last_confirmed)
    assert offloader.started.wait(10)
    cursors.close()
    ml.close()
    offloader.block.set()
    assert ml.wait_for_offload(10)
    status = ml.offload_status()
    assert status.status == "ERROR" and "no longer served" in status.last_error, status
    assert offloader.copies == {} and offloader.source_reads == 1, offloader.source_reads
    stack.close()


def test_after_a_failed_offload_the_threshold_waits_before_asking_the_store_again(data_dir: str) -> None:
    offloader = MemoryOffloader()
    offloader.fail_offload = True
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, dataclasses.replace(LAG_0, offload_threshold_bytes=0))
    _fill(stack, ml, 12)
    assert ml.offload_by_threshold() and ml.wait_for_offload(10)
    assert ml.offload_status().status == "ERROR"
    assert not ml.offload_by_threshold()  # the next maintenance pass does not retry at once
    stack.clock.advance(OFFLOAD_RETRY_DELAY_MS / 1000)
    offloader.fail_offload = False
    assert ml.offload_by_threshold() and ml.wait_for_offload(10)
    assert ml.offload_status().status == "SUCCESS"
    stack.close()


def test_a_ledger_whose_close_failed_is_recovered_before_it_is_copied_whole(data_dir: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger whose close failed (its metadata write lost) is still OPEN at the bookies, its
    last-add-confirmed one entry behind; the offload recovers it first, so the copy holds every
    entry and every message reads back after the bookies' copy is deleted (before: a copy one
    entry short was saved complete, and offset 4 was lost)."""
    from broker.bookkeeper import ledger_handle
    from broker.errors import MagnetarError

    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    times = _fill(stack, ml, 4)
    store_metadata = ledger_handle.LedgerHandle._store_metadata
    failed: list[int] = []

    def lose_the_first_close(self: ledger_handle.LedgerHandle, **kwargs: object) -> None:
        if not failed and not self.writable:
            failed.append(self.ledger_id)
            raise MagnetarError("the metadata store lost the close")
        store_metadata(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger_handle.LedgerHandle, "_store_metadata", lose_the_first_close)
    for i in range(4, 12):
        stack.clock.advance(1.0)
        times.append(append_messages(ml, [f"m{i}".encode()]).publish_time_ms)
    monkeypatch.setattr(ledger_handle.LedgerHandle, "_store_metadata", store_metadata)
    assert failed, "no close failed: the test did not set up what it means to"
    ml.offload_prefix(ml.last_confirmed)
    assert ml.wait_for_offload(10) and ml.offload_status().status == "SUCCESS", ml.offload_status()
    copied = {ledger_id: len(entries) for (ledger_id, _), entries in offloader.copies.items()}
    assert copied[failed[0]] == next(i.entries for i in ml.ledger_infos() if i.ledger_id == failed[0])
    ml.close()
    reopened, _ = stack.open(NAME, LAG_0)
    _check_reads(reopened, times)


def test_a_trimmed_copy_the_store_did_not_delete_stays_pending_and_goes_later(data_dir: str) -> None:
    """Retention trims two offloaded ledgers while the store refuses deletions: their copies stay
    recorded as pending (before: forgotten, left in the bucket for good) and go at the next trim
    once the store deletes again."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, cursors = stack.open(NAME, LAG_0)
    sub = cursors.open("sub", initial="earliest")
    _fill(stack, ml, 22)
    _offload_all(ml)
    copies = len(offloader.copies)
    sub.ack_cumulative(9).result(timeout=10)  # the first two ledgers are consumed
    offloader.fail_deletes = True
    trimmed = ml.trim()
    assert len(trimmed) == 2 and len(offloader.copies) == copies
    assert sorted(ledger_id for ledger_id, _ in ml._list.pending_offload_deletes) == sorted(trimmed)
    offloader.fail_deletes = False
    ml.trim()
    assert len(offloader.copies) == copies - 2 and ml._list.pending_offload_deletes == []
    cursors.close()
    stack.close()


def test_a_bookie_handle_opened_before_the_offload_completed_is_not_read_after_the_local_delete(
        data_dir: str) -> None:
    """A reader opened the ledger on the bookies before its offload was saved complete; the
    bookies' copy is then deleted (lag 0): the next read goes to the offloaded copy, not to the
    stale handle (before: every read of the ledger failed with NoSuchEntry until the handle
    was evicted)."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    times = _fill(stack, ml, 12)
    first = ml.ledger_infos()[0]
    stale = stack.ledgers.open(first.ledger_id, recovery=False)
    _offload_all(ml)
    ml.delete_offloaded_locally()
    assert not _ledger_exists(stack, first.ledger_id)
    ml._reads._handles[first.ledger_id] = (stale, None)  # as a reader that opened it before `complete` left it
    stack.cache.invalidate_ledger(first.ledger_id)
    _check_reads(ml, times)
    ml.close()
    stack.close()


def test_a_drivers_own_exception_is_reported_by_its_type_never_its_text(data_dir: str) -> None:
    """An exception that is not the offloader's own (a credential provider's, say) may carry
    what it read: the status and the log name its type only (before: its text, here a key)."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, LAG_0)
    _fill(stack, ml, 12)

    def leaky(*_args: object) -> None:
        raise RuntimeError("could not use key AKIA-SECRET-VALUE")

    offloader.offload = leaky  # type: ignore[method-assign,assignment]
    ml.offload_prefix(ml.last_confirmed)
    assert ml.wait_for_offload(10)
    status = ml.offload_status()
    assert status.status == "ERROR" and "RuntimeError" in status.last_error, status
    assert "AKIA-SECRET-VALUE" not in status.last_error
    ml.close()
    stack.close()


def test_copies_a_deleted_topic_could_not_delete_are_named_and_swept_later(data_dir: str) -> None:
    """A topic deleted while the store refuses deletions: its copies are named under
    ``/offload/orphaned-copies`` before its metadata goes (before: forgotten, left in the bucket
    for good), and a later sweep deletes them and their names once the store deletes again."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, cursors = stack.open(NAME, LAG_0)
    _fill(stack, ml, 22)
    _offload_all(ml)
    copies = dict(offloader.copies)
    assert copies
    cursors.close()
    offloader.fail_deletes = True
    ml.delete()
    assert offloader.copies == copies and not stack.store.exists(f"{ML_ROOT}/{NAME}")
    named = stack.store.children(ORPHANS_ROOT)
    assert sorted(named) == sorted(f"{ledger_id}-{uuid}" for ledger_id, uuid in copies)
    sweeper = OrphanedCopies(stack.store, lambda: offloader, stack.clock)
    assert sweeper.sweep(offloader) == 0 and stack.store.children(ORPHANS_ROOT) == named  # still refused
    offloader.fail_deletes = False
    sweeper.maybe_sweep()
    assert offloader.copies == {} and stack.store.children(ORPHANS_ROOT) == []
    assert sweeper.statistics().deleted == len(copies)
    stack.close()


def test_the_sweep_runs_at_most_once_per_interval_and_a_bounded_number_of_copies(data_dir: str) -> None:
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    context = OffloadContext(uuid="u", driver_name="memory", complete=True)
    record_orphaned_copies(stack.store, NAME, [(ledger_id, context) for ledger_id in range(5)])
    sweeper = OrphanedCopies(stack.store, lambda: offloader, stack.clock, interval_ms=60_000, per_sweep_max=2)
    sweeper.maybe_sweep()
    assert len(offloader.deleted) == 2
    sweeper.maybe_sweep()  # within the interval: nothing
    assert len(offloader.deleted) == 2
    stack.clock.advance(60.0)
    sweeper.maybe_sweep()
    assert len(offloader.deleted) == 4 and len(stack.store.children(ORPHANS_ROOT)) == 1
    stack.close()


class _RefusingOffloader(MemoryOffloader):
    """Refuses to delete the copies of ``refused`` ledgers (or every copy, ``fail_deletes``),
    counting every delete asked of it."""

    def __init__(self, refused: set[int]) -> None:
        super().__init__()
        self.refused = refused
        self.tries: list[int] = []

    def delete(self, ledger_id: int, uuid: str, driver_metadata: dict[str, str], driver_name: str = "") -> None:
        self.tries.append(ledger_id)
        if ledger_id in self.refused:
            raise OffloadError(f"ledger {ledger_id}: the memory store refuses deletions")
        super().delete(ledger_id, uuid, driver_metadata, driver_name)


def test_a_sweep_stops_at_the_first_refused_delete(data_dir: str) -> None:
    """A store that refuses is asked once per sweep, not once per named copy: each refusal may
    wait out the store's timeouts and retries, in the maintenance thread that also times out
    acks and starts redeliveries (before: every named copy, up to the per-sweep bound, was tried
    against the refusing store in one pass)."""
    offloader = _RefusingOffloader(set(range(5)))
    stack = open_stack(data_dir, offloader=offloader)
    context = OffloadContext(uuid="u", driver_name="memory", complete=True)
    record_orphaned_copies(stack.store, NAME, [(ledger_id, context) for ledger_id in range(5)])
    sweeper = OrphanedCopies(stack.store, lambda: offloader, stack.clock)
    assert sweeper.sweep(offloader) == 0
    assert len(offloader.tries) == 1 and len(stack.store.children(ORPHANS_ROOT)) == 5
    stack.close()


def test_a_copy_refused_for_good_does_not_keep_the_others_from_being_swept(data_dir: str) -> None:
    """Each sweep starts after the copy the last one stopped at (before: every sweep began with
    the same first names, so copies the store refused for good kept the rest in the bucket)."""
    offloader = _RefusingOffloader({0})
    stack = open_stack(data_dir, offloader=offloader)
    context = OffloadContext(uuid="u", driver_name="memory", complete=True)
    record_orphaned_copies(stack.store, NAME, [(ledger_id, context) for ledger_id in range(3)])
    sweeper = OrphanedCopies(stack.store, lambda: offloader, stack.clock, per_sweep_max=1)
    for _ in range(3):
        sweeper.sweep(offloader)
    assert stack.store.children(ORPHANS_ROOT) == ["0-u"] and offloader.tries == [0, 1, 2]
    sweeper.sweep(offloader)  # round again: the refused one is asked again
    assert offloader.tries == [0, 1, 2, 0]
    stack.close()


class _UnavailableStore:
    """A metadata store that is down for the sweep's reads."""

    def children(self, path: str) -> list[str]:
        raise MetadataStoreUnavailable("the metadata store is down")


def test_a_sweep_whose_metadata_store_is_down_logs_and_returns() -> None:
    """The module's invariant: a failure is logged, never raised to the maintenance pass
    (before: the store's error went up to the pass, which logged a traceback)."""
    offloader = MemoryOffloader()
    store = cast(MetadataStore, _UnavailableStore())
    sweeper = OrphanedCopies(store, lambda: offloader, lambda: 0.0)
    sweeper.maybe_sweep()
    assert sweeper.statistics().deleted == 0


def test_a_list_saved_before_pending_local_deletes_were_kept_has_its_marked_ledgers_deleted_on_load(
        data_dir: str) -> None:
    """A list written before ``pendingLocalDeletes`` existed, with a ledger marked deleted
    locally whose bookie copy is still there (the old broker crashed before deleting it, or the
    bookies refused): the next load deletes it, as the broker that wrote the list promised
    (before: no pending deletion was recorded, so the bookie copy stayed for good)."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, dataclasses.replace(LAG_0, offload_deletion_lag_ms=3_600_000))
    times = _fill(stack, ml, 12)
    _offload_all(ml)
    path = f"{ML_ROOT}/{NAME}"
    stored, version = stack.store.get_json(path) or ({}, -1)
    stored.pop("pendingLocalDeletes", None)
    first = stored["ledgers"][0]
    first["offloadContext"]["bookkeeperDeleted"] = True  # as the old broker saved its mark
    stack.store.put_json(path, stored, version)
    assert _ledger_exists(stack, int(first["ledgerId"]))
    other = _other_broker(stack, offloader)
    taken = other.open(NAME, LAG_0)
    assert not _ledger_exists(stack, int(first["ledgerId"]))
    _check_reads(taken, times)
    listed, _ = stack.store.get_json(path) or ({}, -1)
    assert listed.get("pendingLocalDeletes") == []  # known gone: the next load asks nothing
    other.close_all()
    stack.close()


def test_local_deletion_counts_only_the_ledgers_the_bookies_deleted(data_dir: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger the bookies refuse to delete stays pending (deleted again later) and is not
    counted as deleted locally; the others are."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, dataclasses.replace(LAG_0, offload_deletion_lag_ms=60_000))
    _fill(stack, ml, 17)  # 3 closed ledgers and the current one
    _offload_all(ml)
    refused = ml.ledger_infos()[1].ledger_id
    delete = stack.ledgers.delete

    def delete_but_one(ledger_id: int) -> None:
        if ledger_id == refused:
            raise ServiceUnitNotReady("the bookies are busy")
        delete(ledger_id)

    monkeypatch.setattr(stack.ledgers, "delete", delete_but_one)
    stack.clock.advance(61)
    due = ml.delete_offloaded_locally()
    assert len(due) == 3 and refused in due
    assert ml.offload_counters.local_deleted == 2
    assert ml._list.pending_local_deletes == [refused] and _ledger_exists(stack, refused)
    stack.close()


def test_a_pending_deletion_save_refused_because_another_broker_took_the_topic_marks_it_taken_over(
        data_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another broker loads the topic between the mark and the save of the bookies' deletions:
    that save loses its compare-and-set, which says the topic is no longer this broker's (the
    list is the new owner's, and so are the deletions still pending in it)."""
    offloader = MemoryOffloader()
    stack = open_stack(data_dir, offloader=offloader)
    ml, _ = stack.open(NAME, dataclasses.replace(LAG_0, offload_deletion_lag_ms=60_000))
    _fill(stack, ml, 12)
    _offload_all(ml)
    other = _other_broker(stack, offloader)
    delete = stack.ledgers.delete

    def delete_then_lose_the_topic(ledger_id: int) -> None:
        delete(ledger_id)
        if not other._open:
            other.open(NAME, LAG_0)

    monkeypatch.setattr(stack.ledgers, "delete", delete_then_lose_the_topic)
    stack.clock.advance(61)
    assert not ml.taken_over
    assert len(ml.delete_offloaded_locally()) == 2
    assert ml.taken_over
    assert ml.delete_offloaded_locally() == []  # nothing more is this broker's to delete
    other.close_all()
    stack.close()
