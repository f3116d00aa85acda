"""A route whose endpoint reads its request itself: the data plane's hottest routes.

Role: FastAPI resolves an endpoint's parameters and dependencies on every request, inspecting
their annotations as it goes: measured in process, 55 of the 245 µs of event-loop CPU a
one-message produce request took. An endpoint that takes the ``Request`` and its path's
parameters as text needs none of that. ``RequestRoute`` calls it with exactly those; the rest of
the route is FastAPI's: its OpenAPI operation (made from the endpoint's signature, as for any
route), the body size limit, the application's exception handlers.

Invariant: a ``RequestRoute`` endpoint is a coroutine function whose parameters are ``request``
and the path's parameters, each text (``str`` and matched as text); any other endpoint is refused
when the route is made (a ``TypeError`` at startup), never on a request.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.convertors import PathConvertor, StringConvertor
from starlette.routing import compile_path

REQUEST_PARAMETER = "request"


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
