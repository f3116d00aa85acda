"""``magnetar bookie``: one ``LedgerStorage`` served over the network and registered in ZooKeeper.

Role: the process the seeds call a bookie. It opens its storage (entry logs and index under
``--data-dir``, the journal under ``--journal-dir``, ideally another disk), serves it with the
bookie protocol (``storage/bookie_server.py``) and registers ``<address>:<port>`` as an
ephemeral node under ``/ledgers/available`` (``storage/registration.py``), so brokers pick it
for new ensembles while it lives and stop when it dies (its session ends with the process, or
within the session timeout after a ``kill -9``). It imports nothing above storage.

Invariant: the registration appears only once the server accepts connections and the storage
has recovered; SIGTERM or SIGINT unregisters first, then stops serving, then closes the storage
(flush and checkpoint).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field

from storage.bookie_server import BookieServer
from storage.config import StorageConfig
from storage.ledger_storage import LedgerStorage
from storage.limits import SESSION_TIMEOUT_S
from storage.registration import BookieRegistration, connect

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BookieProcessConfig:
    data_dir: str
    metadata_store: str
    port: int
    journal_dir: str | None = None
    host: str = "0.0.0.0"
    advertised_address: str | None = None
    """The host name brokers reach this bookie at (default: ``host``, or 127.0.0.1 for 0.0.0.0)."""
    storage: StorageConfig = field(default_factory=StorageConfig.production)
    session_timeout_s: float = SESSION_TIMEOUT_S

    def bookie_id(self, port: int) -> str:
        address = self.advertised_address or ("127.0.0.1" if self.host in ("0.0.0.0", "") else self.host)
        return f"{address}:{port}"


def run_bookie(config: BookieProcessConfig) -> int:
    """Serve until SIGTERM or SIGINT; the exit code."""
    storage = LedgerStorage.open(config.data_dir, config.storage, journal_dir=config.journal_dir)
    loop = asyncio.new_event_loop()
    server = BookieServer(storage, config.host, config.port)
    try:
        loop.run_until_complete(server.start())
        bookie_id = config.bookie_id(server.port)
        zk = connect(config.metadata_store, session_timeout_s=config.session_timeout_s)
        registration = BookieRegistration(zk, bookie_id, identifier=bookie_id)
        try:
            registration.register()
            log.info("bookie %s serving %s (journal %s)", bookie_id, config.data_dir, storage.journal_dir)
            stop = asyncio.Event()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            loop.run_until_complete(stop.wait())
        finally:
            registration.close()
            zk.stop()
            zk.close()
        loop.run_until_complete(server.close())
    finally:
        loop.close()
        storage.close()
    return 0
