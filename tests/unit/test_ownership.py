"""Bundle ownership between brokers, on a real ZooKeeper: first lookups spread bundles over the
least-loaded brokers, an unload hands a bundle over, a split divides it, and a broker whose
session expires loses every bundle (dropped without writes) while another takes them."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kazoo.client import KazooClient

from broker.errors import NotFound, TopicNotOwned
from broker.metadata.zookeeper import ZooKeeperMetadataStore
from broker.namespace.lookup import BrokerAddress
from broker.namespace.namespaces import POLICIES
from broker.namespace.ownership import OwnershipConfig, OwnershipManager
from broker.topic_name import TopicName
from storage import connect
from tests.tcp_link import TcpLink

NAMESPACE = "public/default"
DEADLINE_S = 30.0
SESSION_S = 3.0


class Broker:
    """One broker's ownership manager on its own ZooKeeper session, and what it was told to drop."""

    def __init__(self, spec: str, name: str, store: ZooKeeperMetadataStore | None = None) -> None:
        self.store = store or ZooKeeperMetadataStore.open(spec)
        address = BrokerAddress(name, f"http://{name}")
        self.ownership = OwnershipManager(self.store.client, self.store,
                                          OwnershipConfig(address, default_bundles=4, load_report_interval_ms=100))
        self.dropped: list[tuple[str, bool]] = []
        self.ownership.on_bundle_lost(lambda bundle, graceful: self.dropped.append((bundle.key, graceful)))
        self.ownership.start()

    @classmethod
    def over(cls, store: ZooKeeperMetadataStore, name: str) -> Broker:
        return cls("", name, store)

    @property
    def name(self) -> str:
        return self.ownership.address.broker_id

    def close(self) -> None:
        self.ownership.close()
        self.store.client.stop()
        self.store.client.close()


@contextmanager
def brokers(zookeeper: str, count: int) -> Iterator[list[Broker]]:
    spec = f"zk:{zookeeper}/ownership-{uuid.uuid4().hex}"
    made = [Broker(spec, f"127.0.0.1:{9000 + i}") for i in range(count)]
    made[0].store.put_json(f"{POLICIES}/{NAMESPACE}", {"retention_policies": {}})
    try:
        yield made
    finally:
        for broker in made:
            broker.close()


def _topic_per_bundle(broker: Broker) -> list[TopicName]:
    """One topic in each of the namespace's bundles."""
    found: dict[str, TopicName] = {}
    for i in range(1000):
        topic = TopicName.parse(f"persistent://{NAMESPACE}/t{i}")
        found.setdefault(broker.ownership.bundle_of(topic).key, topic)
        if len(found) == 4:
            return list(found.values())
    raise AssertionError("1000 topics did not reach every bundle")


def _served_by(found: list[Broker], topic: TopicName) -> Broker:
    """Look ``topic`` up at the first broker and follow the answer, as a client does."""
    answer = found[0].ownership.lookup(topic)
    owner = next(b for b in found if b.name == answer.owner.broker_id)
    assert owner.ownership.lookup(topic).local
    return owner


def test_first_lookups_spread_bundles_and_every_broker_agrees(zookeeper: str) -> None:
    with brokers(zookeeper, 2) as found:
        topics = _topic_per_bundle(found[0])
        owners = {t: _served_by(found, t).name for t in topics}
        assert sorted(owners.values()) == sorted([found[0].name, found[1].name] * 2)  # least loaded: 2 and 2
        for topic, owner in owners.items():
            for broker in found:
                answer = broker.ownership.lookup(topic)
                assert answer.owner.broker_id == owner and answer.local == (broker.name == owner)
        elsewhere = next(t for t, o in owners.items() if o != found[0].name)
        with pytest.raises(TopicNotOwned) as redirect:
            found[0].ownership.check_served_here(elsewhere)
        assert redirect.value.owner_url == f"http://{owners[elsewhere]}"
        reports = {r.address.broker_id: r for r in found[0].ownership.load_reports()}
        deadline_s = time.monotonic() + DEADLINE_S
        while any(r.bundles != 2 for r in reports.values()) and time.monotonic() < deadline_s:
            time.sleep(0.05)
            reports = {r.address.broker_id: r for r in found[0].ownership.load_reports()}
        assert set(reports) == {found[0].name, found[1].name} and all(r.bundles == 2 for r in reports.values())


def test_unload_hands_the_bundle_to_the_other_broker(zookeeper: str) -> None:
    with brokers(zookeeper, 2) as found:
        topic = _topic_per_bundle(found[0])[0]
        owner = _served_by(found, topic)
        other = next(b for b in found if b is not owner)
        bundle = owner.ownership.bundle_of(topic)
        with pytest.raises(TopicNotOwned):
            other.ownership.unload(NAMESPACE, bundle.range_name)  # the call belongs at the owner
        target = owner.ownership.unload(NAMESPACE, bundle.range_name)
        assert target is not None and target.broker_id == other.name
        assert owner.dropped == [(bundle.key, True)]
        assert not owner.ownership.owns(topic)
        assert owner.ownership.lookup(topic).owner.broker_id == other.name
        assert other.ownership.lookup(topic).local
        with pytest.raises(NotFound):
            owner.ownership.unload(NAMESPACE, "0x00000000_0x00000010")


def test_split_divides_an_owned_bundle(zookeeper: str) -> None:
    with brokers(zookeeper, 1) as found:
        broker = found[0]
        topic = _topic_per_bundle(broker)[0]
        assert broker.ownership.lookup(topic).local
        bundle = broker.ownership.bundle_of(topic)
        halves = broker.ownership.split(NAMESPACE, bundle.range_name)
        middle = bundle.lower + (bundle.upper - bundle.lower) // 2
        assert [(h.lower, h.upper) for h in halves] == [(bundle.lower, middle), (middle, bundle.upper)]
        assert broker.dropped == [(bundle.key, True)]
        assert broker.ownership.bundles(NAMESPACE).to_policy()["numBundles"] == 5
        assert broker.ownership.bundle_of(topic) in halves
        assert broker.ownership.lookup(topic).local  # the half is taken on its first lookup
        assert broker.ownership.owned_bundles() == [broker.ownership.bundle_of(topic)]


def test_an_expired_session_loses_every_bundle_to_the_other_broker(zookeeper: str) -> None:
    with brokers(zookeeper, 2) as found:
        topic = _topic_per_bundle(found[0])[0]
        victim = _served_by(found, topic)
        survivor = next(b for b in found if b is not victim)
        # Expire the victim's session from the server's side, as a partition longer than the
        # session timeout does: a second client attaches to the session and closes it.
        session_id, password = victim.store.client.client_id
        hosts = zookeeper
        killer = KazooClient(hosts=hosts, client_id=(session_id, password))
        killer.start(timeout=15)
        killer.stop()
        killer.close()
        deadline_s = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline_s and not survivor.ownership.lookup(topic).local:
            time.sleep(0.05)
        assert survivor.ownership.lookup(topic).local
        while time.monotonic() < deadline_s and not victim.dropped:
            time.sleep(0.05)
        assert victim.dropped == [(survivor.ownership.bundle_of(topic).key, False)]  # dropped, not closed
        assert not victim.ownership.owns(topic)
        while time.monotonic() < deadline_s and not victim.ownership.serving:
            time.sleep(0.05)
        assert victim.ownership.lookup(topic).owner.broker_id == survivor.name
        stats = victim.ownership.statistics()
        assert stats.sessions_lost >= 1 and stats.owned_bundles == 0


def test_concurrent_first_lookups_elect_one_owner(zookeeper: str) -> None:
    with brokers(zookeeper, 3) as found:
        topic = TopicName.parse(f"persistent://{NAMESPACE}/contended")
        answers: list[str] = []
        errors: list[BaseException] = []

        def look(broker: Broker) -> None:
            try:
                answers.append(broker.ownership.lookup(topic).owner.broker_id)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=look, args=(b,)) for b in found for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE_S)
        assert not errors
        owner = _served_by(found, topic).name
        assert sum(1 for b in found if b.ownership.owns(topic)) == 1
        assert len(answers) == len(threads)  # every lookup answered (racing assignments may differ
        assert owner in answers              # for a moment; the ephemeral node elects one owner)


def test_a_partitioned_broker_stops_serving_before_another_takes_over(zookeeper: str) -> None:
    """Cut between one broker and ZooKeeper: kazoo reports the connection suspended after about
    two thirds of the session timeout, and the broker drops its topics then; the server expires
    the session only at the timeout, and only then can the other broker take the bundle."""
    chroot = f"/partition-{uuid.uuid4().hex}"
    link = TcpLink(zookeeper).start()
    spec = f"zk:{zookeeper}{chroot}"
    victim_store = ZooKeeperMetadataStore(connect(f"zk:{link.address}{chroot}", session_timeout_s=SESSION_S), None,
                                          owns_client=True)
    victim = Broker.over(victim_store, "127.0.0.1:9100")
    survivor = Broker.over(ZooKeeperMetadataStore.open(spec), "127.0.0.1:9101")
    try:
        survivor.store.put_json(f"{POLICIES}/{NAMESPACE}", {"retention_policies": {}})
        dropped_at: list[float] = []
        victim.ownership.on_bundle_lost(lambda _bundle, _graceful: dropped_at.append(time.monotonic()))
        topic = TopicName.parse(f"persistent://{NAMESPACE}/partitioned")
        bundle = survivor.ownership.bundle_of(topic)
        victim.ownership._acquire(bundle)  # the victim owns the topic's bundle
        assert victim.ownership.owns(topic) and survivor.ownership.lookup(topic).owner.broker_id == victim.name
        link.cut()
        cut_at = time.monotonic()
        deadline_s = cut_at + DEADLINE_S
        while time.monotonic() < deadline_s:
            answer = survivor.ownership.lookup(topic)
            if answer.local:
                taken_at = time.monotonic()
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the survivor never took the bundle")
        assert dropped_at, "the partitioned broker never stopped serving"
        print(f"cut at 0: the partitioned broker stopped serving at {dropped_at[0] - cut_at:.2f} s, "
              f"the survivor took over at {taken_at - cut_at:.2f} s (session timeout {SESSION_S:g} s)")
        assert dropped_at[0] < taken_at
        assert not victim.ownership.owns(topic) and not victim.ownership.serving
    finally:
        link.close()
        survivor.close()
        victim.close()
