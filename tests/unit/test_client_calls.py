"""The client's request-and-answer calls, written once without I/O, driven the same way by the
blocking and the asyncio driver: requests in order, answers sent back, error answers thrown in
where they were asked for and mapped by the call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from consumers.client import KeyVersionMismatch
from consumers.client._calls import Call, HttpRequest, run_async, run_blocking
from consumers.client._dcb import DcbConditionFailed, DcbEvent, DcbQueryItem
from consumers.client._dcb import append_call as dcb_append_call
from consumers.client._dcb import read_call as dcb_read_call
from consumers.client._streams import append_call, read_stream_call
from consumers.client.errors import HttpError

Answer = dict[str, Any] | HttpError


def both_drivers(make_call: Callable[[], Call[Any]], answers: list[Answer]) -> tuple[list[HttpRequest], Any, Any]:
    """The requests the call made (the same through both drivers, asserted), and what each
    driver returned or raised."""
    outcomes, asked_by_driver = [], []
    for driver in ("blocking", "async"):
        asked: list[HttpRequest] = []
        left = list(answers)

        def answer(request: HttpRequest, asked: list[HttpRequest] = asked, left: list[Answer] = left) -> httpx.Response:
            asked.append(request)
            given = left.pop(0)
            if isinstance(given, HttpError):
                raise given
            return httpx.Response(200, content=json.dumps(given).encode())

        async def answer_async(request: HttpRequest, answer: Callable[[HttpRequest], httpx.Response] = answer
                               ) -> httpx.Response:
            return answer(request)

        try:
            outcome: Any = run_blocking(make_call(), answer) if driver == "blocking" else \
                asyncio.run(run_async(make_call(), answer_async))
        except Exception as exc:  # what the driver raised is its outcome
            outcome = exc
        outcomes.append(outcome)
        asked_by_driver.append(asked)
    assert asked_by_driver[0] == asked_by_driver[1]
    return asked_by_driver[0], outcomes[0], outcomes[1]


def stream_answer(versions: list[int]) -> dict[str, Any]:
    return {"key": "k", "version": 9, "firstVersion": 0, "nextVersion": versions[-1] + 1, "partition": -1,
            "messages": [{"payload": "eA==", "messageId": "CAEQAA==", "offset": v, "key": "k", "properties": {},
                          "publishTimeMs": 1, "keyVersion": v} for v in versions]}


def test_a_stream_read_asks_once_and_both_drivers_return_its_batch() -> None:
    asked, blocking, run = both_drivers(lambda: read_stream_call("t", "a/b", 3, 2, False), [stream_answer([3, 4])])
    assert asked == [HttpRequest("GET", "/topics/persistent/public/default/t/keys/a%2Fb/messages",
                                 params={"maxMessages": 2, "direction": "forward", "fromVersion": 3})]
    assert [m.key_version for m in blocking.messages] == [m.key_version for m in run.messages] == [3, 4]


def test_a_refused_expectation_becomes_the_calls_own_error_and_other_errors_pass() -> None:
    mismatch = HttpError(409, "key_version_mismatch", "moved", {"currentKeyVersions": {"k": 4}})
    _, blocking, run = both_drivers(lambda: append_call("t", "k", [b"x"], 2, None, None, None), [mismatch])
    assert isinstance(blocking, KeyVersionMismatch) and isinstance(run, KeyVersionMismatch)
    assert blocking.current_versions == run.current_versions == {"k": 4}
    busy = HttpError(429, "too_many_requests", "later")
    _, blocking, run = both_drivers(lambda: append_call("t", "k", [b"x"], None, None, None, None), [busy])
    assert blocking is busy and run is busy
    _, blocking, run = both_drivers(lambda: dcb_append_call("t", [DcbEvent("A", b"x")], [DcbQueryItem(("A",))], 5,
                                                            None, None),
                                    [HttpError(409, "dcb_condition_failed", "no", {"position": 7})])
    assert isinstance(blocking, DcbConditionFailed) and isinstance(run, DcbConditionFailed)
    assert blocking.position == run.position == 7


def test_bad_arguments_are_refused_before_any_request() -> None:
    asked, blocking, run = both_drivers(lambda: read_stream_call("t", "k", None, 0, False), [])
    assert asked == [] and isinstance(blocking, ValueError) and isinstance(run, ValueError)


def test_a_dcb_read_follows_next_after_until_its_limit() -> None:
    def page(first: int, count: int, next_after: int | None) -> dict[str, Any]:
        return {"events": [{"type": "A", "data": "", "tags": [], "position": p} for p in range(first, first + count)],
                "head": 100, "nextAfter": next_after}

    asked, blocking, run = both_drivers(lambda: dcb_read_call("t", [], 0, 5), [page(1, 3, 3), page(4, 2, 5)])
    assert [request.json_body["after"] for request in asked] == [0, 3]
    assert [request.json_body["limit"] for request in asked] == [5, 2]
    assert [e.position for e in blocking.events] == [e.position for e in run.events] == [1, 2, 3, 4, 5]
    assert blocking.head == run.head == 100


@pytest.mark.parametrize("limit", [None, 2])
def test_a_dcb_read_stops_at_the_head_it_answers(limit: int | None) -> None:
    _, blocking, _ = both_drivers(lambda: dcb_read_call("t", [], 0, limit), [
        {"events": [{"type": "A", "data": "", "tags": [], "position": 1}], "head": 1, "nextAfter": None}])
    assert [e.position for e in blocking.events] == [1] and blocking.next_after is None
