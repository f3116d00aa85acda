"""Topic names as Pulsar spells them: ``persistent://tenant/namespace/topic[-partition-N]``.

A short name ``my-topic`` means ``persistent://public/default/my-topic``; ``t/ns/my-topic``
means ``persistent://t/ns/my-topic``. The managed ledger of a topic is named
``tenant/namespace/persistent/topic``. Invalid names raise ``InvalidRequest``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from broker.errors import InvalidRequest

_NAME = re.compile(r"^[-=:.\w]+$")
_TOPIC = re.compile(r"^[-=:.%\w]+$")
PARTITION_SUFFIX = "-partition-"
NAME_BYTES_MAX = 512


@dataclass(frozen=True, order=True)
class TopicName:
    tenant: str
    namespace: str
    local_name: str
    domain: str = "persistent"

    @classmethod
    def parse(cls, name: str) -> TopicName:
        if not name or len(name.encode()) > NAME_BYTES_MAX:
            raise InvalidRequest(f"invalid topic name {name!r}: empty or longer than {NAME_BYTES_MAX} bytes")
        domain, rest = "persistent", name
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain != "persistent":
                raise InvalidRequest(f"invalid topic name {name!r}: only persistent:// topics exist here")
        parts = rest.split("/")
        if len(parts) == 1:
            parts = ["public", "default", parts[0]]
        if len(parts) != 3:
            raise InvalidRequest(f"invalid topic name {name!r}: expected tenant/namespace/topic")
        return cls.of(parts[0], parts[1], parts[2], domain)

    @classmethod
    def of(cls, tenant: str, namespace: str, local_name: str, domain: str = "persistent") -> TopicName:
        for label, value, pattern in (("tenant", tenant, _NAME), ("namespace", namespace, _NAME),
                                      ("topic", local_name, _TOPIC)):
            if not pattern.match(value):
                raise InvalidRequest(f"invalid {label} {value!r}: use letters, digits and - _ = : . only")
        return cls(tenant, namespace, local_name, domain)

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
        """The partition number of ``-partition-N`` names, else -1 (computed once: every
        publish asks)."""
        head, sep, tail = self.local_name.rpartition(PARTITION_SUFFIX)
        return int(tail) if sep and head and tail.isdigit() else -1

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
