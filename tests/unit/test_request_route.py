"""``RequestRoute``: an endpoint called with its request and path parameters, FastAPI's OpenAPI
operation kept, and any endpoint it could not call so refused when the route is made."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field

from api.app import create_app
from api.request_route import RequestRoute, query_of, query_parameters
from broker import BrokerService, InvalidRequest
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


def included_routes(app: FastAPI) -> list[Any]:
    """The routes of the routers ``create_app`` includes."""
    return [r for included in app.router.routes for r in getattr(getattr(included, "original_router", None),
                                                                 "routes", [])]


def test_the_produce_route_of_an_unpartitioned_topic_is_a_request_route(tmp_path: Path) -> None:
    app = create_app(BrokerService(str(tmp_path), BrokerConfig.test_min()))
    routes = included_routes(app)
    produce = [r for r in routes if getattr(r, "path", "") == "/topics/persistent/{tenant}/{namespace}/{topic}"
               and "POST" in r.methods]
    assert len(produce) == 1 and isinstance(produce[0], RequestRoute)
    operation = app.openapi()["paths"]["/topics/persistent/{tenant}/{namespace}/{topic}"]["post"]
    assert [p["name"] for p in operation["parameters"]] == ["tenant", "namespace", "topic"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["properties"]["messages"]


class Page(BaseModel):
    offset: Annotated[int, Field(ge=0)]
    limit: Annotated[int, Field(ge=1, le=10)] = 5


def request_of(query: bytes) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "query_string": query, "headers": []})


def test_query_of_reads_the_query_as_the_model_and_a_repeated_parameters_last_value() -> None:
    assert query_of(request_of(b"offset=3"), Page) == Page(offset=3, limit=5)
    assert query_of(request_of(b"offset=3&limit=2&limit=7&other=x"), Page) == Page(offset=3, limit=7)


@pytest.mark.parametrize(("query", "says"), [
    (b"", "query.offset: Field required"),
    (b"offset=one", "query.offset: Input should be a valid integer"),
    (b"offset=-1&limit=11", "query.offset: Input should be greater than or equal to 0; "
                            "query.limit: Input should be less than or equal to 10"),
])
def test_an_invalid_query_is_an_invalid_request_naming_each_problem_as_fastapi_does(query: bytes, says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        query_of(request_of(query), Page)
    assert str(refused.value).startswith(says), str(refused.value)


def test_query_parameters_are_the_models_fields_in_the_openapi_operation() -> None:
    async def page(request: Request) -> Response:
        query = query_of(request, Page)
        return Response(f"{query.offset} {query.limit}")

    app = FastAPI()
    app.router.add_api_route("/page", page, methods=["GET"], route_class_override=RequestRoute,
                             openapi_extra=query_parameters(Page))
    parameters = app.openapi()["paths"]["/page"]["get"]["parameters"]
    assert [(p["name"], p["in"], p["required"], p["schema"]["type"]) for p in parameters] == \
        [("offset", "query", True, "integer"), ("limit", "query", False, "integer")]
    assert parameters[0]["schema"]["minimum"] == 0 and parameters[1]["schema"]["maximum"] == 10


def test_the_range_read_routes_are_request_routes_with_their_query_in_the_openapi_operation(tmp_path: Path) -> None:
    app = create_app(BrokerService(str(tmp_path), BrokerConfig.test_min()))
    routes = included_routes(app)
    base = "/topics/persistent/{tenant}/{namespace}/{topic}"
    for path in (f"{base}/messages", f"{base}/partitions/{{partition}}/messages"):
        reads = [r for r in routes if getattr(r, "path", "") == path and "GET" in r.methods]
        assert len(reads) == 1 and isinstance(reads[0], RequestRoute), path
        parameters = app.openapi()["paths"][path]["get"]["parameters"]
        query = {p["name"]: p for p in parameters if p["in"] == "query"}
        assert set(query) == {"offset", "maxMessages", "maxBytes"} and query["offset"]["required"], path
        assert query["offset"]["schema"]["minimum"] == 0 and query["maxMessages"]["schema"]["minimum"] == 1
