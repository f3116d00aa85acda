"""Seeded simulation of managed ledgers and durable cursors against a trivially correct model.

Role: drive the real broker stack (``LedgerStorage`` with ``StorageConfig.test_min()`` over a
``FaultyFileIO``, ``RocksDBMetadataStore``, ``LedgerManager``, ``ManagedLedgerFactory`` with
``ManagedLedgerConfig.test_min()`` so ledgers roll over every few entries, and cursor ledgers
switched every few states) with one or two topics and one to three durable cursors each,
through a random sequence of publishes (single and pipelined batches of 1-5 messages), cursor
reads, individual acks (whole entries and parts of batches), range and cumulative acks, nacks
(rewind, or seek back to a delivered message), seeks, skips, resets, forced ledger rollovers,
trims (also right after a reset, and with acks in flight), cursor creation, clean restarts
(with publishes and acks in flight) and crashes (``FaultyFileIO.crash`` at once, after a short
delay, or at a journal sync failpoint, then ``lose_unsynced``; nothing on the broker side is
closed or flushed).

The model is plain Python: per topic the payload of every acknowledged publish by offset and
the entry boundaries; per cursor the set of acknowledged offsets (mark-delete offset plus the
offsets above it), the read offset, and the states whose persistence is not yet confirmed
(``broker_model.py``, with the stack it drives).

What is checked:
- offsets are gap-free and increasing across ledgers, every acknowledged publish reads back
  with its exact payloads, before and after every restart and crash; a publish that was not
  acknowledged when the crash came is either absent or byte-exact after recovery;
- every read delivers exactly the entries the model expects (from the entry holding the read
  offset, every entry with an unacknowledged message, in order), with the model's payloads;
- after every operation each cursor's mark-delete offset and acknowledged ranges equal the
  model's, and ``backlog_messages`` equals the model's unacknowledged count in
  ``[first_offset, next_offset)``;
- after a clean restart every cursor is restored exactly; after a crash it is restored to a
  state no older than the last one whose ack Future resolved (never a redelivery of a
  persisted ack), and no newer than the last one issued;
- trimming deletes only offsets every cursor (as it is in memory) acknowledged, on entry
  boundaries, and a cursor restored after a crash never starts below the first offset;
- at the end every cursor, rewound, redelivers exactly its unacknowledged offsets (no loss),
  and ``check_consistency().ok`` holds for the storage.

No assertion depends on timing: persistence, flushes and GC run in the background and may
finish at any moment; the model accepts every outcome a correct broker may produce.

Replay: a failure prints ``replay with MAGNETAR_SIM_SEED=<n>``; that variable runs only that
seed. ``MAGNETAR_SIM_SEEDS`` (a count N for seeds 1..N, or a comma-separated list) and
``MAGNETAR_SIM_OPS`` (operations per seed) run longer simulations.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future

import pytest

import broker.cursor
from broker.cursor import ManagedCursor
from broker.entry import Entry
from broker.entry_format import decode_entry
from broker.errors import DataLost, MagnetarError, NoSuchEntry
from tests.simulation.broker_model import (
    ML_CONFIG,
    RESULT_TIMEOUT_S,
    BrokerStack,
    CursorModel,
    CursorState,
    InFlightPublish,
    TopicModel,
    encode,
    random_payload,
    settle_quietly,
)
from tests.simulation.seeds import ops_per_seed, run_with_replay_hint, seeds_to_run
from tests.unit.broker_stack import FakeClock

pytestmark = pytest.mark.simulation

DEFAULT_SEEDS = (1, 2, 3, 8, 21, 24, 2009)
DEFAULT_OPS = 250
CURSORS_MAX = 3
BATCH_MESSAGES_MAX = 5
READ_BATCH_MAX = 6
DRAIN_BATCH = 50
TRACE_TAIL = 60
CURSOR_LEDGER_ENTRIES = 4
"""Cursor states per cursor ledger (the production value is 1000): ledger switches happen often."""
JOURNAL_FAILPOINTS = ("journal: before fdatasync", "journal: after fdatasync")


# --- the simulation ---------------------------------------------------------------------


class Simulation:
    def __init__(self, seed: int, path: str) -> None:
        self.seed = seed
        self.replay_hint = f"replay with MAGNETAR_SIM_SEED={seed}"
        self.rng = random.Random(seed)
        self.path = path
        self.clock = FakeClock()
        self.trace: list[str] = []
        self.ops = Counter[str]()
        self.events = Counter[str]()
        self.topics = {name: TopicModel(name) for name in
                       (f"sim/ns/persistent/topic-{i}" for i in range(self.rng.randint(1, 2)))}
        self.stack = BrokerStack.open(path, self.clock, self.rng.randrange(1 << 32), self.topics)
        for topic in self.topics.values():
            for _ in range(self.rng.randint(1, CURSORS_MAX)):
                self.open_cursor(topic, "earliest")

    # lifecycle ---------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.trace.append(text)

    def describe(self) -> str:
        tail = "\n  ".join(self.trace[-TRACE_TAIL:])
        return f"{self.replay_hint} ({len(self.trace)} steps; last {min(TRACE_TAIL, len(self.trace))}):\n  {tail}"

    def close_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.stack.close_after_crash()

    def run(self, operations: int) -> None:
        table = self.operation_table()
        population = [op for op, _ in table]
        weights = [weight for _, weight in table]
        for _ in range(operations):
            op = self.rng.choices(population, weights)[0]
            self.ops[op.__name__] += 1
            op()
            self.absorb_resolved_acks(healthy=True)
            self.check_cheap()
        self.note("final drain")
        self.drain_and_verify()
        self.note("final close")
        self.stack.close_cleanly()

    def operation_table(self) -> list[tuple[Callable[[], None], int]]:
        return [
            (self.op_publish, 20),
            (self.op_publish_pipelined, 8),
            (self.op_read, 22),
            (self.op_ack, 12),
            (self.op_ack_batch_part, 6),
            (self.op_ack_range, 3),
            (self.op_ack_cumulative, 5),
            (self.op_nack, 6),
            (self.op_seek, 4),
            (self.op_skip, 3),
            (self.op_reset, 2),
            (self.op_rollover, 3),
            (self.op_trim, 3),
            (self.op_open_cursor, 2),
            (self.op_clean_restart, 3),
            (self.op_crash, 4),
        ]

    # choosing ----------------------------------------------------------------------------
    def any_topic(self) -> TopicModel:
        return self.topics[self.rng.choice(sorted(self.topics))]

    def any_cursor(self) -> tuple[TopicModel, CursorModel]:
        topic = self.any_topic()
        return topic, topic.cursors[self.rng.choice(sorted(topic.cursors))]

    def cursor_with_deliveries(self) -> tuple[TopicModel, CursorModel] | None:
        choices = [(t, c) for t in self.topics.values() for c in t.cursors.values() if c.delivered]
        return self.rng.choice(sorted(choices, key=lambda tc: (tc[0].name, tc[1].name))) if choices else None

    def all_cursors(self) -> list[CursorModel]:
        return [c for t in self.topics.values() for c in t.cursors.values()]

    # publishing --------------------------------------------------------------------------
    def submit_publish(self, topic: TopicModel, first_offset: int) -> InFlightPublish:
        payloads = [random_payload(self.rng) for _ in range(self.rng.randint(1, BATCH_MESSAGES_MAX))]
        topic.sequence_id += 1
        data = encode(payloads, topic.sequence_id, int(self.clock() * 1000))
        self.note(f"publish {topic.name} {len(payloads)} msgs at {first_offset}")
        try:
            future = self.stack.ml(topic.name).append([data], [len(payloads)])
        except MagnetarError as exc:  # a crashed storage may refuse at once (a rollover deletes, say)
            if not self.stack.fio.crashed:
                raise
            self.note(f"  refused: {exc!r}")
            future = Future()
            future.set_exception(exc)
        return InFlightPublish(topic.name, payloads, first_offset, future)

    def submit_publishes(self, count: int, topic: TopicModel | None = None) -> list[InFlightPublish]:
        next_offsets = {name: t.next_offset for name, t in self.topics.items()}
        publishes = []
        for _ in range(count):
            chosen = topic or self.any_topic()
            publish = self.submit_publish(chosen, next_offsets[chosen.name])
            next_offsets[chosen.name] += len(publish.payloads)
            publishes.append(publish)
        return publishes

    def acknowledge(self, publish: InFlightPublish) -> None:
        result = publish.future.result(timeout=RESULT_TIMEOUT_S)[0]
        topic = self.topics[publish.topic]
        expected = (topic.next_offset, topic.next_offset + len(publish.payloads) - 1)
        assert publish.first_offset == topic.next_offset, "publishes acknowledged out of order"
        assert (result.first_offset, result.last_offset) == expected, f"publish got {result}, expected {expected}"
        topic.append(publish.payloads)

    def op_publish(self) -> None:
        for publish in self.submit_publishes(1):
            self.acknowledge(publish)

    def op_publish_pipelined(self) -> None:
        topic = self.any_topic() if self.rng.random() < 0.7 else None
        for publish in self.submit_publishes(self.rng.randint(2, 4), topic):
            self.acknowledge(publish)

    def op_rollover(self) -> None:
        """Age the current ledger past ``ledger_age_ms_max``: the next publish starts a new one."""
        topic = self.any_topic()
        self.note(f"rollover {topic.name} by age")
        self.clock.advance(ML_CONFIG.ledger_age_ms_max / 1000 + 1)
        for publish in self.submit_publishes(1, topic):
            self.acknowledge(publish)
            assert publish.future.result()[0].position.entry_id == 0, "an aged ledger did not roll over"

    # reading -----------------------------------------------------------------------------
    def op_read(self) -> None:
        topic, cm = self.any_cursor()
        self.read(topic, cm, self.rng.randint(1, READ_BATCH_MAX))

    def read(self, topic: TopicModel, cm: CursorModel, max_entries: int) -> list[Entry]:
        expected, read_offset = topic.expected_delivery(cm, max_entries)
        self.note(f"read {topic.name} {cm.name} from {cm.read_offset} max {max_entries}")
        entries = self.stack.cursor(topic.name, cm.name).read_entries(max_entries)
        got = [(e.first_offset, e.last_offset) for e in entries]
        want = [topic.entries[i] for i in expected]
        assert got == want, f"{cm.name} of {topic.name} delivered {got}, expected {want}"
        for entry in entries:
            self.check_entry(topic, entry)
            cm.delivered.update(o for o in range(entry.first_offset, entry.last_offset + 1) if not cm.is_acked(o))
        cm.read_offset = read_offset
        return entries

    def check_entry(self, topic: TopicModel, entry: Entry) -> None:
        decoded = decode_entry(entry.data)
        assert decoded.first_offset == entry.first_offset, f"entry at {entry.position} has a wrong index"
        for message in decoded.messages:
            assert message.offset is not None
            assert message.payload == topic.payloads[message.offset], f"{topic.name}@{message.offset} differs"
        assert len(decoded.messages) == entry.message_count

    # acknowledging -------------------------------------------------------------------------
    def track(self, cm: CursorModel, future: Future[None]) -> None:
        cm.track(future)
        if self.rng.random() < 0.4:  # a consumer that waits for the ack receipt
            future.result(timeout=RESULT_TIMEOUT_S)

    def op_ack(self) -> None:
        found = self.cursor_with_deliveries()
        if found is None:
            return
        topic, cm = found
        offsets = self.rng.sample(sorted(cm.delivered), self.rng.randint(1, min(8, len(cm.delivered))))
        if self.rng.random() < 0.1 and cm.md > 0:
            offsets.append(self.rng.randrange(cm.md))  # acked already: a duplicate ack changes nothing
        self.note(f"ack {topic.name} {cm.name} {sorted(offsets)}")
        future = self.stack.cursor(topic.name, cm.name).ack(offsets)
        cm.ack(offsets)
        self.track(cm, future)

    def op_ack_batch_part(self) -> None:
        """Ack some messages of one delivered batch entry (Pulsar's batch-index ack)."""
        found = self.cursor_with_deliveries()
        if found is None:
            return
        topic, cm = found
        first, last = topic.entries[topic.entry_index(self.rng.choice(sorted(cm.delivered)))]
        unacked = [o for o in range(first, last + 1) if not cm.is_acked(o)]
        offsets = self.rng.sample(unacked, self.rng.randint(1, len(unacked)))
        self.note(f"ack batch part {topic.name} {cm.name} {sorted(offsets)} of [{first}, {last}]")
        future = self.stack.cursor(topic.name, cm.name).ack(offsets)
        cm.ack(offsets)
        self.track(cm, future)

    def op_ack_range(self) -> None:
        found = self.cursor_with_deliveries()
        if found is None:
            return
        topic, cm = found
        start = self.rng.choice(sorted(cm.delivered))
        end = min(topic.next_offset, start + self.rng.randint(1, 6))
        self.note(f"ack range {topic.name} {cm.name} [{start}, {end})")
        future = self.stack.cursor(topic.name, cm.name).ack_range(start, end)
        cm.ack(range(start, end))
        self.track(cm, future)

    def op_ack_cumulative(self) -> None:
        found = self.cursor_with_deliveries()
        if found is None:
            return
        topic, cm = found
        offset = self.rng.choice(sorted(cm.delivered))
        self.note(f"ack cumulative {topic.name} {cm.name} {offset}")
        future = self.stack.cursor(topic.name, cm.name).ack_cumulative(offset)
        cm.ack_cumulative(offset)
        self.track(cm, future)

    def op_skip(self) -> None:
        topic, cm = self.any_cursor()
        messages = self.rng.randint(1, 5)
        self.note(f"skip {topic.name} {cm.name} {messages}")
        future = self.stack.cursor(topic.name, cm.name).skip(messages)
        cm.skip(messages, topic.next_offset)
        self.track(cm, future)

    # moving the read position -----------------------------------------------------------------
    def op_nack(self) -> None:
        """Negative ack: the unacknowledged messages are delivered again."""
        topic, cm = self.any_cursor()
        cursor = self.stack.cursor(topic.name, cm.name)
        if cm.delivered and self.rng.random() < 0.5:
            offset = self.rng.choice(sorted(cm.delivered))
            self.note(f"nack {topic.name} {cm.name} {offset} (seek back)")
            cursor.seek(offset)
            cm.read_offset = max(offset, cm.md)
        else:
            self.note(f"nack {topic.name} {cm.name} (rewind)")
            cursor.rewind()
            cm.read_offset = cm.md

    def op_seek(self) -> None:
        topic, cm = self.any_cursor()
        offset = self.rng.randint(0, topic.next_offset + 2)
        self.note(f"seek {topic.name} {cm.name} {offset}")
        self.stack.cursor(topic.name, cm.name).seek(offset)
        cm.read_offset = max(offset, cm.md)

    def op_reset(self) -> None:
        topic, cm = self.any_cursor()
        offset = self.rng.randint(0, topic.next_offset + 2)
        self.note(f"reset {topic.name} {cm.name} to {offset}")
        future = self.stack.cursor(topic.name, cm.name).reset_to_offset(offset)
        cm.reset(max(min(offset, topic.next_offset), topic.first_offset))
        self.track(cm, future)
        if self.rng.random() < 0.3:  # the trimmer may run at any moment, also right after a reset
            self.trim(topic)

    # cursors and trimming ----------------------------------------------------------------------
    def open_cursor(self, topic: TopicModel, initial: str | int) -> None:
        name = f"sub-{len(topic.cursors)}"
        self.note(f"open cursor {topic.name} {name} at {initial}")
        cursor = self.stack.topics[topic.name][1].open(name, initial=initial)
        if initial == "earliest":
            md = topic.first_offset
        elif initial == "latest":
            md = topic.next_offset
        else:
            assert isinstance(initial, int)
            md = max(topic.first_offset, min(initial, topic.next_offset))
        assert cursor.mark_delete_offset == md, f"new cursor {name} starts at {cursor.mark_delete_offset}, not {md}"
        topic.cursors[name] = CursorModel.at(name, md)

    def op_open_cursor(self) -> None:
        topic = self.any_topic()
        if len(topic.cursors) < CURSORS_MAX:
            choices: list[str | int] = ["earliest", "latest", self.rng.randint(0, topic.next_offset + 2)]
            self.open_cursor(topic, self.rng.choice(choices))

    def wait_for_acks(self, cursors: Iterable[CursorModel]) -> None:
        for cm in cursors:
            for future, _ in cm.unconfirmed:
                future.result(timeout=RESULT_TIMEOUT_S)
            cm.absorb_resolved(healthy=True)
            assert not cm.unconfirmed

    def op_trim(self) -> None:
        """Trim, usually once every ack is persisted, sometimes with acks (and resets) in flight."""
        topic = self.any_topic()
        if self.rng.random() < 0.6:
            self.wait_for_acks(topic.cursors.values())
        self.trim(topic)

    def trim(self, topic: TopicModel) -> None:
        """Nothing a cursor has not acknowledged may go, whether or not its state is persisted yet."""
        ml = self.stack.ml(topic.name)
        trimmed = ml.trim()
        first = ml.first_offset
        self.note(f"trim {topic.name}: ledgers {trimmed} gone, first offset {topic.first_offset} -> {first}")
        slowest = min(cm.md for cm in topic.cursors.values())
        assert topic.first_offset <= first <= slowest, f"trimmed to {first}; slowest cursor is at {slowest}"
        assert first == topic.next_offset or topic.entries[topic.entry_index(first)][0] == first
        for ledger_id in trimmed:
            assert not self.stack.storage.ledger_exists(ledger_id), f"trimmed ledger {ledger_id} still stored"
        if first > topic.first_offset:
            self.events["trimmed"] += 1
        topic.first_offset = first

    # restarts and crashes ----------------------------------------------------------------------
    def reopen(self) -> None:
        self.stack = BrokerStack.open(self.path, self.clock, self.rng.randrange(1 << 32), self.topics)

    def op_clean_restart(self) -> None:
        """Close with publishes and acks in flight: closing finishes them all."""
        publishes = self.submit_publishes(self.rng.choice([0, 0, 1, 3]))
        self.note(f"clean restart with {len(publishes)} publishes in flight")
        self.stack.close_cleanly()
        for publish in publishes:
            self.acknowledge(publish)
        self.wait_for_acks(self.all_cursors())
        self.reopen()
        for topic in self.topics.values():
            self.check_restored_cursors(topic, exact=True)
        self.verify_all()

    def op_crash(self) -> None:
        """Crash at once, after a short delay, or when the journal is about to sync (or just
        synced): what was written but not acknowledged is then in doubt."""
        for _ in range(self.rng.randint(0, 3)):  # before the publishes: skip goes by confirmed offsets
            self.rng.choice([self.op_ack, self.op_ack_batch_part, self.op_ack_cumulative, self.op_skip])()
        failpoint = self.rng.choice([None, None, *JOURNAL_FAILPOINTS])
        if failpoint is not None:
            hits_before = self.rng.randint(0, 2)
            self.note(f"arm crash at {failpoint!r} after {hits_before} hits")
            self.stack.fio.crash_at(failpoint, hits_before)
        publishes = self.submit_publishes(self.rng.randint(0, 4))
        in_flight_acks = [f for cm in self.all_cursors() for f, _ in cm.unconfirmed]
        if failpoint is not None:
            settle_quietly([*(p.future for p in publishes), *in_flight_acks])  # done, fired or not
            if self.stack.fio.crashed:
                self.events["crash at a journal failpoint"] += 1
        else:
            delay_s = self.rng.choice([0.0, 0.0, 0.0005, 0.002, 0.01])
            self.note(f"crash after {delay_s * 1000:.1f} ms")
            if delay_s:
                time.sleep(delay_s)
        self.note(f"crash with {len(publishes)} publishes in flight")
        self.stack.fio.crash()
        settle_quietly([*(p.future for p in publishes), *in_flight_acks])
        in_doubt = self.settle_publishes(publishes)
        self.events["publish in doubt at a crash"] += sum(len(ps) for ps in in_doubt.values())
        for cm in self.all_cursors():
            cm.absorb_resolved(healthy=False)
        self.stack.close_after_crash()
        self.stack.fio.lose_unsynced()
        self.reopen()
        for topic in self.topics.values():
            self.reconcile_publishes(topic, in_doubt.get(topic.name, []))
            self.check_restored_cursors(topic, exact=False)
        self.verify_all()

    def settle_publishes(self, publishes: list[InFlightPublish]) -> dict[str, list[InFlightPublish]]:
        """Acknowledged publishes join the model; the rest (a suffix per topic) are in doubt."""
        in_doubt: dict[str, list[InFlightPublish]] = {}
        for publish in publishes:
            if publish.future.exception() is None:
                assert publish.topic not in in_doubt, f"{publish.topic}: a publish succeeded after one failed"
                self.acknowledge(publish)
            else:
                in_doubt.setdefault(publish.topic, []).append(publish)
        self.note("in doubt after the crash: " + ", ".join(f"{p.topic}@{p.first_offset}"
                                                           for ps in in_doubt.values() for p in ps))
        return in_doubt

    def reconcile_publishes(self, topic: TopicModel, in_doubt: list[InFlightPublish]) -> None:
        """Recovery keeps a prefix of the unacknowledged publishes, each byte-exact."""
        ml = self.stack.ml(topic.name)
        recovered_next = ml.confirmed_next_offset()
        assert recovered_next >= topic.next_offset, (
            f"{topic.name} lost acknowledged publishes: next offset {recovered_next} < {topic.next_offset}")
        for publish in in_doubt:
            if topic.next_offset >= recovered_next:
                break
            assert publish.first_offset == topic.next_offset
            entry = ml.read_entry(ml.offset_to_position(publish.first_offset)[0])
            assert (entry.first_offset, entry.last_offset) == (publish.first_offset,
                                                                publish.first_offset + len(publish.payloads) - 1)
            assert [m.payload for m in decode_entry(entry.data).messages] == publish.payloads, (
                f"unacknowledged publish {topic.name}@{publish.first_offset} recovered with different payloads")
            self.note(f"in-doubt publish {topic.name}@{publish.first_offset} recovered")
            self.events["in-doubt publish recovered"] += 1
            topic.append(publish.payloads)
        assert recovered_next == topic.next_offset, (
            f"{topic.name} recovered to offset {recovered_next}; publishes reach {topic.next_offset}")

    def check_restored_cursors(self, topic: TopicModel, *, exact: bool) -> None:
        cursors = self.stack.topics[topic.name][1]
        assert cursors.names() == sorted(topic.cursors), f"{topic.name} restored cursors {cursors.names()}"
        for name, cm in topic.cursors.items():
            cursor = self.stack.cursor(topic.name, name)
            state: CursorState = (cursor.mark_delete_offset, tuple(cursor.acked_ranges()))
            candidates = [cm.state()] if exact else cm.candidates()
            assert state in candidates, (
                f"cursor {name} of {topic.name} restored as {state}; the persisted state was {cm.confirmed}, "
                f"possible states {candidates}")
            self.note(f"cursor {topic.name} {name} restored at md {state[0]}")
            if state != cm.confirmed:
                self.events["cursor restored past its confirmed state"] += 1
            assert state[0] >= topic.first_offset, f"cursor {name} restored below the first offset {topic.first_offset}"
            cm.restored(state)

    def absorb_resolved_acks(self, *, healthy: bool) -> None:
        for cm in self.all_cursors():
            cm.absorb_resolved(healthy=healthy)

    # verification ----------------------------------------------------------------------------
    def check_cheap(self) -> None:
        """After every operation: offsets, ledger boundaries and cursor state agree with the model."""
        for topic in self.topics.values():
            ml = self.stack.ml(topic.name)
            assert ml.confirmed_next_offset() == topic.next_offset, (
                f"{topic.name}: confirmed next offset {ml.confirmed_next_offset()}, published {topic.next_offset}")
            tail = [(i.ledger_id, i.first_offset, i.entries, i.closed_ms > 0) for i in ml.ledger_infos()[-3:]]
            assert ml.next_offset == topic.next_offset, (
                f"{topic.name} will give offset {ml.next_offset} to the next publish, not {topic.next_offset}; "
                f"last ledgers (id, first offset, entries, closed): {tail}")
            assert ml.first_offset == topic.first_offset, (
                f"{topic.name}: first offset {ml.first_offset}, trimmed up to {topic.first_offset}")
            infos = [i for i in ml.ledger_infos() if i.entries > 0]
            if infos:
                assert infos[0].first_offset == topic.first_offset
            for before, after in itertools.pairwise(infos):
                assert after.first_offset == before.next_offset, f"{topic.name} has an offset gap between ledgers"
            for name, cm in topic.cursors.items():
                self.check_cursor(topic, cm, self.stack.cursor(topic.name, name))

    def check_cursor(self, topic: TopicModel, cm: CursorModel, cursor: ManagedCursor) -> None:
        label = f"cursor {cm.name} of {topic.name}"
        assert cursor.mark_delete_offset == cm.md, f"{label}: mark-delete {cursor.mark_delete_offset} != {cm.md}"
        assert tuple(cursor.acked_ranges()) == cm.state()[1], f"{label}: acked ranges differ"
        backlog = cm.backlog(topic.first_offset, topic.next_offset)
        assert cursor.backlog_messages() == backlog, f"{label}: backlog {cursor.backlog_messages()} != {backlog}"

    def verify_all(self) -> None:
        """Every stored offset reads back exactly; ``is_acked`` agrees everywhere; storage is consistent."""
        self.note("verify all")
        self.check_cheap()
        for topic in self.topics.values():
            self.verify_topic(topic)
            for name, cm in topic.cursors.items():
                cursor = self.stack.cursor(topic.name, name)
                for offset in range(topic.first_offset, topic.next_offset + 1):
                    assert cursor.is_acked(offset) == cm.is_acked(offset), f"is_acked({offset}) of {name} differs"
        report = self.stack.storage.check_consistency()
        assert report.ok, f"consistency check failed ({report.entries_checked} checked): {report.problems[:10]}"

    def verify_topic(self, topic: TopicModel) -> None:
        ml = self.stack.ml(topic.name)
        entries: list[Entry] = []
        position = ml.first_position()
        while batch := ml.read_entries(position, 64):
            entries.extend(batch)
            position = ml.next_position(batch[-1].position)
        first_index = topic.entry_index(topic.first_offset) if topic.first_offset < topic.next_offset else len(
            topic.entries)
        got = [(e.first_offset, e.last_offset) for e in entries]
        assert got == topic.entries[first_index:], f"{topic.name} holds entries {got[:20]}..."
        for entry in entries:
            self.check_entry(topic, entry)
        for offset in self.rng.sample(range(topic.first_offset, topic.next_offset),
                                      min(5, topic.next_offset - topic.first_offset)):
            position, index = ml.offset_to_position(offset)
            message = decode_entry(ml.read_entry(position).data).messages[index]
            assert (message.offset, message.payload) == (offset, topic.payloads[offset])
        if topic.first_offset > 0:
            with pytest.raises(DataLost):
                ml.offset_to_position(topic.first_offset - 1)
        with pytest.raises(NoSuchEntry):
            ml.offset_to_position(topic.next_offset)

    def drain_and_verify(self) -> None:
        """Rewind every cursor and read to the end: exactly the unacknowledged offsets come back."""
        self.wait_for_acks(self.all_cursors())
        for topic in self.topics.values():
            for name, cm in topic.cursors.items():
                self.stack.cursor(topic.name, name).rewind()
                cm.read_offset = cm.md
                delivered: set[int] = set()
                while entries := self.read(topic, cm, DRAIN_BATCH):
                    delivered.update(o for e in entries for o in range(e.first_offset, e.last_offset + 1))
                unacked = {o for o in range(topic.first_offset, topic.next_offset) if not cm.is_acked(o)}
                assert {o for o in delivered if not cm.is_acked(o)} == unacked, f"{name} of {topic.name} lost messages"
        self.verify_all()


# --- tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", seeds_to_run(DEFAULT_SEEDS), ids=lambda s: f"seed={s}")
def test_random_broker_operations_match_the_model(seed: int, monkeypatch: pytest.MonkeyPatch, data_dir: str) -> None:
    monkeypatch.setattr(broker.cursor, "CURSOR_LEDGER_ENTRIES_MAX", CURSOR_LEDGER_ENTRIES)
    sim = Simulation(seed, data_dir)
    run_with_replay_hint(sim, lambda: sim.run(ops_per_seed(DEFAULT_OPS)))
    print(f"seed {seed}: {dict(sim.ops)}; {dict(sim.events)}")
