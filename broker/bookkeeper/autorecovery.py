"""Re-replication (BookKeeper's autorecovery): copies what a dead bookie held to live ones.

Role: after a bookie dies, every entry it stored has one copy fewer. This worker restores them,
so a second failure loses nothing. It runs in each cluster broker (``ReplicationWorker``), in
two steps, each under a lock of the coordination service so that workers of several brokers
never do the same work twice:

1. **Audit** (lock ``auditor``; every ``audit_interval_ms`` and after each membership change):
   list the ledgers, and mark under ``/ledgers/underreplication/ledgers/<id>`` each one that has
   a fragment with a bookie that is no longer registered and entries to copy.
2. **Replicate** (lock ``ledger-<id>`` per marked ledger): for each such fragment choose a new
   ensemble (a spare in each dead bookie's place, or, without spares, the fragment's live
   bookies if they are at least the write quorum, as the writer's ensemble change does), copy
   every entry of the fragment to the bookies that joined its write set (read from a live
   replica, written as a recovery add so fenced ledgers accept it, with its piggybacked LAC
   and length unchanged), then compare-and-set the ledger metadata with the new ensembles and
   remove the mark.

What is copied: a closed ledger's fragments up to its last entry; an open ledger's finished
fragments, and its last fragment up to the highest LAC its live bookies know, which is split
off as a fragment of its own (the writer keeps writing the rest to its ensemble and merges this
change when it next changes the metadata, see ``LedgerHandle._store_metadata``). Ledgers in
recovery are left to their recoverer and looked at again in the next pass.

Invariants: metadata changes only by compare-and-set, after every copy it names is durable; a
worker that loses its lock (session expiry) stops before writing metadata.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from broker.bookkeeper.bookie import BookieClient, BookieUnavailable, StoredEntry, write_set
from broker.bookkeeper.ledger_manager import LedgerManager
from broker.bookkeeper.ledger_metadata import LEDGERS_PATH, LedgerMetadata, LedgerState, ledger_path
from broker.errors import BadVersion, BrokerError, MagnetarError, NoSuchEntry, NoSuchLedger, NotFound
from broker.limits import COPY_TIMEOUT_S
from broker.metadata.coordination import Coordination, Lease
from broker.metadata.store import MetadataStore

log = logging.getLogger(__name__)

UNDERREPLICATED_PATH = "/ledgers/underreplication/ledgers"
AUDITOR_LOCK = "auditor"


@dataclass(frozen=True)
class AutoRecoveryConfig:
    interval_ms: int = 1_000
    """How often marked ledgers are looked for (cheap: one listing)."""
    audit_interval_ms: int = 60_000
    """How often every ledger's ensembles are checked (also after each membership change)."""
    copies_in_flight_max: int = 256
    """Entries being copied at once by one worker."""


@dataclass(frozen=True)
class AutoRecoveryStats:
    audits: int
    ledgers_audited: int
    ledgers_marked: int
    ledgers_replicated: int
    fragments_replaced: int
    entries_copied: int
    conflicts: int
    failures: int
    underreplicated: int


@dataclass(frozen=True)
class _Plan:
    fragments: list[tuple[int, list[str]]]
    copies: list[tuple[int, list[str], list[str]]]
    """(entry id, bookies that hold it, bookies it must be copied to)."""
    replaced: int


class ReplicationWorker:
    def __init__(self, store: MetadataStore, manager: LedgerManager, coordination: Coordination,
                 config: AutoRecoveryConfig | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.manager = manager
        self.coordination = coordination
        self.config = config or AutoRecoveryConfig()
        self.clock = clock
        self._stop = threading.Event()
        self._audit_due = threading.Event()
        self._audit_due.set()
        self._thread: threading.Thread | None = None
        self._last_audit_s = 0.0
        self._counters = dict.fromkeys(("audits", "ledgers_audited", "ledgers_marked", "ledgers_replicated",
                                        "fragments_replaced", "entries_copied", "conflicts", "failures"), 0)
        coordination.on_bookies_changed(lambda _: self._audit_due.set())

    @property
    def client(self) -> BookieClient:
        return self.manager.client

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="magnetar-autorecovery", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.config.interval_ms / 1000.0):
            try:
                self.run_once()
            except MagnetarError:
                self._counters["failures"] += 1
                log.exception("re-replication pass failed")

    def run_once(self) -> int:
        """One pass: audit when due, then replicate every marked ledger; ledgers repaired."""
        now = time.monotonic()
        if self._audit_due.is_set() or now - self._last_audit_s >= self.config.audit_interval_ms / 1000.0:
            self._audit_due.clear()
            self._last_audit_s = now
            self.audit()
        repaired = 0
        for ledger_id in self.underreplicated():
            if self._stop.is_set():
                break
            repaired += self._replicate_marked(ledger_id)
        return repaired

    def statistics(self) -> AutoRecoveryStats:
        c = self._counters
        return AutoRecoveryStats(c["audits"], c["ledgers_audited"], c["ledgers_marked"], c["ledgers_replicated"],
                                 c["fragments_replaced"], c["entries_copied"], c["conflicts"], c["failures"],
                                 len(self.underreplicated()))

    # --- audit ---------------------------------------------------------------------------------
    def audit(self) -> list[int]:
        """Mark every ledger with something to re-replicate; the ledgers marked by this pass."""
        lease = self.coordination.try_lock(AUDITOR_LOCK)
        if lease is None:
            return []
        marked: list[int] = []
        try:
            self._counters["audits"] += 1
            available = set(self.coordination.available_bookies())
            for name in self.store.children(LEDGERS_PATH):
                if not name.isdigit() or not lease.held:
                    continue
                self._counters["ledgers_audited"] += 1
                try:
                    meta, _ = self.manager.metadata(int(name))
                    plan = self._plan(meta, available, copy_plan=False)
                except (NoSuchLedger, BrokerError):
                    continue
                if plan is not None and plan.replaced:
                    self._mark(meta.ledger_id, sorted({b for _, e in meta.fragments for b in e} - available))
                    marked.append(meta.ledger_id)
        finally:
            lease.release()
        return marked

    def underreplicated(self) -> list[int]:
        return sorted(int(n) for n in self.store.children(UNDERREPLICATED_PATH) if n.isdigit())

    def _mark(self, ledger_id: int, missing: list[str]) -> None:
        path = f"{UNDERREPLICATED_PATH}/{ledger_id}"
        if not self.store.exists(path):
            self.store.put_json(path, {"missingReplicas": missing, "markedMs": int(self.clock() * 1000)})
            self._counters["ledgers_marked"] += 1

    def _unmark(self, ledger_id: int) -> None:
        try:
            self.store.delete(f"{UNDERREPLICATED_PATH}/{ledger_id}")
        except NotFound:
            return

    # --- replication ---------------------------------------------------------------------------
    def _replicate_marked(self, ledger_id: int) -> int:
        lease = self.coordination.try_lock(f"ledger-{ledger_id}")
        if lease is None:
            return 0
        try:
            return 1 if self.replicate(ledger_id, lease) else 0
        except MagnetarError:
            self._counters["failures"] += 1
            log.warning("re-replication of ledger %d failed; retried in a later pass", ledger_id, exc_info=True)
            return 0
        finally:
            lease.release()

    def replicate(self, ledger_id: int, lease: Lease | None = None) -> bool:
        """Re-replicate one ledger now; True when its metadata no longer names a dead bookie
        for any entry that can be repaired (its mark is then removed)."""
        try:
            meta, version = self.manager.metadata(ledger_id)
        except NoSuchLedger:
            self._unmark(ledger_id)
            return True
        if meta.state is LedgerState.IN_RECOVERY:
            return False
        plan = self._plan(meta, set(self.coordination.available_bookies()), copy_plan=True)
        if plan is None:
            return False
        if plan.replaced:
            self._copy(meta, plan)
            if lease is not None and not lease.held:
                return False
            meta.fragments = plan.fragments
            try:
                self.store.put(ledger_path(ledger_id), meta.to_json(), version)
            except BadVersion:
                self._counters["conflicts"] += 1
                return False
            self._counters["fragments_replaced"] += plan.replaced
            self._counters["ledgers_replicated"] += 1
        self._unmark(ledger_id)
        return True

    def _plan(self, meta: LedgerMetadata, available: set[str], *, copy_plan: bool) -> _Plan | None:
        """The new fragments and the copies they need; None when a fragment with a dead bookie
        cannot be repaired now (too few live bookies)."""
        qw = meta.quorum.write_quorum_size
        fragments: list[tuple[int, list[str]]] = []
        copies: list[tuple[int, list[str], list[str]]] = []
        replaced = 0
        count = len(meta.fragments)
        for index, (first, ensemble) in enumerate(meta.fragments):
            last_fragment = index == count - 1
            if meta.state is LedgerState.CLOSED:
                end = meta.last_entry_id if last_fragment else meta.fragments[index + 1][0] - 1
            elif not last_fragment:
                end = meta.fragments[index + 1][0] - 1
            else:
                end = self._confirmed_on(meta, ensemble, available)
            dead = [b for b in ensemble if b not in available]
            if not dead or end < first:
                fragments.append((first, ensemble))
                continue
            new_ensemble = self._new_ensemble(ensemble, dead, available, qw)
            if new_ensemble is None:
                return None
            replaced += 1
            fragments.append((first, new_ensemble))
            if last_fragment and meta.state is not LedgerState.CLOSED:
                fragments.append((end + 1, ensemble))  # the writer's part, beyond what is confirmed
            if copy_plan:
                for entry_id in range(first, end + 1):
                    old = write_set(ensemble, entry_id, qw)
                    holders = [b for b in old if b in available]
                    targets = [b for b in write_set(new_ensemble, entry_id, qw) if b not in holders]
                    if targets:
                        copies.append((entry_id, holders, targets))
        return _Plan(fragments, copies, replaced)

    def _new_ensemble(self, ensemble: list[str], dead: list[str], available: set[str], qw: int) -> list[str] | None:
        spares = [b for b in sorted(available) if b not in ensemble]
        if len(spares) >= len(dead):
            replacement = dict(zip(dead, spares, strict=False))
            return [replacement.get(b, b) for b in ensemble]
        live = [b for b in ensemble if b in available]
        return live if len(live) >= qw else None

    def _confirmed_on(self, meta: LedgerMetadata, ensemble: list[str], available: set[str]) -> int:
        """The highest LAC piggybacked on the live bookies of an open ledger's last fragment."""
        best = -1
        for bookie_id in ensemble:
            if bookie_id in available:
                try:
                    best = max(best, self.client.bookie(bookie_id).read_last_add_confirmed(meta.ledger_id))
                except BrokerError:
                    continue
        return best

    def _copy(self, meta: LedgerMetadata, plan: _Plan) -> None:
        """Copy every planned entry; raise if any copy fails (nothing is then published)."""
        in_flight: list[Future[int]] = []
        for entry_id, holders, targets in plan.copies:
            stored = self._read(meta.ledger_id, entry_id, holders)
            for target in targets:
                in_flight.append(self.client.bookie(target).add_entries(
                    meta.ledger_id, [entry_id], stored.lac, [(stored.length_bytes, stored.payload)], recovery=True))
            if len(in_flight) >= self.config.copies_in_flight_max:
                self._wait(in_flight)
        self._wait(in_flight)

    def _read(self, ledger_id: int, entry_id: int, holders: list[str]) -> StoredEntry:
        for bookie_id in holders:
            try:
                return self.client.bookie(bookie_id).read_entry(ledger_id, entry_id)
            except (BookieUnavailable, NoSuchEntry, NoSuchLedger):
                continue
        raise NoSuchEntry(f"entry {ledger_id}:{entry_id} is on no live bookie of {holders}")

    def _wait(self, in_flight: list[Future[int]]) -> None:
        for future in in_flight:
            future.result(timeout=COPY_TIMEOUT_S)
            self._counters["entries_copied"] += 1
        in_flight.clear()
