"""The seam between a managed ledger and an object store, as Pulsar's ``LedgerOffloader``.

Role: a ``LedgerOffloader`` copies one closed ledger (read through a ``ReadHandle``, the same
face a ``LedgerHandle`` shows readers) to its store under an id chosen per attempt (``uuid``),
opens an offloaded copy for reading as a ``ReadHandle``, and deletes a copy. ``OffloadContext``
is what the managed ledger records in the ledger's ``LedgerInfo`` (saved in its ledger list in
the metadata store, so every broker of a cluster sees it): which attempt, which driver and
where, whether the copy is complete, and whether the local copy (the bookies') is deleted.

Invariants: ``offload`` returns only once every object of the attempt is durable in the store;
an attempt that did not return leaves objects no reader trusts (the managed ledger records the
attempt's ``uuid`` with ``complete=False`` before it starts, and deletes an incomplete
attempt's objects before it tries again). A ``ReadHandle`` of an offloaded copy returns exactly
the bytes the ledger held, or raises ``OffloadReadError`` naming the ledger; never other data.

The one implementation is ``blob_offloader.BlobStoreOffloader`` (every driver, built by
``factory.create_offloader``); the bytes it stores are specified in ``format.py``. The error
classes are declared in ``broker/errors.py`` (so ``ERRORS_BY_CODE`` holds them) and re-exported
here under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.errors import OffloadConfigError, OffloadError, OffloadReadError

__all__ = ["LedgerOffloader", "OffloadConfigError", "OffloadContext", "OffloadError", "OffloadReadError",
           "ReadHandle"]


class ReadHandle(Protocol):
    """What a reader of a closed ledger needs: a ``LedgerHandle`` opened for reading is one."""

    ledger_id: int

    @property
    def last_add_confirmed(self) -> int: ...

    @property
    def length_bytes(self) -> int: ...

    def read(self, first_entry_id: int, last_entry_id: int) -> list[bytes]: ...


@dataclass(frozen=True)
class OffloadContext:
    """Pulsar's ``OffloadContext`` of a ``LedgerInfo``: one offload attempt of one ledger."""

    uuid: str
    driver_name: str
    driver_metadata: dict[str, str] = field(default_factory=dict)
    complete: bool = False
    bookkeeper_deleted: bool = False
    timestamp_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "driverName": self.driver_name, "driverMetadata": dict(self.driver_metadata),
                "complete": self.complete, "bookkeeperDeleted": self.bookkeeper_deleted,
                "timestamp": self.timestamp_ms}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> OffloadContext:
        return cls(uuid=str(obj["uuid"]), driver_name=str(obj["driverName"]),
                   driver_metadata={str(k): str(v) for k, v in obj.get("driverMetadata", {}).items()},
                   complete=bool(obj.get("complete", False)),
                   bookkeeper_deleted=bool(obj.get("bookkeeperDeleted", False)),
                   timestamp_ms=int(obj.get("timestamp", 0)))


class LedgerOffloader(Protocol):
    """One configured store (``managedLedgerOffloadDriver`` and its keys)."""

    @property
    def driver_name(self) -> str: ...

    def driver_metadata(self) -> dict[str, str]:
        """Where this offloader writes (bucket, region, endpoint or filesystem URI; never a
        secret): recorded in each ``OffloadContext`` so a reader opens the same place."""
        ...

    def offload(self, source: ReadHandle, uuid: str, extra_metadata: dict[str, str]) -> None:
        """Copy every entry of the closed ledger ``source`` (0..LAC) to the store under ``uuid``;
        blocking, returns when all objects are durable. Raises ``OffloadError``."""
        ...

    def open(self, ledger_id: int, uuid: str, driver_metadata: dict[str, str], driver_name: str = "") -> ReadHandle:
        """A reader of the copy of ``ledger_id`` written under ``uuid`` by the driver
        ``driver_name`` (``""``: this offloader's) to the place ``driver_metadata`` names.
        Raises ``OffloadError`` (missing or unreadable index object)."""
        ...

    def delete(self, ledger_id: int, uuid: str, driver_metadata: dict[str, str], driver_name: str = "") -> None:
        """Delete the copy (every object of the attempt; missing objects are not an error)."""
        ...

    def statistics(self) -> dict[str, Any]: ...
