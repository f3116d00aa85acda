"""``AsyncClient``: the asyncio entry point (producers, consumers, readers, REST produce, admin calls).

Role: build the WebSocket paths and query parameters of Pulsar's WebSocket API v2 (v3 for several
topics), open sessions, and make the HTTP calls (PIP-64 REST produce, offsets, admin requests)
with the same ``Authorization: Bearer`` token. Event streams (``_streams.py``): ``append`` with an
expected version, ``read_stream``, ``stream_info`` and ``create_stream_reader``. ``consumers``
reach the broker over the network only; nothing here imports the broker.

A cluster is reached the way Pulsar's clients reach it: ``service_url`` may list several brokers
(``http://b1:8080,http://b2:8080``), tried in turn; a WebSocket session on one topic starts with
a lookup (``/lookup/v2/topic/...``) and connects to the owner it names; an HTTP call follows the
broker's 307 to the owner (at most ``REDIRECTS_MAX`` hops, the same method and body, since a 307
means nothing was done). While a topic changes owners (the owner died and its ZooKeeper session
has not expired yet, or a bundle is being unloaded) a lookup may name a broker that cannot be
reached or answer 503: connections and requests that were not sent are tried again, with
backoff, for at most ``failover_timeout_s``. Only when no listed broker can be reached at all
does a first connection fail at once.

Invariants: every HTTP call has a timeout (``HTTP_TIMEOUT_S``); an HTTP error answer becomes
``HttpError`` with the broker's ``code`` and ``message``; options are checked before any
connection is opened; ``close()`` closes every producer, consumer and reader the client made;
a request is sent again when it was not received (connection refused), was redirected or
refused as not ready (307, 503), or timed out (``CallRoute``: writes that must not repeat carry
a producer name and sequence id).
"""

from __future__ import annotations

import asyncio
import urllib.parse
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
from websockets.asyncio.client import ClientConnection

from consumers.client._calls import Call, HttpRequest, check_range, run_async
from consumers.client._consumer import (
    RECEIVER_QUEUE_SIZE_DEFAULT,
    RECEIVER_QUEUE_SIZE_MAX,
    AsyncConsumer,
    AsyncReader,
)
from consumers.client._dcb import (
    DcbEvent,
    DcbQueryItem,
    DcbReadResult,
)
from consumers.client._dcb import (
    append_call as dcb_append_call,
)
from consumers.client._dcb import (
    read_call as dcb_read_call,
)
from consumers.client._http_call import Backoff, CallRoute, not_ready, retriable
from consumers.client._producer import (
    PENDING_MESSAGES_DEFAULT,
    PENDING_MESSAGES_MAX,
    SEND_TIMEOUT_MS_DEFAULT,
    AsyncProducer,
    rest_produce_body,
)
from consumers.client._retry import RetryLetter, RetryLetterPolicy
from consumers.client._session import auth_headers, open_connection, ws_url
from consumers.client._streams import (
    AsyncStreamReader,
    append_call,
    read_stream_call,
    stream_info_call,
)
from consumers.client.errors import ConnectError, HttpError, SendError
from consumers.client.types import (
    PARTITION_SUFFIX,
    AppendResult,
    MessageIdParts,
    SendResult,
    StreamBatch,
    StreamInfo,
    Topic,
)
from consumers.tls import ClientTls

DEFAULT_SERVICE_URL = "http://127.0.0.1:8080"
HTTP_TIMEOUT_S = 60.0
FAILOVER_TIMEOUT_S = 60.0
"""How long a connection or request keeps trying while its topic changes owners."""
LOOKUP_TIMEOUT_S = 5.0
"""A lookup is small: a broker that does not answer one in this time (stopped, overloaded) is
passed over for the next listed one."""
REST_MESSAGES_PER_REQUEST_MAX = 10_000  # the broker's bound on one PIP-64 request
SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
INITIAL_POSITIONS = {"latest": "Latest", "earliest": "Earliest"}
_Closable = AsyncProducer | AsyncConsumer | AsyncReader | AsyncStreamReader
_T = TypeVar("_T", AsyncProducer, AsyncConsumer, AsyncReader, AsyncStreamReader)
_R = TypeVar("_R")


def service_urls(service_url: str) -> list[str]:
    """The brokers of a ``service_url`` (comma-separated; at least one)."""
    urls = [u.strip().rstrip("/") for u in service_url.split(",") if u.strip()]
    if not urls:
        raise ValueError("service_url names no broker")
    return urls


async def _waited(backoff: Backoff) -> bool:
    """Wait the backoff's next delay; False (no wait) when it would pass its deadline."""
    delay_s = backoff.next_delay_s()
    if delay_s is None:
        return False
    await asyncio.sleep(delay_s)
    return True


class AsyncClient:
    """``async with AsyncClient("http://127.0.0.1:8080", token=...) as client: ...``

    An ``https://`` service URL is reached over TLS (HTTPS, and WSS for the sessions), trusting
    ``tls_trust_certs_file_path`` (else the system's authorities) and presenting
    ``tls_certificate_file_path`` with ``tls_private_key_file_path`` when given (mutual TLS: a
    broker with ``AuthenticationProviderTls`` takes the role from its CN, no token needed)."""

    def __init__(self, service_url: str = DEFAULT_SERVICE_URL, token: str | None = None, *,
                 http_timeout_s: float = HTTP_TIMEOUT_S, failover_timeout_s: float = FAILOVER_TIMEOUT_S,
                 tls_trust_certs_file_path: str | None = None, tls_certificate_file_path: str | None = None,
                 tls_private_key_file_path: str | None = None) -> None:
        self._service_urls = service_urls(service_url)
        self.service_url = self._service_urls[0]
        self._token = token
        self._failover_timeout_s = failover_timeout_s
        self._ssl = ClientTls(tls_trust_certs_file_path, tls_certificate_file_path, tls_private_key_file_path).context()
        self._http = httpx.AsyncClient(timeout=http_timeout_s, headers=auth_headers(token), verify=self._ssl)
        self._children: weakref.WeakSet[_Closable] = weakref.WeakSet()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        children = list(self._children)
        self._children.clear()
        await asyncio.gather(*(child.close() for child in children), return_exceptions=True)
        await self._http.aclose()

    # --- WebSocket sessions ----------------------------------------------------------------
    async def create_producer(self, topic: str, *, producer_name: str | None = None, batching: bool = False,
                              batching_max_messages: int = 1000, max_pending_messages: int = PENDING_MESSAGES_DEFAULT,
                              send_timeout_ms: int = SEND_TIMEOUT_MS_DEFAULT, compression_type: str | None = None,
                              initial_sequence_id: int | None = None, reconnect: bool = False) -> AsyncProducer:
        """A producer on ``topic`` (``persistent://tenant/ns/topic``, ``tenant/ns/topic`` or a short
        name in ``public/default``). ``batching`` lets the broker store publishes that arrive
        together as one entry. With ``producer_name`` and ``initial_sequence_id`` the producer
        numbers its messages from ``initial_sequence_id + 1``, so what it sends again after a
        reconnection (``reconnect``) is stored once."""
        name = Topic.parse(topic)
        check_range("max_pending_messages", max_pending_messages, 1, PENDING_MESSAGES_MAX)
        check_range("send_timeout_ms", send_timeout_ms, 0, 2**31 - 1)
        query = {"producerName": producer_name, "batchingEnabled": batching or None,
                 "batchingMaxMessages": batching_max_messages if batching else None,
                 "maxPendingMessages": max_pending_messages, "sendTimeoutMillis": send_timeout_ms,
                 "compressionType": compression_type, "initialSequenceId": initial_sequence_id}
        path = f"/ws/v2/producer/{name.path}"
        ws = await self._connect(path, query, name)
        connector = (lambda: self._connect(path, query, name, reconnecting=True)) if reconnect else None
        first = initial_sequence_id + 1 if initial_sequence_id is not None and producer_name is not None else None
        return self._adopt(AsyncProducer(ws, name.full_name, max_pending_messages=max_pending_messages,
                                         send_timeout_ms=send_timeout_ms, connector=connector,
                                         first_sequence_id=first))

    async def subscribe(self, topic: str | Sequence[str], subscription: str, *, subscription_type: str = "Exclusive",
                        initial_position: str = "latest", receiver_queue_size: int = RECEIVER_QUEUE_SIZE_DEFAULT,
                        ack_timeout_ms: int | None = None, negative_ack_redelivery_delay_ms: int | None = None,
                        max_redeliver_count: int | None = None, dead_letter_topic: str | None = None,
                        consumer_name: str | None = None, reconnect: bool = False, retry_enable: bool = False,
                        retry_letter_topic: str | None = None) -> AsyncConsumer:
        """A consumer of ``subscription`` on one topic or several (Pulsar's v3 multi-topic path).
        With ``retry_enable`` (one topic) it also consumes the retry-letter topic and
        ``reconsume_later`` works (``_retry.py``: ``retry_letter_topic``, ``dead_letter_topic``
        and ``max_redeliver_count`` shape the policy, Pulsar's defaults otherwise)."""
        topics = [Topic.parse(t) for t in ([topic] if isinstance(topic, str) else topic)]
        if not topics:
            raise ValueError("subscribe needs at least one topic")
        retry: RetryLetterPolicy | None = None
        if retry_enable:
            if len(topics) != 1:
                raise ValueError("retry_enable takes one topic")
            retry = RetryLetterPolicy.of(
                topics[0].full_name, subscription, max_redeliver_count=max_redeliver_count,
                retry_letter_topic=Topic.parse(retry_letter_topic).full_name if retry_letter_topic else None,
                dead_letter_topic=Topic.parse(dead_letter_topic).full_name if dead_letter_topic else None)
            topics.append(Topic.parse(retry.retry_letter_topic))
            # as Pulsar's clients: the policy's dead-letter topic and count also apply to nacked
            # and timed-out messages (by default 16 redeliveries, then <topic>-<subscription>-DLQ)
            max_redeliver_count, dead_letter_topic = retry.max_redeliver_count, retry.dead_letter_topic
        elif retry_letter_topic is not None:
            raise ValueError("retry_letter_topic needs retry_enable")
        if subscription_type not in SUBSCRIPTION_TYPES:
            raise ValueError(f"subscription_type must be one of {', '.join(SUBSCRIPTION_TYPES)}")
        if initial_position not in INITIAL_POSITIONS:
            raise ValueError("initial_position must be 'latest' or 'earliest'")
        check_range("receiver_queue_size", receiver_queue_size, 1, RECEIVER_QUEUE_SIZE_MAX)
        query = {"subscriptionType": subscription_type,
                 "subscriptionInitialPosition": INITIAL_POSITIONS[initial_position],
                 "receiverQueueSize": receiver_queue_size, "ackTimeoutMillis": ack_timeout_ms,
                 "negativeAckRedeliveryDelay": negative_ack_redelivery_delay_ms,
                 "maxRedeliverCount": max_redeliver_count, "deadLetterTopic": dead_letter_topic,
                 "consumerName": consumer_name}
        quoted = urllib.parse.quote(subscription, safe="")
        single = topics[0] if len(topics) == 1 else None
        if single is not None:
            path = f"/ws/v2/consumer/{single.path}/{quoted}"
        else:
            path = f"/ws/v3/consumer/{quoted}"
            query["topics"] = ",".join(t.full_name for t in topics)
        ws = await self._connect(path, query, single)
        connector = (lambda: self._connect(path, query, single, reconnecting=True)) if reconnect else None
        letters = None if retry is None else RetryLetter(retry, self.create_producer)
        return self._adopt(AsyncConsumer(ws, topics, subscription, receiver_queue_size, connector, retry=letters))

    async def create_reader(self, topic: str, start_message_id: str = "earliest", *,
                            receiver_queue_size: int = RECEIVER_QUEUE_SIZE_DEFAULT,
                            reader_name: str | None = None, reconnect: bool = False) -> AsyncReader:
        """A reader from ``"earliest"``, ``"latest"`` or after a message id (base64 or ``l:e``)."""
        name = Topic.parse(topic)
        if start_message_id not in ("earliest", "latest"):
            MessageIdParts.parse(start_message_id)  # a bad id fails here, before connecting
        check_range("receiver_queue_size", receiver_queue_size, 1, RECEIVER_QUEUE_SIZE_MAX)
        query = {"messageId": start_message_id, "receiverQueueSize": receiver_queue_size, "readerName": reader_name}
        path = f"/ws/v2/reader/{name.path}"
        ws = await self._connect(path, query, name)

        async def reopen(after: str) -> ClientConnection:
            return await self._connect(path, {**query, "messageId": after}, name, reconnecting=True)

        try:
            start_offsets = await self.offsets(name.full_name) if start_message_id == "latest" else {}
        except BaseException:
            await ws.close()
            raise
        return self._adopt(AsyncReader(ws, name, receiver_queue_size, start=start_message_id,
                                       start_offsets=start_offsets, offsets=lambda: self.offsets(name.full_name),
                                       probe=self._message_id_at, connector=reopen if reconnect else None))

    async def create_stream_reader(self, topic: str, key: str, from_version: int = 0, *,
                                   receiver_queue_size: int = RECEIVER_QUEUE_SIZE_DEFAULT) -> AsyncStreamReader:
        """A live reader of the event stream of ``key``: its events from ``from_version`` on
        (in version order), then each new one as it is appended."""
        name = Topic.parse(topic)
        check_range("from_version", from_version, 0, 2**63 - 1)
        check_range("receiver_queue_size", receiver_queue_size, 1, RECEIVER_QUEUE_SIZE_MAX)
        query = {"key": key, "fromKeyVersion": from_version, "receiverQueueSize": receiver_queue_size}
        ws = await open_connection(ws_url(self.service_url, f"/ws/v2/reader/{name.path}", query), self._token,
                                   self._ssl)
        return self._adopt(AsyncStreamReader(ws, name, key, from_version, receiver_queue_size,
                                             lambda: self.stream_info(name.full_name, key)))

    def _adopt(self, child: _T) -> _T:
        self._children.add(child)
        return child

    async def _connect(self, path: str, query: dict[str, Any], topic: Topic | None, *,
                       reconnecting: bool = False) -> ClientConnection:
        """A WebSocket session on ``path``: on the owner of ``topic`` (found by a lookup), or on
        the first listed broker that answers. Tried again while the topic changes owners (the
        owner unreachable, or 503) for at most ``failover_timeout_s``; a refusal (4xx) is final,
        and so is finding no listed broker at all, unless ``reconnecting``."""
        backoff = Backoff(self._failover_timeout_s)
        while True:
            try:
                base = await self._owner_url(topic) if topic is not None else None
            except ConnectError as exc:
                if ((exc.status == 0 and reconnecting) or not_ready(exc)) and await _waited(backoff):
                    continue
                raise
            try:
                if base is None:
                    return await self._open_any(path, query)
                return await open_connection(ws_url(base, path, query), self._token, self._ssl)
            except ConnectError as exc:
                owner_lost = exc.status == 0 and (base is not None or reconnecting)
                if (owner_lost or not_ready(exc)) and await _waited(backoff):
                    continue
                raise

    async def _open_any(self, path: str, query: dict[str, Any]) -> ClientConnection:
        """Connect to the first listed broker that accepts a connection (it follows 307s)."""
        failure: ConnectError | None = None
        for base in self._service_urls:
            try:
                return await open_connection(ws_url(base, path, query), self._token, self._ssl)
            except ConnectError as exc:
                if exc.status != 0:
                    raise
                failure = exc
        assert failure is not None
        raise failure

    async def _owner_url(self, topic: Topic) -> str | None:
        """The web service URL of the broker serving ``topic`` (Pulsar's lookup); None when the
        lookup is refused (the session's own handshake then says why)."""
        try:
            response = await self.request("GET", f"/lookup/v2/topic/{topic.path}", retry=False,
                                          timeout_s=LOOKUP_TIMEOUT_S)
        except HttpError as exc:
            if exc.status == 0 or not_ready(exc):
                raise ConnectError(exc.status, exc.code, exc.message) from exc
            return None
        url = response.json().get("httpUrl")
        return str(url).rstrip("/") if url else None

    # --- HTTP ----------------------------------------------------------------------------
    async def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                      retry: bool = True, timeout_s: float | None = None,
                      headers: dict[str, str] | None = None) -> httpx.Response:
        """One HTTP call (``headers`` added to the client's, e.g. an ``Accept`` for an Arrow
        answer); an error status raises ``HttpError``. A 307 is followed to the owner
        (``REDIRECTS_MAX`` hops); with ``retry``, a call that was not received (its broker
        unreachable after a redirect) or was refused as not ready (503) is made again, with
        backoff, for at most ``failover_timeout_s``."""
        backoff = Backoff(self._failover_timeout_s)
        while True:
            try:
                return await self._request_once(method, path, json_body, params, timeout_s, headers)
            except HttpError as exc:
                if not (retry and retriable(exc) and await _waited(backoff)):
                    raise

    async def _request_once(self, method: str, path: str, json_body: Any, params: dict[str, Any] | None,
                            timeout_s: float | None, headers: dict[str, str] | None = None) -> httpx.Response:
        """One attempt along its ``CallRoute``: the listed brokers in turn, 307s followed."""
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(timeout_s)
        route = CallRoute(method, path, params, self._service_urls)
        while True:
            try:
                response = await self._http.request(method, route.url, json=json_body, params=route.params,
                                                     timeout=timeout, headers=headers)
            except (httpx.ConnectError, httpx.TimeoutException, httpx.HTTPError) as exc:
                route.unreachable(exc, connect_failed=isinstance(exc, httpx.ConnectError),
                                  timed_out=isinstance(exc, httpx.TimeoutException))
                continue
            if route.answered(response):
                return response

    async def produce_batch(self, topic: str, payloads: Sequence[bytes], *, keys: Sequence[str | None] | None = None,
                            properties: dict[str, str] | None = None, producer_name: str | None = None,
                            sequence_id: int | None = None, expected_offset: int | None = None,
                            partition: int | None = None) -> list[SendResult]:
        """REST produce (Pulsar's PIP-64): the payloads in one request, stored as one entry."""
        if not 1 <= len(payloads) <= REST_MESSAGES_PER_REQUEST_MAX:
            raise ValueError(f"produce_batch takes 1..{REST_MESSAGES_PER_REQUEST_MAX} payloads")
        if keys is not None and len(keys) != len(payloads):
            raise ValueError("keys must have one entry per payload")
        body = rest_produce_body(payloads, keys, properties, producer_name, sequence_id)
        if expected_offset is not None:
            body["expectedOffset"] = expected_offset
        path = f"/topics/{Topic.parse(topic).path}" + (f"/partitions/{partition}" if partition is not None else "")
        response = await self.request("POST", path, json_body=body)
        return [_rest_result(r) for r in response.json()["messagePublishResults"]]

    # --- event streams (consumers/client/_streams.py) -----------------------------------------
    async def append(self, topic: str, key: str, events: Sequence[bytes], *,
                     expected_version: int | str | None = None, producer_name: str | None = None,
                     sequence_id: int | None = None, properties: dict[str, str] | None = None) -> AppendResult:
        """Append ``events`` to the event stream of ``key`` in one request (all or none). With
        ``expected_version`` (the stream's current version, -1 for a new stream, or
        ``"exists"``) the append happens only if the stream is there, else
        ``KeyVersionMismatch`` with its current version and nothing written. Give
        ``producer_name`` and ``sequence_id`` to make a retry after a timeout safe: a resend of
        the producer's last append is answered with that append's results."""
        return await self._run(append_call(topic, key, events, expected_version, producer_name, sequence_id,
                                           properties))

    async def read_stream(self, topic: str, key: str, *, from_version: int | None = None, max_messages: int = 100,
                          backward: bool = False) -> StreamBatch:
        """Up to ``max_messages`` events of the stream of ``key`` from ``from_version`` on
        (forward from the first version kept, or backward from the last, by default)."""
        return await self._run(read_stream_call(topic, key, from_version, max_messages, backward))

    async def stream_info(self, topic: str, key: str) -> StreamInfo:
        """Where the stream of ``key`` stands: its version (-1: no event), the first version kept."""
        return await self._run(stream_info_call(topic, key))

    # --- dynamic consistency boundaries (consumers/client/_dcb.py) ----------------------------
    async def dcb_read(self, topic: str, items: Sequence[DcbQueryItem] = (), *, after: int = 0,
                       limit: int | None = None) -> DcbReadResult:
        """The events matching any of ``items`` (every event for none) at positions after
        ``after``, in order, at most ``limit`` (None: all, in as many requests as it takes)."""
        return await self._run(dcb_read_call(topic, items, after, limit))

    async def dcb_append(self, topic: str, events: Sequence[DcbEvent], condition: Sequence[DcbQueryItem] | None = None,
                         *, after: int = 0, producer_name: str | None = None,
                         sequence_id: int | None = None) -> int | None:
        """Store ``events`` as one entry unless an event matching ``condition`` follows position
        ``after`` (``DcbConditionFailed``: nothing written); the last event's position (None: a
        resend of an append whose positions the broker no longer has)."""
        return await self._run(dcb_append_call(topic, events, condition, after, producer_name, sequence_id))

    async def _run(self, call: Call[_R]) -> _R:
        return await run_async(call, self._requested)

    async def _requested(self, asked: HttpRequest) -> httpx.Response:
        return await self.request(asked.method, asked.path, json_body=asked.json_body, params=asked.params)

    async def offsets(self, topic: str) -> dict[str, dict[str, int]]:
        """First retained and next offset of every partition (Magnetar's ``.../offsets``)."""
        response = await self.request("GET", f"/topics/{Topic.parse(topic).path}/offsets")
        found: dict[str, dict[str, int]] = response.json()["offsets"]
        return found

    async def _message_id_at(self, partition: str, offset: int) -> str | None:
        base, sep, index = partition.rpartition(PARTITION_SUFFIX)
        path = f"/topics/{Topic.parse(base).path}/partitions/{index}" if sep and index.isdigit() \
            else f"/topics/{Topic.parse(partition).path}"
        response = await self.request("GET", f"{path}/messages", params={"offset": offset, "maxMessages": 1})
        messages = response.json()["messages"]
        return str(messages[0]["messageId"]) if messages else None


def _rest_result(result: dict[str, Any]) -> SendResult:
    if result.get("errorCode"):
        raise SendError(str(result.get("errorMsg") or "publish failed"), code="rest_publish_failed",
                        result_code=int(result["errorCode"]))
    text = str(result["messageId"])
    if text.startswith("-1:-1"):
        return SendResult(message_id=MessageIdParts(-1, -1).to_base64(), offset=None, duplicate=True)
    return SendResult(message_id=MessageIdParts.parse(text).to_base64(), offset=result.get("offset"))
