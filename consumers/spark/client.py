"""The few broker HTTP calls the Spark source and sink make, and Pulsar topic-name helpers.

Role: ``consumers`` reach a broker over the network only, so this module is the Spark
connector's whole view of Magnetar: partition offsets (``GET .../offsets``), topic listings of a
namespace (Pulsar's admin v2 ``GET /admin/v2/persistent/{tenant}/{namespace}`` and
``.../partitioned``), Arrow range reads (``GET .../messages``) and REST produce (``POST
/topics/persistent/...``, Pulsar's PIP-64 body).

Invariants: every call has a timeout (``HTTP_TIMEOUT_S``); a broker error answer becomes
``BrokerHttpError`` carrying the broker's ``code`` and ``message``; nothing here retries (the
callers decide what is safe to repeat).
"""

from __future__ import annotations

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


def _error_of(response: httpx.Response) -> BrokerHttpError:
    try:
        body = response.json()
        return BrokerHttpError(response.status_code, str(body.get("code", "error")), str(body.get("message", body)))
    except (ValueError, AttributeError):
        return BrokerHttpError(response.status_code, "error", response.text[:500])


class BrokerClient:
    """One HTTP connection pool to a broker's ``service.url``; use as a context manager. With
    ``token`` every request carries ``Authorization: Bearer <token>`` (brokers with auth on)."""

    def __init__(self, service_url: str, *, token: str | None = None, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.service_url = service_url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.service_url, timeout=timeout_s, headers=headers)

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BrokerHttpError(0, "unreachable", f"{method} {self.service_url}{path}: {exc}") from exc
        if response.status_code >= 400:
            raise _error_of(response)
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
        response = self._request("GET", topic_path(topic_partition) + "/messages",
                                 params={"offset": offset, "maxMessages": max_messages},
                                 headers={"accept": ARROW_STREAM_MEDIA_TYPE})
        reader = pa.ipc.open_stream(response.content)
        return RangeRead(list(reader), int(response.headers[NEXT_OFFSET_HEADER]),
                         int(response.headers[FIRST_OFFSET_HEADER]))

    def produce(self, topic: str, body: dict[str, Any], *, partition: int | None = None) -> list[dict[str, Any]]:
        """REST produce (PIP-64) to ``topic``, or to one partition of it; the per-message results."""
        path = topic_path(topic) + ("" if partition is None else f"/partitions/{partition}")
        results: list[dict[str, Any]] = self._request("POST", path, json=body).json()["messagePublishResults"]
        return results
