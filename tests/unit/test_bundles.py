"""Namespace bundles: Pulsar's hash (Murmur3-32 of the full topic name), ranges and splits."""

from __future__ import annotations

import pytest

from broker.errors import InvalidRequest, NotFound
from broker.namespace.bundles import HASH_MAX, Bundle, NamespaceBundles, murmur3_32, topic_hash
from broker.topic_name import TopicName


def test_murmur3_matches_the_reference_values() -> None:
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert murmur3_32(b"abc", seed=1) != murmur3_32(b"abc")


def test_equal_bundles_cover_the_hash_space_and_every_topic_falls_in_one() -> None:
    bundles = NamespaceBundles.equal("public/default", 4)
    assert bundles.to_policy() == {"boundaries": ["0x00000000", "0x40000000", "0x80000000", "0xc0000000",
                                                  "0xffffffff"], "numBundles": 4}
    for i in range(200):
        name = f"persistent://public/default/t{i}"
        found = [b for b in bundles.bundles if b.includes(topic_hash(name))]
        assert found == [bundles.bundle_of(name)]
        assert found[0].contains_topic(TopicName.parse(name))
    last = bundles.bundles[-1]
    assert last.includes(HASH_MAX) and bundles.bundle_of_hash(HASH_MAX) == last
    assert bundles.bundle_of_hash(0) == bundles.bundles[0]
    assert not bundles.bundles[0].contains_topic(TopicName.parse("persistent://public/other/t"))


def test_split_divides_one_bundle_at_its_middle() -> None:
    bundles = NamespaceBundles.equal("public/default", 2)
    first = bundles.bundles[0]
    split = bundles.split(first)
    assert [b.range_name for b in split.bundles] == ["0x00000000_0x40000000", "0x40000000_0x80000000",
                                                     "0x80000000_0xffffffff"]
    assert NamespaceBundles.from_policy("public/default", split.to_policy()).boundaries == split.boundaries
    with pytest.raises(NotFound):
        split.split(first)  # no longer one of the namespace's bundles


def test_bad_ranges_and_policies_are_refused() -> None:
    for bad in ("0x0_", "00000000_0x10", "0x20_0x10", "0xzz_0x10"):
        with pytest.raises(InvalidRequest):
            Bundle.parse("public/default", bad)
    with pytest.raises(NotFound):
        NamespaceBundles.equal("public/default", 4).find("0x00000000_0x10000000")
    with pytest.raises(InvalidRequest):
        NamespaceBundles("public/default", [0, 10, 5, HASH_MAX])
    with pytest.raises(InvalidRequest):
        NamespaceBundles.equal("public/default", 0)
    with pytest.raises(InvalidRequest):
        NamespaceBundles.from_policy("public/default", {"numBundles": "four"})
