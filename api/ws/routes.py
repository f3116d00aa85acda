"""Pulsar's WebSocket API v2 routes: which session each handshake path opens, and their documentation.

Role: paths and query parameters follow Pulsar's WebSocket API, so a client written from
Pulsar's docs works unchanged (plus Magnetar's DCB socket, ``/ws/v2/dcb/…``: ``dcb.py``); the
producer and consumer paths exist for ``non-persistent`` topics too
(``/ws/v2/producer/non-persistent/…``). ``websocket_routes`` is the edge's route table: each
``WebSocketRoute`` matches a handshake's path and reads the handshake (``Handshake``: path
parameters and query) into an ``Opening``: what the caller must be allowed (an action on topics;
a consumer that names its own dead-letter topic also needs the produce permission there, since
the broker writes into it on its behalf) and how the session's broker objects (producer,
consumer over a ``MultiConsumer``, readers) start. A bad parameter raises the broker's
``InvalidRequest``; ``server.py`` answers every refusal of a handshake, once, as an HTTP error.
``router`` lists the same paths, with their query parameters and frames, in the OpenAPI document
and ``/docs``, and answers a plain HTTP GET on them with 426.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fastapi import APIRouter

from api.auth import Action
from api.errors import UpgradeRequired
from api.limits import RECEIVER_QUEUE_MESSAGES_MAX, EdgeLimits
from api.ws.consumer import ConsumerSession
from api.ws.dcb import DcbSession
from api.ws.params import ConsumerParams, ProducerParams, QueryParams, reader_start
from api.ws.producer import ProducerSession
from api.ws.reader import ReaderSession
from api.ws.session import Session, SessionIO
from broker import (
    VERSION_MAX,
    BrokerService,
    InvalidRequest,
    KeyReader,
    Reader,
    TopicName,
    check_key,
    check_subscription_name,
)

_PARAMETER = re.compile(r"\{(\w+)\}")
PERSISTENT, NON_PERSISTENT = "persistent", "non-persistent"


@dataclass(frozen=True)
class Handshake:
    """What a route reads of a WebSocket handshake."""

    params: Mapping[str, str]
    """The path's parameters (percent-decoded)."""
    query: QueryParams
    peer: str = ""
    """The client's address, ``host:port`` (empty when the transport does not know it)."""


@dataclass(frozen=True)
class Opening:
    """A handshake's session, before it is authorized and started."""

    action: Action
    topics: list[TopicName]
    start: Callable[[SessionIO], Session]
    """Creates the session's broker objects; raises the broker's refusal (the upgrade is answered)."""
    dead_letter_topic: str | None = None
    also: tuple[Action, ...] = ()
    """Actions the caller must be allowed on ``topics`` besides ``action`` (a DCB socket reads and appends)."""


@dataclass(frozen=True)
class WebSocketRoute:
    path: str
    """The path template, ``{name}`` for a parameter (one path segment)."""
    summary: str
    description: str
    open: Callable[[Handshake], Opening]
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = _PARAMETER.sub(r"(?P<\1>[^/]+)", self.path)  # the paths' other characters are literal in a regex
        object.__setattr__(self, "_pattern", re.compile(f"^{regex}$"))

    def match(self, path: str) -> dict[str, str] | None:
        """The path parameters when ``path`` (percent-decoded) is this route's, else None."""
        found = self._pattern.match(path)
        return None if found is None else found.groupdict()


def websocket_routes(service: BrokerService, limits: EdgeLimits) -> list[WebSocketRoute]:
    """The WebSocket API's routes over ``service``."""

    def producer(handshake: Handshake) -> Opening:
        params = handshake.params
        name = TopicName.of(params["tenant"], params["namespace"], params["topic"], params.get("domain", PERSISTENT))
        producing = ProducerParams.parse(handshake.query)
        return Opening(Action.PRODUCE, [name], lambda io: ProducerSession(io, service, name, producing))

    def consume(handshake: Handshake, topics: list[TopicName], subscription: str,
                pattern: tuple[str, str] | None = None) -> Opening:
        params = ConsumerParams.parse(handshake.query, limits, handshake.peer)

        def start(io: SessionIO) -> Session:
            if pattern is not None:
                consumer = service.subscriptions.subscribe_pattern(
                    pattern[0], pattern[1], subscription, params.sub_type, params.config, initial=params.initial,
                    pattern_bytes_max=limits.topics_pattern_bytes_max)
            else:
                consumer = service.subscriptions.subscribe_many(
                    [t.full_name for t in topics], subscription, params.sub_type, params.config,
                    initial=params.initial, durable=params.durable)
            return ConsumerSession(io, service, consumer, params, topics, subscription)

        return Opening(Action.CONSUME, topics, start, params.config.dead_letter_topic)

    def consumer(handshake: Handshake) -> Opening:
        params = handshake.params
        name = TopicName.of(params["tenant"], params["namespace"], params["topic"], params.get("domain", PERSISTENT))
        check_subscription_name(params["subscription"])
        return consume(handshake, [name], params["subscription"])

    def multi_topic_consumer(handshake: Handshake) -> Opening:
        subscription, query = handshake.params["subscription"], handshake.query
        check_subscription_name(subscription)
        topics_text, pattern = query.text("topics"), query.text("topicsPattern")
        if (topics_text is None) == (pattern is None):
            raise InvalidRequest("give exactly one of the query parameters topics or topicsPattern")
        if pattern is not None:
            names, target = _pattern_target(pattern)
            return consume(handshake, names, subscription, target)
        assert topics_text is not None
        names = [TopicName.parse(t.strip()) for t in topics_text.split(",") if t.strip()]
        if not names:
            raise InvalidRequest("topics lists no topic")
        return consume(handshake, names, subscription)

    def reader(handshake: Handshake) -> Opening:
        params, query = handshake.params, handshake.query
        name = TopicName.of(params["tenant"], params["namespace"], params["topic"])
        receiver_queue = min(query.integer("receiverQueueSize", RECEIVER_QUEUE_MESSAGES_MAX, 1, 2**31 - 1),
                             RECEIVER_QUEUE_MESSAGES_MAX)
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

        def start_reading(io: SessionIO) -> Session:
            if key is not None:
                readers: list[Reader | KeyReader] = [service.streams.stream_reader(name, key, from_version)]
            else:
                readers = [service.subscriptions.reader(p, start, compacted=compacted)
                           for p in service.topics.expand_partitions(name)]
            return ReaderSession(io, service, readers, receiver_queue, limits.consumer_unacked_bytes_max)

        return Opening(Action.CONSUME, [name], start_reading)

    def dcb(handshake: Handshake) -> Opening:
        params = handshake.params
        name = TopicName.of(params["tenant"], params["namespace"], params["topic"])
        read_bytes_max = limits.read_response_bytes_max * 3 // 4  # base64 in JSON
        return Opening(Action.CONSUME, [name], lambda io: DcbSession(io, service, name, read_bytes_max),
                       also=(Action.PRODUCE,))

    handlers = {"producer": producer, "consumer": consumer, "multi": multi_topic_consumer, "reader": reader,
                "dcb": dcb}
    routes = [WebSocketRoute(path, summary, description, handlers[kind])
              for kind, (path, summary, description) in _WS_DOCS.items()]
    for kind in ("producer", "consumer"):  # Pulsar's paths for non-persistent topics
        path, summary, description = _WS_DOCS[kind]
        routes.append(WebSocketRoute(path.replace(f"/{PERSISTENT}/", f"/{NON_PERSISTENT}/"),
                                     f"{summary}, non-persistent topic", description,
                                     _in_domain(NON_PERSISTENT, handlers[kind])))
    return routes


def _in_domain(domain: str, handler: Callable[[Handshake], Opening]) -> Callable[[Handshake], Opening]:
    """``handler`` for the topics of ``domain`` (its path names no domain parameter)."""
    return lambda handshake: handler(Handshake({**handshake.params, "domain": domain}, handshake.query))


_WS_DOCS = {
    "producer": (
        "/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}",
        "WebSocket producer (Pulsar WebSocket API v2)",
        "Connect with a WebSocket client. Query parameters: producerName, initialSequenceId, batchingEnabled, "
        "batchingMaxMessages, maxPendingMessages, messageRoutingMode, compressionType, token. Send "
        "`{payload (base64), properties, context, key, eventTime, deliverAt, deliverAfterMs, sequenceId, "
        "expectedOffset, expectedKeyVersion}`; each frame is answered `{result: \"ok\", messageId, context, offset, "
        "keyVersion}` or `{result: \"send-error:<n>\", errorMsg, errorCode, context, currentKeyVersion}`."),
    "consumer": (
        "/ws/v2/consumer/persistent/{tenant}/{namespace}/{topic}/{subscription}",
        "WebSocket consumer (Pulsar WebSocket API v2)",
        "Connect with a WebSocket client. Query parameters: subscriptionType (Exclusive, Shared, Failover, "
        "Key_Shared), subscriptionMode, subscriptionInitialPosition, receiverQueueSize (≤ 1000), consumerName, "
        "priorityLevel, ackTimeoutMillis, negativeAckRedeliveryDelay, maxRedeliverCount, deadLetterTopic, "
        "pullMode, token. Messages arrive as `{messageId, payload, properties, publishTime, redeliveryCount, "
        "key, eventTime, offset}`; send `{messageId}` to acknowledge, `{type: \"negativeAcknowledge\", "
        "messageId}`, `{type: \"permit\", permitMessages}` (pull mode), `{type: \"unsubscribe\"}`, "
        "`{type: \"isEndOfTopic\"}`."),
    "multi": (
        "/ws/v3/consumer/{subscription}",
        "WebSocket multi-topic consumer (Pulsar WebSocket API v3)",
        "Like the v2 consumer, over `?topics=a,b` or `?topicsPattern=persistent://tenant/namespace/regex`."),
    "reader": (
        "/ws/v2/reader/persistent/{tenant}/{namespace}/{topic}",
        "WebSocket reader (Pulsar WebSocket API v2)",
        "Connect with a WebSocket client. Query parameters: messageId (earliest, latest or a base64 message "
        "id; the reader starts after it), receiverQueueSize, readerName, readCompacted (the latest message per "
        "key up to the last compaction, then the rest of the topic), token; or key and fromKeyVersion (default 0) "
        "for a live reader of one key's event stream: its messages from that version on, then each new one, "
        "with their keyVersion. Messages arrive like the consumer's; acknowledgements only free flow-control "
        "credit; `{type: \"isEndOfTopic\"}` is answered."),
    "dcb": (
        "/ws/v2/dcb/persistent/{tenant}/{namespace}/{topic}",
        "WebSocket DCB store: events read by query, appended on a condition (Magnetar)",
        "Connect with a WebSocket client (produce and consume permissions). Send `{type: \"read\", context, items: "
        "[{types, tags}], after, limit}` or `{type: \"append\", context, events: [{type, tags, data (base64)}], "
        "condition: {failIfEventsMatch: {items}, after}, producerName, sequenceId}`; each frame is answered in "
        "order, `{result: \"ok\", context, events, head, nextAfter}` or `{result: \"ok\", context, position}`, or "
        "`{result: \"error:<n>\", context, errorCode, errorMsg, position}` (`dcb_condition_failed`: nothing "
        "written)."),
}


def router(routes: list[WebSocketRoute]) -> APIRouter:
    """Plain HTTP GETs on the WebSocket paths answer 426 with a clear error, and the WebSocket
    endpoints (with their query parameters and frames) are listed in the OpenAPI document and
    ``/docs``."""
    documented = APIRouter()
    for route in routes:
        def upgrade_required() -> None:
            raise UpgradeRequired("this is a WebSocket endpoint: connect with a WebSocket client (ws://)")

        documented.add_api_route(route.path, upgrade_required, methods=["GET"], summary=route.summary,
                                 description=route.description, tags=["websocket"], status_code=101,
                                 response_model=None,
                                 responses={426: {"description": "Not a WebSocket upgrade request"}})
    return documented


def _pattern_target(pattern: str) -> tuple[list[TopicName], tuple[str, str]]:
    """The namespace a ``topicsPattern`` ranges over (for authorization) and the full-name regex."""
    full = pattern if "://" in pattern else f"persistent://{pattern}"
    parts = full.split("://", 1)[1].split("/")
    if len(parts) < 3:
        raise InvalidRequest(f"topicsPattern {pattern!r} must look like persistent://tenant/namespace/regex")
    namespace_probe = TopicName.of(parts[0], parts[1], "pattern")
    return [namespace_probe], (namespace_probe.namespace_name, full)
