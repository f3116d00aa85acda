"""Kill -9 crash test of a real broker process: cursor state survives, no message is lost.

Each round starts ``broker_crash_child.py`` on the same data directory (so every recovery runs
on top of earlier recoveries: managed-ledger tail recovery, cursor-ledger recovery, ledger
rollovers, trims and storage journal replay). The child publishes batches to one topic and
acknowledges through a durable cursor: individual acks leaving holes, acks of some messages of
an entry (batch-index acks) and cumulative acks. It reports every durable publish (``PUB``),
every ack before issuing it (``ISSUE``/``ISSUEC``) and once its Future resolved
(``ACK``/``CUM``). The parent SIGKILLs it at a seeded random moment (usually after ``READY``,
sometimes counted from spawn so the kill can land in start-up or recovery) or, in a clean
round, lets it reach its bound and close the stack (some kill rounds are as short as a clean
one, so the kill may land while the child closes the stack). It reaps the child by PID, reopens the
stack in this process and checks, against everything reported so far:

- the topic's offsets are gap-free from its first offset to its end, and every message reads
  back with its exact payload (a function of salt, round and offset); every reported publish
  is there; nothing below the first offset was trimmed that the cursor had not acknowledged;
- every ack whose Future resolved (reported, or seen persisted by an earlier check) is still
  acknowledged: reading from the cursor after ``rewind`` never delivers it again;
- every acknowledged offset was issued by the child (an ack persisted just before the kill
  may lack its report, but an offset never acked must not be skipped);
- every unacknowledged offset is delivered again by the cursor, and no wholly acknowledged
  entry is (a partly acknowledged batch is delivered again; its acknowledged messages stay
  acknowledged);
- after a clean close (the child reported ``DONE``) the state is exact: the topic ends at the
  last reported publish and the cursor holds exactly the reported acks;
- the child's own view after its restart (``READY <next offset> <mark-delete>``) equals what
  the previous check saw; the storage is consistent and writable.

The child also reports ``DATALOST`` when a cursor read raised ``DataLost`` although nothing at
or after the cursor's position can have been trimmed; such a read is retried so the round goes
on, and the test fails for it once every durability check of the run has passed.

What recovery decided for an ack issued but unreported becomes the model from then on (a later
restart must keep it). Assertions hold whatever the kill timing; only coverage depends on it.
``test_cursor_state_survives_clean_restarts`` runs clean rounds only, so the exact check is
always exercised.

Replay: every failure names ``MAGNETAR_CRASH_SEED`` (kill moments, configs and the child's
choices derive from it; the interleaving of threads does not). ``MAGNETAR_CRASH_ROUNDS`` sets
the number of rounds (30 by default; the soak runs hundreds).
"""

from __future__ import annotations

import bisect
import enum
import itertools
import random
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.cursor import ManagedCursor
from broker.entry import Entry
from broker.entry_format import decode_entry
from broker.errors import CorruptEntry
from broker.managed_ledger import ManagedLedger
from broker.managed_ledger_config import ManagedLedgerConfig
from storage import StorageConfig
from tests.crash.broker_crash_child import SUBSCRIPTION, TOPIC, message_payload, open_broker_stack
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
from tests.unit.broker_stack import Stack

pytestmark = pytest.mark.crash

CHILD_MODULE = "tests.crash.broker_crash_child"
KILL_AFTER_READY_SECONDS = (0.0, 1.0)
KILL_AFTER_SPAWN_SECONDS = (0.0, 0.5)
KILL_FROM_SPAWN_PROBABILITY = 0.12
CLEAN_ROUND_PROBABILITY = 0.12
PRODUCTION_CONFIG_PROBABILITY = 0.4
CLEAN_ROUNDS_MIN = 3
CHILD_RUN_SECONDS_MAX = 10.0
KILL_ROUND_ENTRIES_MAX = 5000
CLEAN_ROUND_ENTRIES = (20, 250)
SHORT_KILL_ROUND_PROBABILITY = 0.25
"""A kill round with as few entries as a clean one: the kill may land while the child closes
the stack, or after it finished."""
READY_TIMEOUT_SECONDS = 60.0
CLEAN_EXIT_TIMEOUT_SECONDS = 90.0
READ_BATCH_ENTRIES = 200
PROBLEMS_SHOWN_MAX = 20
OFFSETS_SHOWN_MAX = 12


class RoundMode(enum.Enum):
    KILL_AFTER_READY = "SIGKILL after READY"
    KILL_AFTER_SPAWN = "SIGKILL after spawn"
    CLEAN = "clean close"


@dataclass(frozen=True)
class RoundPlan:
    round_index: int
    seed: int
    config_name: str
    mode: RoundMode
    kill_delay_seconds: float
    entries_max: int

    def describe(self) -> str:
        when = "" if self.mode is RoundMode.CLEAN else f" {self.kill_delay_seconds:.3f} s"
        return (f"round {self.round_index} (round seed {self.seed}, child config {self.config_name}, "
                f"{self.mode.value}{when}, at most {self.entries_max} entries)")


def plan_round(base_seed: int, round_index: int, *, clean_only: bool) -> RoundPlan:
    rng = random.Random(f"broker:{'clean' if clean_only else 'kill'}:{base_seed}:{round_index}")
    roll = rng.random()
    if clean_only or roll < CLEAN_ROUND_PROBABILITY:
        mode = RoundMode.CLEAN
    elif roll < CLEAN_ROUND_PROBABILITY + KILL_FROM_SPAWN_PROBABILITY:
        mode = RoundMode.KILL_AFTER_SPAWN
    else:
        mode = RoundMode.KILL_AFTER_READY
    low, high = KILL_AFTER_SPAWN_SECONDS if mode is RoundMode.KILL_AFTER_SPAWN else KILL_AFTER_READY_SECONDS
    short = mode is RoundMode.CLEAN or rng.random() < SHORT_KILL_ROUND_PROBABILITY
    return RoundPlan(
        round_index=round_index,
        seed=rng.randrange(2**32),
        config_name="production" if rng.random() < PRODUCTION_CONFIG_PROBABILITY else "test_min",
        mode=mode,
        kill_delay_seconds=rng.uniform(low, high),
        entries_max=rng.randint(*CLEAN_ROUND_ENTRIES) if short else KILL_ROUND_ENTRIES_MAX,
    )


# --- the model -----------------------------------------------------------------------------
@dataclass
class AckSet:
    """Acknowledged offsets: everything below ``below`` plus ``offsets`` (the oracle keeps its
    own representation rather than the broker's ``RangeSet``)."""

    below: int = 0
    offsets: set[int] = field(default_factory=set)

    def __contains__(self, offset: int) -> bool:
        return offset < self.below or offset in self.offsets

    def add(self, offsets: Iterable[int]) -> None:
        self.offsets.update(offsets)

    def add_cumulative(self, offset: int) -> None:
        self.below = max(self.below, offset + 1)

    def normalized(self) -> tuple[int, frozenset[int]]:
        """The canonical form: ``below`` is the first offset not acknowledged."""
        below = self.below
        while below in self.offsets:
            below += 1
        return below, frozenset(o for o in self.offsets if o > below)

    def copy(self) -> AckSet:
        return AckSet(self.below, set(self.offsets))

    @classmethod
    def of_cursor(cls, cursor: ManagedCursor) -> AckSet:
        return cls(cursor.mark_delete_offset, {o for s, e in cursor.acked_ranges() for o in range(s, e)})


@dataclass(frozen=True)
class Checked:
    """What the last check saw after a restart."""

    next_offset: int
    mark_delete_offset: int


@dataclass
class TopicModel:
    """What the children reported over all rounds so far, settled by each check."""

    round_starts: list[tuple[int, int]] = field(default_factory=list)
    """(first offset, round index) of each round that reported READY, in order."""
    reported_end: int = 0
    """Every offset below this was reported published."""
    acked: AckSet = field(default_factory=AckSet)
    """Acks known persisted: reported resolved, or seen after a restart."""
    issued: AckSet = field(default_factory=AckSet)
    """``acked`` plus every ack issued since the last check (which may or may not persist)."""
    checked: Checked | None = None

    def round_of(self, offset: int) -> int | None:
        at = bisect.bisect_right(self.round_starts, (offset, sys.maxsize)) - 1
        return self.round_starts[at][1] if at >= 0 else None


@dataclass
class Coverage:
    rounds: dict[RoundMode, int] = field(default_factory=dict)
    exact_checks: int = 0
    publishes: int = 0
    acks: int = 0
    cumulative_acks: int = 0
    holes_after_restart: int = 0
    partly_acked_entries_after_restart: int = 0
    unreported_acks_persisted: int = 0
    """Issued acks without an ACK line that recovery kept (the allowance was needed)."""
    issued_acks_not_persisted: int = 0
    data_lost_reports: list[str] = field(default_factory=list)

    def summary(self) -> str:
        modes = ", ".join(f"{mode.value}: {count}" for mode, count in self.rounds.items())
        return (f"{modes}; exact checks {self.exact_checks}; {self.publishes} publishes, {self.acks} acks, "
                f"{self.cumulative_acks} cumulative acks reported; {self.holes_after_restart} holes and "
                f"{self.partly_acked_entries_after_restart} partly acknowledged entries restored; issued acks "
                f"without a report: {self.unreported_acks_persisted} persisted, {self.issued_acks_not_persisted} not")


@dataclass
class RoundEvents:
    done: bool = False
    problems: list[str] = field(default_factory=list)


def offsets_text(offsets: Iterable[int]) -> str:
    shown = sorted(offsets)
    more = f" ... ({len(shown)} in all)" if len(shown) > OFFSETS_SHOWN_MAX else ""
    return " ".join(str(o) for o in shown[:OFFSETS_SHOWN_MAX]) + more


def apply_ready(model: TopicModel, plan: RoundPlan, numbers: list[int]) -> list[str]:
    next_offset, mark_delete = numbers
    model.round_starts.append((next_offset, plan.round_index))
    checked = model.checked
    if checked is not None and (next_offset, mark_delete) != (checked.next_offset, checked.mark_delete_offset):
        return [f"child restarted at next offset {next_offset}, mark-delete {mark_delete}; the check before "
                f"saw {checked.next_offset}, {checked.mark_delete_offset}"]
    return []


def apply_events(model: TopicModel, plan: RoundPlan, lines: list[str], coverage: Coverage) -> RoundEvents:
    """Fold the child's event lines into the model; report inconsistencies of the stream."""
    events = RoundEvents()
    next_publish: int | None = None
    for line in lines:
        kind, numbers = line.split()[0], [int(w) for w in line.split()[1:]]
        if kind == "READY":
            events.problems += apply_ready(model, plan, numbers)
            next_publish = numbers[0]
        elif kind == "PUB":
            if numbers[0] != next_publish:
                events.problems.append(f"child reported PUB {numbers[0]} {numbers[1]}, expected first {next_publish}")
            next_publish = numbers[1] + 1
            model.reported_end = max(model.reported_end, next_publish)
            coverage.publishes += 1
        elif kind == "ISSUE":
            model.issued.add(numbers)
        elif kind == "ISSUEC":
            model.issued.add_cumulative(numbers[0])
        elif kind == "ACK":
            if any(o not in model.issued for o in numbers):
                events.problems.append(f"child reported {line!r} without issuing it first")
            model.acked.add(numbers)
            coverage.acks += 1
        elif kind == "CUM":
            model.acked.add_cumulative(numbers[0])
            coverage.cumulative_acks += 1
        elif kind == "DATALOST":
            coverage.data_lost_reports.append(f"{plan.describe()}: {line}")
        elif kind == "DONE":
            events.done = True
        else:
            events.problems.append(f"unknown child event line {line!r}")
    return events


# --- the child ---------------------------------------------------------------------------



def child_command(plan: RoundPlan, data_dir: str, salt: int) -> list[str]:
    return [
        sys.executable, "-m", CHILD_MODULE,
        "--data-dir", data_dir,
        "--seed", str(plan.seed),
        "--round", str(plan.round_index),
        "--salt", str(salt),
        "--config", plan.config_name,
        "--run-seconds-max", str(CHILD_RUN_SECONDS_MAX),
        "--entries-max", str(plan.entries_max),
    ]








def wait_for_clean_exit(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(CLEAN_EXIT_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"child did not finish within {CLEAN_EXIT_TIMEOUT_SECONDS} s (hung?)") from None


def run_child(plan: RoundPlan, data_dir: str, salt: int, stderr_path: Path) -> ChildResult:
    with started_child(child_command(plan, data_dir, salt), stderr_path) as proc:
        assert proc.stdout is not None
        reader = LineReader(proc.stdout)
        if plan.mode is RoundMode.CLEAN:
            returncode = wait_for_clean_exit(proc)
        else:
            returncode = kill_after(proc, reader, wait_ready=plan.mode is RoundMode.KILL_AFTER_READY,
                                    delay_seconds=plan.kill_delay_seconds,
                                    ready_timeout_seconds=READY_TIMEOUT_SECONDS)
        reader.join(REAP_TIMEOUT_SECONDS)
    return ChildResult(reader.lines, returncode, stderr_tail(stderr_path))


def child_exit_problems(plan: RoundPlan, result: ChildResult) -> list[str]:
    if result.returncode == 0 and result.lines[-1:] == ["DONE"]:
        return []
    if result.returncode == -signal.SIGKILL and plan.mode is not RoundMode.CLEAN:
        return []
    return [f"child exited with code {result.returncode} (last line {result.lines[-1:]}); stderr:\n{result.stderr}"]


# --- verification: messages ------------------------------------------------------------------
def check_entry(entry: Entry, expected_first: int, salt: int, model: TopicModel) -> list[str]:
    """The entry starts where the previous one ended and holds exactly the expected messages."""
    where = f"entry {entry.position} (offsets {entry.first_offset}..{entry.last_offset})"
    problems = []
    if entry.first_offset != expected_first:
        problems.append(f"{where}: expected first offset {expected_first} (offsets not gap-free)")
    try:
        decoded = decode_entry(entry.data)
    except CorruptEntry as exc:
        return [*problems, f"{where}: CorruptEntry: {exc}"]
    if decoded.num_messages != entry.message_count:
        problems.append(f"{where}: holds {decoded.num_messages} messages")
    for index, message in enumerate(decoded.messages):
        offset = entry.first_offset + index
        round_index = model.round_of(offset)
        if message.offset != offset:
            problems.append(f"{where}: message {index} has offset {message.offset}")
        elif round_index is None or message.payload != message_payload(salt, round_index, offset):
            problems.append(f"{where}: offset {offset}: payload {message.payload[:24]!r}... is not the one "
                            f"published in round {round_index}")
    return problems


def verify_messages(ml: ManagedLedger, salt: int, model: TopicModel) -> list[str]:
    """Gap-free offsets from the first to the end, exact payloads, nothing reported missing."""
    end, first = ml.confirmed_next_offset(), ml.first_offset
    problems = []
    if end < model.reported_end:
        problems.append(f"topic ends at offset {end}; publishes up to {model.reported_end - 1} were acknowledged")
    if model.checked is not None and end < model.checked.next_offset:
        problems.append(f"topic ends at offset {end}; the check before saw it end at {model.checked.next_offset}")
    infos = [i for i in ml.ledger_infos() if i.entries > 0]
    for before, after in itertools.pairwise(infos):
        if after.first_offset != before.next_offset:
            problems.append(f"ledger {after.ledger_id} starts at offset {after.first_offset}, ledger "
                            f"{before.ledger_id} ends before {before.next_offset}")
    expected, position = first, ml.first_position()
    while expected < end and len(problems) < PROBLEMS_SHOWN_MAX:
        entries = ml.read_entries(position, READ_BATCH_ENTRIES)
        if not entries:
            problems.append(f"entries end at offset {expected}, before the topic's end {end}")
            break
        for entry in entries:
            problems += check_entry(entry, expected, salt, model)
            expected = entry.last_offset + 1
        position = ml.next_position(entries[-1].position)
    return problems


# --- verification: the cursor ----------------------------------------------------------------
def persisted_acks_problems(cursor: ManagedCursor, model: TopicModel) -> list[str]:
    """Every ack known persisted is still there (else it would be redelivered)."""
    problems = []
    mark_delete = cursor.mark_delete_offset
    if mark_delete < model.acked.below:
        problems.append(f"restored mark-delete offset {mark_delete}, yet offsets up to {model.acked.below - 1} "
                        "were acknowledged cumulatively (persisted)")
    lost = [o for o in model.acked.offsets if not cursor.is_acked(o)]
    if lost:
        problems.append(f"acknowledged (persisted) offsets unacknowledged after restart: {offsets_text(lost)}")
    return problems


def unissued_acks_problems(cursor: ManagedCursor, model: TopicModel, end: int) -> list[str]:
    """Every acknowledged offset was issued (else it would be skipped: lost)."""
    acked_ranges = [(0, cursor.mark_delete_offset), *cursor.acked_ranges()]
    phantom = [o for start, stop in acked_ranges for o in range(max(start, model.issued.below), stop)
               if o not in model.issued]
    problems = []
    if phantom:
        problems.append(f"offsets acknowledged after restart that the child never acknowledged: "
                        f"{offsets_text(phantom)}")
    if acked_ranges[-1][1] > end:
        problems.append(f"acknowledged offsets reach {acked_ranges[-1][1] - 1}, past the topic's end {end}")
    return problems


def redelivery_problems(cursor: ManagedCursor, end: int, coverage: Coverage) -> list[str]:
    """Reading after ``rewind`` delivers exactly the entries holding unacknowledged offsets."""
    mark_delete = cursor.mark_delete_offset
    cursor.rewind()
    problems: list[str] = []
    delivered: list[int] = []
    last_offset = -1  # the first entry may start below the mark-delete offset
    for _ in range(end - mark_delete + 1):
        entries = cursor.read_entries(READ_BATCH_ENTRIES)
        if not entries:
            break
        for entry in entries:
            if entry.first_offset <= last_offset:
                problems.append(f"entry {entry.position} (offsets {entry.first_offset}..) delivered out of order")
            last_offset = entry.last_offset
            unacked = [o for o in range(entry.first_offset, entry.last_offset + 1) if not cursor.is_acked(o)]
            if not unacked:
                problems.append(f"wholly acknowledged entry {entry.position} (offsets {entry.first_offset}.."
                                f"{entry.last_offset}) delivered again")
            elif len(unacked) < entry.message_count and entry.first_offset >= mark_delete:
                coverage.partly_acked_entries_after_restart += 1
            delivered += unacked
    expected = [o for o in range(mark_delete, end) if not cursor.is_acked(o)]
    if delivered != expected:
        missing, extra = set(expected) - set(delivered), set(delivered) - set(expected)
        problems.append(f"unacknowledged offsets not delivered again (lost): {offsets_text(missing)}; "
                        f"delivered though not expected: {offsets_text(extra)}")
    return problems


def verify_cursor(ml: ManagedLedger, cursor: ManagedCursor, model: TopicModel, coverage: Coverage) -> list[str]:
    end, first = ml.confirmed_next_offset(), ml.first_offset
    problems = persisted_acks_problems(cursor, model) + unissued_acks_problems(cursor, model, end)
    coverage.holes_after_restart += len(cursor.acked_ranges())
    if first > cursor.mark_delete_offset:
        return [*problems, f"topic trimmed to offset {first}, past the cursor's mark-delete offset "
                           f"{cursor.mark_delete_offset}: unacknowledged messages lost"]
    return problems + redelivery_problems(cursor, end, coverage)


def exact_problems(ml: ManagedLedger, cursor: ManagedCursor, model: TopicModel) -> list[str]:
    """After a clean close nothing is uncertain: the state is exactly what was reported."""
    problems = []
    end = ml.confirmed_next_offset()
    if end != model.reported_end:
        problems.append(f"after a clean close the topic ends at {end}, the last reported publish at "
                        f"{model.reported_end - 1}")
    restored = AckSet.of_cursor(cursor)
    for name, reported in (("acknowledged", model.acked), ("issued", model.issued)):
        if restored.normalized() != reported.normalized():
            differ = [o for o in range(end) if (o in restored) != (o in reported)]
            problems.append(f"after a clean close the cursor's acks differ from those {name} at offsets "
                            f"{offsets_text(differ)}")
    return problems


def settle(model: TopicModel, ml: ManagedLedger, cursor: ManagedCursor, coverage: Coverage) -> None:
    """What recovery decided is final: a later restart must keep exactly these acks."""
    restored = AckSet.of_cursor(cursor)
    for offset in range(model.acked.below, ml.confirmed_next_offset()):
        if offset in model.issued and offset not in model.acked:
            if offset in restored:
                coverage.unreported_acks_persisted += 1
            else:
                coverage.issued_acks_not_persisted += 1
    model.acked = restored
    model.issued = model.acked.copy()
    model.checked = Checked(ml.confirmed_next_offset(), cursor.mark_delete_offset)


def verify_stack(stack: Stack, salt: int, model: TopicModel, exact: bool, coverage: Coverage) -> list[str]:
    problems = [f"storage: {p}" for p in stack.storage.check_consistency().problems]
    if stack.storage.read_only:
        problems.append("storage is read-only right after recovery")
    if not stack.factory.exists(TOPIC):
        return problems + (["topic missing, though a child reported READY"] if model.round_starts else [])
    ml, cursors = stack.open(TOPIC, ManagedLedgerConfig.test_min())
    cursor = cursors.get(SUBSCRIPTION)
    problems += verify_messages(ml, salt, model)
    if cursor is None:
        return problems + (["cursor missing, though a child reported READY"] if model.round_starts else [])
    problems += verify_cursor(ml, cursor, model, coverage)
    if exact:
        problems += exact_problems(ml, cursor, model)
        coverage.exact_checks += 1
    if not problems:
        settle(model, ml, cursor, coverage)
    return problems


def verify_after_round(data_dir: str, salt: int, model: TopicModel, exact: bool, coverage: Coverage) -> list[str]:
    stack = open_broker_stack(data_dir, StorageConfig.test_min())
    try:
        return verify_stack(stack, salt, model, exact, coverage)
    finally:
        stack.close()


# --- the tests -------------------------------------------------------------------------------
def failure_message(base_seed: int, plan: RoundPlan, result: ChildResult, problems: list[str]) -> str:
    shown = "\n  ".join(problems[:PROBLEMS_SHOWN_MAX])
    more = f"\n  ... and {len(problems) - PROBLEMS_SHOWN_MAX} more" if len(problems) > PROBLEMS_SHOWN_MAX else ""
    return (f"broker crash check failed in {plan.describe()}; replay with MAGNETAR_CRASH_SEED={base_seed} "
            f"MAGNETAR_CRASH_ROUNDS={plan.round_index + 1}\n  {shown}{more}\n"
            f"child: {len(result.lines)} event lines (last {result.lines[-3:]}), exit code {result.returncode}, "
            f"stderr tail:\n{result.stderr}")


def data_lost_message(base_seed: int, reports: list[str]) -> str:
    shown = "\n  ".join(reports[:PROBLEMS_SHOWN_MAX])
    return (f"cursor reads raised DataLost {len(reports)} times for offsets nothing had trimmed "
            f"(MAGNETAR_CRASH_SEED={base_seed}); every durability check passed. Lines are "
            f"DATALOST <read offset> <first offset> <confirmed next offset>:\n  {shown}")


def run_rounds(tmp_path: Path, base_seed: int, rounds: int, *, clean_only: bool) -> Coverage:
    data_dir = str(tmp_path / "data")
    stderr_path = tmp_path / "child-stderr.txt"
    model, coverage = TopicModel(), Coverage()
    for round_index in range(rounds):
        plan = plan_round(base_seed, round_index, clean_only=clean_only)
        coverage.rounds[plan.mode] = coverage.rounds.get(plan.mode, 0) + 1
        result = run_child(plan, data_dir, base_seed, stderr_path)
        events = apply_events(model, plan, result.lines, coverage)
        problems = child_exit_problems(plan, result) + events.problems
        problems += verify_after_round(data_dir, base_seed, model, events.done, coverage)
        if problems:
            pytest.fail(failure_message(base_seed, plan, result, problems))
    print(f"MAGNETAR_CRASH_SEED={base_seed}: {coverage.summary()}")
    if coverage.data_lost_reports:
        pytest.fail(data_lost_message(base_seed, coverage.data_lost_reports))
    return coverage


@pytest.mark.timeout(rounds_timeout_s())
def test_cursor_state_survives_broker_kill9(tmp_path: Path) -> None:
    base_seed, rounds = crash_seed(), crash_rounds()
    print(f"MAGNETAR_CRASH_SEED={base_seed} MAGNETAR_CRASH_ROUNDS={rounds}")
    coverage = run_rounds(tmp_path, base_seed, rounds, clean_only=False)
    if rounds >= 10:
        assert coverage.acks > 0, f"no ack was ever reported in {rounds} rounds (MAGNETAR_CRASH_SEED={base_seed})"


@pytest.mark.timeout(rounds_timeout_s())
def test_cursor_state_survives_clean_restarts(tmp_path: Path) -> None:
    base_seed = crash_seed()
    rounds = max(CLEAN_ROUNDS_MIN, crash_rounds() // 10)
    print(f"MAGNETAR_CRASH_SEED={base_seed} clean rounds {rounds}")
    coverage = run_rounds(tmp_path, base_seed, rounds, clean_only=True)
    assert coverage.exact_checks == rounds
    assert coverage.acks > 0, f"no ack was ever reported (MAGNETAR_CRASH_SEED={base_seed})"
