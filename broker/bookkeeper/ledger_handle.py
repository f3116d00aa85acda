"""LedgerHandle: the writer or a reader of one ledger (BookKeeper's LedgerHandle).

Role: the managed ledger appends through a handle and reads through one. Its metadata
(``ledger_metadata.py``) says which bookies hold each entry.

- **Add**: the writer sends entry ``e`` to its write set (``Qw`` bookies from ``e % E``) and
  acknowledges it once ``Qa`` of them have it durable. Acknowledgements complete in entry order
  and advance the last add confirmed (LAC). A failed bookie is replaced by an ensemble change
  (a new fragment) when a spare bookie exists; otherwise the handle fails its pending adds.
- **Read**: only entries ``<= LAC``; each is tried on the bookies of its write set in turn, so a
  stopped bookie's entries are read from a replica.
- **Close** fixes the last entry id in the metadata (compare-and-set, so a concurrent recovery
  wins and the writer learns it was fenced). A recovery (``ledger_recovery.py``) fences the
  bookies: the old handle's later adds fail with ``LedgerFenced``.

Invariants: entry ids are dense from 0 and acknowledged in order; the LAC never passes an entry
that ``Qa`` bookies of its current write set hold; the writer changes the metadata only by
compare-and-set, merging a re-replication worker's change to finished fragments (at most
``METADATA_MERGES_MAX`` times).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from broker.bookkeeper.bookie import BookieClient, BookieUnavailable, write_set
from broker.bookkeeper.ledger_metadata import (
    LedgerMetadata,
    LedgerState,
    ensemble_in,
    ledger_path,
    read_ledger_metadata,
)
from broker.errors import (
    BadVersion,
    CorruptEntry,
    InvalidRequest,
    LedgerClosed,
    LedgerFenced,
    MagnetarError,
    NoSuchEntry,
    NoSuchLedger,
    NotEnoughBookies,
    StorageError,
)
from broker.limits import FUTURE_TIMEOUT_S, METADATA_MERGES_MAX
from broker.metadata.store import MetadataStore
from storage import new_future


@dataclass(slots=True)
class _PendingAdd:
    entry_id: int
    payload: bytes
    length_bytes: int  # ledger length including this entry, piggybacked for recovery
    future: Future[int] | None  # None inside a group add: only the group's last entry has one
    acked_by: set[str] = field(default_factory=set)
    done: bool = False


class LedgerHandle:
    """A writer (from ``create``) or reader (from ``open``) of one ledger."""

    def __init__(self, store: MetadataStore, client: BookieClient, meta: LedgerMetadata, version: int, *,
                 writable: bool) -> None:
        self._store = store
        self._client = client
        self.metadata = meta
        self._version = version
        self.writable = writable and meta.state is LedgerState.OPEN
        self.ledger_id = meta.ledger_id
        self._lock = threading.Lock()
        self._lac = meta.last_entry_id
        self._next_entry_id = meta.last_entry_id + 1
        self._length_bytes = meta.length_bytes
        self._sent_length_bytes = meta.length_bytes
        self._pending: deque[_PendingAdd] = deque()
        self._failure: MagnetarError | None = None
        self._ensemble_changes = 0
        self._failed_bookies: set[str] = set()
        """Bookies that failed this writer: never chosen again for this ledger, so ensemble
        changes end (at most one per bookie) instead of cycling between unreachable ones."""

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length_bytes(self) -> int:
        return self._length_bytes

    @property
    def closed(self) -> bool:
        return self.metadata.state is LedgerState.CLOSED

    def refresh_last_add_confirmed(self) -> int:
        """For a reader of an open ledger: the highest LAC piggybacked on the bookies."""
        if self.closed:
            return self._lac
        best = self._lac
        for bookie_id in self.metadata.fragments[-1][1]:
            try:
                best = max(best, self._client.bookie(bookie_id).read_last_add_confirmed(self.ledger_id))
            except BookieUnavailable:
                continue
        self._lac = best
        return best

    # --- writing -------------------------------------------------------------------------
    def append(self, payloads: Sequence[bytes]) -> Future[int]:
        """Append consecutive entries (a single entry is a group of one); one Future resolves to
        the last entry id once every one of them is acknowledged by ``Qa`` bookies (groups
        complete in entry order), or fails with the first failure. All of them are accepted or
        none.

        Each bookie of the ensemble gets the entries of the group whose write set holds it in
        one call (``Bookie.add_entries``: one journal item in process, one request on the
        wire), so a group costs a call per bookie, not one per entry and copy."""
        if not payloads:
            raise InvalidRequest("an append needs at least one entry")
        with self._lock:
            if not self.writable:
                raise LedgerClosed(f"ledger {self.ledger_id} is not open for writing")
            if self._failure is not None:
                raise self._failure
            group: list[_PendingAdd] = []
            entry_id, length_bytes = self._next_entry_id, self._sent_length_bytes
            for payload in payloads:
                length_bytes += len(payload)
                group.append(_PendingAdd(entry_id, payload, length_bytes, None))
                entry_id += 1
            future: Future[int] = new_future()
            group[-1].future = future
            self._next_entry_id, self._sent_length_bytes = entry_id, length_bytes
            self._pending.extend(group)
            ensemble, lac = self.metadata.fragments[-1][1], self._lac
            write_quorum = self.metadata.quorum.write_quorum_size
        if write_quorum == len(ensemble):  # every bookie holds every entry (E = Qw, e.g. 1/1/1 or 2/2/2)
            for bookie_id in ensemble:
                self._send_group(group, bookie_id, lac)
            return future
        per_bookie: dict[str, list[_PendingAdd]] = {}
        for pending in group:
            for bookie_id in write_set(ensemble, pending.entry_id, write_quorum):
                per_bookie.setdefault(bookie_id, []).append(pending)
        for bookie_id, entries in per_bookie.items():
            self._send_group(entries, bookie_id, lac)
        return future

    def _send_group(self, group: list[_PendingAdd], bookie_id: str, lac: int) -> None:
        try:
            future = self._client.bookie(bookie_id).add_entries(
                self.ledger_id, [p.entry_id for p in group], lac, [(p.length_bytes, p.payload) for p in group])
        except MagnetarError as exc:
            self._on_bookie_failure(group[0], bookie_id, exc)
            return
        future.add_done_callback(lambda f: self._on_group_result(group, bookie_id, f))

    def _on_group_result(self, group: list[_PendingAdd], bookie_id: str, future: Future[int]) -> None:
        error = future.exception()
        if error is not None:
            self._on_bookie_failure(group[0], bookie_id, error)
            return
        with self._lock:
            changed = self._ensemble_changes
            for pending in group:
                if changed and bookie_id not in self._write_set(pending.entry_id):
                    continue  # replaced by an ensemble change meanwhile: its copy does not count
                pending.acked_by.add(bookie_id)
        self._complete_in_order()

    def _write_set(self, entry_id: int) -> list[str]:
        return write_set(self.metadata.ensemble_for(entry_id), entry_id, self.metadata.quorum.write_quorum_size)

    def _complete_in_order(self) -> None:
        completed: list[_PendingAdd] = []
        quorum = self.metadata.quorum.ack_quorum_size
        with self._lock:
            while self._pending and len(self._pending[0].acked_by) >= quorum:
                pending = self._pending.popleft()
                pending.done = True
                self._lac = pending.entry_id
                self._length_bytes += len(pending.payload)
                completed.append(pending)
        for pending in completed:
            if pending.future is not None:
                pending.future.set_result(pending.entry_id)

    def _on_bookie_failure(self, pending: _PendingAdd, bookie_id: str, error: BaseException) -> None:
        if isinstance(error, LedgerFenced):
            self._fail_all(LedgerFenced(f"ledger {self.ledger_id} was fenced by a recovery"))
            return
        try:
            old_fragments = self._change_ensemble(bookie_id)
        except NotEnoughBookies as exc:
            # no spare: the bookie's own refusal (its disk is full, it is read-only) says more
            self._fail_all(error if isinstance(error, StorageError) else exc)
            return
        except MagnetarError as exc:
            self._fail_all(exc)
            return
        if old_fragments is None:
            return  # an ensemble change already replaced that bookie and resent this entry
        self._resend(old_fragments)

    def _resend(self, old_fragments: list[tuple[int, list[str]]]) -> None:
        """After an ensemble change: each pending entry goes to the bookies that joined its
        write set, and acknowledgements from bookies that left it no longer count (BookKeeper's
        ``unsetSuccessAndSendWriteRequest``)."""
        quorum = self.metadata.quorum.write_quorum_size
        sends: dict[str, list[_PendingAdd]] = {}
        with self._lock:
            for waiting in self._pending:
                if waiting.done:
                    continue
                old = write_set(ensemble_in(old_fragments, waiting.entry_id), waiting.entry_id, quorum)
                new = self._write_set(waiting.entry_id)
                waiting.acked_by.intersection_update(new)
                for target in new:
                    if target not in old and target not in waiting.acked_by:
                        sends.setdefault(target, []).append(waiting)
            lac = self._lac
        for target, group in sends.items():
            self._send_group(group, target, lac)
        self._complete_in_order()

    def _change_ensemble(self, failed_bookie: str) -> list[tuple[int, list[str]]] | None:
        """Replace ``failed_bookie`` in the current ensemble from the next pending entry on;
        the fragments as they were before, or None when it is no longer in the ensemble."""
        with self._lock:
            ensemble = self.metadata.fragments[-1][1]
            if failed_bookie not in ensemble:
                return None
            old_fragments = list(self.metadata.fragments)
            self._failed_bookies.add(failed_bookie)
            new_ensemble = self._replacement_ensemble(ensemble, failed_bookie)
            first_entry_id = self._lac + 1
            fragments = [f for f in self.metadata.fragments if f[0] < first_entry_id]
            fragments.append((first_entry_id, new_ensemble))
            self.metadata.fragments = fragments
            self._ensemble_changes += 1
            self._store_metadata(change_from=first_entry_id)
            return old_fragments

    def _replacement_ensemble(self, ensemble: list[str], failed_bookie: str) -> list[str]:
        """A spare bookie in the failed one's place; without a spare, the ensemble's live bookies
        alone, as long as they are at least the write quorum (every entry still goes to ``Qw``
        bookies and waits for ``Qa``: only the striping narrows)."""
        client = self._client
        try:
            spare = client.new_ensemble(1, exclude=[*ensemble, *self._failed_bookies])[0]
        except NotEnoughBookies:
            live = [b for b in ensemble if b not in self._failed_bookies and _is_available(client, b)]
            if len(live) < self.metadata.quorum.write_quorum_size:
                raise
            return live
        return [spare if b == failed_bookie else b for b in ensemble]

    def _fail_all(self, error: MagnetarError) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = error
            failed = [p for p in self._pending if not p.done]
            self._pending.clear()
        for pending in failed:
            pending.done = True
            if pending.future is not None and not pending.future.done():
                pending.future.set_exception(error)

    def _store_metadata(self, *, change_from: int | None = None) -> None:
        """Compare-and-set the metadata. A conflict while the ledger is still OPEN is the
        re-replication worker, which rewrites only fragments this writer has finished: take
        its fragments before ``change_from`` (all of them when None) and this writer's from
        there on, and try again. Otherwise a recovery took the ledger: ``LedgerFenced``."""
        store = self._store
        for _ in range(METADATA_MERGES_MAX):
            try:
                self._version = store.put(ledger_path(self.ledger_id), self.metadata.to_json(), self._version).version
                return
            except BadVersion:
                stored, version = read_ledger_metadata(self._store, self.ledger_id)
                if stored.state is not LedgerState.OPEN:
                    raise LedgerFenced(f"ledger {self.ledger_id} was recovered by another writer") from None
                if change_from is None:
                    self.metadata.fragments = stored.fragments
                else:
                    self.metadata.fragments = [f for f in stored.fragments if f[0] < change_from] + [
                        f for f in self.metadata.fragments if f[0] >= change_from]
                self._version = version
        raise BadVersion(f"ledger {self.ledger_id}: metadata kept changing under its writer")

    def close(self) -> None:
        """Wait for pending adds, then fix the last entry id in the metadata."""
        if not self.writable:
            return
        with self._lock:
            waiting = [p.future for p in self._pending if p.future is not None]
        for future in waiting:
            try:
                future.result(timeout=FUTURE_TIMEOUT_S)
            except MagnetarError:
                break
        with self._lock:
            self.writable = False
            self.metadata.state = LedgerState.CLOSED
            self.metadata.last_entry_id = self._lac
            self.metadata.length_bytes = self._length_bytes
            try:
                self._store_metadata()
            except LedgerFenced:
                self.metadata, self._version = read_ledger_metadata(self._store, self.ledger_id)
                raise

    # --- reading -------------------------------------------------------------------------
    def read_entry(self, entry_id: int) -> bytes:
        if not 0 <= entry_id <= self._lac:
            raise NoSuchEntry(f"entry {self.ledger_id}:{entry_id} is beyond the last add confirmed {self._lac}")
        return self._read_any_replica(entry_id)

    def read(self, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """Entries ``first..last`` inclusive; ``last`` may not pass the LAC. A range that one
        bookie holds whole (its fragment's write set is the whole ensemble) is one range read
        from it; otherwise each entry is read from any replica of its write set."""
        if first_entry_id > last_entry_id:
            raise InvalidRequest(f"empty range {first_entry_id}..{last_entry_id}")
        if last_entry_id > self._lac or first_entry_id < 0:
            raise NoSuchEntry(f"range {first_entry_id}..{last_entry_id} passes the LAC {self._lac}")
        holder = self._single_holder(first_entry_id, last_entry_id)
        if holder is not None:
            try:
                return self._client.bookie(holder).read_payloads(self.ledger_id, first_entry_id, last_entry_id)
            except (BookieUnavailable, NoSuchEntry, NoSuchLedger, CorruptEntry):
                pass  # the replicas one by one, as for any other range
        return [self._read_any_replica(e) for e in range(first_entry_id, last_entry_id + 1)]

    def _single_holder(self, first_entry_id: int, last_entry_id: int) -> str | None:
        """The bookie that holds every entry of the range, when one does (E = Qw within one
        fragment: every bookie of the ensemble holds every entry; the first is asked)."""
        ensemble = self.metadata.ensemble_for(first_entry_id)
        if ensemble != self.metadata.ensemble_for(last_entry_id):
            return None
        if self.metadata.quorum.write_quorum_size < len(ensemble):
            return None
        return write_set(ensemble, first_entry_id, self.metadata.quorum.write_quorum_size)[0]

    def _read_any_replica(self, entry_id: int) -> bytes:
        try:
            return self._read_replica(entry_id)
        except NoSuchEntry:
            if not self._adopt_stored_fragments():
                raise
        return self._read_replica(entry_id)

    def _read_replica(self, entry_id: int) -> bytes:
        targets = write_set(self.metadata.ensemble_for(entry_id), entry_id, self.metadata.quorum.write_quorum_size)
        last_error: BaseException | None = None
        for bookie_id in targets:
            try:
                return self._client.bookie(bookie_id).read_entry(self.ledger_id, entry_id).payload
            except (BookieUnavailable, NoSuchEntry, NoSuchLedger, CorruptEntry) as exc:
                last_error = exc
        raise NoSuchEntry(f"entry {self.ledger_id}:{entry_id} unreadable on {targets}: {last_error}")

    def _adopt_stored_fragments(self) -> bool:
        """After a failed read: take the stored fragments, which the re-replication worker may
        have moved to live bookies since this handle read them. True when they differ. The
        writer adopts the stored version too only while the ledger is still OPEN, so a
        recovery's state change still fences it at its next metadata write."""
        try:
            stored, version = read_ledger_metadata(self._store, self.ledger_id)
        except MagnetarError:
            return False
        with self._lock:
            if stored.fragments == self.metadata.fragments:
                return False
            self.metadata.fragments = stored.fragments
            if stored.state is LedgerState.OPEN and self.metadata.state is LedgerState.OPEN:
                self._version = version
            return True


def _is_available(client: BookieClient, bookie_id: str) -> bool:
    try:
        return client.bookie(bookie_id).available
    except BookieUnavailable:
        return False
