"""A managed ledger's ledger list, as stored in the metadata store.

Role: ``ManagedLedger`` (``broker/managed_ledger.py``) keeps its ledgers (``LedgerInfo``, oldest
first, the current one last, each with its offload context), whether it is terminated, its
properties, the ledgers (and offloaded copies) dropped from the list and not yet deleted, and the
offset floor in one ``LedgerList``, stored at
``/managed-ledgers/{name}`` and written by compare-and-set on every change (``save``): a second
writer (another broker that recovered the topic) makes the save fail with ``BadVersion``.

Invariants: the stored list never names a deleted ledger (a ledger leaves the list, saved, before
it is deleted: ``pending_deletes`` holds it meanwhile, retried on open; its offloaded copy, if
any, likewise in ``pending_offload_deletes``; an offloaded ledger marked deleted locally is in
``pending_local_deletes`` until its bookie copy is gone; a stored list that marks a ledger so
always has the key, and one without it, saved before it was kept, has every marked ledger
pending). Offsets never restart
below ``offset_floor``, the confirmed end as of the last save, even when trimming removed every
ledger that held entries. A save that failed without an answer may have been applied: the next
save first takes the stored version if the stored list is exactly the one that save wrote, so a
lost answer is never mistaken for another writer's change. Changed only under the managed
ledger's lock.
"""

from __future__ import annotations

import json
from typing import Any

from broker.errors import BadVersion
from broker.metadata.store import MetadataStore
from broker.offload.offloader import OffloadContext
from broker.offset_index import LedgerInfo


class LedgerList:
    def __init__(self, store: MetadataStore, path: str) -> None:
        self._store = store
        self.path = path
        self.infos: list[LedgerInfo] = []
        self.terminated = False
        self.properties: dict[str, str] = {}
        self.pending_deletes: list[int] = []
        """Ledgers dropped from the list but maybe not yet deleted (retried on open)."""
        self.pending_offload_deletes: list[tuple[int, OffloadContext]] = []
        """Offloaded copies of ledgers dropped from the list, maybe not yet deleted (likewise)."""
        self.pending_local_deletes: list[int] = []
        """Offloaded ledgers marked ``bookkeeperDeleted`` whose bookie copy may not be deleted
        yet (retried on open; the ledgers stay in the list, read from their copies)."""
        self.offset_floor = 0
        """The confirmed end as of the last save: offsets never restart below it, even when
        trimming removed every ledger that held entries."""
        self._version = -1
        self._uncertain: list[dict[str, Any]] | None = None
        """The ledgers of the last list save that failed without an answer (it may have been
        applied); None when the last save was answered."""

    def load(self) -> None:
        """Take the stored list, if there is one (a new managed ledger has none yet)."""
        stat = self._store.get(self.path)
        if stat is None:
            return
        obj = json.loads(stat.value)
        self.infos = [LedgerInfo.from_json(i) for i in obj["ledgers"]]
        self.terminated = bool(obj.get("terminated", False))
        self.properties = dict(obj.get("properties", {}))
        self.pending_deletes = [int(i) for i in obj.get("pendingDeletes", [])]
        self.pending_offload_deletes = [(int(i["ledgerId"]), OffloadContext.from_json(i["offloadContext"]))
                                        for i in obj.get("pendingOffloadDeletes", [])]
        pending_local = obj.get("pendingLocalDeletes")
        # a list saved before pendingLocalDeletes was kept: each ledger marked deleted locally may
        # still be at the bookies (its deletion was to be repeated on load)
        self.pending_local_deletes = ([int(i) for i in pending_local] if pending_local is not None
                                      else [i.ledger_id for i in self.infos if i.local_deleted])
        self.offset_floor = int(obj.get("offsetFloor", 0))
        self._version = stat.version

    def save(self) -> None:
        """Compare-and-set the ledger list. A save that failed without an answer (the metadata
        store was cut off) may have been applied: the next save first takes the stored version
        if the stored list is exactly the one that save wrote, so a lost answer is not mistaken
        for another writer's change (a ledger that list named and this writer has dropped since,
        empty, is then deleted with the next pending deletions)."""
        if self._uncertain is not None:
            self._adopt_own_list(self._uncertain)
        ledgers = [i.to_json() for i in self.infos]
        try:
            self._put_list(ledgers)
        except BadVersion:
            raise
        except BaseException:
            self._uncertain = ledgers
            raise
        self._uncertain = None

    def _adopt_own_list(self, written: list[dict[str, Any]]) -> None:
        stat = self._store.get(self.path)
        if stat is None or json.loads(stat.value)["ledgers"] != written:
            return  # not applied (the version is still right), or another writer's: the put decides
        self._version = stat.version
        ours = {i.ledger_id for i in self.infos}
        self.pending_deletes.extend(ledger_id for ledger_id in (int(i["ledgerId"]) for i in written)
                                    if ledger_id not in ours and ledger_id not in self.pending_deletes)

    def _put_list(self, ledgers: list[dict[str, Any]]) -> None:
        confirmed = [i for i in self.infos if i.entries > 0]
        if confirmed:
            self.offset_floor = max(self.offset_floor, confirmed[-1].next_offset)
        obj: dict[str, Any] = {"ledgers": ledgers, "terminated": self.terminated, "properties": self.properties,
                               "pendingDeletes": self.pending_deletes, "offsetFloor": self.offset_floor}
        if self.pending_offload_deletes:
            obj["pendingOffloadDeletes"] = [{"ledgerId": ledger_id, "offloadContext": context.to_json()}
                                            for ledger_id, context in self.pending_offload_deletes]
        if self.pending_local_deletes or any(i.local_deleted for i in self.infos):
            obj["pendingLocalDeletes"] = self.pending_local_deletes  # present, even empty: known gone
        body = json.dumps(obj, sort_keys=True).encode()
        self._version = self._store.put(self.path, body, self._version).version
