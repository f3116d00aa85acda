"""Load reports and bundle assignment: which live broker should take an unowned bundle.

Role: the load half of Pulsar's cluster ``NamespaceService`` (its ``LoadManager``). Every broker
publishes a load report as the ephemeral ``/loadbalance/brokers/{host:port}`` (bundles and
topics owned, message rates, CPU), which is also the list of live brokers. When a lookup finds a
bundle unowned, the bundle is *assigned* to the least-loaded live broker (fewest bundles, then
lowest message rate in), and the assignment is written to
``/loadbalance/assignments/{tenant}/{ns}/{range}`` so that every broker sends the client to the
same place; the assigned broker takes the bundle when the client reaches it (an assignment to a
broker no longer live, or older than ``assignment_ttl_ms``, is made again).

Invariants: a report is published in this broker's current session (a node left by its
previous session is waited out for at most ``EPHEMERAL_WAIT_S_MAX``); bundles this broker
assigned lately count as load until the reports catch up (at most ``RECENT_ASSIGNMENTS_MAX``
per broker); every ZooKeeper call is bounded (``bounded_zookeeper.py``).
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

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from broker.errors import ServiceUnitNotReady
from broker.limits import EPHEMERAL_WAIT_S_MAX, RECENT_ASSIGNMENTS_MAX
from broker.namespace.bounded_zookeeper import BoundedZooKeeper
from broker.namespace.bundles import Bundle
from broker.namespace.lookup import BrokerAddress, listeners_of

log = logging.getLogger(__name__)

BROKERS_PATH = "/loadbalance/brokers"
ASSIGNMENTS_ROOT = "/loadbalance/assignments"


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
                "pulsarServiceUrlTls": self.address.pulsar_service_url_tls,
                "advertisedListeners": self.address.listeners_json(), "numBundles": self.bundles,
                "numTopics": self.topics, "msgRateIn": self.msg_rate_in, "msgRateOut": self.msg_rate_out,
                "cpu": {"usage": self.cpu_percent, "limit": 100.0 * (os.cpu_count() or 1)},
                "lastUpdate": self.last_update_ms}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LoadReport:
        address = BrokerAddress(str(obj["brokerId"]), str(obj["webServiceUrl"]), str(obj.get("pulsarServiceUrl") or ""),
                                str(obj.get("pulsarServiceUrlTls") or ""), listeners_of(obj.get("advertisedListeners")))
        return cls(address, int(obj.get("numBundles", 0)), int(obj.get("numTopics", 0)),
                   float(obj.get("msgRateIn", 0.0)), float(obj.get("msgRateOut", 0.0)),
                   float(obj.get("cpu", {}).get("usage", 0.0)), int(obj.get("lastUpdate", 0)))


@dataclass(frozen=True)
class LocalLoad:
    """What the broker service reports about itself."""

    topics: int = 0
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0


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


class LoadManager:
    """This broker's load report, the live brokers' reports, and the assignment of unowned
    bundles to the least loaded of them."""

    def __init__(self, client: Any, address: BrokerAddress, *, report_interval_ms: int, assignment_ttl_ms: int,
                 owned_count: Callable[[], int], serving: Callable[[], bool],
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._zk = BoundedZooKeeper(client)
        self.address = address
        self._report_interval_ms = report_interval_ms
        self._assignment_ttl_ms = assignment_ttl_ms
        self._owned_count = owned_count
        """The number of bundles this broker owns now."""
        self._serving = serving
        """Whether this broker serves now (reports are published only then)."""
        self._clock = clock
        self._recent = _RecentAssignments()
        self._load_source: Callable[[], LocalLoad] = LocalLoad
        self._report_stop = threading.Event()
        self._report_thread: threading.Thread | None = None
        self._cpu_mark = (time.monotonic(), time.process_time())
        self.assignments = 0

    def use_load_source(self, source: Callable[[], LocalLoad]) -> None:
        self._load_source = source

    def start_reporting(self) -> None:
        """Publish the report every ``report_interval_ms`` (while serving) until :meth:`stop_reporting`."""
        self._report_thread = threading.Thread(target=self._report_loop, name="magnetar-load-report", daemon=True)
        self._report_thread.start()

    def stop_reporting(self) -> None:
        self._report_stop.set()
        if self._report_thread is not None:
            self._report_thread.join()
            self._report_thread = None

    def withdraw_report(self) -> None:
        """Leave the broker list (a clean shutdown; otherwise the session's end does it)."""
        self._zk.delete_quietly(self._report_path)

    # --- reports ------------------------------------------------------------------------------
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

    def least_loaded(self, reports: list[LoadReport], exclude: str | None = None) -> BrokerAddress | None:
        since_s = self._clock() - self._report_interval_ms * 2 / 1000.0
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
        bundles = self._owned_count()
        return LoadReport(self.address, bundles, load.topics, load.msg_rate_in, load.msg_rate_out,
                          100.0 * used / wall if wall > 0 else 0.0, int(self._clock() * 1000))

    def publish_report(self, *, create: bool = False) -> None:
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
        while not self._report_stop.wait(self._report_interval_ms / 1000.0):
            if self._serving():
                self.publish_report()

    # --- assignments --------------------------------------------------------------------------
    @staticmethod
    def _assignment_path(bundle: Bundle) -> str:
        return f"{ASSIGNMENTS_ROOT}/{bundle.key}"

    def assigned_broker(self, bundle: Bundle) -> BrokerAddress:
        """The live broker the bundle is assigned to, assigning it now when it is not (or to a
        broker no longer live, or too long ago)."""
        reports = self.load_reports()
        live = {r.address.broker_id: r.address for r in reports}
        try:
            data, _ = self._zk.get(self._assignment_path(bundle))
            obj = json.loads(data)
            fresh = self._clock() * 1000 - int(obj["assignedMs"]) < self._assignment_ttl_ms
            if fresh and obj["broker"] in live:
                return live[obj["broker"]]
        except NoNodeError:
            pass
        except (KazooException, ValueError, KeyError, TypeError) as exc:
            raise ServiceUnitNotReady(f"cannot read the assignment of {bundle.key}: {exc!r}") from exc
        target = self.least_loaded(reports) or self.address
        self.write_assignment(bundle, target)
        return target

    def write_assignment(self, bundle: Bundle, target: BrokerAddress) -> None:
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
        self.assignments += 1
        self._recent.add(target.broker_id, bundle.key, self._clock())
        log.info("bundle %s assigned to %s", bundle.key, target.broker_id)

    def forget_assignment(self, bundle: Bundle) -> None:
        """The assigned broker took the bundle: its assignment is done."""
        self._zk.delete_quietly(self._assignment_path(bundle))
