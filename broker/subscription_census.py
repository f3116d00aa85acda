"""How many subscriptions every topic has, loaded or not: the console overview's count.

Role: ``BrokerService`` asks ``SubscriptionCensus.maybe_count`` after each maintenance pass;
at most every ``SUBSCRIPTION_CENSUS_INTERVAL_S`` it walks the metadata store's managed ledgers
(``/managed-ledgers/{tenant}/{namespace}/persistent/{topic}/cursors``) and keeps each topic's
count of durable subscriptions. ``total(loaded)`` answers the count now: the census's counts of
the topics not loaded here, plus the live counts of the loaded ones (``loaded``, topic name →
its subscriptions), so a subscription made or deleted on a loaded topic shows at once, and one
of a topic nobody has loaded (or another broker of a cluster has) within one interval. A topic
unloaded or deleted here makes the next maintenance pass walk again (``recount``), so its
subscriptions are counted from the store within a pass, not an interval.

Invariants: a walk runs in the maintenance thread, never on the event loop, and reads at most
``SUBSCRIPTION_CENSUS_TOPICS_MAX`` topics (beyond, the census says it is not ``complete``); a
finished walk replaces the previous one whole; a topic deleted during a walk is skipped, not an
error; before the first walk ``total`` is None (nothing is claimed that was not counted).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.limits import SUBSCRIPTION_CENSUS_INTERVAL_S, SUBSCRIPTION_CENSUS_TOPICS_MAX
from broker.managed_ledger import ML_ROOT
from broker.metadata.store import MetadataStore


@dataclass(frozen=True)
class SubscriptionCount:
    total: int | None
    """Subscriptions of every topic; None before the first walk."""
    topics_counted: int
    complete: bool
    """False when the last walk stopped at ``SUBSCRIPTION_CENSUS_TOPICS_MAX`` topics."""
    counted_at_ms: int | None
    """When the last walk ended (ms since the epoch)."""


class SubscriptionCensus:
    def __init__(self, store: MetadataStore, clock: Callable[[], float], *,
                 interval_ms: int = int(SUBSCRIPTION_CENSUS_INTERVAL_S * 1000),
                 topics_max: int = SUBSCRIPTION_CENSUS_TOPICS_MAX) -> None:
        self._store = store
        self._clock = clock
        self._interval_ms = interval_ms
        self._topics_max = topics_max
        self._lock = threading.Lock()
        self._counts: dict[str, int] | None = None
        self._complete = True
        self._counted_at_ms: int | None = None
        self._due = threading.Event()

    def recount(self) -> None:
        """Walk again at the next ``maybe_count`` (a topic was unloaded or deleted here)."""
        self._due.set()

    def maybe_count(self) -> None:
        """Walk the metadata store when the last walk is older than the interval, or one is due."""
        now_ms = int(self._clock() * 1000)
        recent = self._counted_at_ms is not None and now_ms - self._counted_at_ms < self._interval_ms
        if recent and not self._due.is_set():
            return
        self._due.clear()
        counts, complete = self._walk()
        with self._lock:
            self._counts, self._complete = counts, complete
            self._counted_at_ms = int(self._clock() * 1000)

    def _walk(self) -> tuple[dict[str, int], bool]:
        counts: dict[str, int] = {}
        for topic_path in self._topic_paths():
            if len(counts) >= self._topics_max:
                return counts, False
            counts[topic_path.removeprefix(ML_ROOT + "/")] = len(self._store.children(f"{topic_path}/cursors"))
        return counts, True

    def _topic_paths(self) -> list[str]:
        """Every persistent topic's managed ledger path (read level by level; the last level
        only as far as the bound needs)."""
        paths: list[str] = []
        for tenant in self._store.children(ML_ROOT):
            for namespace in self._store.children(f"{ML_ROOT}/{tenant}"):
                domain = f"{ML_ROOT}/{tenant}/{namespace}/persistent"
                paths.extend(f"{domain}/{topic}" for topic in self._store.children(domain))
                if len(paths) > self._topics_max:
                    return paths
        return paths

    def total(self, loaded: Mapping[str, int]) -> SubscriptionCount:
        """``loaded``: each loaded topic's managed ledger name (``tenant/ns/persistent/topic``)
        → its subscriptions now."""
        with self._lock:
            counts, complete, at_ms = self._counts, self._complete, self._counted_at_ms
        if counts is None:
            return SubscriptionCount(None, 0, False, None)
        unloaded = sum(n for name, n in counts.items() if name not in loaded)
        return SubscriptionCount(unloaded + sum(loaded.values()), len(counts), complete, at_ms)
