"""The grouped add path: many entries through every layer in one call, one future per group.

Checks, layer by layer with real storage (RocksDB, files, fdatasync):
- storage: group adds and single adds interleaved complete in entry order, each group's future
  once, after its last entry is durable; the LAC follows;
- a journal write that fails fails exactly the adds that were in it: every entry of a group is
  refused together, entries acknowledged before stay readable, none of the failed ones is
  readable, and after a restart a failed entry is absent or exact;
- a write cache that stays full refuses a group before its future exists and keeps none of its
  entries; the same entry ids are written once the flush drained;
- ledger and managed ledger: a group's results carry consecutive positions and offsets, in order
  with single adds around them;
- topic: a burst where some messages are refused (too large, a duplicate, a sequence id out of
  range) stores the others, each as its own entry, and answers each message in order; so does a
  group of entries binary clients encoded, stored byte for byte (a partial chunk claims no
  sequence id, and is a duplicate once its message was stored).
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from broker.entry_builder import PreparedEntry, entry_of_client
from broker.entry_format import Message, decode_entry
from broker.errors import InvalidRequest, MagnetarError, MessageTooLarge
from broker.limits import CLIENT_ENTRY_OVERHEAD_BYTES_MAX
from broker.topic import PersistentTopic, PublishResult
from broker.topic_name import TopicName
from storage import InvalidArgument, LedgerStorage, NoSuchEntry, StorageConfig, StorageIOError, WriteCacheFull
from storage.fileio import FaultyFileIO, FileIO
from tests.publishing import publish, publish_each
from tests.unit.broker_stack import Stack, append_messages, open_stack

LEDGER = 9
RESULT_TIMEOUT_S = 10.0
JOURNAL_FILES = ".jnl"


def data(entry_id: int) -> bytes:
    return f"entry {entry_id} of {LEDGER}".encode() * 3


def test_group_and_single_adds_complete_in_entry_order(data_dir: str) -> None:
    completed: list[int] = []
    lock = threading.Lock()

    def record(future: object) -> None:
        with lock:
            completed.append(future.result())  # type: ignore[attr-defined]

    with LedgerStorage.open(data_dir, StorageConfig.test_min()) as st:
        futures = [st.add_entries(LEDGER, [0], [data(0)]),
                   st.add_entries(LEDGER, range(1, 51), [data(e) for e in range(1, 51)]),
                   st.add_entries(LEDGER, [51], [data(51)]),
                   st.add_entries(LEDGER, range(52, 61), [data(e) for e in range(52, 61)])]
        for future in futures:
            future.add_done_callback(record)
        assert [f.result(timeout=RESULT_TIMEOUT_S) for f in futures] == [0, 50, 51, 60]
        assert completed == [0, 50, 51, 60]
        assert st.get_last_add_confirmed(LEDGER) == 60
        assert all(st.get_entry(LEDGER, e) == data(e) for e in range(61))
        assert st.statistics().entries_added == 61
        with pytest.raises(Exception, match="at least one"):
            st.add_entries(LEDGER, range(61, 61), [])


def test_a_striped_share_of_entries_is_one_add(data_dir: str) -> None:
    """A bookie of a striped ledger (E=3, Qw=2) holds two entries of every three: one group add
    stores exactly those, in one journal item; ids out of order or unpaired are refused whole."""
    share = [e for e in range(30) if e % 3 != 1]
    with LedgerStorage.open(data_dir, StorageConfig.test_min()) as st:
        assert st.add_entries(LEDGER, share, [data(e) for e in share]).result(timeout=RESULT_TIMEOUT_S) == 29
        assert all(st.get_entry(LEDGER, e) == data(e) for e in share)
        for entry_id in (1, 4, 28):
            with pytest.raises(NoSuchEntry):
                st.get_entry(LEDGER, entry_id)
        assert st.get_last_add_confirmed(LEDGER) == 29
        assert st.statistics().entries_added == len(share)
        for ids, datas in (([31, 30], [data(31), data(30)]), ([32, 32], [data(32), data(32)]),
                           ([33, 34], [data(33)])):
            with pytest.raises(InvalidArgument):
                st.add_entries(LEDGER, ids, datas)
        for entry_id in (30, 31, 32, 33):
            with pytest.raises(NoSuchEntry):
                st.get_entry(LEDGER, entry_id)


def test_a_failing_journal_write_fails_exactly_its_adds(data_dir: str) -> None:
    fio = FaultyFileIO(seed=21)
    config = StorageConfig.test_min()
    st = LedgerStorage.open(data_dir, config, fileio=fio)
    try:
        assert st.add_entries(LEDGER, range(10), [data(e) for e in range(10)]).result(timeout=RESULT_TIMEOUT_S) == 9
        fio.inject("sync", "EIO", path_contains=JOURNAL_FILES)
        failed = st.add_entries(LEDGER, range(10, 30), [data(e) for e in range(10, 30)])
        with pytest.raises(StorageIOError):
            failed.result(timeout=RESULT_TIMEOUT_S)
        assert all(st.get_entry(LEDGER, e) == data(e) for e in range(10))
        for entry_id in range(10, 30):
            with pytest.raises(NoSuchEntry):
                st.get_entry(LEDGER, entry_id)
        assert st.get_last_add_confirmed(LEDGER) == 9
    finally:
        st.close()
    with LedgerStorage.open(data_dir, config, fileio=FileIO()) as st:
        assert all(st.get_entry(LEDGER, e) == data(e) for e in range(10))
        for entry_id in range(10, 30):  # written before the failed fdatasync: absent or exact, never torn
            with contextlib.suppress(NoSuchEntry):
                assert st.get_entry(LEDGER, entry_id) == data(entry_id)
        assert st.check_consistency().ok


def test_a_full_write_cache_refuses_the_whole_group(data_dir: str) -> None:
    config = StorageConfig.test_min().replace(write_cache_full_wait_ms=50, flush_interval_ms=600_000)
    with LedgerStorage.open(data_dir, config) as st:
        group = [b"x" * 1000] * (config.write_cache_bytes_max // 1000 + 10)  # more than the cache holds
        with st._flush_lock:  # a stuck flush: the being-flushed buffer cannot drain
            with pytest.raises(WriteCacheFull):
                st.add_entries(LEDGER, range(len(group)), group)
            assert st.statistics().write_cache.size_bytes <= config.write_cache_bytes_max
            for entry_id in (0, len(group) // 2, len(group) - 1):
                with pytest.raises(NoSuchEntry):
                    st.get_entry(LEDGER, entry_id)
        assert st.add_entries(LEDGER, range(2), [data(0), data(1)]).result(timeout=RESULT_TIMEOUT_S) == 1
        assert st.get_entry(LEDGER, 0) == data(0) and st.get_entry(LEDGER, 1) == data(1)


def test_a_managed_ledger_group_has_consecutive_positions_and_offsets(data_dir: str) -> None:
    stack = open_stack(data_dir)
    try:
        ml, _ = stack.open("t/ns/persistent/groups")
        first = append_messages(ml, [b"a", b"b"])  # offsets 0-1 in entry 0
        entries = [publish_entry(i) for i in range(5)]
        results = ml.append(entries, [1, 1, 1, 1, 1]).result(timeout=RESULT_TIMEOUT_S)
        after = append_messages(ml, [b"z"])
        # 1 + 5 entries would pass the ledger's bound of 5: the group starts a new ledger, whole
        assert [(r.position.entry_id, r.first_offset, r.last_offset) for r in results] == [
            (0, 2, 2), (1, 3, 3), (2, 4, 4), (3, 5, 5), (4, 6, 6)]
        assert len({r.publish_time_ms for r in results}) == 1
        assert len({r.position.ledger_id for r in results}) == 1  # a group stays in one ledger
        assert results[0].position.ledger_id != first.position.ledger_id
        assert after.first_offset == 7  # the next add follows (in a new ledger once this one is full)
        assert ml.next_offset == 8 and ml.statistics().entries_added == 7
        for result, entry in zip(results, entries, strict=True):
            stored = ml.read_entry(result.position)
            assert decode_entry(stored.data).messages[0].payload == decode_entry(entry).messages[0].payload
            assert stored.first_offset == result.first_offset
        with pytest.raises(InvalidRequest):
            ml.append(entries, [1, 1])
        with pytest.raises(MessageTooLarge):
            ml.append([entries[0], b"x" * (ml.config.entry_size_bytes_max + 1)], [1, 1])
        assert ml.next_offset == 8  # a refused group wrote nothing
    finally:
        stack.close()


def publish_entry(index: int) -> bytes:
    from broker.entry_format import encode_entry

    return encode_entry([Message(f"g{index}".encode())], producer_name="test", sequence_id=index, publish_time_ms=0)


def open_topic(stack: Stack, name: str, *, message_size_bytes_max: int = 1000) -> PersistentTopic:
    topic_name = TopicName.parse(name)
    ml, cursors = stack.open(topic_name.managed_ledger_name)
    return PersistentTopic(topic_name, ml, cursors, stack.store, clock=stack.clock,
                           message_size_bytes_max=message_size_bytes_max)


def test_a_partly_refused_burst_stores_the_rest_and_answers_each_in_order(data_dir: str) -> None:
    stack = open_stack(data_dir)
    try:
        topic = open_topic(stack, "t/ns/burst")
        publish(topic, [Message(b"first")], producer_name="p", sequence_id=0).result(timeout=RESULT_TIMEOUT_S)
        burst = [Message(b"one"), Message(b"x" * 1001), Message(b"dup", sequence_id=0), Message(b"two"),
                 Message(b"three")]
        sequence_ids: list[int | None] = [None, None, None, None, 2**63]
        outcomes = publish_each(topic, burst, producer_name="p", sequence_ids=sequence_ids).result(
            timeout=RESULT_TIMEOUT_S)
        assert len(outcomes) == 5
        one, too_large, duplicate, two, out_of_range = outcomes
        assert isinstance(one, PublishResult) and isinstance(two, PublishResult)
        assert (one.first_offset, one.count, two.first_offset, two.count) == (1, 1, 2, 1)
        assert one.position.entry_id + 1 == two.position.entry_id  # each its own entry
        assert isinstance(too_large, MessageTooLarge)
        assert isinstance(duplicate, PublishResult) and duplicate.duplicate
        assert isinstance(out_of_range, MagnetarError) and "sequence ids" in str(out_of_range)
        assert topic.ml.next_offset == 3
        assert [m.payload for e in topic.entries_from(0) for m in decode_entry(e.data).messages] == [
            b"first", b"one", b"two"]
        assert topic.last_sequence_id("p") == 2  # "one" took 1, "two" took 2
        again = publish_each(topic, [Message(b"two again")], producer_name="p", sequence_ids=[2]).result(
            timeout=RESULT_TIMEOUT_S)
        assert isinstance(again[0], PublishResult) and again[0].duplicate and topic.ml.next_offset == 3
        refused = publish_each(topic, [Message(b"y" * 2000)], producer_name="p", sequence_ids=[None]).result(
            timeout=RESULT_TIMEOUT_S)
        assert isinstance(refused[0], MessageTooLarge) and topic.ml.next_offset == 3
    finally:
        stack.close()


def client_entry(payloads: list[bytes], sequence_id: int) -> PreparedEntry:
    """An entry as a binary client sends it (checked as the front end checks it)."""
    from broker.entry_format import encode_entry

    data = encode_entry([Message(p) for p in payloads], producer_name="p", sequence_id=sequence_id,
                        publish_time_ms=0)
    return entry_of_client(data, len(payloads), sequence_id, sequence_id + len(payloads) - 1)


def raw_entry(data: bytes | None, sequence_id: int, highest_sequence_id: int, *, partial_chunk: bool = False,
              ) -> PreparedEntry:
    """A one-message entry of ``data`` with the sequence ids as given, unchecked (what the topic
    itself must refuse or accept)."""
    assert data is not None
    return PreparedEntry(data, (), 1, (None,), sequence_id, highest_sequence_id, partial_chunk, size_bytes=len(data))


def test_client_entries_are_stored_byte_for_byte_as_one_group_and_answered_each(data_dir: str) -> None:
    from broker.entry_format import split_prefix

    stack = open_stack(data_dir)
    try:
        topic = open_topic(stack, "t/ns/client-entries", message_size_bytes_max=1000)
        first = topic.append([client_entry([b"first"], 0)], producer_name="p").result(
            timeout=RESULT_TIMEOUT_S)[0]
        assert isinstance(first, PublishResult) and first.first_offset == 0
        adds_before = topic.ml.statistics().entries_added
        one, batch = client_entry([b"one"], 1), client_entry([b"two", b"three"], 2)
        too_large = client_entry([b"x" * 1001 + b"y" * CLIENT_ENTRY_OVERHEAD_BYTES_MAX], 4)
        duplicate = client_entry([b"again"], 0)
        out_of_range = raw_entry(one.data, 7, 6)  # highest below the first
        partial = raw_entry(client_entry([b"chunk"], 9).data, 9, 9, partial_chunk=True)
        group = [one, too_large, duplicate, batch, out_of_range, partial]
        outcomes = topic.append(group, producer_name="p").result(timeout=RESULT_TIMEOUT_S)
        stored_one, refused_large, dup, stored_batch, refused_ids, stored_chunk = outcomes
        assert isinstance(stored_one, PublishResult) and isinstance(stored_batch, PublishResult)
        assert isinstance(stored_chunk, PublishResult)
        assert (stored_one.first_offset, stored_one.count) == (1, 1)
        assert (stored_batch.first_offset, stored_batch.count) == (2, 2)
        assert stored_batch.position.entry_id == stored_one.position.entry_id + 1  # each its own entry
        assert isinstance(refused_large, MessageTooLarge)
        assert isinstance(dup, PublishResult) and dup.duplicate and dup.count == 0
        assert isinstance(refused_ids, InvalidRequest)
        assert topic.ml.statistics().entries_added == adds_before + 3
        for result, sent in ((stored_one, one), (stored_batch, batch)):
            data = topic.ml.read_entry(result.position).data
            assert data[split_prefix(data)[1]:] == sent.data  # the client's bytes, untouched
        assert topic.last_sequence_id("p") == 3  # the partial chunk claimed no sequence id
        chunk_again = raw_entry(partial.data, 3, 3, partial_chunk=True)
        resent = topic.append([chunk_again, client_entry([b"two", b"three"], 2)],
                                       producer_name="p").result(timeout=RESULT_TIMEOUT_S)
        assert all(isinstance(r, PublishResult) and r.duplicate for r in resent)  # its message was stored
        assert topic.ml.next_offset == 5
    finally:
        stack.close()
