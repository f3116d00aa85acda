"""The in-memory metadata store: the contract of ``broker/metadata/store.py`` on a dict.

Role: the twin of ``RocksDBMetadataStore`` (``broker/metadata/rocksdb.py``) for unit tests and
simulations of the code above the store; it runs the same contract test suite.

Invariant: nothing is durable; closing it drops every node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from broker.metadata.store import Stat, VersionedStore, child_name, is_under


class InMemoryMetadataStore(VersionedStore):
    """A dict of path → Stat with the full contract (not durable); for tests of code above it."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        super().__init__(clock)
        self._nodes: dict[str, Stat] = {}

    def _load(self, path: str) -> Stat | None:
        return self._nodes.get(path)

    def _commit(self, changes: Mapping[str, Stat | None], durable: bool) -> None:
        for path, stat in changes.items():
            if stat is None:
                self._nodes.pop(path, None)
            else:
                self._nodes[path] = stat

    def _child_names(self, path: str) -> list[str]:
        names = {child_name(path, node) for node in self._nodes}
        return sorted(name for name in names if name is not None)

    def _subtree(self, path: str) -> list[str]:
        return [node for node in self._nodes if is_under(node, path)]

    def _close_backend(self) -> None:
        self._nodes.clear()


