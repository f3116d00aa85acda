"""The maintenance pass: what the broker does on a clock rather than on a request.

Role: ``BrokerService.maintenance``. Every ``maintenance_interval_ms`` (or on demand, ``run``)
it applies ack timeouts, releases due redeliveries and updates dispatch rates (subscriptions),
expires messages past their namespace's TTL on every cursor, trims the ledgers retention lets
go of (by default nothing goes: an event store keeps its events), starts the offloads the topics'
thresholds ask for (each runs in its own thread, ``broker/managed_ledger_offload.py``) and deletes
the bookies' copies of ledgers offloaded longer than the deletion lag ago, updates the publish rates, lets
the key index compact away the rows of trimmed entries, ages out the entry cache, and then
hands over to ``after_pass`` (the broker's rate history, ``broker/rate_history.py``, the
subscription census and the sweep of orphaned offloaded copies, ``broker/offload/orphans.py``).

Invariants: trimming never passes the key index's checkpoint (the managed ledger counts it as a
cursor), so every trimmed version has its row in a segment; a failed pass is logged and the next
one runs as usual; ``close`` returns once no pass runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from broker.entry_cache import EntryCache
from broker.errors import MagnetarError
from broker.key_index import KeyIndex
from broker.topic import PersistentTopic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaintenanceStats:
    passes: int
    """Passes completed since the broker started."""


class Maintenance:
    def __init__(self, interval_ms: int, tick_subscriptions: Callable[[], None],
                 topics: Callable[[], list[PersistentTopic]], key_index: KeyIndex, cache: EntryCache,
                 after_pass: Callable[[], None] = lambda: None) -> None:
        """``tick_subscriptions()``: the subscriptions' timed work; ``topics()``: the loaded ones;
        ``after_pass()``: what follows a pass (the broker's rate history)."""
        self._interval_ms = interval_ms
        self._tick_subscriptions = tick_subscriptions
        self._topics = topics
        self._key_index = key_index
        self._cache = cache
        self._after_pass = after_pass
        self._passes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="magnetar-maintenance", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """One pass, now, on the calling thread."""
        self._tick_subscriptions()
        for topic in self._topics():
            expired = topic.ml.expired_offset()
            if expired is not None:
                for name in topic.cursors.names():
                    cursor = topic.cursors.get(name)
                    if cursor is not None:
                        cursor.expire_before(expired)
            if topic.streams is not None:
                topic.streams.advance_for_trim()
            topic.ml.trim()
            self._offload(topic)
            topic.tick()
        self._key_index.cleanup()
        self._cache.evict_expired()
        self._passes += 1
        try:
            self._after_pass()
        except Exception:  # what follows a pass (sampling rates) never stops the passes
            log.exception("after a maintenance pass")

    @staticmethod
    def _offload(topic: PersistentTopic) -> None:
        """Start what the topic's offload thresholds ask, delete local copies past the lag; a
        failure is logged and retried on the next pass, never stopping the pass for other topics."""
        try:
            topic.ml.offload_by_threshold()
            topic.ml.delete_offloaded_locally()
        except MagnetarError:
            log.exception("offload maintenance of %s failed", topic.ml.display_name)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_ms / 1000.0):
            try:
                self.run()
            except MagnetarError:
                log.exception("maintenance pass failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def statistics(self) -> MaintenanceStats:
        return MaintenanceStats(self._passes)
