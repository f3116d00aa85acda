"""The bundles this broker owns, through ephemeral ownership nodes (Pulsar's ``OwnershipCache``).

Role: a broker owns a namespace bundle (``bundles.py``) while its ZooKeeper session holds the
ephemeral node ``/namespace/{tenant}/{ns}/0xLLLLLLLL_0xUUUUUUUU``, with Pulsar's
``NamespaceEphemeralData`` keys (``httpUrl``, ``nativeUrl``, ``advertisedListeners``, ``disabled``). Creating the node
is the election: of two brokers that try, one gets it. This cache holds the nodes this broker
created, in memory, so that "do I serve this topic?" is answered without ZooKeeper; the
ownership manager (``ownership.py``) decides when to take, adopt, disable and give them up.

Invariants: a bundle is in the cache only while this broker's current session holds its node;
an ownership node is kept only after re-reading the namespace's boundaries (a split in between
makes the acquisition give the node back), so two brokers never own overlapping ranges; a
bundle being released is never adopted back meanwhile; every ZooKeeper call is bounded
(``bounded_zookeeper.py``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from broker.errors import ServiceUnitNotReady
from broker.namespace.bounded_zookeeper import BoundedZooKeeper
from broker.namespace.bundles import Bundle, NamespaceBundles
from broker.namespace.lookup import BrokerAddress, listeners_of
from broker.topic_name import TopicName

log = logging.getLogger(__name__)

OWNERSHIP_ROOT = "/namespace"


class OwnershipCache:
    """The ownership nodes of this broker's bundles, and reads of other brokers' nodes."""

    def __init__(self, client: Any, address: BrokerAddress, bundles: Callable[[str], NamespaceBundles]) -> None:
        self._client = client
        self._zk = BoundedZooKeeper(client)
        self.address = address
        self._bundles = bundles
        """A namespace's current bundles (read again before a node is kept)."""
        self._lock = threading.RLock()
        self._owned: dict[Bundle, str] = {}  # bundle -> ownership znode path
        self._releasing: set[Bundle] = set()
        self.acquired = 0

    # --- what this broker owns ----------------------------------------------------------------
    def holds(self, bundle: Bundle) -> bool:
        with self._lock:
            return bundle in self._owned

    def owns(self, topic: TopicName) -> bool:
        """Whether a bundle held here contains ``topic``."""
        with self._lock:
            return any(bundle.contains_topic(topic) for bundle in self._owned)

    def owned_bundles(self) -> list[Bundle]:
        with self._lock:
            return sorted(self._owned)

    def count(self) -> int:
        with self._lock:
            return len(self._owned)

    def snapshot(self, *, forget: bool = False) -> list[Bundle]:
        """The bundles held now; with ``forget`` they are no longer held (the session is lost:
        its nodes are gone)."""
        with self._lock:
            bundles = list(self._owned)
            if forget:
                self._owned.clear()
        return bundles

    def forget_all(self) -> dict[Bundle, str]:
        """Hold nothing any more; the nodes that were held, for the caller to delete."""
        with self._lock:
            owned, self._owned = dict(self._owned), {}
        return owned

    def keep_session_nodes(self) -> None:
        """After a reconnection: keep the bundles whose nodes this session still holds (a
        session that survived), forget the others."""
        session = self._client.client_id[0]
        with self._lock:
            for bundle, path in list(self._owned.items()):
                stat = self._zk.exists(path)
                if stat is None or stat.ephemeralOwner != session:
                    del self._owned[bundle]

    # --- ownership nodes ------------------------------------------------------------------------
    @staticmethod
    def _owner_path(bundle: Bundle) -> str:
        return f"{OWNERSHIP_ROOT}/{bundle.key}"

    def _ownership_data(self) -> bytes:
        return json.dumps({"brokerId": self.address.broker_id, "httpUrl": self.address.web_service_url,
                           "nativeUrl": self.address.pulsar_service_url, "httpUrlTls": None,
                           "nativeUrlTls": self.address.pulsar_service_url_tls or None,
                           "advertisedListeners": self.address.listeners_json(),
                           "disabled": False}, sort_keys=True).encode()

    def read_owner(self, bundle: Bundle) -> BrokerAddress | None:
        """The broker whose node owns ``bundle`` (None: nobody); ``ServiceUnitNotReady`` while
        its owner is unloading it or ZooKeeper cannot be read."""
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
                             str(obj.get("nativeUrlTls") or ""), listeners_of(obj.get("advertisedListeners")))

    def try_acquire(self, bundle: Bundle) -> bool:
        """Create the ownership node; True once this broker holds ``bundle`` (False: someone
        else was faster, or the boundaries changed)."""
        path = self._owner_path(bundle)
        with self._lock:
            try:
                self._zk.create(path, self._ownership_data(), ephemeral=True, makepath=True)
            except NodeExistsError:
                return False
            except KazooException as exc:
                raise ServiceUnitNotReady(f"cannot take {bundle.key}: {exc!r}") from exc
            if bundle not in self._bundles(bundle.namespace).bundles:  # split meanwhile: give it back
                self._zk.delete_quietly(path)
                return False
            self._owned[bundle] = path
            self.acquired += 1
        return True

    def adopt(self, bundle: Bundle) -> bool:
        """The node names this broker: keep it if this session created it (a suspended session
        that survived), else wait for the old session's node to go."""
        path = self._owner_path(bundle)
        with self._lock:
            releasing = bundle in self._releasing
        stat = None if releasing else self._zk.exists(path)
        if stat is not None and stat.ephemeralOwner == self._client.client_id[0] and \
                bundle in self._bundles(bundle.namespace).bundles:
            with self._lock:
                self._owned[bundle] = path
            return True
        time.sleep(0.05)
        return False

    def begin_release(self, bundle: Bundle) -> str | None:
        """Stop holding ``bundle`` and mark it being released (not adopted back until
        :meth:`end_release`); its node's path, None when it was not held."""
        with self._lock:
            path = self._owned.pop(bundle, None)
            self._releasing.add(bundle)
        return path

    def begin_release_held(self, bundle: Bundle) -> str:
        """:meth:`begin_release` of a bundle the caller saw held: ``KeyError``, nothing marked,
        when it no longer is."""
        with self._lock:
            path = self._owned.pop(bundle)
            self._releasing.add(bundle)
        return path

    def end_release(self, bundle: Bundle) -> None:
        with self._lock:
            self._releasing.discard(bundle)

    def disable(self, bundle: Bundle) -> None:
        """Mark the ownership node ``disabled`` (Pulsar's flag for a bundle being unloaded):
        lookups answer 'not ready' until the node is gone, instead of sending clients here."""
        data = json.loads(self._ownership_data())
        data["disabled"] = True
        try:
            self._zk.set(self._owner_path(bundle), json.dumps(data, sort_keys=True).encode())
        except KazooException:
            log.warning("could not mark %s disabled", bundle.key)

    def delete(self, path: str) -> None:
        """Delete a node that was held (failures logged: the session's end removes it)."""
        self._zk.delete_quietly(path)
