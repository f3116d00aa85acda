"""``RequestRoute``: an endpoint called with its request and path parameters, FastAPI's OpenAPI
operation kept, and any endpoint it could not call so refused when the route is made."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response

from api.app import create_app
from api.request_route import RequestRoute
from broker import BrokerService
from broker.config import BrokerConfig


async def echo(tenant: str, rest: str, request: Request) -> Response:
    return Response(f"{request.method} {tenant} {rest} {(await request.body()).decode()}")


def test_the_endpoint_is_called_with_the_request_and_the_paths_parameters_as_text() -> None:
    app = FastAPI()
    app.router.add_api_route("/t/{tenant}/{rest:path}", echo, methods=["POST"], route_class_override=RequestRoute)

    async def ask() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
            return await client.post("/t/public/a/b%20c", content=b"body")

    answer = asyncio.run(ask())
    assert (answer.status_code, answer.text) == (200, "POST public a/b c body")


def test_the_openapi_operation_is_fastapis_own() -> None:
    app = FastAPI()
    app.router.add_api_route("/t/{tenant}/{rest:path}", echo, methods=["POST"], route_class_override=RequestRoute,
                             summary="Echo", openapi_extra={"requestBody": {"content": {"text/plain": {}}}})
    operation = app.openapi()["paths"]["/t/{tenant}/{rest}"]["post"]
    assert operation["summary"] == "Echo" and "requestBody" in operation
    assert [(p["name"], p["in"], p["schema"]["type"]) for p in operation["parameters"]] == \
        [("tenant", "path", "string"), ("rest", "path", "string")]


async def not_text(tenant: int, request: Request) -> Response:
    return Response(str(tenant))


async def other_parameter(tenant: str, request: Request, limit: str) -> Response:
    return Response(tenant)


async def no_request(tenant: str) -> Response:
    return Response(tenant)


def not_a_coroutine(tenant: str, request: Request) -> Response:
    return Response(tenant)


@pytest.mark.parametrize(("path", "endpoint", "says"), [
    ("/t/{tenant}", not_a_coroutine, "coroutine function"),
    ("/t/{tenant:int}", not_text, "not matched as text"),
    ("/t/{tenant}", not_text, "path parameters are str"),
    ("/t/{tenant}", other_parameter, "takes 'request' and the parameters"),
    ("/t/{tenant}", no_request, "takes 'request' and the parameters"),
])
def test_an_endpoint_it_cannot_call_is_refused_when_the_route_is_made(path: str, endpoint: Any, says: str) -> None:
    with pytest.raises(TypeError, match=says):
        RequestRoute(path, endpoint, methods=["POST"])


def test_the_produce_route_of_an_unpartitioned_topic_is_a_request_route(tmp_path: Path) -> None:
    app = create_app(BrokerService(str(tmp_path), BrokerConfig.test_min()))
    routes = [r for included in app.router.routes for r in getattr(getattr(included, "original_router", None),
                                                                   "routes", [])]
    produce = [r for r in routes if getattr(r, "path", "") == "/topics/persistent/{tenant}/{namespace}/{topic}"
               and "POST" in r.methods]
    assert len(produce) == 1 and isinstance(produce[0], RequestRoute)
    operation = app.openapi()["paths"]["/topics/persistent/{tenant}/{namespace}/{topic}"]["post"]
    assert [p["name"] for p in operation["parameters"]] == ["tenant", "namespace", "topic"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["properties"]["messages"]
