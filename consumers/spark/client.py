"""The few broker HTTP calls the Spark source and sink make, and Pulsar topic-name helpers.

Role: ``consumers`` reach a broker over the network only, so this module is the Spark
connector's whole view of Magnetar: partition offsets (``GET .../offsets``), topic listings of a
namespace (Pulsar's admin v2 ``GET /admin/v2/persistent/{tenant}/{namespace}`` and
``.../partitioned``), Arrow range reads (``GET .../messages``) and REST produce (``POST
/topics/persistent/...``, Pulsar's PIP-64 body).

Invariants: every call has a timeout (``HTTP_TIMEOUT_S``); a broker error answer becomes
``BrokerHttpError`` carrying the broker's ``code`` and ``message``; nothing here retries (the
callers decide what is safe to repeat), except that a range read finding its idle keep-alive
connection closed by the broker opens a new one and sends the read again (it changes nothing).

Transport: range reads go over one keep-alive connection of the standard library's
``http.client``, which reads an answer's body (megabytes of Arrow) with one call into one buffer;
httpx receives it in 64 KiB pieces through its HTTP/1.1 parser and costs about five times the CPU
per row, CPU that an executor needs for Spark itself. Everything else uses httpx, created on first
use (an executor that only reads ranges never builds its TLS context).
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx
import pyarrow as pa

HTTP_TIMEOUT_S = 60.0
ARROW_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
NEXT_OFFSET_HEADER = "X-Magnetar-Next-Offset"
FIRST_OFFSET_HEADER = "X-Magnetar-First-Offset"
DEFAULT_NAMESPACE = "public/default"
PARTITION_SUFFIX = "-partition-"


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
    """One keep-alive ``http.client`` connection for range reads (see the module docstring).

    Calls must not overlap (a lock makes them wait for each other)."""

    def __init__(self, service_url: str, headers: dict[str, str], timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(service_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"service.url {service_url!r} must be http://host:port or https://host:port")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base_path = parts.path.rstrip("/")
        self._headers = headers
        self._timeout_s = timeout_s
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._connection = kind(self._host, self._port, timeout=self._timeout_s)
        return self._connection

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def get(self, path: str, params: dict[str, int], headers: dict[str, str]) -> tuple[http.client.HTTPResponse, bytes]:
        """The answer to ``GET path?params`` and its whole body. Raises ``BrokerHttpError``."""
        target = f"{self._base_path}{path}?{urllib.parse.urlencode(params)}"
        with self._lock:
            try:
                return self._exchange(target, {**self._headers, **headers})
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise BrokerHttpError(0, "unreachable", f"GET {self._host}{target}: {exc}") from exc

    def _exchange(self, target: str, headers: dict[str, str]) -> tuple[http.client.HTTPResponse, bytes]:
        reused = self._connection is not None and self._connection.sock is not None
        try:
            return self._send(target, headers)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            if not reused:
                raise
            self._drop()  # the broker closed the idle connection: a new one, once
            return self._send(target, headers)

    def _send(self, target: str, headers: dict[str, str]) -> tuple[http.client.HTTPResponse, bytes]:
        connection = self._connect()
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
        body = response.read()
        if response.will_close:
            self._drop()
        return response, body


class BrokerClient:
    """One HTTP connection pool to a broker's ``service.url``; use as a context manager. With
    ``token`` every request carries ``Authorization: Bearer <token>`` (brokers with auth on)."""

    def __init__(self, service_url: str, *, token: str | None = None, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.service_url = service_url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._timeout_s = timeout_s
        self._http: httpx.Client | None = None
        self._ranges = _RangeConnection(self.service_url, self._headers, timeout_s)

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._ranges.close()
        if self._http is not None:
            self._http.close()
            self._http = None

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._http is None:
            self._http = httpx.Client(base_url=self.service_url, timeout=self._timeout_s, headers=self._headers)
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BrokerHttpError(0, "unreachable", f"{method} {self.service_url}{path}: {exc}") from exc
        if response.status_code >= 400:
            raise _error_of(response.status_code, response.content)
        return response

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
        """One Arrow range read (``GET .../messages``); the batches are views of the answer's body."""
        response, body = self._ranges.get(topic_path(topic_partition) + "/messages",
                                          {"offset": offset, "maxMessages": max_messages},
                                          {"accept": ARROW_STREAM_MEDIA_TYPE})
        if response.status >= 400:
            raise _error_of(response.status, body)
        reader = pa.ipc.open_stream(body)
        return RangeRead(list(reader), int(response.headers[NEXT_OFFSET_HEADER]),
                         int(response.headers[FIRST_OFFSET_HEADER]))

    def produce(self, topic: str, body: dict[str, Any], *, partition: int | None = None) -> list[dict[str, Any]]:
        """REST produce (PIP-64) to ``topic``, or to one partition of it; the per-message results."""
        path = topic_path(topic) + ("" if partition is None else f"/partitions/{partition}")
        results: list[dict[str, Any]] = self._request("POST", path, json=body).json()["messagePublishResults"]
        return results
