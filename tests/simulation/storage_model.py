"""The storage simulation's model: what each ledger of the embedded bookie must hold.

Role: ``test_storage_simulation.py`` drives ``LedgerStorage`` and compares it with this plain
Python model after every operation: per ledger the acknowledged entries, the adds and fences
whose outcome a crash left in doubt, the ids skipped on purpose (they must read as
``NoSuchEntry``), and whether it is fenced or deleted. Also the storage configuration and the
helpers the simulation and the replayed GC interleavings share.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from storage import LAST_ADD_CONFIRMED, StorageConfig, StorageError

CONFIG = StorageConfig.test_min()
RESULT_TIMEOUT_S = 30.0
PAYLOAD_BYTES_MAX = 10 * 1024


@dataclass
class LedgerModel:
    """What one ledger must hold. ``in_doubt`` adds were not acknowledged before a crash."""

    entries: dict[int, bytes] = field(default_factory=dict)
    in_doubt: dict[int, bytes] = field(default_factory=dict)
    absent: set[int] = field(default_factory=set)
    next_entry: int = 0
    fenced: bool = False
    fence_in_doubt: bool = False
    exists_in_doubt: bool = False

    def take_entry_id(self, rng: random.Random) -> int:
        if rng.random() < 0.05:  # leave a gap: those ids must read as NoSuchEntry
            gap = rng.randint(1, 3)
            self.absent.update(range(self.next_entry, self.next_entry + gap))
            self.next_entry += gap
        entry_id = self.next_entry
        self.next_entry += 1
        return entry_id

    def last_entry(self) -> int:
        return max(self.entries, default=LAST_ADD_CONFIRMED)


@dataclass
class Model:
    ledgers: dict[int, LedgerModel] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    next_ledger: int = 1

    def new_ledger(self) -> int:
        ledger_id = self.next_ledger
        self.next_ledger += 1
        self.ledgers[ledger_id] = LedgerModel(exists_in_doubt=True)  # until an add or fence is acknowledged
        return ledger_id

    def with_entries(self) -> list[int]:
        return sorted(lid for lid, ledger in self.ledgers.items() if ledger.entries)


@dataclass
class InFlightAdd:
    ledger_id: int
    entry_id: int
    data: bytes
    future: Future[int] | None  # None: the add raised before it was queued


@dataclass
class InFlightFence:
    ledger_id: int
    future: Future[None] | None


def random_payload(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.05:
        return b""
    if roll < 0.35:
        return rng.randbytes(rng.randint(1, 64))
    if roll < 0.70:
        return rng.randbytes(rng.randint(65, 2048))
    return rng.randbytes(rng.randint(2049, PAYLOAD_BYTES_MAX))


def wait_quietly(futures: Iterable[Future[int] | Future[None] | None]) -> None:
    """Wait for futures that may legitimately fail (a crash is under way)."""
    for future in futures:
        if future is not None:
            with contextlib.suppress(StorageError):
                future.result(timeout=RESULT_TIMEOUT_S)
