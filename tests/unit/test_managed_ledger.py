"""Managed ledgers and cursors over the real embedded storage and RocksDB metadata.

Checks: offsets are gap-free across frequent ledger rollovers (``test_min``); offset → message
and time → offset lookups are exact at ledger boundaries; conditional append refuses a stale
``expected_offset`` and writes nothing; cursor state (mark-delete, holes, batch-message acks)
survives a restart; trimming deletes only ledgers every durable cursor has consumed and that
retention lets go, and storage GC then gives the disk back; terminate refuses later writes; an
append to a ledger another writer recovered fails as fenced and the factory counts it, also
when the new owner found it empty and deleted it; once another broker recovered the topic and
rewrote its ledger list, every later append of the old writer fails as fenced (none goes to a
ledger the list does not name); an offset lookup reads forward a bounded number of bytes, and
at most one sample interval of entries from the bookies.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from broker.bookkeeper.ledger_manager import LedgerManager
from broker.cursor import CursorManager
from broker.entry_cache import EntryCache
from broker.entry_format import Message, decode_entry, encode_entry
from broker.errors import DataLost, LedgerFenced, OffsetMismatch, TopicTerminated
from broker.limits import READ_RUN_ENTRIES_MAX
from broker.managed_ledger import ManagedLedger
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.managed_ledger_factory import ManagedLedgerFactory
from broker.metadata import MetadataStore
from tests.unit.broker_stack import Stack, append_messages, open_stack


@pytest.fixture
def stack(data_dir: str) -> Stack:
    return open_stack(data_dir)


def test_offsets_are_gap_free_across_rollovers_and_lookups_hit_boundaries(stack: Stack) -> None:
    ml, _ = stack.open("t/ns/persistent/offsets")
    expected_offset = 0
    publish_times: list[tuple[int, int]] = []
    for i in range(40):
        batch = [f"m{expected_offset + j}".encode() for j in range(1 + i % 3)]
        stack.clock.advance(1.0)
        result = append_messages(ml, batch)
        assert (result.first_offset, result.last_offset) == (expected_offset, expected_offset + len(batch) - 1)
        publish_times.append((result.publish_time_ms, result.first_offset))
        expected_offset += len(batch)
    infos = ml.ledger_infos()
    assert len(infos) >= 8  # test_min rolls every 5 entries
    for before, after in itertools.pairwise(infos):
        assert after.first_offset == before.next_offset
    for offset in range(expected_offset):
        position, index = ml.offset_to_position(offset)
        decoded = decode_entry(ml.read_entry(position).data)
        assert decoded.messages[index].payload == f"m{offset}".encode()
    for publish_ms, first_offset in publish_times:
        assert ml.time_to_offset(publish_ms) == first_offset
        assert ml.time_to_offset(publish_ms - 1) == first_offset
    assert ml.time_to_offset(publish_times[-1][0] + 1) == expected_offset
    stack.close()
    reopened = open_stack(str(Path(stack.storage.path).parent), stack.clock)
    ml2, _ = reopened.open("t/ns/persistent/offsets")
    assert ml2.next_offset == expected_offset
    assert append_messages(ml2, [b"after restart"]).first_offset == expected_offset
    reopened.close()


def test_conditional_append_never_lets_two_writers_take_one_offset(stack: Stack) -> None:
    ml, _ = stack.open("t/ns/persistent/cas", ManagedLedgerConfig())
    append_messages(ml, [b"genesis"])
    winners: list[tuple[int, int]] = []
    losers: list[int] = []
    lock = threading.Lock()

    def appender(writer: int) -> None:
        for _ in range(50):
            expected = ml.next_offset
            try:
                entry = encode_entry([Message(payload=f"w{writer}".encode())], producer_name=f"w{writer}",
                                     sequence_id=0, publish_time_ms=0)
                result = ml.append([entry], [1], expected_offset=expected).result(timeout=10)[0]
                with lock:
                    winners.append((result.first_offset, writer))
            except OffsetMismatch:
                with lock:
                    losers.append(writer)

    threads = [threading.Thread(target=appender, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    offsets = [o for o, _ in winners]
    assert len(offsets) == len(set(offsets))
    assert sorted(offsets) == list(range(1, 1 + len(offsets)))
    assert ml.next_offset == 1 + len(offsets)
    with pytest.raises(OffsetMismatch) as info:
        ml.append([b"x"], [1], expected_offset=0)
    assert info.value.next_offset == ml.next_offset
    stack.close()


def test_cursor_state_with_holes_and_batch_acks_survives_restart(stack: Stack) -> None:
    ml, cursors = stack.open("t/ns/persistent/cursor")
    cursor = cursors.open("sub", initial="earliest")
    for i in range(10):
        append_messages(ml, [f"{i}-{j}".encode() for j in range(4)])  # offsets 4i .. 4i+3
    cursor.ack_cumulative(5).result(timeout=10)
    cursor.ack([7, 8, 9, 10, 11]).result(timeout=10)  # one whole entry (8..11) plus one batch message (7)
    cursor.ack([21]).result(timeout=10)
    assert cursor.mark_delete_offset == 6
    assert cursor.backlog_messages() == 40 - 6 - 6
    data_dir = str(Path(stack.storage.path).parent)
    stack.close()
    reopened = open_stack(data_dir, stack.clock)
    _, cursors2 = reopened.open("t/ns/persistent/cursor")
    restored = cursors2.get("sub")
    assert restored is not None
    assert restored.mark_delete_offset == 6
    assert restored.acked_ranges() == [(7, 12), (21, 22)]
    delivered = restored.read_entries(100)
    assert delivered[0].first_offset == 4  # the entry holding unacked offset 6
    assert all(e.first_offset != 8 for e in delivered)  # wholly acked entry is skipped
    unacked = [o for e in delivered for o in range(e.first_offset, e.last_offset + 1) if not restored.is_acked(o)]
    assert unacked == [6, *range(12, 21), *range(22, 40)]
    reopened.close()


def test_trim_respects_cursors_and_retention_and_frees_disk(stack: Stack) -> None:
    config = ManagedLedgerConfig.test_min()
    ml, cursors = stack.open("t/ns/persistent/trim", config)
    slow = cursors.open("slow", initial="earliest")
    fast = cursors.open("fast", initial="earliest")
    for i in range(200):  # 400 KB: several 128 KiB entry logs, so sealed logs exist for GC
        append_messages(ml, [bytes([i % 256]) * 2000])
    ledgers_before = len(ml.ledger_infos())
    fast.skip_all().result(timeout=10)
    assert ml.trim() == []  # the slow cursor still needs everything
    slow.ack_cumulative(149).result(timeout=10)
    trimmed = ml.trim()
    assert trimmed and len(ml.ledger_infos()) < ledgers_before
    assert 140 <= ml.first_offset <= 150
    with pytest.raises(DataLost):
        ml.offset_to_position(0)
    for ledger_id in trimmed:
        assert not stack.storage.ledger_exists(ledger_id)
    stack.storage.checkpoint()
    disk_before = stack.storage.statistics().entry_logs.disk_bytes
    stack.storage.collect_garbage(compaction_threshold=0.9)
    assert stack.storage.statistics().entry_logs.disk_bytes < disk_before
    slow.skip_all().result(timeout=10)
    kept = dataclasses.replace(config, retention_time_ms=3_600_000, retention_size_bytes=-1)
    ml_kept, cursors_kept = stack.open("t/ns/persistent/kept", kept)
    cursors_kept.open("c", initial="earliest")
    for _ in range(20):
        append_messages(ml_kept, [b"x" * 100])
    cursors_kept.get("c").skip_all().result(timeout=10)  # type: ignore[union-attr]
    assert ml_kept.trim() == []  # consumed, but retention keeps it for an hour
    stack.clock.advance(3601)
    assert ml_kept.trim() != []
    stack.close()


def test_terminate_refuses_writes(stack: Stack) -> None:
    ml, _ = stack.open("t/ns/persistent/term")
    append_messages(ml, [b"last words"])
    last = ml.terminate()
    assert last == ml.last_confirmed
    with pytest.raises(TopicTerminated):
        append_messages(ml, [b"too late"])
    stack.close()


def test_an_append_to_a_ledger_another_writer_recovered_fails_fenced_and_is_counted(stack: Stack) -> None:
    ml, _ = stack.open("t/ns/persistent/fenced", ManagedLedgerConfig())
    first = append_messages(ml, [b"before"])
    assert stack.factory.appends_fenced == 0
    other_broker = LedgerManager(stack.store, stack.ledgers.client, stack.clock)
    other_broker.open(first.position.ledger_id, recovery=True)  # fences the ledger, as a new owner does
    entry = encode_entry([Message(b"after")], producer_name="test", sequence_id=1, publish_time_ms=0)
    with pytest.raises(LedgerFenced):
        ml.append([entry], [1]).result(timeout=10)
    assert stack.factory.appends_fenced == 1
    assert other_broker.open(first.position.ledger_id).last_add_confirmed == first.position.entry_id
    stack.close()


def test_an_append_to_an_empty_ledger_another_writer_recovered_and_deleted_fails_fenced(stack: Stack) -> None:
    """A new owner that finds the last ledger empty drops it from the list and deletes it; the
    old owner, still holding that ledger as its current one, must not have an append
    acknowledged there (no list names the ledger: the message would be lost)."""
    ml, _ = stack.open("t/ns/persistent/emptied-by-another", ManagedLedgerConfig())
    empty = ml.ledger_infos()[-1].ledger_id  # its current ledger, nothing appended yet
    other_broker = ManagedLedgerFactory(stack.store, LedgerManager(stack.store, stack.ledgers.client, stack.clock),
                                        EntryCache(1 << 20), stack.clock)
    taken = other_broker.open("t/ns/persistent/emptied-by-another", ManagedLedgerConfig())
    assert empty not in [i.ledger_id for i in taken.ledger_infos()]  # recovered empty: dropped and deleted
    entry = encode_entry([Message(b"after")], producer_name="test", sequence_id=1, publish_time_ms=0)
    with pytest.raises(LedgerFenced):
        ml.append([entry], [1]).result(timeout=10)
    other_broker.close_all()
    stack.close()


def test_offsets_continue_after_every_ledger_was_trimmed(data_dir: str) -> None:
    stack = open_stack(data_dir)
    ml, cursors = stack.open("t/ns/persistent/emptied")
    sub = cursors.open("sub", initial="earliest")
    append_messages(ml, [b"a", b"b", b"c"])
    sub.ack_cumulative(2).result(timeout=10)
    cursors.close()
    stack.close()
    stack = open_stack(data_dir, stack.clock)
    ml, cursors = stack.open("t/ns/persistent/emptied")
    assert ml.trim() != []  # the only ledger with entries goes
    cursors.close()
    stack.close()
    stack = open_stack(data_dir, stack.clock)
    ml, cursors = stack.open("t/ns/persistent/emptied")
    assert append_messages(ml, [b"d"]).first_offset == 3
    restored = cursors.get("sub")
    assert restored is not None and restored.backlog_messages() == 1
    stack.close()


def test_an_offset_lookup_reads_at_most_a_sample_interval_of_entries_from_the_bookies(
        data_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing cached (a reopened stack), a lookup of an offset just past a sample reads one
    run of at most 64 entries (the sample interval) from the bookies, not the read run of a
    sequential reader (256), whatever else the ledger holds after it."""
    config = dataclasses.replace(ManagedLedgerConfig(), index_interval_entries=64)
    stack = open_stack(data_dir)
    ml, _ = stack.open("lookups", config)
    for _ in range(300):
        append_messages(ml, [b"x"])
    stack.close()
    stack = open_stack(data_dir, stack.clock)
    ml, _ = stack.open("lookups", config)
    runs: list[int] = []
    read_run = ml._reads._read_run

    def counting(*args: Any) -> list[Any]:
        run = read_run(*args)
        runs.append(len(run))
        return run

    monkeypatch.setattr(ml._reads, "_read_run", counting)
    position, index = ml.offset_to_position(70)
    assert (position.entry_id, index) == (70, 0)
    assert 0 < sum(runs) <= 64
    stack.close()


def test_an_offset_lookup_reads_forward_a_bounded_number_of_bytes(data_dir: str) -> None:
    """Entries of 1-3 KB with a 4 KiB byte interval: every lookup reads at most five entries
    from its sample (64 by the entry interval alone), before and after recovery rebuilt the
    current ledger's sparse index."""
    config = dataclasses.replace(ManagedLedgerConfig(), index_interval_entries=64, index_interval_bytes=4096)
    rng = random.Random(7)
    sizes = [rng.randint(1000, 3000) for _ in range(150)]
    stack = open_stack(data_dir)
    ml, _ = stack.open("large-entries", config)
    for offset, size in enumerate(sizes):
        assert append_messages(ml, [bytes([offset % 256]) * size]).first_offset == offset

    def entries_read_by_lookups(stack: Stack, ml: ManagedLedger) -> list[int]:
        reads = []
        for offset in range(len(sizes)):
            before = stack.cache.statistics()
            position, index = ml.offset_to_position(offset)
            after = stack.cache.statistics()
            assert (position.entry_id, index) == (offset, 0)
            reads.append(after.hits + after.misses - before.hits - before.misses)
        return reads

    assert max(entries_read_by_lookups(stack, ml)) <= 5
    stack.close()
    stack = open_stack(data_dir)
    ml, _ = stack.open("large-entries", config)
    assert max(entries_read_by_lookups(stack, ml)) <= 5
    stack.close()


def _nodes(store: MetadataStore, path: str = "/") -> dict[str, int]:
    """Every node under ``path`` with its version."""
    found = {}
    stat = store.get(path)
    if stat is not None:
        found[path] = stat.version
    for child in store.children(path):
        found.update(_nodes(store, f"{path.rstrip('/')}/{child}"))
    return found


def test_after_another_broker_took_the_topic_over_no_append_of_the_old_owner_is_acknowledged(stack: Stack) -> None:
    """The old owner's first append fails on the fenced ledger; its next ones fail too, as fenced
    and at once: a ledger it opened instead could not enter the ledger list the new owner
    rewrote (anything acknowledged in it would be lost), and the old owner writes nothing to
    the metadata the new owner now keeps (no samples of the fenced ledger, no new ledger)."""
    old, _ = stack.open("t/ns/persistent/taken", ManagedLedgerConfig())
    append_messages(old, [b"before"])
    new_owner = ManagedLedgerFactory(stack.store, LedgerManager(stack.store, stack.ledgers.client, stack.clock),
                                     EntryCache(1 << 20, clock=stack.clock), stack.clock)
    taken = new_owner.open("t/ns/persistent/taken", ManagedLedgerConfig())  # recovers (fences) the last ledger
    metadata = _nodes(stack.store)
    for i in range(3):  # the add to the fenced ledger; then refused at once
        with pytest.raises(LedgerFenced):
            append_messages(old, [f"late {i}".encode()])
    assert stack.factory.appends_fenced == 3
    old.close()
    assert _nodes(stack.store) == metadata
    append_messages(taken, [b"on the new owner"])
    stored = [decode_entry(e.data).messages[0].payload for e in taken.read_entries(taken.first_position(), 100)]
    assert stored == [b"before", b"on the new owner"]
    new_owner.close_all()
    stack.close()


def test_an_old_owner_whose_next_append_is_due_to_roll_over_writes_nothing_and_deletes_nothing(stack: Stack) -> None:
    """The first append after the fence finds a rollover due: closing the fenced ledger fails as
    fenced, so the old owner neither saves that ledger's samples nor opens another, and a
    terminate or delete sent to it is refused instead of touching the new owner's topic."""
    config = ManagedLedgerConfig.test_min()
    old, _ = stack.open("t/ns/persistent/rolled", config)
    for i in range(config.ledger_entries_max):  # the next append rolls over
        append_messages(old, [f"m{i}".encode()])
    new_owner = ManagedLedgerFactory(stack.store, LedgerManager(stack.store, stack.ledgers.client, stack.clock),
                                     EntryCache(1 << 20, clock=stack.clock), stack.clock)
    taken = new_owner.open("t/ns/persistent/rolled", config)
    metadata = _nodes(stack.store)
    with pytest.raises(LedgerFenced):
        append_messages(old, [b"late"])
    assert stack.factory.appends_fenced == 1
    with pytest.raises(LedgerFenced):
        old.terminate()
    with pytest.raises(LedgerFenced):
        old.delete()
    old.close()
    assert _nodes(stack.store) == metadata
    assert not taken.terminated
    append_messages(taken, [b"on the new owner"])
    new_owner.close_all()
    stack.close()


def test_after_a_takeover_the_old_owners_cursor_persists_nothing_and_the_new_owners_goes_on(stack: Stack) -> None:
    """The new owner restores the cursor (fencing its ledger) and writes its snapshot back: the
    old owner's acks then fail as fenced, whether its next persist appends to the fenced cursor
    ledger or starts a new one (a compare-and-set on the old version), and nothing it does
    changes the metadata; the new owner's acks persist, and a restore after it finds them."""
    old, old_cursors = stack.open("t/ns/persistent/acks", ManagedLedgerConfig())
    for i in range(6):
        append_messages(old, [f"m{i}".encode()])
    sub = old_cursors.open("sub", initial="earliest")
    sub.ack_cumulative(0).result(timeout=10)  # the old owner's cursor has a ledger
    new_owner = ManagedLedgerFactory(stack.store, LedgerManager(stack.store, stack.ledgers.client, stack.clock),
                                     EntryCache(1 << 20, clock=stack.clock), stack.clock)
    taken = new_owner.open("t/ns/persistent/acks", ManagedLedgerConfig())
    new_cursors = CursorManager(taken, new_owner.ledgers, stack.store)
    restored = new_cursors.get("sub")
    assert restored is not None and restored.mark_delete_offset == 1
    metadata = _nodes(stack.store)
    with pytest.raises(LedgerFenced):  # appended to the cursor ledger the new owner fenced
        sub.ack_cumulative(2).result(timeout=10)
    with pytest.raises(LedgerFenced):  # refused at once: no new cursor ledger, no snapshot swap
        sub.ack_cumulative(3).result(timeout=10)
    assert _nodes(stack.store) == metadata
    restored.ack_cumulative(4).result(timeout=10)
    restored.ack_cumulative(5).result(timeout=10)
    again = CursorManager(taken, new_owner.ledgers, stack.store).get("sub")
    assert again is not None and again.mark_delete_offset == 6
    new_owner.close_all()
    stack.close()


def test_a_group_of_entries_that_would_pass_the_entry_bound_starts_a_new_ledger(stack: Stack) -> None:
    """Pulsar never puts more than ``managedLedgerMaxEntriesPerLedger`` entries in a ledger: a
    group of entries (one append, never split) that would pass the bound rolls over first."""
    config = dataclasses.replace(ManagedLedgerConfig.test_min(), ledger_entries_max=5)
    ml, _ = stack.open("t/ns/persistent/grouped", config)
    for i in range(3):
        append_messages(ml, [f"single-{i}".encode()])
    group = [encode_entry([Message(payload=f"grouped-{i}".encode())], producer_name="test", sequence_id=i,
                          publish_time_ms=0) for i in range(4)]
    results = ml.append(group, [1] * len(group)).result(timeout=10)
    assert len({r.position.ledger_id for r in results}) == 1  # the group stays in one ledger...
    entries = [info.entries for info in ml.ledger_infos()]
    assert entries == [3, 4], entries  # ...a new one: before the fix, [7]
    assert max(entries) <= config.ledger_entries_max


def test_a_read_takes_cached_runs_at_once_and_counts_each_entry_once(stack: Stack) -> None:
    """Entries 0-3 in the broker's cache, 4-5 too large for it, 6-7 cached again: a read of all
    eight takes the cached runs at once and the large entries from the bookie (a run of one
    each, by their size), with the same entries and offsets, and looks each entry up in the
    cache once: six hits, two misses."""
    ml, _ = stack.open("cached-runs")
    large = stack.cache.capacity_bytes  # past the cache's watermark: never cached
    payloads = [b"a", b"b", b"c", b"d", b"e" * large, b"f" * large, b"g", b"h"]
    for payload in payloads:
        append_messages(ml, [payload])
    start, _ = ml.offset_to_position(0)
    before = stack.cache.statistics()
    entries = ml.read_entries(start, 8, max_bytes=1 << 30)
    after = stack.cache.statistics()
    assert [decode_entry(e.data).messages[0].payload for e in entries] == payloads
    assert [(e.first_offset, e.last_offset) for e in entries] == [(i, i) for i in range(8)]
    assert (after.hits - before.hits, after.misses - before.misses) == (6, 2)


def test_a_tailing_read_longer_than_a_run_is_served_from_the_cache_alone(stack: Stack) -> None:
    ml, _ = stack.open("tailing")
    for i in range(READ_RUN_ENTRIES_MAX + 44):
        append_messages(ml, [b"%d" % i])
    start, _ = ml.offset_to_position(0)
    before = stack.cache.statistics()
    entries = ml.read_entries(start, READ_RUN_ENTRIES_MAX + 44, max_bytes=1 << 30)
    after = stack.cache.statistics()
    assert [e.first_offset for e in entries] == list(range(READ_RUN_ENTRIES_MAX + 44))
    assert (after.hits - before.hits, after.misses - before.misses) == (READ_RUN_ENTRIES_MAX + 44, 0)
