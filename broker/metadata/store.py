"""The broker's metadata store: versioned values at hierarchical paths (Pulsar/ZooKeeper-like).

Role: every piece of broker state that must survive a restart (topics, ledger lists of managed
ledgers, cursor snapshots, ...) is written through a ``MetadataStore``; nothing lives only in
memory. This module holds the interface, its values (``Stat``, the ops, the notifications), the
path rules and ``VersionedStore``, the contract built once on four storage primitives that the
backends provide: ``RocksDBMetadataStore`` (``rocksdb.py``, the embedded default),
``InMemoryMetadataStore`` (``memory.py``, its twin for tests of the code above it) and
``ZooKeeperMetadataStore`` (``zookeeper.py``, a cluster's).

Contract (the same for every implementation, checked by one test suite):

* Paths are absolute and ``/``-separated: no empty, ``.`` or ``..`` segments, no trailing slash
  (except the root ``/``), no control characters, at most ``METADATA_PATH_BYTES_MAX`` bytes of UTF-8.
  Anything else raises ``InvalidRequest``.
* A node holds bytes and a ``version``: 0 when created, +1 on every put. Deleting a node and
  creating it again restarts at 0.
* ``put(path, value, expected_version)``: ``None`` writes unconditionally, ``-1`` only creates
  (``BadVersion`` if the node exists), ``n >= 0`` is a compare-and-set (``BadVersion`` if the node
  is missing or at another version) — Pulsar's ``MetadataStore`` semantics.
* ``delete``: ``NotFound`` if the node is missing, ``BadVersion`` on a version mismatch.
* Parents are implicit: ``/a/b/c`` may exist without ``/a`` or ``/a/b``. ``children("/a")``
  still lists ``b``; ``get``/``exists`` only see nodes that were put (the root never holds a
  value). Deleting a node leaves its descendants alone; ``delete_recursive`` removes a subtree.
* ``transaction(ops)`` applies puts and deletes, each with its own CAS, all or nothing; each op
  sees the effect of the ops before it.
* Writes are serialised by one lock (no lost update under concurrent CAS). In
  ``RocksDBMetadataStore`` every write is one atomic, synced ``WriteBatch``: once a call returns,
  its change survives ``kill -9``.
* Watches: ``watch(prefix, callback)`` calls ``callback(Notification)`` for each committed change
  of ``prefix`` or of any path below it. Notifications are delivered in commit order,
  synchronously after the commit and without the store lock held (callbacks may call the store),
  in the thread of a writer: when a write returns, the callbacks for its changes have run. A
  callback must therefore not block waiting for another thread's write. An exception raised by a
  callback is logged and swallowed; it never affects the store or the writer.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from broker.errors import AlreadyExists, BadVersion, InvalidRequest, NotFound, StorageClosed
from broker.limits import METADATA_PATH_BYTES_MAX, METADATA_VALUE_BYTES_MAX

log = logging.getLogger(__name__)

ROOT = "/"
SEPARATOR = "/"
CREATE_ONLY = -1
"""``expected_version`` meaning "the node must not exist yet"."""


# --- values -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """A node as read or written: its value and version, and when it was created / last modified."""

    path: str
    value: bytes
    version: int
    created_ms: int
    modified_ms: int


class NotificationType(StrEnum):
    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclass(frozen=True)
class Notification:
    type: NotificationType
    path: str


@dataclass(frozen=True)
class PutOp:
    """A transaction op: put ``value`` at ``path`` (``expected_version`` as in ``put``)."""

    path: str
    value: bytes
    expected_version: int | None = None


@dataclass(frozen=True)
class DeleteOp:
    """A transaction op: delete ``path`` (``expected_version`` as in ``delete``)."""

    path: str
    expected_version: int | None = None


Op = PutOp | DeleteOp
WatchCallback = Callable[[Notification], None]


@dataclass(frozen=True)
class MetadataStoreStats:
    gets: int
    puts: int
    deletes: int
    cas_failures: int
    watches: int


# --- path rules ---------------------------------------------------------------------------------


def validate_path(path: object) -> str:
    """Return ``path`` if it is a valid absolute path, else raise ``InvalidRequest``."""
    if not isinstance(path, str):
        raise InvalidRequest(f"metadata path must be a string, got {type(path).__name__}")
    if len(path.encode("utf-8", errors="replace")) > METADATA_PATH_BYTES_MAX:
        raise InvalidRequest(f"metadata path longer than {METADATA_PATH_BYTES_MAX} bytes")
    if not path.startswith(SEPARATOR):
        raise InvalidRequest(f"metadata path must be absolute: {path!r}")
    if path == ROOT:
        return path
    for segment in path[1:].split(SEPARATOR):
        if not segment:
            raise InvalidRequest(f"metadata path has an empty segment or a trailing slash: {path!r}")
        if segment in (".", ".."):
            raise InvalidRequest(f"metadata path has a relative segment: {path!r}")
    if _CONTROL_CHARACTER.search(path):
        raise InvalidRequest(f"metadata path has a control character: {path!r}")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"metadata path is not valid unicode: {path!r}") from exc
    return path


_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")


def _validated_node_path(path: object) -> str:
    """A path that may hold a value: valid and not the root."""
    valid = validate_path(path)
    if valid == ROOT:
        raise InvalidRequest("the root path holds no value")
    return valid


def _validated_expected_version(expected_version: object) -> int | None:
    if expected_version is None:
        return None
    if isinstance(expected_version, bool) or not isinstance(expected_version, int) or expected_version < CREATE_ONLY:
        raise InvalidRequest(f"expected_version must be None, -1 or >= 0, got {expected_version!r}")
    return expected_version


def _validated_value(value: object) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidRequest(f"metadata value must be bytes, got {type(value).__name__}")
    data = bytes(value)
    if len(data) > METADATA_VALUE_BYTES_MAX:
        raise InvalidRequest(f"metadata value larger than {METADATA_VALUE_BYTES_MAX} bytes")
    return data


def is_under(path: str, prefix: str) -> bool:
    """Whether ``path`` is ``prefix`` or lies below it (by whole segments, not characters)."""
    return prefix in (ROOT, path) or path.startswith(prefix + SEPARATOR)


def child_name(parent: str, path: str) -> str | None:
    """The segment right below ``parent`` on the way to ``path``, or None if not below it."""
    base = SEPARATOR if parent == ROOT else parent + SEPARATOR
    if not path.startswith(base) or path == base:
        return None
    return path[len(base) :].split(SEPARATOR, 1)[0]


# --- watches ------------------------------------------------------------------------------------


class Watch:
    """A registered watch; ``cancel()`` stops further notifications (idempotent)."""

    def __init__(self, prefix: str, callback: WatchCallback, on_cancel: Callable[[Watch], None]) -> None:
        self.prefix = prefix
        self.callback = callback
        self._on_cancel = on_cancel
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def matches(self, path: str) -> bool:
        return self._active and is_under(path, self.prefix)

    def cancel(self) -> None:
        if self._active:
            self._active = False
            self._on_cancel(self)


# --- the interface ------------------------------------------------------------------------------


class MetadataStore(ABC):
    """Versioned values at hierarchical paths; see the module docstring for the contract."""

    @abstractmethod
    def get(self, path: str) -> Stat | None:
        """The node at ``path``, or None if no value was put there."""

    @abstractmethod
    def put(self, path: str, value: bytes, expected_version: int | None = None, *, durable: bool = True) -> Stat:
        """Write ``value``; ``expected_version``: None = unconditional, -1 = create only, n = CAS.

        ``durable=False`` is for values the broker can rebuild (snapshots that only shorten a
        recovery): the write is atomic and survives a crash of the process, but is not synced to
        disk before the call returns, so a power failure may take it back to an older value."""

    @abstractmethod
    def delete(self, path: str, expected_version: int | None = None) -> None:
        """Delete one node (not its descendants). ``NotFound`` if missing, ``BadVersion`` on mismatch."""

    @abstractmethod
    def delete_recursive(self, path: str) -> int:
        """Atomically delete ``path`` and everything below it; returns the number of nodes deleted."""

    @abstractmethod
    def children(self, path: str) -> list[str]:
        """Sorted names of the immediate children of ``path`` (implicit parents included)."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a value was put at ``path`` (implicit parents do not exist)."""

    @abstractmethod
    def watch(self, prefix: str, callback: WatchCallback) -> Watch:
        """Call ``callback`` after each committed change of ``prefix`` or below it."""

    @abstractmethod
    def transaction(self, ops: Sequence[Op], *, durable: bool = True) -> list[Stat | None]:
        """Apply ``ops`` atomically, in order; per op a ``Stat`` (put) or None (delete).
        ``durable`` as for :meth:`put`."""

    @abstractmethod
    def statistics(self) -> MetadataStoreStats: ...

    @abstractmethod
    def close(self) -> None:
        """Release resources; later calls raise ``StorageClosed``. Idempotent."""

    # Helpers built on the primitives above.

    def create(self, path: str, value: bytes) -> Stat:
        """Create ``path``; unlike ``put(..., -1)`` an existing node raises ``AlreadyExists``."""
        try:
            return self.put(path, value, CREATE_ONLY)
        except BadVersion as exc:
            raise AlreadyExists(f"metadata node already exists: {path}") from exc

    def put_many(self, values: Mapping[str, bytes]) -> list[Stat]:
        """Unconditionally put several values atomically; Stats in the mapping's order."""
        results = self.transaction([PutOp(path, value) for path, value in values.items()])
        return [stat for stat in results if stat is not None]

    def get_json(self, path: str) -> tuple[dict[str, Any], int] | None:
        """The JSON object stored at ``path`` and its version, or None if missing."""
        stat = self.get(path)
        if stat is None:
            return None
        return decode_json(stat), stat.version

    def put_json(self, path: str, obj: Mapping[str, Any], expected_version: int | None = None) -> Stat:
        """Put ``obj`` as canonical JSON (sorted keys, compact) with ``put``'s CAS semantics."""
        return self.put(path, encode_json(obj), expected_version)

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def encode_json(obj: Mapping[str, Any]) -> bytes:
    if not isinstance(obj, Mapping):
        raise InvalidRequest(f"metadata JSON value must be an object, got {type(obj).__name__}")
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"metadata value is not JSON-serialisable: {exc}") from exc


def decode_json(stat: Stat) -> dict[str, Any]:
    try:
        obj = json.loads(stat.value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest(f"metadata node {stat.path} does not hold JSON") from exc
    if not isinstance(obj, dict):
        raise InvalidRequest(f"metadata node {stat.path} does not hold a JSON object")
    return obj


# --- shared semantics ---------------------------------------------------------------------------


class VersionedStore(MetadataStore):
    """The contract on top of four storage primitives, so every backend behaves the same.

    Subclasses provide ``_load`` (one node), ``_commit`` (apply path → Stat | None atomically and
    durably), ``_child_names`` and ``_subtree`` (node paths at or below a path). The lock covers
    every primitive call, which makes each CAS read-modify-write atomic.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock if clock is not None else time.time
        self._lock = threading.Lock()
        self._closed = False
        self._watches: list[Watch] = []
        self._pending: deque[Notification] = deque()
        self._delivery_lock = threading.RLock()
        self._gets = 0
        self._puts = 0
        self._deletes = 0
        self._cas_failures = 0

    # Primitives.

    @abstractmethod
    def _load(self, path: str) -> Stat | None: ...

    @abstractmethod
    def _commit(self, changes: Mapping[str, Stat | None], durable: bool) -> None: ...

    @abstractmethod
    def _child_names(self, path: str) -> list[str]: ...

    @abstractmethod
    def _subtree(self, path: str) -> list[str]: ...

    @abstractmethod
    def _close_backend(self) -> None: ...

    # Reads.

    def get(self, path: str) -> Stat | None:
        valid = validate_path(path)
        with self._lock:
            self._check_open()
            self._gets += 1
            return None if valid == ROOT else self._load(valid)

    def exists(self, path: str) -> bool:
        return self.get(path) is not None

    def children(self, path: str) -> list[str]:
        valid = validate_path(path)
        with self._lock:
            self._check_open()
            return self._child_names(valid)

    # Writes.

    def put(self, path: str, value: bytes, expected_version: int | None = None, *, durable: bool = True) -> Stat:
        stat = self.transaction([PutOp(path, value, expected_version)], durable=durable)[0]
        assert stat is not None
        return stat

    def delete(self, path: str, expected_version: int | None = None) -> None:
        self.transaction([DeleteOp(path, expected_version)])

    def delete_recursive(self, path: str) -> int:
        valid = validate_path(path)
        with self._lock:
            self._check_open()
            doomed = sorted(self._subtree(valid), reverse=True)  # descendants before ancestors
            if doomed:
                self._commit(dict.fromkeys(doomed), durable=True)
                self._deletes += len(doomed)
                self._pending.extend(Notification(NotificationType.DELETED, p) for p in doomed)
        self._deliver()
        return len(doomed)

    def transaction(self, ops: Sequence[Op], *, durable: bool = True) -> list[Stat | None]:
        checked = [_validated_op(op) for op in ops]
        with self._lock:
            self._check_open()
            changes, results, notifications = self._plan(checked)
            if changes:
                self._commit(changes, durable)
            self._count_applied(checked)
            self._pending.extend(notifications)
        self._deliver()
        return results

    def _plan(self, ops: Sequence[Op]) -> tuple[dict[str, Stat | None], list[Stat | None], list[Notification]]:
        """Check every op against the state left by the ops before it; raise before any write."""
        now_ms = int(self._clock() * 1000)
        changes: dict[str, Stat | None] = {}
        results: list[Stat | None] = []
        notifications: list[Notification] = []
        for op in ops:
            current = changes[op.path] if op.path in changes else self._load(op.path)
            new: Stat | None = None
            if isinstance(op, PutOp):
                new = self._planned_put(op, current, now_ms)
                kind = NotificationType.CREATED if current is None else NotificationType.MODIFIED
            else:
                self._check_delete(op, current)
                kind = NotificationType.DELETED
            changes[op.path] = new
            results.append(new)
            notifications.append(Notification(kind, op.path))
        return changes, results, notifications

    def _planned_put(self, op: PutOp, current: Stat | None, now_ms: int) -> Stat:
        if op.expected_version is not None:
            current_version = CREATE_ONLY if current is None else current.version
            if op.expected_version != current_version:
                self._cas_failures += 1
                raise BadVersion(
                    f"metadata put {op.path}: expected version {op.expected_version}, found {current_version}"
                )
        if current is None:
            return Stat(op.path, op.value, 0, now_ms, now_ms)
        return Stat(op.path, op.value, current.version + 1, current.created_ms, now_ms)

    def _check_delete(self, op: DeleteOp, current: Stat | None) -> None:
        if current is None:
            raise NotFound(f"metadata node not found: {op.path}")
        if op.expected_version is not None and op.expected_version != current.version:
            self._cas_failures += 1
            raise BadVersion(
                f"metadata delete {op.path}: expected version {op.expected_version}, found {current.version}"
            )

    def _count_applied(self, ops: Sequence[Op]) -> None:
        puts = sum(1 for op in ops if isinstance(op, PutOp))
        self._puts += puts
        self._deletes += len(ops) - puts

    # Watches.

    def watch(self, prefix: str, callback: WatchCallback) -> Watch:
        valid = validate_path(prefix)
        with self._lock:
            self._check_open()
            handle = Watch(valid, callback, self._remove_watch)
            self._watches.append(handle)
            return handle

    def _remove_watch(self, handle: Watch) -> None:
        with self._lock:
            if handle in self._watches:
                self._watches.remove(handle)

    def _deliver(self) -> None:
        """Run callbacks for every pending notification, in commit order, without the store lock."""
        with self._delivery_lock:
            while True:
                with self._lock:
                    if not self._pending:
                        return
                    notification = self._pending.popleft()
                    targets = [w for w in self._watches if w.matches(notification.path)]
                for handle in targets:
                    call_safely(handle, notification)

    # Lifecycle.

    def statistics(self) -> MetadataStoreStats:
        with self._lock:
            return MetadataStoreStats(self._gets, self._puts, self._deletes, self._cas_failures, len(self._watches))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._watches.clear()
            self._pending.clear()
            self._close_backend()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosed("metadata store is closed")


def _validated_op(op: Op) -> Op:
    if isinstance(op, PutOp):
        return PutOp(
            _validated_node_path(op.path), _validated_value(op.value), _validated_expected_version(op.expected_version)
        )
    if isinstance(op, DeleteOp):
        return DeleteOp(_validated_node_path(op.path), _validated_expected_version(op.expected_version))
    raise InvalidRequest(f"not a metadata op: {op!r}")


def call_safely(handle: Watch, notification: Notification) -> None:
    if not handle.active:
        return
    try:
        handle.callback(notification)
    except Exception:
        log.exception("metadata watch callback failed (prefix %s, %s)", handle.prefix, notification)
