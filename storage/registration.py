"""A bookie's registration in ZooKeeper, and the connection to ZooKeeper it rides on.

Role: a ``magnetar bookie`` (``storage/bookie_process.py``) announces itself as the ephemeral
node ``/ledgers/available/<host:port>`` (BookKeeper's registration path); brokers watch that list
to pick ensembles (``broker/metadata/coordination.py``). ``connect`` turns
``zk:HOST:PORT[,HOST:PORT...][/chroot]`` into a started kazoo client rooted at the chroot; the
broker's ZooKeeper metadata store and coordination take it, and ``AVAILABLE_PATH``, from here.

Invariants:
- the node exists exactly while a session of this registration holds it: it goes with the
  session (``kill -9``, or the session timeout after a lost connection), and once kazoo has a new
  session the registration creates it again;
- a node left by this bookie's previous session (a restart within the session timeout) is never
  taken over: it is waited out, at most ``REGISTRATION_WAIT_S_MAX``, as BookKeeper's bookies do.

Nothing here imports ``broker``: a bookie depends on nothing above storage.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError
from kazoo.protocol.states import KazooState

from storage.errors import InvalidArgument, MetadataStoreUnavailable
from storage.limits import CONNECT_TIMEOUT_S, REGISTRATION_WAIT_S_MAX, SESSION_TIMEOUT_S

log = logging.getLogger(__name__)

AVAILABLE_PATH = "/ledgers/available"
"""Where bookies register: one ephemeral node ``<host:port>`` per live bookie."""
_SPEC = re.compile(r"^zk:(?P<hosts>[^/]+)(?P<chroot>/.*)?$")
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class ZooKeeperSpec:
    """``zk:HOST:PORT[,HOST:PORT...][/chroot]``."""

    hosts: str
    chroot: str

    @classmethod
    def parse(cls, spec: str) -> ZooKeeperSpec:
        match = _SPEC.match(spec.strip())
        if match is None:
            raise InvalidArgument(f"not a ZooKeeper metadata store: {spec!r} (expected zk:HOST:PORT[/chroot])")
        chroot = (match.group("chroot") or "").rstrip("/")
        segments = chroot.split("/")[1:]
        if any(segment in ("", ".", "..") for segment in segments) or _CONTROL_CHARACTER.search(chroot):
            raise InvalidArgument(f"not a ZooKeeper chroot: {chroot!r}")
        return cls(match.group("hosts"), chroot)

    @property
    def url(self) -> str:
        return f"zk:{self.hosts}{self.chroot}"


def connect(spec: str | ZooKeeperSpec, *, session_timeout_s: float = SESSION_TIMEOUT_S,
            connect_timeout_s: float = CONNECT_TIMEOUT_S) -> KazooClient:
    """A started kazoo client rooted at the spec's chroot (created when missing). It reconnects
    by itself after a lost connection, with a new session after an expired one."""
    parsed = spec if isinstance(spec, ZooKeeperSpec) else ZooKeeperSpec.parse(spec)
    retry = {"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 1.0}
    try:
        if parsed.chroot:
            _ensure_chroot(parsed, session_timeout_s, connect_timeout_s)
        client = KazooClient(hosts=parsed.hosts + parsed.chroot, timeout=session_timeout_s,
                             connection_retry=retry, command_retry={"max_tries": 3, "delay": 0.05, "max_delay": 1.0})
        client.start(timeout=connect_timeout_s)
    except (KazooException, TimeoutError) as exc:
        raise MetadataStoreUnavailable(f"cannot reach ZooKeeper at {parsed.url}: {exc!r}") from exc
    return client


def _ensure_chroot(parsed: ZooKeeperSpec, session_timeout_s: float, connect_timeout_s: float) -> None:
    bootstrap = KazooClient(hosts=parsed.hosts, timeout=session_timeout_s)
    bootstrap.start(timeout=connect_timeout_s)
    try:
        bootstrap.ensure_path(parsed.chroot)
    finally:
        bootstrap.stop()
        bootstrap.close()


class BookieRegistration:
    """The node ``/ledgers/available/<bookie_id>`` of one bookie, on a started kazoo client.

    ``register()`` creates it (and returns once it exists); from then on every time kazoo
    connects, it is created again if the session changed, until ``close()``. The client stays
    its owner's: closing the registration does not end the session (ending the session removes
    the node)."""

    def __init__(self, client: KazooClient, bookie_id: str, *, identifier: str = "") -> None:
        self.client = client
        self.bookie_id = bookie_id
        self.path = f"{AVAILABLE_PATH}/{bookie_id}"
        self._identifier = identifier
        self._closed = False
        self._listening = False
        self.registrations = 0
        """Nodes created: 1 after ``register()``, +1 per session that had to register again."""

    def register(self) -> None:
        """Create the node; ``MetadataStoreUnavailable`` when ZooKeeper cannot be reached or the
        previous session's node outlives ``REGISTRATION_WAIT_S_MAX``."""
        self._create()
        if not self._listening:
            self._listening = True
            self.client.add_listener(self._on_state)

    def close(self) -> None:
        """Stop registering again (idempotent); the node goes with the session."""
        self._closed = True
        if self._listening:
            self._listening = False
            self.client.remove_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED and not self._closed:
            self.client.handler.spawn(self._register_again)  # a listener must not block

    def _register_again(self) -> None:
        try:
            self._create()
        except Exception:
            log.exception("could not register bookie %s again", self.bookie_id)

    def _create(self) -> None:
        deadline_s = time.monotonic() + REGISTRATION_WAIT_S_MAX
        while True:
            try:
                self.client.create(self.path, self._identifier.encode(), ephemeral=True, makepath=True)
                self.registrations += 1
                return
            except NodeExistsError:
                if self._held_by_this_session():
                    return
                self._wait_until_gone(deadline_s)
            except KazooException as exc:
                raise MetadataStoreUnavailable(f"could not register bookie {self.bookie_id}: {exc!r}") from exc

    def _held_by_this_session(self) -> bool:
        stat = self.client.exists(self.path)
        return stat is not None and stat.ephemeralOwner == self.client.client_id[0]

    def _wait_until_gone(self, deadline_s: float) -> None:
        gone = threading.Event()
        if self.client.exists(self.path, watch=lambda _event: gone.set()) is not None:
            gone.wait(max(0.0, deadline_s - time.monotonic()))
        if time.monotonic() >= deadline_s:
            raise MetadataStoreUnavailable(f"bookie {self.bookie_id} is still registered by another session")
