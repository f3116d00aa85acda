"""Kill -9 crash test: a real child process writes, the parent SIGKILLs it and checks recovery.

Each round starts ``crash_child.py`` on the same data directory (so every recovery runs on top
of earlier recoveries, flushes, checkpoints, journal trims and GC runs), reads its event lines
in a thread, SIGKILLs it at a seeded random moment (usually after it reported READY, sometimes
counted from spawn so the kill can land inside start-up or recovery), reaps it, then reopens
the storage in this process and checks, against the events reported before the kill:

- every acknowledged entry of a ledger that is not deleted reads back byte-for-byte;
- no entry is half-visible: every entry id up to past the LAC either raises ``NoSuchEntry``
  or returns exactly the expected payload (never other bytes, never ``CorruptEntry``);
- ``get_last_add_confirmed`` is at least the highest acknowledged entry id;
- a ledger whose fence completed is fenced (``add_entry`` raises ``LedgerFenced``), and no
  ledger is fenced that the child never tried to fence;
- a ledger whose deletion completed is gone (``NoSuchLedger``);
- a ledger with acknowledged entries or a completed fence still exists;
- ``check_consistency()`` reports no problem and the storage is not read-only.

A fence or deletion the child started but was killed before reporting as done may or may not
have happened; the check accepts either and records what recovery decided, which is final
from then on. Assertions hold whatever the kill timing; only coverage depends on it.

Replay: every failure names ``MAGNETAR_CRASH_SEED`` (kill moments, configs and the child's
choices derive from it; the interleaving of threads does not). ``MAGNETAR_CRASH_ROUNDS`` sets
the number of rounds (30 by default; the soak runs hundreds).
"""

from __future__ import annotations

import enum
import random
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from storage import (
    CorruptEntry,
    LedgerFenced,
    LedgerStorage,
    NoSuchEntry,
    NoSuchLedger,
    StorageConfig,
)
from tests.crash.crash_child import describe_mismatch, expected_payload
from tests.crash.harness import (
    REAP_TIMEOUT_SECONDS,
    ChildResult,
    LineReader,
    crash_rounds,
    crash_seed,
    kill_after,
    rounds_timeout_s,
    started_child,
    stderr_tail,
)

pytestmark = pytest.mark.crash

CHILD_SCRIPT = Path(__file__).with_name("crash_child.py")
KILL_AFTER_READY_SECONDS = (0.02, 0.6)
KILL_AFTER_SPAWN_SECONDS = (0.0, 0.4)
KILL_FROM_SPAWN_PROBABILITY = 0.15
PRODUCTION_CONFIG_PROBABILITY = 0.3
READY_TIMEOUT_SECONDS = 60.0
CHILD_RUN_SECONDS_MAX = 10.0
CHILD_ENTRIES_MAX = 200_000
PROBE_BEYOND_LAC_ENTRIES = 3
"""Entry ids past the LAC that are also probed for half-visible data."""
PROBLEMS_SHOWN_MAX = 20


class Certainty(enum.Enum):
    NO = "no"
    MAYBE = "maybe"
    YES = "yes"


@dataclass
class LedgerModel:
    """What the child reported about one ledger, over all rounds so far."""

    acked_entry_ids: set[int] = field(default_factory=set)
    fenced: Certainty = Certainty.NO
    deleted: Certainty = Certainty.NO


@dataclass(frozen=True)
class RoundPlan:
    round_index: int
    seed: int
    config_name: str
    writers: int
    kill_from_spawn: bool
    kill_delay_seconds: float

    def describe(self) -> str:
        origin = "spawn" if self.kill_from_spawn else "READY"
        return (f"round {self.round_index} (round seed {self.seed}, child config {self.config_name}, "
                f"{self.writers} writers, SIGKILL {self.kill_delay_seconds:.3f} s after {origin})")








def plan_round(base_seed: int, round_index: int) -> RoundPlan:
    rng = random.Random(f"{base_seed}:{round_index}")
    kill_from_spawn = rng.random() < KILL_FROM_SPAWN_PROBABILITY
    low, high = KILL_AFTER_SPAWN_SECONDS if kill_from_spawn else KILL_AFTER_READY_SECONDS
    return RoundPlan(
        round_index=round_index,
        seed=rng.randrange(2**32),
        config_name="production" if rng.random() < PRODUCTION_CONFIG_PROBABILITY else "test_min",
        writers=rng.randint(2, 4),
        kill_from_spawn=kill_from_spawn,
        kill_delay_seconds=rng.uniform(low, high),
    )


# --- the child ---------------------------------------------------------------------------



def child_command(plan: RoundPlan, data_dir: str, salt: int) -> list[str]:
    return [
        sys.executable, str(CHILD_SCRIPT),
        "--data-dir", data_dir,
        "--seed", str(plan.seed),
        "--round", str(plan.round_index),
        "--salt", str(salt),
        "--config", plan.config_name,
        "--writers", str(plan.writers),
        "--run-seconds-max", str(CHILD_RUN_SECONDS_MAX),
        "--entries-max", str(CHILD_ENTRIES_MAX),
    ]








def run_child_until_killed(plan: RoundPlan, data_dir: str, salt: int, stderr_path: Path) -> ChildResult:
    with started_child(child_command(plan, data_dir, salt), stderr_path) as proc:
        assert proc.stdout is not None
        reader = LineReader(proc.stdout)
        returncode = kill_after(proc, reader, wait_ready=not plan.kill_from_spawn,
                                delay_seconds=plan.kill_delay_seconds, ready_timeout_seconds=READY_TIMEOUT_SECONDS)
        reader.join(REAP_TIMEOUT_SECONDS)
    return ChildResult(reader.lines, returncode, stderr_tail(stderr_path))


def child_exit_problems(result: ChildResult) -> list[str]:
    if result.returncode == -signal.SIGKILL:
        return []
    if result.returncode == 0 and result.lines[-1:] == ["DONE"]:
        return []
    return [f"child exited with code {result.returncode} instead of being killed; stderr:\n{result.stderr}"]


# --- the model -----------------------------------------------------------------------------
def apply_events(models: dict[int, LedgerModel], lines: list[str]) -> int:
    """Fold the child's event lines into the models; return how many adds were acknowledged."""
    acks = 0
    for line in lines:
        words = line.split()
        kind, ids = words[0], [int(w) for w in words[1:]]
        if kind in ("READY", "DONE"):
            continue
        model = models.setdefault(ids[0], LedgerModel())
        if kind == "ACK":
            model.acked_entry_ids.add(ids[1])
            acks += 1
        elif kind == "FENCING" and model.fenced is Certainty.NO:
            model.fenced = Certainty.MAYBE
        elif kind == "FENCED":
            model.fenced = Certainty.YES
        elif kind == "DELETING" and model.deleted is Certainty.NO:
            model.deleted = Certainty.MAYBE
        elif kind == "DELETED":
            model.deleted = Certainty.YES
        elif kind not in ("FENCING", "DELETING"):
            raise AssertionError(f"unknown child event line {line!r}")
    return acks


# --- verification ----------------------------------------------------------------------------
def verify_deleted(st: LedgerStorage, ledger_id: int) -> list[str]:
    problems = []
    if st.ledger_exists(ledger_id):
        problems.append(f"ledger {ledger_id}: deleted, yet it exists after recovery")
    for read in (lambda: st.get_last_add_confirmed(ledger_id), lambda: st.get_entry(ledger_id, 0)):
        try:
            read()
            problems.append(f"ledger {ledger_id}: deleted, yet a read did not raise NoSuchLedger")
        except NoSuchLedger:
            pass
    return problems


def verify_entries(st: LedgerStorage, salt: int, ledger_id: int, model: LedgerModel) -> list[str]:
    """Acknowledged entries are exact; any other entry id is absent or exact."""
    problems = []
    lac = st.get_last_add_confirmed(ledger_id)
    highest_acked = max(model.acked_entry_ids, default=-1)
    if lac < highest_acked:
        problems.append(f"ledger {ledger_id}: LAC {lac} is below the highest acknowledged entry {highest_acked}")
    for entry_id in range(max(lac, highest_acked) + 1 + PROBE_BEYOND_LAC_ENTRIES):
        acked = entry_id in model.acked_entry_ids
        try:
            data = st.get_entry(ledger_id, entry_id)
        except NoSuchEntry:
            if acked:
                problems.append(f"{ledger_id}:{entry_id}: acknowledged, missing after recovery (LAC {lac})")
            continue
        except CorruptEntry as exc:
            problems.append(f"{ledger_id}:{entry_id}: CorruptEntry ({'acknowledged' if acked else 'unacknowledged'}): "
                            f"{exc}")
            continue
        if data != expected_payload(salt, ledger_id, entry_id):
            status = "acknowledged" if acked else "unacknowledged, half-visible"
            problems.append(f"{ledger_id}:{entry_id}: {status}: {describe_mismatch(salt, ledger_id, entry_id, data)}")
    return problems


def verify_fence(st: LedgerStorage, salt: int, ledger_id: int, model: LedgerModel) -> list[str]:
    fenced = st.is_fenced(ledger_id)
    if model.fenced is Certainty.MAYBE:
        model.fenced = Certainty.YES if fenced else Certainty.NO
        return []
    if model.fenced is Certainty.NO:
        return [f"ledger {ledger_id}: fenced, yet the child never fenced it"] if fenced else []
    if not fenced:
        return [f"ledger {ledger_id}: fence completed before the kill, not fenced after recovery"]
    entry_id = st.get_last_add_confirmed(ledger_id) + 1
    try:
        st.add_entries(ledger_id, [entry_id], [expected_payload(salt, ledger_id, entry_id)]).result(timeout=30)
    except LedgerFenced:
        return []
    return [f"ledger {ledger_id}: fenced, yet add_entry was accepted"]


def verify_ledger(st: LedgerStorage, salt: int, ledger_id: int, model: LedgerModel) -> list[str]:
    """Check one ledger and settle the model's MAYBE states with what recovery decided."""
    if model.deleted is Certainty.YES:
        return verify_deleted(st, ledger_id)
    if not st.ledger_exists(ledger_id):
        if model.deleted is Certainty.MAYBE:
            model.deleted = Certainty.YES
            return []
        if model.acked_entry_ids or model.fenced is Certainty.YES:
            return [f"ledger {ledger_id}: has acknowledged entries or a completed fence, missing after recovery"]
        return []  # created but nothing became durable: nothing was promised
    model.deleted = Certainty.NO
    return verify_entries(st, salt, ledger_id, model) + verify_fence(st, salt, ledger_id, model)


def verify_storage(st: LedgerStorage, salt: int, models: dict[int, LedgerModel]) -> list[str]:
    problems: list[str] = []
    if st.read_only:
        problems.append("storage is read-only right after recovery")
    for ledger_id in st.ledgers():
        models.setdefault(ledger_id, LedgerModel())
    for ledger_id, model in sorted(models.items()):
        problems += verify_ledger(st, salt, ledger_id, model)
    report = st.check_consistency()
    problems += [f"check_consistency: {p}" for p in report.problems]
    return problems


def failure_message(base_seed: int, plan: RoundPlan, result: ChildResult, problems: list[str]) -> str:
    shown = "\n  ".join(problems[:PROBLEMS_SHOWN_MAX])
    more = f"\n  ... and {len(problems) - PROBLEMS_SHOWN_MAX} more" if len(problems) > PROBLEMS_SHOWN_MAX else ""
    return (f"crash check failed in {plan.describe()}; replay with MAGNETAR_CRASH_SEED={base_seed} "
            f"MAGNETAR_CRASH_ROUNDS={plan.round_index + 1}\n  {shown}{more}\n"
            f"child: {len(result.lines)} event lines, exit code {result.returncode}, stderr tail:\n{result.stderr}")


# --- the test ------------------------------------------------------------------------------
@pytest.mark.timeout(rounds_timeout_s())
def test_acknowledged_entries_survive_kill9(tmp_path: Path) -> None:
    base_seed = crash_seed()
    rounds = crash_rounds()
    data_dir = str(tmp_path / "data")
    stderr_path = tmp_path / "child-stderr.txt"
    print(f"MAGNETAR_CRASH_SEED={base_seed} MAGNETAR_CRASH_ROUNDS={rounds}")
    models: dict[int, LedgerModel] = {}
    acks_total = 0
    for round_index in range(rounds):
        plan = plan_round(base_seed, round_index)
        result = run_child_until_killed(plan, data_dir, base_seed, stderr_path)
        acks_total += apply_events(models, result.lines)
        problems = child_exit_problems(result)
        with LedgerStorage.open(data_dir, StorageConfig.test_min()) as st:
            problems += verify_storage(st, base_seed, models)
        if problems:
            pytest.fail(failure_message(base_seed, plan, result, problems))
    assert acks_total > 0, f"no add was ever acknowledged in {rounds} rounds (MAGNETAR_CRASH_SEED={base_seed})"
