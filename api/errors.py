"""The one place where errors become HTTP responses.

Every ``MagnetarError`` (storage and broker alike) maps to its class's ``http_status`` with the
body ``{"code": ..., "message": ...}`` (plus what the error's ``details()`` adds); request
validation failures (malformed JSON, missing or mistyped fields) are 400 ``invalid_request``; a
path no route serves is 404 ``not_found`` and a method its route does not take 405
``method_not_allowed``, in the same body. Routes never catch broker errors themselves.

``TopicNotOwned`` (a cluster broker asked for a topic another broker serves) is the one error
answered with a header: 307 with ``Location`` naming the same path and query on the owner, so
HTTP clients resend the request there (a 307 keeps the method and body); a WebSocket upgrade
gets the same 307 with a ``ws://`` location (``api/ws/server.py``, the WebSocket edge's one
mapping of a refused handshake).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from api.limits import VALIDATION_PROBLEM_ITEMS_MAX
from broker import BrokerError, MagnetarError, TopicNotOwned


class UpgradeRequired(MagnetarError):
    """A plain HTTP request reached a WebSocket endpoint."""

    code = "upgrade_required"
    http_status = 426


class TooManyConnections(MagnetarError):
    """A role holds as many requests and sessions as it may (``api/limits.py``)."""

    code = "too_many_connections"
    http_status = 429
    retriable = True


class TooManyRequests(MagnetarError):
    """An edge holds as many requests of one kind in flight as it may (the binary protocol's
    lookups, ``api/pulsar/lookups.py``): retry shortly."""

    code = "too_many_requests"
    http_status = 429
    retriable = True


class PayloadTooLarge(MagnetarError):
    code = "request_too_large"
    http_status = 413


class RequestTimeout(MagnetarError):
    code = "request_timeout"
    http_status = 408


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


def error_of(error: MagnetarError) -> dict[str, Any]:
    """``{code, message}`` of ``error``, plus the fields its class adds (a key version
    mismatch's ``currentKeyVersions``, a trimmed stream's ``firstVersion``)."""
    body = error_body(error.code, str(error) or error.code)
    if isinstance(error, BrokerError):
        body.update(error.details())
    return body


def error_bytes(error: MagnetarError) -> bytes:
    """The JSON body of ``error``'s HTTP answer."""
    return json.dumps(error_of(error)).encode()


def redirect_location(owner_url: str, path: str, query: str, *, websocket: bool = False) -> str:
    """The URL of the same request on the owner (``owner_url`` is ``http(s)://host:port``)."""
    owner = urllib.parse.urlsplit(owner_url)
    scheme = owner.scheme if not websocket else ("wss" if owner.scheme == "https" else "ws")
    return urllib.parse.urlunsplit((scheme, owner.netloc, path, query, ""))


def redirect_headers(exc: TopicNotOwned, path: str, query: str, *, websocket: bool = False) -> dict[str, str]:
    return {"Location": redirect_location(exc.owner_url, path, query, websocket=websocket),
            "X-Magnetar-Owner": exc.owner_broker}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MagnetarError)
    async def magnetar_error(request: Request, exc: MagnetarError) -> JSONResponse:
        headers = redirect_headers(exc, request.url.path, request.url.query) \
            if isinstance(exc, TopicNotOwned) else None
        return JSONResponse(error_of(exc), status_code=exc.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body("invalid_request", validation_problems(exc.errors(), exc.body) or
                                       "invalid request"),
                            status_code=400)

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, exc: HTTPException) -> JSONResponse:
        """A path no route serves, or a method its route does not take: ``{code, message}`` as
        every other refusal, not the framework's ``{"detail"}``."""
        route = f"{request.method} {request.url.path}"
        code, message = {404: ("not_found", f"no such resource: {route}"),
                         405: ("method_not_allowed", f"{route}: the resource does not take {request.method}")
                         }.get(exc.status_code, ("http_error", f"{route}: {exc.detail}"))
        return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=exc.headers)



def validation_problems(errors: Sequence[Any], body: object = None) -> str:
    """Validation errors (FastAPI's of a request, or pydantic's of a body parsed by hand) in one
    wording: ``field.path: what is wrong`` each, and a body that is not JSON at all as ``the
    request body is not valid JSON: <why> at line <l> column <c>``, whichever parser found it
    (the body, when given, is read again by Python's ``json`` for the why and the where, so REST
    produce's parser and the admin API's say it alike)."""
    problems = []
    for error in list(errors)[:VALIDATION_PROBLEM_ITEMS_MAX]:
        if error.get("type") == "json_invalid":
            problems.append(f"the request body is not valid JSON: {_json_problem(error, body)}")
        else:
            problems.append(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}")
    return "; ".join(problems)


def _json_problem(error: Any, body: object) -> str:
    if isinstance(body, bytes | str):
        try:
            json.loads(body)
        except ValueError as exc:
            if isinstance(exc, json.JSONDecodeError):
                return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            return str(exc)  # not UTF-8
    reason = str((error.get("ctx") or {}).get("error") or error.get("msg") or "")
    reason = reason.removeprefix("Invalid JSON: ")
    loc = [p for p in error.get("loc", ()) if p != "body"]
    if loc and isinstance(loc[0], int):  # FastAPI's: the character where its parser stopped
        reason = f"{reason} at character {loc[0]}"
    return reason
