"""Topic ownership between brokers: bundles owned through ephemeral znodes, lookups, load reports.

Role: any cluster broker can serve any topic, one broker at a time. A broker owns a namespace
bundle (``broker/namespace/bundles.py``) while its ZooKeeper session holds the ephemeral node
``/namespace/{tenant}/{ns}/0xLLLLLLLL_0xUUUUUUUU`` (Pulsar's path and ``NamespaceEphemeralData``
keys: ``httpUrl``, ``nativeUrl``, ``disabled``). Every broker publishes a load report as the
ephemeral ``/loadbalance/brokers/{host:port}`` (bundles and topics owned, message rates, CPU),
which is also the list of live brokers.

``lookup(topic)`` is the one answer every transport gives (HTTP 307, the binary protocol's
LOOKUP): the owner's address. When nobody owns the bundle, the bundle is *assigned* to the
least-loaded live broker (fewest bundles, then lowest message rate in), and the assignment is
written to ``/loadbalance/assignments/{tenant}/{ns}/{range}`` so that every broker sends the
client to the same place; the assigned broker takes the bundle when the client reaches it (an
assignment to a broker no longer live, or older than ``assignment_ttl_ms``, is made again).
Unloading a bundle closes its topics, assigns it to another broker and deletes the ownership
node; splitting one closes its topics, writes the new boundaries and deletes the node.

Failover: when an owner dies, its session expires and ZooKeeper deletes its nodes; the next
lookup assigns the bundle to a live broker, whose managed ledgers recover each topic's last
ledger by fencing it (``broker/managed_ledger.py``), so the old owner, were it still running,
can no longer append. A broker whose connection to ZooKeeper is suspended stops serving at
once (kazoo reports it after about two thirds of the session timeout, before the server
expires the session): its topics are dropped without any write; if the session survives, it
serves again, reopening topics (and fencing its own last ledgers) on demand; if the session
expired, it owns nothing and registers its load report anew.

Invariants: a broker serves a topic only while it holds the ownership node of the topic's
bundle in its current session and that session is connected; an ownership node is created only
after re-reading the namespace's boundaries (a split in between makes the acquisition give the
node back), so two brokers never own overlapping ranges; every wait and retry is bounded.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError, OperationTimeoutError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from broker.errors import BadVersion, NotFound, ServiceUnitNotReady, TopicNotOwned
from broker.metadata.store import MetadataStore
from broker.namespace.bundles import BUNDLES_DEFAULT, POLICY_KEY, Bundle, NamespaceBundles
from broker.namespace.lookup import BrokerAddress, LookupResult
from broker.namespace.namespaces import POLICIES
from broker.topic_name import TopicName

log = logging.getLogger(__name__)

OWNERSHIP_ROOT = "/namespace"
BROKERS_PATH = "/loadbalance/brokers"
ASSIGNMENTS_ROOT = "/loadbalance/assignments"
LOOKUP_ATTEMPTS_MAX = 8
"""Rounds of read-owner / assign / acquire in one lookup before it answers 'not ready'."""
POLICY_CAS_ATTEMPTS_MAX = 16
RECENT_ASSIGNMENTS_MAX = 10_000
ZK_CALL_TIMEOUT_S = 10.0
"""Every ZooKeeper call here waits at most this long (kazoo would queue one forever while it
cannot reach ZooKeeper): a broker cut off answers 'not ready' and still shuts down."""
EPHEMERAL_WAIT_S_MAX = 60.0
"""How long a restarted broker waits for its previous session's load report node to expire."""


@dataclass(frozen=True)
class LoadReport:
    """One live broker's load, as it last published it."""

    address: BrokerAddress
    bundles: int
    topics: int
    msg_rate_in: float
    msg_rate_out: float
    cpu_percent: float
    last_update_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"brokerId": self.address.broker_id, "webServiceUrl": self.address.web_service_url,
                "pulsarServiceUrl": self.address.pulsar_service_url,
                "pulsarServiceUrlTls": self.address.pulsar_service_url_tls, "numBundles": self.bundles,
                "numTopics": self.topics, "msgRateIn": self.msg_rate_in, "msgRateOut": self.msg_rate_out,
                "cpu": {"usage": self.cpu_percent, "limit": 100.0 * (os.cpu_count() or 1)},
                "lastUpdate": self.last_update_ms}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LoadReport:
        address = BrokerAddress(str(obj["brokerId"]), str(obj["webServiceUrl"]), str(obj.get("pulsarServiceUrl") or ""),
                                str(obj.get("pulsarServiceUrlTls") or ""))
        return cls(address, int(obj.get("numBundles", 0)), int(obj.get("numTopics", 0)),
                   float(obj.get("msgRateIn", 0.0)), float(obj.get("msgRateOut", 0.0)),
                   float(obj.get("cpu", {}).get("usage", 0.0)), int(obj.get("lastUpdate", 0)))


@dataclass(frozen=True)
class LocalLoad:
    """What the broker service reports about itself."""

    topics: int = 0
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0


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
    acquired: int = 0
    released: int = 0
    assignments: int = 0
    suspended: int = 0
    lost: int = 0


@dataclass
class _RecentAssignments:
    """Bundles this broker assigned lately, by broker: counted as load until reports catch up."""

    by_broker: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, broker_id: str, bundle_key: str, now_s: float) -> None:
        entries = self.by_broker.setdefault(broker_id, {})
        if len(entries) >= RECENT_ASSIGNMENTS_MAX:
            entries.clear()
        entries[bundle_key] = now_s

    def count(self, broker_id: str, since_s: float) -> int:
        return sum(1 for at in self.by_broker.get(broker_id, {}).values() if at >= since_s)


class _BoundedCalls:
    """The kazoo calls this module makes, each bounded by ``ZK_CALL_TIMEOUT_S`` (a timeout is
    kazoo's ``OperationTimeoutError``, a ``KazooException`` like every other failure)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def _wait(self, started: Any) -> Any:
        try:
            return started.get(timeout=ZK_CALL_TIMEOUT_S)
        except KazooTimeoutError:
            raise OperationTimeoutError(f"no answer from ZooKeeper within {ZK_CALL_TIMEOUT_S:g} s") from None

    def get(self, path: str) -> Any:
        return self._wait(self._client.get_async(path))

    def get_children(self, path: str) -> Any:
        return self._wait(self._client.get_children_async(path))

    def exists(self, path: str) -> Any:
        return self._wait(self._client.exists_async(path))

    def set(self, path: str, data: bytes) -> Any:
        return self._wait(self._client.set_async(path, data))

    def delete(self, path: str) -> Any:
        return self._wait(self._client.delete_async(path))

    def create(self, path: str, data: bytes, *, ephemeral: bool = False, makepath: bool = False) -> Any:
        return self._wait(self._client.create_async(path, data, ephemeral=ephemeral, makepath=makepath))


BundleListener = Callable[[Bundle, bool], object]
"""``listener(bundle, graceful)``: stop serving the bundle's topics (graceful: close them,
persisting what they hold; otherwise drop them without any write)."""


class OwnershipManager:
    def __init__(self, client: Any, store: MetadataStore, config: OwnershipConfig,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._zk = _BoundedCalls(client)
        self._store = store
        self.config = config
        self._clock = clock
        self._lock = threading.RLock()
        self._owned: dict[Bundle, str] = {}  # bundle -> ownership znode path
        self._releasing: set[Bundle] = set()
        self._serving = False
        self._closed = False
        self._counters = _Counters()
        self._recent = _RecentAssignments()
        self._bundle_listeners: list[BundleListener] = []
        self._load_source: Callable[[], LocalLoad] = LocalLoad
        self._report_stop = threading.Event()
        self._report_thread: threading.Thread | None = None
        self._cpu_mark = (time.monotonic(), time.process_time())

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._client.ensure_path(BROKERS_PATH)
        self._client.ensure_path(OWNERSHIP_ROOT)
        self._client.ensure_path(ASSIGNMENTS_ROOT)
        self._client.add_listener(self._on_state)
        self._publish_report(create=True)
        self._serving = True
        self._report_thread = threading.Thread(target=self._report_loop, name="magnetar-load-report", daemon=True)
        self._report_thread.start()

    def on_bundle_lost(self, listener: BundleListener) -> None:
        self._bundle_listeners.append(listener)

    def use_load_source(self, source: Callable[[], LocalLoad]) -> None:
        self._load_source = source

    def stop(self) -> None:
        """No more lookups or load reports; bundles stay owned until :meth:`close`."""
        self._closed = True
        self._serving = False
        self._report_stop.set()
        if self._report_thread is not None:
            self._report_thread.join()
            self._report_thread = None

    def close(self) -> None:
        """Give every bundle back (the caller has closed its topics) and leave the broker list."""
        self.stop()
        self._client.remove_listener(self._on_state)
        with self._lock:
            owned, self._owned = dict(self._owned), {}
            self._serving = False
        if not self._client.connected:
            return  # the nodes are ephemeral: they go with the session
        for path in owned.values():
            self._delete_quietly(path)
        self._delete_quietly(self._report_path)

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
            with self._lock:
                if bundle in self._owned:
                    return LookupResult(topic.full_name, bundle.key, self.address, True)
            owner = self._read_owner(bundle)
            if owner is not None:
                if owner.broker_id == self.address.broker_id:
                    if self._adopt(bundle):
                        return LookupResult(topic.full_name, bundle.key, self.address, True)
                    continue
                self._counters.redirects += 1
                return LookupResult(topic.full_name, bundle.key, owner, False)
            target = self._assigned_broker(bundle)
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
        with self._lock:
            return any(bundle.contains_topic(topic) for bundle in self._owned)

    def owner_of(self, topic: TopicName) -> BrokerAddress | None:
        """The current owner of ``topic``'s bundle, without assigning it (None: unowned)."""
        bundle = self.bundle_of(topic)
        with self._lock:
            if bundle in self._owned:
                return self.address
        return self._read_owner(bundle)

    # --- bundles -----------------------------------------------------------------------
    def bundles(self, namespace: str) -> NamespaceBundles:
        """The namespace's bundles; a namespace without a bundles policy gets the default number
        written into its policies first (so every broker agrees on the ranges)."""
        for _ in range(POLICY_CAS_ATTEMPTS_MAX):
            found = self._store.get_json(f"{POLICIES}/{namespace}")
            if found is None:
                raise NotFound(f"namespace {namespace} does not exist")
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
        with self._lock:
            return sorted(self._owned)

    def bundle_owners(self, namespace: str) -> dict[str, BrokerAddress | None]:
        """Each bundle of ``namespace`` and its owner (None: unowned)."""
        return {b.range_name: self._read_owner(b) for b in self.bundles(namespace).bundles}

    def unload(self, namespace: str, range_name: str, destination: str | None = None) -> BrokerAddress | None:
        """Stop serving one owned bundle and hand it to ``destination`` (a live broker id) or to
        the least-loaded other live broker (this one when it is alone); returns where it goes.
        ``TopicNotOwned`` when another broker owns it (the call belongs there), ``NotFound``
        when nobody does."""
        bundle = self.bundles(namespace).find(range_name)
        self._require_owned(bundle)
        live = {r.address.broker_id: r for r in self.load_reports()}
        if destination is not None and destination not in live:
            raise NotFound(f"broker {destination} is not live")
        target = live[destination].address if destination is not None else \
            self._least_loaded(list(live.values()), exclude=self.address.broker_id)
        if target is not None:
            self._write_assignment(bundle, target)
        self._release(bundle, graceful=True)
        return target

    def split(self, namespace: str, range_name: str) -> list[Bundle]:
        """Divide one owned bundle in two (its topics are closed; the halves are assigned on
        their next lookups)."""
        bundles = self.bundles(namespace)
        bundle = bundles.find(range_name)
        self._require_owned(bundle)
        with self._lock:
            path = self._owned.pop(bundle)
            self._releasing.add(bundle)
        try:
            self._disable(bundle)
            self._notify_lost(bundle, graceful=True)
            divided = self._write_split(namespace, bundle)
            self._delete_quietly(path)
        finally:
            with self._lock:
                self._releasing.discard(bundle)
        self._counters.released += 1
        self._publish_report()
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
        with self._lock:
            if bundle in self._owned and self._serving:
                return
        owner = self._read_owner(bundle)
        if owner is None:
            raise NotFound(f"bundle {bundle.key} is not owned by any broker")
        if owner.broker_id != self.address.broker_id:
            raise TopicNotOwned(f"bundle {bundle.key} is owned by {owner.broker_id}", owner_url=owner.web_service_url,
                                owner_broker=owner.broker_id, pulsar_url=owner.pulsar_service_url)
        raise ServiceUnitNotReady(f"bundle {bundle.key} is being taken over")

    # --- brokers and load ------------------------------------------------------------------
    def load_reports(self) -> list[LoadReport]:
        """The live brokers' reports, sorted by broker id (one ZooKeeper read each)."""
        reports = []
        try:
            names = self._zk.get_children(BROKERS_PATH)
        except KazooException as exc:
            raise ServiceUnitNotReady(f"cannot list brokers: {exc!r}") from exc
        for name in sorted(names):
            try:
                data, _ = self._zk.get(f"{BROKERS_PATH}/{name}")
                reports.append(LoadReport.from_json(json.loads(data)))
            except NoNodeError:
                continue
            except (KazooException, ValueError, KeyError, TypeError):
                log.warning("unreadable load report of broker %s", name)
        return reports

    def _least_loaded(self, reports: list[LoadReport], exclude: str | None = None) -> BrokerAddress | None:
        since_s = self._clock() - self.config.load_report_interval_ms * 2 / 1000.0
        candidates = [r for r in reports if r.address.broker_id != exclude]
        if not candidates:
            return None
        best = min(candidates, key=lambda r: (r.bundles + self._recent.count(r.address.broker_id, since_s),
                                              r.msg_rate_in, r.address.broker_id))
        return best.address

    @property
    def _report_path(self) -> str:
        return f"{BROKERS_PATH}/{self.address.broker_id}"

    def _report(self) -> LoadReport:
        load = self._load_source()
        now, cpu = time.monotonic(), time.process_time()
        wall, used = now - self._cpu_mark[0], cpu - self._cpu_mark[1]
        self._cpu_mark = (now, cpu)
        with self._lock:
            bundles = len(self._owned)
        return LoadReport(self.address, bundles, load.topics, load.msg_rate_in, load.msg_rate_out,
                          100.0 * used / wall if wall > 0 else 0.0, int(self._clock() * 1000))

    def _publish_report(self, *, create: bool = False) -> None:
        data = json.dumps(self._report().to_json(), sort_keys=True).encode()
        try:
            if create:
                self._create_ephemeral(self._report_path, data)
            else:
                self._zk.set(self._report_path, data)
        except NoNodeError:
            self._create_ephemeral(self._report_path, data)
        except KazooException:
            log.warning("could not publish the load report", exc_info=True)

    def _create_ephemeral(self, path: str, data: bytes) -> None:
        """Create ``path`` in this session, waiting out (bounded) a node left by this broker's
        previous session (a restart within the session timeout)."""
        deadline_s = time.monotonic() + EPHEMERAL_WAIT_S_MAX
        while True:
            try:
                self._zk.create(path, data, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                stat = self._zk.exists(path)
                if stat is not None and stat.ephemeralOwner == self._client.client_id[0]:
                    self._zk.set(path, data)
                    return
                if time.monotonic() >= deadline_s:
                    raise
                time.sleep(0.1)

    def _report_loop(self) -> None:
        while not self._report_stop.wait(self.config.load_report_interval_ms / 1000.0):
            if self._serving:
                self._publish_report()

    # --- ownership nodes ------------------------------------------------------------------
    @staticmethod
    def _owner_path(bundle: Bundle) -> str:
        return f"{OWNERSHIP_ROOT}/{bundle.key}"

    @staticmethod
    def _assignment_path(bundle: Bundle) -> str:
        return f"{ASSIGNMENTS_ROOT}/{bundle.key}"

    def _ownership_data(self) -> bytes:
        return json.dumps({"brokerId": self.address.broker_id, "httpUrl": self.address.web_service_url,
                           "nativeUrl": self.address.pulsar_service_url, "httpUrlTls": None,
                           "nativeUrlTls": self.address.pulsar_service_url_tls or None,
                           "disabled": False}, sort_keys=True).encode()

    def _read_owner(self, bundle: Bundle) -> BrokerAddress | None:
        try:
            data, _ = self._zk.get(self._owner_path(bundle))
        except NoNodeError:
            return None
        except KazooException as exc:
            raise ServiceUnitNotReady(f"cannot read the owner of {bundle.key}: {exc!r}") from exc
        obj = json.loads(data)
        if obj.get("disabled"):
            raise ServiceUnitNotReady(f"bundle {bundle.key} is being unloaded")
        return BrokerAddress(str(obj["brokerId"]), str(obj["httpUrl"]), str(obj.get("nativeUrl") or ""),
                             str(obj.get("nativeUrlTls") or ""))

    def _assigned_broker(self, bundle: Bundle) -> BrokerAddress:
        """The live broker the bundle is assigned to, assigning it now when it is not (or to a
        broker no longer live, or too long ago)."""
        reports = self.load_reports()
        live = {r.address.broker_id: r.address for r in reports}
        try:
            data, _ = self._zk.get(self._assignment_path(bundle))
            obj = json.loads(data)
            fresh = self._clock() * 1000 - int(obj["assignedMs"]) < self.config.assignment_ttl_ms
            if fresh and obj["broker"] in live:
                return live[obj["broker"]]
        except NoNodeError:
            pass
        except (KazooException, ValueError, KeyError, TypeError) as exc:
            raise ServiceUnitNotReady(f"cannot read the assignment of {bundle.key}: {exc!r}") from exc
        target = self._least_loaded(reports) or self.address
        self._write_assignment(bundle, target)
        return target

    def _write_assignment(self, bundle: Bundle, target: BrokerAddress) -> None:
        data = json.dumps({"broker": target.broker_id, "assignedMs": int(self._clock() * 1000),
                           "by": self.address.broker_id}).encode()
        path = self._assignment_path(bundle)
        try:
            try:
                self._zk.set(path, data)
            except NoNodeError:
                self._zk.create(path, data, makepath=True)
        except NodeExistsError:
            self._zk.set(path, data)
        except KazooException as exc:
            raise ServiceUnitNotReady(f"cannot assign {bundle.key}: {exc!r}") from exc
        self._counters.assignments += 1
        self._recent.add(target.broker_id, bundle.key, self._clock())
        log.info("bundle %s assigned to %s", bundle.key, target.broker_id)

    def _acquire(self, bundle: Bundle) -> bool:
        """Create the ownership node; True once this broker owns ``bundle`` (False: someone
        else was faster, or the boundaries changed; the caller looks again)."""
        path = self._owner_path(bundle)
        with self._lock:
            try:
                self._zk.create(path, self._ownership_data(), ephemeral=True, makepath=True)
            except NodeExistsError:
                return False
            except KazooException as exc:
                raise ServiceUnitNotReady(f"cannot take {bundle.key}: {exc!r}") from exc
            if bundle not in self.bundles(bundle.namespace).bundles:  # split meanwhile: give it back
                self._delete_quietly(path)
                return False
            self._owned[bundle] = path
            self._counters.acquired += 1
        self._delete_quietly(self._assignment_path(bundle))
        log.info("broker %s now owns bundle %s", self.address.broker_id, bundle.key)
        self._publish_report()
        return True

    def _adopt(self, bundle: Bundle) -> bool:
        """The node names this broker: keep it if this session created it (a suspended session
        that survived), else wait for the old session's node to go."""
        path = self._owner_path(bundle)
        with self._lock:
            releasing = bundle in self._releasing
        stat = None if releasing else self._zk.exists(path)
        if stat is not None and stat.ephemeralOwner == self._client.client_id[0] and \
                bundle in self.bundles(bundle.namespace).bundles:
            with self._lock:
                self._owned[bundle] = path
            return True
        time.sleep(0.05)
        return False

    def _disable(self, bundle: Bundle) -> None:
        """Mark the ownership node ``disabled`` (Pulsar's flag for a bundle being unloaded):
        lookups answer 'not ready' until the node is gone, instead of sending clients here."""
        data = json.loads(self._ownership_data())
        data["disabled"] = True
        try:
            self._zk.set(self._owner_path(bundle), json.dumps(data, sort_keys=True).encode())
        except KazooException:
            log.warning("could not mark %s disabled", bundle.key)

    def _release(self, bundle: Bundle, *, graceful: bool) -> None:
        with self._lock:
            path = self._owned.pop(bundle, None)
            self._releasing.add(bundle)
        try:
            if path is not None:
                self._disable(bundle)
            self._notify_lost(bundle, graceful=graceful)
        finally:
            with self._lock:
                self._releasing.discard(bundle)
        if path is not None:
            self._delete_quietly(path)
            self._counters.released += 1
        self._publish_report()

    def _notify_lost(self, bundle: Bundle, *, graceful: bool) -> None:
        for listener in list(self._bundle_listeners):
            try:
                listener(bundle, graceful)
            except Exception:
                log.exception("a bundle listener failed for %s", bundle.key)

    def _delete_quietly(self, path: str) -> None:
        try:
            self._zk.delete(path)
        except NoNodeError:
            pass
        except KazooException:
            log.warning("could not delete %s; the session's end removes it if ephemeral", path)

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
            with self._lock:
                bundles = list(self._owned)
                if state == KazooState.LOST:
                    self._owned.clear()
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
            session = self._client.client_id[0]
            with self._lock:
                for bundle, path in list(self._owned.items()):
                    stat = self._zk.exists(path)
                    if stat is None or stat.ephemeralOwner != session:
                        del self._owned[bundle]
            self._publish_report(create=True)
            self._serving = True
            log.info("ZooKeeper session back: serving %d bundles", len(self._owned))
        except Exception:
            log.exception("could not resume serving after reconnecting to ZooKeeper")

    def statistics(self) -> OwnershipStats:
        c = self._counters
        with self._lock:
            owned = len(self._owned)
        return OwnershipStats(self._serving, owned, c.lookups, c.redirects, c.acquired, c.released, c.assignments,
                              c.suspended, c.lost)
