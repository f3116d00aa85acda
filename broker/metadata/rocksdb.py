"""The embedded metadata store: the contract of ``broker/metadata/store.py`` in one RocksDB.

Role: what ``magnetar standalone`` keeps its metadata in (``<data dir>/metadata``). A node is one
key: ``N`` then the path's segments, each preceded by a NUL byte (``node_key``), so a node's
subtree is one contiguous key range; its value is a small header (format, version, created and
modified times) then the node's bytes.

Invariant: every write is one atomic ``WriteBatch``, synced before the call returns unless the
caller asked for ``durable=False``; once a durable call returns, its change survives ``kill -9``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping

from rocksdict import WriteBatch

from broker.errors import CorruptEntry
from broker.metadata.store import ROOT, SEPARATOR, Stat, VersionedStore
from storage import as_storage_error, open_rdict, write_durably

_NODE_PREFIX = b"N"
_KEY_SEPARATOR = b"\x00"
_AFTER_SEPARATOR = b"\x01"
_VALUE_FORMAT = 1
_VALUE_HEADER = struct.Struct(">Bqqq")  # format, version, created_ms, modified_ms


def node_key(path: str) -> bytes:
    """RocksDB key of a node: ``N`` then each segment preceded by a NUL byte.

    NUL sorts before every byte a segment may hold, so a node's descendants sort right after it
    and before its next sibling, and siblings sort by name. ``children`` is then a prefix scan
    that seeks past each child's subtree, and a subtree is one contiguous key range. The root
    maps to the bare prefix ``N`` and is never stored.
    """
    if path == ROOT:
        return _NODE_PREFIX
    return _NODE_PREFIX + path.encode("utf-8").replace(SEPARATOR.encode(), _KEY_SEPARATOR)


def path_of_key(key: bytes) -> str:
    return key[len(_NODE_PREFIX) :].replace(_KEY_SEPARATOR, SEPARATOR.encode()).decode("utf-8")


def encode_node(stat: Stat) -> bytes:
    return _VALUE_HEADER.pack(_VALUE_FORMAT, stat.version, stat.created_ms, stat.modified_ms) + stat.value


def decode_node(path: str, raw: bytes) -> Stat:
    if len(raw) < _VALUE_HEADER.size or raw[0] != _VALUE_FORMAT:
        raise CorruptEntry(f"metadata node {path} has an unreadable record")
    _, version, created_ms, modified_ms = _VALUE_HEADER.unpack_from(raw)
    return Stat(path, raw[_VALUE_HEADER.size :], version, created_ms, modified_ms)


class RocksDBMetadataStore(VersionedStore):
    """The embedded default: one RocksDB (rocksdict, raw mode) directory at ``path``.

    Every commit is one ``WriteBatch`` with its write-ahead log synced (``write_durably``):
    atomic, and durable when the call returns. RocksDB's failures (reported by rocksdict as
    plain ``Exception``s) become the storage's errors: ``StorageFull`` on a full disk,
    ``StorageBusy`` when out of descriptors, ``StorageIOError`` otherwise; nothing is written.
    """

    def __init__(self, path: str, clock: Callable[[], float] | None = None) -> None:
        super().__init__(clock)
        self.path = path
        self._db = open_rdict(path)

    def _load(self, path: str) -> Stat | None:
        try:
            raw = self._db.get(node_key(path))
        except Exception as exc:  # rocksdict: RocksDB's status as a plain Exception
            raise as_storage_error(exc, f"reading {path} from the metadata store") from exc
        return None if raw is None else decode_node(path, raw)

    def _commit(self, changes: Mapping[str, Stat | None], durable: bool) -> None:
        batch = WriteBatch(raw_mode=True)
        for path, stat in changes.items():
            if stat is None:
                batch.delete(node_key(path))
            else:
                batch.put(node_key(path), encode_node(stat))
        try:
            if durable:
                write_durably(self._db, batch)
            else:
                self._db.write(batch)
        except Exception as exc:  # rocksdict: RocksDB's status as a plain Exception
            raise as_storage_error(exc, "writing the metadata store") from exc

    def _child_names(self, path: str) -> list[str]:
        prefix = node_key(path) + _KEY_SEPARATOR
        names: list[str] = []
        it = self._db.iter()
        try:
            it.seek(prefix)
            while it.valid():
                key: bytes = it.key()
                if not key.startswith(prefix):
                    break
                segment = key[len(prefix) :].split(_KEY_SEPARATOR, 1)[0]
                names.append(segment.decode("utf-8"))
                it.seek(prefix + segment + _AFTER_SEPARATOR)  # skip the child's whole subtree
        finally:
            del it
        return names

    def _subtree(self, path: str) -> list[str]:
        found = [] if path == ROOT or self._load(path) is None else [path]
        found.extend(path_of_key(key) for key in self._keys_with_prefix(node_key(path) + _KEY_SEPARATOR))
        return found

    def _keys_with_prefix(self, prefix: bytes) -> Iterator[bytes]:
        it = self._db.iter()
        try:
            it.seek(prefix)
            while it.valid():
                key: bytes = it.key()
                if not key.startswith(prefix):
                    return
                yield key
                it.next()
        finally:
            del it

    def _close_backend(self) -> None:
        self._db.close()
