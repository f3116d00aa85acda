"""The metadata store on ZooKeeper (through kazoo): what a cluster's brokers share.

Role: ``--metadata-store zk:HOST:PORT[,HOST:PORT...][/chroot]`` puts every piece of broker state
(tenants, policies, managed ledgers, cursors, ledger metadata) in ZooKeeper with the same
contract as the embedded RocksDB store (``broker/metadata/store.py``; one contract test runs
against all three backends). Several brokers may share it: every write is a compare-and-set that
ZooKeeper checks, so they never lose each other's updates. The connection (``connect``, one
kazoo session rooted at the chroot) is the bookies' own, from ``storage/registration.py``.

How the contract maps onto znodes:

- A node that holds a value has data ``MAGIC [version i64][created_ms i64][modified_ms i64]
  [writer u64]`` then the value (``writer`` identifies the store object that wrote it). The
  version is the store's own (0 on create, +1 per put, back to 0 after a delete), not
  ZooKeeper's, because a znode can outlive its value (see the next point).
- ZooKeeper needs parents; the store's parents are implicit. Missing parents are created as
  *placeholders* (no data, hence no value: ``get`` answers None, ``children`` lists them);
  deleting a value whose znode has children turns it into a placeholder; a placeholder left
  without children is removed (right after the delete that emptied it), so ``children`` only
  lists names that still lead to values, as with the other backends.
- Nodes other processes create with raw kazoo calls (bookie registrations, locks, the ledger
  id counter) hold no value for the store either.
- A write reads the znodes it touches, checks the store's versions, and commits one ZooKeeper
  ``multi`` guarded by the znodes' ZooKeeper versions. If another client changed one of them in
  between, the multi fails as a whole and the write is planned again from fresh reads (at most
  ``ZK_CONFLICT_RETRIES_MAX`` times), so a compare-and-set never succeeds against a stale read.
- ``delete_recursive`` removes the subtree in one multi when it has at most
  ``ZK_MULTI_OPS_MAX`` znodes, else in batches from the leaves up (a crash part-way leaves a
  smaller subtree, never an orphan).
- Watches deliver the changes made through this store object synchronously, as the other
  backends do. Changes made by other clients (other brokers) are delivered too, asynchronously,
  from kazoo's ``TreeCache`` recipe on the watched prefix (one per prefix, closed with its last
  watch): a change is reported once its znode is read, so quick successive changes of one node
  may arrive as one (the latest), and a callback must re-read what it needs. This object's own
  writes are recognised (by the writer field, or the ZooKeeper version a delete removed) and
  not reported twice.
- Ledger ids come from a counter znode at ``/ledgers/idgen`` (a CAS on one znode, retried on conflict),
  so brokers sharing the store never hand out one id twice.

Errors: a lost connection or session during a call raises the retriable
``MetadataStoreUnavailable`` (a storage error: a bookie meets it too). A write may or may not
have been applied, as with any ZooKeeper client; callers re-read before retrying, which every
caller of a CAS does anyway.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.recipe.cache import TreeCache, TreeEvent
from kazoo.retry import ForceRetryError, KazooRetry, RetryFailedError

from broker.limits import (
    LEDGER_ID_CAS_TRIES_MAX,
    OWN_DELETES_REMEMBERED_MAX,
    ZK_CONFLICT_RETRIES_MAX,
    ZK_MULTI_OPS_MAX,
    ZK_WATCH_LOAD_TIMEOUT_S,
)
from broker.metadata.store import (
    ROOT,
    SEPARATOR,
    Notification,
    NotificationType,
    Stat,
    VersionedStore,
    Watch,
    WatchCallback,
    call_safely,
    validate_path,
)
from storage import MetadataStoreUnavailable, connect

MAGIC = b"MGV1"
_HEADER = struct.Struct(">4sqqqQ")
LEDGER_ID_COUNTER_PATH = "/ledgers/idgen"


class _Conflict(Exception):
    """Another client changed a znode between this write's reads and its multi: plan again."""


def _encode(stat: Stat, writer: int) -> bytes:
    return _HEADER.pack(MAGIC, stat.version, stat.created_ms, stat.modified_ms, writer) + stat.value


def _decode(path: str, data: bytes) -> Stat | None:
    if len(data) < _HEADER.size or data[:4] != MAGIC:
        return None  # a placeholder, or a znode some recipe owns
    _, version, created_ms, modified_ms, _ = _HEADER.unpack_from(data)
    return Stat(path, data[_HEADER.size :], version, created_ms, modified_ms)


def _writer_of(data: bytes) -> int | None:
    if len(data) < _HEADER.size or data[:4] != MAGIC:
        return None
    writer: int = _HEADER.unpack_from(data)[4]
    return writer


def _parent(path: str) -> str:
    parent = path.rsplit(SEPARATOR, 1)[0]
    return parent or ROOT


@dataclass
class _Seen:
    """A znode as this write read it: ZooKeeper's version and child count (None: absent)."""

    zk_version: int | None
    children: int
    is_value: bool
    czxid: int = 0


class ZooKeeperMetadataStore(VersionedStore):
    """The contract of ``broker/metadata/store.py`` on a started kazoo client (see the module docstring)."""

    def __init__(self, client: KazooClient, clock: Callable[[], float] | None = None, *,
                 owns_client: bool = False) -> None:
        super().__init__(clock)
        self._client = client
        self._owns_client = owns_client
        self._seen: dict[str, _Seen] = {}
        self._counter_lock = threading.Lock()
        self._writer = int.from_bytes(os.urandom(8), "big")
        self._caches: dict[str, TreeCache] = {}
        self._cache_ready: dict[str, threading.Event] = {}
        self._own_deletes: OrderedDict[tuple[str, int, int], None] = OrderedDict()
        """(path, czxid, version) of znodes this object deleted or emptied: one znode's one state."""
        self._own_lock = threading.Lock()
        self._read_retry = KazooRetry(max_tries=5, delay=0.05, max_delay=1.0, ignore_expire=False)

    @classmethod
    def open(cls, spec: str, clock: Callable[[], float] | None = None) -> ZooKeeperMetadataStore:
        return cls(connect(spec), clock, owns_client=True)

    @property
    def client(self) -> KazooClient:
        return self._client

    # --- reads (no store lock: ZooKeeper orders them) ----------------------------------------------
    def get(self, path: str) -> Stat | None:
        valid = validate_path(path)
        with self._lock:
            self._check_open()
            self._gets += 1
        if valid == ROOT:
            return None
        data = self._read(valid)
        return None if data is None else _decode(valid, data[0])

    def children(self, path: str) -> list[str]:
        valid = validate_path(path)
        with self._lock:
            self._check_open()
        return self._list_children(valid)

    def _list_children(self, path: str) -> list[str]:
        try:
            names: list[str] = self._read_retry(self._client.get_children, path)
        except NoNodeError:
            return []
        except KazooException as exc:
            raise MetadataStoreUnavailable(f"metadata read of {path} failed: {exc!r}") from exc
        return sorted(names)

    def _read(self, path: str) -> tuple[bytes, Any] | None:
        try:
            data, zstat = self._read_retry(self._client.get, path)
        except NoNodeError:
            return None
        except KazooException as exc:
            raise MetadataStoreUnavailable(f"metadata read of {path} failed: {exc!r}") from exc
        return data, zstat

    # --- the primitives the shared contract is built on (called under the store lock) ----------------
    def _load(self, path: str) -> Stat | None:
        found = self._read(path)
        if found is None:
            self._seen[path] = _Seen(None, 0, False)
            return None
        data, zstat = found
        stat = _decode(path, data)
        self._seen[path] = _Seen(zstat.version, zstat.numChildren, stat is not None, zstat.czxid)
        return stat

    def _commit(self, changes: Mapping[str, Stat | None], durable: bool) -> None:
        transaction = self._client.transaction()
        deleted: list[str] = []
        ensured: set[str] = set()
        for path, stat in changes.items():
            seen = self._seen[path]
            if stat is not None:
                if seen.zk_version is None:
                    self._ensure_parent(path, ensured)
                    transaction.create(path, _encode(stat, self._writer))
                else:
                    transaction.set_data(path, _encode(stat, self._writer), version=seen.zk_version)
            elif seen.children:
                assert seen.zk_version is not None
                self._expect_echo(path, seen.czxid, seen.zk_version + 1)
                transaction.set_data(path, b"", version=seen.zk_version)  # keeps its children
            else:
                assert seen.zk_version is not None
                self._expect_echo(path, seen.czxid, seen.zk_version)
                transaction.delete(path, version=seen.zk_version)
                deleted.append(path)
        self._run(transaction)
        self._prune(deleted)

    def _child_names(self, path: str) -> list[str]:
        return self._list_children(path)

    def _subtree(self, path: str) -> list[str]:
        return [node for node, is_value, _, _ in self._walk(path) if is_value]

    def _close_backend(self) -> None:
        for cache in self._caches.values():
            cache.close()
        self._caches.clear()
        self._cache_ready.clear()
        if self._owns_client:
            self._client.stop()
            self._client.close()

    # --- writes ---------------------------------------------------------------------------------
    def transaction(self, ops: Any, *, durable: bool = True) -> list[Stat | None]:
        for _ in range(ZK_CONFLICT_RETRIES_MAX):
            self._seen.clear()
            try:
                return super().transaction(ops, durable=durable)
            except _Conflict:
                continue
        raise MetadataStoreUnavailable("metadata write kept conflicting with other clients")

    def delete_recursive(self, path: str) -> int:
        valid = validate_path(path)
        for _ in range(ZK_CONFLICT_RETRIES_MAX):
            with self._lock:
                self._check_open()
                nodes = self._walk(valid)
                if valid == ROOT:
                    nodes = [n for n in nodes if n[0] != ROOT]
                nodes.sort(key=lambda n: n[0].count(SEPARATOR), reverse=True)  # leaves first
                try:
                    self._delete_nodes(nodes)
                except _Conflict:
                    continue
                doomed = sorted((node for node, is_value, _, _ in nodes if is_value), reverse=True)
                self._deletes += len(doomed)
                self._pending.extend(Notification(NotificationType.DELETED, p) for p in doomed)
            if valid != ROOT:
                self._prune([valid])
            self._deliver()
            return len(doomed)
        raise MetadataStoreUnavailable(f"recursive delete of {valid} kept conflicting with other clients")

    def _delete_nodes(self, nodes: list[tuple[str, bool, int, int]]) -> None:
        for start in range(0, len(nodes), ZK_MULTI_OPS_MAX):
            transaction = self._client.transaction()
            for node, _, zk_version, czxid in nodes[start : start + ZK_MULTI_OPS_MAX]:
                self._expect_echo(node, czxid, zk_version)
                transaction.delete(node, version=zk_version)
            self._run(transaction)

    def _walk(self, path: str) -> list[tuple[str, bool, int, int]]:
        """Every znode at and below ``path``: (path, holds a value, ZooKeeper version, czxid)."""
        found: list[tuple[str, bool, int, int]] = []
        stack = [path]
        while stack:
            node = stack.pop()
            read = self._read(node)
            if read is None:
                continue
            data, zstat = read
            found.append((node, _decode(node, data) is not None, zstat.version, zstat.czxid))
            base = SEPARATOR if node == ROOT else node + SEPARATOR
            stack.extend(base + child for child in self._list_children(node))
        return found

    def _ensure_parent(self, path: str, ensured: set[str]) -> None:
        parent = _parent(path)
        if parent == ROOT or parent in ensured:
            return
        try:
            self._client.ensure_path(parent)
            ensured.add(parent)
        except KazooException as exc:
            raise MetadataStoreUnavailable(f"could not create the parents of {path}: {exc!r}") from exc

    def _run(self, transaction: Any) -> None:
        try:
            results = transaction.commit()
        except KazooException as exc:
            raise MetadataStoreUnavailable(f"metadata write failed: {exc!r}") from exc
        failures = [r for r in results
                    if isinstance(r, Exception) and not isinstance(r, RolledBackError | RuntimeInconsistency)]
        if not failures:
            return
        if all(isinstance(f, BadVersionError | NoNodeError | NodeExistsError | NotEmptyError) for f in failures):
            raise _Conflict()
        raise MetadataStoreUnavailable(f"metadata write failed: {failures[0]!r}")

    def _prune(self, deleted: list[str]) -> None:
        """Remove placeholders that the deletes left without children (best effort: a
        placeholder that gained a child or a value meanwhile stays)."""
        for path in deleted:
            parent = _parent(path)
            while parent != ROOT:
                read = self._read(parent)
                if read is None or _decode(parent, read[0]) is not None or read[1].numChildren:
                    break
                try:
                    self._client.delete(parent, version=read[1].version)
                except (NotEmptyError, BadVersionError, NoNodeError):
                    break
                except KazooException:
                    return
                parent = _parent(parent)

    # --- ledger ids ---------------------------------------------------------------------------------
    def ledger_id_generator(self) -> Callable[[], int]:
        """Ledger ids from a counter znode (``/ledgers/idgen``, decimal text as kazoo's ``Counter``
        writes it), incremented by compare-and-set: unique across every broker of the cluster.
        A conflict means another broker took an id meanwhile, so it is retried (with jittered
        backoff, up to ``LEDGER_ID_CAS_TRIES_MAX`` times) rather than failed, however many
        brokers allocate at once."""
        client = self._client
        retry = KazooRetry(max_tries=LEDGER_ID_CAS_TRIES_MAX, delay=0.002, backoff=1.5, max_delay=0.1,
                           max_jitter=0.5)

        def increment() -> int:
            try:
                data, stat = client.get(LEDGER_ID_COUNTER_PATH)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    client.create(LEDGER_ID_COUNTER_PATH, b"0", makepath=True)
                raise ForceRetryError() from None
            value = int(data.decode("ascii") or "0") + 1
            try:
                client.set(LEDGER_ID_COUNTER_PATH, str(value).encode("ascii"), version=stat.version)
            except BadVersionError:
                raise ForceRetryError() from None
            return value

        def next_id() -> int:
            with self._counter_lock:
                try:
                    value: int = retry.copy()(increment)
                except (KazooException, RetryFailedError) as exc:
                    raise MetadataStoreUnavailable(f"could not allocate a ledger id: {exc!r}") from exc
                return value

        return next_id

    # --- other clients' changes, through kazoo's TreeCache ---------------------------------------
    def watch(self, prefix: str, callback: WatchCallback) -> Watch:
        """As every store's watch, and other clients' changes too: it returns once the prefix's
        ``TreeCache`` has loaded what exists, so every change made after it returns is reported
        (a change during the load would otherwise read as part of the initial state)."""
        handle = super().watch(prefix, callback)
        failure: KazooException | None = None
        with self._lock:
            initialized = self._cache_ready.get(handle.prefix)
            if initialized is None:
                cache = TreeCache(self._client, handle.prefix)
                self._caches[handle.prefix] = cache
                initialized = self._cache_ready[handle.prefix] = threading.Event()
                cache.listen(lambda event, p=handle.prefix, ready=initialized: self._on_tree_event(p, ready, event))
                try:
                    cache.start()
                except KazooException as exc:
                    failure = exc
        if failure is not None:
            self._remove_watch(handle)
            raise MetadataStoreUnavailable(f"cannot watch {handle.prefix}: {failure!r}") from failure
        if not initialized.wait(ZK_WATCH_LOAD_TIMEOUT_S):
            self._remove_watch(handle)
            raise MetadataStoreUnavailable(f"watching {handle.prefix}: ZooKeeper did not load it within "
                                           f"{ZK_WATCH_LOAD_TIMEOUT_S:.0f} s")
        return handle

    def _remove_watch(self, handle: Watch) -> None:
        super()._remove_watch(handle)
        with self._lock:
            if not any(w.prefix == handle.prefix for w in self._watches):
                cache = self._caches.pop(handle.prefix, None)
                self._cache_ready.pop(handle.prefix, None)
                if cache is not None:
                    cache.close()

    def _expect_echo(self, path: str, czxid: int, zk_version: int) -> None:
        with self._own_lock:
            self._own_deletes[(path, czxid, zk_version)] = None
            while len(self._own_deletes) > OWN_DELETES_REMEMBERED_MAX:
                self._own_deletes.popitem(last=False)

    def _is_echo(self, path: str, czxid: int, zk_version: int | None) -> bool:
        """Whether this object deleted (or emptied, at ``zk_version``) the znode incarnation
        ``czxid``; ``zk_version`` None: at any version (a removal is reported with the last
        state the cache had read, which may be older than the one deleted)."""
        with self._own_lock:
            if zk_version is not None:
                return (path, czxid, zk_version) in self._own_deletes
            return any(p == path and c == czxid for p, c, _ in reversed(self._own_deletes))

    def _on_tree_event(self, prefix: str, initialized: threading.Event, event: Any) -> None:
        """A ``TreeCache`` event (on its own thread): a notification for another client's change."""
        if event.event_type == TreeEvent.INITIALIZED:
            initialized.set()
            return
        data = event.event_data
        if not initialized.is_set() or data is None:
            return  # the cache's initial load, or a connection event
        kind = self._remote_change(data.path, data.data or b"", data.stat, event.event_type)
        if kind is None:
            return
        notification = Notification(kind, data.path)
        with self._lock:
            targets = [w for w in self._watches if w.prefix == prefix and w.matches(data.path)]
        with self._delivery_lock:
            for handle in targets:
                call_safely(handle, notification)

    def _remote_change(self, path: str, data: bytes, zstat: Any, event_type: int) -> NotificationType | None:
        stat = _decode(path, data)
        removed = event_type == TreeEvent.NODE_REMOVED
        own = self._is_echo(path, zstat.czxid, None if removed else zstat.version)
        if removed:
            if stat is None or own:
                return None
            return NotificationType.DELETED
        if stat is None:  # a placeholder: a value deleted under its children, or a new parent
            if event_type == TreeEvent.NODE_UPDATED and not own:
                return NotificationType.DELETED
            return None
        if _writer_of(data) == self._writer:
            return None
        return NotificationType.CREATED if stat.version == 0 else NotificationType.MODIFIED
