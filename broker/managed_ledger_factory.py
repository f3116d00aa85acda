"""Opening managed ledgers by name: one per topic partition, loaded once, shared by its users.

Role: ``BrokerService`` (``broker/service.py``) builds one ``ManagedLedgerFactory`` over the
metadata store, the ledger manager (``broker/bookkeeper/``) and the broker's entry cache, with
the publish buffer every append counts in (``broker/byte_budget.py``) and the offloader, if
one is configured (``broker/offload/``); the topic registry opens
each topic partition's ``ManagedLedger`` (``broker/managed_ledger.py``) through it, as Pulsar's
``ManagedLedgerFactoryImpl``.

Invariants: only a fully loaded managed ledger is kept: a load that loses its compare-and-set to
another writer ``LOAD_ATTEMPTS_MAX`` times in a row fails with ``ServiceUnitNotReady`` (retriable)
and leaves nothing loaded, so the next open loads afresh. ``appends_fenced`` counts every
append refused because another broker recovered the topic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from broker.bookkeeper.ledger_manager import LedgerManager
from broker.byte_budget import ByteBudget
from broker.entry_cache import EntryCache
from broker.errors import BadVersion, LedgerFenced, MagnetarError, ServiceUnitNotReady
from broker.limits import LOAD_ATTEMPTS_MAX
from broker.managed_ledger import ML_ROOT, ManagedLedger
from broker.managed_ledger_config import ManagedLedgerConfig
from broker.metadata.store import MetadataStore
from broker.offload.offloader import LedgerOffloader
from broker.topic_name import display_name


class ManagedLedgerFactory:
    """Opens managed ledgers by name; owns the shared entry cache."""

    def __init__(self, store: MetadataStore, ledgers: LedgerManager, cache: EntryCache,
                 clock: Callable[[], float] = time.time, *, publish_buffer: ByteBudget | None = None,
                 offloader: LedgerOffloader | None = None) -> None:
        self.store = store
        self.ledgers = ledgers
        self.cache = cache
        self.clock = clock
        self.publish_buffer = publish_buffer
        """Counts the bytes of every append until it is stored (``maxMessagePublishBufferSizeInMB``)."""
        self.offloader = offloader
        """The object store closed ledgers are offloaded to (``managedLedgerOffloadDriver``; None: off)."""
        self._open: dict[str, ManagedLedger] = {}
        self._lock = threading.Lock()
        self._appends_fenced = 0
        self._counters_lock = threading.Lock()

    @property
    def appends_fenced(self) -> int:
        """Appends (add calls) of this broker's managed ledgers that failed because another
        broker recovered the topic (fenced its ledger, or rewrote its ledger list): each one was
        refused, never acknowledged."""
        return self._appends_fenced

    def count_fenced_append(self) -> None:
        with self._counters_lock:
            self._appends_fenced += 1

    def open(self, name: str, config: ManagedLedgerConfig | None = None) -> ManagedLedger:
        """The managed ledger ``name``, loaded on first use. Only a fully loaded one is kept:
        a load that fails leaves nothing behind, so the next call loads afresh."""
        with self._lock:
            ml = self._open.get(name)
            if ml is None:
                ml = self._load(name, config or ManagedLedgerConfig())
                self._open[name] = ml
            return ml

    def _load(self, name: str, config: ManagedLedgerConfig) -> ManagedLedger:
        """Load ``name`` anew up to ``LOAD_ATTEMPTS_MAX`` times while another writer changes its
        ledger list meanwhile (``BadVersion``, ``LedgerFenced``); then ``ServiceUnitNotReady``
        (retriable: the caller looks the topic up and tries again). Other errors propagate."""
        failure: MagnetarError | None = None
        for _ in range(LOAD_ATTEMPTS_MAX):
            ml = ManagedLedger(self, name, config)
            try:
                ml._load()
                return ml
            except (BadVersion, LedgerFenced) as exc:  # another writer changed the list meanwhile: read it again
                ml.abandon()
                failure = exc
        raise ServiceUnitNotReady(
            f"topic {display_name(name)} could not be loaded: its ledger list changed during each of "
            f"{LOAD_ATTEMPTS_MAX} attempts (another broker is loading it); retry") from failure

    def exists(self, name: str) -> bool:
        return self.store.exists(f"{ML_ROOT}/{name}")

    def close_all(self) -> None:
        with self._lock:
            for ml in self._open.values():
                ml.close()
            self._open.clear()

    def forget(self, name: str) -> None:
        with self._lock:
            self._open.pop(name, None)
