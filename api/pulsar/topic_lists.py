"""A namespace's topic list on the binary protocol: GET_TOPICS_OF_NAMESPACE and topic-list watches.

Role: pattern (regex) consumers find their topics here. GET_TOPICS_OF_NAMESPACE lists the
namespace's topics of its mode (PERSISTENT: the stored topics; NON_PERSISTENT: the live
non-persistent ones, ``broker/non_persistent_topic.py``; ALL: both), a partitioned topic as
its partitions; with a
``topics_pattern`` the list is filtered and says so, with Pulsar's ``topics_hash``.
WATCH_TOPIC_LIST (clients use it when CONNECTED advertises ``supports_topic_watchers``)
answers the matching persistent topics, then sends WATCH_TOPIC_UPDATE whenever a matching topic is
created or deleted, until WATCH_TOPIC_LIST_CLOSE or the end of the connection. Updates come
from the broker (``Subscriptions.watch_topics``) on whatever thread created the topic and are
handed to the event loop.

Matching is Pulsar's: the pattern and the topic name are compared without their
``persistent://`` or ``non-persistent://`` scheme, the whole name must match (RE2, so no pattern can stall the broker).
The hash is Pulsar's too (CRC32C of the sorted names, concatenated, as Guava prints it), so a
client comparing the hash of its list with the broker's sees the same value.

Invariants: listing and watching need the right to produce or consume in the namespace (or
tenant admin), checked before the namespace is looked up (``permissions.py``), and a watch ends
when its role loses that right (``revoked``); at most ``TOPIC_LIST_WATCHES_PER_CONNECTION_MAX`` watches
per connection and ``topic_list_watchers_per_role_max`` per role on the server (its share of
the broker's pool, ``shares.py``; more are refused with an error); a watch sends only changes
to the set it announced, each topic once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import crc32c

from api.limits import TOPIC_LIST_WATCHES_PER_CONNECTION_MAX
from api.pulsar import commands
from api.pulsar.context import ConnectionContext
from api.pulsar.proto import pulsar_api_pb2 as pb
from broker import InvalidRequest, MagnetarError, NotFound, TopicName, TopicPattern, check_namespace


def _without_scheme(name: str) -> str:
    """A topic name or pattern without its ``persistent://`` or ``non-persistent://`` scheme."""
    return name.split("://", 1)[1] if "://" in name else name


def topics_hash(topics: Iterable[str]) -> str:
    """Pulsar's ``TopicList.calculateHash``: CRC32C of the sorted names joined, as Guava's
    ``HashCode.toString`` prints it (the checksum's bytes little-endian, in hex)."""
    return crc32c.crc32c("".join(sorted(topics)).encode()).to_bytes(4, "little").hex()


def _pattern(namespace: str, text: str) -> TopicPattern:
    return TopicPattern(namespace, _without_scheme(text))


def _matching(pattern: TopicPattern, namespace: str, topics: Iterable[str]) -> list[str]:
    return sorted(t for t in topics if pattern.matches(namespace, _without_scheme(t)))


@dataclass
class _Watch:
    pattern: TopicPattern
    namespace: str
    topics: set[str] = field(default_factory=set)
    unwatch: Callable[[], None] | None = None


class TopicLists:
    """The topic-list requests and watches of one connection."""

    def __init__(self, context: ConnectionContext) -> None:
        self._context = context
        self._watches: dict[int, _Watch] = {}

    def __len__(self) -> int:
        return len(self._watches)

    def _namespace(self, text: str) -> str:
        """The namespace's name (its role's right to list it was checked: ``permissions.py``)."""
        namespace = "/".join(check_namespace(text))
        self._context.service.namespaces.policies(namespace)  # NotFound for an unknown namespace
        return namespace

    def _topics(self, namespace: str, mode: int = pb.CommandGetTopicsOfNamespace.PERSISTENT) -> list[str]:
        """The namespace's topics of ``mode``'s domains: the persistent ones stored, the
        non-persistent ones live now; a partitioned topic as its partitions."""
        service = self._context.service
        found: set[str] = set()
        domains: tuple[str, ...] = ("persistent", "non-persistent")  # ALL
        if mode == pb.CommandGetTopicsOfNamespace.PERSISTENT:
            domains = ("persistent",)
        elif mode == pb.CommandGetTopicsOfNamespace.NON_PERSISTENT:
            domains = ("non-persistent",)
        if "persistent" in domains:
            found.update(service.topics.names(namespace))
        if "non-persistent" in domains:
            found.update(service.topics.non_persistent.names(namespace))
        for domain in domains:
            for partitioned in service.topics.partitioned_names(namespace, domain):
                found.update(p.full_name for p in service.topics.expand_partitions(TopicName.parse(partitioned)))
        return sorted(found)

    # --- GET_TOPICS_OF_NAMESPACE -------------------------------------------------------------
    def get(self, request: pb.CommandGetTopicsOfNamespace) -> None:
        out = self._context.out
        try:
            namespace = self._namespace(request.namespace)
            topics = self._topics(namespace, request.mode)
            filtered = request.HasField("topics_pattern")
            if filtered:
                topics = _matching(_pattern(namespace, request.topics_pattern), namespace, topics)
        except MagnetarError as exc:
            out.write([commands.error(request.request_id, exc)])
            return
        digest = topics_hash(topics)
        changed = not request.HasField("topics_hash") or request.topics_hash != digest
        out.write([commands.topics_of_namespace(request.request_id, topics if changed else [], filtered=filtered,
                                                topics_hash=digest, changed=changed)])

    # --- WATCH_TOPIC_LIST ----------------------------------------------------------------
    def watch(self, request: pb.CommandWatchTopicList) -> None:
        out = self._context.out
        try:
            if request.watcher_id in self._watches:
                raise InvalidRequest(f"watcher id {request.watcher_id} is already in use on this connection")
            if len(self._watches) >= TOPIC_LIST_WATCHES_PER_CONNECTION_MAX:
                raise InvalidRequest(f"a connection may watch at most {TOPIC_LIST_WATCHES_PER_CONNECTION_MAX} "
                                     "topic lists")
            namespace = self._namespace(request.namespace)
            watch = _Watch(_pattern(namespace, request.topics_pattern), namespace)
            watch.topics.update(_matching(watch.pattern, namespace, self._topics(namespace)))
            self._follow(watch, request.watcher_id)
        except MagnetarError as exc:
            out.write([commands.error(request.request_id, exc)])
            return
        self._watches[request.watcher_id] = watch
        out.write([commands.watch_topic_list_success(request.request_id, request.watcher_id, sorted(watch.topics),
                                                     topics_hash(watch.topics))])

    def _follow(self, watch: _Watch, watcher_id: int) -> None:
        """Take the role's share of the pool, then follow the namespace's topics."""
        loop = self._context.loop
        role = self._context.counted_role
        shares = self._context.pools.topic_list_watches
        if role is not None:
            shares.take(role)

        def changed(topic: str, exists: bool) -> None:  # on the thread that created or deleted it
            loop.call_soon_threadsafe(self._changed, watcher_id, topic, exists)

        try:
            unwatch = self._context.service.subscriptions.watch_topics(watch.namespace, changed)
        except MagnetarError:
            if role is not None:
                shares.give_back(role)
            raise

        def end() -> None:
            unwatch()
            if role is not None:
                shares.give_back(role)

        watch.unwatch = end

    def _changed(self, watcher_id: int, topic: str, exists: bool) -> None:
        watch = self._watches.get(watcher_id)
        if watch is None or exists == (topic in watch.topics):
            return
        if not watch.pattern.matches(watch.namespace, _without_scheme(topic)):
            return
        if exists:
            watch.topics.add(topic)
        else:
            watch.topics.discard(topic)
        self._context.out.write([commands.watch_topic_update(watcher_id, [topic] if exists else [],
                                                             [] if exists else [topic], topics_hash(watch.topics))])

    def close(self, request: pb.CommandWatchTopicListClose) -> None:
        watch = self._watches.pop(request.watcher_id, None)
        if watch is None:
            self._context.out.write([commands.error(request.request_id, NotFound(
                f"watcher {request.watcher_id} is not open on this connection"))])
            return
        if watch.unwatch is not None:
            watch.unwatch()
        self._context.out.write([commands.success(request.request_id)])

    def namespaces(self) -> set[str]:
        """The namespaces this connection watches."""
        return {watch.namespace for watch in self._watches.values()}

    def revoked(self, namespaces: set[str]) -> None:
        """The role may no longer list these namespaces: their watches end (no more updates;
        the protocol has no command telling the client)."""
        for watcher_id in [i for i, w in self._watches.items() if w.namespace in namespaces]:
            watch = self._watches.pop(watcher_id)
            if watch.unwatch is not None:
                watch.unwatch()

    def close_all(self) -> None:
        for watch in self._watches.values():
            if watch.unwatch is not None:
                watch.unwatch()
        self._watches.clear()
