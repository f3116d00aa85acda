"""The blocking client: the asyncio client driven from a background event-loop thread.

Role: ``Client`` owns one daemon thread running an event loop and one ``AsyncClient`` on it;
``Producer``, ``Consumer`` and ``Reader`` forward each call to their asyncio twin and wait for
its result. There is one implementation of the protocol (the asyncio one); this module only
crosses threads. The exceptions are the calls of one request and its answer: ``Client.request``,
and the event streams' and DCB calls (``consumers/client/_calls.py``, each written once, without
I/O, for both clients); they are made from the calling thread (``BlockingHttp``, the same
``CallRoute`` as the asyncio client's), which costs a blocking caller a third of the CPU of a hop
to the loop thread and back.

Invariants: a blocking call waits exactly as long as its asyncio twin (whose own waits are
bounded: send timeout, receive timeout, close timeout); if the caller is interrupted (Ctrl-C)
the asyncio call is cancelled. ``send_async`` returns a ``concurrent.futures.Future`` and blocks
the caller only while ``max_pending_messages`` publishes are in flight. ``Client.close()`` closes
everything the client made, then stops and joins the thread (bounded by ``THREAD_JOIN_TIMEOUT_S``);
a ``Client`` garbage-collected without it does the same in the background, without waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import weakref
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import httpx

from consumers.client._async import (
    DEFAULT_SERVICE_URL,
    FAILOVER_TIMEOUT_S,
    HTTP_TIMEOUT_S,
    AsyncClient,
    service_urls,
)
from consumers.client._calls import Call, HttpRequest, run_blocking
from consumers.client._consumer import RECEIVER_QUEUE_SIZE_DEFAULT, AsyncConsumer, AsyncReader
from consumers.client._dcb import DcbEvent, DcbQueryItem, DcbReadResult
from consumers.client._dcb import append_call as dcb_append_call
from consumers.client._dcb import read_call as dcb_read_call
from consumers.client._http_call import BlockingHttp, PendingGet
from consumers.client._producer import PENDING_MESSAGES_DEFAULT, SEND_TIMEOUT_MS_DEFAULT, AsyncProducer
from consumers.client._streams import AsyncStreamReader, append_call, read_stream_call, stream_info_call
from consumers.client.errors import ConnectionClosed
from consumers.client.types import AppendResult, Message, SendResult, StreamBatch, StreamInfo
from consumers.tls import ClientTls

THREAD_JOIN_TIMEOUT_S = 10.0
_R = TypeVar("_R")


class _LoopThread:
    """An event loop running in a daemon thread; ``call`` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._close_when_stopped = False
        self._thread = threading.Thread(target=self._run, name="magnetar-client", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.loop.run_forever()
        if self._close_when_stopped:
            self.loop.close()

    def stop_soon(self, last: Coroutine[Any, Any, None]) -> None:
        """Run ``last`` on the loop, then stop and close the loop, without waiting: safe from
        any thread, a finalizer's (which may be the loop's own) included."""
        if self.loop.is_closed() or not self._thread.is_alive():
            last.close()
            return
        self._close_when_stopped = True

        async def final() -> None:
            try:
                await last
            finally:
                self.loop.stop()

        asyncio.run_coroutine_threadsafe(final(), self.loop)

    def call(self, coroutine: Coroutine[Any, Any, _R]) -> _R:
        if self._close_when_stopped:  # stopping (``stop_soon``): the coroutine might never run
            coroutine.close()
            raise RuntimeError("the client is closed")
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        except RuntimeError:  # the loop is closed (the client was): the coroutine will never run
            coroutine.close()
            raise
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(THREAD_JOIN_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()


def _to_concurrent(future: asyncio.Future[_R]) -> concurrent.futures.Future[_R]:
    """A thread-safe future completed with ``future``'s outcome (call on the loop's thread)."""
    out: concurrent.futures.Future[_R] = concurrent.futures.Future()

    def copy(done: asyncio.Future[_R]) -> None:
        if done.cancelled():
            out.cancel()
        elif (error := done.exception()) is not None:
            out.set_exception(error)
        else:
            out.set_result(done.result())

    future.add_done_callback(copy)
    return out


class Producer:
    """Create with ``Client.create_producer``."""

    def __init__(self, runner: _LoopThread, producer: AsyncProducer) -> None:
        self._runner = runner
        self._producer = producer
        self.topic = producer.topic

    def send(self, payload: bytes, *, key: str | None = None, properties: dict[str, str] | None = None,
             event_time_ms: int | None = None, deliver_after_ms: int | None = None, deliver_at_ms: int | None = None,
             sequence_id: int | None = None, expected_offset: int | None = None,
             expected_key_version: int | str | None = None) -> SendResult:
        """Publish one message and wait until it is durable (``expected_offset``,
        ``expected_key_version``: conditionally)."""
        return self._runner.call(self._producer.send(
            payload, key=key, properties=properties, event_time_ms=event_time_ms, deliver_after_ms=deliver_after_ms,
            deliver_at_ms=deliver_at_ms, sequence_id=sequence_id, expected_offset=expected_offset,
            expected_key_version=expected_key_version))

    def send_async(self, payload: bytes, *, key: str | None = None, properties: dict[str, str] | None = None,
                   event_time_ms: int | None = None, deliver_after_ms: int | None = None,
                   deliver_at_ms: int | None = None, sequence_id: int | None = None,
                   expected_offset: int | None = None) -> concurrent.futures.Future[SendResult]:
        """Start a publish; blocks only while ``max_pending_messages`` are in flight."""
        async def start() -> concurrent.futures.Future[SendResult]:
            return _to_concurrent(await self._producer.send_async(
                payload, key=key, properties=properties, event_time_ms=event_time_ms,
                deliver_after_ms=deliver_after_ms, deliver_at_ms=deliver_at_ms, sequence_id=sequence_id,
                expected_offset=expected_offset))

        return self._runner.call(start())

    @property
    def pending_messages(self) -> int:
        return self._producer.pending_messages

    def flush(self) -> None:
        self._runner.call(self._producer.flush())

    def close(self) -> None:
        self._runner.call(self._producer.close())

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Consumer:
    """Create with ``Client.subscribe``; iterating yields messages until the session ends."""

    def __init__(self, runner: _LoopThread, consumer: AsyncConsumer) -> None:
        self._runner = runner
        self._consumer = consumer
        self.subscription = consumer.subscription
        self.topics = consumer.topics

    def receive(self, timeout_ms: int | None = None) -> Message:
        """The next message; ``ReceiveTimeout`` after ``timeout_ms`` (None: wait until one comes)."""
        return self._runner.call(self._consumer.receive(timeout_ms))

    def acknowledge(self, message: Message | str) -> None:
        self._runner.call(self._consumer.acknowledge(message))

    def negative_acknowledge(self, message: Message | str) -> None:
        self._runner.call(self._consumer.negative_acknowledge(message))

    def reconsume_later(self, message: Message, delay_ms: int) -> str:
        """See ``AsyncConsumer.reconsume_later``."""
        return self._runner.call(self._consumer.reconsume_later(message, delay_ms))

    def unsubscribe(self) -> None:
        self._runner.call(self._consumer.unsubscribe())

    def close(self) -> None:
        self._runner.call(self._consumer.close())

    def __iter__(self) -> Iterator[Message]:
        while True:
            try:
                yield self.receive()
            except ConnectionClosed:
                return

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Reader:
    """Create with ``Client.create_reader`` (or ``Client.create_stream_reader``, one key's
    stream); iterating yields messages until the session ends."""

    def __init__(self, runner: _LoopThread, reader: AsyncReader | AsyncStreamReader) -> None:
        self._runner = runner
        self._reader = reader
        self.topic = reader.topic

    def read_next(self, timeout_ms: int | None = None) -> Message:
        return self._runner.call(self._reader.read_next(timeout_ms))

    def has_message_available(self) -> bool:
        return self._runner.call(self._reader.has_message_available())

    @property
    def reconnects(self) -> int:
        """Times the reader's session was opened again after its broker went away."""
        return self._reader.reconnects

    def close(self) -> None:
        self._runner.call(self._reader.close())

    def __iter__(self) -> Iterator[Message]:
        while True:
            try:
                yield self.read_next()
            except ConnectionClosed:
                return

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _close_dropped(runner: _LoopThread, client: AsyncClient, http: BlockingHttp) -> None:
    """A ``Client`` collected without ``close()``: its connections are closed and its thread
    ends, in the background."""
    http.close()
    runner.stop_soon(client.close())


class Client:
    """``with Client("http://127.0.0.1:8080", token=...) as client: ...``; one dropped without
    ``close()`` closes its connections and ends its thread when it is garbage-collected."""

    def __init__(self, service_url: str = DEFAULT_SERVICE_URL, token: str | None = None, *,
                 http_timeout_s: float = HTTP_TIMEOUT_S, failover_timeout_s: float = FAILOVER_TIMEOUT_S,
                 tls_trust_certs_file_path: str | None = None, tls_certificate_file_path: str | None = None,
                 tls_private_key_file_path: str | None = None) -> None:
        """See ``AsyncClient`` (``https://`` URLs and the TLS options among them)."""
        self.service_url = service_url.rstrip("/")
        self._runner = _LoopThread()

        async def make() -> AsyncClient:
            return AsyncClient(service_url, token, http_timeout_s=http_timeout_s, failover_timeout_s=failover_timeout_s,
                               tls_trust_certs_file_path=tls_trust_certs_file_path,
                               tls_certificate_file_path=tls_certificate_file_path,
                               tls_private_key_file_path=tls_private_key_file_path)

        try:
            self._client = self._runner.call(make())
        except BaseException:
            self._runner.stop()
            raise
        # a context of its own: httpx sets ALPN on its context for every connection it opens (on
        # the loop thread), and an OpenSSL context must not change while other threads use it
        tls = ClientTls(tls_trust_certs_file_path, tls_certificate_file_path, tls_private_key_file_path)
        self._http = BlockingHttp(service_urls(service_url), token, http_timeout_s, failover_timeout_s,
                                  functools.cache(tls.context))
        self._finalizer = weakref.finalize(self, _close_dropped, self._runner, self._client, self._http)
        self._finalizer.atexit = False

    def create_producer(self, topic: str, *, producer_name: str | None = None, batching: bool = False,
                        batching_max_messages: int = 1000, max_pending_messages: int = PENDING_MESSAGES_DEFAULT,
                        send_timeout_ms: int = SEND_TIMEOUT_MS_DEFAULT, compression_type: str | None = None,
                        initial_sequence_id: int | None = None, reconnect: bool = False) -> Producer:
        return Producer(self._runner, self._runner.call(self._client.create_producer(
            topic, producer_name=producer_name, batching=batching, batching_max_messages=batching_max_messages,
            max_pending_messages=max_pending_messages, send_timeout_ms=send_timeout_ms,
            compression_type=compression_type, initial_sequence_id=initial_sequence_id, reconnect=reconnect)))

    def subscribe(self, topic: str | Sequence[str], subscription: str, *, subscription_type: str = "Exclusive",
                  initial_position: str = "latest", receiver_queue_size: int = RECEIVER_QUEUE_SIZE_DEFAULT,
                  ack_timeout_ms: int | None = None, negative_ack_redelivery_delay_ms: int | None = None,
                  max_redeliver_count: int | None = None, dead_letter_topic: str | None = None,
                  consumer_name: str | None = None, reconnect: bool = False, retry_enable: bool = False,
                  retry_letter_topic: str | None = None) -> Consumer:
        return Consumer(self._runner, self._runner.call(self._client.subscribe(
            topic, subscription, subscription_type=subscription_type, initial_position=initial_position,
            receiver_queue_size=receiver_queue_size, ack_timeout_ms=ack_timeout_ms,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            max_redeliver_count=max_redeliver_count, dead_letter_topic=dead_letter_topic,
            consumer_name=consumer_name, reconnect=reconnect, retry_enable=retry_enable,
            retry_letter_topic=retry_letter_topic)))

    def create_reader(self, topic: str, start_message_id: str = "earliest", *,
                      receiver_queue_size: int = RECEIVER_QUEUE_SIZE_DEFAULT, reader_name: str | None = None,
                      reconnect: bool = False) -> Reader:
        return Reader(self._runner, self._runner.call(self._client.create_reader(
            topic, start_message_id, receiver_queue_size=receiver_queue_size, reader_name=reader_name,
            reconnect=reconnect)))

    def create_stream_reader(self, topic: str, key: str, from_version: int = 0, *,
                             receiver_queue_size: int = RECEIVER_QUEUE_SIZE_DEFAULT) -> Reader:
        """A live reader of the event stream of ``key`` from ``from_version`` on."""
        return Reader(self._runner, self._runner.call(self._client.create_stream_reader(
            topic, key, from_version, receiver_queue_size=receiver_queue_size)))

    def append(self, topic: str, key: str, events: Sequence[bytes], *, expected_version: int | str | None = None,
               producer_name: str | None = None, sequence_id: int | None = None,
               properties: dict[str, str] | None = None) -> AppendResult:
        """Append ``events`` to the stream of ``key`` (see ``AsyncClient.append``)."""
        return self._run(append_call(topic, key, events, expected_version, producer_name, sequence_id, properties))

    def read_stream(self, topic: str, key: str, *, from_version: int | None = None, max_messages: int = 100,
                    backward: bool = False) -> StreamBatch:
        """Events of the stream of ``key`` by version (see ``AsyncClient.read_stream``)."""
        return self._run(read_stream_call(topic, key, from_version, max_messages, backward))

    def stream_info(self, topic: str, key: str) -> StreamInfo:
        return self._run(stream_info_call(topic, key))

    def dcb_read(self, topic: str, items: Sequence[DcbQueryItem] = (), *, after: int = 0,
                 limit: int | None = None) -> DcbReadResult:
        """DCB events matching a query after a position (see ``AsyncClient.dcb_read``)."""
        return self._run(dcb_read_call(topic, items, after, limit))

    def dcb_append(self, topic: str, events: Sequence[DcbEvent], condition: Sequence[DcbQueryItem] | None = None, *,
                   after: int = 0, producer_name: str | None = None, sequence_id: int | None = None) -> int | None:
        """DCB events appended on a condition (see ``AsyncClient.dcb_append``)."""
        return self._run(dcb_append_call(topic, events, condition, after, producer_name, sequence_id))

    def produce_batch(self, topic: str, payloads: Sequence[bytes], *, keys: Sequence[str | None] | None = None,
                      properties: dict[str, str] | None = None, producer_name: str | None = None,
                      sequence_id: int | None = None, expected_offset: int | None = None,
                      partition: int | None = None) -> list[SendResult]:
        """REST produce (Pulsar's PIP-64): the payloads in one request, stored as one entry."""
        return self._runner.call(self._client.produce_batch(
            topic, payloads, keys=keys, properties=properties, producer_name=producer_name, sequence_id=sequence_id,
            expected_offset=expected_offset, partition=partition))

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> httpx.Response:
        """One HTTP call to the broker (admin API and the like), made from the calling thread
        (``BlockingHttp``); an error status raises ``HttpError``."""
        return self._http.request(method, path, json_body=json_body, params=params, headers=headers)

    def _run(self, call: Call[_R]) -> _R:
        """A request-and-answer call made from the calling thread (``BlockingHttp``)."""
        return run_blocking(call, self._requested)

    def _requested(self, asked: HttpRequest) -> httpx.Response:
        return self._http.request(asked.method, asked.path, json_body=asked.json_body, params=asked.params)

    def send_get(self, path: str, *, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                 broker: httpx.URL | None = None) -> PendingGet:
        """A GET sent now whose answer ``PendingGet.answer()`` reads later, so the broker works
        on it while the caller does something else; to the broker of the URL ``broker`` when
        given (``response.url`` of a :meth:`request` for this path: its owner), else to the
        first listed broker. No retry, redirect or failover: a caller that gets ``HttpError``
        makes the call again with :meth:`request`."""
        return self._http.send(path, params=params, headers=headers, broker=broker)

    def close(self) -> None:
        if self._finalizer.detach() is None:
            # closed already, or being closed by the finalizer: a garbage collection of a cycle
            # holding this client runs the finalizer before the ``__del__`` of its holder (an
            # application closing its infrastructure), whose ``close()`` would otherwise hand a
            # coroutine to a loop that is stopping, and wait for it forever
            return
        self._http.close()
        if not self._runner.loop.is_closed():
            try:
                self._runner.call(self._client.close())
            finally:
                self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
