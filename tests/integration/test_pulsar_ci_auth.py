"""Authentication and authorization as Pulsar's own client CI configures them, with the official client.

One broker configured as ``pulsar-client-python``'s CI configures Pulsar (``pulsar_ci.py``): auth
on, ``anonymousUserRole=anonymous``, the TLS, token and Basic providers side by side, the
tenants and namespaces made through admin v2 right after start. Each test covers one item: the
CI's setup landing with its policies, the anonymous role on every transport, Basic (htpasswd:
apr1, crypt, bcrypt), TLS client certificates, tokens, an unknown method, and lookups that need
produce or consume rather than tenant admin. Every refusal must come within ``REFUSAL_S_MAX``.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar.proto import pulsar_api_pb2 as pb
from tests.integration.pulsar_ci import (
    BASIC_USERS,
    REFUSAL_S_MAX,
    SETUP,
    TLS_ROLE,
    TOKEN_ROLE,
    CiBroker,
    ci_broker,
    refused_fast,
)
from tests.integration.pulsar_wire import RawConnection, command
from tests.integration.ws_client import open_ws, produce, refused_status, ws_base

T = pb.BaseCommand.Type
RECEIVE_MS = 10_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CiBroker]:
    with ci_broker(tmp_path_factory.mktemp("pulsar-ci")) as running:
        yield running


def unique(namespace: str) -> str:
    return f"persistent://{namespace}/t-{uuid.uuid4().hex[:10]}"


def round_trip(client: pulsar.Client, topic: str) -> bytes:
    """Subscribe, produce one message, receive it: what the CI's tests do first."""
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    client.create_producer(topic).send(b"hello")
    data: bytes = consumer.receive(RECEIVE_MS).data()
    return data


def grant(broker: CiBroker, namespace: str, role: str, actions: list[str]) -> None:
    response = broker.admin("POST", f"namespaces/{namespace}/permissions/{role}", json=actions)
    assert response.status_code == 204, response.text


def test_the_ci_setup_lands_with_its_policies(broker: CiBroker) -> None:
    assert broker.setup_statuses == {path: 204 for path, _ in SETUP}
    for path, body in SETUP:
        if path.startswith("namespaces/"):
            shown = broker.admin("GET", path).json()
            granted = {role: sorted(actions) for role, actions in body["auth_policies"]["namespace_auth"].items()}
            assert shown["auth_policies"]["namespace_auth"] == granted, path
            assert shown["replication_clusters"] == ["standalone"], path
    assert broker.admin("GET", "tenants/public").json()["adminRoles"] == ["anonymous"]
    cluster = broker.admin("GET", "clusters/standalone")
    assert cluster.status_code == 200 and cluster.json()["serviceUrl"]
    assert broker.admin("GET", "clusters").json() == ["standalone"]
    # the namespaces exist now: a second PUT is the conflict Pulsar answers, nothing is overwritten
    assert broker.admin("PUT", "namespaces/public/default", json={}).status_code == 409
    assert broker.admin("PUT", "clusters/standalone", json=SETUP[0][1]).status_code == 409


def test_a_namespace_body_as_pulsar_admin_sends_it(broker: CiBroker) -> None:
    """``pulsar-admin namespaces create -c standalone`` sends Pulsar's whole ``Policies``."""
    body = {"auth_policies": {"namespace_auth": {"anonymous": ["consume"]}, "destination_auth": {},
                              "subscription_auth_roles": {}},
            "replication_clusters": ["standalone"], "backlog_quota_map": {}, "clusterDispatchRate": {},
            "topicDispatchRate": {}, "subscriptionDispatchRate": {}, "publishMaxMessageRate": {},
            "latency_stats_sample_rate": {}, "deleted": False, "encryption_required": False,
            "subscription_auth_mode": "None", "properties": {}, "is_allow_auto_update_schema": True}
    name = f"public/ns-{uuid.uuid4().hex[:8]}"
    created = broker.admin("PUT", f"namespaces/{name}", json=body)
    assert created.status_code == 204, created.text
    shown = broker.admin("GET", f"namespaces/{name}").json()
    assert shown["auth_policies"]["namespace_auth"] == {"anonymous": ["consume"]}
    assert shown["replication_clusters"] == ["standalone"]


def test_anonymous_role_on_the_binary_protocol(broker: CiBroker) -> None:
    client = broker.client()
    try:
        assert round_trip(client, unique("public/default")) == b"hello"
        refused_fast(lambda: client.create_producer(unique("private/auth")), pulsar.AuthorizationError)
    finally:
        client.close()


def test_anonymous_role_over_http_lookups_and_admin(broker: CiBroker) -> None:
    client = broker.client(broker.http_url)
    try:
        assert round_trip(client, unique("public/default-2")) == b"hello"
    finally:
        client.close()
    # anonymous is an admin of the tenant public (the CI's tests post admin calls without credentials)
    dedup = broker.admin("POST", "namespaces/public/default/deduplication", role=None, json=True)
    assert dedup.status_code == 204, dedup.text
    assert broker.admin("GET", "namespaces/private/auth", role=None).status_code == 403


def test_anonymous_role_on_websocket(broker: CiBroker) -> None:
    topic = unique("public/default").removeprefix("persistent://")
    with open_ws(f"{ws_base(broker.http_url)}/ws/v2/producer/persistent/{topic}") as ws:
        assert produce(ws, [b"x"])[0]["result"] == "ok"
    private = unique("private/auth").removeprefix("persistent://")
    status, _ = refused_status(f"{ws_base(broker.http_url)}/ws/v2/producer/persistent/{private}")
    assert status == 403


@pytest.mark.parametrize("user", sorted(BASIC_USERS))
def test_basic_authentication_for_each_hash(broker: CiBroker, user: str) -> None:
    grant(broker, "private/auth", user, ["produce", "consume"])
    for url in (broker.pulsar_url, broker.http_url):
        client = broker.client(url, authentication=pulsar.AuthenticationBasic(user, BASIC_USERS[user]))
        try:
            assert round_trip(client, unique("private/auth")) == b"hello"
        finally:
            client.close()


def refused_connect(broker: CiBroker, method: str, data: bytes | None = None) -> None:
    """A CONNECT of ``method`` is answered AuthenticationError and the connection closed, at once."""
    body: dict[str, object] = {"client_version": "raw-test", "protocol_version": 19, "auth_method_name": method}
    if data is not None:
        body["auth_data"] = data
    started = time.monotonic()
    with RawConnection(int(broker.pulsar_url.rsplit(":", 1)[1])) as raw:
        raw.send_command(command(T.CONNECT, connect=body))
        answer = raw.expect(T.CONNECTED, T.ERROR)
        assert answer.type == T.ERROR
        assert answer.error.error == pb.AuthenticationError, pb.ServerError.Name(answer.error.error)
        assert raw.closes()
    assert time.monotonic() - started < REFUSAL_S_MAX


def never_connects(client: pulsar.Client, topic: str) -> None:
    """The official client (3.13) retries a refused CONNECT as a connection error until its
    operation timeout, against Pulsar's broker as against this one: it must fail, never produce."""
    with pytest.raises((pulsar.Timeout, pulsar.ConnectError, pulsar.AuthenticationError)):
        client.create_producer(topic)


def test_basic_authentication_refuses_a_wrong_password(broker: CiBroker) -> None:
    refused_connect(broker, "basic", b"admin:not-the-password")
    refused_connect(broker, "basic", b"nobody:123456")
    client = broker.client(authentication=pulsar.AuthenticationBasic("admin", "not-the-password"),
                           operation_timeout_s=2)
    try:
        never_connects(client, unique("public/default"))
    finally:
        client.close()
    wrong = base64.b64encode(b"admin:nope").decode()
    response = httpx.get(f"{broker.http_url}/admin/v2/tenants", headers={"Authorization": f"Basic {wrong}"})
    assert response.status_code == 401
    right = base64.b64encode(f"admin:{BASIC_USERS['admin']}".encode()).decode()
    response = httpx.get(f"{broker.http_url}/admin/v2/tenants", headers={"Authorization": f"Basic {right}"})
    assert response.status_code == 200 and "private" in response.json()


def test_tls_client_certificate_names_the_role(broker: CiBroker) -> None:
    grant(broker, "private/auth", TLS_ROLE, ["produce", "consume"])
    client = broker.client(broker.pulsar_tls_url, authentication=broker.tls_auth())
    try:
        assert round_trip(client, unique("private/auth")) == b"hello"
    finally:
        client.close()


def test_token_over_http_and_binary(broker: CiBroker) -> None:
    for url in (broker.http_url, broker.pulsar_url):
        client = broker.client(url, authentication=pulsar.AuthenticationToken(broker.token(TOKEN_ROLE)))
        try:
            assert round_trip(client, unique("private/auth")) == b"hello"
        finally:
            client.close()


def test_an_unknown_method_is_an_authentication_error(broker: CiBroker) -> None:
    refused_connect(broker, "kerberos", b"ticket")


@pytest.mark.parametrize("action", ["produce", "consume"])
def test_lookup_and_partitions_need_produce_or_consume(broker: CiBroker, action: str) -> None:
    role = f"only-{action}-{uuid.uuid4().hex[:6]}"
    grant(broker, "private/auth", role, [action])
    topic = unique("private/auth")
    created = broker.admin("PUT", f"persistent/{topic.removeprefix('persistent://')}/partitions", json=2)
    assert created.status_code == 204, created.text
    for url in (broker.pulsar_url, broker.http_url):
        client = broker.client(url, authentication=pulsar.AuthenticationToken(broker.token(role)))
        try:
            assert len(client.get_topic_partitions(topic)) == 2
        finally:
            client.close()
    # the C++ client's HTTP lookup turns any refusal into ConnectError; the broker answers 403
    refusals: tuple[tuple[str, type[Exception]], ...] = (
        (broker.pulsar_url, pulsar.AuthorizationError), (broker.http_url, pulsar.ConnectError))
    for url, refusal in refusals:
        stranger = broker.client(url, authentication=pulsar.AuthenticationToken(broker.token("stranger")))
        try:
            refused_fast(partial(stranger.get_topic_partitions, topic), refusal)
        finally:
            stranger.close()
    partitions = f"persistent/{topic.removeprefix('persistent://')}/partitions"
    assert broker.admin("GET", partitions, role="stranger").status_code == 403


def test_without_the_anonymous_role_no_credentials_are_refused(tmp_path: Path) -> None:
    with ci_broker(tmp_path, setup=False, anonymousUserRole="") as plain:
        refused_connect(plain, "none")
        client = plain.client(operation_timeout_s=2)
        try:
            never_connects(client, unique("public/default"))
        finally:
            client.close()
        assert plain.admin("GET", "tenants", role=None).status_code == 401
        topic = unique("public/default").removeprefix("persistent://")
        status, _ = refused_status(f"{ws_base(plain.http_url)}/ws/v2/producer/persistent/{topic}")
        assert status == 401
