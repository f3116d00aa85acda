"""Broker crash-test child: publishes batches and acknowledges them through a durable cursor.

Role: the process that ``test_broker_kill9.py`` SIGKILLs at seeded random moments. It assembles
the real broker stack (embedded storage with the ``--config`` preset, RocksDB metadata, ledger
manager, managed-ledger factory, entry cache; see :func:`open_broker_stack`), opens one topic
with ``ManagedLedgerConfig.test_min()`` (a ledger rolls every few entries) and one durable
cursor, which runs the managed-ledger and cursor recovery on whatever the previous round left.
Then two threads run until the child is killed or reaches its own bound:

- the producer appends entries of 1 to ``MESSAGES_PER_ENTRY_MAX`` messages (batches, with a
  random compression) with ``expected_offset``, keeping a few adds in flight;
- the consumer reads entries through the cursor and acknowledges a seeded-random subset of
  their offsets: a whole entry, some messages of it (batch-index acks, leaving holes) or none;
  now and then it acknowledges cumulatively, rewinds (redelivery) or trims the topic.

Every event is one stdout line, written with a single ``os.write`` (atomic on a pipe)::

    READY <next_offset> <mark_delete_offset>  the stack is open and recovered
    PUB <first_offset> <last_offset>          an add's Future resolved: the entry is durable
    ISSUE <offset>...                         about to call ack() with these offsets
    ACK <offset>...                           that ack's Future resolved: the state is persisted
    ISSUEC <offset>                           about to call ack_cumulative(offset)
    CUM <offset>                              that Future resolved
    DATALOST <read> <first> <confirmed_next>  read_entries raised DataLost although nothing at or
                                              after the cursor's read position can be trimmed
    DONE                                      the bound was reached and the stack closed cleanly

``DATALOST`` is a broker fault, reported and retried so the run goes on (the parent fails the
test for it after all durability checks ran); see :meth:`Consumer._read`.

``ISSUE`` lines tell the parent which offsets may legitimately be acknowledged after a kill
even though their ``ACK`` line never came (the state may have been persisted just before).

Payloads are a pure function of (salt, round, offset), see :func:`message_payload`: the parent
learns each round's first offset from its ``READY`` line and recomputes every byte.

Bounds: the child stops after ``--run-seconds-max`` seconds or ``--entries-max`` entries,
waits for every Future, closes the cursors and the stack and reports ``DONE``.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

from broker.cursor import CursorManager, ManagedCursor
from broker.entry import Entry
from broker.entry_format import Compression, Message, encode_entry
from broker.errors import DataLost
from broker.managed_ledger import ManagedLedger
from broker.managed_ledger_adds import AddResult
from broker.managed_ledger_config import ManagedLedgerConfig
from storage import StorageConfig
from tests.crash.crash_child import CONFIGS, Reporter, run_or_die
from tests.unit.broker_stack import FakeClock, Stack, open_stack

TOPIC = "crash/ns/persistent/cursor-kill9"
SUBSCRIPTION = "sub"
MESSAGES_PER_ENTRY_MAX = 8
PAYLOAD_BYTES_MAX = 300
PRODUCER_WINDOW_MAX = 12
"""Most adds the producer keeps in flight before waiting for the oldest."""
ACK_WINDOW_MAX = 8
"""Most ack Futures the consumer keeps unresolved before waiting for the oldest."""
CONSUMER_LAG_MESSAGES_MAX = 3000
"""The producer pauses while the consumer's read position lags this far behind."""
READ_ENTRIES_MAX = 16
WHOLE_ENTRY_ACK_PROBABILITY = 0.45
PARTIAL_ENTRY_ACK_PROBABILITY = 0.35
"""Otherwise the entry is left unacknowledged (it is redelivered after a rewind or restart)."""
PARTIAL_MESSAGE_ACK_PROBABILITY = 0.5
CUMULATIVE_ACK_PROBABILITY = 0.015
"""Per entry: acknowledge cumulatively up to a random message of it instead."""
GROUPED_ACK_PROBABILITY = 0.3
"""Per read: acknowledge the chosen offsets of all its entries in one ack() call."""
REWIND_PROBABILITY = 0.03
TRIM_PROBABILITY = 0.05
IDLE_WAIT_SECONDS = 0.01
FUTURE_TIMEOUT_SECONDS = 60.0
COMPRESSIONS = (Compression.NONE, Compression.NONE, Compression.LZ4, Compression.ZSTD, Compression.ZLIB,
                Compression.SNAPPY)


# --- the stack and payloads (shared with the parent) -------------------------------------
def open_broker_stack(data_dir: str, storage_config: StorageConfig) -> Stack:
    """``tests.unit.broker_stack.open_stack`` with a chosen storage preset and the wall clock's
    current time (rounds keep moving forward in time)."""
    return open_stack(data_dir, FakeClock(time.time()), storage_config)


def message_payload(salt: int, round_index: int, offset: int) -> bytes:
    """The exact payload of the message at ``offset``, published in round ``round_index``."""
    rng = random.Random(f"{salt}:{round_index}:{offset}")
    return f"{round_index}:{offset}:".encode() + rng.randbytes(rng.randint(0, PAYLOAD_BYTES_MAX))


# --- the run -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ChildArgs:
    data_dir: str
    seed: int
    round_index: int
    salt: int
    config_name: str
    run_seconds_max: float
    entries_max: int


class Run:
    """What both threads share: the topic, the cursor, the reporter and the bounds."""

    def __init__(self, ml: ManagedLedger, cursor: ManagedCursor, args: ChildArgs, reporter: Reporter) -> None:
        self.ml = ml
        self.cursor = cursor
        self.args = args
        self.report = reporter
        self.producer_done = threading.Event()
        self._deadline = time.monotonic() + args.run_seconds_max

    def out_of_time(self) -> bool:
        return time.monotonic() >= self._deadline


class Producer:
    """Appends batches at the topic's next offset, reporting each durable one in order."""

    def __init__(self, run: Run, rng: random.Random) -> None:
        self._run = run
        self._rng = rng
        self._window = rng.randint(1, PRODUCER_WINDOW_MAX)
        self._pending: deque[Future[list[AddResult]]] = deque()

    def run(self) -> None:
        try:
            for _ in range(self._run.args.entries_max):
                if self._run.out_of_time():
                    break
                self._wait_for_consumer()
                self._publish_next()
                self._report(keep=self._window)
            self._report(keep=0)
        finally:
            self._run.producer_done.set()

    def _wait_for_consumer(self) -> None:
        ml, cursor = self._run.ml, self._run.cursor
        while ml.next_offset - cursor.read_offset > CONSUMER_LAG_MESSAGES_MAX and not self._run.out_of_time():
            self._report(keep=0)
            time.sleep(IDLE_WAIT_SECONDS)

    def _publish_next(self) -> None:
        ml, args = self._run.ml, self._run.args
        first = ml.next_offset  # the only writer: nobody else moves it
        count = self._rng.randint(1, MESSAGES_PER_ENTRY_MAX)
        messages = [Message(payload=message_payload(args.salt, args.round_index, first + i)) for i in range(count)]
        entry = encode_entry(messages, producer_name=f"crash-{args.round_index}", sequence_id=first,
                             publish_time_ms=int(time.time() * 1000), compression=self._rng.choice(COMPRESSIONS))
        self._pending.append(ml.append([entry], [count], expected_offset=first))

    def _report(self, keep: int) -> None:
        """Report the oldest adds, in order, until at most ``keep`` are in flight; adds already
        completed are reported too."""
        while self._pending and (len(self._pending) > keep or self._pending[0].done()):
            added = self._pending.popleft().result(timeout=FUTURE_TIMEOUT_SECONDS)[0]
            self._run.report.line("PUB", added.first_offset, added.last_offset)


class Consumer:
    """Reads through the cursor and acknowledges seeded-random subsets, reporting each ack
    before it is issued (``ISSUE``/``ISSUEC``) and once its Future resolved (``ACK``/``CUM``)."""

    def __init__(self, run: Run, rng: random.Random) -> None:
        self._run = run
        self._rng = rng
        self._window = rng.randint(1, ACK_WINDOW_MAX)
        self._pending: deque[tuple[str, list[int], Future[None]]] = deque()

    def run(self) -> None:
        cursor = self._run.cursor
        while not self._run.out_of_time():
            entries = self._read(self._rng.randint(1, READ_ENTRIES_MAX))
            if entries:
                self._consume(entries)
            elif self._run.producer_done.is_set() and not cursor.has_more():
                break
            else:
                self._report(keep=0)
                self._run.ml.wait_for_entries(self._run.ml.last_confirmed, IDLE_WAIT_SECONDS)
            self._maybe_rewind_or_trim()
        self._report(keep=0)

    def _read(self, max_entries: int) -> list[Entry]:
        """Read through the cursor. Trimming only deletes ledgers below the persisted
        mark-delete offset, so ``DataLost`` at or after it is a fault: reported, then retried."""
        cursor, ml = self._run.cursor, self._run.ml
        read_offset = cursor.read_offset
        try:
            return cursor.read_entries(max_entries)
        except DataLost:
            if read_offset < cursor.persisted_mark_delete_offset:
                raise
            self._run.report.line("DATALOST", read_offset, ml.first_offset, ml.confirmed_next_offset())
            return []

    def _consume(self, entries: list[Entry]) -> None:
        grouped: list[int] = []
        group = self._rng.random() < GROUPED_ACK_PROBABILITY
        for entry in entries:
            if self._rng.random() < CUMULATIVE_ACK_PROBABILITY:
                self._issue("CUM", [self._rng.randint(entry.first_offset, entry.last_offset)])
                continue
            chosen = self._choose_offsets(entry)
            if group:
                grouped += chosen
            elif chosen:
                self._issue("ACK", chosen)
        if grouped:
            self._issue("ACK", grouped)

    def _choose_offsets(self, entry: Entry) -> list[int]:
        unacked = [o for o in range(entry.first_offset, entry.last_offset + 1) if not self._run.cursor.is_acked(o)]
        roll = self._rng.random()
        if roll < WHOLE_ENTRY_ACK_PROBABILITY:
            return unacked
        if roll < WHOLE_ENTRY_ACK_PROBABILITY + PARTIAL_ENTRY_ACK_PROBABILITY:
            return [o for o in unacked if self._rng.random() < PARTIAL_MESSAGE_ACK_PROBABILITY]
        return []

    def _issue(self, kind: str, offsets: list[int]) -> None:
        cursor = self._run.cursor
        if kind == "CUM":
            self._run.report.line("ISSUEC", offsets[0])
            future = cursor.ack_cumulative(offsets[0])
        else:
            self._run.report.line("ISSUE", *offsets)
            future = cursor.ack(offsets)
        self._pending.append((kind, offsets, future))
        self._report(keep=self._window)

    def _report(self, keep: int) -> None:
        """Report resolved acks in issue order (their Futures resolve in that order)."""
        while self._pending and (len(self._pending) > keep or self._pending[0][2].done()):
            kind, offsets, future = self._pending.popleft()
            future.result(timeout=FUTURE_TIMEOUT_SECONDS)
            self._run.report.line(kind, *offsets)

    def _maybe_rewind_or_trim(self) -> None:
        roll = self._rng.random()
        if roll < REWIND_PROBABILITY:
            self._run.cursor.rewind()
        elif roll < REWIND_PROBABILITY + TRIM_PROBABILITY:
            self._run.ml.trim()


def run_round(ml: ManagedLedger, cursor: ManagedCursor, args: ChildArgs, reporter: Reporter) -> None:
    rng = random.Random(args.seed)
    run = Run(ml, cursor, args, reporter)
    bodies = [Producer(run, random.Random(rng.random())).run, Consumer(run, random.Random(rng.random())).run]
    threads = [threading.Thread(target=run_or_die(body), name=f"broker-crash-child-{i}")
               for i, body in enumerate(bodies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def open_topic(stack: Stack) -> tuple[ManagedLedger, CursorManager, ManagedCursor]:
    ml, cursors = stack.open(TOPIC, ManagedLedgerConfig.test_min())
    return ml, cursors, cursors.open(SUBSCRIPTION, initial="earliest")


def parse_args(argv: list[str] | None) -> ChildArgs:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--round", type=int, required=True, dest="round_index")
    parser.add_argument("--salt", type=int, required=True, help="payload salt; the parent uses the same")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="test_min", dest="config_name")
    parser.add_argument("--run-seconds-max", type=float, default=10.0)
    parser.add_argument("--entries-max", type=int, default=5000)
    return ChildArgs(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reporter = Reporter(sys.stdout.fileno())
    stack = open_broker_stack(args.data_dir, CONFIGS[args.config_name]())
    ml, cursors, cursor = open_topic(stack)
    reporter.line("READY", ml.confirmed_next_offset(), cursor.mark_delete_offset)
    run_round(ml, cursor, args, reporter)
    cursors.close()
    stack.close()
    reporter.line("DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
