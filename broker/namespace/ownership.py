"""Topic ownership between brokers: which broker serves a bundle, lookups, unload and split.

Role: any cluster broker can serve any topic, one broker at a time: the one that owns the
topic's namespace bundle (``bundles.py``). ``OwnershipManager`` is the cluster half of Pulsar's
``NamespaceService``: it answers lookups, unloads and splits bundles, and follows the ZooKeeper
session. It owns bundles through ephemeral nodes held in its ``OwnershipCache``
(``ownership_cache.py``) and asks the ``LoadManager`` (``load_manager.py``) where an unowned
bundle should go.

``lookup(topic)`` is the one answer every transport gives (HTTP 307, the binary protocol's
LOOKUP): the owner's address. When nobody owns the bundle, it is assigned to the least-loaded
live broker, which takes it when the client reaches it. Unloading a bundle closes its topics,
assigns it to another broker and deletes the ownership node; splitting one closes its topics,
writes the new boundaries and deletes the node.

Failover: when an owner dies, its session expires and ZooKeeper deletes its nodes; the next
lookup assigns the bundle to a live broker, whose managed ledgers recover each topic's last
ledger by fencing it (``broker/managed_ledger.py``), so the old owner, were it still running,
can no longer append. A broker whose connection to ZooKeeper is suspended stops serving at
once (kazoo reports it after about two thirds of the session timeout, before the server
expires the session): its topics are dropped without any write; if the session survives, it
serves again, reopening topics (and fencing its own last ledgers) on demand; if the session
expired, it owns nothing and registers its load report anew.

Invariants: a broker serves a topic only while it holds the ownership node of the topic's
bundle in its current session and that session is connected; a split gives the old bundle up
before writing the new boundaries, so owned bundles always carry the current ones; every wait
and retry is bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.protocol.states import KazooState

from broker.errors import BadVersion, NotFound, ServiceUnitNotReady, TopicNotOwned
from broker.limits import LOOKUP_ATTEMPTS_MAX, POLICY_CAS_ATTEMPTS_MAX
from broker.metadata.store import MetadataStore
from broker.namespace.bundles import BUNDLES_DEFAULT, POLICY_KEY, Bundle, NamespaceBundles
from broker.namespace.load_manager import ASSIGNMENTS_ROOT, BROKERS_PATH, LoadManager, LoadReport, LocalLoad
from broker.namespace.lookup import BrokerAddress, LookupResult
from broker.namespace.namespaces import POLICIES, namespace_missing
from broker.namespace.ownership_cache import OWNERSHIP_ROOT, OwnershipCache
from broker.topic_name import TopicName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OwnershipConfig:
    address: BrokerAddress
    default_bundles: int = BUNDLES_DEFAULT
    """``defaultNumberOfNamespaceBundles``: the bundles of a namespace without a bundles policy."""
    load_report_interval_ms: int = 2000
    assignment_ttl_ms: int = 30_000
    """An assignment the assigned broker has not taken up within this time is made again."""


@dataclass(frozen=True)
class OwnershipStats:
    serving: bool
    owned_bundles: int
    lookups: int
    redirects: int
    acquired: int
    released: int
    assignments: int
    sessions_suspended: int
    sessions_lost: int


@dataclass
class _Counters:
    lookups: int = 0
    redirects: int = 0
    released: int = 0
    suspended: int = 0
    lost: int = 0


BundleListener = Callable[[Bundle, bool], object]
"""``listener(bundle, graceful)``: stop serving the bundle's topics (graceful: close them,
persisting what they hold; otherwise drop them without any write)."""


class OwnershipManager:
    """The cluster half of Pulsar's ``NamespaceService``: lookups, unload and split of bundles,
    and the ZooKeeper session they depend on."""

    def __init__(self, client: Any, store: MetadataStore, config: OwnershipConfig,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._store = store
        self.config = config
        self._clock = clock
        self._serving = False
        self._cache = OwnershipCache(client, config.address, self.bundles)
        self._loads = LoadManager(client, config.address, report_interval_ms=config.load_report_interval_ms,
                                  assignment_ttl_ms=config.assignment_ttl_ms, owned_count=self._cache.count,
                                  serving=lambda: self._serving, clock=clock)
        self._closed = False
        self._counters = _Counters()
        self._bundle_listeners: list[BundleListener] = []

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._client.ensure_path(BROKERS_PATH)
        self._client.ensure_path(OWNERSHIP_ROOT)
        self._client.ensure_path(ASSIGNMENTS_ROOT)
        self._client.add_listener(self._on_state)
        self._loads.publish_report(create=True)
        self._serving = True
        self._loads.start_reporting()

    def on_bundle_lost(self, listener: BundleListener) -> None:
        self._bundle_listeners.append(listener)

    def use_load_source(self, source: Callable[[], LocalLoad]) -> None:
        self._loads.use_load_source(source)

    def stop(self) -> None:
        """No more lookups or load reports; bundles stay owned until :meth:`close`."""
        self._closed = True
        self._serving = False
        self._loads.stop_reporting()

    def close(self) -> None:
        """Give every bundle back (the caller has closed its topics) and leave the broker list."""
        self.stop()
        self._client.remove_listener(self._on_state)
        owned = self._cache.forget_all()
        self._serving = False
        if not self._client.connected:
            return  # the nodes are ephemeral: they go with the session
        for path in owned.values():
            self._cache.delete(path)
        self._loads.withdraw_report()

    @property
    def serving(self) -> bool:
        return self._serving

    @property
    def address(self) -> BrokerAddress:
        return self.config.address

    # --- lookups -----------------------------------------------------------------------
    def lookup(self, topic: TopicName) -> LookupResult:
        """Where ``topic`` is served; takes its bundle when it is assigned here. Raises
        ``ServiceUnitNotReady`` while this broker is cut off from ZooKeeper, or when the bundle
        kept changing hands for ``LOOKUP_ATTEMPTS_MAX`` rounds."""
        self._counters.lookups += 1
        for _ in range(LOOKUP_ATTEMPTS_MAX):
            if not self._serving:
                raise ServiceUnitNotReady(f"broker {self.address.broker_id} is not connected to ZooKeeper")
            bundle = self.bundle_of(topic)
            if self._cache.holds(bundle):
                return LookupResult(topic.full_name, bundle.key, self.address, True)
            owner = self._cache.read_owner(bundle)
            if owner is not None:
                if owner.broker_id == self.address.broker_id:
                    if self._cache.adopt(bundle):
                        return LookupResult(topic.full_name, bundle.key, self.address, True)
                    continue
                self._counters.redirects += 1
                return LookupResult(topic.full_name, bundle.key, owner, False)
            target = self._loads.assigned_broker(bundle)
            if target.broker_id != self.address.broker_id:
                self._counters.redirects += 1
                return LookupResult(topic.full_name, bundle.key, target, False, assigned=True)
            if self._acquire(bundle):
                return LookupResult(topic.full_name, bundle.key, self.address, True)
        raise ServiceUnitNotReady(f"the bundle of {topic.full_name} is changing owners; retry")

    def check_served_here(self, topic: TopicName) -> None:
        """Return when this broker serves ``topic``; else ``TopicNotOwned`` naming the owner."""
        found = self.lookup(topic)
        if not found.local:
            raise TopicNotOwned(f"{topic.full_name} is served by {found.owner.broker_id}",
                                owner_url=found.owner.web_service_url, owner_broker=found.owner.broker_id,
                                pulsar_url=found.owner.pulsar_service_url)

    def owns(self, topic: TopicName) -> bool:
        """Whether this broker serves ``topic`` now, from memory: owned bundles always carry the
        current boundaries (a split gives the old bundle up before writing new ones)."""
        if not self._serving:
            return False
        return self._cache.owns(topic)

    def owner_of(self, topic: TopicName) -> BrokerAddress | None:
        """The current owner of ``topic``'s bundle, without assigning it (None: unowned)."""
        bundle = self.bundle_of(topic)
        if self._cache.holds(bundle):
            return self.address
        return self._cache.read_owner(bundle)

    # --- bundles -----------------------------------------------------------------------
    def bundles(self, namespace: str) -> NamespaceBundles:
        """The namespace's bundles; a namespace without a bundles policy gets the default number
        written into its policies first (so every broker agrees on the ranges)."""
        for _ in range(POLICY_CAS_ATTEMPTS_MAX):
            found = self._store.get_json(f"{POLICIES}/{namespace}")
            if found is None:
                raise namespace_missing(namespace)
            policies, version = found
            if policies.get(POLICY_KEY):
                return NamespaceBundles.from_policy(namespace, policies[POLICY_KEY])
            made = NamespaceBundles.equal(namespace, self.config.default_bundles)
            try:
                self._store.put_json(f"{POLICIES}/{namespace}", {**policies, POLICY_KEY: made.to_policy()}, version)
                return made
            except BadVersion:
                continue
        raise ServiceUnitNotReady(f"the policies of {namespace} keep changing; retry")

    def bundle_of(self, topic: TopicName) -> Bundle:
        return self.bundles(topic.namespace_name).bundle_of(topic.full_name)

    def owned_bundles(self) -> list[Bundle]:
        return self._cache.owned_bundles()

    def bundle_owners(self, namespace: str) -> dict[str, BrokerAddress | None]:
        """Each bundle of ``namespace`` and its owner (None: unowned)."""
        return {b.range_name: self._cache.read_owner(b) for b in self.bundles(namespace).bundles}

    def unload(self, namespace: str, range_name: str, destination: str | None = None) -> BrokerAddress | None:
        """Stop serving one owned bundle and hand it to ``destination`` (a live broker id) or to
        the least-loaded other live broker (this one when it is alone); returns where it goes.
        ``TopicNotOwned`` when another broker owns it (the call belongs there), ``NotFound``
        when nobody does."""
        bundle = self.bundles(namespace).find(range_name)
        self._require_owned(bundle)
        live = {r.address.broker_id: r for r in self._loads.load_reports()}
        if destination is not None and destination not in live:
            raise NotFound(f"broker {destination} is not live")
        target = live[destination].address if destination is not None else \
            self._loads.least_loaded(list(live.values()), exclude=self.address.broker_id)
        if target is not None:
            self._loads.write_assignment(bundle, target)
        self._release(bundle, graceful=True)
        return target

    def split(self, namespace: str, range_name: str) -> list[Bundle]:
        """Divide one owned bundle in two (its topics are closed; the halves are assigned on
        their next lookups)."""
        bundles = self.bundles(namespace)
        bundle = bundles.find(range_name)
        self._require_owned(bundle)
        path = self._cache.begin_release_held(bundle)
        try:
            self._cache.disable(bundle)
            self._notify_lost(bundle, graceful=True)
            divided = self._write_split(namespace, bundle)
            self._cache.delete(path)
        finally:
            self._cache.end_release(bundle)
        self._counters.released += 1
        self._loads.publish_report()
        return [b for b in divided.bundles if bundle.lower <= b.lower and b.upper <= bundle.upper]

    def _write_split(self, namespace: str, bundle: Bundle) -> NamespaceBundles:
        for _ in range(POLICY_CAS_ATTEMPTS_MAX):
            policies, version = self._store.get_json(f"{POLICIES}/{namespace}") or ({}, -1)
            divided = NamespaceBundles.from_policy(namespace, policies[POLICY_KEY]).split(bundle)
            try:
                self._store.put_json(f"{POLICIES}/{namespace}", {**policies, POLICY_KEY: divided.to_policy()},
                                     version)
                return divided
            except BadVersion:
                continue
        raise ServiceUnitNotReady(f"the policies of {namespace} keep changing; retry")

    def _require_owned(self, bundle: Bundle) -> None:
        if self._cache.holds(bundle) and self._serving:
            return
        owner = self._cache.read_owner(bundle)
        if owner is None:
            raise NotFound(f"bundle {bundle.key} is not owned by any broker")
        if owner.broker_id != self.address.broker_id:
            raise TopicNotOwned(f"bundle {bundle.key} is owned by {owner.broker_id}", owner_url=owner.web_service_url,
                                owner_broker=owner.broker_id, pulsar_url=owner.pulsar_service_url)
        raise ServiceUnitNotReady(f"bundle {bundle.key} is being taken over")

    # --- brokers and load ------------------------------------------------------------------
    def load_reports(self) -> list[LoadReport]:
        """The live brokers' reports, sorted by broker id (one ZooKeeper read each)."""
        return self._loads.load_reports()

    # --- ownership nodes ------------------------------------------------------------------
    def _acquire(self, bundle: Bundle) -> bool:
        """Create the ownership node; True once this broker owns ``bundle`` (False: someone
        else was faster, or the boundaries changed; the caller looks again)."""
        if not self._cache.try_acquire(bundle):
            return False
        self._loads.forget_assignment(bundle)
        log.info("broker %s now owns bundle %s", self.address.broker_id, bundle.key)
        self._loads.publish_report()
        return True

    def _release(self, bundle: Bundle, *, graceful: bool) -> None:
        path = self._cache.begin_release(bundle)
        try:
            if path is not None:
                self._cache.disable(bundle)
            self._notify_lost(bundle, graceful=graceful)
        finally:
            self._cache.end_release(bundle)
        if path is not None:
            self._cache.delete(path)
            self._counters.released += 1
        self._loads.publish_report()

    def _notify_lost(self, bundle: Bundle, *, graceful: bool) -> None:
        for listener in list(self._bundle_listeners):
            try:
                listener(bundle, graceful)
            except Exception:
                log.exception("a bundle listener failed for %s", bundle.key)

    # --- session ----------------------------------------------------------------------------
    def _on_state(self, state: str) -> None:
        """kazoo's connection listener: it runs on kazoo's thread and must not block."""
        if self._closed:
            return
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            was_serving, self._serving = self._serving, False
            if state == KazooState.SUSPENDED:
                self._counters.suspended += 1
            else:
                self._counters.lost += 1
            bundles = self._cache.snapshot(forget=state == KazooState.LOST)
            if was_serving:  # after a suspension, a loss finds the topics dropped already
                log.warning("ZooKeeper session %s: stop serving %d bundles", state.lower(), len(bundles))
                threading.Thread(target=self._drop_all, args=(bundles,), name="magnetar-ownership-drop",
                                 daemon=True).start()
        elif state == KazooState.CONNECTED:
            self._client.handler.spawn(self._reconnected)

    def _drop_all(self, bundles: list[Bundle]) -> None:
        for bundle in bundles:
            self._notify_lost(bundle, graceful=False)

    def _reconnected(self) -> None:
        """Back in touch with ZooKeeper: keep the bundles whose nodes this session still holds
        (a session that survived), forget the others, publish the load report, serve again."""
        try:
            self._cache.keep_session_nodes()
            self._loads.publish_report(create=True)
            self._serving = True
            log.info("ZooKeeper session back: serving %d bundles", self._cache.count())
        except Exception:
            log.exception("could not resume serving after reconnecting to ZooKeeper")

    def statistics(self) -> OwnershipStats:
        c = self._counters
        owned = self._cache.count()
        return OwnershipStats(self._serving, owned, c.lookups, c.redirects, self._cache.acquired, c.released,
                              self._loads.assignments, c.suspended, c.lost)
