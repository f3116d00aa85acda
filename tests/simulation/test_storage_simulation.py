"""Seeded simulation of the embedded bookie against a trivially correct in-memory model.

Role: drive ``LedgerStorage`` (with ``StorageConfig.test_min()``, so flushes, journal and
entry-log rotation, read-cache eviction and GC all happen, with the background flush and GC
threads running) through a random sequence of add (single and pipelined), read (entry and
LAC), reads of missing entries and unknown ledgers, fence, delete, flush, checkpoint,
collect_garbage, clean restart, crash restart (``FaultyFileIO.crash`` + ``lose_unsynced``) and
crashes at every named failpoint. The model is a dict per ledger plus fenced and deleted state
(``storage_model.py``).

What is checked:
- every acknowledged entry reads back byte-for-byte, before and after every restart and crash;
- an add that was not acknowledged when the crash came is either absent or byte-exact, and
  whichever it is after the restart stays so;
- LAC equals the highest entry present, ``get_entry(-1)`` returns it, fencing refuses plain
  adds but not recovery adds and survives restarts, deleted ledgers stay gone;
- every run ends with a full model comparison and ``check_consistency().ok`` (every index
  entry points at a readable, CRC-valid record of a live ledger).

Besides the random runs: a scripted crash at each named failpoint (each one must be reached);
the GC interleavings the random runs found are replayed deterministically in
``test_storage_gc_interleavings.py``.

No assertion depends on timing: the background threads may flush or collect at any moment.

Replay: a failure prints ``replay with MAGNETAR_SIM_SEED=<n>``; that variable runs only that
seed. ``MAGNETAR_SIM_SEEDS`` (a count N for seeds 1..N, or a comma-separated list) and
``MAGNETAR_SIM_OPS`` (operations per seed) run longer simulations.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from storage import LAST_ADD_CONFIRMED, LedgerFenced, LedgerStorage, NoSuchEntry, NoSuchLedger, StorageError
from storage.fileio import FaultyFileIO
from tests.simulation.seeds import ops_per_seed, run_with_replay_hint, seeds_to_run
from tests.simulation.storage_model import (
    CONFIG,
    RESULT_TIMEOUT_S,
    InFlightAdd,
    InFlightFence,
    LedgerModel,
    Model,
    random_payload,
    wait_quietly,
)

pytestmark = pytest.mark.simulation

DEFAULT_SEEDS = (1, 2, 3, 4, 5, 6, 7, 8)
DEFAULT_OPS = 300
LIVE_LEDGERS_MAX = 6
UNKNOWN_LEDGER_BASE = 1 << 40
TRACE_TAIL = 40

JOURNAL_FAILPOINTS = ("journal: before write", "journal: before fdatasync", "journal: after fdatasync")
FLUSH_FAILPOINTS = (
    "flush: after entry log append, before sync",
    "flush: after entry log sync, before index write",
    "flush: after index write, before checkpoint",
)
GC_FAILPOINTS = ("gc: after copy, before index update", "gc: after index update, before log removal")
FAILPOINTS = JOURNAL_FAILPOINTS + FLUSH_FAILPOINTS + GC_FAILPOINTS


# --- the simulation ---------------------------------------------------------------------


class Simulation:
    def __init__(self, seed: int, path: str, replay_hint: str | None = None) -> None:
        self.seed = seed
        self.replay_hint = replay_hint or f"replay with MAGNETAR_SIM_SEED={seed}"
        self.rng = random.Random(seed)
        self.path = path
        self.model = Model()
        self.trace: list[str] = []
        self.ops = Counter[str]()
        self.failpoints_fired = Counter[str]()
        self.fio = FaultyFileIO(self.rng.randrange(1 << 32))
        self.st = LedgerStorage.open(path, CONFIG, fileio=self.fio)

    # lifecycle ---------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.trace.append(text)

    def reopen(self) -> None:
        self.fio = FaultyFileIO(self.rng.randrange(1 << 32))
        self.st = LedgerStorage.open(self.path, CONFIG, fileio=self.fio)

    def close_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.st.close()

    def describe(self) -> str:
        tail = "\n  ".join(self.trace[-TRACE_TAIL:])
        return (f"{self.replay_hint} ({len(self.trace)} steps; "
                f"last {min(TRACE_TAIL, len(self.trace))}):\n  {tail}")

    def run(self, operations: int) -> None:
        table = self.operation_table()
        population = [op for op, _ in table]
        weights = [weight for _, weight in table]
        for _ in range(operations):
            op = self.rng.choices(population, weights)[0]
            self.ops[op.__name__] += 1
            op()
        self.note("final check")
        self.verify_all()

    def operation_table(self) -> list[tuple[Callable[[], None], int]]:
        return [
            (self.op_add, 24),
            (self.op_add_pipelined, 10),
            (self.op_read, 14),
            (self.op_read_lac, 6),
            (self.op_read_missing_entry, 3),
            (self.op_read_unknown_ledger, 3),
            (self.op_fence, 3),
            (self.op_delete, 4),
            (self.op_flush, 4),
            (self.op_checkpoint, 3),
            (self.op_collect_garbage, 3),
            (self.op_clean_restart, 2),
            (self.op_crash_restart, 3),
            (self.op_crash_at_failpoint, 3),
        ]

    # choosing ledgers ----------------------------------------------------------------------
    def ledger_for_add(self) -> int:
        live = sorted(self.model.ledgers)
        if not live or (len(live) < LIVE_LEDGERS_MAX and self.rng.random() < 0.1):
            return self.model.new_ledger()
        return self.rng.choice(live)

    def any_live_ledger(self) -> int | None:
        live = sorted(self.model.ledgers)
        return self.rng.choice(live) if live else None

    # adds --------------------------------------------------------------------------------
    def submit_add(self, ledger_id: int, *, recovery: bool) -> InFlightAdd:
        ledger = self.model.ledgers[ledger_id]
        entry_id = ledger.take_entry_id(self.rng)
        data = random_payload(self.rng)
        self.note(f"add {ledger_id}:{entry_id} {len(data)}B{' recovery' if recovery else ''}")
        try:
            future: Future[int] | None = self.st.add_entries(ledger_id, [entry_id], [data], recovery=recovery)
        except StorageError:
            future = None
        return InFlightAdd(ledger_id, entry_id, data, future)

    def acknowledge(self, add: InFlightAdd) -> None:
        assert add.future is not None, f"add {add.ledger_id}:{add.entry_id} refused by a healthy storage"
        assert add.future.result(timeout=RESULT_TIMEOUT_S) == add.entry_id
        ledger = self.model.ledgers[add.ledger_id]
        ledger.entries[add.entry_id] = add.data
        ledger.exists_in_doubt = False

    def add_or_expect_fenced(self, ledger_id: int) -> InFlightAdd | None:
        ledger = self.model.ledgers[ledger_id]
        recovery = ledger.fenced and self.rng.random() < 0.6
        if ledger.fenced and not recovery:
            self.note(f"add {ledger_id}:{ledger.next_entry} to fenced ledger (expect LedgerFenced)")
            with pytest.raises(LedgerFenced):
                self.st.add_entries(ledger_id, [ledger.next_entry], [b"refused"])
            return None
        return self.submit_add(ledger_id, recovery=recovery)

    def op_add(self) -> None:
        add = self.add_or_expect_fenced(self.ledger_for_add())
        if add is not None:
            self.acknowledge(add)

    def op_add_pipelined(self) -> None:
        adds = [self.add_or_expect_fenced(self.ledger_for_add()) for _ in range(self.rng.randint(2, 8))]
        for add in adds:
            if add is not None:
                self.acknowledge(add)

    # reads -------------------------------------------------------------------------------
    def op_read(self) -> None:
        candidates = self.model.with_entries()
        if not candidates:
            return
        ledger_id = self.rng.choice(candidates)
        entries = self.model.ledgers[ledger_id].entries
        entry_id = self.rng.choice(sorted(entries))
        self.note(f"read {ledger_id}:{entry_id}")
        assert self.st.get_entry(ledger_id, entry_id) == entries[entry_id], f"{ledger_id}:{entry_id} differs"

    def op_read_lac(self) -> None:
        ledger_id = self.any_live_ledger()
        if ledger_id is not None:
            self.note(f"read LAC of {ledger_id}")
            self.verify_lac(ledger_id, self.model.ledgers[ledger_id])

    def op_read_missing_entry(self) -> None:
        ledger_id = self.any_live_ledger()
        if ledger_id is None:
            return
        ledger = self.model.ledgers[ledger_id]
        if ledger.absent and self.rng.random() < 0.5:
            entry_id = self.rng.choice(sorted(ledger.absent))
        else:
            entry_id = ledger.next_entry + self.rng.randint(0, 1000)  # never added (yet)
        self.note(f"read missing {ledger_id}:{entry_id}")
        with pytest.raises(NoSuchEntry):
            self.st.get_entry(ledger_id, entry_id)

    def op_read_unknown_ledger(self) -> None:
        gone = sorted(self.model.gone)
        if gone and self.rng.random() < 0.6:
            ledger_id = self.rng.choice(gone)
        else:
            ledger_id = UNKNOWN_LEDGER_BASE + self.rng.randrange(1 << 20)
        self.note(f"read unknown ledger {ledger_id}")
        self.verify_gone(ledger_id)

    # fence, delete -------------------------------------------------------------------------
    def op_fence(self) -> None:
        live = sorted(self.model.ledgers)
        if not live or (len(live) < LIVE_LEDGERS_MAX and self.rng.random() < 0.15):
            ledger_id = self.model.new_ledger()  # fencing an unknown ledger creates it
        else:
            ledger_id = self.rng.choice(live)
        self.note(f"fence {ledger_id}")
        self.st.fence(ledger_id).result(timeout=RESULT_TIMEOUT_S)
        self.model.ledgers[ledger_id].fenced = True
        self.model.ledgers[ledger_id].exists_in_doubt = False
        assert self.st.is_fenced(ledger_id)

    def delete(self, ledger_id: int) -> None:
        self.note(f"delete {ledger_id}")
        self.st.delete_ledger(ledger_id)
        del self.model.ledgers[ledger_id]
        self.model.gone.add(ledger_id)

    def op_delete(self) -> None:
        gone = sorted(self.model.gone)
        if gone and self.rng.random() < 0.15:
            ledger_id = self.rng.choice(gone)
            self.note(f"delete gone ledger {ledger_id} (expect NoSuchLedger)")
            with pytest.raises(NoSuchLedger):
                self.st.delete_ledger(ledger_id)
            return
        ledger_id_or_none = self.any_live_ledger()
        if ledger_id_or_none is None:
            return
        self.delete(ledger_id_or_none)
        self.verify_gone(ledger_id_or_none)

    # flush, checkpoint, GC --------------------------------------------------------------------
    def op_flush(self) -> None:
        self.note("flush")
        self.st.flush()

    def op_checkpoint(self) -> None:
        self.note("checkpoint")
        self.st.checkpoint()

    def op_collect_garbage(self) -> None:
        threshold = self.rng.choice([None, 0.0, 0.2, 0.5, 0.8, 1.0])
        self.note(f"collect_garbage({threshold})")
        self.st.collect_garbage(threshold)

    # restarts and crashes ------------------------------------------------------------------
    def op_clean_restart(self) -> None:
        """Close with adds still in flight: close finishes them, so every one is acknowledged."""
        adds = [self.submit_add(self.ledger_for_add(), recovery=True) for _ in range(self.rng.choice([0, 0, 3]))]
        self.note(f"clean restart with {len(adds)} adds in flight")
        self.st.close()
        for add in adds:
            self.acknowledge(add)
        self.reopen()
        self.verify_all()

    def op_crash_restart(self) -> None:
        adds = [self.submit_add(self.ledger_for_add(), recovery=True) for _ in range(self.rng.randint(0, 6))]
        fences = [self.submit_fence() for _ in range(self.rng.random() < 0.3)]
        delay_s = self.rng.choice([0.0, 0.0, 0.0005, 0.002, 0.01])
        self.note(f"crash after {delay_s * 1000:.1f} ms with {len(adds)} adds, {len(fences)} fences in flight")
        if delay_s:
            time.sleep(delay_s)
        self.crash_and_recover(adds, fences)

    def submit_fence(self) -> InFlightFence:
        ledger_id = self.ledger_for_add()
        self.note(f"fence {ledger_id} (in flight)")
        try:
            future: Future[None] | None = self.st.fence(ledger_id)
        except StorageError:
            future = None
        return InFlightFence(ledger_id, future)

    def op_crash_at_failpoint(self) -> None:
        name = self.rng.choice(FAILPOINTS)
        hits_before = self.rng.choice([0, 0, 0, 1])
        self.note(f"crash at failpoint {name!r} after {hits_before} hits")
        self.fio.crash_at(name, hits_before)
        adds = self.trigger(name)
        if self.fio.crashed:
            self.failpoints_fired[name] += 1
        self.crash_and_recover(adds, [])

    def trigger(self, name: str, gc_threshold: float | None = None) -> list[InFlightAdd]:
        """Do what reaches ``name``; any step may fail once the crash point fired."""
        adds: list[InFlightAdd] = []
        if name in JOURNAL_FAILPOINTS or name in FLUSH_FAILPOINTS:
            adds = [self.submit_add(self.ledger_for_add(), recovery=True) for _ in range(self.rng.randint(1, 3))]
            wait_quietly(add.future for add in adds)
        if name in FLUSH_FAILPOINTS:
            with contextlib.suppress(StorageError):
                self.st.flush()
        if name in GC_FAILPOINTS:
            with contextlib.suppress(StorageError):
                self.st.collect_garbage(gc_threshold if gc_threshold is not None else self.rng.choice([0.5, 1.0]))
        return adds

    def crash_and_recover(self, adds: list[InFlightAdd], fences: list[InFlightFence]) -> None:
        self.fio.crash()
        self.read_some_while_crashed()
        self.st.close()
        self.settle(adds, fences)
        self.fio.lose_unsynced()
        self.reopen()
        self.reconcile()
        self.verify_all()

    def read_some_while_crashed(self) -> None:
        """Reads keep working once writes fail: earlier acknowledged entries still read back."""
        candidates = [(lid, eid) for lid in self.model.with_entries() for eid in self.model.ledgers[lid].entries]
        for ledger_id, entry_id in self.rng.sample(candidates, min(5, len(candidates))):
            expected = self.model.ledgers[ledger_id].entries[entry_id]
            assert self.st.get_entry(ledger_id, entry_id) == expected, f"{ledger_id}:{entry_id} differs after the crash"

    def settle(self, adds: list[InFlightAdd], fences: list[InFlightFence]) -> None:
        """After close every future is done: acknowledged ones join the model, the rest are in doubt."""
        for add in adds:
            ledger = self.model.ledgers[add.ledger_id]
            if add.future is not None and add.future.exception(timeout=RESULT_TIMEOUT_S) is None:
                assert add.future.result() == add.entry_id
                ledger.entries[add.entry_id] = add.data
                ledger.exists_in_doubt = False
            else:
                ledger.in_doubt[add.entry_id] = add.data
        for fence in fences:
            ledger = self.model.ledgers[fence.ledger_id]
            if fence.future is not None and fence.future.exception(timeout=RESULT_TIMEOUT_S) is None:
                ledger.fenced = True
                ledger.exists_in_doubt = False
            elif not ledger.fenced:
                ledger.fence_in_doubt = True
        acked = [f"{a.ledger_id}:{a.entry_id}" for a in adds if a.entry_id in self.model.ledgers[a.ledger_id].entries]
        self.note(f"acknowledged before the crash: {', '.join(acked) or 'none'}")

    def reconcile(self) -> None:
        """Resolve everything in doubt by reading the recovered storage once."""
        for ledger_id in sorted(self.model.ledgers):
            ledger = self.model.ledgers[ledger_id]
            if ledger.exists_in_doubt and not self.st.ledger_exists(ledger_id):
                assert not ledger.entries and not ledger.fenced, f"ledger {ledger_id} lost acknowledged state"
                self.note(f"ledger {ledger_id} was never created")
                del self.model.ledgers[ledger_id]
                self.model.gone.add(ledger_id)
                continue
            ledger.exists_in_doubt = False
            self.reconcile_entries(ledger_id, ledger)
            if ledger.fence_in_doubt:
                ledger.fenced = self.st.is_fenced(ledger_id)
                ledger.fence_in_doubt = False

    def reconcile_entries(self, ledger_id: int, ledger: LedgerModel) -> None:
        for entry_id, data in sorted(ledger.in_doubt.items()):
            try:
                stored = self.st.get_entry(ledger_id, entry_id)
            except NoSuchEntry:
                ledger.absent.add(entry_id)
                self.note(f"in-doubt {ledger_id}:{entry_id} absent after recovery")
                continue
            assert stored == data, f"unacknowledged {ledger_id}:{entry_id} recovered with different bytes"
            ledger.entries[entry_id] = data
            self.note(f"in-doubt {ledger_id}:{entry_id} present after recovery")
        ledger.in_doubt.clear()

    # verification ----------------------------------------------------------------------------
    def verify_all(self) -> None:
        assert self.st.ledgers() == sorted(self.model.ledgers), "ledger set differs from the model"
        for ledger_id in sorted(self.model.gone):
            self.verify_gone(ledger_id)
        for ledger_id, ledger in sorted(self.model.ledgers.items()):
            self.verify_ledger(ledger_id, ledger)
        report = self.st.check_consistency()
        assert report.ok, f"consistency check failed ({report.entries_checked} checked): {report.problems[:10]}"

    def verify_ledger(self, ledger_id: int, ledger: LedgerModel) -> None:
        for entry_id, data in sorted(ledger.entries.items()):
            assert self.st.get_entry(ledger_id, entry_id) == data, f"{ledger_id}:{entry_id} differs"
        for entry_id in sorted(ledger.absent):
            with pytest.raises(NoSuchEntry):
                self.st.get_entry(ledger_id, entry_id)
        self.verify_lac(ledger_id, ledger)
        assert self.st.is_fenced(ledger_id) == ledger.fenced, f"fenced state of {ledger_id} differs"

    def verify_lac(self, ledger_id: int, ledger: LedgerModel) -> None:
        lac = self.st.get_last_add_confirmed(ledger_id)
        expected = ledger.last_entry()
        assert lac == expected, f"LAC of {ledger_id} is {lac}, highest present entry is {expected}"
        if lac == LAST_ADD_CONFIRMED:
            with pytest.raises(NoSuchEntry):
                self.st.get_entry(ledger_id, LAST_ADD_CONFIRMED)
        else:
            assert self.st.get_entry(ledger_id, LAST_ADD_CONFIRMED) == ledger.entries[lac]

    def verify_gone(self, ledger_id: int) -> None:
        assert not self.st.ledger_exists(ledger_id), f"ledger {ledger_id} should not exist"
        with pytest.raises(NoSuchLedger):
            self.st.get_entry(ledger_id, 0)
        with pytest.raises(NoSuchLedger):
            self.st.get_entry(ledger_id, LAST_ADD_CONFIRMED)
        with pytest.raises(NoSuchLedger):
            self.st.get_last_add_confirmed(ledger_id)


# --- tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", seeds_to_run(DEFAULT_SEEDS), ids=lambda s: f"seed={s}")
def test_random_operations_match_the_model(seed: int, data_dir: str) -> None:
    sim = Simulation(seed, data_dir)
    run_with_replay_hint(sim, lambda: sim.run(ops_per_seed(DEFAULT_OPS)))
    print(f"seed {seed}: {dict(sim.ops)}; failpoints fired: {dict(sim.failpoints_fired)}")


def fill_interleaved(sim: Simulation, entries_each: int, size_bytes: int) -> tuple[int, int]:
    """Two new ledgers with acknowledged entries alternating between them: several sealed
    entry logs that each hold both ledgers."""
    ledgers = (sim.model.new_ledger(), sim.model.new_ledger())
    for entry_id in range(entries_each):
        for ledger_id in ledgers:
            data = sim.rng.randbytes(size_bytes)
            sim.note(f"add {ledger_id}:{entry_id} {size_bytes}B")
            add = InFlightAdd(ledger_id, entry_id, data, sim.st.add_entries(ledger_id, [entry_id], [data]))
            sim.model.ledgers[ledger_id].next_entry = entry_id + 1
            sim.acknowledge(add)
    sim.st.flush()
    return ledgers


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_crash_at_each_failpoint_loses_nothing_acknowledged(failpoint: str, data_dir: str) -> None:
    sim = Simulation(FAILPOINTS.index(failpoint), data_dir, replay_hint=f"scripted crash at {failpoint!r}")

    def scenario() -> None:
        doomed, _ = fill_interleaved(sim, entries_each=60, size_bytes=3 * 1024)
        assert sim.st.statistics().entry_logs.logs >= 3
        sim.note(f"arm crash at {failpoint!r}")
        sim.fio.crash_at(failpoint)
        sim.delete(doomed)  # the sealed logs are now half dead: compaction copies the other ledger out
        adds = sim.trigger(failpoint, gc_threshold=1.0)
        assert sim.fio.crashed, f"failpoint {failpoint!r} was never reached"
        sim.crash_and_recover(adds, [])
        sim.op_add_pipelined()  # writable again after recovery
        sim.verify_all()

    run_with_replay_hint(sim, scenario)
