"""A ledger's metadata at ``/ledgers/{id}`` in the metadata store (BookKeeper's ``LedgerMetadata``).

Role: a ledger is a single-writer log of entries with dense ids from 0. Its metadata holds the
quorum sizes, the state (OPEN → IN_RECOVERY → CLOSED), the last entry id and length once
closed, and its *fragments*: the ensemble of bookies used from each first entry id. The writer
(``ledger_handle.py``), recovery (``ledger_recovery.py``), the manager (``ledger_manager.py``)
and re-replication (``autorecovery.py``) read and write it here, always by compare-and-set.

Invariants: fragments are in first-entry order and the first starts at entry 0; the state only
moves forward; a CLOSED ledger's last entry id and length never change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from broker.bookkeeper.bookie import QuorumConfig
from broker.errors import NoSuchLedger
from broker.metadata.store import MetadataStore

LEDGERS_PATH = "/ledgers"


class LedgerState(StrEnum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclass
class LedgerMetadata:
    ledger_id: int
    quorum: QuorumConfig
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length_bytes: int = 0
    fragments: list[tuple[int, list[str]]] = field(default_factory=list)
    created_ms: int = 0
    custom: dict[str, str] = field(default_factory=dict)

    def ensemble_for(self, entry_id: int) -> list[str]:
        return ensemble_in(self.fragments, entry_id)

    def to_json(self) -> bytes:
        return json.dumps({
            "ledgerId": self.ledger_id,
            "ensembleSize": self.quorum.ensemble_size,
            "writeQuorumSize": self.quorum.write_quorum_size,
            "ackQuorumSize": self.quorum.ack_quorum_size,
            "state": self.state.value,
            "lastEntryId": self.last_entry_id,
            "length": self.length_bytes,
            "fragments": [[first, list(ensemble)] for first, ensemble in self.fragments],
            "ctime": self.created_ms,
            "customMetadata": self.custom,
        }, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LedgerMetadata:
        obj: dict[str, Any] = json.loads(raw)
        return cls(
            ledger_id=int(obj["ledgerId"]),
            quorum=QuorumConfig(obj["ensembleSize"], obj["writeQuorumSize"], obj["ackQuorumSize"]),
            state=LedgerState(obj["state"]),
            last_entry_id=int(obj["lastEntryId"]),
            length_bytes=int(obj["length"]),
            fragments=[(int(first), [str(b) for b in ensemble]) for first, ensemble in obj["fragments"]],
            created_ms=int(obj["ctime"]),
            custom={str(k): str(v) for k, v in obj.get("customMetadata", {}).items()},
        )


def ledger_path(ledger_id: int) -> str:
    return f"{LEDGERS_PATH}/{ledger_id}"


def read_ledger_metadata(store: MetadataStore, ledger_id: int) -> tuple[LedgerMetadata, int]:
    """The ledger's metadata and its version in ``store``; ``NoSuchLedger`` when it has none."""
    stat = store.get(ledger_path(ledger_id))
    if stat is None:
        raise NoSuchLedger(f"ledger {ledger_id} does not exist")
    return LedgerMetadata.from_json(stat.value), stat.version


def ensemble_in(fragments: list[tuple[int, list[str]]], entry_id: int) -> list[str]:
    """The ensemble of the fragment that holds ``entry_id``."""
    chosen = fragments[0][1]
    for first_entry_id, ensemble in fragments:
        if first_entry_id <= entry_id:
            chosen = ensemble
    return chosen

