"""Names as Pulsar spells them, checked in one place: tenants, namespaces, topics, subscriptions.

A topic is ``persistent://tenant/namespace/topic[-partition-N]`` or, for Pulsar's in-memory
at-most-once topics (``broker/non_persistent_topic.py``), ``non-persistent://…``; a short name
``my-topic`` means ``persistent://public/default/my-topic`` and ``t/ns/my-topic`` means
``persistent://t/ns/my-topic``. The managed ledger of a (persistent) topic is named
``tenant/namespace/persistent/topic``. Every message about a topic prints its full name.

The rule (``NAME_RULE``), for every name part and for subscription names: 1 to
``NAME_BYTES_MAX`` bytes (256 for a subscription) of ASCII letters, digits and ``- _ = : .``, and
not ``.`` or ``..`` (Pulsar's ``NamedEntity`` rule; Java's ``\\w`` is ASCII); a full topic name
is at most ``NAME_BYTES_MAX`` bytes. A partition suffix is
``-partition-`` and ASCII digits. Invalid names raise ``InvalidRequest`` whose text states the
rule, so a client never sees an internal path or a parser's message instead.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from broker.errors import InvalidRequest
from broker.limits import NAME_BYTES_MAX, PARTITION_INDEX_MAX, SUBSCRIPTION_NAME_BYTES_MAX

_NAME = re.compile(r"[-=:.A-Za-z0-9_]+")
PARTITION_SUFFIX = "-partition-"
DOMAINS = ("persistent", "non-persistent")
NAME_RULE = "1 to {limit} ASCII letters, digits and - _ = : . (not '.' or '..')"


def check_name(kind: str, value: str, limit: int = NAME_BYTES_MAX) -> str:
    """``value`` if it is a valid name part (tenant, namespace, topic, subscription)."""
    if not isinstance(value, str) or len(value) > limit or not _NAME.fullmatch(value) or value in (".", ".."):
        shown = value[:80] + "…" if isinstance(value, str) and len(value) > 80 else value
        raise InvalidRequest(f"invalid {kind} name {shown!r}: use {NAME_RULE.format(limit=limit)}", field=kind)
    return value


def check_subscription_name(name: str) -> str:
    return check_name("subscription", name, SUBSCRIPTION_NAME_BYTES_MAX)


def check_namespace(namespace: str) -> tuple[str, str]:
    """``tenant/namespace`` split and checked."""
    parts = namespace.split("/") if isinstance(namespace, str) else []
    if len(parts) != 2:
        raise InvalidRequest(f"invalid namespace {namespace!r}: expected tenant/namespace", field="namespace")
    return check_name("tenant", parts[0]), check_name("namespace", parts[1])


@dataclass(frozen=True, order=True)
class TopicName:
    tenant: str
    namespace: str
    local_name: str
    domain: str = "persistent"

    @classmethod
    def parse(cls, name: str) -> TopicName:
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"invalid topic name {name!r}: expected persistent://tenant/namespace/topic",
                                 field="topic")
        domain, rest = "persistent", name
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain not in DOMAINS:
                raise InvalidRequest(f"invalid topic name {name[:200]!r}: a topic is persistent:// or "
                                     "non-persistent://", field="topic")
        parts = rest.split("/")
        if len(parts) == 1:
            parts = ["public", "default", parts[0]]
        if len(parts) != 3:
            raise InvalidRequest(f"invalid topic name {name[:200]!r}: expected persistent://tenant/namespace/topic",
                                 field="topic")
        return cls.of(parts[0], parts[1], parts[2], domain)

    @classmethod
    def of(cls, tenant: str, namespace: str, local_name: str, domain: str = "persistent") -> TopicName:
        name = cls(check_name("tenant", tenant), check_name("namespace", namespace), check_name("topic", local_name),
                   domain)
        if len(name.full_name) > NAME_BYTES_MAX:
            raise InvalidRequest(f"invalid topic name {name.full_name[:80]!r}…: a full topic name is at most "
                                 f"{NAME_BYTES_MAX} bytes", field="topic")
        name.partition_index  # noqa: B018 - a malformed partition suffix fails here, not later
        return name

    @property
    def persistent(self) -> bool:
        return self.domain == "persistent"

    @property
    def full_name(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def managed_ledger_name(self) -> str:
        return f"{self.tenant}/{self.namespace}/{self.domain}/{self.local_name}"

    @functools.cached_property
    def partition_index(self) -> int:
        """The partition number of ``-partition-N`` names (ASCII digits), else -1 (computed
        once: every publish asks)."""
        head, sep, tail = self.local_name.rpartition(PARTITION_SUFFIX)
        if not (sep and head and tail.isascii() and tail.isdigit()):
            return -1
        index = int(tail)
        if index > PARTITION_INDEX_MAX:
            raise InvalidRequest(f"invalid topic name {self.local_name!r}: partition {index} is over "
                                 f"{PARTITION_INDEX_MAX}", field="topic")
        return index

    @functools.cached_property
    def base(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself when not a partition)."""
        if self.partition_index < 0:
            return self
        return TopicName(self.tenant, self.namespace, self.local_name.rpartition(PARTITION_SUFFIX)[0], self.domain)

    def partition(self, index: int) -> TopicName:
        return TopicName(self.tenant, self.namespace, f"{self.base.local_name}{PARTITION_SUFFIX}{index}", self.domain)

    def __str__(self) -> str:
        return self.full_name


def display_name(managed_ledger_name: str) -> str:
    """The topic a managed ledger holds, as users spell it (``tenant/ns/persistent/t`` →
    ``persistent://tenant/ns/t``); other names are returned as they are."""
    parts = managed_ledger_name.split("/")
    if len(parts) == 4:
        return f"{parts[2]}://{parts[0]}/{parts[1]}/{parts[3]}"
    return managed_ledger_name
