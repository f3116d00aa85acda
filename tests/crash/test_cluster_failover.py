"""Two brokers share ZooKeeper and three bookies; topics move between them under load and nothing
acknowledged is lost.

Processes: one ZooKeeper (Debian's package), three ``magnetar bookie`` and two ``magnetar
broker`` on 127.0.0.1, each started with a known PID and stopped by it whatever happens. The
brokers' ZooKeeper sessions time out after ``SESSION_TIMEOUT_S``.

``test_unload_then_kill9_under_load``: 20 topics of a namespace with 8 bundles, each with a named
producer (numbered messages, so resends are deduplicated) and an Exclusive consumer, all through
the Python client with every broker in its service URL (lookups, 307s, reconnection).

1. The first lookups spread the topics over both brokers.
2. A bundle is unloaded under load: its topics move to the other broker and keep being
   produced and consumed there.
3. The broker serving the most topics is killed with SIGKILL: within the session timeout plus
   recovery its topics are served by the survivor, which fenced their last ledgers.
4. Every acknowledged publish was delivered; no payload is stored twice in any topic (read back
   whole); consumers resumed from their acknowledged positions: nothing acknowledged before the
   first phase ended is delivered again. Duplicated deliveries (of messages whose
   acknowledgement had not reached the broker) are counted and reported.

``test_split_brain_sigstop``: the owner of a topic (the first broker the clients list) is stopped
with SIGSTOP until its session expires and the other broker serves the topic, then gets SIGCONT.
It runs twice: ``expiry-seen``, where ZooKeeper's end of the session reaches the stopped broker
(ZooKeeper closes the connection, so the broker learns it at once after SIGCONT), and
``expiry-hidden``, where the broker's ZooKeeper connection goes through a ``TcpLink`` that holds
it silent from the SIGSTOP on, as a partition would: after SIGCONT the broker still believes it
owns the topic until its own heartbeat times out.

1. ``expiry-seen``, an append in flight: with the load paused, the three bookies are stopped, a
   REST publish is sent to the owner, and once the bookies' kernels hold the owner's bytes for
   it (unread receive queues, ``/proc/net/tcp``) the owner is stopped and the bookies resumed.
   A bookie reads its sockets in order, so it stores that entry before the new owner's fence
   can reach it: the entry is part of the ledger the new owner recovers and is stored exactly
   once, whatever the stopped broker answers after SIGCONT (200 when the bookies'
   acknowledgements reach it first, an error when its own bookie timeouts fire first: a client
   does not know). ``expiry-hidden`` stops the owner with nothing in flight, at a moment when
   none of its ZooKeeper requests waits for an answer (a heartbeat would time out at once).
2. A REST publish sent to the stopped broker waits in its socket and is processed after
   SIGCONT. It is never answered 200 and never stored. With the expiry seen, whether it is
   refused as fenced or as no longer served here is a race between kazoo's thread and the
   broker's loop, both woken by SIGCONT: the test reports which, and when the answer is
   ``ledger_fenced`` the broker's ``magnetar_appends_fenced_total`` must count it. With the
   expiry hidden the broker appends to its old ledger: the bookies refuse it as fenced (the
   broker logs it), the publish is answered 409 ``ledger_fenced``, and the counter counts it.
3. The old owner then sends lookups to the new one; every acknowledged message is stored once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from broker.bookkeeper.bookie_network import BookieNetwork
from broker.bookkeeper.ledger_metadata import LedgerMetadata, ledger_path
from broker.bookkeeper.remote_bookie import RemoteBookie
from broker.errors import MagnetarError
from broker.managed_ledger import ML_ROOT
from broker.metadata.zookeeper import ZooKeeperMetadataStore
from broker.offset_index import LedgerInfo
from broker.topic_name import TopicName
from consumers.cluster_launcher import Cluster, Process, running_cluster
from tests.crash.cluster_load import ClusterLoad, stored_payloads
from tests.tcp_link import TcpLink

pytestmark = pytest.mark.crash

NAMESPACE = "public/failover"
TOPICS = 20
BUNDLES = 8
SESSION_TIMEOUT_S = 4.0
BROKER_ARGS = ("--zk-session-timeout-s", str(SESSION_TIMEOUT_S), "--load-report-interval-ms", "500",
               "--bookie-timeout-ms", "3000", "--autorecovery-interval-ms", "500", "--audit-interval-ms", "2000",
               "--log-level", "info")
ACKS_PER_PHASE = 15
PHASE_DEADLINE_S = 120.0
RECOVERY_BOUND_S = 60.0
"""A moved topic must be served again within the session timeout plus this (recovery, lookups)."""
IN_FLIGHT_PAD_BYTES = 8192
"""The in-flight append's size: far more than anything else the owner sends its bookies while
the load is paused, so the bookies' unread bytes from the owner show that the append left it."""


def _http() -> httpx.Client:
    return httpx.Client(timeout=30.0, follow_redirects=True, max_redirects=5)


def _owner(http: httpx.Client, broker: str, topic: str) -> str:
    response = http.get(f"{broker}/lookup/v2/topic/persistent/{NAMESPACE}/{topic}")
    response.raise_for_status()
    return str(response.json()["brokerId"])


def _lookup(http: httpx.Client, broker: str, topic: str) -> dict[str, Any]:
    response = http.get(f"{broker}/lookup/v2/topic/persistent/{NAMESPACE}/{topic}")
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def _create_namespace(http: httpx.Client, broker: str) -> None:
    response = http.put(f"{broker}/admin/v2/namespaces/{NAMESPACE}", json={  # retention: every message is read back
        "bundles": {"numBundles": BUNDLES},
        "retention_policies": {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}})
    assert response.status_code == 204, response.text


def _broker_urls(cluster: Cluster) -> dict[str, str]:
    return {broker.address: f"http://{broker.address}" for broker in cluster.brokers}


def _check_stored_once(http: httpx.Client, broker: str, load: ClusterLoad) -> dict[str, int]:
    """Every acknowledged payload is stored, none twice; returns the stored count per topic."""
    counts = {}
    for topic in load.topics:
        short = topic.rsplit("/", 1)[1]
        stored = stored_payloads(http, broker, NAMESPACE, short)
        assert len(stored) == len(set(stored)), f"{short}: a payload is stored twice"
        acked = load.records[topic].acked
        assert acked <= set(stored), f"{short}: {len(acked - set(stored))} acknowledged payloads are not stored"
        counts[short] = len(stored)
    return counts


def test_unload_then_kill9_under_load(tmp_path: Path) -> None:
    log = open(tmp_path / "cluster.log", "wb")  # noqa: SIM115 - closed at the end, after the processes
    try:
        with running_cluster(tmp_path, bookies=3, brokers=2, broker_args=BROKER_ARGS, output=log) as cluster, \
                _http() as http:
            urls = _broker_urls(cluster)
            first = cluster.broker_url
            _create_namespace(http, first)
            topics = [f"persistent://{NAMESPACE}/t{i}" for i in range(TOPICS)]
            load = ClusterLoad(cluster.service_url, topics)
            load.start()
            try:
                _scenario(cluster, http, urls, load)
            finally:
                load.stop()
    finally:
        log.close()


def _scenario(cluster: Cluster, http: httpx.Client, urls: dict[str, str], load: ClusterLoad) -> None:
    first = cluster.broker_url
    assert load.wait_acks(dict.fromkeys(load.topics, ACKS_PER_PHASE), time.monotonic() + PHASE_DEADLINE_S), \
        f"phase 1 acks: {load.acked_counts()}"
    # Phase 1 settles: producing pauses, every acknowledged message is delivered and acknowledged.
    load.pause_producing()
    assert load.wait_all_delivered(time.monotonic() + PHASE_DEADLINE_S), f"undelivered: {load.missing()}"
    time.sleep(0.5)  # the consumers' acknowledgements of the last deliveries reach the broker
    with load.lock:
        settled = {t: set(r.delivered) for t, r in load.records.items()}
    load.resume_producing()

    # 1. The first lookups spread the topics over both brokers.
    lookups = {t: _lookup(http, first, t.rsplit("/", 1)[1]) for t in load.topics}
    owners = {t: str(found["brokerId"]) for t, found in lookups.items()}
    per_broker = {b: sorted(t for t, o in owners.items() if o == b) for b in urls}
    print(f"topics per broker after the first lookups: { {b: len(ts) for b, ts in per_broker.items()} }")
    assert all(per_broker.values()), f"a broker serves no topic: {per_broker}"

    # 2. Unload a bundle with topics under load: they move to the other broker.
    bundle_of = {t: str(found["bundle"]) for t, found in lookups.items()}
    moving_bundle = bundle_of[load.topics[0]]
    moving = [t for t in load.topics if bundle_of[t] == moving_bundle]
    old_owner = owners[load.topics[0]]
    before = load.acked_counts()
    range_name = moving_bundle.rsplit("/", 1)[1]
    response = http.put(f"{first}/admin/v2/namespaces/{NAMESPACE}/{range_name}/unload")
    assert response.status_code == 204, response.text
    assert load.wait_acks({t: before[t] + ACKS_PER_PHASE for t in load.topics}, time.monotonic() + PHASE_DEADLINE_S), \
        f"after the unload: {load.acked_counts()} (before {before})"
    moved_to = {t: _owner(http, first, t.rsplit("/", 1)[1]) for t in moving}
    print(f"unloaded {moving_bundle} ({len(moving)} topics) from {old_owner}: now on {set(moved_to.values())}")
    assert all(o != old_owner for o in moved_to.values()), moved_to

    # 3. kill -9 the broker serving the most topics, under load.
    owners = {t: _owner(http, first, t.rsplit("/", 1)[1]) for t in load.topics}
    victim_id = max(urls, key=lambda b: sum(1 for o in owners.values() if o == b))
    survivor_id = next(b for b in urls if b != victim_id)
    victims = [t for t, o in owners.items() if o == victim_id]
    victim = next(b for b in cluster.brokers if b.address == victim_id)
    before = load.acked_counts()
    killed_s = time.monotonic()
    victim.stop(kill=True)
    assert load.wait_acks({t: before[t] + ACKS_PER_PHASE for t in load.topics}, time.monotonic() + PHASE_DEADLINE_S), \
        f"after kill -9 of {victim_id}: {load.acked_counts()} (before {before}); errors: "\
        f"{ {t: r.errors[-2:] for t, r in load.records.items() if r.errors} }"
    with load.lock:
        served_again_s = max(load.records[t].last_ack_s for t in victims) - killed_s
    print(f"kill -9 {victim_id}: {len(victims)} topics moved to {survivor_id}; the last of them had "
          f"{ACKS_PER_PHASE} new acknowledgements {served_again_s:.1f} s after the kill "
          f"(session timeout {SESSION_TIMEOUT_S:g} s)")
    assert served_again_s < SESSION_TIMEOUT_S + RECOVERY_BOUND_S
    survivor = urls[survivor_id]
    assert all(_owner(http, survivor, t.rsplit("/", 1)[1]) == survivor_id for t in victims)

    # 4. Nothing acknowledged lost, nothing stored twice, consumers resumed where they acknowledged.
    load.pause_producing()
    assert load.wait_all_delivered(time.monotonic() + PHASE_DEADLINE_S), f"undelivered: {load.missing()}"
    stored = _check_stored_once(http, survivor, load)
    with load.lock:
        redelivered_settled = {t: sum(1 for p in settled[t] if r.delivered[p] > 1) for t, r in load.records.items()}
        errors = {t: r.errors[:3] for t, r in load.records.items() if r.errors}
    duplicates = load.duplicates()
    print(f"stored {sum(stored.values())} messages in {len(stored)} topics, each once; "
          f"{sum(len(r.acked) for r in load.records.values())} acknowledged, all delivered; "
          f"duplicate deliveries (unacknowledged at the move): {sum(duplicates.values())} {duplicates}; "
          f"client errors seen and retried: {errors}")
    assert not any(redelivered_settled.values()), f"acknowledged before the moves, delivered again: " \
                                                  f"{redelivered_settled}"


@pytest.mark.parametrize("expiry_seen", [True, False], ids=["expiry-seen", "expiry-hidden"])
def test_split_brain_sigstop(tmp_path: Path, expiry_seen: bool) -> None:
    log = open(tmp_path / "cluster.log", "wb")  # noqa: SIM115 - closed at the end, after the processes
    try:
        with contextlib.ExitStack() as stack:
            links: list[TcpLink] = []

            def via(index: int, zookeeper: str) -> str:
                if index != 0 or expiry_seen:
                    return zookeeper
                links.append(stack.enter_context(TcpLink(zookeeper)))
                return links[0].address

            cluster = stack.enter_context(running_cluster(tmp_path, bookies=3, brokers=2, broker_args=BROKER_ARGS,
                                                          output=log, zookeeper_via=via))
            http = stack.enter_context(_http())
            _split_brain(cluster, http, tmp_path, log, links[0] if links else None)
    finally:
        log.close()


def _split_brain(cluster: Cluster, http: httpx.Client, tmp_path: Path, log: IO[bytes], link: TcpLink | None) -> None:
    urls = _broker_urls(cluster)
    first = cluster.broker_url
    _create_namespace(http, first)
    topic = "brain"
    # The owner to stop is the first broker of the clients' service URL (the harder case: their
    # lookups try it first, and a stopped broker accepts connections but never answers).
    found = _lookup(http, first, topic)
    if found["brokerId"] != cluster.brokers[0].address:
        _lookup(http, urls[found["brokerId"]], topic)  # the assigned broker takes the bundle
        range_name = str(found["bundle"]).rsplit("/", 1)[1]
        moved = http.put(f"{first}/admin/v2/namespaces/{NAMESPACE}/{range_name}/unload",
                         params={"destinationBroker": cluster.brokers[0].address})
        assert moved.status_code == 204, moved.text
    assert _owner(http, first, topic) == cluster.brokers[0].address
    load = ClusterLoad(cluster.service_url, [f"persistent://{NAMESPACE}/{topic}"])
    load.start()
    stopped = None
    paused: list[Process] = []
    try:
        assert load.wait_acks({load.topics[0]: ACKS_PER_PHASE}, time.monotonic() + PHASE_DEADLINE_S)
        owner_id = _owner(http, first, topic)
        other_id = next(b for b in urls if b != owner_id)
        stopped = next(b for b in cluster.brokers if b.address == owner_id)
        assert stopped.proc is not None
        owner_url = urls[owner_id]
        load.pause_producing()
        assert load.wait_all_delivered(time.monotonic() + PHASE_DEADLINE_S), f"undelivered: {load.missing()}"
        ledger_id, ensemble = _current_ledger(cluster, topic)

        marker, in_flight_payload, in_flight_answer = "", "", None
        if link is None:
            # 1. An append in flight: the bookies are stopped, the owner sends them an entry (it
            # waits unread in their sockets, the owner waits for the answers), and the owner is stopped.
            marker = f"in-flight {os.urandom(8).hex()} "
            in_flight_payload = marker + "x" * IN_FLIGHT_PAD_BYTES
            for bookie in cluster.bookies:
                assert bookie.proc is not None
                os.kill(bookie.proc.pid, signal.SIGSTOP)
                paused.append(bookie)
            in_flight_answer = _publish_in_thread(owner_url, topic, "in-flight", in_flight_payload)
            deadline_s = time.monotonic() + PHASE_DEADLINE_S
            while time.monotonic() < deadline_s:
                unread = {b: _unread_from(b, stopped.proc.pid) for b in ensemble}
                if all(n >= len(in_flight_payload) for n in unread.values()):
                    break
                time.sleep(0.01)
            else:
                raise AssertionError(f"the owner's append did not reach the stopped bookies {ensemble}: {unread}")
            os.kill(stopped.proc.pid, signal.SIGSTOP)
        else:
            # 1. The owner is stopped while none of its ZooKeeper requests (a heartbeat) waits for
            # an answer, and the link then hides ZooKeeper's end of the session from it.
            _stop_with_nothing_asked(stopped.proc.pid, link)
        stopped_s = time.monotonic()
        if link is not None:
            assert link.hold() == 1, "the owner does not have one ZooKeeper connection through the link"
        # 2. A publish sent to the stopped owner waits in its socket; it is processed after SIGCONT.
        late_answer = _publish_in_thread(owner_url, topic, "late", "late")
        if paused:
            for bookie in paused:
                assert bookie.proc is not None
                os.kill(bookie.proc.pid, signal.SIGCONT)
            paused.clear()
            # The bookies read the append before anything the other broker sends later (the
            # fence): they store it, so it belongs to the ledger the other broker recovers.
            holders = _bookies_holding(ensemble, ledger_id, marker.encode(), time.monotonic() + PHASE_DEADLINE_S)
            assert holders == set(ensemble), f"the in-flight entry is on {holders}, not on all of {ensemble}"

        # 3. The other broker takes the topic once the stopped one's session expired.
        deadline_s = time.monotonic() + PHASE_DEADLINE_S
        while time.monotonic() < deadline_s:
            try:
                if _owner(http, urls[other_id], topic) == other_id:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"{other_id} did not take {topic} over")
        taken_s = time.monotonic() - stopped_s
        load.resume_producing()
        before = load.acked_counts()[load.topics[0]]
        assert load.wait_acks({load.topics[0]: before + ACKS_PER_PHASE}, time.monotonic() + PHASE_DEADLINE_S)
        os.kill(stopped.proc.pid, signal.SIGCONT)
        late = late_answer.result(130)
        in_flight = in_flight_answer.result(130) if in_flight_answer is not None else None
        fenced_appends = _metric(http, owner_url, "magnetar_appends_fenced_total")
        print(f"SIGSTOP {owner_id} (ZooKeeper's end of its session {'hidden' if link else 'seen'}): {other_id} "
              f"served {topic} {taken_s:.1f} s later; after SIGCONT the stopped broker answered "
              + (f"the append it had in flight (stored by the bookies before the fence) with {_shown(in_flight)} "
                 "and " if in_flight is not None else "")
              + f"the publish waiting in its socket with {_shown(late)}; "
              f"it counts {fenced_appends:g} appends refused as fenced")
        assert not (isinstance(late, httpx.Response) and late.status_code == 200), \
            "the stopped broker appended to a fenced ledger"
        if link is not None:  # it believed it still owned the topic: the bookies refused its append
            assert isinstance(late, httpx.Response) and late.status_code == 409, _shown(late)
        for outcome in (in_flight, late):
            if isinstance(outcome, httpx.Response) and outcome.status_code == 409:
                assert outcome.json()["code"] == "ledger_fenced", outcome.text
                assert fenced_appends >= 1, "a publish was refused as fenced, and the broker did not count it"
        log.flush()
        logged = sum(1 for line in (tmp_path / "cluster.log").read_text(errors="replace").splitlines()
                     if "failed: fenced" in line)
        print(f"fenced ledgers the stopped broker logged: {logged}")
        if link is not None:
            assert logged >= 1, "the bookies refused none of the stopped broker's appends as fenced"
        # 4. The old owner gave the bundle up: it now sends the topic's lookups to the new owner.
        deadline_s = time.monotonic() + PHASE_DEADLINE_S
        while time.monotonic() < deadline_s:
            try:
                if _lookup(http, urls[owner_id], topic)["brokerId"] == other_id:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"{owner_id} still claims {topic} after SIGCONT")
        # 5. Nothing stored twice, nothing acknowledged lost; the in-flight entry is stored once
        # (whatever the stopped broker answered), the late publish not at all.
        load.pause_producing()
        assert load.wait_all_delivered(time.monotonic() + PHASE_DEADLINE_S), f"undelivered: {load.missing()}"
        stored = stored_payloads(http, urls[other_id], NAMESPACE, topic)
        assert b"late" not in stored
        if in_flight_payload:
            assert stored.count(in_flight_payload.encode()) == 1, "the in-flight entry is not stored exactly once"
        assert len(stored) == len(set(stored)), "a payload is stored twice"
        assert load.records[load.topics[0]].acked <= set(stored)
        print(f"{len(stored)} messages stored once each; {load.duplicates()} duplicate deliveries")
    finally:
        for process in (*paused, stopped):
            if process is not None and process.proc is not None and process.proc.poll() is None:
                os.kill(process.proc.pid, signal.SIGCONT)
        load.stop()


def _stop_with_nothing_asked(pid: int, link: TcpLink) -> None:
    """SIGSTOP ``pid`` at a moment when none of its requests through ``link`` waits for an
    answer (checked again once it is stopped: a request may leave between the check and the
    signal; then it is resumed and stopped again)."""
    deadline_s = time.monotonic() + PHASE_DEADLINE_S
    while True:
        assert time.monotonic() < deadline_s, "the owner's ZooKeeper requests are never all answered"
        if link.answered():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.05)  # what left before the signal reaches the link, and its answer comes back
            if link.answered():
                return
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.001)


def _publish_in_thread(broker_url: str, topic: str, producer: str, payload: str) -> Future[httpx.Response | Exception]:
    """POST one message to ``broker_url`` from a thread; the future holds the answer (redirects
    not followed: only that broker's own answer) or the exception."""
    answer: Future[httpx.Response | Exception] = Future()

    def publish() -> None:
        try:
            with httpx.Client(timeout=120.0) as direct:
                answer.set_result(direct.post(f"{broker_url}/topics/persistent/{NAMESPACE}/{topic}", json={
                    "producerName": producer, "messages": [{"payload": payload, "sequenceId": 1}]}))
        except Exception as exc:
            answer.set_result(exc)

    threading.Thread(target=publish, daemon=True).start()
    return answer


def _shown(outcome: httpx.Response | Exception) -> str:
    return f"{outcome.status_code} {outcome.text[:160]}" if isinstance(outcome, httpx.Response) else repr(outcome)


def _metric(http: httpx.Client, broker_url: str, name: str) -> float:
    """One counter of the broker's ``/metrics`` (asked again while it answers 503: a broker
    getting its new ZooKeeper session)."""
    deadline_s = time.monotonic() + PHASE_DEADLINE_S
    response = http.get(f"{broker_url}/metrics")
    while response.status_code == 503 and time.monotonic() < deadline_s:
        time.sleep(0.2)
        response = http.get(f"{broker_url}/metrics")
    response.raise_for_status()
    for line in response.text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{broker_url}/metrics has no {name}")


def _current_ledger(cluster: Cluster, topic: str) -> tuple[int, list[str]]:
    """The topic's current ledger and the bookies of its last fragment, from ZooKeeper."""
    store = ZooKeeperMetadataStore.open(cluster.metadata_store)
    try:
        name = TopicName.parse(f"persistent://{NAMESPACE}/{topic}").managed_ledger_name
        listed = store.get(f"{ML_ROOT}/{name}")
        assert listed is not None, f"{name} has no ledger list"
        ledger_id = LedgerInfo.from_json(json.loads(listed.value)["ledgers"][-1]).ledger_id
        meta = store.get(ledger_path(ledger_id))
        assert meta is not None, f"ledger {ledger_id} has no metadata"
        return ledger_id, LedgerMetadata.from_json(meta.value).fragments[-1][1]
    finally:
        store.close()


def _unread_from(bookie_id: str, sender_pid: int) -> int:
    """Bytes the bookie at ``bookie_id`` has not read yet from the connections of process
    ``sender_pid`` (the kernel's receive queues, from ``/proc/net/tcp``)."""
    port = int(bookie_id.rsplit(":", 1)[1])
    inodes = set()
    for fd in Path(f"/proc/{sender_pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    rows = []  # (local port, remote port, receive queue, inode) of every TCP socket
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                rows.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16),
                             int(fields[4].split(":")[1], 16), int(fields[9])))
    sender_ports = {local for local, remote, _, inode in rows if inode in inodes and remote == port}
    return sum(queued for local, remote, queued, _ in rows if local == port and remote in sender_ports)


def _bookies_holding(ensemble: list[str], ledger_id: int, marker: bytes, deadline_s: float) -> set[str]:
    """The bookies of ``ensemble`` that hold an entry of ``ledger_id`` containing ``marker``
    (asked over the bookie protocol until all do or the deadline passes)."""
    network = BookieNetwork()
    holders: set[str] = set()
    try:
        while time.monotonic() < deadline_s and len(holders) < len(ensemble):
            for bookie_id in ensemble:
                if bookie_id in holders:
                    continue
                bookie = RemoteBookie(bookie_id, network)
                with contextlib.suppress(MagnetarError):
                    last = bookie.last_entry_id(ledger_id)
                    if last >= 0 and any(marker in e.payload for e in
                                         bookie.read_entries(ledger_id, max(0, last - 20), last)):
                        holders.add(bookie_id)
            time.sleep(0.1)
    finally:
        network.close()
    return holders
