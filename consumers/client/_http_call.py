"""One HTTP call of the client to a broker: where it goes, when it is made again, what its
error answer means; and the blocking client's way of making it.

Role: ``CallRoute`` is the policy of one call without its I/O, driven by both clients: the
listed brokers in turn (the next one when a broker refuses the connection, or, for a GET, which
changes nothing, does not answer in time), a 307 followed to the owner it names (at most
``REDIRECTS_MAX`` hops, the same method and body: a 307 means nothing was done), an error
answer made ``HttpError`` with the broker's ``code`` and ``message``. ``Backoff`` spaces the
attempts of a call refused as not ready (503) or whose owner could not be reached after a
redirect, for at most the client's failover timeout. ``AsyncClient.request`` makes the call with
httpx on the event loop; ``BlockingHttp`` makes it from the calling thread over a keep-alive
connection taken from its idle ones (``consumers/http_connection.py``), so a blocking caller (a
recorder of the ``eventsourcing`` library, the CLI) pays neither the hop to the loop thread nor
httpx's asyncio stack.

Invariants: a call is sent again when it was not received (connection refused), was redirected
or refused as not ready (307, 503), or got no answer in time: a write may then be done twice,
so a write that must not be (an ``eventsourcing`` recorder's insert, a DCB append) carries a
producer name and sequence id, and the broker answers the resend with the first attempt's
results; never when its answer was lost otherwise (``unreachable``). Every call has a timeout;
a connection serves one call at a time; the blocking client keeps at most
``IDLE_CONNECTIONS_MAX`` idle connections per broker, and ``close()`` closes them and those of
calls sent whose answers were not read (``send``). Unlike
httpx, the blocking client goes to the brokers directly (no ``HTTP_PROXY``).
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import httpx

from consumers.client._session import auth_headers
from consumers.client.errors import HttpError
from consumers.http_connection import ConnectFailed, HttpAnswer, KeepAliveConnection

REDIRECTS_MAX = 5
RETRY_BACKOFF_S_MIN = 0.1
RETRY_BACKOFF_S_MAX = 2.0
NOT_READY_CODES = frozenset({"service_unit_not_ready", "metadata_store_unavailable", "coordination_unavailable"})
HTTP_ERROR_TEXT_MAX = 500
IDLE_CONNECTIONS_MAX = 8
"""Keep-alive connections the blocking client keeps to one broker between calls (as many as
calls at once are made; those past this are closed when their call ends)."""


def error_of(response: httpx.Response) -> HttpError:
    try:
        body = response.json()
        details = {k: v for k, v in body.items() if k not in ("code", "message")}
        return HttpError(response.status_code, str(body["code"]), str(body["message"]), details)
    except (ValueError, KeyError, TypeError):
        text = response.text[:HTTP_ERROR_TEXT_MAX] or response.reason_phrase
        return HttpError(response.status_code, f"http_{response.status_code}", text)


def base_of(url: httpx.URL) -> str:
    """``scheme://host:port`` of ``url``: the broker it goes to (the key of its connections)."""
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


def response_of(answer: HttpAnswer, method: str, url: httpx.URL) -> httpx.Response:
    """The answer read from a connection as the ``httpx.Response`` the client's callers take."""
    return httpx.Response(answer.status, content=answer.body, request=httpx.Request(method, url),
                          headers=[(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers])


def not_ready(exc: HttpError) -> bool:
    return exc.status == 503 and exc.code in NOT_READY_CODES


def retriable(exc: HttpError) -> bool:
    """Whether a call that failed so was not received, and may be made again after a wait."""
    return not_ready(exc) or (exc.status == 0 and exc.code == "owner_unreachable")


class Backoff:
    """Waits between attempts, doubling, until a deadline: ``next_delay_s()`` is the next wait,
    or None when it would pass the deadline."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._deadline_s = clock() + timeout_s
        self._delay_s = RETRY_BACKOFF_S_MIN

    def next_delay_s(self) -> float | None:
        if self._clock() + self._delay_s > self._deadline_s:
            return None
        delay_s, self._delay_s = self._delay_s, min(self._delay_s * 2, RETRY_BACKOFF_S_MAX)
        return delay_s


class CallRoute:
    """Where one call goes next (see the module docstring): ``url`` and ``params`` of the next
    attempt; ``unreachable`` and ``answered`` say how the attempt ended."""

    def __init__(self, method: str, path: str, params: dict[str, Any] | None, service_urls: list[str]) -> None:
        self.method, self._path, self._params = method, path, params
        self._service_urls = service_urls
        self._next_base = 1
        self.url: str = f"{service_urls[0]}{path}"
        self.params = params
        self._hop = 0

    def unreachable(self, exc: BaseException, *, connect_failed: bool, timed_out: bool) -> None:
        """The attempt at ``url`` got no answer: on to the next listed broker when it was not
        received (or, for a GET, timed out) at a listed broker; else ``HttpError`` (status 0):
        ``owner_unreachable`` (made again after a wait) when it was not received or timed out,
        ``unreachable`` (never made again) when its answer was lost or unreadable."""
        if self._hop == 0 and (connect_failed or (timed_out and self.method == "GET")):
            if self._next_base < len(self._service_urls):
                self.url, self.params = f"{self._service_urls[self._next_base]}{self._path}", self._params
                self._next_base += 1
                return
            raise HttpError(0, "unreachable", f"{self.method} {','.join(self._service_urls)}{self._path}: {exc}")
        code = "owner_unreachable" if connect_failed or timed_out else "unreachable"
        raise HttpError(0, code, f"{self.method} {self.url}: {exc}") from exc

    def answered(self, response: httpx.Response) -> bool:
        """True when ``response`` is the call's answer; False when it redirects (``url`` is the
        next attempt's); an error answer raises ``HttpError``."""
        location = response.headers.get("location")
        if response.status_code in (307, 308) and location:
            if self._hop == REDIRECTS_MAX:
                raise HttpError(508, "too_many_redirects", f"{self.method} {self._path}: more than {REDIRECTS_MAX} "
                                "redirects")
            self._hop += 1
            self.url, self.params = str(httpx.URL(self.url).join(location)), None  # the location carries the query
            return False
        if response.status_code >= 400:
            raise error_of(response)
        return True


class BlockingHttp:
    """The blocking client's HTTP calls (see the module docstring)."""

    def __init__(self, service_urls: list[str], token: str | None, timeout_s: float, failover_timeout_s: float,
                 ssl_context: Callable[[], Any]) -> None:
        self._service_urls = service_urls
        self._headers = {"accept": "*/*", **auth_headers(token)}
        self._timeout_s = timeout_s
        self._failover_timeout_s = failover_timeout_s
        self._ssl_context = ssl_context
        self._idle: dict[str, list[KeepAliveConnection]] = {}
        """Connections between calls, by broker (the last given back is the next taken)."""
        self._lock = threading.Lock()
        self._closed = False
        self._pending: weakref.WeakSet[PendingGet] = weakref.WeakSet()
        """Calls sent whose answer is not read yet (``close()`` drops them)."""

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> httpx.Response:
        backoff = Backoff(self._failover_timeout_s)
        while True:
            try:
                return self._request_once(method, path, json_body, params, headers)
            except HttpError as exc:
                delay_s = backoff.next_delay_s() if retriable(exc) else None
                if delay_s is None:
                    raise
            time.sleep(delay_s)

    def _request_once(self, method: str, path: str, json_body: Any, params: dict[str, Any] | None,
                      headers: dict[str, str] | None) -> httpx.Response:
        body = None if json_body is None else json.dumps(json_body, allow_nan=False).encode()
        sent = {name.lower(): value for name, value in (headers or {}).items()}
        if body is not None:
            sent.setdefault("content-type", "application/json")
        route = CallRoute(method, path, params, self._service_urls)
        while True:
            url = httpx.URL(route.url) if route.params is None else httpx.URL(route.url).copy_merge_params(route.params)
            try:
                answer = self._exchange(base_of(url), method, url.raw_path.decode("ascii"), body, sent)
            except ValueError as exc:  # a redirect to a location that is not http(s)://host:port
                raise HttpError(0, "unreachable", f"{method} {route.url}: {exc}") from exc
            except ConnectFailed as exc:
                route.unreachable(exc, connect_failed=True, timed_out=False)
                continue
            except TimeoutError as exc:
                route.unreachable(exc, connect_failed=False, timed_out=True)
                continue
            except OSError as exc:  # the answer was lost, cut short or unreadable
                route.unreachable(exc, connect_failed=False, timed_out=False)
                continue
            response = response_of(answer, method, url)
            if route.answered(response):
                return response

    def send(self, path: str, *, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
             broker: httpx.URL | None = None) -> PendingGet:
        """A GET to the broker of the URL ``broker`` (one that answered for this path before, its
        owner; None: the first listed) sent now, its answer read later by
        :meth:`PendingGet.answer` on the connection it went out on (held by the call until
        then): the broker works on it while the caller does something else. A failure to send
        is raised when the answer is asked for."""
        url = httpx.URL(f"{self._service_urls[0] if broker is None else base_of(broker)}{path}")
        url = url if params is None else url.copy_merge_params(params)
        base = base_of(url)
        connection = self._take_connection(base)
        sent = {name.lower(): value for name, value in (headers or {}).items()}
        try:
            connection.send("GET", url.raw_path.decode("ascii"), sent)
        except OSError as exc:
            return PendingGet(self, base, None, url, exc)
        call = PendingGet(self, base, connection, url, None)
        with self._lock:
            self._pending.add(call)
        return call

    def _exchange(self, base: str, method: str, target: str, body: bytes | None,
                  headers: dict[str, str]) -> HttpAnswer:
        """One exchange on an idle connection to ``base`` (a new one when none is idle), given
        back afterwards (closed instead when ``IDLE_CONNECTIONS_MAX`` are idle already)."""
        connection = self._take_connection(base)
        try:
            return connection.exchange(method, target, body, headers)
        finally:
            self._give_back(base, connection)

    def _take_connection(self, base: str) -> KeepAliveConnection:
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            idle = self._idle.setdefault(base, [])
            connection = idle.pop() if idle else None
        if connection is None:
            connection = KeepAliveConnection(base, self._headers, self._timeout_s, self._ssl_context)
        return connection

    def _give_back(self, base: str, connection: KeepAliveConnection) -> None:
        with self._lock:
            kept = not self._closed and len(self._idle.setdefault(base, [])) < IDLE_CONNECTIONS_MAX
            if kept:
                self._idle[base].append(connection)
        if not kept:
            connection.close()

    def close(self) -> None:
        """Close the idle connections; one in use is closed when its call ends (a call after
        this raises ``RuntimeError``)."""
        with self._lock:
            self._closed = True
            idle = [c for connections in self._idle.values() for c in connections]
            self._idle.clear()
            pending = list(self._pending)
        for connection in idle:
            connection.close()
        for call in pending:
            call.drop()


class PendingGet:
    """A GET sent by :meth:`BlockingHttp.send` whose answer is not read yet: :meth:`answer`
    reads it (once; its connection is then given back), :meth:`drop` closes the connection
    unread. Its answer is the call's only when it is a success: a redirect, an error answer or
    a lost connection raise ``HttpError`` (no attempt is made again here; the caller makes the
    call again the usual way, with its failover and retries, when it wants to)."""

    def __init__(self, http: BlockingHttp, base: str, connection: KeepAliveConnection | None, url: httpx.URL,
                 failure: OSError | None) -> None:
        self._http, self._base, self._connection, self._url = http, base, connection, url
        self._failure: OSError | str | None = failure
        # a call nobody answered or dropped (its reader went away) closes its connection: a
        # finalizer, not __del__, so the connection's socket is closed before the collector
        # could reach it among the same garbage (and warn that it was never closed)
        self._closer = None if connection is None else weakref.finalize(self, connection.close)

    def answer(self) -> httpx.Response:
        connection, self._connection = self._connection, None
        if connection is None:
            raise HttpError(0, "unreachable", f"GET {self._url}: {self._failure or 'dropped'}")
        self._failure = "answered already"
        if self._closer is not None:
            self._closer.detach()
        try:
            answer = connection.receive("GET")
        except OSError as exc:
            raise HttpError(0, "unreachable", f"GET {self._url}: {exc}") from exc
        self._http._give_back(self._base, connection)
        response = response_of(answer, "GET", self._url)
        if response.status_code >= 300:
            raise error_of(response) if response.status_code >= 400 else \
                HttpError(response.status_code, "redirected", f"GET {self._url}: answered by another broker")
        return response

    def drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._failure = "dropped"
            if self._closer is not None:
                self._closer()  # closes it, once
