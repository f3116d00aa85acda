"""The BookieClient seam: how the broker reaches bookies, whether in-process or remote.

Role: ``LedgerHandle`` writes each entry to its *write set* (the ``Qw`` bookies of the ledger's
ensemble starting at index ``entry_id % E``) and reads it from any of them. A ``Bookie`` is
anything with the storage front door's shape; ``LocalBookie`` wraps an in-process
``LedgerStorage`` (the embedded default is one of them, E = Qw = Qa = 1).

Stored entry = ``[last_add_confirmed i64][ledger length i64][payload]``: the writer piggybacks
its LAC and the ledger's length up to this entry on every entry, as BookKeeper does, so a reader
or a recovering writer learns a safe LAC (``read_last_add_confirmed``) and the ledger's length
from the bookies alone, without trusting entries that were never acknowledged.

Invariants: a stopped bookie raises ``BookieUnavailable`` from every call; ensemble selection
never places one bookie twice in an ensemble.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from broker.errors import BrokerError, NoSuchEntry, NoSuchLedger, NotEnoughBookies
from storage import LedgerStorage, new_future

_HEADER = struct.Struct(">qq")  # piggybacked LAC, ledger length through this entry


class BookieUnavailable(BrokerError):
    code = "bookie_unavailable"
    http_status = 503
    retriable = True


class StoredEntry(NamedTuple):
    """An entry as a bookie keeps it: the writer's LAC and length when it was added, and its
    payload (a tuple: one is made per entry read)."""

    lac: int
    length_bytes: int
    payload: bytes


class Bookie(Protocol):
    bookie_id: str

    def add_entries(self, ledger_id: int, entry_ids: Sequence[int], lac: int,
                    entries: Sequence[tuple[int, bytes]], *, recovery: bool = False) -> Future[int]:
        """Store ``entries`` (each its ledger length through it and its payload; a single entry
        is a group of one) with the writer's LAC piggybacked; the Future resolves to the last
        entry id once every one is durable. ``recovery`` writes past a fence."""
    def read_entry(self, ledger_id: int, entry_id: int) -> StoredEntry: ...
    def read_entries(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[StoredEntry]: ...
    def read_payloads(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]: ...
    def read_last_add_confirmed(self, ledger_id: int) -> int: ...
    def last_entry_id(self, ledger_id: int) -> int: ...
    def fence(self, ledger_id: int) -> Future[None]: ...
    def delete_ledger(self, ledger_id: int) -> None: ...
    @property
    def available(self) -> bool: ...


def pack_entry(lac: int, length_bytes: int, payload: bytes) -> bytes:
    return _HEADER.pack(lac, length_bytes) + payload


def all_added(adds: Sequence[Callable[[], Future[int]]], last_entry_id: int) -> Future[int]:
    """Start ``adds`` in order; one future for them all that resolves to ``last_entry_id``, or
    to the first failure among them (an add refused at once stops the rest from starting)."""
    done: Future[int] = new_future()
    remaining = [len(adds)]
    lock = threading.Lock()

    def one_done(future: Future[int]) -> None:
        error = future.exception()
        with lock:
            if done.done():
                return
            remaining[0] -= 1
            if error is None and remaining[0]:
                return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(last_entry_id)

    for add in adds:
        try:
            future = add()
        except BaseException as exc:  # refused at once: the group fails, whatever was sent
            with lock:
                if done.done():
                    return done
            done.set_exception(exc)
            return done
        future.add_done_callback(one_done)
    return done


def unpack_entry(stored: bytes) -> StoredEntry:
    lac, length_bytes = _HEADER.unpack_from(stored)
    return StoredEntry(lac, length_bytes, stored[_HEADER.size :])


class LocalBookie:
    """A bookie in this process, over one ``LedgerStorage``."""

    def __init__(self, bookie_id: str, storage: LedgerStorage) -> None:
        self.bookie_id = bookie_id
        self.storage = storage
        self._stopped = False

    @property
    def available(self) -> bool:
        return not self._stopped

    def stop(self) -> None:
        """Simulate a bookie going away: every later call raises ``BookieUnavailable``."""
        self._stopped = True

    def _check(self) -> None:
        if self._stopped:
            raise BookieUnavailable(f"bookie {self.bookie_id} is unavailable")

    def add_entries(self, ledger_id: int, entry_ids: Sequence[int], lac: int,
                    entries: Sequence[tuple[int, bytes]], *, recovery: bool = False) -> Future[int]:
        """The entries in one storage call: one journal item, one future."""
        self._check()
        return self.storage.add_entries(ledger_id, entry_ids,
                                        [pack_entry(lac, length_bytes, payload) for length_bytes, payload in entries],
                                        recovery=recovery)

    def read_entry(self, ledger_id: int, entry_id: int) -> StoredEntry:
        self._check()
        return unpack_entry(self.storage.get_entry(ledger_id, entry_id))

    def read_entries(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[StoredEntry]:
        """Entries ``first..last`` of a ledger (the storage's read-ahead fills its read cache
        with the entries that follow the first it reads from an entry log)."""
        self._check()
        return [unpack_entry(data) for data in self.storage.get_entries(ledger_id, first_entry_id, last_entry_id)]

    def read_payloads(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """The payloads of entries ``first..last`` (a ledger's range read: no ``StoredEntry`` is made)."""
        self._check()
        start = _HEADER.size
        return [data[start:] for data in self.storage.get_entries(ledger_id, first_entry_id, last_entry_id)]

    def last_entry_id(self, ledger_id: int) -> int:
        self._check()
        try:
            return self.storage.get_last_add_confirmed(ledger_id)
        except NoSuchLedger:
            return -1

    def read_last_add_confirmed(self, ledger_id: int) -> int:
        """The highest LAC piggybacked on this bookie's entries of the ledger."""
        last = self.last_entry_id(ledger_id)
        if last < 0:
            return -1
        try:
            return self.read_entry(ledger_id, last).lac
        except NoSuchEntry:
            return -1

    def fence(self, ledger_id: int) -> Future[None]:
        self._check()
        return self.storage.fence(ledger_id)

    def delete_ledger(self, ledger_id: int) -> None:
        self._check()
        try:
            self.storage.delete_ledger(ledger_id)
        except NoSuchLedger:
            return


@dataclass(frozen=True)
class QuorumConfig:
    ensemble_size: int = 1
    write_quorum_size: int = 1
    ack_quorum_size: int = 1

    def __post_init__(self) -> None:
        if not self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1:
            raise ValueError("need ensemble_size >= write_quorum_size >= ack_quorum_size >= 1")


def write_set(ensemble: Sequence[str], entry_id: int, write_quorum_size: int) -> list[str]:
    """The ``Qw`` bookies that store ``entry_id``: consecutive from index ``entry_id % E``."""
    size = len(ensemble)
    if write_quorum_size == 1:
        return [ensemble[entry_id % size]]
    return [ensemble[(entry_id + i) % size] for i in range(write_quorum_size)]


class BookieClient:
    """Knows the bookies; picks ensembles; looks bookies up by id."""

    def __init__(self, bookies: Sequence[Bookie]) -> None:
        if not bookies:
            raise ValueError("at least one bookie is required")
        self._bookies = {b.bookie_id: b for b in bookies}
        self._next = 0
        self._lock = threading.Lock()

    def bookie(self, bookie_id: str) -> Bookie:
        bookie = self._bookies.get(bookie_id)
        if bookie is None:
            raise BookieUnavailable(f"unknown bookie {bookie_id}")
        return bookie

    def bookies(self) -> list[Bookie]:
        return list(self._bookies.values())

    def new_ensemble(self, size: int, *, exclude: Sequence[str] = ()) -> list[str]:
        """``size`` distinct available bookies, rotating the starting point between calls."""
        with self._lock:
            ids = sorted(b for b, bookie in self._bookies.items() if bookie.available and b not in exclude)
            if len(ids) < size:
                raise NotEnoughBookies(f"need {size} available bookies, have {len(ids)}")
            start = self._next % len(ids)
            self._next += 1
        return [ids[(start + i) % len(ids)] for i in range(size)]
