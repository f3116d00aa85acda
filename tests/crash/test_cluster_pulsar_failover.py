"""The official ``pulsar-client`` over two brokers, one of them killed with SIGKILL under load.

Processes: one ZooKeeper (Debian's package), three ``magnetar bookie`` and two ``magnetar
broker`` on 127.0.0.1 (``consumers/cluster_launcher.py``), each started with a known PID and
stopped by it whatever happens. The brokers' ZooKeeper sessions time out after
``SESSION_TIMEOUT_S``. The client is Pulsar's own (``import pulsar``) with both brokers in its
service URL, Pulsar's multi-host form ``pulsar://127.0.0.1:P1,127.0.0.1:P2``: it looks topics up
through either broker, connects to the owner each lookup names, and reconnects through lookups
(with its own backoff) when its broker goes away.

``test_pulsar_client_goes_on_after_kill9_of_a_broker``: ``TOPICS`` topics of a namespace with
``BUNDLES`` bundles, half of them served by each broker. Every topic has a named producer
(``send_async`` with explicit sequence ids, so a send the client repeats after reconnecting is
deduplicated by the broker) and a consumer (Exclusive or Shared) that acknowledges what it
receives.

1. Load runs until every topic has ``ACKS_PER_PHASE`` acknowledged sends; then it settles:
   producing pauses, every acknowledged send is delivered, every subscription's cursor is at
   the topic's end on its owner, and an acknowledgement over REST (answered once the cursor's
   state is persisted, which includes every earlier acknowledgement) makes that durable.
2. Producing resumes and the first broker of the service URL (the one the client tries first,
   owner of half the topics) is killed with SIGKILL. Until its session expires, lookups of its
   topics on the survivor answer Connect with the dead owner's URL (ZooKeeper still names it,
   and Pulsar's brokers answer an owned bundle with its owner); the client's connections there
   fail and it looks up again with backoff. A LOOKUP repeated on the survivor (raw frames)
   answers only that, or a failure with ServiceNotReady (retriable), until it answers Connect
   with its own URL.
   Within the session timeout plus ``RECOVERY_BOUND_S`` every topic has ``ACKS_PER_PHASE`` new
   acknowledged sends and new deliveries, all on the survivor.
3. Producing pauses, every send settles, every acknowledged send is delivered. Everything is
   read back through the survivor over REST: every acknowledged payload is stored, none twice;
   nothing settled in step 1 is delivered again (the consumers resumed from their acknowledged
   positions). Deliveries beyond the first (messages unacknowledged at the kill, or whose
   acknowledgement had not been persisted) are counted and printed, as are the client's errors.

Every wait is a bounded loop with a deadline; nothing depends on how fast the machine is.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar.proto import pulsar_api_pb2 as pb
from consumers.cluster_launcher import Cluster, Process, running_cluster
from tests.crash.cluster_load import stored_payloads
from tests.crash.test_cluster_failover import BROKER_ARGS, SESSION_TIMEOUT_S
from tests.integration.pulsar_wire import RawConnection, T, command

pytestmark = pytest.mark.crash

NAMESPACE = "public/pulsar-failover"
TOPICS = 4
CANDIDATES_MAX = 64
"""Topic names looked up (each assigning its bundle) until ``TOPICS // 2`` are on each broker."""
BUNDLES = 8
SUBSCRIPTION = "failover"
ACKS_PER_PHASE = 15
PHASE_DEADLINE_S = 150.0
RECOVERY_BOUND_S = 120.0
"""A moved topic must be served again within the session timeout plus this: recovery, and the
client's own backoff between lookups (it doubles up to tens of seconds, and a lookup sent to the
dead broker, still in the service URL, fails again)."""
LOOKUP_PROBE_PAUSE_S = 0.2
WINDOW = 16
"""Sends in flight per producer (far below the client's pending-message limit)."""
SEND_PACE_S = 0.05
"""Pause between two rounds of sends over every topic (the machine is shared: paced, not flat out)."""
SEND_TIMEOUT_MS = 120_000
OPERATION_TIMEOUT_S = 30
RECEIVE_TIMEOUT_MS = 500


@dataclass
class TopicLoad:
    """What one topic's producer and consumer saw (guarded by ``Load.lock``)."""

    name: str
    sent: int = 0
    in_flight: int = 0
    acked: set[bytes] = field(default_factory=set)
    acked_at_s: list[float] = field(default_factory=list)
    failed: collections.Counter[str] = field(default_factory=collections.Counter)
    delivered: collections.Counter[bytes] = field(default_factory=collections.Counter)
    delivered_at_s: list[float] = field(default_factory=list)
    acknowledged: set[bytes] = field(default_factory=set)
    """Payloads the consumer acknowledged (the client sends acknowledgements on its own time,
    without waiting for the broker: one not yet persisted when its broker dies is redelivered)."""
    receive_errors: collections.Counter[str] = field(default_factory=collections.Counter)


class Load:
    """Producers (one thread, ``send_async``) and consumers (one thread each) of every topic,
    through one ``pulsar.Client``."""

    def __init__(self, client: pulsar.Client, topics: list[str]) -> None:
        self.lock = threading.Lock()
        self.topics = {t: TopicLoad(t) for t in topics}
        self._producing = threading.Event()
        self._producing.set()
        self._stop = threading.Event()
        self._consumers = [client.subscribe(t, SUBSCRIPTION, initial_position=pulsar.InitialPosition.Earliest,
                                            consumer_type=pulsar.ConsumerType.Shared if i % 2 else
                                            pulsar.ConsumerType.Exclusive)
                           for i, t in enumerate(topics)]
        self._producers = [client.create_producer(t, producer_name=f"failover-{i}", batching_enabled=False,
                                                  send_timeout_millis=SEND_TIMEOUT_MS)
                           for i, t in enumerate(topics)]
        self._threads = [threading.Thread(target=self._produce, name="produce", daemon=True)]
        self._threads += [threading.Thread(target=self._consume, args=(self.topics[t], c), name=f"consume-{t}",
                                           daemon=True) for t, c in zip(topics, self._consumers, strict=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def pause_producing(self) -> None:
        self._producing.clear()

    def resume_producing(self) -> None:
        self._producing.set()

    # --- the load's threads ------------------------------------------------------------
    def _produce(self) -> None:
        sequence = dict.fromkeys(self.topics, 0)
        while not self._stop.is_set():
            if not self._producing.wait(0.1):
                continue
            for record, producer in zip(self.topics.values(), self._producers, strict=True):
                with self.lock:
                    if record.in_flight >= WINDOW:
                        continue
                    record.in_flight += 1
                    record.sent += 1
                sequence_id = sequence[record.name]
                sequence[record.name] += 1
                payload = f"{record.name}:{sequence_id}".encode()
                try:
                    producer.send_async(payload, self._settled(record, payload), sequence_id=sequence_id)
                except Exception as exc:  # refused at once: never sent
                    with self.lock:
                        record.in_flight -= 1
                        record.failed[type(exc).__name__] += 1
            time.sleep(SEND_PACE_S)

    def _settled(self, record: TopicLoad, payload: bytes) -> Callable[[pulsar.Result, pulsar.MessageId], None]:
        def callback(result: pulsar.Result, _message_id: pulsar.MessageId) -> None:
            with self.lock:
                record.in_flight -= 1
                if result == pulsar.Result.Ok:
                    record.acked.add(payload)
                    record.acked_at_s.append(time.monotonic())
                else:
                    record.failed[str(result)] += 1

        return callback

    def _consume(self, record: TopicLoad, consumer: pulsar.Consumer) -> None:
        while not self._stop.is_set():
            try:
                message = consumer.receive(RECEIVE_TIMEOUT_MS)
            except pulsar.Timeout:
                continue
            except Exception as exc:
                with self.lock:
                    record.receive_errors[f"receive: {type(exc).__name__}"] += 1
                time.sleep(0.2)
                continue
            with self.lock:
                record.delivered[message.data()] += 1
                record.delivered_at_s.append(time.monotonic())
            try:
                consumer.acknowledge(message)
            except Exception as exc:
                with self.lock:
                    record.receive_errors[f"acknowledge: {type(exc).__name__}"] += 1
                continue
            with self.lock:
                record.acknowledged.add(message.data())

    # --- views (test thread) --------------------------------------------------------------
    def acked_counts(self) -> dict[str, int]:
        with self.lock:
            return {t: len(r.acked) for t, r in self.topics.items()}

    def wait(self, done: Callable[[], bool], deadline_s: float) -> bool:
        while time.monotonic() < deadline_s:
            if done():
                return True
            time.sleep(0.1)
        return False

    def undelivered(self) -> dict[str, int]:
        with self.lock:
            return {t: len(r.acked - set(r.delivered)) for t, r in self.topics.items() if r.acked - set(r.delivered)}

    def in_flight(self) -> int:
        with self.lock:
            return sum(r.in_flight for r in self.topics.values())


def _rounded(seconds: dict[str, float]) -> dict[str, float]:
    return {_short(t): round(s, 1) for t, s in seconds.items()}


def _short(topic: str) -> str:
    return topic.rsplit("/", 1)[1]


def _owner(http: httpx.Client, broker_url: str, topic: str) -> str:
    """The broker id serving ``topic`` (an HTTP lookup, which assigns its bundle the first time)."""
    response = http.get(f"{broker_url}/lookup/v2/topic/persistent/{NAMESPACE}/{topic}")
    response.raise_for_status()
    return str(response.json()["brokerId"])


def _spread_topics(http: httpx.Client, cluster: Cluster) -> dict[str, str]:
    """``TOPICS`` topic names, half of them served by each broker: full name -> owner id."""
    chosen: dict[str, str] = {}
    per_broker = collections.Counter[str]()
    for i in range(CANDIDATES_MAX):
        owner = _owner(http, cluster.broker_url, f"t{i}")
        if per_broker[owner] < TOPICS // 2:
            per_broker[owner] += 1
            chosen[f"persistent://{NAMESPACE}/t{i}"] = owner
        if len(chosen) == TOPICS:
            return chosen
    raise AssertionError(f"{CANDIDATES_MAX} topics did not spread over both brokers: {per_broker}")


def _subscription(http: httpx.Client, broker_url: str, topic: str) -> tuple[int, int]:
    """(mark-delete offset of the load's subscription, next offset of the topic) on its owner."""
    response = http.get(f"{broker_url}/admin/v2/persistent/{NAMESPACE}/{_short(topic)}/stats")
    response.raise_for_status()
    stats = response.json()
    return int(stats["subscriptions"][SUBSCRIPTION]["markDeleteOffset"]), int(stats["nextOffset"])


def _lookups_until_connect(broker: Process, topic: str, dead_url: str, deadline_s: float) -> collections.Counter[str]:
    """LOOKUP ``topic`` on ``broker`` over the binary protocol until it answers Connect with its
    own URL; the answers seen, counted. While ZooKeeper still names the dead owner (its session
    has not expired) the answer is Connect with the dead owner's URL, as Pulsar's brokers answer
    an owned bundle (the client's connection there fails, and it looks up again); a failed
    lookup may only be ServiceNotReady, which the client retries. Nothing else is acceptable."""
    answers = collections.Counter[str]()
    with RawConnection(broker.pulsar_port) as conn:
        conn.connect()
        for request_id in range(1, 1_000_000):
            assert time.monotonic() < deadline_s, f"no Connect for {topic} from {broker.address}: {answers}"
            conn.send_command(command(T.LOOKUP, lookupTopic={"topic": topic, "request_id": request_id}))
            found = conn.expect(T.LOOKUP_RESPONSE).lookupTopicResponse
            assert found.request_id == request_id
            if found.response == pb.CommandLookupTopicResponse.Connect:
                if found.brokerServiceUrl == broker.pulsar_url:
                    answers["Connect here"] += 1
                    return answers
                assert found.brokerServiceUrl == dead_url, found
                answers["Connect to the killed broker"] += 1
            else:
                assert found.error == pb.ServiceNotReady, found
                answers["Failed: ServiceNotReady"] += 1
            time.sleep(LOOKUP_PROBE_PAUSE_S)
    raise AssertionError(f"no Connect for {topic} from {broker.address}: {answers}")


@pytest.mark.timeout(900)
def test_pulsar_client_goes_on_after_kill9_of_a_broker(tmp_path: Path) -> None:
    with open(tmp_path / "cluster.log", "wb") as log, \
            running_cluster(tmp_path, bookies=3, brokers=2, broker_args=BROKER_ARGS, output=log) as cluster, \
            httpx.Client(timeout=30.0, follow_redirects=True, max_redirects=5) as http:
        response = http.put(f"{cluster.broker_url}/admin/v2/namespaces/{NAMESPACE}", json={
            "bundles": {"numBundles": BUNDLES},  # retention: everything is read back at the end
            "retention_policies": {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}})
        assert response.status_code == 204, response.text
        owners = _spread_topics(http, cluster)
        service_url = "pulsar://" + ",".join(f"127.0.0.1:{b.pulsar_port}" for b in cluster.brokers)
        client = pulsar.Client(service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                               logger=pulsar.FileLogger(pulsar.LoggerLevel.Info, str(tmp_path / "client.log")))
        load: Load | None = None
        try:
            load = Load(client, list(owners))
            load.start()
            _scenario(cluster, http, owners, load)
        finally:
            if load is not None:
                load.stop()
            client.close()


def _scenario(cluster: Cluster, http: httpx.Client, owners: dict[str, str], load: Load) -> None:
    topics = list(owners)
    # 1. Load on both brokers, then settle: everything acknowledged, durably.
    assert load.wait(lambda: all(n >= ACKS_PER_PHASE for n in load.acked_counts().values()),
                     time.monotonic() + PHASE_DEADLINE_S), f"phase 1 acks: {load.acked_counts()}"
    load.pause_producing()
    assert load.wait(lambda: load.in_flight() == 0 and not load.undelivered(), time.monotonic() + PHASE_DEADLINE_S), \
        f"phase 1: in flight {load.in_flight()}, undelivered {load.undelivered()}"

    def cursors_at_end() -> bool:
        return all(mark_delete == end for mark_delete, end in
                   (_subscription(http, f"http://{owners[t]}", t) for t in topics))

    assert load.wait(cursors_at_end, time.monotonic() + PHASE_DEADLINE_S), \
        f"acknowledgements missing on the owners: {[_subscription(http, f'http://{owners[t]}', t) for t in topics]}"
    for topic in topics:  # answered once the cursor's state is persisted: all earlier acks with it
        acked = http.post(f"http://{owners[topic]}/topics/persistent/{NAMESPACE}/{_short(topic)}/subscription/"
                          f"{SUBSCRIPTION}/ack", json={"offsets": [0]})
        assert acked.status_code == 200, acked.text
    with load.lock:
        settled = {t: set(r.delivered) for t, r in load.topics.items()}
    load.resume_producing()

    # 2. kill -9 the first broker of the service URL under load.
    victim: Process = cluster.brokers[0]
    survivor: Process = cluster.brokers[1]
    victims = [t for t, o in owners.items() if o == victim.address]
    assert victims and len(victims) < len(topics), owners
    assert victim.proc is not None
    before = load.acked_counts()
    with load.lock:
        acknowledged_before_kill = {t: set(r.acknowledged) for t, r in load.topics.items()}
    killed_s = time.monotonic()
    assert victim.stop(kill=True) == -9
    deadline_s = killed_s + SESSION_TIMEOUT_S + RECOVERY_BOUND_S + PHASE_DEADLINE_S
    answers = _lookups_until_connect(survivor, victims[0], victim.pulsar_url, deadline_s)
    connected_s = time.monotonic() - killed_s

    def served_again() -> bool:
        with load.lock:
            return all(len(r.acked) >= before[t] + ACKS_PER_PHASE and r.delivered_at_s[-1] > killed_s
                       for t, r in load.topics.items())

    assert load.wait(served_again, deadline_s), \
        f"after kill -9 of {victim.address}: acks {load.acked_counts()} (before {before}); send failures " \
        f"{ {t: dict(r.failed) for t, r in load.topics.items()} }; receive errors " \
        f"{ {t: dict(r.receive_errors) for t, r in load.topics.items()} }"
    with load.lock:
        first_ack_after_s = {t: min(s for s in load.topics[t].acked_at_s if s > killed_s) - killed_s for t in victims}
        first_delivery_after_s = {t: min(s for s in load.topics[t].delivered_at_s if s > killed_s) - killed_s
                                  for t in victims}
    print(f"\nkill -9 {victim.name} {victim.address} (pid {victim.proc.pid}, {victim.pulsar_url}: first in the "
          f"client's service URL): its topics {[_short(t) for t in victims]} are served by {survivor.address}; "
          f"first acknowledged send after the kill {_rounded(first_ack_after_s)} s, first delivery "
          f"{_rounded(first_delivery_after_s)} s (session timeout {SESSION_TIMEOUT_S:g} s); LOOKUPs of "
          f"{_short(victims[0])} on the survivor until it answered Connect ({connected_s:.1f} s after the kill): "
          f"{dict(answers)}")
    assert max(first_ack_after_s.values()) < SESSION_TIMEOUT_S + RECOVERY_BOUND_S
    assert max(first_delivery_after_s.values()) < SESSION_TIMEOUT_S + RECOVERY_BOUND_S
    assert all(_owner(http, f"http://{survivor.address}", _short(t)) == survivor.address for t in topics)

    # 3. Settle again; read everything back through the survivor.
    load.pause_producing()
    assert load.wait(lambda: load.in_flight() == 0 and not load.undelivered(), time.monotonic() + PHASE_DEADLINE_S), \
        f"at the end: in flight {load.in_flight()}, undelivered {load.undelivered()}"
    load.stop()
    figures = {}
    for topic in topics:
        stored = stored_payloads(http, f"http://{survivor.address}", NAMESPACE, _short(topic))
        record = load.topics[topic]
        assert len(stored) == len(set(stored)), f"{topic}: a payload is stored twice"
        missing = record.acked - set(stored)
        assert not missing, f"{topic}: {len(missing)} acknowledged sends are not stored: {sorted(missing)[:5]}"
        assert record.acked <= set(record.delivered), f"{topic}: an acknowledged send was never delivered"
        again = sorted(p for p in settled[topic] if record.delivered[p] > 1)
        assert not again, f"{topic}: {len(again)} messages acknowledged durably before the kill were delivered " \
                          f"again: {again[:5]}"
        duplicates = {p: n - 1 for p, n in record.delivered.items() if n > 1}
        figures[_short(topic)] = {
            "owner": "killed" if topic in victims else "survivor", "sent": record.sent, "acked": len(record.acked),
            "stored": len(stored), "failed": dict(record.failed), "duplicate deliveries": sum(duplicates.values()),
            "of them acknowledged by the consumer before the kill": sum(
                n for p, n in duplicates.items() if p in acknowledged_before_kill[topic]),
            "receive errors": dict(record.receive_errors)}
    for name, figure in figures.items():
        print(f"{name}: {figure}")
    print(f"settled before the kill and not delivered again: {sum(len(s) for s in settled.values())} messages; "
          f"every acknowledged send stored once and delivered")
