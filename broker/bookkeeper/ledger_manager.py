"""LedgerManager: creates, opens and deletes ledgers (BookKeeper's ``LedgerManager``).

Role: the managed ledger, the cursor store, compaction and re-replication get their ledgers
here. A new ledger takes an id never handed out before (the cluster's id generator, or a
compare-and-set counter in the store), an ensemble from the ``BookieClient`` and its metadata
at ``/ledgers/{id}`` (``ledger_metadata.py``), and comes back as a writable ``LedgerHandle``
(``ledger_handle.py``); opening a ledger that is not closed recovers it first
(``ledger_recovery.py``) unless the caller only wants to read along.

Invariants: ledger ids are never reused; deleting removes a ledger from its bookies before its
metadata, and deleting a missing ledger is a no-op, so an interrupted deletion is simply retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from broker.bookkeeper.bookie import BookieClient, BookieUnavailable, QuorumConfig
from broker.bookkeeper.ledger_handle import LedgerHandle
from broker.bookkeeper.ledger_metadata import LedgerMetadata, LedgerState, ledger_path, read_ledger_metadata
from broker.bookkeeper.ledger_recovery import LedgerRecovery
from broker.errors import BadVersion, NoSuchLedger, NotFound
from broker.metadata.store import MetadataStore

LEDGER_ID_COUNTER = "/counters/ledger-id"


class LedgerManager:
    """Creates, opens (with recovery), and deletes ledgers."""

    def __init__(self, store: MetadataStore, client: BookieClient,
                 clock: Callable[[], float] = time.time, *, id_generator: Callable[[], int] | None = None) -> None:
        self.store = store
        self.client = client
        self.clock = clock
        self._id_generator = id_generator

    def allocate_id(self) -> int:
        """A ledger id never handed out before: from the cluster's id generator when there is
        one (ZooKeeper's counter), else a compare-and-set on a counter in the store."""
        if self._id_generator is not None:
            return self._id_generator()
        for _ in range(1000):
            stat = self.store.get(LEDGER_ID_COUNTER)
            current = int(stat.value) if stat is not None else 0
            try:
                self.store.put(LEDGER_ID_COUNTER, str(current + 1).encode(),
                               stat.version if stat is not None else -1)
            except BadVersion:
                continue
            return current + 1
        raise BadVersion("could not allocate a ledger id: too much contention")

    def create(self, quorum: QuorumConfig | None = None, custom: dict[str, str] | None = None, *,
               ledger_id: int | None = None) -> LedgerHandle:
        """A new, writable ledger; with ``ledger_id`` (from :meth:`allocate_id`) under that id, so
        a caller can name the ledger in its own records before it exists: a crash in between
        leaves a name without a ledger, never a ledger nobody names."""
        quorum = quorum or QuorumConfig()
        ledger_id = self.allocate_id() if ledger_id is None else ledger_id
        meta = LedgerMetadata(ledger_id, quorum, fragments=[(0, self.client.new_ensemble(quorum.ensemble_size))],
                              created_ms=int(self.clock() * 1000), custom=dict(custom or {}))
        stat = self.store.put(ledger_path(ledger_id), meta.to_json(), -1)
        return LedgerHandle(self.store, self.client, meta, stat.version, writable=True)

    def metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return read_ledger_metadata(self.store, ledger_id)

    def open(self, ledger_id: int, *, recovery: bool = True) -> LedgerHandle:
        """A read handle. With ``recovery`` an unclosed ledger is fenced, recovered and closed."""
        meta, version = self.metadata(ledger_id)
        if meta.state is LedgerState.CLOSED or not recovery:
            handle = LedgerHandle(self.store, self.client, meta, version, writable=False)
            if meta.state is not LedgerState.CLOSED:
                handle.refresh_last_add_confirmed()
            return handle
        LedgerRecovery(self.store, self.client, meta, version).run()
        return self.open(ledger_id, recovery=False)

    def delete(self, ledger_id: int) -> None:
        """Delete a ledger from its bookies, then its metadata; deleting a missing ledger is a
        no-op, so interrupted deletions can simply be retried."""
        try:
            meta, _ = self.metadata(ledger_id)
        except NoSuchLedger:
            return
        for bookie_id in sorted({b for _, ensemble in meta.fragments for b in ensemble}):
            try:
                self.client.bookie(bookie_id).delete_ledger(ledger_id)
            except BookieUnavailable:
                continue  # its copy is orphaned; the bookie drops it when it learns the ledger is gone
        try:
            self.store.delete(ledger_path(ledger_id))
        except NotFound:
            return
