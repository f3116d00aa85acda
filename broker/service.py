"""BrokerService: the broker process's root object, owning the embedded bookie.

Role: ``magnetar standalone`` builds one ``BrokerService`` over a data directory; the API layer
talks to the broker only through it (``api`` never touches ``storage``). It opens the storage
(which recovers on open) and closes it on shutdown (flush, checkpoint, release files).

Invariant: between :meth:`start` and :meth:`close` the storage is open; after :meth:`close`
every acknowledged entry is in synced entry logs and the journal is checkpointed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from storage import LedgerStorage, StorageConfig


@dataclass(frozen=True)
class Health:
    status: str
    storage_read_only: bool
    ledgers: int
    journal_fsyncs: int


class BrokerService:
    def __init__(self, data_dir: str, storage_config: StorageConfig | None = None) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self._storage_config = storage_config or StorageConfig.production()
        self._storage: LedgerStorage | None = None

    def start(self) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        self._storage = LedgerStorage.open(os.path.join(self.data_dir, "bookie"), self._storage_config)

    @property
    def storage(self) -> LedgerStorage:
        if self._storage is None:
            raise RuntimeError("broker service is not started")
        return self._storage

    def health(self) -> Health:
        stats = self.storage.statistics()
        status = "degraded" if stats.read_only else "ok"
        return Health(status, stats.read_only, stats.ledgers, stats.journal.fsync_count)

    def close(self) -> None:
        if self._storage is not None:
            self._storage.close()
            self._storage = None
