"""Token authentication and authorization across the API, against a real server with auth on.

For REST produce and the WebSocket producer, consumer and reader: no token → 401, an invalid or
expired token → 401, a role without the permission → 403, a granted role, a tenant admin and a
superuser succeed; a refused call writes nothing. Both HS256 (secret key) and RS256 (key pair)
tokens are accepted when configured.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from api.auth import AuthConfig
from broker.service import BrokerService
from consumers.cli.tokens import create_token
from tests.integration.server import running_server, stored
from tests.integration.ws_client import b64, open_ws, produce, receive, refused_status, ws_base

SECRET = b"0123456789abcdef0123456789abcdef"
NS = "persistent/public/default"
PRODUCE_URL = "/topics/persistent/public/default/secured"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[str, BrokerService]]:
    auth = AuthConfig(enabled=True, secret_key=SECRET, superuser_roles=frozenset({"admin"}))
    with running_server(str(tmp_path / "data"), auth=auth) as (url, service):
        service.namespaces.set_policy("public/default", "auth_policies",
                          {"namespace_auth": {"writer": ["produce"], "reader": ["consume"]}})
        service.namespaces.create_tenant("acme", {"adminRoles": ["acme-admin"]})
        service.namespaces.create_namespace("acme/apps")
        yield url, service


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(role, secret_key=SECRET)}"}


def body(text: str = "hello") -> dict[str, object]:
    return {"messages": [{"payload": text}]}




def test_rest_produce_needs_a_valid_token_and_the_produce_permission(secured: tuple[str, BrokerService]) -> None:
    url, service = secured
    with httpx.Client(base_url=url, timeout=30) as http:
        missing = http.post(PRODUCE_URL, json=body())
        assert missing.status_code == 401 and missing.json()["code"] == "unauthorized"
        forged = create_token("admin", secret_key=b"another-secret-another-secret-!!")
        assert http.post(PRODUCE_URL, json=body(), headers={"Authorization": f"Bearer {forged}"}).status_code == 401
        expired = jwt.encode({"sub": "writer", "exp": 1}, SECRET, algorithm="HS256")
        assert http.post(PRODUCE_URL, json=body(), headers={"Authorization": f"Bearer {expired}"}).status_code == 401
        assert http.post(PRODUCE_URL, json=body(), headers={"Authorization": "Basic abc"}).status_code == 401
        denied = http.post(PRODUCE_URL, json=body(), headers=bearer("reader"))
        assert denied.status_code == 403 and denied.json()["code"] == "forbidden"
        assert http.post(PRODUCE_URL, json=body(), headers=bearer("stranger")).status_code == 403
        assert stored(service, "secured") == []  # nothing refused was written
        assert http.post(PRODUCE_URL, json=body("w"), headers=bearer("writer")).status_code == 200
        assert http.post(PRODUCE_URL, json=body("a"), headers=bearer("admin")).status_code == 200
        acme = "/topics/persistent/acme/apps/events"
        assert http.post(acme, json=body(), headers=bearer("writer")).status_code == 403
        assert http.post(acme, json=body(), headers=bearer("acme-admin")).status_code == 200
    assert stored(service, "secured") == [b"w", b"a"]


def test_websocket_sessions_need_a_token_and_the_right_permission(secured: tuple[str, BrokerService]) -> None:
    url, service = secured
    ws = ws_base(url)
    producer = f"{ws}/ws/v2/producer/{NS}/secured-ws"
    consumer = f"{ws}/ws/v2/consumer/{NS}/secured-ws/sub?subscriptionInitialPosition=Earliest"
    reader = f"{ws}/ws/v2/reader/{NS}/secured-ws?messageId=earliest"
    for path in (producer, consumer, reader):
        status, error = refused_status(path)
        assert (status, error["code"]) == (401, "unauthorized")
    assert refused_status(producer, **bearer("reader"))[0] == 403
    assert refused_status(consumer, **bearer("writer"))[0] == 403
    assert refused_status(reader, **bearer("writer"))[0] == 403
    assert stored(service, "secured-ws") == []
    with open_ws(f"{producer}?token={create_token('writer', secret_key=SECRET)}") as session:  # browsers: ?token=
        assert produce(session, ["m1", "m2"])[1]["result"] == "ok"
    with open_ws(consumer, **bearer("reader")) as session:
        assert [base64.b64decode(m["payload"]) for m in receive(session, 2)] == [b"m1", b"m2"]
    with open_ws(reader, **bearer("admin")) as session:
        assert len(receive(session, 2)) == 2


def test_rs256_tokens_verify_with_the_public_key(tmp_path: Path) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    public_pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    auth = AuthConfig(enabled=True, public_key=public_pem, superuser_roles=frozenset({"ops"}))
    with running_server(str(tmp_path / "data"), auth=auth) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        good = create_token("ops", private_key=private_pem)
        assert http.post(PRODUCE_URL, json=body(), headers={"Authorization": f"Bearer {good}"}).status_code == 200
        hs = create_token("ops", secret_key=SECRET)  # right role, wrong algorithm and key
        assert http.post(PRODUCE_URL, json=body(), headers={"Authorization": f"Bearer {hs}"}).status_code == 401


def test_auth_off_by_default_lets_anonymous_calls_through(tmp_path: Path) -> None:
    with running_server(str(tmp_path / "data")) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        assert http.post(PRODUCE_URL, json=body()).status_code == 200
        with open_ws(f"{ws_base(url)}/ws/v2/producer/{NS}/open") as session:
            assert produce(session, [b64("x")])[0]["result"] == "ok"
