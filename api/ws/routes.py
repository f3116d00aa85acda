"""Pulsar's WebSocket API v2 routes: the handshake of every session kind, and its documentation.

Role: paths and query parameters follow Pulsar's WebSocket API, so a client written from
Pulsar's docs works unchanged. Each handshake authenticates and authorizes first (a consumer
that names its own dead-letter topic also needs the produce permission there), creates the
broker object second (producer, consumer over a ``MultiConsumer``, readers) and only then
accepts; any failure there answers the upgrade with an HTTP error (4xx JSON ``{code,
message}``), as Pulsar does, so nothing is half-open. An admitted session is registered with
what it was admitted for and ends (1008) if its caller loses a permission it needs
(``api/sessions.py``). Plain HTTP GETs on the WebSocket paths answer 426 and list the endpoints
in the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, WebSocket

from api.auth import Action, Authorizer
from api.errors import UpgradeRequired
from api.limits import EdgeLimits
from api.sessions import Admission, SessionRegistry
from api.ws.consumer import ConsumerSession
from api.ws.frames import deny
from api.ws.params import RECEIVER_QUEUE_SIZE_MAX, ConsumerParams, ProducerParams, QueryParams, reader_start
from api.ws.producer import ProducerSession
from api.ws.reader import ReaderSession
from api.ws.session import serve
from broker import (
    VERSION_MAX,
    BrokerService,
    InvalidRequest,
    KeyReader,
    MagnetarError,
    Reader,
    TopicName,
    check_key,
    check_subscription_name,
)

Started = tuple[Callable[[], Awaitable[None]], Callable[[], None] | None]
"""A session's run coroutine, and what undoes its broker objects if the upgrade is refused."""


def router(service: BrokerService, authorizer: Authorizer, limits: EdgeLimits) -> APIRouter:
    routes = APIRouter()
    sessions = SessionRegistry(authorizer)
    service.add_policy_listener(sessions.revalidate)
    service.add_unload_listener(sessions.topics_unloaded)

    async def admit(websocket: WebSocket, action: Action, topics: list[TopicName],
                    dead_letter_topic: str | None = None) -> Admission | None:
        """Authenticate and authorize the handshake (None: refused, and answered); a consumer
        that names its own dead-letter topic must also be allowed to produce there (the broker
        writes into it on its behalf)."""
        checks = [(action, topic) for topic in topics]
        try:
            caller = authorizer.authenticate(websocket)
            if dead_letter_topic is not None:
                checks.append((Action.PRODUCE, TopicName.parse(dead_letter_topic)))
            for needed, topic in checks:
                authorizer.require(caller, needed, topic)
        except MagnetarError as exc:
            await deny(websocket, exc)
            return None
        return Admission(caller, tuple(checks))

    async def open_session(websocket: WebSocket, action: Action, topics: list[TopicName],
                           start: Callable[[], Started], dead_letter_topic: str | None = None) -> None:
        """Admit the handshake, create the session's broker objects (``start``), then run it;
        a refusal at either step answers the upgrade. The session ends early if its caller
        loses a permission it needs."""
        admission = await admit(websocket, action, topics, dead_letter_topic)
        if admission is None:
            return
        try:
            run, on_refused = start()
        except MagnetarError as exc:
            await deny(websocket, exc)
            return
        session_id = sessions.opened(admission, websocket)
        try:
            await serve(websocket, run, on_refused)
        finally:
            sessions.ended(session_id)

    _document_websocket_paths(routes)

    @routes.websocket("/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}")
    async def producer(websocket: WebSocket, tenant: str, namespace: str, topic: str) -> None:
        try:
            name = TopicName.of(tenant, namespace, topic)
            params = ProducerParams.parse(QueryParams(websocket.query_params))
        except MagnetarError as exc:
            await deny(websocket, exc)
            return
        def start_producing() -> Started:
            session = ProducerSession(websocket, service, name, params)
            return session.run, session.producer.close

        await open_session(websocket, Action.PRODUCE, [name], start_producing)

    async def consume(websocket: WebSocket, topics: list[TopicName], subscription: str,
                      pattern: tuple[str, str] | None = None) -> None:
        try:
            params = ConsumerParams.parse(QueryParams(websocket.query_params), limits)
        except MagnetarError as exc:
            await deny(websocket, exc)
            return

        def start() -> Started:
            if pattern is not None:
                consumer = service.subscriptions.subscribe_pattern(
                    pattern[0], pattern[1], subscription, params.sub_type, params.config, initial=params.initial,
                    pattern_bytes_max=limits.topics_pattern_bytes_max)
            else:
                consumer = service.subscriptions.subscribe_many(
                    [t.full_name for t in topics], subscription, params.sub_type, params.config,
                    initial=params.initial, durable=params.durable)
            return ConsumerSession(websocket, service, consumer, params, topics, subscription).run, consumer.close

        await open_session(websocket, Action.CONSUME, topics, start, params.config.dead_letter_topic)

    @routes.websocket("/ws/v2/consumer/persistent/{tenant}/{namespace}/{topic}/{subscription}")
    async def consumer(websocket: WebSocket, tenant: str, namespace: str, topic: str, subscription: str) -> None:
        try:
            name = TopicName.of(tenant, namespace, topic)
            check_subscription_name(subscription)
        except MagnetarError as exc:
            await deny(websocket, exc)
            return
        await consume(websocket, [name], subscription)

    @routes.websocket("/ws/v3/consumer/{subscription}")
    async def multi_topic_consumer(websocket: WebSocket, subscription: str) -> None:
        query = QueryParams(websocket.query_params)
        try:
            check_subscription_name(subscription)
            topics_text, pattern = query.text("topics"), query.text("topicsPattern")
            if (topics_text is None) == (pattern is None):
                raise InvalidRequest("give exactly one of the query parameters topics or topicsPattern")
            if pattern is not None:
                names, target = _pattern_target(pattern)
            else:
                assert topics_text is not None
                names = [TopicName.parse(t.strip()) for t in topics_text.split(",") if t.strip()]
                target = None
                if not names:
                    raise InvalidRequest("topics lists no topic")
        except MagnetarError as exc:
            await deny(websocket, exc)
            return
        await consume(websocket, names, subscription, target)

    @routes.websocket("/ws/v2/reader/persistent/{tenant}/{namespace}/{topic}")
    async def reader(websocket: WebSocket, tenant: str, namespace: str, topic: str) -> None:
        query = QueryParams(websocket.query_params)
        try:
            name = TopicName.of(tenant, namespace, topic)
            receiver_queue = min(query.integer("receiverQueueSize", RECEIVER_QUEUE_SIZE_MAX, 1, 2**31 - 1),
                                 RECEIVER_QUEUE_SIZE_MAX)
            start = reader_start(query)
            compacted = query.flag("readCompacted", False)
            key = query.text("key")
            from_version = query.integer("fromKeyVersion", 0, 0, VERSION_MAX)
            if key is not None:
                check_key(key)
                if query.text("messageId") is not None or compacted:
                    raise InvalidRequest("a key reader (key=) starts at fromKeyVersion: give no messageId or "
                                         "readCompacted")
            elif query.text("fromKeyVersion") is not None:
                raise InvalidRequest("fromKeyVersion needs a key")
        except MagnetarError as exc:
            await deny(websocket, exc)
            return

        def start_reading() -> Started:
            if key is not None:
                readers: list[Reader | KeyReader] = [service.streams.stream_reader(name, key, from_version)]
            else:
                readers = [service.subscriptions.reader(p, start, compacted=compacted)
                           for p in service.topics.expand_partitions(name)]
            session = ReaderSession(websocket, service, readers, receiver_queue, limits.consumer_unacked_bytes_max)
            return session.run, None

        await open_session(websocket, Action.CONSUME, [name], start_reading)

    return routes


_WS_DOCS = {
    "/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}": (
        "WebSocket producer (Pulsar WebSocket API v2)",
        "Connect with a WebSocket client. Query parameters: producerName, initialSequenceId, batchingEnabled, "
        "batchingMaxMessages, maxPendingMessages, messageRoutingMode, compressionType, token. Send "
        "`{payload (base64), properties, context, key, eventTime, deliverAt, deliverAfterMs, sequenceId, "
        "expectedOffset, expectedKeyVersion}`; each frame is answered `{result: \"ok\", messageId, context, offset, "
        "keyVersion}` or `{result: \"send-error:<n>\", errorMsg, errorCode, context, currentKeyVersion}`."),
    "/ws/v2/consumer/persistent/{tenant}/{namespace}/{topic}/{subscription}": (
        "WebSocket consumer (Pulsar WebSocket API v2)",
        "Connect with a WebSocket client. Query parameters: subscriptionType (Exclusive, Shared, Failover, "
        "Key_Shared), subscriptionMode, subscriptionInitialPosition, receiverQueueSize (≤ 1000), consumerName, "
        "priorityLevel, ackTimeoutMillis, negativeAckRedeliveryDelay, maxRedeliverCount, deadLetterTopic, "
        "pullMode, token. Messages arrive as `{messageId, payload, properties, publishTime, redeliveryCount, "
        "key, eventTime, offset}`; send `{messageId}` to acknowledge, `{type: \"negativeAcknowledge\", "
        "messageId}`, `{type: \"permit\", permitMessages}` (pull mode), `{type: \"unsubscribe\"}`, "
        "`{type: \"isEndOfTopic\"}`."),
    "/ws/v3/consumer/{subscription}": (
        "WebSocket multi-topic consumer (Pulsar WebSocket API v3)",
        "Like the v2 consumer, over `?topics=a,b` or `?topicsPattern=persistent://tenant/namespace/regex`."),
    "/ws/v2/reader/persistent/{tenant}/{namespace}/{topic}": (
        "WebSocket reader (Pulsar WebSocket API v2)",
        "Connect with a WebSocket client. Query parameters: messageId (earliest, latest or a base64 message "
        "id; the reader starts after it), receiverQueueSize, readerName, readCompacted (the latest message per "
        "key up to the last compaction, then the rest of the topic), token; or key and fromKeyVersion (default 0) "
        "for a live reader of one key's event stream: its messages from that version on, then each new one, "
        "with their keyVersion. Messages arrive like the consumer's; acknowledgements only free flow-control "
        "credit; `{type: \"isEndOfTopic\"}` is answered."),
}


def _document_websocket_paths(routes: APIRouter) -> None:
    """Plain HTTP GETs on the WebSocket paths answer 426 with a clear error, and list the WebSocket
    endpoints (with their query parameters and frames) in the OpenAPI document and ``/docs``."""
    for path, (summary, description) in _WS_DOCS.items():
        def upgrade_required() -> None:
            raise UpgradeRequired("this is a WebSocket endpoint: connect with a WebSocket client (ws://)")

        routes.add_api_route(path, upgrade_required, methods=["GET"], summary=summary, description=description,
                             tags=["websocket"], status_code=101, response_model=None,
                             responses={426: {"description": "Not a WebSocket upgrade request"}})


def _pattern_target(pattern: str) -> tuple[list[TopicName], tuple[str, str]]:
    """The namespace a ``topicsPattern`` ranges over (for authorization) and the full-name regex."""
    full = pattern if "://" in pattern else f"persistent://{pattern}"
    parts = full.split("://", 1)[1].split("/")
    if len(parts) < 3:
        raise InvalidRequest(f"topicsPattern {pattern!r} must look like persistent://tenant/namespace/regex")
    namespace_probe = TopicName.of(parts[0], parts[1], "pattern")
    return [namespace_probe], (namespace_probe.namespace_name, full)
