"""A route whose endpoint reads its request itself: the data plane's hottest routes.

Role: FastAPI resolves an endpoint's parameters and dependencies on every request, inspecting
their annotations as it goes: measured in process, 55 of the 245 µs of event-loop CPU a
one-message produce request took. An endpoint that takes the ``Request`` and its path's
parameters as text needs none of that. ``RequestRoute`` calls it with exactly those; the rest of
the route is FastAPI's: its OpenAPI operation (made from the endpoint's signature, as for any
route), the body size limit, the application's exception handlers. An endpoint that takes query
parameters declares them as a pydantic model, reads them with ``query_of`` (one validation, its
problems 400 ``invalid_request`` worded as FastAPI's) and puts ``query_parameters`` of the model in
its operation.

Invariant: a ``RequestRoute`` endpoint is a coroutine function whose parameters are ``request``
and the path's parameters, each text (``str`` and matched as text); any other endpoint is refused
when the route is made (a ``TypeError`` at startup), never on a request.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.convertors import PathConvertor, StringConvertor
from starlette.routing import compile_path

from api.errors import validation_problems
from broker import InvalidRequest

REQUEST_PARAMETER = "request"
QUERY_LOCATION = "query"
_Query = TypeVar("_Query", bound=BaseModel)


class RequestRoute(APIRoute):
    """An ``APIRoute`` whose endpoint is called with the ``Request`` and the path's parameters."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        check_request_endpoint(path, endpoint)
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            response: Response = await endpoint(request=request, **request.path_params)
            return response

        return handle


def check_request_endpoint(path: str, endpoint: Callable[..., Any]) -> None:
    """Refuse an endpoint ``RequestRoute`` cannot call as it is: not a coroutine function, or
    whose parameters are not ``request`` and the path's parameters, each text."""
    name = getattr(endpoint, "__qualname__", repr(endpoint))
    if not inspect.iscoroutinefunction(endpoint):
        raise TypeError(f"{name}: a RequestRoute endpoint is a coroutine function")
    convertors = compile_path(path)[2]
    not_text = sorted(p for p, c in convertors.items() if not isinstance(c, StringConvertor | PathConvertor))
    if not_text:
        raise TypeError(f"{name}: path parameters {not_text} of {path!r} are not matched as text")
    hints = typing.get_type_hints(endpoint)
    parameters = inspect.signature(endpoint).parameters
    if set(parameters) != {REQUEST_PARAMETER, *convertors}:
        raise TypeError(f"{name}: a RequestRoute endpoint takes {REQUEST_PARAMETER!r} and the parameters of "
                        f"{path!r} ({sorted(convertors)}), not {sorted(parameters)}")
    not_str = sorted(p for p in convertors if hints.get(p) is not str)
    if not_str or hints.get(REQUEST_PARAMETER) is not Request:
        raise TypeError(f"{name}: a RequestRoute endpoint's path parameters are str and its request a Request "
                        f"(not so: {not_str or [REQUEST_PARAMETER]})")


def query_of(request: Request, model: type[_Query]) -> _Query:
    """The request's query parameters as ``model`` (a repeated one's last value, as FastAPI takes
    it); any that is missing or invalid is ``InvalidRequest`` (400 ``invalid_request``) naming each
    as FastAPI would (``query.offset: ...``)."""
    try:
        return model.model_validate(dict(request.query_params))
    except ValidationError as exc:
        errors = [{**error, "loc": (QUERY_LOCATION, *error["loc"])} for error in exc.errors()]
        raise InvalidRequest(validation_problems(errors) or "invalid query") from None


def query_parameters(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI ``parameters`` of ``model``'s fields as query parameters (for the route's
    ``openapi_extra``: FastAPI adds them to the path's own)."""
    schema = model.model_json_schema()
    required = set(schema.get("required", ()))
    return {"parameters": [{"name": name, "in": QUERY_LOCATION, "required": name in required, "schema": field}
                           for name, field in schema["properties"].items()]}
