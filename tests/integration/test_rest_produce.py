"""REST produce in Pulsar's PIP-64 shape against a real uvicorn server on an ephemeral port.

Checks: a Pulsar-shaped request succeeds and returns ``ledger:entry:partition`` ids plus
offsets; binary payloads with ``payloadEncoding: base64``; producer dedup by sequence id;
``expectedOffset`` (409, nothing written); partitions; and that each bad-input class gets a
4xx JSON error with a code and message and writes nothing.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.message_id import MessageId
from broker.service import BrokerService
from broker.topic_name import TopicName
from tests.integration.server import running_server, stored

TOPIC_URL = "/topics/persistent/public/default/orders"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[httpx.Client, BrokerService]]:
    with running_server(str(tmp_path / "data")) as (url, service), httpx.Client(base_url=url, timeout=30) as client:
        yield client, service




def test_pulsar_shaped_produce_returns_ids_and_offsets(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    body = {"producerName": "rest-1", "messages": [
        {"payload": "hello", "key": "k1", "properties": {"a": "1"}, "eventTime": "1700000000000", "sequenceId": 0}]}
    response = client.post(TOPIC_URL, json=body)
    assert response.status_code == 200, response.text
    result = response.json()["messagePublishResults"][0]
    assert result["errorCode"] == 0 and result["errorMsg"] is None and result["offset"] == 0
    ledger, entry, partition = (int(x) for x in result["messageId"].split(":"))
    assert partition == -1 and MessageId.parse(result["messageId"]) == MessageId(ledger, entry, -1, -1)
    batch = client.post(TOPIC_URL, json={"producerName": "rest-1", "messages": [
        {"payload": base64.b64encode(b"\x00\xffbinary").decode(), "sequenceId": 1},
        {"payload": base64.b64encode(b"second").decode(), "sequenceId": 2}], "payloadEncoding": "base64"})
    assert [r["offset"] for r in batch.json()["messagePublishResults"]] == [1, 2]
    assert [r["messageId"].count(":") for r in batch.json()["messagePublishResults"]] == [3, 3]
    duplicate = client.post(TOPIC_URL, json={"producerName": "rest-1", "messages": [{"payload": "x", "sequenceId": 2}]})
    assert duplicate.status_code == 200
    assert stored(service, "public/default/orders") == [b"hello", b"\x00\xffbinary", b"second"]


def test_expected_offset_conflict_writes_nothing(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    ok = client.post(TOPIC_URL, json={"messages": [{"payload": "e0"}], "expectedOffset": 0})
    assert ok.status_code == 200
    conflict = client.post(TOPIC_URL, json={"messages": [{"payload": "e?"}, {"payload": "e??"}], "expectedOffset": 0})
    assert conflict.status_code == 409
    assert conflict.json()["code"] == "offset_mismatch"
    assert stored(service, "public/default/orders") == [b"e0"]


def test_partitions(server: tuple[httpx.Client, BrokerService]) -> None:
    client, service = server
    service.topics.create_partitioned(TopicName.parse("public/default/parts"), 2)
    one = {"messages": [{"payload": "p"}]}
    response = client.post("/topics/persistent/public/default/parts/partitions/1", json=one)
    assert response.json()["messagePublishResults"][0]["messageId"].endswith(":1")
    missing = client.post("/topics/persistent/public/default/parts/partitions/7", json=one)
    assert missing.status_code == 400 and missing.json()["code"] == "invalid_request"


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_request"),
    (b'{"messages": []}', 400, "invalid_request"),
    (b'{"messages": [{"key": "no payload"}]}', 400, "invalid_request"),
    (b'{"messages": [{"payload": "%%%"}], "payloadEncoding": "base64"}', 400, "invalid_request"),
    (b'{"messages": [{"payload": "x", "eventTime": "yesterday"}]}', 400, "invalid_request"),
    (b'{"messages": [{"payload": "x"}], "payloadEncoding": "rot13"}', 400, "invalid_request"),
])
def test_bad_input_gets_a_clear_4xx_and_writes_nothing(server: tuple[httpx.Client, BrokerService], body: bytes,
                                                        status: int, code: str) -> None:
    client, service = server
    response = client.post(TOPIC_URL, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert response.json()["code"] == code and response.json()["message"]
    assert not service.topics.exists(TopicName.parse("public/default/orders")) or \
        stored(service, "public/default/orders") == []


def test_invalid_topic_name_and_oversized_message(server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    bad_name = client.post("/topics/persistent/public/default/bad%20name", json={"messages": [{"payload": "x"}]})
    assert bad_name.status_code == 400 and bad_name.json()["code"] == "invalid_request"
    huge = base64.b64encode(b"x" * (5 * 1024 * 1024 + 1)).decode()
    too_big = client.post(TOPIC_URL, json={"messages": [{"payload": huge}], "payloadEncoding": "base64"})
    assert too_big.status_code == 413 and too_big.json()["code"] == "message_too_large"


def test_a_body_that_is_not_json_is_refused_in_one_wording_everywhere(
        server: tuple[httpx.Client, BrokerService]) -> None:
    """REST produce parses its body itself and admin through FastAPI; both say the same thing of a
    body that is not JSON (they said ": Invalid JSON: EOF while parsing a list at line 1 column 14"
    and "body.27: JSON decode error")."""
    client, _ = server
    headers = {"content-type": "application/json"}
    produce = client.post(TOPIC_URL, content=b'{"messages": [', headers=headers)
    admin = client.post("/admin/v2/namespaces/public/default/retention", content=b'{"retentionTimeInMinutes": ',
                        headers=headers)
    for answer in (produce, admin):
        assert answer.status_code == 400 and answer.json()["code"] == "invalid_request", answer.text
    assert produce.json()["message"] == "the request body is not valid JSON: Expecting value at line 1 column 15"
    assert admin.json()["message"] == "the request body is not valid JSON: Expecting value at line 1 column 28"


def test_a_missing_namespace_or_tenant_is_refused_saying_how_to_create_it(
        server: tuple[httpx.Client, BrokerService]) -> None:
    client, _ = server
    body = {"messages": [{"payload": "x"}]}
    namespace = client.post("/topics/persistent/public/absent/t", json=body)
    tenant = client.put("/admin/v2/namespaces/nobody/ns")
    assert namespace.status_code == 404 and namespace.json()["code"] == "not_found", namespace.text
    assert namespace.json()["message"] == (
        "namespace public/absent does not exist; create it first (admin v2: PUT /admin/v2/namespaces/public/absent; "
        "CLI: magnetar admin namespaces create public/absent)")
    assert tenant.status_code == 404 and tenant.json()["message"] == (
        "tenant nobody does not exist; create it first (admin v2: PUT /admin/v2/tenants/nobody; "
        "CLI: magnetar admin tenants create nobody)"), tenant.text


def test_a_path_or_method_no_route_serves_is_refused_with_code_and_message(
        server: tuple[httpx.Client, BrokerService]) -> None:
    """Not the framework's ``{"detail": "Not Found"}``: every refusal has ``code`` and ``message``."""
    client, _ = server
    missing = client.get("/topics/non-persistent/public/default/t/messages")
    wrong_method = client.delete("/topics/persistent/public/default/orders")
    assert missing.status_code == 404 and missing.json() == {
        "code": "not_found", "message": "no such resource: GET /topics/non-persistent/public/default/t/messages"}
    assert wrong_method.status_code == 405 and wrong_method.json()["code"] == "method_not_allowed", wrong_method.text
    assert "DELETE" in wrong_method.json()["message"]
