"""Seeded simulation of the key index (event streams) against a trivially correct model.

Role: drive a real in-process broker (``BrokerService`` over ``BrokerConfig.test_min()``, so
ledgers roll every five entries, its embedded bookie over a ``FaultyFileIO``, the RocksDB
metadata store) with one topic, sometimes also a partitioned one, and 3-12 keys through a random
sequence of: appends of 1-4 keyed and keyless messages in one entry (several keys per entry),
conditional appends with right and wrong expectations (-1, the exact version, ``exists``),
pipelined appends (several in flight, conditional ones against the versions of those before
them), forced checkpoints (``PartitionKeys.checkpoint`` or ``KeyIndex.flush``), compactions
(``cleanup``), trims by a retention that keeps nothing (``maintenance.run``), clean restarts,
crashes (``FaultyFileIO.crash`` at once, at a journal failpoint, or in the middle of a
checkpoint's segment write; nothing closed or written after it, then ``lose_unsynced``),
unloads and reloads of a topic (graceful or abandoned) with the old partition's late checkpoint
refused, and takeovers by a second ``BrokerService`` over the same metadata and ledgers (as
another broker of a cluster), the first one's late checkpoint and late append refused. Each
seed also shrinks the index's bounds (segments before a compaction, rows before a checkpoint,
cached heads, block size), so compactions, checkpoints while entries are read again on open,
head evictions and multi-block segments happen within a few operations.

The model (``key_index_model.py``): per stream the acknowledged (version, payload, offset); per
partition its next offset and the first offset retention kept.

What is checked, after every operation:
- each acknowledged append got the model's next versions and offsets; a conditional append is
  accepted iff the model says so, and a refused one wrote nothing and reports the model's
  current versions of the keys it expected;
- every stream's ``stream_info`` (version, first kept version, first and last offsets) equals
  the model, and the streams an operation touched read back (``read_stream`` forwards from the
  start, from a random version, and backwards) exactly as the model's kept events, with
  payloads and offsets; a trimmed version raises ``DataLost`` naming the first kept one;
  versions never restart after trims, restarts, crashes or takeovers;
- a trim never passes the index's durable watermark;
- after a crash: every acknowledged version is readable, an append in flight at the crash is
  absent or present with exactly the next versions (a prefix of them per partition), and the
  next conditional append against the last version (acknowledged or recovered) succeeds;
- a checkpoint by a partition that another opening replaced writes nothing (the record's
  compare-and-set refuses it) and leaves the record as the new owner wrote it.

No assertion depends on timing: the key index's checkpoint thread may write whenever a seed's
small ``KEY_INDEX_CHECKPOINT_ROWS`` wakes it, and the model accepts every outcome a correct index may give.

Replay: a failure prints ``replay with MAGNETAR_SIM_SEED=<n>`` and the trace's tail;
``MAGNETAR_SIM_SEEDS`` (a count or a list) and ``MAGNETAR_SIM_OPS`` run more or longer seeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, cast

import pytest

from broker import limits
from broker.bookkeeper.ledger_metadata import LEDGERS_PATH, read_ledger_metadata
from broker.dcb import DcbEvent, QueryItem, check_query
from broker.entry_format import Message, decode_entry
from broker.errors import DataLost, DcbConditionFailed, KeyVersionMismatch, MagnetarError, NoSuchLedger
from broker.key_index import PartitionKeys
from broker.key_index import index as key_index_module
from broker.key_index import partition as key_partition
from broker.key_index import segment as key_segment
from broker.key_index.checkpoint import Checkpoint, record_path
from broker.key_index.derived import tag_key, type_key
from broker.message_fields import EXISTS, ExpectedVersion
from broker.service import BrokerConfig, BrokerService
from broker.topic import PublishResult
from broker.topic_name import TopicName
from storage.fileio import FaultyFileIO
from tests.publishing import publish
from tests.simulation.key_index_model import Append, PartitionModel, SharedStack, StreamModel, World, by_partition
from tests.simulation.seeds import ops_per_seed, run_with_replay_hint, seeds_to_run
from tests.unit.broker_stack import FakeClock

if TYPE_CHECKING:
    from broker.cluster import ClusterStorage

pytestmark = pytest.mark.simulation

DEFAULT_SEEDS = [*range(1, 61), 5055]
"""60 seeds, and 5055: a checkpoint whose first unconfirmed keyed entry lay past a keyless one in
flight recorded an ``indexedTo`` beyond what the crash left, and the index was rebuilt."""
DEFAULT_OPS = 24
RESULT_TIMEOUT_S = 30.0
TRACE_TAIL = 120
KEEP_NOTHING = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
MESSAGES_MAX = 4
READ_ALL = 1 << 20
DCB_TOPIC = TopicName.parse("events")
DCB_TYPES = ["Opened", "Booked"]
DCB_TAGS = ["t0", "t1", "t2"]
JOURNAL_FAILPOINTS = ("journal: before fdatasync", "journal: after fdatasync")
SETTINGS = dataclasses.replace(BrokerConfig.test_min(), maintenance_interval_ms=3_600_000)


class Simulation:
    def __init__(self, seed: int, data_dir: str) -> None:
        self.seed = seed
        self.replay_hint = f"replay with MAGNETAR_SIM_SEED={seed}"
        self.rng = random.Random(seed)
        self.data_dir = data_dir
        self.clock = FakeClock()
        self.trace: list[str] = []
        self.ops = Counter[str]()
        self.events = Counter[str]()
        self.serial = 0
        self.fio = FaultyFileIO(self.rng.randrange(1 << 32))
        self.service = self.start()
        self.service.namespaces.set_policy("public/default", "retention_policies", KEEP_NOTHING)
        self.world = World()
        self.topics = [TopicName.parse("events")]
        if self.rng.random() < 0.5:
            orders = TopicName.parse("orders")
            self.service.topics.create_partitioned(orders, 2)
            self.topics.append(orders)
        self.build_model([f"k{i}" for i in range(self.rng.randint(3, 12))])

    def build_model(self, keys: list[str]) -> None:
        for topic in self.topics:
            partitions = self.service.topics.partitions(topic)
            for name in [topic.partition(i) for i in range(partitions)] if partitions else [topic]:
                self.world.partitions[name] = PartitionModel(name)
                self.service.topics.topic(name)
            for key in keys:
                home = self.service.streams.stream_partition(topic, key)
                self.world.streams[(topic.full_name, key)] = StreamModel(key, topic, home)

    # lifecycle -------------------------------------------------------------------------------
    def start(self, fio: FaultyFileIO | None = None) -> BrokerService:
        service = BrokerService(self.data_dir, SETTINGS, self.clock, fileio=fio or self.fio)
        service.start()
        return service

    def note(self, text: str) -> None:
        self.trace.append(text)

    def describe(self) -> str:
        tail = "\n  ".join(self.trace[-TRACE_TAIL:])
        return f"{self.replay_hint} ({len(self.trace)} steps; last {min(TRACE_TAIL, len(self.trace))}):\n  {tail}"

    def close_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.service.close()

    def run(self, operations: int) -> None:
        table = self.operation_table()
        population = [op for op, _ in table]
        weights = [weight for _, weight in table]
        for _ in range(operations):
            op = self.rng.choices(population, weights)[0]
            self.ops[op.__name__] += 1
            touched = op()
            self.check_infos()
            self.check_dcb()
            for stream in touched or []:
                self.check_reads(stream)
        self.note("final restart")
        self.restart()
        self.verify_all()
        self.service.close()

    def operation_table(self) -> list[tuple[Callable[[], list[StreamModel] | None], int]]:
        return [
            (self.op_append, 30),
            (self.op_append_pipelined, 10),
            (self.op_read, 8),
            (self.op_checkpoint, 8),
            (self.op_cleanup, 4),
            (self.op_trim, 6),
            (self.op_clean_restart, 3),
            (self.op_crash, 5),
            (self.op_unload, 4),
            (self.op_takeover, 3),
            (self.op_dcb_condition, 6),
        ]

    # choosing ----------------------------------------------------------------------------------
    def any_partition(self) -> TopicName:
        return self.rng.choice(sorted(self.world.partitions, key=lambda n: n.full_name))

    def keys_in(self, partition: TopicName) -> list[StreamModel]:
        return sorted(self.world.keys_of(partition), key=lambda s: s.key)

    def random_messages(self, partition: TopicName) -> list[Message]:
        pool = self.keys_in(partition)
        messages = []
        for _ in range(self.rng.randint(1, MESSAGES_MAX)):
            key = self.rng.choice(pool).key if pool and self.rng.random() < 0.8 else None
            self.serial += 1
            messages.append(Message(f"{key}#{self.serial}".encode(), key=key, properties=self.random_dcb()))
        return messages

    def random_dcb(self) -> dict[str, str]:
        """A DCB event's properties (its type and tags) for some messages, none for the others."""
        if self.rng.random() < 0.6:
            return {}
        tags = self.rng.sample(DCB_TAGS, self.rng.randint(0, len(DCB_TAGS)))
        return {"dcb-type": self.rng.choice(DCB_TYPES), "dcb-tags": json.dumps(tags)}

    def random_dcb_item(self) -> QueryItem:
        types = tuple(self.rng.sample(DCB_TYPES, self.rng.randint(0, 1)))
        return QueryItem(types, tuple(self.rng.sample(DCB_TAGS, self.rng.randint(0 if types else 1, 2))))

    def random_expectations(self, partition: TopicName, in_flight: list[Append]) -> dict[str, ExpectedVersion] | None:
        pool = self.keys_in(partition)
        if not pool or self.rng.random() < 0.55:
            return None
        planned = self.world.plan(partition, [], {s.key: -1 for s in pool}, in_flight).current
        expected: dict[str, ExpectedVersion] = {}
        for stream in self.rng.sample(pool, self.rng.randint(1, min(3, len(pool)))):
            current = planned[stream.key]
            expected[stream.key] = self.rng.choice([current, current, current, EXISTS, -1, current + 1, current - 1])
        return expected

    # appending ---------------------------------------------------------------------------------
    def submit(self, partition: TopicName, in_flight: list[Append], *, conditional: bool = True,
               service: BrokerService | None = None) -> Append:
        messages = self.random_messages(partition)
        expected = self.random_expectations(partition, in_flight) if conditional else None
        append = self.world.plan(partition, messages, expected, in_flight)
        self.note(append.describe())
        future: Future[PublishResult]
        try:
            future = publish((service or self.service).topics.topic(partition), messages, producer_name="sim",
                             expected_key_versions=expected)
        except MagnetarError as exc:
            future = Future()
            future.set_exception(exc)
        append.future = future
        return append

    def settle(self, append: Append) -> None:
        """A healthy broker's answer to ``append`` is the model's."""
        assert append.future is not None
        if not append.accepted:
            with pytest.raises(KeyVersionMismatch) as refused:
                append.future.result(timeout=RESULT_TIMEOUT_S)
            assert refused.value.current_key_versions == append.current, (
                f"{append.describe()}: refused reporting {refused.value.current_key_versions}")
            self.events["conditional append refused"] += 1
            return
        result = append.future.result(timeout=RESULT_TIMEOUT_S)
        assert (result.first_offset, result.key_versions) == (append.first_offset, append.versions), (
            f"{append.describe()}: stored at {result.first_offset} with versions {result.key_versions}")
        self.world.stored(append)
        if append.expected:
            self.events["conditional append accepted"] += 1

    def touched(self, appends: list[Append]) -> list[StreamModel]:
        keys = {(a.partition, m.key) for a in appends for m in a.messages if m.key is not None}
        keys |= {(a.partition, k) for a in appends for k in a.expected or {}}
        return [self.world.stream_of_partition(p, k) for p, k in sorted(keys, key=lambda pk: (pk[0].full_name, pk[1]))]

    def op_append(self) -> list[StreamModel]:
        append = self.submit(self.any_partition(), [])
        self.settle(append)
        return self.touched([append])

    def op_append_pipelined(self) -> list[StreamModel]:
        appends = self.submit_many(self.rng.randint(2, 4))
        for append in appends:
            self.settle(append)
        return self.touched(appends)

    def submit_many(self, count: int, *, conditional: bool = True) -> list[Append]:
        one = self.any_partition() if self.rng.random() < 0.7 else None
        appends: list[Append] = []
        for _ in range(count):
            appends.append(self.submit(one or self.any_partition(), appends, conditional=conditional))
        return appends

    # the index's own work -----------------------------------------------------------------------
    def keys(self, partition: TopicName, service: BrokerService | None = None) -> PartitionKeys:
        keys = (service or self.service).topics.topic(partition).streams
        assert keys is not None
        return keys

    def op_checkpoint(self) -> None:
        if self.rng.random() < 0.3:
            self.note("flush every partition's index")
            self.service.key_index.flush()
            return
        partition = self.any_partition()
        rows = self.keys(partition).checkpoint()
        self.note(f"checkpoint {partition.local_name}: {rows} rows")

    def op_cleanup(self) -> None:
        before = self.service.key_index.statistics().compactions
        self.service.key_index.cleanup()
        after = self.service.key_index.statistics().compactions
        self.note(f"cleanup: {after - before} compactions")
        self.events["compactions seen by a cleanup"] += after - before

    def op_trim(self) -> list[StreamModel]:
        """Retention keeps nothing: maintenance trims every ledger the key index let go."""
        if self.rng.random() < 0.5:
            self.service.key_index.flush()
        self.clock.advance(self.rng.choice([1.0, 61.0]))
        self.service.maintenance.run()
        moved = []
        for name, part in sorted(self.world.partitions.items(), key=lambda item: item[0].full_name):
            first = self.service.topics.topic(name).ml.first_offset
            watermark = self.keys(name).durable_watermark
            assert part.first_offset <= first, f"{name}: first offset went back from {part.first_offset} to {first}"
            if first > part.first_offset:
                assert first <= watermark, f"{name}: trimmed to {first}, past the key index's watermark {watermark}"
                self.events["trims"] += 1
                moved.append(name)
            part.first_offset = first
        self.note(f"trim: first offsets {[(n.local_name, p.first_offset) for n, p in self.world.partitions.items()]}")
        return [s for s in self.world.streams.values() if s.partition in moved]

    # restarts, crashes, unloads, takeovers -------------------------------------------------------
    def restart(self) -> None:
        stats = self.service.key_index.statistics()
        self.events["entries read again on open"] += stats.entries_replayed
        self.events["checkpoints"] += stats.checkpoints
        self.events["compactions"] += stats.compactions
        self.service.close()
        self.fio = FaultyFileIO(self.rng.randrange(1 << 32))
        self.service = self.start()

    def op_clean_restart(self) -> list[StreamModel]:
        self.note("clean restart")
        self.restart()
        return list(self.world.streams.values())

    def op_crash(self) -> list[StreamModel]:
        """Crash at once, at a journal failpoint, or while a checkpoint writes its segment."""
        where = self.rng.choice(["at once", "at once", "journal", "checkpoint"])
        if where == "journal":
            failpoint = self.rng.choice(JOURNAL_FAILPOINTS)
            self.note(f"arm crash at {failpoint!r}")
            self.fio.crash_at(failpoint, self.rng.randint(0, 2))
        appends = self.submit_many(self.rng.randint(0, 4))
        if where == "checkpoint":
            self.crash_in_checkpoint()
        self.note(f"crash {where} with {len(appends)} appends in flight")
        self.fio.crash()
        in_doubt = self.settle_at_crash(appends)
        self.crash_stop()
        self.fio.lose_unsynced()
        self.fio = FaultyFileIO(self.rng.randrange(1 << 32))
        self.service = self.start()
        self.reconcile(in_doubt)
        self.verify_all()
        self.append_after_crash(in_doubt)
        return list(self.world.streams.values())

    def crash_in_checkpoint(self) -> None:
        self.fio.crash_at(self.rng.choice(JOURNAL_FAILPOINTS), 0)
        partition = self.any_partition()
        try:
            rows = self.keys(partition).checkpoint()
            self.note(f"checkpoint {partition.local_name} before the crash: {rows} rows")
        except (MagnetarError, OSError) as exc:
            self.note(f"checkpoint {partition.local_name} cut by the crash: {exc!r}")
            self.events["checkpoint cut by a crash"] += 1

    def settle_at_crash(self, appends: list[Append]) -> list[Append]:
        """Acknowledged appends join the model; the accepted ones that failed are in doubt (after
        one of a partition failed, none of its later ones may succeed)."""
        in_doubt: list[Append] = []
        for append in appends:
            assert append.future is not None
            error = self.wait_quietly(append.future)
            if not append.accepted:
                assert error is not None, f"{append.describe()}: stored although the model refuses it"
            elif error is None:
                assert all(d.partition != append.partition for d in in_doubt), (
                    f"{append.describe()}: acknowledged after an earlier append of its partition failed")
                self.settle(append)
            else:
                in_doubt.append(append)
        self.note("in doubt: " + ", ".join(f"{a.partition.local_name}@{a.first_offset}" for a in in_doubt))
        return in_doubt

    @staticmethod
    def wait_quietly(future: Future[PublishResult]) -> BaseException | None:
        try:
            future.result(timeout=RESULT_TIMEOUT_S)
        except (MagnetarError, OSError) as exc:
            return exc
        return None

    def crash_stop(self) -> None:
        """What a dead process leaves: no metadata write after the crash, nothing flushed."""
        self.service.store.close()
        try:
            self.service.close()
        except (MagnetarError, OSError) as exc:
            self.note(f"closing the crashed broker: {exc!r}")

    def reconcile(self, in_doubt: list[Append]) -> None:
        """Recovery keeps a prefix of each partition's in-doubt appends, stored exactly."""
        for name, appends in by_partition(in_doubt):
            ml = self.service.topics.topic(name).ml
            recovered_next = ml.confirmed_next_offset()
            part = self.world.partitions[name]
            assert recovered_next >= part.next_offset, f"{name} lost acknowledged appends: {recovered_next}"
            for append in appends:
                if part.next_offset >= recovered_next:
                    break
                entry = ml.read_entry(ml.offset_to_position(append.first_offset)[0])
                stored = [(m.key, m.payload) for m in decode_entry(entry.data).messages]
                assert stored == [(m.key, m.payload) for m in append.messages], (
                    f"{append.describe()}: recovered as {stored}")
                self.note(f"recovered {append.describe()}")
                self.events["in-doubt append recovered"] += 1
                self.world.stored(append)
            assert recovered_next == part.next_offset, f"{name} recovered to {recovered_next}, not {part.next_offset}"
            self.events["in-doubt append absent"] += sum(1 for a in appends if a.first_offset >= recovered_next)

    def append_after_crash(self, in_doubt: list[Append]) -> None:
        """The next conditional append against each in-doubt key's version succeeds."""
        for stream in self.touched(in_doubt):
            self.serial += 1
            message = Message(f"{stream.key}#{self.serial}".encode(), key=stream.key)
            append = self.world.plan(stream.partition, [message], {stream.key: stream.version}, [])
            self.note(f"after the crash: {append.describe()}")
            append.future = publish(self.service.topics.topic(stream.partition), [message], producer_name="sim",
                                    expected_key_versions=append.expected)
            self.settle(append)
            self.check_reads(stream)

    def op_unload(self) -> list[StreamModel]:
        """Unload a partition (gracefully or abandoning it) and load it again: the old
        partition's late checkpoint is refused by the record's compare-and-set."""
        partition = self.any_partition()
        graceful = self.rng.random() < 0.5
        old = self.keys(partition)
        if self.rng.random() < 0.7:
            self.settle(self.submit(partition, [], conditional=False))  # a confirmed row for the late checkpoint
        self.note(f"unload {partition.local_name} ({'graceful' if graceful else 'abandoned'}) and load it again")
        self.service.topics.unload(lambda name: name == partition, graceful)
        self.keys(partition)
        self.late_checkpoint(self.service, old, partition)
        return self.keys_in(partition)

    def late_checkpoint(self, owner: BrokerService, old: PartitionKeys, partition: TopicName) -> None:
        owner.key_index.flush()  # the owner's own rows written: its checkpoint thread has nothing to write now
        path = record_path(partition.managed_ledger_name)
        before = owner.store.get(path)
        rows = old.checkpoint()
        self.note(f"late checkpoint of the replaced index of {partition.local_name}: {rows} rows, "
                  f"{'refused' if old.taken_over else 'nothing to write'}")
        after = owner.store.get(path)
        assert rows == 0, f"a replaced index of {partition} checkpointed {rows} rows"
        assert before is not None and after is not None and (before.version, before.value) == (
            after.version, after.value), f"a replaced index of {partition} changed the record"
        if old.taken_over:
            self.events["late checkpoint refused"] += 1

    def op_takeover(self) -> list[StreamModel]:
        """Another broker (a second service over the same metadata and ledgers) takes every
        topic over, appends, and gives them back; the first one's late checkpoints and appends
        are refused meanwhile."""
        first = self.service
        partitions = sorted(self.world.partitions, key=lambda n: n.full_name)
        old = {name: self.keys(name) for name in partitions}
        self.settle(self.submit(self.any_partition(), [], conditional=False))
        self.note("takeover by a second broker")
        self.check_segment_ledgers()
        cluster = cast("ClusterStorage", SharedStack(first.store, first.key_index.ledgers))
        second = BrokerService(None, SETTINGS, self.clock, cluster=cluster)
        second.start()
        try:
            self.serve_from(second, first, old)
        finally:
            second.topics.unload(lambda name: True, True)
            second.close()
        self.service = first
        first.topics.unload(lambda name: True, False)  # it lost them: abandoned without a write
        for name in partitions:
            self.keys(name)
        self.note("the first broker serves again")
        return list(self.world.streams.values())

    def serve_from(self, second: BrokerService, first: BrokerService, old: dict[TopicName, PartitionKeys]) -> None:
        # the first broker's appends are refused by the fence on its open ledger, also when the
        # second found it empty and deleted it (the bookie keeps the fence of a deleted ledger)
        for name in old:
            self.keys(name, second)
        for name, keys in old.items():
            self.late_checkpoint(second, keys, name)
        late = self.submit(self.rng.choice(sorted(old, key=lambda n: n.full_name)), [], conditional=False,
                           service=first)
        assert late.future is not None and self.wait_quietly(late.future) is not None, (
            f"{late.describe()}: the first broker appended to a topic another took over")
        self.events["late append refused"] += 1
        self.service = second
        self.verify_all()
        for append in self.submit_many(self.rng.randint(1, 3)):
            self.settle(append)

    # verification ------------------------------------------------------------------------------
    def check_infos(self) -> None:
        """Offsets of every partition and ``stream_info`` of every stream equal the model."""
        for name, part in self.world.partitions.items():
            ml = self.service.topics.topic(name).ml
            assert (ml.confirmed_next_offset(), ml.first_offset) == (part.next_offset, part.first_offset), (
                f"{name}: next/first offsets {(ml.confirmed_next_offset(), ml.first_offset)}, "
                f"model {(part.next_offset, part.first_offset)}")
        for stream in self.world.streams.values():
            first_offset = self.world.partitions[stream.partition].first_offset
            kept = stream.kept(first_offset)
            info = self.service.streams.stream_info(stream.topic, stream.key)
            got = (info.version, info.first_version, info.first_offset, info.last_offset)
            want = (stream.version, stream.first_version(first_offset), kept[0].offset if kept else None,
                    kept[-1].offset if kept else None)
            assert got == want, f"stream_info {stream.key!r} of {stream.topic.local_name}: {got}, model {want}"

    def read(self, stream: StreamModel, start: int | None, count: int, *,
             backward: bool = False) -> list[tuple[int, bytes, int]]:
        read = self.service.streams.read_stream(stream.topic, stream.key, start, count, READ_ALL, backward=backward)
        columns = [read.batch.column(c).to_pylist() for c in ("keyVersion", "value", "offset")]
        return list(zip(*columns, strict=True))

    def check_reads(self, stream: StreamModel) -> None:
        """The whole stream, from a random version forwards, and backwards, as the model."""
        first_offset = self.world.partitions[stream.partition].first_offset
        kept = [(e.version, e.payload, e.offset) for e in stream.kept(first_offset)]
        label = f"stream {stream.key!r} of {stream.topic.local_name}"
        assert self.read(stream, None, READ_ALL) == kept, f"{label} reads {self.read(stream, None, READ_ALL)}"
        first_version = stream.first_version(first_offset)
        start = self.rng.randint(0, stream.version + 1)
        count = self.rng.randint(1, 4)
        backward = self.rng.random() < 0.4
        lowest = min(start, stream.version)
        probe = lowest if backward else start
        if 0 <= probe <= stream.version and probe < first_version:
            with pytest.raises(DataLost) as lost:
                self.read(stream, start, count, backward=backward)
            assert lost.value.details() == {"firstVersion": first_version}, f"{label}: {lost.value.details()}"
            self.events["trimmed version read as DataLost"] += 1
            return
        if backward:
            want = [row for row in reversed(kept) if lowest - count < row[0] <= lowest]
        else:
            want = [row for row in kept if start <= row[0] < start + count]
        got = self.read(stream, start, count, backward=backward)
        assert got == want, f"{label} from {start} ({count}, backward={backward}): {got}, model {want}"

    def check_dcb(self) -> None:
        """Every derived stream of every partition from a random offset on, and a DCB read of
        a random item in the unpartitioned topic, as the model's kept DCB events."""
        for name, part in self.world.partitions.items():
            keys = self.keys(name)
            start = self.rng.randint(0, part.next_offset)
            for derived in [type_key(t) for t in DCB_TYPES] + [tag_key(t) for t in DCB_TAGS]:
                rows = keys.rows_from_offset(derived, start, READ_ALL)
                got = [r.offset for r in rows if r.offset >= part.first_offset]  # trimmed rows wait for compaction
                want = [o for o, _, found in part.dcb_kept(start) if derived in found]
                assert got == want, f"derived stream {derived!r} of {name.local_name} from {start}: {got}, model {want}"
        part = self.world.partitions[DCB_TOPIC]
        item, after = self.random_dcb_item(), self.rng.randint(0, part.next_offset)
        read = self.service.streams.dcb.read(DCB_TOPIC, [item], after, READ_ALL, READ_ALL)
        wanted = check_query([item])[0]
        events = [(o + 1, p) for o, p, found in part.dcb_kept(after) if wanted.matches(found)]
        assert [(e.position, e.event.data) for e in read.events] == events, f"DCB read {item} after {after}"

    def op_dcb_condition(self) -> list[StreamModel]:
        """A DCB append on the condition of a random item after a random position: refused iff
        the model holds a kept event matching it after that position, else stored next."""
        part = self.world.partitions[DCB_TOPIC]
        item, after = self.random_dcb_item(), self.rng.randint(0, part.next_offset)
        wanted = check_query([item])[0]
        matches = [o for o, _, found in part.dcb_kept(after) if wanted.matches(found)]
        self.serial += 1
        event = DcbEvent(self.rng.choice(DCB_TYPES), f"dcb#{self.serial}".encode(), tuple(self.rng.sample(DCB_TAGS, 1)))
        message = Message(event.data, properties={"dcb-type": event.type, "dcb-tags": json.dumps(list(event.tags))})
        append = self.world.plan(DCB_TOPIC, [message], None, [])
        verdict = f"refuses at {matches[0]}" if matches else "stores"
        self.note(f"DCB append on {item} after {after}: the model {verdict}")
        if matches:
            with pytest.raises(DcbConditionFailed) as refused:
                self.service.streams.dcb.append(DCB_TOPIC, [event], [item], after, "sim-dcb")
            assert refused.value.position == matches[0] + 1, f"refused naming {refused.value.position}"
            self.events["DCB condition refused"] += 1
            return []
        result = self.service.streams.dcb.append(DCB_TOPIC, [event], [item], after, "sim-dcb")
        assert result.position == append.first_offset + 1, f"DCB append stored at {result.position}"
        self.world.stored(append)
        self.events["DCB condition met"] += 1
        return []

    def op_read(self) -> list[StreamModel]:
        return [self.rng.choice(sorted(self.world.streams.values(), key=lambda s: (s.topic.full_name, s.key)))]

    def verify_all(self) -> None:
        self.note("verify all")
        self.check_infos()
        for stream in self.world.streams.values():
            self.check_reads(stream)
        self.check_segment_ledgers()

    def check_segment_ledgers(self) -> None:
        """Every segment ledger is named by its partition's record (as a segment or pending).

        The checkpoint thread may write meanwhile, so the order matters: the ledgers are listed
        first and the records read after. A ledger is named before it is created and unnamed
        only after it is deleted, so one listed and then found in no record must have been
        deleted in between, which reading its metadata again tells."""
        store = self.service.store
        segment_ledgers: dict[int, str] = {}
        for child in store.children(LEDGERS_PATH):
            with contextlib.suppress(NoSuchLedger):  # deleted since the listing
                meta, _ = read_ledger_metadata(store, int(child))
                if "key-index" in meta.custom:
                    segment_ledgers[int(child)] = meta.custom["key-index"]
        named: set[int] = set()
        for name in self.world.partitions:
            record = store.get(record_path(name.managed_ledger_name))
            if record is not None:
                found = Checkpoint.from_bytes(record.value)
                named |= {s.ledger_id for s in found.segments} | set(found.pending)
        for ledger_id, owner in segment_ledgers.items():
            if ledger_id not in named:
                with contextlib.suppress(NoSuchLedger):
                    read_ledger_metadata(store, ledger_id)
                    raise AssertionError(f"segment ledger {ledger_id} of {owner} is named nowhere "
                                         f"(the records name {sorted(named)})")


def shrink_the_bounds(rng: random.Random, monkeypatch: pytest.MonkeyPatch) -> str:
    """Small bounds so the index's rarer paths run within a few operations (per seed)."""
    settings = {
        "KEY_INDEX_SEGMENTS_MAX": rng.choice([1, 2, 3, 8]),
        "KEY_INDEX_CHECKPOINT_ROWS": rng.choice([3, 8, 100_000]),
        "KEY_HEADS_CACHED_MAX": rng.choice([1, 4, 100_000]),
    }
    for name, value in settings.items():
        monkeypatch.setattr(key_partition, name, value)
    block_bytes = rng.choice([40, 200, limits.SEGMENT_BLOCK_BYTES_MAX])
    monkeypatch.setattr(key_segment, "SEGMENT_BLOCK_BYTES_MAX", block_bytes)
    monkeypatch.setattr(key_index_module, "KEY_INDEX_CHECK_INTERVAL_S", 0.05)
    return f"{settings} SEGMENT_BLOCK_BYTES_MAX={block_bytes}"


@pytest.mark.parametrize("seed", seeds_to_run(DEFAULT_SEEDS), ids=lambda s: f"seed={s}")
def test_random_stream_operations_match_the_model(seed: int, monkeypatch: pytest.MonkeyPatch, data_dir: str) -> None:
    bounds = shrink_the_bounds(random.Random(seed * 7919), monkeypatch)
    sim = Simulation(seed, data_dir)
    sim.note(f"bounds: {bounds}")
    run_with_replay_hint(sim, lambda: sim.run(ops_per_seed(DEFAULT_OPS)))
    print(f"seed {seed}: {dict(sim.ops)}; {dict(sim.events)}")
