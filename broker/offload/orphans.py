"""Offloaded copies whose topic is gone but whose objects the store did not delete.

Role: a topic deleted while its store is down (or with no offload driver configured any more)
cannot delete its offloaded copies then, and its metadata, which named them, goes with it. Before
it goes, ``ManagedLedger.delete`` records each such copy here, one node per copy under
``/offload/orphaned-copies`` (``{ledger}-{uuid}``: the copy's ``OffloadContext`` and the managed
ledger it was part of). So is an attempt no ledger list will name whose objects the store did
not delete: a failed upload's, or one that finished after its ledger was trimmed or its topic
went to another broker (``ManagedLedgerOffload._delete_or_orphan``).
``OrphanedCopies.maybe_sweep``, called after each maintenance pass, tries
to delete them again at most every ``OFFLOAD_RETRY_DELAY_MS`` and at most
``OFFLOAD_ORPHAN_DELETES_PER_SWEEP_MAX`` per sweep, and removes a node once its copy is gone. A sweep
stops at the first delete the store refuses (each refusal may have waited out the store's
timeouts and retries, in the maintenance thread), and the next sweep starts after the copy the
last one stopped at, so copies refused for good never keep the others from their turn. In a
cluster every broker sweeps the same nodes; a delete is idempotent (a missing object is not an
error), so two sweeps of one copy are harmless.

Invariants: a copy is recorded before the topic's metadata is deleted, so no copy is ever
unnamed by both; a node is removed only after its copy's delete succeeded; a sweep runs in the
maintenance thread, never on the event loop, and asks a refusing store once; a failure is
logged, never raised to the caller.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.errors import BadVersion, MagnetarError, NotFound
from broker.limits import OFFLOAD_ORPHAN_DELETES_PER_SWEEP_MAX, OFFLOAD_RETRY_DELAY_MS
from broker.metadata.store import MetadataStore
from broker.offload.offloader import LedgerOffloader, OffloadContext

log = logging.getLogger(__name__)

ORPHANS_ROOT = "/offload/orphaned-copies"


def record_orphaned_copies(store: MetadataStore, managed_ledger: str,
                           copies: Iterable[tuple[int, OffloadContext]]) -> None:
    """Name ``copies`` (ledger id, context) of ``managed_ledger`` under ``ORPHANS_ROOT``, so they
    are deleted once the store takes deletes again."""
    for ledger_id, context in copies:
        store.put_json(f"{ORPHANS_ROOT}/{ledger_id}-{context.uuid}",
                       {"ledgerId": ledger_id, "managedLedger": managed_ledger, "context": context.to_json()})


@dataclass(frozen=True)
class OrphanStatistics:
    recorded: int
    """Copies named under ``ORPHANS_ROOT`` at the last sweep."""
    deleted: int
    """Copies this broker deleted since it started."""
    last_sweep_ms: int | None


class OrphanedCopies:
    """The sweeper of ``ORPHANS_ROOT``."""

    def __init__(self, store: MetadataStore, offloader: Callable[[], LedgerOffloader | None],
                 clock: Callable[[], float], *, interval_ms: int = OFFLOAD_RETRY_DELAY_MS,
                 per_sweep_max: int = OFFLOAD_ORPHAN_DELETES_PER_SWEEP_MAX) -> None:
        self._store = store
        self._offloader = offloader
        self._clock = clock
        self._interval_ms = interval_ms
        self._per_sweep_max = per_sweep_max
        self._lock = threading.Lock()
        self._swept_at_ms: int | None = None
        self._recorded = 0
        self._deleted = 0
        self._last_tried = ""
        """The name the last sweep stopped at: the next one starts after it."""

    def maybe_sweep(self) -> None:
        """Sweep when the last sweep is older than the interval (and an offloader is configured)."""
        now_ms = int(self._clock() * 1000)
        with self._lock:
            if self._swept_at_ms is not None and now_ms - self._swept_at_ms < self._interval_ms:
                return
            self._swept_at_ms = now_ms
        offloader = self._offloader()
        if offloader is None:
            return
        try:
            self.sweep(offloader)
        except MagnetarError as exc:  # the metadata store: the next sweep tries again
            log.warning("sweep of the orphaned offloaded copies failed: %s", exc)

    def sweep(self, offloader: LedgerOffloader) -> int:
        """Delete up to ``per_sweep_max`` orphaned copies, starting after the one the last sweep
        stopped at and stopping at the first the store refuses; returns how many went."""
        names = self._store.children(ORPHANS_ROOT)
        self._recorded = len(names)
        start = bisect.bisect_right(names, self._last_tried)
        deleted = 0
        for name in (names[start:] + names[:start])[:self._per_sweep_max]:
            self._last_tried = name
            outcome = self._delete(offloader, name)
            if outcome is None:
                break
            deleted += outcome
        self._deleted += deleted
        self._recorded -= deleted
        return deleted

    def _delete(self, offloader: LedgerOffloader, name: str) -> bool | None:
        """Delete one named copy and then its name: whether this sweep deleted it (False:
        another broker's did), None if the store refused."""
        path = f"{ORPHANS_ROOT}/{name}"
        found = self._store.get_json(path)
        if found is None:
            return False  # another broker's sweep took it
        value, version = found
        try:
            context = OffloadContext.from_json(value["context"])
            offloader.delete(int(value["ledgerId"]), context.uuid, context.driver_metadata, context.driver_name)
        except Exception as exc:  # the store still refuses: the node stays for a later sweep
            log.warning("orphaned offloaded copy %s (of %s) not deleted yet: %s", name,
                        value.get("managedLedger", "?"), exc)
            return None
        with contextlib.suppress(NotFound, BadVersion):  # another broker's sweep took it
            self._store.delete(path, version)
        return True

    def statistics(self) -> OrphanStatistics:
        return OrphanStatistics(recorded=self._recorded, deleted=self._deleted, last_sweep_ms=self._swept_at_ms)
