"""Crash-test child: adds verifiable entries to a LedgerStorage until it is SIGKILLed.

Role: the process that ``test_kill9.py`` kills at seeded random moments. It opens the storage
(running recovery on whatever the previous round left), then several writer threads add
entries to several ledgers with pipelined Futures, while a janitor thread deletes old ledgers.
Now and then a writer fences, deletes or abandons its ledger and moves on to a fresh one.

Every event is reported on stdout as one line, written with a single ``os.write`` (atomic on a
pipe) and only once the event is durable, so the parent knows exactly what must survive:

    READY                   the storage is open (recovery finished)
    ACK <ledger> <entry>    the Future of add_entry completed: the entry is durable
    FENCING <ledger>        a fence is about to be issued (the ledger may or may not end fenced)
    FENCED <ledger>         the Future of fence completed: the fence is durable
    DELETING <ledger>       a deletion is about to be issued (it may or may not happen)
    DELETED <ledger>        delete_ledger returned: the deletion is durable
    DONE                    the run reached its own bound and closed the storage cleanly

Payloads are a pure function of (salt, ledger, entry), see :func:`expected_payload`: sizes
from 1 B to 20 KiB, and a header holding the ids and a CRC of the body, so the parent can
recompute every expected byte and tell a torn or misplaced entry from a missing one.

Bounds: the child stops by itself after ``--run-seconds-max`` seconds or ``--entries-max``
entries, so a parent that never kills it cannot hang. Ledger ids of round ``r`` are
``r * LEDGER_IDS_PER_ROUND + k`` with ``1 <= k < LEDGER_IDS_PER_ROUND``: an id is never
reused after a deletion, as the storage requires.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import crc32c

from storage import LedgerStorage, StorageConfig

PAYLOAD_BYTES_MAX = 20 * 1024
_PAYLOAD_HEADER = struct.Struct(">QQI")  # ledger id, entry id, crc32c of the body
LEDGER_IDS_PER_ROUND = 1000
LIVE_LEDGERS_KEPT = 6
"""Old ledgers beyond this many (oldest first) are deleted by the janitor, which bounds the
data every round re-verifies."""
OLD_LEDGER_DELETE_PROBABILITY = 0.15
CONTINUE_LAC_MAX = 1500
"""Ledgers from earlier rounds whose LAC is below this may be continued by a writer."""
LEDGER_SWITCH_PROBABILITY = 0.004
"""Per add: chance that the writer fences, deletes or abandons its ledger and starts another."""
WINDOW_ENTRIES_MAX = 16
"""Most adds a writer keeps in flight before waiting for the oldest."""
JANITOR_PAUSE_SECONDS_MAX = 0.02
FUTURE_TIMEOUT_SECONDS = 60.0
EXIT_THREAD_FAILED = 3
CONFIGS: dict[str, Callable[[], StorageConfig]] = {
    "test_min": StorageConfig.test_min,
    "production": StorageConfig.production,
}


# --- payloads (shared with the parent) ---------------------------------------------------
def payload_size_bytes(rng: random.Random) -> int:
    """Mostly small entries, some medium, a few up to ``PAYLOAD_BYTES_MAX``."""
    roll = rng.random()
    if roll < 0.6:
        return rng.randint(1, 256)
    if roll < 0.9:
        return rng.randint(257, 4096)
    return rng.randint(4097, PAYLOAD_BYTES_MAX)


def expected_payload(salt: int, ledger_id: int, entry_id: int) -> bytes:
    """The exact bytes of entry ``ledger_id:entry_id``; entries under 20 B hold a cut header."""
    rng = random.Random(f"{salt}:{ledger_id}:{entry_id}")
    size_bytes = payload_size_bytes(rng)
    body = rng.randbytes(max(0, size_bytes - _PAYLOAD_HEADER.size))
    header = _PAYLOAD_HEADER.pack(ledger_id, entry_id, crc32c.crc32c(body))
    return (header + body)[:size_bytes]


def describe_mismatch(salt: int, ledger_id: int, entry_id: int, data: bytes) -> str:
    """Explain how ``data`` differs from the expected payload (for failure messages)."""
    expected = expected_payload(salt, ledger_id, entry_id)
    parts = [f"got {len(data)} B, expected {len(expected)} B"]
    first_diff = next((i for i, (a, b) in enumerate(zip(data, expected, strict=False)) if a != b), None)
    if first_diff is not None:
        parts.append(f"first differing byte at offset {first_diff}")
    if len(data) >= _PAYLOAD_HEADER.size:
        named_ledger, named_entry, body_crc = _PAYLOAD_HEADER.unpack_from(data)
        body_ok = crc32c.crc32c(data[_PAYLOAD_HEADER.size :]) == body_crc
        parts.append(f"its header names {named_ledger}:{named_entry}, body CRC {'valid' if body_ok else 'INVALID'}")
    return "; ".join(parts)


# --- reporting -------------------------------------------------------------------------
class Reporter:
    """Writes one protocol line per event; each line is one atomic ``os.write``."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def line(self, *words: object) -> None:
        data = (" ".join(str(w) for w in words) + "\n").encode("ascii")
        with self._lock:
            os.write(self._fd, data)


# --- the run ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ChildArgs:
    data_dir: str
    seed: int
    round_index: int
    salt: int
    config_name: str
    writers: int
    run_seconds_max: float
    entries_max: int


@dataclass(frozen=True)
class RoundPlan:
    continued: list[tuple[int, int]]
    """(ledger id, next entry id) of earlier ledgers that writers carry on."""
    doomed: list[int]
    """Earlier ledgers the janitor deletes during the run."""


class Run:
    """State shared by the threads of one run: storage, bounds, ids, reporter."""

    def __init__(self, storage: LedgerStorage, args: ChildArgs, reporter: Reporter) -> None:
        self.storage = storage
        self.salt = args.salt
        self.report = reporter
        self._deadline = time.monotonic() + args.run_seconds_max
        self._entries_max = args.entries_max
        self._entries = 0
        self._next_ledger_id = args.round_index * LEDGER_IDS_PER_ROUND + 1
        self._ledger_id_end = (args.round_index + 1) * LEDGER_IDS_PER_ROUND
        self._lock = threading.Lock()
        self._exhausted = False

    def should_stop(self) -> bool:
        return self._exhausted or self._entries >= self._entries_max or time.monotonic() >= self._deadline

    def count_entry(self) -> None:
        with self._lock:
            self._entries += 1

    def new_ledger_id(self) -> int | None:
        with self._lock:
            if self._next_ledger_id >= self._ledger_id_end:
                self._exhausted = True
                return None
            ledger_id = self._next_ledger_id
            self._next_ledger_id += 1
            return ledger_id


class Writer:
    """Adds entries to one ledger at a time, keeping up to ``window`` adds in flight."""

    def __init__(self, run: Run, rng: random.Random, first: tuple[int, int] | None) -> None:
        self._run = run
        self._rng = rng
        self._window = rng.randint(1, WINDOW_ENTRIES_MAX)
        self._pending: deque[tuple[int, int, Future[int]]] = deque()
        self._ledger_id, self._next_entry_id = first if first is not None else (-1, 0)
        self._adds_in_ledger = 0

    def run(self) -> None:
        if self._ledger_id < 0 and not self._start_new_ledger():
            return
        while not self._run.should_stop():
            if self._adds_in_ledger and self._rng.random() < LEDGER_SWITCH_PROBABILITY:
                self._finish_ledger()
                if not self._start_new_ledger():
                    break
                continue
            self._add_next()
        self._acknowledge(keep=0)

    def _start_new_ledger(self) -> bool:
        ledger_id = self._run.new_ledger_id()
        if ledger_id is None:
            return False
        self._ledger_id, self._next_entry_id, self._adds_in_ledger = ledger_id, 0, 0
        return True

    def _add_next(self) -> None:
        ledger_id, entry_id = self._ledger_id, self._next_entry_id
        payload = expected_payload(self._run.salt, ledger_id, entry_id)
        future = self._run.storage.add_entries(ledger_id, [entry_id], [payload])
        self._pending.append((ledger_id, entry_id, future))
        self._next_entry_id += 1
        self._adds_in_ledger += 1
        self._run.count_entry()
        self._acknowledge(keep=self._window)

    def _acknowledge(self, keep: int) -> None:
        """Report the oldest adds, in order, until at most ``keep`` remain in flight; adds
        already completed are reported too."""
        while self._pending and (len(self._pending) > keep or self._pending[0][2].done()):
            ledger_id, entry_id, future = self._pending.popleft()
            future.result(timeout=FUTURE_TIMEOUT_SECONDS)
            self._run.report.line("ACK", ledger_id, entry_id)

    def _finish_ledger(self) -> None:
        """Fence, delete or abandon the current ledger while its last adds are in flight."""
        action = self._rng.choice(("fence", "delete", "abandon"))
        ledger_id = self._ledger_id
        if action == "fence":
            self._run.report.line("FENCING", ledger_id)
            fenced = self._run.storage.fence(ledger_id)
            self._acknowledge(keep=0)
            fenced.result(timeout=FUTURE_TIMEOUT_SECONDS)
            self._run.report.line("FENCED", ledger_id)
        elif action == "delete":
            self._run.report.line("DELETING", ledger_id)
            self._run.storage.delete_ledger(ledger_id)
            self._run.report.line("DELETED", ledger_id)
        self._acknowledge(keep=0)


class Janitor:
    """Deletes ledgers of earlier rounds at random moments of the run."""

    def __init__(self, run: Run, rng: random.Random, doomed: list[int]) -> None:
        self._run = run
        self._rng = rng
        self._doomed = doomed

    def run(self) -> None:
        for ledger_id in self._doomed:
            time.sleep(self._rng.uniform(0.0, JANITOR_PAUSE_SECONDS_MAX))
            if self._run.should_stop():
                return
            self._run.report.line("DELETING", ledger_id)
            self._run.storage.delete_ledger(ledger_id)
            self._run.report.line("DELETED", ledger_id)


def plan_round(storage: LedgerStorage, rng: random.Random, writers: int) -> RoundPlan:
    """Pick earlier ledgers to delete (the oldest beyond ``LIVE_LEDGERS_KEPT``, plus a few at
    random) and unfenced survivors to continue after their LAC."""
    existing = storage.ledgers()
    doomed = set(existing[: max(0, len(existing) - LIVE_LEDGERS_KEPT)])
    doomed |= {ledger_id for ledger_id in existing if rng.random() < OLD_LEDGER_DELETE_PROBABILITY}
    candidates = [
        ledger_id
        for ledger_id in existing
        if ledger_id not in doomed
        and not storage.is_fenced(ledger_id)
        and storage.get_last_add_confirmed(ledger_id) < CONTINUE_LAC_MAX
    ]
    rng.shuffle(candidates)
    continued = [(ledger_id, storage.get_last_add_confirmed(ledger_id) + 1) for ledger_id in candidates[:writers]]
    return RoundPlan(continued, sorted(doomed))


def run_or_die(target: Callable[[], None]) -> Callable[[], None]:
    """Wrap a thread body: any exception is printed and ends the process with a distinct code,
    so the parent sees it instead of a silently shorter run."""

    def body() -> None:
        try:
            target()
        except BaseException:
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            os._exit(EXIT_THREAD_FAILED)

    return body


def run_round(storage: LedgerStorage, args: ChildArgs, reporter: Reporter) -> None:
    rng = random.Random(args.seed)
    plan = plan_round(storage, rng, args.writers)
    run = Run(storage, args, reporter)
    firsts: list[tuple[int, int] | None] = [*plan.continued, *[None] * (args.writers - len(plan.continued))]
    bodies = [Writer(run, random.Random(rng.random()), first).run for first in firsts]
    bodies.append(Janitor(run, random.Random(rng.random()), plan.doomed).run)
    threads = [threading.Thread(target=run_or_die(body), name=f"crash-child-{i}") for i, body in enumerate(bodies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def parse_args(argv: list[str] | None) -> ChildArgs:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--round", type=int, required=True, dest="round_index")
    parser.add_argument("--salt", type=int, required=True, help="payload salt; the parent uses the same")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="test_min", dest="config_name")
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--run-seconds-max", type=float, default=10.0)
    parser.add_argument("--entries-max", type=int, default=200_000)
    return ChildArgs(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reporter = Reporter(sys.stdout.fileno())
    storage = LedgerStorage.open(args.data_dir, CONFIGS[args.config_name]())
    reporter.line("READY")
    run_round(storage, args, reporter)
    storage.close()
    reporter.line("DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
