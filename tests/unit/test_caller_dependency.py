"""The ``Caller`` dependency of the REST routes (``api/auth.py``) runs on the event loop: the
request guard authenticated the caller before, so the dependency is a lookup, and a plain
function dependency would cost every request a round trip through FastAPI's thread pool."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import starlette.concurrency
from fastapi import FastAPI
from fastapi.dependencies import utils as fastapi_dependencies

from api.auth import AuthConfig, Authorizer, Caller


def test_a_route_with_a_caller_uses_no_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    offloaded: list[str] = []
    run_in_threadpool = starlette.concurrency.run_in_threadpool  # what FastAPI imported as its own

    async def counted(call: Any, *args: Any, **kwargs: Any) -> Any:
        offloaded.append(getattr(call, "__name__", repr(call)))
        return await run_in_threadpool(call, *args, **kwargs)

    monkeypatch.setattr(fastapi_dependencies, "run_in_threadpool", counted)
    app = FastAPI()
    app.state.authorizer = Authorizer(AuthConfig(enabled=False), service=None)  # type: ignore[arg-type]

    @app.get("/who")
    async def who(caller: Caller) -> dict[str, str]:
        return {"role": caller.role}

    async def ask() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
            return [await client.get("/who") for _ in range(3)]

    answers = asyncio.run(ask())
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert offloaded == []
