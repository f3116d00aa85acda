"""The kazoo calls of bundle ownership and load reports, each bounded in time.

Role: ``ownership_cache.py`` and ``load_manager.py`` talk to ZooKeeper only through
``BoundedZooKeeper``. kazoo would queue a call forever while it cannot reach ZooKeeper; here
each waits at most ``ZK_CALL_TIMEOUT_S``, so a broker cut off answers 'not ready' and still
shuts down.

Invariant: every call returns or raises within ``ZK_CALL_TIMEOUT_S``; a timeout is kazoo's
``OperationTimeoutError``, a ``KazooException`` like every other failure.
"""

from __future__ import annotations

import logging
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError, OperationTimeoutError
from kazoo.handlers.threading import KazooTimeoutError

from broker.limits import ZK_CALL_TIMEOUT_S

log = logging.getLogger(__name__)


class BoundedZooKeeper:
    """A kazoo client's calls, each bounded by ``ZK_CALL_TIMEOUT_S``."""

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

    def delete_quietly(self, path: str) -> None:
        """Delete ``path`` if it is there; a failure is logged (an ephemeral node goes with the
        session anyway)."""
        try:
            self.delete(path)
        except NoNodeError:
            pass
        except KazooException:
            log.warning("could not delete %s; the session's end removes it if ephemeral", path)
