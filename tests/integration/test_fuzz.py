"""Fuzzing the edge: property-based requests from the OpenAPI schema, and malformed WebSocket frames.

The HTTP part lets schemathesis generate requests for every operation in ``/openapi.json``
(bounded by ``FUZZ_EXAMPLES_PER_OPERATION``) against a real server and fails on any 5xx, once
with authentication off and once with it on (as a superuser, and without a token, which must be
401 for every operation that is not public). The
WebSocket part sends a sweep of malformed frames (not JSON, wrong types, bad base64, invalid
UTF-8 in binary frames, deep nesting, huge numbers) to the producer, consumer and reader: each
must be answered with an error frame, the session must stay usable, the server healthy, and the
producer must have written nothing but the one good frame.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.schemas import OpenApiSchema

from api.auth import AuthConfig
from broker.service import BrokerService
from consumers.cli.tokens import create_token
from tests.integration.server import running_server, stored
from tests.integration.ws_client import b64, open_ws, recv_frame, send_frame, ws_base

FUZZ_EXAMPLES_PER_OPERATION = 25
AUTH_FUZZ_EXAMPLES_PER_OPERATION = 10
UNAUTHENTICATED_EXAMPLES_PER_OPERATION = 3
SECRET = b"fuzzing-secret-fuzzing-secret-32b"
PUBLIC_PATHS = ("/healthz", "/metrics", "/console")
NS = "persistent/public/default"


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BrokerService]]:
    with running_server(str(tmp_path_factory.mktemp("fuzz") / "data")) as (url, service):
        yield url, service


@pytest.fixture(scope="module")
def api_schema(live_server: tuple[str, BrokerService]) -> OpenApiSchema:
    url, _ = live_server
    return schemathesis.openapi.from_url(f"{url}/openapi.json")


def check_operation(operation: Any, url: str, *, headers: dict[str, str] | None = None,
                    examples: int = FUZZ_EXAMPLES_PER_OPERATION, expect_status: int | None = None) -> None:
    """Generated requests for ``operation``: never a 5xx, errors as ``{code, message}``; with
    ``expect_status`` every answer must be that status (401 for calls without a token)."""
    @given(case=operation.as_strategy())
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def no_server_error(case: Any) -> None:
        response = case.call(base_url=url, timeout=30, headers=headers)
        assert response.status_code < 500, f"{case.method} {case.formatted_path} → {response.status_code}: " \
                                           f"{response.text[:300]}"
        if expect_status is not None:
            assert response.status_code == expect_status, f"{case.method} {case.formatted_path}"
        content_type = response.headers.get("content-type") or [""]
        if response.status_code >= 400 and str(content_type[0]).startswith("application/json"):
            problem = response.json()
            assert isinstance(problem, dict) and problem.get("code") and problem.get("message"), problem

    no_server_error()


def test_no_generated_request_gets_a_server_error(api_schema: OpenApiSchema,
                                                  live_server: tuple[str, BrokerService]) -> None:
    url, _ = live_server
    operations = [result.ok() for result in api_schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 3
    for operation in operations:
        check_operation(operation, url)


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BrokerService]]:
    auth = AuthConfig(enabled=True, secret_key=SECRET, superuser_roles=frozenset({"admin"}))
    with running_server(str(tmp_path_factory.mktemp("fuzz-auth") / "data"), auth=auth) as (url, service):
        yield url, service


def test_with_authentication_on_no_generated_request_gets_a_server_error(
        secured_server: tuple[str, BrokerService]) -> None:
    """The same fuzz against a server with token authentication on: as a superuser, requests
    reach every handler; without a token, every operation that is not public is 401."""
    url, _ = secured_server
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    token = {"Authorization": f"Bearer {create_token('admin', secret_key=SECRET)}"}
    for operation in operations:
        check_operation(operation, url, headers=token, examples=AUTH_FUZZ_EXAMPLES_PER_OPERATION)
        public = operation.path in PUBLIC_PATHS or operation.path.startswith("/ws/")
        check_operation(operation, url, examples=UNAUTHENTICATED_EXAMPLES_PER_OPERATION,
                        expect_status=None if public else 401)


def deeply_nested(depth: int) -> str:
    return "[" * depth + "]" * depth


MALFORMED_TEXT_FRAMES = [
    "", " ", "null", "true", "42", '"text"', "[]", "{", "}", '{"payload": }', "\x00\x01\x02",
    deeply_nested(100_000),
    json.dumps({"payload": None}),
    json.dumps({"payload": ["a"]}),
    json.dumps({"payload": "====", "context": 1}),
    json.dumps({"payload": b64("x"), "properties": ["not", "a", "map"]}),
    json.dumps({"payload": b64("x"), "properties": {"k": {"nested": 1}}}),
    json.dumps({"payload": b64("x"), "key": 17}),
    json.dumps({"payload": b64("x"), "eventTime": 10**40}),
    json.dumps({"payload": b64("x"), "eventTime": -5}),
    json.dumps({"payload": b64("x"), "deliverAt": "soon"}),
    json.dumps({"payload": b64("x"), "sequenceId": -1}),
    json.dumps({"payload": b64("x"), "sequenceId": 2**70}),
    json.dumps({"type": "permit", "permitMessages": 10**30}),
    json.dumps({"type": "permit", "permitMessages": "10"}),
    json.dumps({"type": "negativeAcknowledge"}),
    json.dumps({"type": "negativeAcknowledge", "messageId": "CAEQAA"}),
    json.dumps({"messageId": ""}),
    json.dumps({"messageId": "A" * 100_000}),
    json.dumps({"messageId": b64(b"\x08" * 30)}),
    json.dumps({"type": 5, "messageId": None}),
]
MALFORMED_BINARY_FRAMES = [b"\xff\xfe\xfd", b"\x80" * 64, b""]


def sweep(ws: Any) -> list[dict[str, Any]]:
    """Send every malformed frame to a producer; collect the answer to each."""
    answers = []
    for text in MALFORMED_TEXT_FRAMES:
        ws.send(text)
        answers.append(recv_frame(ws))
    for data in MALFORMED_BINARY_FRAMES:
        ws.send(data)
        answers.append(recv_frame(ws))
    return answers




def test_malformed_frames_never_break_a_producer_session(live_server: tuple[str, BrokerService]) -> None:
    url, service = live_server
    with open_ws(f"{ws_base(url)}/ws/v2/producer/{NS}/fuzzed") as ws:
        answers = sweep(ws)
        # every frame of the sweep is malformed: each is refused, none is written
        frames = MALFORMED_TEXT_FRAMES + ["<binary>"] * len(MALFORMED_BINARY_FRAMES)
        accepted = [(frame[:60], a) for frame, a in zip(frames, answers, strict=True)
                    if not a["result"].startswith("send-error:")]
        assert not accepted, accepted
        assert all(a["errorMsg"] for a in answers)
        send_frame(ws, {"payload": b64("good"), "context": "good"})
        answer = recv_frame(ws)
        assert (answer["result"], answer["context"], answer["offset"]) == ("ok", "good", 0), answers
    assert stored(service, "fuzzed") == [b"good"]
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200


@pytest.mark.parametrize("path", [f"/ws/v2/consumer/{NS}/fuzzed-c/sub?pullMode=true",
                                  f"/ws/v2/reader/{NS}/fuzzed-c?messageId=earliest"])
def test_malformed_frames_never_break_consumer_or_reader_sessions(live_server: tuple[str, BrokerService],
                                                                   path: str) -> None:
    url, _ = live_server
    with open_ws(f"{ws_base(url)}{path}") as ws:
        for text in MALFORMED_TEXT_FRAMES + [d.decode("latin-1") for d in MALFORMED_BINARY_FRAMES]:
            ws.send(text)
            send_frame(ws, {"type": "isEndOfTopic"})  # a probe: every answer before it belongs to ``text``
            while "endOfTopic" not in (answer := recv_frame(ws)):
                assert answer["result"].startswith("error:") and answer["errorMsg"], (text[:80], answer)
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
