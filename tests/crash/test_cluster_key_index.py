"""Event streams on a cluster: the key index is stored with its topic, on no broker's disk.

Processes: one ZooKeeper (Debian's package), two ``magnetar bookie`` and one or two ``magnetar
broker`` on 127.0.0.1, each started with a known PID and stopped by it whatever happens. A
broker has no data directory; the brokers run in a directory of their own, which must stay
empty. ``test_newcomer_standalone_then_cluster`` has a cluster of its own; the others share one
of two brokers, each in a namespace of its own, each starting with both brokers running (one
killed by a test before is started again).

- (a) ``test_newcomer_standalone_then_cluster``: ``magnetar standalone`` run from a directory
  with its default ``./data`` appends events to keys; a cluster broker started from the same
  directory does not know the topic (404), then, once it exists there, reports version -1 for
  those keys, reads only its own events, refuses an append expecting the standalone's version
  (409 with ``currentKeyVersions``) and numbers appends from 0; the directory is unchanged, and
  the standalone started there again still has its streams.
- (e) ``test_two_brokers_without_data_dir``: both brokers serve topics (each asked directly, no
  redirect), versions exact, a stale expectation refused.
- (d) ``test_deleted_topic_recreated_starts_over``: a topic whose index has a segment is deleted
  (admin v2, force): its record and segment ledgers go; recreated under the same name, every
  key is at -1 and numbering starts at 0.
- (b) ``test_owner_kill9_during_conditional_appends``: four writers append conditionally over
  1,000 keys (1 to 3 keys a request, each expecting the version it last saw) on the owner; once
  a checkpoint was recorded and a seeded number of appends more were acknowledged, the owner is
  killed with SIGKILL. The other broker takes the topic over: every acknowledged version reads
  back with its offset and payload, streams are dense, a key's version is its last acknowledged
  one or, when its request was in flight, that request's (for all of the request's keys or for
  none), and the next append of every key expecting that version succeeds with the next one.
- (c) ``test_owner_kill9_after_retention_trimmed_half``: the same after retention trimmed the
  first half of the topic (the first ledger, closed by a bundle unload; the policy keeping
  nothing is set through the broker that does not serve the topic, as an admin may): the
  trimmed versions read as 410 ``data_lost`` with ``firstVersion``, and versions continue.

A failure names the seed (``MAGNETAR_CRASH_SEED`` replays it).
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.bookkeeper.ledger_metadata import ledger_path
from broker.key_index.checkpoint import record_path
from broker.metadata.zookeeper import ZooKeeperMetadataStore
from broker.topic_name import TopicName
from consumers.cluster_launcher import Cluster, Process, running_cluster
from consumers.launcher import free_port, stop_process, wait_healthy
from tests.crash.harness import crash_seed

pytestmark = pytest.mark.crash

SESSION_TIMEOUT_S = 4.0
BROKER_ARGS = ("--zk-session-timeout-s", str(SESSION_TIMEOUT_S), "--load-report-interval-ms", "500",
               "--bookie-timeout-ms", "3000", "--log-level", "info")
BUNDLES = 8
KEYS = 1000
WRITERS = 4
KEYS_PER_REQUEST = 100
"""Keys one seeding or checking request appends to (one entry: all of them or none)."""
WAIT_S = 90.0
KEEP_ALL = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
KEEP_NOTHING = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}


# --- topics, requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topic:
    namespace: str
    local: str

    @property
    def path(self) -> str:
        return f"/topics/persistent/{self.namespace}/{self.local}"

    @property
    def full_name(self) -> str:
        return f"persistent://{self.namespace}/{self.local}"

    def key_path(self, key: str) -> str:
        return f"{self.path}/keys/{urllib.parse.quote(key, safe='')}"


def _http(base_url: str = "") -> httpx.Client:
    return httpx.Client(base_url=base_url, timeout=WAIT_S, follow_redirects=True, max_redirects=5)


def _wait(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """``condition()``'s first true value, asked until ``timeout_s`` passed (an HTTP error,
    a broker between owners or just killed, counts as not yet)."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        try:
            found = condition()
        except httpx.HTTPError:
            found = None
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def _post(client: httpx.Client, topic: Topic, producer: str, expected: dict[str, int],
          messages: list[tuple[str, str]]) -> httpx.Response:
    return client.post(topic.path, json={"producerName": producer, "expectedKeyVersions": expected,
                                         "messages": [{"payload": p, "key": k} for k, p in messages]})


def _key_info(client: httpx.Client, topic: Topic, key: str) -> dict[str, Any]:
    answer = client.get(topic.key_path(key))
    assert answer.status_code == 200, answer.text
    info: dict[str, Any] = answer.json()
    return info


def _read_stream(client: httpx.Client, topic: Topic, key: str, from_version: int = 0) -> list[dict[str, Any]]:
    """Every event of ``key`` from ``from_version`` on, payloads decoded."""
    events: list[dict[str, Any]] = []
    version = from_version
    while True:
        answer = client.get(f"{topic.key_path(key)}/messages", params={"fromVersion": version, "maxMessages": 1000})
        assert answer.status_code == 200, answer.text
        page = answer.json()["messages"]
        if not page:
            return events
        events += [{**e, "payload": base64.b64decode(e["payload"]).decode()} for e in page]
        version = answer.json()["nextVersion"]


# --- the cluster ------------------------------------------------------------------------------------


def _create_namespace(http: httpx.Client, broker_url: str, namespace: str) -> None:
    answer = http.put(f"{broker_url}/admin/v2/namespaces/{namespace}",
                      json={"bundles": {"numBundles": BUNDLES}, "retention_policies": KEEP_ALL})
    assert answer.status_code == 204, answer.text


def _set_retention(http: httpx.Client, broker_url: str, namespace: str, policy: dict[str, int]) -> None:
    answer = http.post(f"{broker_url}/admin/v2/namespaces/{namespace}/retention", json=policy)
    assert answer.status_code == 204, answer.text


def _lookup(http: httpx.Client, broker_url: str, topic: Topic) -> dict[str, Any]:
    answer = http.get(f"{broker_url}/lookup/v2/topic/persistent/{topic.namespace}/{topic.local}")
    answer.raise_for_status()
    found: dict[str, Any] = answer.json()
    return found


def _url(broker: Process) -> str:
    return f"http://{broker.address}"


def _serve(http: httpx.Client, cluster: Cluster, topic: Topic) -> Process:
    """The broker serving ``topic`` (its bundle assigned by a lookup and taken by its broker)."""
    owner_id = _lookup(http, _url(cluster.brokers[0]), topic)["brokerId"]
    owner = next(b for b in cluster.brokers if b.address == owner_id)
    assert _lookup(http, _url(owner), topic)["brokerId"] == owner_id
    return owner


def _move(http: httpx.Client, cluster: Cluster, topic: Topic, destination: Process | None) -> Process:
    """Unload the bundle of ``topic`` (to ``destination``, else wherever the next lookup puts
    it); the broker serving it afterwards."""
    found = _lookup(http, cluster.broker_url, topic)
    params = {} if destination is None else {"destinationBroker": destination.address}
    bundle = str(found["bundle"]).rsplit("/", 1)[1]
    answer = http.put(f"{cluster.broker_url}/admin/v2/namespaces/{topic.namespace}/{bundle}/unload", params=params)
    assert answer.status_code == 204, answer.text
    if destination is not None:
        _wait(lambda: _lookup(http, _url(destination), topic)["brokerId"] == destination.address,
              f"{destination.name} serving {topic.full_name}")
        return destination
    served: Process = _wait(lambda: _serve(http, cluster, topic), f"a broker serving {topic.full_name}")
    return served


def _record(store: ZooKeeperMetadataStore, topic: Topic) -> dict[str, Any] | None:
    """The key index record of ``topic`` in ZooKeeper (None: there is none)."""
    found = store.get(record_path(TopicName.parse(topic.full_name).managed_ledger_name))
    return None if found is None else dict(json.loads(found.value))


def _checkpointed(store: ZooKeeperMetadataStore, topic: Topic) -> dict[str, Any]:
    """The record, once a checkpoint recorded rows (``indexedTo`` > 0)."""
    return dict(_wait(lambda: (r := _record(store, topic)) is not None and r["indexedTo"] > 0 and r,
                      f"a key index checkpoint of {topic.full_name}"))


def _tree(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory below ``directory``: (size, modification time in ns)."""
    return {str(p.relative_to(directory)): (p.stat().st_size if p.is_file() else 0, p.stat().st_mtime_ns)
            for p in directory.rglob("*")}


# --- the streams the clients were told about ----------------------------------------------------------


@dataclass
class Stream:
    acked: dict[int, tuple[int, str]] = field(default_factory=dict)
    """version → (offset, payload) of every acknowledged event."""
    version: int = -1
    """The last version acknowledged."""


@dataclass
class Load:
    streams: dict[str, Stream]
    in_flight: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """Per writer, the request sent and not answered: key → its payloads."""
    acks: int = 0
    errors: list[str] = field(default_factory=list)
    """What a writer saw that it should not have (a refused append of keys it alone writes)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def of(cls, keys: list[str]) -> Load:
        return cls({key: Stream() for key in keys})

    def ack(self, writer: str, messages: list[tuple[str, str]], results: list[dict[str, Any]]) -> None:
        with self.lock:
            for (key, payload), result in zip(messages, results, strict=True):
                stream = self.streams[key]
                stream.acked[result["keyVersion"]] = (result["offset"], payload)
                stream.version = result["keyVersion"]
            self.in_flight.pop(writer, None)
            self.acks += 1

    def end_offset(self) -> int:
        """One past the highest acknowledged offset."""
        return 1 + max(offset for s in self.streams.values() for offset, _ in s.acked.values())


def _append_each(client: httpx.Client, topic: Topic, load: Load, label: str, keys: list[str] | None = None) -> None:
    """One event on each key, each expecting the key's last acknowledged version; the versions
    given must be the next ones."""
    keys = list(load.streams) if keys is None else keys
    for at in range(0, len(keys), KEYS_PER_REQUEST):
        chunk = keys[at:at + KEYS_PER_REQUEST]
        expected = {key: load.streams[key].version for key in chunk}
        messages = [(key, f"{label}-{key}-{expected[key] + 1}") for key in chunk]
        answer = _post(client, topic, label, expected, messages)
        assert answer.status_code == 200, f"{label}: {answer.text[:500]}"
        results = answer.json()["messagePublishResults"]
        assert [r["keyVersion"] for r in results] == [expected[k] + 1 for k in chunk], label
        load.ack(label, messages, results)


def _writer(url: str, topic: Topic, load: Load, keys: list[str], rng: random.Random, label: str) -> None:
    """Conditional appends on 1 to 3 of ``keys`` a request (1 or 2 events a key) until
    ``load.stop`` is set or the broker dies under it."""
    serial = 0
    with httpx.Client(base_url=url, timeout=WAIT_S) as client:
        while not load.stop.is_set():
            chosen = rng.sample(keys, rng.randint(1, 3))
            keyed = [key for key in chosen for _ in range(rng.randint(1, 2))]
            messages = [(key, f"{label}-{serial}-{n}") for n, key in enumerate(keyed)]
            expected = {key: load.streams[key].version for key in chosen}
            load.in_flight[label] = {key: [p for k, p in messages if k == key] for key in chosen}
            try:
                answer = _post(client, topic, label, expected, messages)
            except httpx.TransportError:
                return
            if answer.status_code != 200:
                load.errors.append(f"{label} expecting {expected}: {answer.status_code} {answer.text[:300]}")
                return
            load.ack(label, messages, answer.json()["messagePublishResults"])
            serial += 1


def _start_writers(url: str, topic: Topic, load: Load, rng: random.Random, phase: str) -> list[threading.Thread]:
    load.stop.clear()
    keys = list(load.streams)
    writers = [threading.Thread(target=_writer, args=(url, topic, load, keys[w::WRITERS],
                                                      random.Random(rng.random()), f"{phase}-w{w}"))
               for w in range(WRITERS)]
    for writer in writers:
        writer.start()
    return writers


def _join(writers: list[threading.Thread], load: Load, context: str) -> None:
    for writer in writers:
        writer.join(WAIT_S)
        assert not writer.is_alive(), f"a writer did not end; {context}"
    assert not load.errors, f"{load.errors[:3]}; {context}"


def _wait_acks(load: Load, count: int, context: str) -> None:
    _wait(lambda: load.acks >= count or load.errors, f"{count} acknowledged appends (got {load.acks}); {context}",
          WAIT_S * 2)
    assert not load.errors, f"{load.errors[:3]}; {context}"


# --- checks ------------------------------------------------------------------------------------------


def _check_streams(client: httpx.Client, topic: Topic, load: Load, context: str, *, trimmed_below: int = 0) -> int:
    """Every acknowledged version reads back (but those at offsets below ``trimmed_below``, which
    read as 410 naming the first version kept); the in-flight requests landed whole or not at
    all; the next append of every key expecting its version succeeds. Returns how many
    in-flight requests landed."""
    in_flight = {key: (writer, payloads) for writer, request in load.in_flight.items()
                 for key, payloads in request.items()}
    landed_by_writer: dict[str, set[bool]] = {}
    for key, stream in load.streams.items():
        first = sum(1 for offset, _ in stream.acked.values() if offset < trimmed_below)
        info = _key_info(client, topic, key)
        assert info["firstVersion"] == first, f"{key}: {info}, expected firstVersion {first}; {context}"
        if first > 0:
            _check_trimmed(client, topic, key, first, context)
        events = _read_stream(client, topic, key, first)
        head = info["version"]
        assert [e["keyVersion"] for e in events] == list(range(first, head + 1)), f"{key} not dense; {context}"
        stored = {e["keyVersion"]: (e["offset"], e["payload"]) for e in events}
        for version, acked in stream.acked.items():
            if version >= first:
                assert stored.get(version) == acked, f"{key} v{version}: acked {acked}, " \
                                                     f"stored {stored.get(version)}; {context}"
        if key in in_flight:
            writer, payloads = in_flight[key]
            landed_by_writer.setdefault(writer, set()).add(head != stream.version)
            if head != stream.version:  # durable, its answer lost with the broker
                assert head == stream.version + len(payloads), f"{key}: {head} after {stream.version}; {context}"
                assert [stored[v][1] for v in range(stream.version + 1, head + 1)] == payloads, context
                stream.acked.update({v: stored[v] for v in range(stream.version + 1, head + 1)})
                stream.version = head
        assert head == stream.version, f"{key}: version {head}, last acknowledged {stream.version}; {context}"
    partial = {w: o for w, o in landed_by_writer.items() if len(o) > 1}
    assert not partial, f"in-flight requests landed for some of their keys only: {partial}; {context}"
    _append_each(client, topic, load, "check")
    return sum(1 for outcomes in landed_by_writer.values() if True in outcomes)


def _check_trimmed(client: httpx.Client, topic: Topic, key: str, first: int, context: str) -> None:
    answer = client.get(f"{topic.key_path(key)}/messages", params={"fromVersion": 0})
    assert answer.status_code == 410, f"{key} v0: {answer.status_code} {answer.text[:300]}; {context}"
    body = answer.json()
    assert body["code"] == "data_lost" and body["firstVersion"] == first, f"{key}: {body}; {context}"


# --- (a) a newcomer's sequence ----------------------------------------------------------------------


@contextmanager
def _standalone_in(directory: Path) -> Iterator[str]:
    """``magnetar standalone`` run in ``directory`` with its default data directory (``./data``)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "standalone", "--host", "127.0.0.1", "--port", str(port),
                             "--pulsar-port", "0", "--log-level", "warning"], cwd=directory,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/healthz", proc)
        yield url
    finally:
        stop_process(proc)


def test_newcomer_standalone_then_cluster(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    topic = Topic("public/default", "newcomer")
    keys = [f"acct-{i}" for i in range(10)]
    ours = Load.of(keys)
    with _standalone_in(home) as url, _http(url) as client:
        for _ in range(5):
            _append_each(client, topic, ours, "standalone")
    assert (home / "data").is_dir(), "standalone did not use ./data"
    before = _tree(home)
    with open(tmp_path / "cluster.log", "wb") as log, \
            running_cluster(tmp_path / "cluster", bookies=2, brokers=1, broker_args=BROKER_ARGS, output=log,
                            broker_cwd=home) as cluster, _http(cluster.broker_url) as client:
        assert not any(arg.startswith("--data-dir") for arg in cluster.brokers[0].command)
        unknown = client.get(topic.key_path(keys[0]))
        assert unknown.status_code == 404 and unknown.json()["code"] == "not_found", unknown.text
        theirs = Load.of([*keys, "other"])
        _append_each(client, topic, theirs, "cluster", ["other"])  # the topic exists from here on
        for key in keys:
            assert _key_info(client, topic, key)["version"] == -1, key
            assert _read_stream(client, topic, key) == [], key
        refused = _post(client, topic, "cluster", {keys[0]: 4}, [(keys[0], "stale")])
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "key_version_mismatch"
        assert refused.json()["currentKeyVersions"] == {keys[0]: -1}
        _append_each(client, topic, theirs, "cluster", keys)
        for key in keys:
            assert [(e["keyVersion"], e["payload"]) for e in _read_stream(client, topic, key)] == \
                [(0, f"cluster-{key}-0")], key
    assert _tree(home) == before, "the cluster broker changed the directory it was started in"
    with _standalone_in(home) as url, _http(url) as client:
        for key in keys:
            assert [(e["keyVersion"], e["payload"]) for e in _read_stream(client, topic, key)] == \
                [(v, f"standalone-{key}-{v}") for v in range(5)], key


# --- the shared cluster of two brokers -----------------------------------------------------------------


@dataclass
class Shared:
    cluster: Cluster
    http: httpx.Client
    store: ZooKeeperMetadataStore
    cwd: Path
    """Where the brokers run: it stays empty."""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    base = tmp_path_factory.mktemp("kicluster")
    cwd = base / "brokers-cwd"
    cwd.mkdir()
    with open(base / "cluster.log", "wb") as log, \
            running_cluster(base, bookies=2, brokers=2, broker_args=BROKER_ARGS, output=log,
                            broker_cwd=cwd) as cluster, _http() as http:
        store = ZooKeeperMetadataStore.open(cluster.metadata_store)
        try:
            yield Shared(cluster, http, store, cwd)
        finally:
            store.close()


@pytest.fixture
def env(shared: Shared) -> Shared:
    """The shared cluster with both brokers running and live."""
    for broker in shared.cluster.brokers:
        if not broker.running:
            shared.cluster.start_broker(broker)
    wanted = sorted(b.address for b in shared.cluster.brokers)
    _wait(lambda: sorted(shared.http.get(f"{shared.cluster.broker_url}/admin/v2/brokers").json()) == wanted,
          f"brokers {wanted} live")
    return shared


def test_two_brokers_without_data_dir(env: Shared) -> None:
    cluster, http = env.cluster, env.http
    for broker in cluster.brokers:
        assert not any(arg.startswith("--data-dir") for arg in broker.command), broker.command
    namespace = "public/kic-two"
    _create_namespace(http, cluster.broker_url, namespace)
    topics = [Topic(namespace, f"two-{i}") for i in range(BUNDLES * 2)]
    served = {topic: _serve(http, cluster, topic) for topic in topics}
    idle = [b for b in cluster.brokers if b not in served.values()]
    if idle:  # the lookups chose one broker for all: one bundle moves to the other
        _move(http, cluster, topics[0], idle[0])
        served = {topic: _serve(http, cluster, topic) for topic in topics}
    per_broker = {b.name: next(t for t, owner in served.items() if owner is b) for b in cluster.brokers}
    keys = [f"acct-{i}" for i in range(20)]
    for broker in cluster.brokers:
        topic = per_broker[broker.name]
        load = Load.of(keys)
        with httpx.Client(base_url=_url(broker), timeout=WAIT_S, follow_redirects=False) as direct:
            for _ in range(3):
                _append_each(direct, topic, load, broker.name)
            stale = _post(direct, topic, broker.name, {keys[0]: 1}, [(keys[0], "stale")])
            assert stale.status_code == 409 and stale.json()["currentKeyVersions"] == {keys[0]: 2}, stale.text
            for key in keys:
                assert [(e["keyVersion"], e["payload"]) for e in _read_stream(direct, topic, key)] == \
                    [(v, f"{broker.name}-{key}-{v}") for v in range(3)], key
    assert list(env.cwd.iterdir()) == [], "a broker wrote to its working directory"


# --- (d) deleted and recreated ---------------------------------------------------------------------------


def test_deleted_topic_recreated_starts_over(env: Shared) -> None:
    cluster, http, store = env.cluster, env.http, env.store
    namespace = "public/kic-recreate"
    _create_namespace(http, cluster.broker_url, namespace)
    topic = Topic(namespace, "account-events")
    keys = [f"acct-{i}" for i in range(50)]
    owner = _serve(http, cluster, topic)
    old = Load.of(keys)
    with _http(_url(owner)) as client:
        for _ in range(2):
            _append_each(client, topic, old, "old")
    record = _checkpointed(store, topic)
    segments = [s["ledgerId"] for s in record["segments"]]
    assert segments, record
    admin = f"{cluster.broker_url}/admin/v2/persistent/{namespace}/{topic.local}"
    answer = http.delete(admin, params={"force": "true"})
    assert answer.status_code == 204, answer.text
    assert _record(store, topic) is None, "the deleted topic's key index record is still there"
    assert [i for i in segments if store.get(ledger_path(i)) is not None] == [], "its segment ledgers remain"
    gone = http.get(f"{cluster.broker_url}{topic.key_path(keys[0])}")
    assert gone.status_code == 404, gone.text
    created = http.put(admin)
    assert created.status_code == 204, created.text
    owner = _serve(http, cluster, topic)
    with _http(_url(owner)) as client:
        for key in keys:
            info = _key_info(client, topic, key)
            assert (info["version"], info["firstVersion"]) == (-1, 0), info
            assert _read_stream(client, topic, key) == [], key
        stale = _post(client, topic, "new", {keys[0]: 1}, [(keys[0], "stale")])
        assert stale.status_code == 409 and stale.json()["currentKeyVersions"] == {keys[0]: -1}, stale.text
        new = Load.of(keys)
        _append_each(client, topic, new, "new")
        for key in keys:
            assert [(e["keyVersion"], e["payload"]) for e in _read_stream(client, topic, key)] == \
                [(0, f"new-{key}-0")], key
    renewed = _record(store, topic)
    assert renewed is not None and renewed["incarnation"] != record["incarnation"], renewed


# --- (b) and (c): the owner killed during conditional appends ---------------------------------------------


def _kill_during_load(env: Shared, topic: Topic, owner: Process, load: Load, rng: random.Random,
                      context: str) -> tuple[Process, float]:
    """Writers on ``owner`` until a checkpoint was recorded and a seeded number of appends more
    were acknowledged; then ``owner`` is killed with SIGKILL. The broker that took the topic
    over, and the seconds that took."""
    writers = _start_writers(_url(owner), topic, load, rng, "kill")
    _checkpointed(env.store, topic)
    _wait_acks(load, load.acks + rng.randrange(50, 400), context)
    owner.stop(kill=True)
    killed_s = time.monotonic()
    _join(writers, load, context)
    survivor = next(b for b in env.cluster.brokers if b is not owner)
    _wait(lambda: _lookup(env.http, _url(survivor), topic)["brokerId"] == survivor.address,
          f"{survivor.name} serving {topic.full_name}; {context}")
    return survivor, time.monotonic() - killed_s


@pytest.mark.timeout(600)
def test_owner_kill9_during_conditional_appends(env: Shared) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    context = f"seed={seed}"
    namespace = "public/kic-kill"
    _create_namespace(env.http, env.cluster.broker_url, namespace)
    topic = Topic(namespace, "accounts")
    owner = _serve(env.http, env.cluster, topic)
    load = Load.of([f"acct-{i}" for i in range(KEYS)])
    with _http(_url(owner)) as client:
        _append_each(client, topic, load, "seed")
    survivor, took_s = _kill_during_load(env, topic, owner, load, rng, context)
    started_s = time.monotonic()
    with _http(_url(survivor)) as client:
        landed = _check_streams(client, topic, load, context)
    print(f"{context}: {load.acks} appends acknowledged over {KEYS} keys; {survivor.name} served the topic "
          f"{took_s:.1f} s after the kill; {len(load.in_flight)} requests in flight, {landed} of them durable; "
          f"checked in {time.monotonic() - started_s:.1f} s")


@pytest.mark.timeout(600)
def test_owner_kill9_after_retention_trimmed_half(env: Shared) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    context = f"seed={seed}"
    http, cluster = env.http, env.cluster
    namespace = "public/kic-trim"
    _create_namespace(http, cluster.broker_url, namespace)
    topic = Topic(namespace, "accounts")
    owner = _serve(http, cluster, topic)
    load = Load.of([f"acct-{i}" for i in range(KEYS)])
    with _http(_url(owner)) as client:  # the first half, in the topic's first ledger
        _append_each(client, topic, load, "seed")
    _join_after(_start_writers(_url(owner), topic, load, rng, "first"), load, load.acks + rng.randrange(200, 600),
                context)
    boundary = load.end_offset()
    owner = _move(http, cluster, topic, None)  # closes the first ledger, after a last checkpoint
    record = _record(env.store, topic)
    assert record is not None and record["indexedTo"] >= boundary, f"{record}, first half ends at {boundary}"
    _join_after(_start_writers(_url(owner), topic, load, rng, "second"), load, load.acks + rng.randrange(200, 600),
                context)
    other = next(b for b in cluster.brokers if b is not owner)
    _set_retention(http, _url(other), namespace, KEEP_NOTHING)
    probe, stream = next(iter(load.streams.items()))
    first = sum(1 for offset, _ in stream.acked.values() if offset < boundary)
    with _http(_url(owner)) as client:
        _wait(lambda: _key_info(client, topic, probe)["firstVersion"] == first,
              f"retention trimming the first half of {topic.full_name} (offsets below {boundary})")
    _set_retention(http, _url(other), namespace, KEEP_ALL)  # nothing more goes while the streams are checked
    survivor, took_s = _kill_during_load(env, topic, owner, load, rng, context)
    with _http(_url(survivor)) as client:
        landed = _check_streams(client, topic, load, context, trimmed_below=boundary)
    print(f"{context}: offsets below {boundary} trimmed; {load.acks} appends acknowledged over {KEYS} keys; "
          f"{survivor.name} served the topic {took_s:.1f} s after the kill; {landed} in-flight requests durable")


def _join_after(writers: list[threading.Thread], load: Load, acks: int, context: str) -> None:
    """Let ``writers`` run until ``acks`` appends were acknowledged, then stop them (each
    finishes its request: nothing stays in flight)."""
    _wait_acks(load, acks, context)
    load.stop.set()
    _join(writers, load, context)
    assert not load.in_flight, context
