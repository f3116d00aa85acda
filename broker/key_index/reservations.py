"""The key index's write path: each keyed message's version, given under the offset lock.

Role: ``KeyTail.reservation_of_keys`` prepares one entry's keyed messages as a
``KeyReservation``; the managed ledger calls it under the lock that assigns offsets
(``ManagedLedger.append``'s ``on_offsets``): there it checks the expected versions
(``KeyVersionMismatch``: nothing written) and gives each keyed message the next version of its
key. Those versions live in memory (the *tail*) until the entry is durable (``confirmed``:
readers see it from then on) or has failed (``failed``: withdrawn, so versions stay dense). The
indexer (``partition.py``) later takes confirmed reservations off the head of the tail once
their rows are in RocksDB (``rows.py``), whose heads the tail caches.

Invariants: a key's versions are dense and in offset order; a version, once confirmed, never
changes; reservations are made, confirmed and withdrawn in append order, and a failure
withdraws every later unconfirmed one with it; under the offset lock only dictionary work
happens, never a RocksDB write (a head not cached is one RocksDB read); the tail holds at most
``PENDING_ROWS_MAX`` versions (beyond, appends are refused with the retriable
``KeyIndexBusy``) and the head cache ``HEADS_CACHED_MAX`` keys.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence

from broker.errors import KeyIndexBusy, KeyVersionMismatch
from broker.key_index.rows import Head, StreamRow
from broker.limits import HEADS_CACHED_MAX, INDEX_BATCH_ROWS_MAX, PENDING_ROWS_MAX
from broker.message_fields import EXISTS, ExpectedVersion, check_key
from broker.message_id import Position


class KeyReservation:
    """One entry's keyed messages: versions given under the offset lock (:meth:`__call__`),
    visible once the entry is durable (:meth:`confirmed`) or withdrawn (:meth:`failed`)."""

    __slots__ = ("_expected", "_tail", "first_offset", "keyed", "message_count", "position", "versions")

    def __init__(self, tail: KeyTail, keyed: list[tuple[int, str]], message_count: int,
                 expected: Mapping[str, ExpectedVersion] | None) -> None:
        self._tail = tail
        self.keyed = keyed
        """(batch index, key) of every keyed message, in batch order."""
        self.message_count = message_count
        self._expected = expected
        self.versions: list[int] = []
        """The version of each keyed message (parallel to ``keyed``), once reserved."""
        self.first_offset = -1
        self.position: Position | None = None

    def __call__(self, first_offset: int) -> None:
        """Under the managed ledger's offset lock: check the expectations, number the messages."""
        self._tail.reserve(self, first_offset, self._expected)

    def confirmed(self, position: Position) -> None:
        self._tail.confirm(self, position)

    def failed(self) -> None:
        self._tail.withdraw(self)

    def message_versions(self) -> tuple[int | None, ...]:
        """The version of every message of the entry (None for a keyless one); empty when the
        entry has no keyed message."""
        if not self.keyed:
            return ()
        out: list[int | None] = [None] * self.message_count
        for (index, _), version in zip(self.keyed, self.versions, strict=True):
            out[index] = version
        return tuple(out)


class KeyTail:
    """One partition's versions given and not yet in RocksDB, and the heads RocksDB has, cached.

    ``lock`` guards both; it is taken under the managed ledger's offset lock, so it is held
    only briefly."""

    def __init__(self, display_name: str, indexed_head: Callable[[str], Head | None],
                 on_mismatch: Callable[[], None], on_confirmed: Callable[[], None]) -> None:
        self._display_name = display_name
        self._read_head = indexed_head
        """A key's head as RocksDB has it (``PartitionRows.head``)."""
        self._on_mismatch = on_mismatch
        self._on_confirmed = on_confirmed
        """Called on the confirming thread when keyed messages become readable."""
        self.lock = threading.Lock()
        self._pending: deque[KeyReservation] = deque()
        """Reserved entries not yet in RocksDB, in offset order."""
        self._tail: dict[str, deque[tuple[int, KeyReservation, int]]] = {}
        """Per key, its versions not yet in RocksDB: (version, reservation, batch index)."""
        self._pending_rows = 0
        self._heads: OrderedDict[str, Head | None] = OrderedDict()

    # --- reservations ---------------------------------------------------------------------
    def reservation_of_keys(self, keys: Sequence[str | None],
                            expected: Mapping[str, ExpectedVersion] | None = None) -> KeyReservation | None:
        """What the entry whose messages have ``keys`` (None: no key) needs from the index (None:
        nothing, it has no key, expects nothing, and no earlier reservation can be outstanding).
        Call with the topic's publish lock held, so reservations are made in append order."""
        if not expected and not self._pending and keys.count(None) == len(keys):
            return None
        keyed = [(i, check_key(key)) for i, key in enumerate(keys) if key is not None]
        return KeyReservation(self, keyed, len(keys), expected)

    def reserve(self, reservation: KeyReservation, first_offset: int,
                expected: Mapping[str, ExpectedVersion] | None) -> None:
        with self.lock:
            self._forget_failed_from(first_offset)
            current = self._check(expected) if expected else {}
            if not reservation.keyed:
                return
            if self._pending_rows + len(reservation.keyed) > PENDING_ROWS_MAX:
                raise KeyIndexBusy(f"the key index of {self._display_name} is {self._pending_rows} versions "
                                   "behind; retry shortly")
            reservation.first_offset = first_offset
            versions = reservation.versions
            for index, key in reservation.keyed:
                tail = self._tail.get(key)
                if tail:
                    version = tail[-1][0] + 1
                else:
                    latest = current.get(key)
                    if latest is None:
                        head = self.indexed_head(key)
                        latest = -1 if head is None else head[0]
                    version = latest + 1
                    if tail is None:
                        tail = self._tail[key] = deque()
                tail.append((version, reservation, index))
                versions.append(version)
            self._pending.append(reservation)
            self._pending_rows += len(versions)

    def _check(self, expected: Mapping[str, ExpectedVersion]) -> dict[str, int]:
        """Each expected key's latest version (``KeyVersionMismatch`` unless all are as expected)."""
        current: dict[str, int] = {}
        met = True
        for key, wanted in expected.items():  # one pass: this runs per key under the publish lock
            version = current[key] = self._assigned_version(key)
            if version != wanted and (wanted != EXISTS or version < 0):
                met = False
        if not met:
            self._on_mismatch()
            wrong = ", ".join(f"{k!r} is at {current[k]}, not {expected[k]}" for k in list(expected)[:5]
                              if not _meets(current[k], expected[k]))
            raise KeyVersionMismatch(f"key version mismatch on {self._display_name}: {wrong}",
                                     current_key_versions=current)
        return current

    def _assigned_version(self, key: str) -> int:
        """The key's latest version, counting appends still in flight (call with the lock)."""
        tail = self._tail.get(key)
        if tail:
            return tail[-1][0]
        head = self.indexed_head(key)
        return -1 if head is None else head[0]

    def _forget_failed_from(self, first_offset: int) -> None:
        """Offsets at or above ``first_offset`` are being given out again: the managed ledger
        went back to its confirmed end after a failed add, so every reservation still pending
        there failed (its ``failed`` call may simply not have arrived yet)."""
        while self._pending and self._pending[-1].position is None and self._pending[-1].first_offset >= first_offset:
            self._remove_last(self._pending[-1])

    def _remove_last(self, reservation: KeyReservation) -> None:
        """Withdraw ``reservation``, the last pending one of its keys (call with the lock)."""
        self._pending.remove(reservation)
        for index, key in reversed(reservation.keyed):
            tail = self._tail[key]
            if tail[-1][1] is reservation:
                tail.pop()
            else:  # not reached while failures follow append order; kept exact all the same
                tail.remove(next(row for row in tail if row[1] is reservation and row[2] == index))
            if not tail:
                del self._tail[key]
        self._pending_rows -= len(reservation.versions)

    def confirm(self, reservation: KeyReservation, position: Position) -> None:
        if not reservation.versions:
            return
        reservation.position = position
        self._on_confirmed()

    def withdraw(self, reservation: KeyReservation) -> None:
        with self.lock:
            if reservation.position is None and reservation in self._pending:
                failed_from = self._pending.index(reservation)
                for later in list(self._pending)[failed_from:][::-1]:  # later ones failed with it
                    if later.position is None:
                        self._remove_last(later)

    # --- heads ----------------------------------------------------------------------------
    def indexed_head(self, key: str) -> Head | None:
        """The key's head as RocksDB has it (cached; call with the lock)."""
        heads = self._heads
        if key in heads:
            heads.move_to_end(key)
            return heads[key]
        head = self._read_head(key)
        heads[key] = head
        if len(heads) > HEADS_CACHED_MAX:
            heads.popitem(last=False)
        return head

    def forget_heads(self) -> None:
        """Drop the cached heads (RocksDB's changed under them; the cache refills on use)."""
        self._heads.clear()

    def head(self, key: str) -> Head | None:
        """The key's last readable (durable) version and its offset; None: no message."""
        with self.lock:
            for version, reservation, index in reversed(self._tail.get(key, ())):
                if reservation.position is not None:
                    return version, reservation.first_offset + index
            return self.indexed_head(key)

    # --- reading what is not in RocksDB yet -------------------------------------------------
    def entry_versions(self, first_offset: int) -> dict[int, int] | None:
        """{batch index: version} of the confirmed pending entry starting at ``first_offset``
        (None: the tail has no such entry)."""
        with self.lock:
            for reservation in self._pending:
                if reservation.first_offset == first_offset and reservation.position is not None:
                    return {index: version for (index, _), version in zip(reservation.keyed, reservation.versions,
                                                                            strict=True)}
        return None

    def readable_rows(self, key: str, first_version: int, last_version: int) -> list[StreamRow]:
        """The confirmed versions ``first_version..last_version`` of ``key`` in the tail."""
        with self.lock:
            return [StreamRow(version, r.first_offset + index, r.position)
                    for version, r, index in self._tail.get(key, ())
                    if r.position is not None and first_version <= version <= last_version]

    def first_readable_at_or_after(self, key: str, offset: int) -> StreamRow | None:
        with self.lock:
            for version, r, index in self._tail.get(key, ()):
                if r.position is not None and r.first_offset + index >= offset:
                    return StreamRow(version, r.first_offset + index, r.position)
        return None

    # --- handing over to RocksDB ------------------------------------------------------------
    def confirmed_batch(self) -> tuple[list[KeyReservation], int]:
        """The confirmed reservations at the head of the tail, up to ``INDEX_BATCH_ROWS_MAX``
        rows, and their row count."""
        with self.lock:
            batch: list[KeyReservation] = []
            rows = 0
            for reservation in self._pending:
                if reservation.position is None or rows >= INDEX_BATCH_ROWS_MAX:
                    break
                batch.append(reservation)
                rows += len(reservation.versions)
        return batch, rows

    def indexed(self, batch: list[KeyReservation]) -> None:
        """``batch`` (from :meth:`confirmed_batch`) is in RocksDB: take it off the tail, its
        keys' heads cached."""
        with self.lock:
            for reservation in batch:
                self._pending.popleft()
                for _, key in reservation.keyed:
                    tail = self._tail[key]
                    version, _, index = tail.popleft()
                    self._heads[key] = (version, reservation.first_offset + index)
                    self._heads.move_to_end(key)
                    if not tail:
                        del self._tail[key]
                self._pending_rows -= len(reservation.versions)
            while len(self._heads) > HEADS_CACHED_MAX:
                self._heads.popitem(last=False)

    @property
    def has_pending(self) -> bool:
        """Whether any reservation is in the tail (call with the lock for a stable answer)."""
        return bool(self._pending)

    def has_confirmed_pending(self) -> bool:
        with self.lock:
            return bool(self._pending) and self._pending[0].position is not None

    def pending_rows(self) -> int:
        return self._pending_rows


def _meets(current: int, expected: ExpectedVersion) -> bool:
    return current >= 0 if expected == EXISTS else current == expected
