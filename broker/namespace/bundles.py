"""Namespace bundles: the hash ranges of a namespace that brokers own, as in Pulsar.

Role: a topic belongs to exactly one bundle of its namespace, found by hashing its full name
(``persistent://tenant/ns/topic``, each partition on its own) with Murmur3-32 (Pulsar's default
``Murmur3_32Hash``) into ``[0x00000000, 0xffffffff]``. A namespace's bundles are the ranges
between its sorted ``boundaries``; their number starts at ``defaultNumberOfNamespaceBundles``
(4) and grows when a bundle is split in two. Boundaries live in the namespace's policies
(``bundles: {boundaries: [...], numBundles: N}``, Pulsar's layout), so every broker reads the
same ranges.

Invariants: boundaries are strictly increasing, start at 0x00000000 and end at 0xffffffff;
every range is half-open ``[lower, upper)`` except the last, which includes 0xffffffff; so
every hash falls in exactly one bundle. A bundle's name is ``0xLLLLLLLL_0xUUUUUUUU``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from broker.errors import InvalidRequest, NotFound
from broker.limits import BUNDLES_MAX
from broker.topic_name import TopicName

HASH_MAX = 0xFFFFFFFF
BUNDLES_DEFAULT = 4
"""Pulsar's ``defaultNumberOfNamespaceBundles``."""
POLICY_KEY = "bundles"


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """Murmur3 x86 32-bit (Guava's ``murmur3_32``), as an unsigned integer."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & 0xFFFFFFFF
    whole = len(data) & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    tail = data[whole:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def topic_hash(full_name: str) -> int:
    return murmur3_32(full_name.encode())


@dataclass(frozen=True, order=True)
class Bundle:
    """One hash range of one namespace."""

    namespace: str
    lower: int
    upper: int

    @property
    def range_name(self) -> str:
        return f"0x{self.lower:08x}_0x{self.upper:08x}"

    @property
    def key(self) -> str:
        """``tenant/ns/0xLLLLLLLL_0xUUUUUUUU``: the bundle in ownership paths and admin answers."""
        return f"{self.namespace}/{self.range_name}"

    def includes(self, hash_value: int) -> bool:
        return self.lower <= hash_value < self.upper or (self.upper == HASH_MAX and hash_value == HASH_MAX)

    def contains_topic(self, topic: TopicName) -> bool:
        return topic.namespace_name == self.namespace and self.includes(topic_hash(topic.full_name))

    @classmethod
    def parse(cls, namespace: str, range_name: str) -> Bundle:
        """``0xLLLLLLLL_0xUUUUUUUU`` (InvalidRequest when malformed)."""
        lower_text, sep, upper_text = range_name.partition("_")
        try:
            if not sep or not lower_text.startswith("0x") or not upper_text.startswith("0x"):
                raise ValueError(range_name)
            lower, upper = int(lower_text, 16), int(upper_text, 16)
        except ValueError:
            raise InvalidRequest(f"not a bundle range: {range_name!r} (expected 0xLLLLLLLL_0xUUUUUUUU)") from None
        if not 0 <= lower < upper <= HASH_MAX:
            raise InvalidRequest(f"not a bundle range: {range_name!r}")
        return cls(namespace, lower, upper)


class NamespaceBundles:
    """The bundles of one namespace, from its boundaries."""

    def __init__(self, namespace: str, boundaries: list[int]) -> None:
        if len(boundaries) < 2 or boundaries[0] != 0 or boundaries[-1] != HASH_MAX \
                or any(b >= a for a, b in zip(boundaries[1:], boundaries, strict=False)):
            raise InvalidRequest(f"bundle boundaries of {namespace} are not increasing from 0x0 to 0xffffffff")
        self.namespace = namespace
        self.boundaries = boundaries

    @classmethod
    def equal(cls, namespace: str, count: int) -> NamespaceBundles:
        """``count`` ranges of (almost) equal width, as Pulsar creates them."""
        if not 1 <= count <= BUNDLES_MAX:
            raise InvalidRequest(f"numBundles must be in 1..{BUNDLES_MAX}, not {count}")
        step = (HASH_MAX + 1) // count
        return cls(namespace, [i * step for i in range(count)] + [HASH_MAX])

    @classmethod
    def from_policy(cls, namespace: str, policy: Any) -> NamespaceBundles:
        """From the namespace policy's ``bundles`` value (``{boundaries, numBundles}``)."""
        if not isinstance(policy, dict):
            raise InvalidRequest("bundles must be an object with boundaries or numBundles")
        boundaries = policy.get("boundaries")
        if boundaries:
            try:
                return cls(namespace, [int(str(b), 16) for b in boundaries])
            except (TypeError, ValueError):
                raise InvalidRequest("bundle boundaries must be hexadecimal strings like 0x40000000") from None
        count = policy.get("numBundles")
        if not isinstance(count, int) or isinstance(count, bool):
            raise InvalidRequest("bundles needs boundaries or an integer numBundles")
        return cls.equal(namespace, count)

    def to_policy(self) -> dict[str, Any]:
        return {"boundaries": [f"0x{b:08x}" for b in self.boundaries], "numBundles": len(self.boundaries) - 1}

    @property
    def bundles(self) -> list[Bundle]:
        return [Bundle(self.namespace, lo, hi) for lo, hi in zip(self.boundaries, self.boundaries[1:], strict=False)]

    def bundle_of_hash(self, hash_value: int) -> Bundle:
        index = min(bisect.bisect_right(self.boundaries, hash_value) - 1, len(self.boundaries) - 2)
        return Bundle(self.namespace, self.boundaries[index], self.boundaries[index + 1])

    def bundle_of(self, full_topic_name: str) -> Bundle:
        return self.bundle_of_hash(topic_hash(full_topic_name))

    def find(self, range_name: str) -> Bundle:
        """The bundle named ``range_name`` (NotFound when the namespace has no such bundle)."""
        wanted = Bundle.parse(self.namespace, range_name)
        if wanted not in self.bundles:
            raise NotFound(f"namespace {self.namespace} has no bundle {range_name}")
        return wanted

    def split(self, bundle: Bundle) -> NamespaceBundles:
        """The boundaries with ``bundle`` divided at its middle (Pulsar's range_equally_divide)."""
        if bundle not in self.bundles:
            raise NotFound(f"namespace {self.namespace} has no bundle {bundle.range_name}")
        if len(self.boundaries) - 1 >= BUNDLES_MAX:
            raise InvalidRequest(f"namespace {self.namespace} already has {BUNDLES_MAX} bundles")
        middle = bundle.lower + (bundle.upper - bundle.lower) // 2
        if middle == bundle.lower:
            raise InvalidRequest(f"bundle {bundle.range_name} is too small to split")
        return NamespaceBundles(self.namespace, sorted([*self.boundaries, middle]))
