"""Pulsar's WebSocket API v2: producer, consumer and reader sessions over JSON frames.

Role: the streaming edge. A session is one WebSocket connection bound to one broker object (a
producer publishing to a topic, a ``MultiConsumer`` on a subscription, or readers). Paths, query
parameters and frames follow Pulsar's WebSocket API, so a client written from Pulsar's docs works
unchanged; Magnetar adds the message ``offset`` to publish results and to delivered messages.

Invariants:
- The handshake authenticates and authorizes first and creates the broker object second; any
  failure there answers the upgrade with an HTTP error (4xx JSON ``{code, message}``), as Pulsar
  does, so nothing is half-open.
- A bad frame never closes the session and never writes anything: the producer answers
  ``{"result": "send-error:<n>", "errorMsg", "context"}`` (3 bad JSON, 7 bad payload encoding,
  8 broker refusal), consumers and readers answer ``{"result": "error:<n>", "errorMsg"}``.
- Every buffer is bounded: a producer has at most ``maxPendingMessages`` publishes in flight (it
  stops reading frames until results are sent); a push-mode consumer or a reader has at most
  ``receiverQueueSize`` (≤ 1000) messages delivered and not yet acknowledged, and that credit is
  recomputed from the broker's own accounting so redelivered messages never leak it (Pulsar
  #2731); a pull-mode consumer gets exactly the permits it asks for.
- Publishes complete in order; a result is sent only once its entry is durable.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import itertools
import json
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from api.auth import Action, Authorizer
from api.errors import UpgradeRequired, error_body
from api.limits import EdgeLimits
from api.sessions import Admission, SessionRegistry
from api.wakeup import LoopSignal, LoopWakeup
from api.ws_protocol import FrameWriter
from broker.entry_format import Compression, Message
from broker.errors import InvalidRequest, MagnetarError
from broker.message_id import MessageId
from broker.reader import Reader, StartPosition
from broker.routing import MultiConsumer
from broker.service import BrokerService
from broker.subscription import ConsumerConfig, Delivery, SubscriptionType
from broker.topic import SEQUENCE_ID_MAX, PublishResult
from broker.topic_name import TopicName

log = logging.getLogger(__name__)

RECEIVER_QUEUE_SIZE_MAX = 1000
PENDING_MESSAGES_MAX = 10_000
BATCH_MESSAGES_MAX = 10_000
PERMITS_PER_FRAME_MAX = 100_000
READER_FILL_MESSAGES_MAX = 1000
CREDIT_CHECK_INTERVAL_S = 1.0
FRAME_ERROR_TEXT_MAX = 300
ISO_SECONDS_CACHED_MAX = 4096
SENT_IDS_REMEMBERED_MAX = 4 * RECEIVER_QUEUE_SIZE_MAX
DELIVERY_BACKLOG_FRAMES_MAX = RECEIVER_QUEUE_SIZE_MAX

# Pulsar's WebSocket result codes
JSON_DESERIALIZE_ERROR = 3
PAYLOAD_ENCODING_ERROR = 7
UNKNOWN_ERROR = 8

_COMPRESSIONS = {"NONE": Compression.NONE, "LZ4": Compression.LZ4, "ZLIB": Compression.ZLIB,
                 "ZSTD": Compression.ZSTD, "SNAPPY": Compression.SNAPPY}


class FrameError(Exception):
    """A client frame this session cannot use; answered with an error frame, nothing written."""

    def __init__(self, result_code: int, message: str) -> None:
        super().__init__(message)
        self.result_code = result_code


# --- query parameters ------------------------------------------------------------------------
class QueryParams:
    """Typed access to a handshake's query string; bad values raise ``InvalidRequest`` (400)."""

    def __init__(self, query: Mapping[str, str]) -> None:
        self._query = query

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self._query.get(name)
        return value if value not in (None, "") else default

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        raw = self._query.get(name)
        if raw in (None, ""):
            return default
        try:
            value = int(raw)
        except ValueError:
            raise InvalidRequest(f"query parameter {name} must be an integer, not {raw!r}") from None
        if not low <= value <= high:
            raise InvalidRequest(f"query parameter {name} must be between {low} and {high}, not {value}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        raw = self._query.get(name)
        if raw in (None, ""):
            return default
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise InvalidRequest(f"query parameter {name} must be true or false, not {raw!r}")

    def choice(self, name: str, options: Mapping[str, Any], default: str) -> Any:
        raw = self.text(name, default)
        assert raw is not None
        for option, value in options.items():
            if option.lower() == raw.lower():
                return value
        raise InvalidRequest(f"query parameter {name} must be one of {', '.join(options)}, not {raw!r}")


# --- frames ------------------------------------------------------------------------------------
def iso_time(epoch_ms: int) -> str:
    """Pulsar's WebSocket timestamps: ISO-8601 with milliseconds, UTC."""
    seconds, millis = divmod(epoch_ms, 1000)
    return f"{_iso_second(seconds)}.{millis:03d}Z"


@functools.lru_cache(maxsize=ISO_SECONDS_CACHED_MAX)
def _iso_second(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def parse_event_time_ms(value: Any) -> int | None:
    """``eventTime`` as epoch milliseconds (a number or numeric string) or ISO-8601 text."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise FrameError(PAYLOAD_ENCODING_ERROR, "eventTime must be epoch milliseconds or ISO-8601")
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            stamp = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
            return max(0, int(stamp.timestamp() * 1000))
    raise FrameError(PAYLOAD_ENCODING_ERROR, f"eventTime {str(value)[:40]!r} is not epoch ms or ISO-8601")


def message_frame(delivery: Delivery, message_id_b64: str | None = None) -> str:
    """A delivered message as Pulsar's WebSocket frame (plus its ``offset``), written directly:
    ids, base64 and times need no escaping; only the key and properties go through JSON."""
    message = delivery.message
    extra = ""
    if message.key is not None:
        extra += f',"key":{json.dumps(message.key)}'
    if message.event_time_ms is not None:
        extra += f',"eventTime":"{iso_time(message.event_time_ms)}"'
    properties = json.dumps(message.properties, separators=(",", ":")) if message.properties else "{}"
    message_id = message_id_b64 or delivery.message_id.to_base64()
    return (f'{{"messageId":"{message_id}",'
            f'"payload":"{base64.b64encode(message.payload).decode("ascii")}",'
            f'"properties":{properties},"publishTime":"{iso_time(delivery.publish_time_ms)}",'
            f'"redeliveryCount":{delivery.redelivery_count},"offset":{delivery.offset}{extra}}}')


def parse_frame(text: str) -> dict[str, Any]:
    try:
        frame = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FrameError(JSON_DESERIALIZE_ERROR, f"frame is not valid JSON: {exc}") from None
    if not isinstance(frame, dict):
        raise FrameError(JSON_DESERIALIZE_ERROR, "frame must be a JSON object")
    return frame


def _short(text: str) -> str:
    return text if len(text) <= FRAME_ERROR_TEXT_MAX else text[:FRAME_ERROR_TEXT_MAX] + "…"


def _frame_text(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))


async def _receive_text(websocket: WebSocket) -> str | None:
    """The next text frame (binary frames are decoded as UTF-8), or None once the peer left."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        return None
    if message.get("text") is not None:
        text: str = message["text"]
        return text
    try:
        return bytes(message.get("bytes") or b"").decode()
    except UnicodeDecodeError:
        return "\x00"  # not JSON: answered as a bad frame


async def _deny(websocket: WebSocket, exc: MagnetarError) -> None:
    """Answer the upgrade with an HTTP error, as Pulsar does when it cannot create the session."""
    await websocket.send_denial_response(
        JSONResponse(error_body(exc.code, str(exc) or exc.code), status_code=exc.http_status))


# --- producer ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProducerParams:
    producer_name: str
    explicit_name: bool
    initial_sequence_id: int | None
    batching: bool
    batch_messages_max: int
    pending_messages_max: int
    routing_mode: str
    compression: Compression

    @classmethod
    def parse(cls, query: QueryParams) -> ProducerParams:
        name = query.text("producerName")
        initial = query.text("initialSequenceId")
        return cls(
            producer_name=name or f"ws-producer-{uuid.uuid4().hex[:12]}",
            explicit_name=name is not None,
            initial_sequence_id=query.integer("initialSequenceId", -1, -1, 2**63 - 1) if initial else None,
            batching=query.flag("batchingEnabled", False),
            batch_messages_max=query.integer("batchingMaxMessages", 1000, 1, BATCH_MESSAGES_MAX),
            pending_messages_max=query.integer("maxPendingMessages", 1000, 1, PENDING_MESSAGES_MAX),
            routing_mode=query.choice("messageRoutingMode", {"RoundRobinPartition": "RoundRobinPartition",
                                                             "SinglePartition": "SinglePartition"},
                                      "RoundRobinPartition"),
            compression=query.choice("compressionType", _COMPRESSIONS, "NONE"),
        )


@dataclass
class _Send:
    context: Any
    message: Message
    deliver_at_ms: int | None
    sequence_id: int | None


@dataclass
class _Rejected:
    context: Any
    error: FrameError


class ProducerSession:
    """Frames in, durable publishes out, results back in the order the frames came.

    Results are written by the event-loop callback that learns a publish finished (no task
    switch per result): every finished publish at the head of ``_pending`` is answered, in
    frame order, in one socket write."""

    def __init__(self, websocket: WebSocket, service: BrokerService, topic: TopicName,
                 params: ProducerParams) -> None:
        self.ws = websocket
        self.service = service
        self.topic = topic
        self.params = params
        self._inbox: asyncio.Queue[_Send | _Rejected | None] = asyncio.Queue(params.pending_messages_max)
        self._pending: deque[tuple[list[Any], Outcome]] = deque()
        self._room = asyncio.Event()
        self._room.set()
        self._answered = asyncio.Event()
        self._writer = FrameWriter(websocket, params.pending_messages_max)
        self._finished = LoopSignal(asyncio.get_running_loop(), self._send_results)
        self._sequence_ids = itertools.count(params.initial_sequence_id + 1) \
            if params.initial_sequence_id is not None else None

    async def run(self) -> None:
        """Without batching, frames are published as they are read; with it, a publish loop
        takes them from an inbox so that frames which arrived together make one entry."""
        workers = [asyncio.create_task(self._publish_loop())] if self.params.batching else []
        if await _supervise(self.ws, self._receive_loop(), workers):
            # the client left: answer what it sent before it did
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                if self.params.batching:
                    await self._inbox.put(None)
                    await asyncio.gather(*workers)
                while self._pending:
                    self._answered.clear()
                    await self._answered.wait()
                await self._writer.flush()

    async def _receive_loop(self) -> None:
        while (text := await _receive_text(self.ws)) is not None:
            try:
                item: _Send | _Rejected = self._parse_send(text)
            except _ContextFrameError as exc:
                item = _Rejected(exc.context, exc)
            except FrameError as exc:
                item = _Rejected(None, exc)
            if self.params.batching:
                await self._inbox.put(item)
            else:
                await self._wait_for_room()
                self._track(*self._outcome_of(item))

    def _outcome_of(self, item: _Send | _Rejected) -> tuple[list[Any], Outcome]:
        """One frame's publish, or its refusal."""
        if isinstance(item, _Rejected):
            return [item.context], item.error
        return [item.context], self._publish([item])

    def _parse_send(self, text: str) -> _Send:
        frame = parse_frame(text)
        context = frame.get("context")
        try:
            return self._build_send(frame, context)
        except FrameError as exc:
            raise _ContextFrameError(exc.result_code, str(exc), context) from None

    def _build_send(self, frame: dict[str, Any], context: Any) -> _Send:
        payload = frame.get("payload")
        if not isinstance(payload, str):
            raise FrameError(PAYLOAD_ENCODING_ERROR, "payload must be a base64 string")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise FrameError(PAYLOAD_ENCODING_ERROR, "payload is not valid base64") from None
        properties = frame.get("properties") or {}
        if not isinstance(properties, dict) or (properties and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in properties.items())):
            raise FrameError(JSON_DESERIALIZE_ERROR, "properties must be an object of strings")
        key = frame.get("key")
        if key is not None and not isinstance(key, str):
            raise FrameError(JSON_DESERIALIZE_ERROR, "key must be a string")
        message = Message(payload=data, key=key, properties=properties,
                          event_time_ms=parse_event_time_ms(frame.get("eventTime")))
        return _Send(context, message, self._deliver_at_ms(frame), self._sequence_id(frame))

    def _deliver_at_ms(self, frame: dict[str, Any]) -> int | None:
        deliver_at, deliver_after = frame.get("deliverAt"), frame.get("deliverAfterMs")
        if deliver_at is None and deliver_after is None:
            return None
        for name, value in (("deliverAt", deliver_at), ("deliverAfterMs", deliver_after)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise FrameError(JSON_DESERIALIZE_ERROR, f"{name} must be a non-negative integer")
        if deliver_at:
            return int(deliver_at)
        if deliver_after:
            return int(self.service.clock() * 1000) + int(deliver_after)
        return None

    def _sequence_id(self, frame: dict[str, Any]) -> int | None:
        value = frame.get("sequenceId")
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEQUENCE_ID_MAX:
                raise FrameError(JSON_DESERIALIZE_ERROR, f"sequenceId must be an integer in 0..{SEQUENCE_ID_MAX}")
            return value
        return next(self._sequence_ids) if self._sequence_ids is not None else None

    async def _publish_loop(self) -> None:
        """Take frames in order; with batching, frames already waiting join one entry."""
        carried: list[_Send | _Rejected | None] = []
        while True:
            first = carried.pop() if carried else await self._inbox.get()
            if first is None:
                break
            await self._wait_for_room()
            if isinstance(first, _Rejected):
                self._track(*self._outcome_of(first))
                continue
            group = [first]
            if self._batchable(first):
                target = self.service.route(self.topic, first.message.key, self.params.routing_mode)
                while len(group) < self.params.batch_messages_max and not self._inbox.empty():
                    candidate = self._inbox.get_nowait()
                    if isinstance(candidate, _Send) and self._batchable(candidate) and \
                            self.service.route(self.topic, candidate.message.key, self.params.routing_mode) == target:
                        group.append(candidate)
                    else:
                        carried.append(candidate)
                        break
            self._track([s.context for s in group], self._publish(group))

    def _batchable(self, send: _Send) -> bool:
        return self.params.batching and send.deliver_at_ms is None and send.sequence_id is None

    def _publish(self, group: list[_Send]) -> Future[PublishResult] | MagnetarError:
        try:
            future: Future[PublishResult] = self.service.publish_async(
                self.topic, [s.message for s in group], producer_name=self.params.producer_name,
                sequence_id=group[0].sequence_id, routing_mode=self.params.routing_mode,
                compression=self.params.compression, deliver_at_time_ms=group[0].deliver_at_ms)
        except MagnetarError as exc:
            return exc
        future.add_done_callback(self._finished.notify)
        return future

    async def _wait_for_room(self) -> None:
        """At most ``maxPendingMessages`` publishes unanswered, and as many results unwritten."""
        while len(self._pending) >= self.params.pending_messages_max:
            self._room.clear()
            await self._room.wait()
        await self._writer.room()

    def _track(self, contexts: list[Any], outcome: Outcome) -> None:
        self._pending.append((contexts, outcome))
        if len(self._pending) == 1 and (not isinstance(outcome, Future) or outcome.done()):
            self._send_results()

    def _send_results(self) -> None:
        """Answer every finished publish at the head of the queue, in order, in one write."""
        frames: list[str] = []
        while self._pending:
            contexts, outcome = self._pending[0]
            if isinstance(outcome, Future) and not outcome.done():
                break
            self._pending.popleft()
            try:
                frames += _outcome_frames(contexts, outcome)
            except Exception as exc:  # not the broker's refusal: a fault, reported as one
                log.exception("publish failed")
                frames += [_send_error(c, UNKNOWN_ERROR, "internal_error", str(exc)) for c in contexts]
        self._writer.send(frames)
        if len(self._pending) < self.params.pending_messages_max:
            self._room.set()
        if not self._pending:
            self._answered.set()


class _ContextFrameError(FrameError):
    def __init__(self, result_code: int, message: str, context: Any) -> None:
        super().__init__(result_code, message)
        self.context = context


Outcome = Future[PublishResult] | MagnetarError | FrameError
"""A publish's outcome: its future, the broker's refusal, or a frame that was never published."""


def _outcome_frames(contexts: list[Any], outcome: Outcome) -> list[str]:
    """The result frames of a finished publish (or of a refused one)."""
    if isinstance(outcome, FrameError):
        return [_send_error(c, outcome.result_code, InvalidRequest.code, str(outcome)) for c in contexts]
    if isinstance(outcome, MagnetarError):
        return [_send_error(c, UNKNOWN_ERROR, outcome.code, str(outcome)) for c in contexts]
    error = outcome.exception()
    if error is not None:
        if isinstance(error, MagnetarError):
            return [_send_error(c, UNKNOWN_ERROR, error.code, str(error)) for c in contexts]
        raise error
    result = outcome.result()
    if result.duplicate:  # Pulsar acknowledges a deduplicated send with id -1:-1
        dup = MessageId(-1, -1).to_base64()
        return [_frame_text({"result": "ok", "messageId": dup, "context": c, "duplicate": True}) for c in contexts]
    return [f'{{"result":"ok","messageId":"{mid.to_base64()}","context":{json.dumps(c)},"offset":{offset}}}'
            for c, mid, offset in zip(contexts, result.message_ids, result.offsets, strict=True)]


def _send_error(context: Any, result_code: int, error_code: str, message: str) -> str:
    return _frame_text({"result": f"send-error:{result_code}", "errorMsg": _short(f"{error_code}: {message}"),
                        "errorCode": error_code, "context": context})


# --- consumer ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConsumerParams:
    sub_type: SubscriptionType
    durable: bool
    initial: str
    receiver_queue_size: int
    pull_mode: bool
    config: ConsumerConfig

    @classmethod
    def parse(cls, query: QueryParams, limits: EdgeLimits) -> ConsumerParams:
        receiver_queue = query.integer("receiverQueueSize", RECEIVER_QUEUE_SIZE_MAX, 0, 2**31 - 1)
        receiver_queue = min(receiver_queue, RECEIVER_QUEUE_SIZE_MAX)  # Pulsar caps it at 1000
        config = ConsumerConfig(
            name=query.text("consumerName") or f"ws-consumer-{uuid.uuid4().hex[:12]}",
            receiver_queue_size=receiver_queue,
            priority_level=query.integer("priorityLevel", 0, 0, 2**31 - 1),
            ack_timeout_ms=query.integer("ackTimeoutMillis", 0, 0, 2**31 - 1),
            negative_ack_redelivery_delay_ms=query.integer("negativeAckRedeliveryDelay", 60_000, 0, 2**31 - 1),
            max_redeliver_count=query.integer("maxRedeliverCount", 0, 0, 2**31 - 1),
            dead_letter_topic=query.text("deadLetterTopic"),
            unacked_bytes_max=limits.consumer_unacked_bytes_max,
        )
        sub_type = SubscriptionType.parse(query.text("subscriptionType", "Exclusive") or "Exclusive")
        return cls(
            sub_type=sub_type,
            durable=query.choice("subscriptionMode", {"Durable": True, "NonDurable": False}, "Durable"),
            initial=query.choice("subscriptionInitialPosition", {"Latest": "latest", "Earliest": "earliest"},
                                 "Latest"),
            receiver_queue_size=receiver_queue,
            pull_mode=query.flag("pullMode", False),
            config=config,
        )


class _Credit:
    """Flow credit of a push session: keep ``limit`` messages granted-or-unacknowledged."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int, held: Callable[[], int],
                 permits: Callable[[], int], grant: Callable[[int], None]) -> None:
        self._loop = loop
        self._limit = limit
        self._held = held
        self._permits = permits
        self._grant = grant
        self._scheduled = False

    def top_up_soon(self) -> None:
        """Top up once the frames already received are handled (one flow per burst of acks)."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.top_up)

    def top_up(self) -> None:
        """Grant what is missing once half the credit is used (as Pulsar's clients refill their
        receiver queue at half): one flow, and one dispatch, per half queue instead of per ack;
        a consumer left without any permit is always topped up, so it never waits on credit."""
        self._scheduled = False
        missing = self._limit - self._held()
        if missing > 0 and (missing >= self._limit // 2 or self._permits() == 0):
            self._grant(missing)


class ConsumerSession:
    """Deliveries of a ``MultiConsumer`` out as frames; acks, nacks and commands in."""

    def __init__(self, websocket: WebSocket, service: BrokerService, consumer: MultiConsumer,
                 params: ConsumerParams, topics: list[TopicName], subscription: str) -> None:
        self.ws = websocket
        self.service = service
        self.consumer = consumer
        self.params = params
        self.topics = topics
        self.subscription = subscription
        self._consumer_closed = asyncio.Event()
        self._acks: dict[str, list[int]] = {}
        self._acks_scheduled = False
        self._names: dict[str, TopicName] = {}
        self._sent: OrderedDict[str, tuple[str, int]] = OrderedDict()
        loop = asyncio.get_running_loop()
        self._credit = _Credit(loop, params.receiver_queue_size, consumer.held_messages, consumer.available_permits,
                               consumer.flow)

        # deliveries leave inside the dispatch that made them, ahead of the publisher's result
        self._delivered = LoopSignal(loop, self._send_deliveries, direct_on_loop=True)
        self._writer = FrameWriter(websocket, DELIVERY_BACKLOG_FRAMES_MAX, on_drained=self._delivered.notify)
        consumer.listener = self._delivered.notify

    async def run(self) -> None:
        if not self.params.pull_mode:
            self._credit.top_up()
        self._delivered.notify()
        workers = [asyncio.create_task(self._close_when_consumer_closes())]
        if not self.params.pull_mode:
            workers.append(asyncio.create_task(self._credit_loop()))
        try:
            await _supervise(self.ws, self._receive_loop(), workers)
        finally:
            for worker in workers:
                worker.cancel()
            self._flush_acks()  # acks that arrived just before the client left still count
            self.consumer.close()

    def _send_deliveries(self) -> None:
        """Every delivery the consumer holds, in one write (runs on the loop when the consumer
        has news). While earlier frames still wait for the peer, deliveries stay with the
        consumer (its flow control holds them) until the writer has drained."""
        if self._writer.backlogged:
            return
        frames = []
        while (delivery := self.consumer.poll()) is not None:
            message_id = delivery.message_id.to_base64()
            self._remember(message_id, delivery.topic, delivery.offset)
            frames.append(message_frame(delivery, message_id))
        self._writer.send(frames)
        if self.consumer.closed:
            self._consumer_closed.set()

    async def _close_when_consumer_closes(self) -> None:
        await self._consumer_closed.wait()
        await self._writer.flush()
        await self.ws.close(1000, "the broker closed this consumer (subscription deleted)")

    async def _credit_loop(self) -> None:
        """Redelivery after an ack timeout frees credit without any frame arriving."""
        while True:
            await asyncio.sleep(CREDIT_CHECK_INTERVAL_S)
            self._credit.top_up()

    async def _receive_loop(self) -> None:
        await _command_loop(self.ws, self._handle, self._writer)

    async def _handle(self, frame: dict[str, Any]) -> bool:
        """Apply one client frame; True when the session is over (unsubscribed)."""
        kind = frame.get("type")
        if kind == "permit":
            self.consumer.flow(_permits(frame))
        elif kind == "isEndOfTopic":
            self._writer.send([_frame_text({"endOfTopic": self._end_of_topic()})])
        elif kind == "unsubscribe":
            self.consumer.close()
            for name in self.topics:
                for partition in self.service.expand_partitions(name):
                    self.service.unsubscribe(partition, self.subscription)
            await self._writer.flush()
            await self.ws.close(1000, "unsubscribed")
            return True
        elif kind == "negativeAcknowledge":
            topic, offset = self._locate(frame)
            self.consumer.nack(topic, [offset])
            self._credit_after_ack()
        else:  # Pulsar: a frame with no (or an unknown) type is an acknowledgement
            topic, offset = self._locate(frame)
            self._queue_ack(topic, offset)
        return False

    def _queue_ack(self, topic: str, offset: int) -> None:
        """Acks of one burst of frames reach the subscription together: one cursor update and
        one dispatch per burst, not per message."""
        self._acks.setdefault(topic, []).append(offset)
        if not self._acks_scheduled:
            self._acks_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._acks_scheduled = False
        acks, self._acks = self._acks, {}
        for topic, offsets in acks.items():
            try:
                self.consumer.ack(topic, offsets)
            except MagnetarError:
                log.exception("acknowledging %d messages of %s failed", len(offsets), topic)
        self._credit_after_ack()

    def _credit_after_ack(self) -> None:
        if not self.params.pull_mode:
            self._credit.top_up_soon()

    def _remember(self, message_id: str, topic: str, offset: int) -> None:
        """Where a sent message lives, so its ack needs no id parsing (bounded: the oldest go)."""
        self._sent[message_id] = (topic, offset)
        if len(self._sent) > SENT_IDS_REMEMBERED_MAX:
            self._sent.popitem(last=False)

    def _locate(self, frame: dict[str, Any]) -> tuple[str, int]:
        """The (partition topic, offset) of the message a frame's ``messageId`` names."""
        raw = frame.get("messageId")
        if not isinstance(raw, str):
            raise FrameError(JSON_DESERIALIZE_ERROR, "frame needs a messageId string")
        known = self._sent.pop(raw, None)
        if known is not None:
            return known
        message_id = MessageId.from_base64(raw)
        for topic_full_name in self.consumer.topics():
            name = self._names.get(topic_full_name) or self._names.setdefault(topic_full_name,
                                                                              TopicName.parse(topic_full_name))
            if name.partition_index == message_id.partition or \
                    (name.partition_index < 0 and message_id.partition < 0):
                consumer = self.consumer.consumer_for(topic_full_name)
                offset = consumer.offset_of(message_id)
                if offset is None:
                    offset = self.service.topic(name, create=False).offset_of(message_id)
                return topic_full_name, offset
        raise InvalidRequest(f"message id {raw} does not belong to this consumer's topics")

    def _end_of_topic(self) -> bool:
        for topic_full_name in self.consumer.topics():
            topic = self.service.topic(topic_full_name, create=False)
            if not topic.ml.terminated:
                return False
            consumer = self.consumer.consumer_for(topic_full_name)
            if consumer.subscription.cursor.backlog_messages() > 0:
                return False
        return True


async def _command_loop(websocket: WebSocket, handle: Callable[[dict[str, Any]], Awaitable[bool]],
                        writer: FrameWriter) -> None:
    """Consumer and reader sessions: apply each client frame with ``handle`` (True ends the
    session); a bad frame is answered with ``{"result": "error:<n>", "errorMsg"}`` (after the
    frames already on their way) and the session goes on."""
    while (text := await _receive_text(websocket)) is not None:
        try:
            if await handle(parse_frame(text)):
                return
        except FrameError as exc:
            writer.send([_frame_text({"result": f"error:{exc.result_code}", "errorMsg": _short(str(exc))})])
        except MagnetarError as exc:
            writer.send([_frame_text({"result": f"error:{UNKNOWN_ERROR}", "errorCode": exc.code,
                                      "errorMsg": _short(str(exc))})])


def _permits(frame: dict[str, Any]) -> int:
    permits = frame.get("permitMessages")
    if isinstance(permits, bool) or not isinstance(permits, int) or not 0 < permits <= PERMITS_PER_FRAME_MAX:
        raise FrameError(JSON_DESERIALIZE_ERROR, f"permitMessages must be an integer in 1..{PERMITS_PER_FRAME_MAX}")
    return permits


# --- reader --------------------------------------------------------------------------------------
class ReaderSession:
    """Readers (one per partition) from a start position; acks only free flow credit: at most
    ``receiverQueueSize`` messages and ``outstanding_bytes_max`` payload bytes (but always one
    message) are sent and not yet acknowledged."""

    def __init__(self, websocket: WebSocket, service: BrokerService, readers: list[Reader],
                 receiver_queue_size: int, outstanding_bytes_max: int) -> None:
        self.ws = websocket
        self.service = service
        self.readers = readers
        self._limit = max(receiver_queue_size, 1)
        self._bytes_limit = outstanding_bytes_max
        self._sent: OrderedDict[str, int] = OrderedDict()  # message id -> payload bytes, oldest first
        self._outstanding_bytes = 0
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._published = LoopWakeup(self._loop, self._wake)
        self._writer = FrameWriter(websocket, self._limit)
        self._listeners: list[tuple[Reader, Callable[[], None]]] = []

    def _notify(self) -> None:
        self._published.notify()

    async def run(self) -> None:
        for reader in self.readers:
            reader.topic.ml.add_listener(self._notify)
            self._listeners.append((reader, self._notify))
        sender = asyncio.create_task(self._send_loop())
        try:
            await _supervise(self.ws, self._receive_loop(), [sender])
        finally:
            sender.cancel()
            for reader, listener in self._listeners:
                reader.topic.ml.remove_listener(listener)

    async def _send_loop(self) -> None:
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while len(self._sent) < self._limit and self._outstanding_bytes < self._bytes_limit:
                room = self._limit - len(self._sent)
                batch = await asyncio.to_thread(self._read, min(room, READER_FILL_MESSAGES_MAX),
                                                self._bytes_limit - self._outstanding_bytes)
                if not batch:
                    break
                frames = []
                for delivery in batch:
                    message_id = delivery.message_id.to_base64()
                    self._sent[message_id] = len(delivery.message.payload)
                    self._outstanding_bytes += len(delivery.message.payload)
                    frames.append(message_frame(delivery, message_id))
                self._writer.send(frames)
                await self._writer.room()

    def _read(self, count: int, bytes_room: int) -> list[Delivery]:
        """Up to ``count`` messages within ``bytes_room`` payload bytes (at least one), taking
        turns over the partitions; a message that does not fit waits in its reader."""
        out: list[Delivery] = []
        size = 0
        progress = True
        while len(out) < count and progress:
            progress = False
            for reader in self.readers:
                delivery = reader.peek_next()
                if delivery is None:
                    continue
                if (out or self._sent) and size + len(delivery.message.payload) > bytes_room:
                    return out
                reader.read_next()
                out.append(delivery)
                size += len(delivery.message.payload)
                progress = True
                if len(out) >= count:
                    break
        return out

    async def _receive_loop(self) -> None:
        await _command_loop(self.ws, self._handle, self._writer)

    async def _handle(self, frame: dict[str, Any]) -> bool:
        if frame.get("type") == "isEndOfTopic":
            self._writer.send([_frame_text({"endOfTopic": self._end_of_topic()})])
            return False
        if not isinstance(frame.get("messageId"), str):
            raise FrameError(JSON_DESERIALIZE_ERROR, "an acknowledgement needs a messageId string")
        MessageId.from_base64(frame["messageId"])
        size = self._sent.pop(frame["messageId"], None)
        if size is None and self._sent:  # not an id it was sent: frees the oldest credit
            size = self._sent.popitem(last=False)[1]
        if size is not None:
            self._outstanding_bytes -= size
            self._wake.set()
        return False

    def _end_of_topic(self) -> bool:
        return all(r.topic.ml.terminated and not r.has_message_available() for r in self.readers)


def _reader_start(query: QueryParams) -> StartPosition:
    raw = query.text("messageId", "latest")
    assert raw is not None
    if raw.lower() == "earliest":
        return StartPosition.earliest()
    if raw.lower() == "latest":
        return StartPosition.latest()
    return StartPosition("message_id", message_id=MessageId.parse(raw), inclusive=False)


# --- routes --------------------------------------------------------------------------------------
def router(service: BrokerService, authorizer: Authorizer, limits: EdgeLimits) -> APIRouter:
    routes = APIRouter()
    sessions = SessionRegistry(authorizer)
    service.add_policy_listener(sessions.revalidate)

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
            await _deny(websocket, exc)
            return None
        return Admission(caller, tuple(checks))

    async def serve(websocket: WebSocket, admission: Admission, run: Callable[[], Awaitable[None]],
                    on_refused: Callable[[], None] | None = None) -> None:
        """Run an admitted session; it ends early if its caller loses a permission it needs."""
        session_id = sessions.opened(admission, websocket)
        try:
            await _serve(websocket, run, on_refused)
        finally:
            sessions.ended(session_id)

    _document_websocket_paths(routes)

    @routes.websocket("/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}")
    async def producer(websocket: WebSocket, tenant: str, namespace: str, topic: str) -> None:
        try:
            name = TopicName.of(tenant, namespace, topic)
            params = ProducerParams.parse(QueryParams(websocket.query_params))
        except MagnetarError as exc:
            await _deny(websocket, exc)
            return
        admission = await admit(websocket, Action.PRODUCE, [name])
        if admission is None:
            return
        try:
            for partition in service.expand_partitions(name):
                service.topic(partition)
        except MagnetarError as exc:
            await _deny(websocket, exc)
            return
        await serve(websocket, admission, ProducerSession(websocket, service, name, params).run)

    async def consume(websocket: WebSocket, topics: list[TopicName], subscription: str,
                      pattern: tuple[str, str] | None = None) -> None:
        try:
            params = ConsumerParams.parse(QueryParams(websocket.query_params), limits)
        except MagnetarError as exc:
            await _deny(websocket, exc)
            return
        admission = await admit(websocket, Action.CONSUME, topics, params.config.dead_letter_topic)
        if admission is None:
            return
        try:
            if pattern is not None:
                consumer = service.subscribe_pattern(pattern[0], pattern[1], subscription, params.sub_type,
                                                     params.config, initial=params.initial,
                                                     pattern_bytes_max=limits.topics_pattern_bytes_max)
            else:
                consumer = service.subscribe_many([t.full_name for t in topics], subscription, params.sub_type,
                                                  params.config, initial=params.initial, durable=params.durable)
        except MagnetarError as exc:
            await _deny(websocket, exc)
            return
        session = ConsumerSession(websocket, service, consumer, params, topics, subscription)
        await serve(websocket, admission, session.run, on_refused=consumer.close)

    @routes.websocket("/ws/v2/consumer/persistent/{tenant}/{namespace}/{topic}/{subscription}")
    async def consumer(websocket: WebSocket, tenant: str, namespace: str, topic: str, subscription: str) -> None:
        try:
            name = TopicName.of(tenant, namespace, topic)
            _check_subscription_name(subscription)
        except MagnetarError as exc:
            await _deny(websocket, exc)
            return
        await consume(websocket, [name], subscription)

    @routes.websocket("/ws/v3/consumer/{subscription}")
    async def multi_topic_consumer(websocket: WebSocket, subscription: str) -> None:
        query = QueryParams(websocket.query_params)
        try:
            _check_subscription_name(subscription)
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
            await _deny(websocket, exc)
            return
        await consume(websocket, names, subscription, target)

    @routes.websocket("/ws/v2/reader/persistent/{tenant}/{namespace}/{topic}")
    async def reader(websocket: WebSocket, tenant: str, namespace: str, topic: str) -> None:
        query = QueryParams(websocket.query_params)
        try:
            name = TopicName.of(tenant, namespace, topic)
            receiver_queue = min(query.integer("receiverQueueSize", RECEIVER_QUEUE_SIZE_MAX, 1, 2**31 - 1),
                                 RECEIVER_QUEUE_SIZE_MAX)
            start = _reader_start(query)
            compacted = query.flag("readCompacted", False)
        except MagnetarError as exc:
            await _deny(websocket, exc)
            return
        admission = await admit(websocket, Action.CONSUME, [name])
        if admission is None:
            return
        try:
            readers = [service.reader(p, start, compacted=compacted) for p in service.expand_partitions(name)]
        except MagnetarError as exc:
            await _deny(websocket, exc)
            return
        session = ReaderSession(websocket, service, readers, receiver_queue, limits.consumer_unacked_bytes_max)
        await serve(websocket, admission, session.run)

    return routes


_WS_DOCS = {
    "/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}": (
        "WebSocket producer (Pulsar WebSocket API v2)",
        "Connect with a WebSocket client. Query parameters: producerName, initialSequenceId, batchingEnabled, "
        "batchingMaxMessages, maxPendingMessages, messageRoutingMode, compressionType, token. Send "
        "`{payload (base64), properties, context, key, eventTime, deliverAt, deliverAfterMs, sequenceId}`; "
        "each frame is answered `{result: \"ok\", messageId, context, offset}` or "
        "`{result: \"send-error:<n>\", errorMsg, errorCode, context}`."),
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
        "key up to the last compaction, then the rest of the topic), token. Messages arrive like the "
        "consumer's; acknowledgements only free flow-control credit; `{type: \"isEndOfTopic\"}` is answered."),
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


async def _supervise(websocket: WebSocket, receive: Coroutine[Any, Any, None],
                     workers: list[asyncio.Task[None]]) -> bool:
    """Run a session's receive loop beside its worker tasks. True when the client left (or the
    session ended normally); a worker that fails closes the socket with 1011 and its reason
    instead of leaving the client waiting on a stalled session."""
    receiver = asyncio.create_task(receive)
    done, _ = await asyncio.wait([receiver, *workers], return_when=asyncio.FIRST_COMPLETED)
    if receiver in done:
        receiver.result()
        return True
    receiver.cancel()
    failed = next(task for task in done)
    error = failed.exception()
    if error is None or isinstance(error, WebSocketDisconnect):
        return False
    log.error("WebSocket session failed", exc_info=error)
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await websocket.close(1011, _short(f"{getattr(error, 'code', 'internal_error')}: {error}")[:120])
    return False


def _check_subscription_name(name: str) -> None:
    TopicName.of("t", "ns", name)  # same character rules as a topic's local name


async def _serve(websocket: WebSocket, run: Callable[[], Awaitable[None]],
                 on_refused: Callable[[], None] | None = None) -> None:
    try:
        await websocket.accept()
    except (WebSocketDisconnect, RuntimeError):
        if on_refused is not None:
            on_refused()
        return
    try:
        await run()
    except WebSocketDisconnect:
        pass
    finally:
        if websocket.application_state is not WebSocketState.DISCONNECTED and \
                websocket.client_state is not WebSocketState.DISCONNECTED:
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await websocket.close()
