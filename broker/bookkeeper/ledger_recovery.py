"""Ledger recovery: fence a ledger its writer may have left open, then close it (``LedgerRecoveryOp``).

Role: ``LedgerManager.open(recovery=True)`` of a ledger that is not closed runs this. It marks
the ledger IN_RECOVERY, fences enough bookies of the last ensemble that the old writer can no
longer reach an ack quorum, reads forward from the highest piggybacked LAC, re-replicates every
entry found (replacing bookies that fail, as a writer's ensemble change does), and closes the
ledger at the last one. The old handle's later adds fail with ``LedgerFenced``.

Invariants: every entry the old writer had acknowledged is inside the closed ledger (recovery
stops only where so many bookies of an entry's write set say they lack it that it cannot have
reached an ack quorum; too few answers is ``NotEnoughBookies``, never an early end); the
metadata moves to IN_RECOVERY and CLOSED by compare-and-set, so a writer's close and a
recovery never both win; at most ``RECOVERY_ENTRIES_MAX`` entries are read forward.
"""

from __future__ import annotations

from broker.bookkeeper.bookie import BookieClient, BookieUnavailable, StoredEntry, write_set
from broker.bookkeeper.ledger_metadata import LedgerMetadata, LedgerState, ensemble_in, ledger_path
from broker.errors import BrokerError, CorruptEntry, NoSuchEntry, NoSuchLedger, NotEnoughBookies
from broker.limits import FUTURE_TIMEOUT_S, RECOVERY_ENTRIES_MAX
from broker.metadata.store import MetadataStore


class LedgerRecovery:
    """Fence, read forward from the highest piggybacked LAC, re-replicate, close."""

    def __init__(self, store: MetadataStore, client: BookieClient, meta: LedgerMetadata, version: int) -> None:
        self.store = store
        self.client = client
        self.meta = meta
        self.version = version
        self.written_with = list(meta.fragments)
        """Where the writer put each entry: reads follow these, whatever ensemble changes this
        recovery makes for the entries it writes again."""

    def run(self) -> None:
        """Recover the ledger and close it at the last entry found (its metadata CLOSED)."""
        if self.meta.state is LedgerState.OPEN:
            self.meta.state = LedgerState.IN_RECOVERY
            self.version = self.store.put(ledger_path(self.meta.ledger_id), self.meta.to_json(),
                                                  self.version).version
        lac, length_bytes = self._fence_and_read_lac()
        last, length_bytes = self._recover_forward(lac, length_bytes)
        self.meta.state = LedgerState.CLOSED
        self.meta.last_entry_id = last
        self.meta.length_bytes = length_bytes
        self.store.put(ledger_path(self.meta.ledger_id), self.meta.to_json(), self.version)

    def _fence_and_read_lac(self) -> tuple[int, int]:
        """Fence the last ensemble; return the highest piggybacked LAC and the ledger length
        at that entry."""
        ensemble = self.meta.fragments[-1][1]
        quorum = self.meta.quorum
        fenced, lac = 0, -1
        for bookie_id in ensemble:
            try:
                bookie = self.client.bookie(bookie_id)
                bookie.fence(self.meta.ledger_id).result(timeout=FUTURE_TIMEOUT_S)
                lac = max(lac, bookie.read_last_add_confirmed(self.meta.ledger_id))
                fenced += 1
            except BrokerError:
                continue
        if fenced < len(ensemble) - quorum.ack_quorum_size + 1:
            raise NotEnoughBookies(f"fenced {fenced} of {len(ensemble)} bookies of ledger {self.meta.ledger_id}")
        if lac < 0:
            return lac, 0
        return lac, self._read(lac).length_bytes

    def _read(self, entry_id: int) -> StoredEntry:
        """The entry from any bookie of its write set. ``NoSuchEntry`` only when so many of them
        answered that they lack it (``Qw - Qa + 1``) that it cannot have reached an ack quorum;
        when too few answered to tell, ``NotEnoughBookies`` (recovery must not stop early and
        cut off an acknowledged entry held by the unreachable ones)."""
        quorum = self.meta.quorum
        targets = write_set(ensemble_in(self.written_with, entry_id), entry_id, quorum.write_quorum_size)
        missing = 0
        for bookie_id in targets:
            try:
                return self.client.bookie(bookie_id).read_entry(self.meta.ledger_id, entry_id)
            except (NoSuchEntry, NoSuchLedger):
                missing += 1
            except (BookieUnavailable, CorruptEntry):
                continue
        if missing >= quorum.write_quorum_size - quorum.ack_quorum_size + 1:
            raise NoSuchEntry(f"entry {self.meta.ledger_id}:{entry_id} is on no bookie of {targets}")
        raise NotEnoughBookies(f"entry {self.meta.ledger_id}:{entry_id}: too few of {targets} answered")

    def _recover_forward(self, lac: int, length_bytes: int) -> tuple[int, int]:
        last = lac
        for entry_id in range(lac + 1, lac + 1 + RECOVERY_ENTRIES_MAX):
            try:
                stored = self._read(entry_id)
            except NoSuchEntry:
                break
            self._replicate(entry_id, entry_id - 1, stored.length_bytes, stored.payload)
            last, length_bytes = entry_id, stored.length_bytes
        return last, length_bytes

    def _replicate(self, entry_id: int, lac: int, length_bytes: int, payload: bytes) -> None:
        """Write a recovered entry to its write set; bookies that fail are replaced from this
        entry on (a new fragment, as a writer's ensemble change), so a dead bookie in the last
        ensemble does not make the ledger unrecoverable."""
        quorum = self.meta.quorum
        failed: set[str] = set()
        while True:
            targets = write_set(self.meta.ensemble_for(entry_id), entry_id, quorum.write_quorum_size)
            acks = 0
            for bookie_id in targets:
                try:
                    bookie = self.client.bookie(bookie_id)
                    bookie.add_entries(self.meta.ledger_id, [entry_id], lac, [(length_bytes, payload)],
                                       recovery=True).result(timeout=FUTURE_TIMEOUT_S)
                    acks += 1
                except BrokerError:
                    failed.add(bookie_id)
            if acks >= quorum.ack_quorum_size:
                return
            self._change_ensemble(entry_id, failed)

    def _change_ensemble(self, entry_id: int, failed: set[str]) -> None:
        ensemble = self.meta.ensemble_for(entry_id)
        client = self.client
        dead = [b for b in ensemble if b in failed]
        if not dead:
            raise NotEnoughBookies(f"recovered entry {self.meta.ledger_id}:{entry_id} reached too few bookies")
        try:
            spares = client.new_ensemble(len(dead), exclude=[*ensemble, *failed])
            replacement = dict(zip(dead, spares, strict=True))
            new_ensemble = [replacement.get(b, b) for b in ensemble]
        except NotEnoughBookies:
            new_ensemble = [b for b in ensemble if b not in failed]
            if len(new_ensemble) < self.meta.quorum.write_quorum_size:
                raise NotEnoughBookies(f"recovered entry {self.meta.ledger_id}:{entry_id}: "
                                       f"too few bookies answered, {sorted(failed)} failed") from None
        self.meta.fragments = [f for f in self.meta.fragments if f[0] < entry_id] + [(entry_id, new_ensemble)]
