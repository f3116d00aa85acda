"""The few broker HTTP calls the Spark source and sink make, and Pulsar topic-name helpers.

Role: ``consumers`` reach a broker over the network only, so this module is the Spark
connector's whole view of Magnetar: partition offsets (``GET .../offsets``), topic listings of a
namespace (Pulsar's admin v2 ``GET /admin/v2/persistent/{tenant}/{namespace}`` and
``.../partitioned``), Arrow range reads (``GET .../messages``) and REST produce (``POST
/topics/persistent/...``, Pulsar's PIP-64 body).

Invariants: every call has a timeout (``HTTP_TIMEOUT_S``); a broker error answer becomes
``BrokerHttpError`` carrying the broker's ``code`` and ``message``; a write (REST produce) is
never repeated here (the sink decides, with dedup); a range read finding its idle keep-alive
connection closed by the broker opens a new one and sends the read again (it changes nothing).

A cluster: ``service.url`` may list several brokers (comma-separated, tried in turn); a broker's
307 to a topic's owner is followed (at most ``REDIRECTS_MAX`` hops), and range reads remember
each partition's owner and keep one connection per broker (at most ``OWNER_CONNECTIONS_MAX``).
Reads, which change nothing, are tried again while a topic changes owners (its owner
unreachable after a redirect, or 503), with backoff, for at most ``FAILOVER_TIMEOUT_S``.

Transport: range reads go over one keep-alive connection (``consumers/http_connection.py``),
which receives an answer's body (megabytes of Arrow) in a few reads through ``httptools``' C
parser; httpx receives it in 64 KiB pieces through its HTTP/1.1 parser written in Python and
costs about five times the CPU per row, CPU that an executor needs for Spark itself. Everything
else uses httpx, created on first use. An ``https://`` broker is reached over TLS with the
options ``tls.trust.certs.file.path`` (the authorities that signed the broker's certificate)
and, for mutual TLS, ``tls.certificate.file.path`` and ``tls.private.key.file.path``
(``tls_of``; one context per ``BrokerClient``, built on first use, so a plain-HTTP executor
never builds one).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pyarrow as pa

from consumers.http_connection import HttpAnswer, KeepAliveConnection
from consumers.tls import ClientTls

HTTP_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 60.0
REDIRECTS_MAX = 5
OWNER_CONNECTIONS_MAX = 16
OWNERS_REMEMBERED_MAX = 10_000
RETRY_BACKOFF_S_MIN = 0.1
RETRY_BACKOFF_S_MAX = 2.0
ARROW_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
NEXT_OFFSET_HEADER = "X-Magnetar-Next-Offset"
FIRST_OFFSET_HEADER = "X-Magnetar-First-Offset"
DEFAULT_NAMESPACE = "public/default"
PARTITION_SUFFIX = "-partition-"
TLS_OPTIONS = ("tls.trust.certs.file.path", "tls.certificate.file.path", "tls.private.key.file.path")
"""The source's and the sink's TLS options, in ``ClientTls``'s order."""


def tls_of(options: Mapping[str, str]) -> ClientTls:
    """The TLS options of a source or sink (``TLS_OPTIONS``; each may be absent)."""
    return ClientTls(*(options.get(name) or None for name in TLS_OPTIONS))


class BrokerHttpError(Exception):
    """The broker answered a request with an error (or could not be reached)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message

    @property
    def retriable(self) -> bool:
        return self.status in (0, 502, 503, 504) or self.code == "duplicate_in_flight"


_R = TypeVar("_R")


def _retrying_reads(read: Callable[[], _R]) -> _R:
    """``read()`` again while it fails in a way a topic changing owners explains (the broker
    unreachable, or 503 'not ready'), with backoff, for at most ``FAILOVER_TIMEOUT_S``."""
    deadline_s = time.monotonic() + FAILOVER_TIMEOUT_S
    delay_s = RETRY_BACKOFF_S_MIN
    while True:
        try:
            return read()
        except BrokerHttpError as exc:
            if exc.status not in (0, 503) or time.monotonic() + delay_s > deadline_s:
                raise
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, RETRY_BACKOFF_S_MAX)


def _base_of(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class PartitionOffsets:
    first: int
    """The first offset retention kept."""
    next: int
    """The offset the next message will get (one past the last readable one)."""
    at_timestamp: int | None = None


@dataclass(frozen=True)
class RangeRead:
    batches: list[pa.RecordBatch]
    next_offset: int
    first_offset: int


def full_topic_name(name: str) -> str:
    """``persistent://tenant/namespace/topic``; short names mean ``public/default`` as in Pulsar."""
    text = name.strip()
    if "://" in text:
        domain, _, rest = text.partition("://")
        parts = rest.split("/")
        if domain != "persistent" or len(parts) != 3 or not all(parts):
            raise ValueError(f"invalid topic name {name!r}: expected persistent://tenant/namespace/topic")
        return text
    parts = text.split("/")
    if len(parts) == 1 and parts[0]:
        return f"persistent://{DEFAULT_NAMESPACE}/{parts[0]}"
    if len(parts) == 3 and all(parts):
        return f"persistent://{text}"
    raise ValueError(f"invalid topic name {name!r}: expected topic, tenant/namespace/topic or persistent://...")


def _path_parts(full_name: str) -> list[str]:
    return full_name.partition("://")[2].split("/")


def topic_path(full_name: str) -> str:
    """``/topics/persistent/{tenant}/{namespace}/{topic}`` of a full topic name (segments quoted)."""
    return "/topics/persistent/" + "/".join(urllib.parse.quote(p, safe="") for p in _path_parts(full_name))


def partition_index(full_name: str) -> int:
    head, sep, tail = full_name.rpartition(PARTITION_SUFFIX)
    return int(tail) if sep and head and tail.isdigit() else -1


def _error_of(status: int, body: bytes) -> BrokerHttpError:
    try:
        answer = json.loads(body)
        return BrokerHttpError(status, str(answer.get("code", "error")), str(answer.get("message", answer)))
    except (ValueError, AttributeError):
        return BrokerHttpError(status, "error", body[:500].decode(errors="replace"))


class _RangeConnection:
    """One keep-alive connection for range reads (see the module docstring): a failure to reach
    the broker is ``BrokerHttpError`` (status 0); calls on it wait for each other."""

    def __init__(self, service_url: str, headers: dict[str, str], timeout_s: float,
                 ssl_context: Callable[[], ssl.SSLContext]) -> None:
        try:
            self._connection = KeepAliveConnection(service_url, headers, timeout_s, ssl_context)
        except ValueError:
            raise ValueError(f"service.url {service_url!r} must be http://host:port or https://host:port") from None

    def close(self) -> None:
        self._connection.close()

    def get(self, path: str, params: dict[str, int], headers: dict[str, str]) -> HttpAnswer:
        """The answer to ``GET path?params``, its whole body read. Raises ``BrokerHttpError``."""
        target = f"{path}?{urllib.parse.urlencode(params)}"
        try:
            return self._connection.exchange("GET", target, headers=headers)
        except OSError as exc:
            raise BrokerHttpError(0, "unreachable", f"GET {self._connection.host}{target}: {exc}") from exc


class BrokerClient:
    """One HTTP connection pool to a broker's ``service.url``; use as a context manager. With
    ``token`` every request carries ``Authorization: Bearer <token>`` (brokers with auth on);
    ``tls`` says how an ``https://`` broker is trusted (and which certificate to present)."""

    def __init__(self, service_url: str, *, token: str | None = None, timeout_s: float = HTTP_TIMEOUT_S,
                 tls: ClientTls | None = None) -> None:
        self._service_urls = [u.strip().rstrip("/") for u in service_url.split(",") if u.strip()]
        if not self._service_urls:
            raise ValueError("service.url names no broker")
        self.service_url = self._service_urls[0]
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._timeout_s = timeout_s
        self._tls = tls or ClientTls()
        self._ssl: ssl.SSLContext | None = None
        self._http: httpx.Client | None = None
        self._ranges = _RangeConnection(self.service_url, self._headers, timeout_s, self._ssl_context)
        self._owner_ranges: dict[str, _RangeConnection] = {}
        """Range-read connections to brokers other than the first listed, by base URL."""
        self._owners: dict[str, str] = {}
        """The base URL serving each partition read so far (a 307 names it)."""
        self._owners_lock = threading.Lock()

    def __enter__(self) -> BrokerClient:
        return self

    def _ssl_context(self) -> ssl.SSLContext:
        """The TLS context of this client's ``https://`` connections, built on first use."""
        if self._ssl is None:
            self._ssl = self._tls.context()
        return self._ssl

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._ranges.close()
        with self._owners_lock:
            for connection in self._owner_ranges.values():
                connection.close()
            self._owner_ranges.clear()
        if self._http is not None:
            self._http.close()
            self._http = None

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call through the first listed broker that answers, following 307s; reads are
        tried again while their topic changes owners."""
        if method == "GET":
            return _retrying_reads(lambda: self._request_once(method, path, **kwargs))
        return self._request_once(method, path, **kwargs)

    def _request_once(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._http is None:
            verify = self._ssl_context() if self._tls.given else True
            self._http = httpx.Client(timeout=self._timeout_s, headers=self._headers, follow_redirects=True,
                                      max_redirects=REDIRECTS_MAX, verify=verify)
        failure: Exception | None = None
        for base in self._service_urls:
            try:
                response = self._http.request(method, f"{base}{path}", **kwargs)
            except (httpx.ConnectError, httpx.TimeoutException) as exc:
                if isinstance(exc, httpx.TimeoutException) and method != "GET":
                    raise BrokerHttpError(0, "unreachable", f"{method} {base}{path}: {exc}") from exc
                failure = exc  # this listed broker is down (or, for a read, stopped): the next one
                continue
            except httpx.HTTPError as exc:
                raise BrokerHttpError(0, "unreachable", f"{method} {base}{path}: {exc}") from exc
            if response.status_code >= 400:
                raise _error_of(response.status_code, response.content)
            return response
        raise BrokerHttpError(0, "unreachable", f"{method} {','.join(self._service_urls)}{path}: {failure}")

    def offsets(self, topic: str, *, timestamp_ms: int | None = None) -> tuple[int, dict[str, PartitionOffsets]]:
        """(partition count, 0 when unpartitioned; offsets of every partition by full name)."""
        params = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
        body = self._request("GET", topic_path(topic) + "/offsets", params=params).json()
        found = {name: PartitionOffsets(int(o["first"]), int(o["next"]),
                                        None if "atTimestamp" not in o else int(o["atTimestamp"]))
                 for name, o in body["offsets"].items()}
        return int(body["partitions"]), found

    def list_topics(self, namespace: str) -> tuple[list[str], list[str]]:
        """(every topic of ``namespace``, partitions listed as ``-partition-N``; its partitioned topics)."""
        quoted = "/".join(urllib.parse.quote(p, safe="") for p in namespace.split("/"))
        topics = self._request("GET", f"/admin/v2/persistent/{quoted}").json()
        partitioned = self._request("GET", f"/admin/v2/persistent/{quoted}/partitioned").json()
        return [str(t) for t in topics], [str(t) for t in partitioned]

    def read_arrow(self, topic_partition: str, offset: int, max_messages: int) -> RangeRead:
        """One Arrow range read (``GET .../messages``) on the partition's owner; the batches are
        views of the answer's body."""
        response, body = _retrying_reads(lambda: self._read_on_owner(topic_partition, offset, max_messages))
        if response.status >= 400:
            raise _error_of(response.status, body)
        reader = pa.ipc.open_stream(body)
        headers = {name.lower(): value for name, value in response.headers}
        return RangeRead(list(reader), int(headers[NEXT_OFFSET_HEADER.lower()]),
                         int(headers[FIRST_OFFSET_HEADER.lower()]))

    def _read_on_owner(self, topic_partition: str, offset: int, max_messages: int) -> tuple[HttpAnswer, bytes]:
        path = topic_path(topic_partition) + "/messages"
        with self._owners_lock:
            owner = self._owners.get(topic_partition, self.service_url)
        try:
            for _ in range(REDIRECTS_MAX + 1):
                response = self._ranges_of(owner).get(path, {"offset": offset, "maxMessages": max_messages},
                                                      {"accept": ARROW_STREAM_MEDIA_TYPE})
                location = next((value for name, value in response.headers if name.lower() == "location"), None)
                if response.status not in (307, 308) or not location:
                    return response, response.body
                owner = _base_of(location)
                with self._owners_lock:
                    if len(self._owners) >= OWNERS_REMEMBERED_MAX:
                        self._owners.clear()
                    self._owners[topic_partition] = owner
        except BrokerHttpError:
            with self._owners_lock:  # the owner may be gone: ask a listed broker again next time
                self._owners.pop(topic_partition, None)
            raise
        raise BrokerHttpError(508, "too_many_redirects", f"GET {path}: more than {REDIRECTS_MAX} redirects")

    def _ranges_of(self, base: str) -> _RangeConnection:
        if base == self.service_url:
            return self._ranges
        with self._owners_lock:
            connection = self._owner_ranges.get(base)
            if connection is None:
                if len(self._owner_ranges) >= OWNER_CONNECTIONS_MAX:
                    for stale in self._owner_ranges.values():
                        stale.close()
                    self._owner_ranges.clear()
                connection = self._owner_ranges[base] = _RangeConnection(base, self._headers, self._timeout_s,
                                                                         self._ssl_context)
            return connection

    def produce(self, topic: str, body: dict[str, Any], *, partition: int | None = None) -> list[dict[str, Any]]:
        """REST produce (PIP-64) to ``topic``, or to one partition of it; the per-message results."""
        path = topic_path(topic) + ("" if partition is None else f"/partitions/{partition}")
        results: list[dict[str, Any]] = self._request("POST", path, json=body).json()["messagePublishResults"]
        return results
