"""A ``LedgerOffloader`` over a dict, for unit tests of the managed ledger's offload only.

It copies entries as a driver does (read through the source ``ReadHandle``, 0..LAC), keeps each
attempt's copy under (ledger id, uuid), and can be told to fail: ``fail_offload`` makes the
next offloads raise after copying part of the ledger (its objects stay, as a crashed upload's
would), ``fail_reads`` makes reads of copies raise ``OffloadReadError``, ``fail_deletes`` makes
deletions raise, and ``block`` holds an offload until the test releases it.
"""

from __future__ import annotations

import threading
from typing import Any

from broker.offload.offloader import OffloadError, OffloadReadError, ReadHandle


class MemoryCopy:
    """An offloaded copy's reader."""

    def __init__(self, store: MemoryOffloader, ledger_id: int, entries: list[bytes]) -> None:
        self._store = store
        self.ledger_id = ledger_id
        self._entries = entries

    @property
    def last_add_confirmed(self) -> int:
        return len(self._entries) - 1

    @property
    def length_bytes(self) -> int:
        return sum(len(e) for e in self._entries)

    def read(self, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        if self._store.fail_reads:
            raise OffloadReadError(f"ledger {self.ledger_id}: the memory store refuses reads")
        self._store.reads += last_entry_id - first_entry_id + 1
        return self._entries[first_entry_id:last_entry_id + 1]


class MemoryOffloader:
    def __init__(self) -> None:
        self.copies: dict[tuple[int, str], list[bytes]] = {}
        self.fail_offload = False
        self.fail_reads = False
        self.fail_deletes = False
        self.block: threading.Event | None = None
        self.started = threading.Event()
        self.reads = 0
        self.source_reads = 0
        self.deleted: list[tuple[int, str]] = []

    @property
    def driver_name(self) -> str:
        return "memory"

    def driver_metadata(self) -> dict[str, str]:
        return {"store": "memory"}

    def offload(self, source: ReadHandle, uuid: str, extra_metadata: dict[str, str]) -> None:
        self.started.set()
        if self.block is not None:
            self.block.wait(10)
        lac = source.last_add_confirmed
        key = (source.ledger_id, uuid)
        self.source_reads += 1
        self.copies[key] = source.read(0, lac // 2) if lac >= 0 else []
        if self.fail_offload:
            raise OffloadError(f"ledger {source.ledger_id}: the memory store is down")
        self.source_reads += 1
        self.copies[key] = source.read(0, lac) if lac >= 0 else []

    def open(self, ledger_id: int, uuid: str, driver_metadata: dict[str, str], driver_name: str = "") -> ReadHandle:
        entries = self.copies.get((ledger_id, uuid))
        if entries is None:
            raise OffloadError(f"ledger {ledger_id}: no copy {uuid} in the memory store")
        return MemoryCopy(self, ledger_id, entries)

    def delete(self, ledger_id: int, uuid: str, driver_metadata: dict[str, str], driver_name: str = "") -> None:
        if self.fail_deletes:
            raise OffloadError(f"ledger {ledger_id}: the memory store refuses deletions")
        self.copies.pop((ledger_id, uuid), None)
        self.deleted.append((ledger_id, uuid))

    def statistics(self) -> dict[str, Any]:
        return {"copies": len(self.copies)}
