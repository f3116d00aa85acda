"""The subscription census's walk: every topic's durable cursors, bounded by topics read."""

from __future__ import annotations

from broker.managed_ledger import ML_ROOT
from broker.metadata.memory import InMemoryMetadataStore
from broker.subscription_census import SubscriptionCensus


def _store_with(cursors: dict[str, int]) -> InMemoryMetadataStore:
    store = InMemoryMetadataStore()
    for topic, n in cursors.items():
        store.put(f"{ML_ROOT}/{topic}", b"{}")
        for i in range(n):
            store.put(f"{ML_ROOT}/{topic}/cursors/s{i}", b"{}")
    return store


def test_counts_every_topics_cursors_and_takes_loaded_topics_live() -> None:
    clock = [1000.0]
    store = _store_with({"t1/ns/persistent/a": 2, "t1/ns/persistent/b": 0, "t2/other/persistent/c": 3})
    census = SubscriptionCensus(store, lambda: clock[0])
    assert census.total({}).total is None
    census.maybe_count()
    assert census.total({}).total == 5 and census.total({}).topics_counted == 3
    # a loaded topic's live count replaces its counted one; a topic loaded since the walk adds its own
    assert census.total({"t1/ns/persistent/a": 4, "t1/ns/persistent/new": 1}).total == 3 + 4 + 1


def test_walks_again_after_the_interval_or_when_a_recount_is_due() -> None:
    clock = [1000.0]
    store = _store_with({"t/ns/persistent/a": 1})
    census = SubscriptionCensus(store, lambda: clock[0], interval_ms=30_000)
    census.maybe_count()
    store.put(f"{ML_ROOT}/t/ns/persistent/a/cursors/late", b"{}")
    clock[0] += 10
    census.maybe_count()
    assert census.total({}).total == 1  # within the interval: not walked again
    census.recount()
    census.maybe_count()
    assert census.total({}).total == 2
    store.put(f"{ML_ROOT}/t/ns/persistent/a/cursors/later", b"{}")
    clock[0] += 31
    census.maybe_count()
    assert census.total({}).total == 3


def test_a_walk_stops_at_its_bound_and_says_so() -> None:
    store = _store_with({f"t/ns/persistent/topic-{i}": 1 for i in range(10)})
    census = SubscriptionCensus(store, lambda: 0.0, topics_max=4)
    census.maybe_count()
    count = census.total({})
    assert count.topics_counted == 4 and count.total == 4 and count.complete is False
