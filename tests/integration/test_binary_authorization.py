"""Every binary command authorized, every time, against a real ``magnetar standalone`` with tokens on.

Roles: ``admin`` is a superuser; tenant ``secret`` (namespace ``secret/ns``) is granted only to
``alice``; ``mallory`` holds a valid token granted on ``public/default``. Checked on the wire:

- GET_SCHEMA of secret's topic is refused to mallory (its HTTP twin answers 403), with the same
  answer for a topic that does not exist;
- the command walk: every ``BaseCommand`` type a client may send is in the broker's table of
  permissions (``api/pulsar/permissions.py``), and each command naming a topic or a namespace
  is refused to a role without the permission, alike for an existing and a missing name, and
  served to one with it (a new command without a decision fails the walk); the walk and the
  GET_SCHEMA check run once on the plain listener and once on a broker with TLS on and the
  plain ports off (``webServicePort=``, ``brokerServicePort=``);
- revoking a grant closes the role's binary producers (CLOSE_PRODUCER, later sends refused)
  and consumers (CLOSE_CONSUMER, nothing more delivered), raw and with the official client;
- the 5,000th producer of a topic costs what the first does (create, send, close), and the
  5,000th consumer of a subscription what the first does (subscribe, deliver, ack, close),
  in the broker's CPU time per batch;
- per-role shares: one role filling its share of the topic-list watches does not keep another
  from watching; binary connections per role are bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar.permissions import COMMANDS, Needs
from api.pulsar.proto import pulsar_api_pb2 as pb
from api.pulsar.session import BROKER_ONLY
from consumers.cli.tokens import create_token
from tests.integration.pulsar_support import binary_broker, client
from tests.integration.pulsar_wire import RawConnection, T, command, entry, send_frame
from tests.standalone import REPO_ROOT, free_port, stop, wait_healthy
from tests.tls_material import make_material

SECRET = b"binary-authorization-secret-0123456789"
SCHEMA_DEFINITION = json.dumps({"type": "record", "name": "Salary", "fields": [
    {"name": "employee", "type": "string"}, {"name": "amount", "type": "int"}]})
SECRET_TOPIC = "persistent://secret/ns/payroll"
MISSING_TOPIC = "persistent://secret/ns/no-such-topic"
CONNECTIONS_PER_ROLE = 20
PRODUCER_BATCH = 1000
PRODUCER_BATCHES = 5
LAST_TO_FIRST_BATCH_RATIO_MAX = 2.0
QUIET_S = 1.0


@dataclass(frozen=True)
class Broker:
    http_url: str
    port: int
    pulsar_url: str
    pid: int
    ssl_context: ssl.SSLContext | None = None
    """How a client trusts the broker when it serves TLS only (None: plain listeners)."""

    def cpu_s(self) -> float:
        """CPU seconds the broker process used so far (every thread), from ``/proc/PID/stat``."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def token(role: str) -> str:
    return create_token(role, secret_key=SECRET)


def admin(method: str, url: str, body: object = None, verify: ssl.SSLContext | bool = True) -> None:
    response = httpx.request(method, url, json=body, headers={"Authorization": f"Bearer {token('admin')}"},
                             verify=verify, timeout=30)
    assert response.status_code in (200, 204), f"{method} {url}: {response.status_code} {response.text}"


def grant(broker: Broker, namespace: str, role: str, actions: list[str]) -> None:
    admin("POST", f"{broker.http_url}/admin/v2/namespaces/{namespace}/permissions/{role}", actions)


def revoke(broker: Broker, namespace: str, role: str) -> None:
    admin("DELETE", f"{broker.http_url}/admin/v2/namespaces/{namespace}/permissions/{role}")


def _configuration(directory: Path, **keys: str) -> Path:
    secret = directory / "secret.key"
    secret.write_bytes(SECRET)
    config = directory / "standalone.conf"
    config.write_text(f"authenticationEnabled=true\ntokenSecretKey=file://{secret}\nsuperUserRoles=admin\n"
                      f"brokerMaxConnectionsPerRole={CONNECTIONS_PER_ROLE}\n"
                      + "".join(f"{key}={value}\n" for key, value in keys.items()))
    return config


def _prepare(found: Broker) -> Broker:
    """Tenant ``secret`` with its schema'd topic, and the grants the roles need."""
    url, verify = found.http_url, found.ssl_context or True
    admin("PUT", f"{url}/admin/v2/tenants/secret", {"adminRoles": [], "allowedClusters": ["standalone"]}, verify)
    admin("PUT", f"{url}/admin/v2/namespaces/secret/ns", verify=verify)
    admin("POST", f"{url}/admin/v2/namespaces/secret/ns/permissions/alice", ["produce", "consume"], verify)
    admin("POST", f"{url}/admin/v2/namespaces/public/default/permissions/mallory", ["produce", "consume"], verify)
    admin("PUT", f"{url}/admin/v2/persistent/secret/ns/payroll", verify=verify)
    admin("POST", f"{url}/admin/v2/schemas/secret/ns/payroll/schema",
          {"type": "JSON", "schema": SCHEMA_DEFINITION, "properties": {"owner": "payroll-team"}}, verify)
    return found


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    directory = tmp_path_factory.mktemp("binary-authorization")
    config = _configuration(directory)
    with binary_broker(directory / "data", "--config", str(config)) as (http_url, pulsar_url, proc):
        yield _prepare(Broker(http_url, int(pulsar_url.rsplit(":", 1)[1]), pulsar_url, proc.pid))


@pytest.fixture(scope="module")
def tls_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The same broker with TLS on and the plain listeners off, started by its configuration alone."""
    directory = tmp_path_factory.mktemp("binary-authorization-tls")
    material = make_material(directory / "certs")
    web_port, pulsar_port = free_port(), free_port()
    config = _configuration(directory, webServicePort="", brokerServicePort="", webServicePortTls=str(web_port),
                            brokerServicePortTls=str(pulsar_port), tlsCertificateFilePath=str(material.server.cert),
                            tlsKeyFilePath=str(material.server.key), tlsTrustCertsFilePath=str(material.ca.cert))
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "standalone", "--data-dir", str(directory / "data"),
                             "--host", "127.0.0.1", "--config", str(config), "--log-level", "warning"],
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        web_url = f"https://127.0.0.1:{web_port}"
        wait_healthy(f"{web_url}/healthz", proc, verify=material.context())
        yield _prepare(Broker(web_url, pulsar_port, f"pulsar+ssl://127.0.0.1:{pulsar_port}", proc.pid,
                              material.context()))
    finally:
        stop(proc)


@pytest.fixture(params=["plain", "tls-only"])
def walked(request: pytest.FixtureRequest) -> Broker:
    """The broker a walk runs against: each walk runs on both listener kinds."""
    found: Broker = request.getfixturevalue("broker" if request.param == "plain" else "tls_only")
    return found


@contextlib.contextmanager
def connected(broker: Broker, role: str) -> Iterator[RawConnection]:
    with RawConnection(broker.port, ssl_context=broker.ssl_context) as conn:
        assert conn.connect(token=token(role)).type == T.CONNECTED
        yield conn


# --- GET_SCHEMA -------------------------------------------------------------------------------
def get_schema(conn: RawConnection, topic: str, request_id: int) -> pb.CommandGetSchemaResponse:
    conn.send_command(command(T.GET_SCHEMA, getSchema={"request_id": request_id, "topic": topic}))
    return conn.expect(T.GET_SCHEMA_RESPONSE).getSchemaResponse


def test_get_schema_is_refused_alike_for_a_forbidden_and_a_missing_topic(walked: Broker) -> None:
    with connected(walked, "alice") as alice:
        allowed = get_schema(alice, SECRET_TOPIC, 1)
        assert allowed.schema.schema_data == SCHEMA_DEFINITION.encode()  # the control: alice reads it
    with connected(walked, "mallory") as mallory:
        forbidden = get_schema(mallory, SECRET_TOPIC, 1)
        missing = get_schema(mallory, MISSING_TOPIC, 1)
    assert forbidden.error_code == pb.AuthorizationError, forbidden
    assert not forbidden.HasField("schema") and not forbidden.schema_version
    assert (missing.error_code, missing.HasField("schema")) == (forbidden.error_code, False)
    assert missing.error_message.replace(MISSING_TOPIC, "<topic>") == \
        forbidden.error_message.replace(SECRET_TOPIC, "<topic>")
    http = httpx.get(f"{walked.http_url}/admin/v2/schemas/secret/ns/payroll/schema",
                     headers={"Authorization": f"Bearer {token('mallory')}"}, verify=walked.ssl_context or True,
                     timeout=30)
    assert http.status_code == 403  # the HTTP twin's answer


# --- the command walk -------------------------------------------------------------------------
SCHEMA = {"name": "probe", "schema_data": b"", "type": pb.Schema.String}
NAMED_REQUESTS: dict[int, Callable[[str, int], pb.BaseCommand]] = {
    T.LOOKUP: lambda name, rid: command(T.LOOKUP, lookupTopic={"topic": name, "request_id": rid}),
    T.PARTITIONED_METADATA: lambda name, rid: command(T.PARTITIONED_METADATA, partitionMetadata={
        "topic": name, "request_id": rid}),
    T.PRODUCER: lambda name, rid: command(T.PRODUCER, producer={"topic": name, "producer_id": rid,
                                                                  "request_id": rid}),
    T.SUBSCRIBE: lambda name, rid: command(T.SUBSCRIBE, subscribe={
        "topic": name, "subscription": "walk", "subType": pb.CommandSubscribe.Shared, "consumer_id": rid,
        "request_id": rid}),
    T.GET_SCHEMA: lambda name, rid: command(T.GET_SCHEMA, getSchema={"topic": name, "request_id": rid}),
    T.GET_OR_CREATE_SCHEMA: lambda name, rid: command(T.GET_OR_CREATE_SCHEMA, getOrCreateSchema={
        "topic": name, "request_id": rid, "schema": SCHEMA}),
    T.GET_TOPICS_OF_NAMESPACE: lambda name, rid: command(T.GET_TOPICS_OF_NAMESPACE, getTopicsOfNamespace={
        "namespace": name, "request_id": rid}),
    T.WATCH_TOPIC_LIST: lambda name, rid: command(T.WATCH_TOPIC_LIST, watchTopicList={
        "namespace": name, "request_id": rid, "watcher_id": rid, "topics_pattern": ".*"}),
}
"""How the walk spells each command that names a topic or a namespace."""
OWNED_REQUESTS: dict[int, Callable[[int], pb.BaseCommand | bytes]] = {
    T.SEND: lambda oid: send_frame(oid, 0, entry(b"x")),
    T.CLOSE_PRODUCER: lambda oid: command(T.CLOSE_PRODUCER, close_producer={"producer_id": oid, "request_id": oid}),
    T.FLOW: lambda oid: command(T.FLOW, flow={"consumer_id": oid, "messagePermits": 10}),
    T.ACK: lambda oid: command(T.ACK, ack={"consumer_id": oid, "ack_type": pb.CommandAck.Individual,
                                           "request_id": oid}),
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: lambda oid: command(
        T.REDELIVER_UNACKNOWLEDGED_MESSAGES, redeliverUnacknowledgedMessages={"consumer_id": oid}),
    T.SEEK: lambda oid: command(T.SEEK, seek={"consumer_id": oid, "request_id": oid, "message_publish_time": 0}),
    T.GET_LAST_MESSAGE_ID: lambda oid: command(T.GET_LAST_MESSAGE_ID, getLastMessageId={
        "consumer_id": oid, "request_id": oid}),
    T.UNSUBSCRIBE: lambda oid: command(T.UNSUBSCRIBE, unsubscribe={"consumer_id": oid, "request_id": oid}),
    T.CLOSE_CONSUMER: lambda oid: command(T.CLOSE_CONSUMER, close_consumer={"consumer_id": oid, "request_id": oid}),
    T.CONSUMER_STATS: lambda oid: command(T.CONSUMER_STATS, consumerStats={"consumer_id": oid, "request_id": oid}),
    T.WATCH_TOPIC_LIST_CLOSE: lambda oid: command(T.WATCH_TOPIC_LIST_CLOSE, watchTopicListClose={
        "watcher_id": oid, "request_id": oid}),
}
"""How the walk spells each command that names something its connection opened."""
CLIENT_COMMANDS = sorted(set(pb.BaseCommand.Type.values()) - BROKER_ONLY)


def test_every_client_command_has_a_permission(broker: Broker) -> None:
    missing = [T.Name(kind) for kind in CLIENT_COMMANDS if kind not in COMMANDS]
    assert not missing, f"client commands without a decision in api/pulsar/permissions.py: {missing}"
    assert not [T.Name(kind) for kind in COMMANDS if kind in BROKER_ONLY], "the table names broker-only commands"
    for kind, rule in COMMANDS.items():
        if rule.needs in (Needs.TOPIC, Needs.NAMESPACE):
            assert kind in NAMED_REQUESTS, f"the walk cannot spell {T.Name(kind)}: add it to NAMED_REQUESTS"
            assert rule.actions, f"{T.Name(kind)} names a {rule.needs.value} but needs no action there"
        elif rule.needs in (Needs.PRODUCER, Needs.CONSUMER, Needs.WATCH):
            assert kind in OWNED_REQUESTS, f"the walk cannot spell {T.Name(kind)}: add it to OWNED_REQUESTS"
    connection = sorted(T.Name(k) for k, r in COMMANDS.items() if r.needs is Needs.CONNECTION)
    assert connection == ["AUTH_RESPONSE", "CONNECT", "PING", "PONG"]


def answer_of(conn: RawConnection) -> tuple[int, int, str]:
    """(command type, Pulsar error code or -1, error text) of the broker's answer."""
    got = conn.expect(*pb.BaseCommand.Type.values())
    for descriptor, body in got.ListFields():
        if descriptor.name == "type":
            continue
        for name in ("error", "error_code"):
            if hasattr(body, name) and body.HasField(name):
                return got.type, getattr(body, name), getattr(body, "message", getattr(body, "error_message", ""))
    return got.type, -1, ""


def named(kind: int, topic: str) -> str:
    return topic.removeprefix("persistent://").rsplit("/", 1)[0] if COMMANDS[kind].needs is Needs.NAMESPACE \
        else topic


@pytest.mark.parametrize("kind", [k for k in CLIENT_COMMANDS if k in NAMED_REQUESTS], ids=T.Name)
def test_a_command_naming_a_topic_demands_its_permission(walked: Broker, kind: int) -> None:
    build = NAMED_REQUESTS[kind]
    with connected(walked, "mallory") as mallory:
        mallory.send_command(build(named(kind, SECRET_TOPIC), 1))
        forbidden = answer_of(mallory)
        mallory.send_command(build(named(kind, MISSING_TOPIC) if COMMANDS[kind].needs is Needs.TOPIC
                                   else "secret/none", 2))
        missing = answer_of(mallory)
    assert forbidden[1] == pb.AuthorizationError, f"{T.Name(kind)} for mallory answered {forbidden}"
    assert missing[:2] == forbidden[:2], f"a missing name answered {missing}, a forbidden one {forbidden}"
    with connected(walked, "alice") as alice:
        alice.send_command(build(named(kind, SECRET_TOPIC), 1))
        allowed = answer_of(alice)
    assert allowed[1] not in (pb.AuthorizationError, pb.AuthenticationError), f"alice was refused: {allowed}"


@pytest.mark.parametrize("kind", [k for k in CLIENT_COMMANDS if k in OWNED_REQUESTS], ids=T.Name)
def test_a_command_naming_another_connections_id_reaches_nothing(walked: Broker, kind: int) -> None:
    """Ids are per connection: alice's producer, consumer and watch 7 are not mallory's 7."""
    with connected(walked, "alice") as alice, connected(walked, "mallory") as mallory:
        alice.send_command(command(T.PRODUCER, producer={"topic": SECRET_TOPIC, "producer_id": 7, "request_id": 1}))
        alice.expect(T.PRODUCER_SUCCESS)
        alice.send_command(command(T.SUBSCRIBE, subscribe={
            "topic": SECRET_TOPIC, "subscription": "owned", "subType": pb.CommandSubscribe.Shared,
            "consumer_id": 7, "request_id": 2}))
        alice.expect(T.SUCCESS)
        request = OWNED_REQUESTS[kind](7)
        mallory.send(request) if isinstance(request, bytes) else mallory.send_command(request)
        try:
            got = mallory.next(QUIET_S)
        except TimeoutError:
            got = None  # silence: FLOW, REDELIVER and an ACK without a request id are not answered
        if got is not None and kind not in (T.CLOSE_PRODUCER, T.CLOSE_CONSUMER):  # closing nothing succeeds
            assert got.type in (T.ERROR, T.ACK_RESPONSE), f"{T.Name(kind)} answered {got}"
            body = got.error if got.type == T.ERROR else got.ackResponse
            assert body.error in (pb.TopicNotFound, pb.UnknownError, pb.ConsumerNotFound), got
        alice.send(send_frame(7, 0, entry(b"still alice's")))
        assert alice.expect(T.SEND_RECEIPT).send_receipt.producer_id == 7
        alice.send_command(command(T.CONSUMER_STATS, consumerStats={"consumer_id": 7, "request_id": 3}))
        assert alice.expect(T.CONSUMER_STATS_RESPONSE).consumerStatsResponse.request_id == 3


@pytest.mark.parametrize("kind", sorted(k for k, r in COMMANDS.items() if r.needs is Needs.UNSUPPORTED), ids=T.Name)
def test_an_unsupported_command_is_refused_to_everyone(walked: Broker, kind: int) -> None:
    with connected(walked, "admin") as conn:
        conn.send_command(pb.BaseCommand(type=kind))  # type: ignore[arg-type]
        got = conn.next()
        assert got is None or (got.type == T.ERROR and got.error.error == pb.NotAllowedError), got


# --- revocation -------------------------------------------------------------------------------
def publish_as_admin(broker: Broker, topic_path: str, payload: str) -> None:
    response = httpx.post(f"{broker.http_url}/topics/persistent/{topic_path}",
                          json={"messages": [{"payload": payload}]},
                          headers={"Authorization": f"Bearer {token('admin')}"}, timeout=30)
    assert response.status_code == 200, response.text


def test_revoking_a_grant_closes_binary_producers_and_consumers(broker: Broker) -> None:
    admin("PUT", f"{broker.http_url}/admin/v2/namespaces/public/revocable")
    grant(broker, "public/revocable", "mallory", ["produce", "consume"])
    grant(broker, "public/revocable", "bob", ["consume"])
    topic = "persistent://public/revocable/raw"
    with connected(broker, "mallory") as mallory, connected(broker, "bob") as bob:
        bob.send_command(command(T.SUBSCRIBE, subscribe={
            "topic": topic, "subscription": "bob", "subType": pb.CommandSubscribe.Shared, "consumer_id": 1,
            "request_id": 1, "force_topic_creation": True}))
        bob.expect(T.SUCCESS)
        bob.send_command(command(T.FLOW, flow={"consumer_id": 1, "messagePermits": 100}))
        mallory.send_command(command(T.PRODUCER, producer={"topic": topic, "producer_id": 1, "request_id": 1}))
        mallory.expect(T.PRODUCER_SUCCESS)
        mallory.send_command(command(T.SUBSCRIBE, subscribe={
            "topic": topic, "subscription": "s", "subType": pb.CommandSubscribe.Shared, "consumer_id": 1,
            "request_id": 2}))
        mallory.expect(T.SUCCESS)
        mallory.send_command(command(T.FLOW, flow={"consumer_id": 1, "messagePermits": 100}))
        mallory.send(send_frame(1, 0, entry(b"before")))
        assert {mallory.expect(T.SEND_RECEIPT, T.MESSAGE).type for _ in range(2)} == {T.SEND_RECEIPT, T.MESSAGE}
        revoke(broker, "public/revocable", "mallory")
        closed = {mallory.expect(T.CLOSE_PRODUCER, T.CLOSE_CONSUMER).type for _ in range(2)}
        assert closed == {T.CLOSE_PRODUCER, T.CLOSE_CONSUMER}
        mallory.send(send_frame(1, 1, entry(b"after", sequence_id=1)))
        refused = mallory.expect(T.SEND_ERROR).send_error
        assert (refused.producer_id, refused.sequence_id, refused.error) == (1, 1, pb.AuthorizationError)
        publish_as_admin(broker, "public/revocable/raw", "for nobody")
        with pytest.raises(TimeoutError):
            mallory.next(QUIET_S)  # no MESSAGE to the closed consumer
        mallory.send_command(command(T.PRODUCER, producer={"topic": topic, "producer_id": 2, "request_id": 3}))
        assert mallory.expect(T.ERROR).error.error == pb.AuthorizationError
        delivered = [bob.expect(T.MESSAGE).message for _ in range(2)]  # bob kept his grant: still served
        assert [m.message_id.entryId for m in delivered] == sorted(m.message_id.entryId for m in delivered)


def test_revoking_a_grant_ends_the_official_clients_producer_and_consumer(broker: Broker) -> None:
    admin("PUT", f"{broker.http_url}/admin/v2/namespaces/public/revocable-client")
    grant(broker, "public/revocable-client", "mallory", ["produce", "consume"])
    topic = "persistent://public/revocable-client/t"
    c = client(broker.pulsar_url, authentication=pulsar.AuthenticationToken(token("mallory")))
    try:
        consumer = c.subscribe(topic, "s")
        producer = c.create_producer(topic, send_timeout_millis=3000)
        producer.send(b"before")
        assert consumer.receive(10_000).data() == b"before"
        revoke(broker, "public/revocable-client", "mallory")
        time.sleep(QUIET_S)  # the broker closes her producer and consumer
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"after")
        publish_as_admin(broker, "public/revocable-client/t", "for nobody")
        with pytest.raises(pulsar.Timeout):
            consumer.receive(int(QUIET_S * 2000))
    finally:
        c.close()
    stored = httpx.get(f"{broker.http_url}/topics/persistent/public/revocable-client/t/messages",
                       params={"offset": 0, "maxMessages": 10}, headers={"Authorization": f"Bearer {token('admin')}"},
                       timeout=30).json()["messages"]
    assert len(stored) == 2  # "before" and the admin's: her send after the revocation was not stored


# --- O(1) producers ---------------------------------------------------------------------------
BATCH_ANSWER_WAIT_S = 120.0
"""How long one answer of a batch may take (the quadratic code took many seconds per batch)."""


def answers(conn: RawConnection, kind: int, count: int) -> None:
    for _ in range(count):
        got = conn.next(BATCH_ANSWER_WAIT_S)
        assert got is not None and got.type == kind, got


def producer_batch(broker: Broker, conn: RawConnection, topic: str, kept: range, churned: range,
                   ) -> tuple[float, float]:
    """(broker CPU seconds, wall seconds) to open the producers ``kept`` and ``churned``, send one
    message through each and close the ``churned`` ones, pipelined over the one connection."""
    ids = [*kept, *churned]
    started, started_cpu = time.perf_counter(), broker.cpu_s()
    conn.send(b"".join(_frame(command(T.PRODUCER, producer={"topic": topic, "producer_id": i, "request_id": i,
                                                            "producer_name": f"many-{i}"})) for i in ids))
    answers(conn, T.PRODUCER_SUCCESS, len(ids))
    conn.send(b"".join(send_frame(i, 0, entry(b"m", producer=f"many-{i}")) for i in ids))
    answers(conn, T.SEND_RECEIPT, len(ids))
    conn.send(b"".join(_frame(command(T.CLOSE_PRODUCER, close_producer={"producer_id": i, "request_id": i}))
                       for i in churned))
    answers(conn, T.SUCCESS, len(churned))
    return broker.cpu_s() - started_cpu, time.perf_counter() - started


def _frame(built: pb.BaseCommand) -> bytes:
    body: bytes = built.SerializeToString()
    return struct.pack(">II", len(body) + 4, len(body)) + body


def test_the_5000th_producer_costs_what_the_first_does(broker: Broker) -> None:
    """Batch k opens 1,000 producers that stay (k,000 open on the topic after it) and 1,000 that
    it closes again, sending one message through each: its cost is creating, sending and closing
    next to (k-1),000 open producers. The cost is the broker's CPU time (wall time is printed
    too: on a shared machine it says more about the neighbours)."""
    topic = "persistent://public/default/many-producers"
    with connected(broker, "mallory") as conn:
        producer_batch(broker, conn, topic, range(0), range(1_000_000, 1_000_000 + PRODUCER_BATCH))  # warm-up
        measured = []
        for batch in range(PRODUCER_BATCHES):
            first = 1 + 2 * batch * PRODUCER_BATCH
            measured.append(producer_batch(broker, conn, topic, range(first, first + PRODUCER_BATCH),
                                           range(first + PRODUCER_BATCH, first + 2 * PRODUCER_BATCH)))
    costs = [cpu for cpu, _ in measured]
    print(f"open, send and close, per batch of {2 * PRODUCER_BATCH}: broker CPU {[round(c, 2) for c in costs]} s, "
          f"wall {[round(w, 2) for _, w in measured]} s")
    assert costs[-1] < LAST_TO_FIRST_BATCH_RATIO_MAX * costs[0], costs


FEEDER_SEQUENCE = itertools.count()


def ack(message: pb.CommandMessage) -> pb.BaseCommand:
    built = command(T.ACK, ack={"consumer_id": message.consumer_id, "ack_type": pb.CommandAck.Individual})
    built.ack.message_id.add(ledgerId=message.message_id.ledgerId, entryId=message.message_id.entryId)
    return built


def consumer_batch(broker: Broker, conn: RawConnection, topic: str, kept: range, churned: range,
                   ) -> tuple[float, float]:
    """(broker CPU seconds, wall seconds) to subscribe the consumers ``kept`` and ``churned`` to
    one Shared subscription, give each a permit, deliver one message to each and have it
    acknowledged, then close the ``churned`` ones, pipelined over the one connection."""
    ids = [*kept, *churned]
    started, started_cpu = time.perf_counter(), broker.cpu_s()
    conn.send(b"".join(_frame(command(T.SUBSCRIBE, subscribe={
        "topic": topic, "subscription": "many", "subType": pb.CommandSubscribe.Shared, "consumer_id": i,
        "request_id": i})) for i in ids))
    answers(conn, T.SUCCESS, len(ids))
    conn.send(b"".join(_frame(command(T.FLOW, flow={"consumer_id": i, "messagePermits": 1})) for i in ids))
    sequence_ids = [next(FEEDER_SEQUENCE) for _ in ids]
    conn.send(b"".join(send_frame(0, n, entry(b"m", producer="feeder", sequence_id=n)) for n in sequence_ids))
    delivered: list[pb.CommandMessage] = []
    receipts = 0
    while len(delivered) < len(ids) or receipts < len(ids):
        got = conn.next(BATCH_ANSWER_WAIT_S)
        assert got is not None and got.type in (T.SEND_RECEIPT, T.MESSAGE), got
        if got.type == T.MESSAGE:
            delivered.append(got.message)
        else:
            receipts += 1
    assert len({m.consumer_id for m in delivered}) == len(ids)  # one each: the permits held
    conn.send(b"".join(_frame(ack(m)) for m in delivered))
    conn.send(b"".join(_frame(command(T.CLOSE_CONSUMER, close_consumer={"consumer_id": i, "request_id": i}))
                       for i in churned))
    answers(conn, T.SUCCESS, len(churned))
    return broker.cpu_s() - started_cpu, time.perf_counter() - started


def test_the_5000th_consumer_costs_what_the_first_does(broker: Broker) -> None:
    """As for producers: batch k subscribes 1,000 consumers that stay and 1,000 it closes again,
    each receiving and acknowledging one message, next to (k-1),000 consumers of the subscription."""
    topic = "persistent://public/default/many-consumers"
    with connected(broker, "mallory") as conn:
        conn.send_command(command(T.PRODUCER, producer={"topic": topic, "producer_id": 0, "request_id": 0,
                                                        "producer_name": "feeder"}))
        conn.expect(T.PRODUCER_SUCCESS)
        consumer_batch(broker, conn, topic, range(0), range(1_000_000, 1_000_000 + PRODUCER_BATCH))  # warm-up
        measured = []
        for batch in range(PRODUCER_BATCHES):
            first = 1 + 2 * batch * PRODUCER_BATCH
            measured.append(consumer_batch(broker, conn, topic, range(first, first + PRODUCER_BATCH),
                                           range(first + PRODUCER_BATCH, first + 2 * PRODUCER_BATCH)))
    costs = [cpu for cpu, _ in measured]
    print(f"subscribe, deliver, ack and close, per batch of {2 * PRODUCER_BATCH}: broker CPU "
          f"{[round(c, 2) for c in costs]} s, wall {[round(w, 2) for _, w in measured]} s")
    assert costs[-1] < LAST_TO_FIRST_BATCH_RATIO_MAX * costs[0], costs


# --- per-role shares --------------------------------------------------------------------------
WATCHES_PER_CONNECTION = 100
WATCH_POOL = 10_000


def watch_until_refused(broker: Broker, role: str, stack: contextlib.ExitStack) -> int:
    """Open topic-list watches as ``role`` (100 per connection) until one is refused: how many
    were granted (at most the broker-wide pool and one more connection)."""
    granted = 0
    for _ in range(WATCH_POOL // WATCHES_PER_CONNECTION + 1):
        conn = stack.enter_context(RawConnection(broker.port))
        if conn.connect(token=token(role)).type != T.CONNECTED:
            return granted
        conn.send(b"".join(_frame(command(T.WATCH_TOPIC_LIST, watchTopicList={
            "request_id": w, "watcher_id": w, "namespace": "public/default", "topics_pattern": "nothing-.*"}))
            for w in range(WATCHES_PER_CONNECTION)))
        answers = [conn.expect(T.WATCH_TOPIC_LIST_SUCCESS, T.ERROR) for _ in range(WATCHES_PER_CONNECTION)]
        granted += sum(a.type == T.WATCH_TOPIC_LIST_SUCCESS for a in answers)
        if any(a.type == T.ERROR for a in answers):
            return granted
    return granted


def test_one_role_filling_its_watch_share_leaves_others_theirs(broker: Broker) -> None:
    grant(broker, "public/default", "alice", ["consume"])
    with contextlib.ExitStack() as stack:
        granted = watch_until_refused(broker, "mallory", stack)
        print(f"mallory was granted {granted} topic-list watches")
        with connected(broker, "alice") as alice:
            alice.send_command(command(T.WATCH_TOPIC_LIST, watchTopicList={
                "request_id": 1, "watcher_id": 1, "namespace": "public/default", "topics_pattern": ".*"}))
            answer = alice.expect(T.WATCH_TOPIC_LIST_SUCCESS, T.ERROR)
    assert answer.type == T.WATCH_TOPIC_LIST_SUCCESS, f"alice refused after mallory took {granted}: {answer}"
    assert granted < WATCH_POOL


def test_binary_connections_per_role_are_bounded(broker: Broker) -> None:
    with contextlib.ExitStack() as stack:
        for _ in range(CONNECTIONS_PER_ROLE):
            stack.enter_context(connected(broker, "eve"))
        with RawConnection(broker.port) as refused:
            answer = refused.connect(token=token("eve"))
            assert answer.type == T.ERROR and answer.error.error == pb.TooManyRequests, answer
            assert refused.closes()
        with connected(broker, "alice"):
            pass  # another role still connects
    deadline = time.monotonic() + 10
    while True:  # once eve's connections are gone, her slots are hers again
        with RawConnection(broker.port) as again:
            if again.connect(token=token("eve")).type == T.CONNECTED:
                break
        assert time.monotonic() < deadline, "eve's slots were not released"
        time.sleep(0.1)
