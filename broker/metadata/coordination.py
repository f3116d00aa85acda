"""Cluster coordination: bookie membership and locks between processes.

Role: in a cluster the metadata store holds *state*; this module holds what lives only as long
as a process's session: which bookies are up (BookKeeper's ``/ledgers/available/<host:port>``
ephemeral nodes) and exclusive locks (so two re-replication workers never copy the same ledger).
``ZooKeeperCoordination`` builds them from kazoo's recipes (``ChildrenWatch``, ``Lock``) and
the bookie's own registration (``storage/registration.py``, which ``magnetar bookie`` uses
directly); ``InMemoryCoordination`` is the twin for simulations and unit tests, with sessions
that a test can expire.

Invariants:
- A bookie is available exactly while the session that registered it lives; a bookie process
  whose session expired registers again once it has a new one.
- A lock is held by at most one session; it is released by ``Lease.release`` or when its
  session ends (``Lease.held`` then turns False, and the holder must stop).
- ``available_bookies()`` is a cached view (updated by watches), never a round trip.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from broker.errors import BrokerError
from storage import AVAILABLE_PATH, BookieRegistration

log = logging.getLogger(__name__)

LOCKS_PATH = "/ledgers/underreplication/locks"


class CoordinationUnavailable(BrokerError):
    """The coordination service (ZooKeeper) could not be reached, or the session is lost."""

    code = "coordination_unavailable"
    http_status = 503
    retriable = True


@dataclass(frozen=True)
class CoordinationStats:
    available_bookies: int
    registrations: int
    locks_acquired: int
    locks_refused: int
    sessions_lost: int


class Lease(ABC):
    """An exclusive lock held by this process."""

    @property
    @abstractmethod
    def held(self) -> bool:
        """False once released or once the session that took it ended."""

    @abstractmethod
    def release(self) -> None:
        """Give the lock up (idempotent)."""


class Coordination(ABC):
    def __init__(self) -> None:
        self._counters = dict.fromkeys(("registrations", "locks_acquired", "locks_refused", "sessions_lost"), 0)
        self._listeners: list[Callable[[list[str]], None]] = []

    @abstractmethod
    def register_bookie(self, bookie_id: str) -> None:
        """Announce this process's bookie (until the session ends; re-announced after that)."""

    @abstractmethod
    def available_bookies(self) -> list[str]:
        """Sorted ids of the bookies registered now (cached)."""

    @abstractmethod
    def try_lock(self, name: str) -> Lease | None:
        """Take the exclusive lock ``name`` without waiting; None when someone else holds it."""

    @abstractmethod
    def close(self) -> None: ...

    def on_bookies_changed(self, listener: Callable[[list[str]], None]) -> None:
        """Call ``listener(available)`` after each membership change."""
        self._listeners.append(listener)

    def _notify(self, available: list[str]) -> None:
        for listener in list(self._listeners):
            try:
                listener(available)
            except Exception:
                log.exception("bookie membership listener failed")

    def statistics(self) -> CoordinationStats:
        c = self._counters
        return CoordinationStats(len(self.available_bookies()), c["registrations"], c["locks_acquired"],
                                 c["locks_refused"], c["sessions_lost"])


# --- in memory ------------------------------------------------------------------------------------


class InMemoryCluster:
    """What the sessions of a simulated cluster share: registrations and locks by session."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bookies: dict[str, int] = {}  # bookie id -> session
        self.locks: dict[str, int] = {}  # lock name -> session
        self.sessions: list[InMemoryCoordination] = []
        self._next_session = 0

    def new_session(self) -> int:
        with self.lock:
            self._next_session += 1
            return self._next_session

    def notify_all(self) -> None:
        for coordination in list(self.sessions):
            coordination._notify(coordination.available_bookies())


class InMemoryCoordination(Coordination):
    """A process's view of an :class:`InMemoryCluster`; ``expire_session`` ends its session
    (registrations and locks vanish, as ZooKeeper's ephemeral nodes do) and starts a new one,
    where registered bookies announce themselves again."""

    def __init__(self, cluster: InMemoryCluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.session = cluster.new_session()
        self._registered: list[str] = []
        cluster.sessions.append(self)

    def register_bookie(self, bookie_id: str) -> None:
        with self.cluster.lock:
            self.cluster.bookies[bookie_id] = self.session
            if bookie_id not in self._registered:
                self._registered.append(bookie_id)
            self._counters["registrations"] += 1
        self.cluster.notify_all()

    def unregister(self) -> None:
        """The process died: its registrations vanish and are not renewed."""
        with self.cluster.lock:
            self._drop_session()
            self._registered.clear()
        self.cluster.notify_all()

    def expire_session(self, *, reconnect: bool = True) -> None:
        with self.cluster.lock:
            self._drop_session()
            self._counters["sessions_lost"] += 1
            self.session = self.cluster._next_session = self.cluster._next_session + 1
            if reconnect:
                for bookie_id in self._registered:
                    self.cluster.bookies[bookie_id] = self.session
        self.cluster.notify_all()

    def _drop_session(self) -> None:
        for table in (self.cluster.bookies, self.cluster.locks):
            for key in [k for k, session in table.items() if session == self.session]:
                del table[key]

    def available_bookies(self) -> list[str]:
        with self.cluster.lock:
            return sorted(self.cluster.bookies)

    def try_lock(self, name: str) -> Lease | None:
        with self.cluster.lock:
            if name in self.cluster.locks:
                self._counters["locks_refused"] += 1
                return None
            self.cluster.locks[name] = self.session
            self._counters["locks_acquired"] += 1
            return _InMemoryLease(self, name, self.session)

    def close(self) -> None:
        self.unregister()
        if self in self.cluster.sessions:
            self.cluster.sessions.remove(self)


class _InMemoryLease(Lease):
    def __init__(self, owner: InMemoryCoordination, name: str, session: int) -> None:
        self._owner, self._name, self._session = owner, name, session

    @property
    def held(self) -> bool:
        with self._owner.cluster.lock:
            return self._owner.cluster.locks.get(self._name) == self._session

    def release(self) -> None:
        with self._owner.cluster.lock:
            if self._owner.cluster.locks.get(self._name) == self._session:
                del self._owner.cluster.locks[self._name]


# --- ZooKeeper ------------------------------------------------------------------------------------


class ZooKeeperCoordination(Coordination):
    """Membership and locks on a started kazoo client (shared with the ZooKeeper metadata store)."""

    def __init__(self, client: Any, *, identifier: str = "") -> None:
        super().__init__()
        self._client = client
        self._identifier = identifier
        self._available: list[str] = []
        self._registrations: dict[str, BookieRegistration] = {}
        self._lock = threading.Lock()
        self._closed = False
        client.ensure_path(AVAILABLE_PATH)
        client.ensure_path(LOCKS_PATH)
        client.add_listener(self._on_state)
        client.ChildrenWatch(AVAILABLE_PATH, self._on_children)

    def _on_children(self, children: list[str]) -> bool:
        with self._lock:
            self._available = sorted(children)
            available = list(self._available)
        self._notify(available)
        return not self._closed

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._counters["sessions_lost"] += 1

    def register_bookie(self, bookie_id: str) -> None:
        with self._lock:
            registration = self._registrations.get(bookie_id)
            if registration is None:
                registration = BookieRegistration(self._client, bookie_id, identifier=self._identifier)
        registration.register()
        with self._lock:
            self._registrations.setdefault(bookie_id, registration)

    def statistics(self) -> CoordinationStats:
        with self._lock:
            self._counters["registrations"] = sum(r.registrations for r in self._registrations.values())
        return super().statistics()

    def available_bookies(self) -> list[str]:
        with self._lock:
            return list(self._available)

    def try_lock(self, name: str) -> Lease | None:
        lock = self._client.Lock(f"{LOCKS_PATH}/{name}", self._identifier)
        try:
            acquired = lock.acquire(blocking=False)
        except KazooException as exc:
            raise CoordinationUnavailable(f"could not take lock {name}: {exc!r}") from exc
        if not acquired:
            self._counters["locks_refused"] += 1
            return None
        self._counters["locks_acquired"] += 1
        return _ZooKeeperLease(self._client, lock)

    def close(self) -> None:
        self._closed = True
        self._client.remove_listener(self._on_state)
        with self._lock:
            registrations, self._registrations = list(self._registrations.values()), {}
        for registration in registrations:
            registration.close()


class _ZooKeeperLease(Lease):
    def __init__(self, client: Any, lock: Any) -> None:
        self._client = client
        self._lock = lock
        self._session = client.client_id

    @property
    def held(self) -> bool:
        return bool(self._lock.is_acquired) and self._client.connected and self._client.client_id == self._session

    def release(self) -> None:
        try:
            self._lock.release()
        except KazooException:
            log.warning("could not release a lock; its session's end releases it")
