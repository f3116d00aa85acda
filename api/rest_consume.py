"""REST consumers: pull, acknowledge and negatively acknowledge a subscription over plain HTTP.

Magnetar extension (Pulsar has no REST consume), shaped like Pulsar's REST paths::

    POST /topics/persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}/pull
    POST /topics/persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}/ack
    POST /topics/persistent/{tenant}/{namespace}/{topic}/subscription/{subscription}/negativeAcknowledge

and the same under ``.../{topic}/partitions/{n}/subscription/...``. A pull answers ``{"messages":
[{messageId, offset, payload, key, properties, publishTime, eventTime, redeliveryCount,
encryptionContext (an end-to-end encrypted entry, delivered whole: see ``broker/delivery.py``)}]}`` with
message ids in the WebSocket API's form (base64 ``MessageIdData``), payloads in base64 and times
in ISO-8601 (UTC). Ack and negative ack take ``{"messageIds": [...]}`` and/or ``{"offsets": [...]}``.

Mapping onto the broker: a REST consumer is one broker ``Consumer`` per (topic partition,
subscription), created by the first pull (which also creates the durable subscription at
``subscriptionInitialPosition``, Latest by default, as in Pulsar), kept in a bounded registry,
and closed once it has been idle
longer than ``REST_CONSUMER_IDLE_MS`` (or its ack timeout, if longer): closing hands its
unacknowledged messages back for redelivery. Delivery, ack timeouts, negative acks, redelivery
counts and dead-lettering are the subscription's own machinery (``broker/subscription.py``,
``broker/redelivery.py``).

Invariants:
- Concurrent pulls share the one consumer and take from its outbox with ``Consumer.take_head``
  (the messages of the oldest run that fit, split into messages here), which takes under the
  subscription's lock only if that run is still the oldest, so no message is handed to two
  pulls; on Shared and Key_Shared subscriptions the subscription's other consumers (e.g.
  WebSocket ones) get their share through the dispatcher as usual.
- A pull tops the consumer's permits up to what the pulls in progress still want. Permits
  cannot be withdrawn, so a pull that returns with fewer messages than it asked for leaves
  permits behind (at most ``PULLS_IN_FLIGHT_MAX`` x ``PULL_MESSAGES_MAX``); messages they
  bring are held for the next pull, which serves them first. Their ack timer started when
  they were dispatched, not when a pull hands them out.
- A consumer closed under the registry (e.g. its subscription was deleted by force) is
  replaced by the next pull.
- An outbox message no longer held by the consumer (its ack timeout fired and it went back for
  redelivery) is never handed out: only one the consumer still holds (``Consumer.holds``) is.
- An ack answers after the cursor has persisted it, so a restarted broker does not redeliver
  it. Every id is checked before anything is acknowledged: an id that names no message of this
  topic (or a malformed one) is a 400 and nothing is acknowledged.
- Every pull, wait, batch and registry is bounded by a named limit below.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.auth import Action, Authorizer, Caller, Principal
from api.errors import TooManyConnections
from api.limits import (
    ACK_IDS_PER_REQUEST_MAX,
    ACK_TIMEOUT_MS_DEFAULT,
    ACK_TIMEOUT_MS_MAX,
    ACK_TIMEOUT_MS_MIN,
    NEGATIVE_ACK_DELAY_MS_DEFAULT,
    NEGATIVE_ACK_DELAY_MS_MAX,
    PULL_MESSAGES_DEFAULT,
    PULL_MESSAGES_MAX,
    PULL_WAIT_MS_MAX,
    PULLS_IN_FLIGHT_MAX,
    REDELIVER_COUNT_MAX,
    REST_CONSUMER_IDLE_MS,
    REST_CONSUMER_SWEEP_INTERVAL_MS,
    EdgeLimits,
)
from api.wakeup import LoopWakeup
from broker import (
    BrokerService,
    Consumer,
    ConsumerBusy,
    ConsumerConfig,
    Delivery,
    InvalidRequest,
    MagnetarError,
    MessageId,
    SubscriptionType,
    TopicName,
    check_subscription_name,
    iso_time,
)

log = logging.getLogger(__name__)


# --- request shapes ------------------------------------------------------------------------------
class PullParams(BaseModel):
    """Query parameters of a pull; the consumer settings apply when the REST consumer is made."""

    max_messages: int = Field(PULL_MESSAGES_DEFAULT, ge=1, le=PULL_MESSAGES_MAX, alias="maxMessages")
    wait_time_ms: int = Field(0, ge=0, le=PULL_WAIT_MS_MAX, alias="waitTimeMs")
    subscription_type: str | None = Field(None, alias="subscriptionType")
    initial_position: str = Field("Latest", alias="subscriptionInitialPosition")
    ack_timeout_ms: int | None = Field(None, ge=ACK_TIMEOUT_MS_MIN, le=ACK_TIMEOUT_MS_MAX, alias="ackTimeoutMillis")
    negative_ack_delay_ms: int | None = Field(None, ge=0, le=NEGATIVE_ACK_DELAY_MS_MAX,
                                              alias="negativeAckRedeliveryDelay")
    max_redeliver_count: int | None = Field(None, ge=0, le=REDELIVER_COUNT_MAX, alias="maxRedeliverCount")
    dead_letter_topic: str | None = Field(None, alias="deadLetterTopic")


class AckRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    messageIds: list[str] = Field(default_factory=list, max_length=ACK_IDS_PER_REQUEST_MAX)  # noqa: N815
    offsets: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=ACK_IDS_PER_REQUEST_MAX)


@dataclass(frozen=True)
class ConsumerSettings:
    """What a pull asked for explicitly (None: whatever the running consumer has, else the default)."""

    subscription_type: SubscriptionType | None
    ack_timeout_ms: int | None
    negative_ack_delay_ms: int | None
    max_redeliver_count: int | None
    dead_letter_topic: str | None

    @classmethod
    def of(cls, params: PullParams) -> ConsumerSettings:
        sub_type = SubscriptionType.parse(params.subscription_type) if params.subscription_type else None
        dead_letter = TopicName.parse(params.dead_letter_topic).full_name if params.dead_letter_topic else None
        return cls(sub_type, params.ack_timeout_ms, params.negative_ack_delay_ms, params.max_redeliver_count,
                   dead_letter)

    def consumer_config(self, subscription: str, unacked_bytes_max: int) -> ConsumerConfig:
        return ConsumerConfig(
            name=f"rest-{subscription}", receiver_queue_size=0, unacked_bytes_max=unacked_bytes_max,
            ack_timeout_ms=self.ack_timeout_ms if self.ack_timeout_ms is not None else ACK_TIMEOUT_MS_DEFAULT,
            negative_ack_redelivery_delay_ms=self.negative_ack_delay_ms
            if self.negative_ack_delay_ms is not None else NEGATIVE_ACK_DELAY_MS_DEFAULT,
            max_redeliver_count=self.max_redeliver_count or 0, dead_letter_topic=self.dead_letter_topic)

    def conflicts(self, running: Consumer) -> list[str]:
        """The explicitly requested settings that differ from the running consumer's."""
        config, problems = running.config, []
        pairs: list[tuple[str, object, object]] = [
            ("subscriptionType", self.subscription_type, running.subscription.type),
            ("ackTimeoutMillis", self.ack_timeout_ms, config.ack_timeout_ms),
            ("negativeAckRedeliveryDelay", self.negative_ack_delay_ms, config.negative_ack_redelivery_delay_ms),
            ("maxRedeliverCount", self.max_redeliver_count, config.max_redeliver_count),
            ("deadLetterTopic", self.dead_letter_topic, config.dead_letter_topic)]
        for label, asked, actual in pairs:
            if asked is not None and asked != actual:
                problems.append(f"{label}={actual}")
        return problems


def _initial_position(value: str) -> str:
    lowered = value.lower()
    if lowered not in ("earliest", "latest"):
        raise InvalidRequest(f"subscriptionInitialPosition must be Earliest or Latest, not {value!r}")
    return lowered


# --- the REST consumer and its registry --------------------------------------------------------------
class RestConsumer:
    """One broker consumer serving the pulls of one (topic partition, subscription)."""

    def __init__(self, topic: TopicName, subscription: str, consumer: Consumer, now_s: float, role: str) -> None:
        self.topic = topic
        self.subscription = subscription
        self.role = role
        self.consumer = consumer
        self.last_used_s = now_s
        self.pulls = 0
        self._wanted = 0
        self._lock = threading.Lock()
        self._wakers: set[Callable[[], None]] = set()
        consumer.listener = self._notify

    @property
    def idle_s_max(self) -> float:
        return max(REST_CONSUMER_IDLE_MS, self.consumer.config.ack_timeout_ms) / 1000.0

    def _notify(self) -> None:
        """Called by the dispatcher (any thread) when deliveries reach the outbox."""
        with self._lock:
            wakers = list(self._wakers)
        for wake in wakers:
            wake()

    def add_waker(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wakers.add(wake)

    def remove_waker(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wakers.discard(wake)

    def want(self, messages: int) -> None:
        with self._lock:
            self._wanted += messages

    def take(self, messages_max: int, bytes_max: int) -> list[Delivery]:
        """Up to ``messages_max`` messages of at most ``bytes_max`` payload bytes in all (at
        least one): what is waiting, then what new permits bring. What does not fit stays in
        the outbox for the next pull."""
        taken = self._drain(messages_max, bytes_max)
        taken_bytes = sum(len(d.message.payload) for d in taken)
        if len(taken) < messages_max and taken_bytes < bytes_max:
            with self._lock:
                missing = self._wanted - self.consumer.permits - self.consumer.outbox_messages
            if missing > 0:
                self.consumer.flow(missing)  # dispatches synchronously what is already stored
            taken += self._drain(messages_max - len(taken), bytes_max - taken_bytes, taken_any=bool(taken))
        return taken

    def _drain(self, messages_max: int, bytes_max: int, *, taken_any: bool = False) -> list[Delivery]:
        """Messages of the runs in the outbox, each run split into its messages here: as many as
        fit, taken with ``Consumer.take_head`` (the rest of a run stays in the outbox)."""
        taken: list[Delivery] = []
        size = 0
        while len(taken) < messages_max:
            run = self.consumer.peek()
            if run is None:
                break
            messages = run.messages()
            fit = fit_bytes = fit_offsets = 0
            for delivery in messages[: messages_max - len(taken)]:
                payload_bytes = len(delivery.message.payload)
                if (taken or taken_any or fit) and size + fit_bytes + payload_bytes > bytes_max:
                    break
                fit += 1
                fit_bytes += payload_bytes
                fit_offsets += len(delivery.offsets)  # an encrypted entry's message carries its run
            if not fit:
                break  # left in the outbox for the next pull
            if self.consumer.take_head(run, fit_offsets) is None:
                continue  # another pull took it first: look again
            for delivery in messages[:fit]:
                if self.consumer.holds(delivery):  # else timed out and requeued
                    taken.append(delivery)
                    size += len(delivery.message.payload)
        with self._lock:
            self._wanted -= len(taken)
        return taken


class RestConsumers:
    """The bounded registry of REST consumers, keyed by (topic partition, subscription)."""

    def __init__(self, service: BrokerService, limits: EdgeLimits) -> None:
        self._service = service
        self._limits = limits
        self._consumers: dict[tuple[TopicName, str], RestConsumer] = {}
        self._per_role: dict[str, int] = {}
        self._per_namespace: dict[str, int] = {}
        self._lock = threading.Lock()

    def _now_s(self) -> float:
        return self._service.clock()

    def begin_pull(self, topic: TopicName, subscription: str, settings: ConsumerSettings, initial: str,
                   messages_max: int, role: str) -> RestConsumer:
        """The REST consumer for a pull of up to ``messages_max`` (made on first use, counted
        against ``role``, the caller who made it, and the topic's namespace)."""
        with self._lock:
            rest = self._consumers.get((topic, subscription))
            if rest is not None and rest.consumer.closed and rest.pulls == 0:
                self._forget((topic, subscription))
                rest = None
            if rest is None:
                rest = self._create(topic, subscription, settings, initial, role)
            conflicts = settings.conflicts(rest.consumer)
            if conflicts:
                raise ConsumerBusy(f"subscription {subscription} of {topic} is pulled with {', '.join(conflicts)}; "
                                   "omit those parameters or wait until its REST consumer closes after idling")
            if rest.pulls >= PULLS_IN_FLIGHT_MAX:
                raise ConsumerBusy(f"{PULLS_IN_FLIGHT_MAX} pulls on subscription {subscription} are already waiting")
            rest.pulls += 1
            rest.want(messages_max)
            rest.last_used_s = self._now_s()
            return rest

    def end_pull(self, rest: RestConsumer, unmet: int) -> None:
        with self._lock:
            rest.pulls -= 1
            rest.want(-unmet)
            rest.last_used_s = self._now_s()
            last = rest.pulls == 0
        if last:  # nobody is waiting: permits left over must not start ack timers for later messages
            rest.consumer.withdraw()

    def _create(self, topic: TopicName, subscription: str, settings: ConsumerSettings, initial: str,
                role: str) -> RestConsumer:
        namespace = topic.namespace_name
        idle = f"; idle ones close after {REST_CONSUMER_IDLE_MS // 1000} s"
        if len(self._consumers) >= self._limits.rest_consumers_max:
            raise TooManyConnections(f"{self._limits.rest_consumers_max} REST consumers are open{idle}")
        if self._per_role.get(role, 0) >= self._limits.rest_consumers_per_role_max:
            raise TooManyConnections(f"role {role!r} has {self._limits.rest_consumers_per_role_max} REST "
                                     f"consumers open{idle}")
        if self._per_namespace.get(namespace, 0) >= self._limits.rest_consumers_per_namespace_max:
            raise TooManyConnections(f"namespace {namespace} has {self._limits.rest_consumers_per_namespace_max} "
                                     f"REST consumers open{idle}")
        sub_type = settings.subscription_type or self._current_type(topic, subscription) or SubscriptionType.EXCLUSIVE
        config = settings.consumer_config(subscription, self._limits.consumer_unacked_bytes_max)
        consumer = self._service.subscriptions.subscribe(topic, subscription, sub_type, config, initial=initial)
        rest = RestConsumer(topic, subscription, consumer, self._now_s(), role)
        self._consumers[(topic, subscription)] = rest
        self._per_role[role] = self._per_role.get(role, 0) + 1
        self._per_namespace[namespace] = self._per_namespace.get(namespace, 0) + 1
        return rest

    def _forget(self, key: tuple[TopicName, str]) -> RestConsumer:
        """Drop a REST consumer from the registry and its counts (lock held)."""
        rest = self._consumers.pop(key)
        for counts, name in ((self._per_role, rest.role), (self._per_namespace, rest.topic.namespace_name)):
            counts[name] -= 1
            if not counts[name]:
                del counts[name]
        return rest

    def _current_type(self, topic: TopicName, subscription: str) -> SubscriptionType | None:
        """The type of the subscription if the broker has it active (a pull that names no type joins it)."""
        return next((s.type for s in self._service.subscriptions.of(topic) if s.name == subscription), None)

    def get(self, topic: TopicName, subscription: str) -> RestConsumer | None:
        with self._lock:
            rest = self._consumers.get((topic, subscription))
            if rest is not None:
                rest.last_used_s = self._now_s()
            return rest

    def __len__(self) -> int:
        return len(self._consumers)

    def sweep(self) -> int:
        """Close the REST consumers idle for longer than they may be; return how many."""
        now = self._now_s()
        with self._lock:
            idle = [key for key, rest in self._consumers.items()
                    if rest.pulls == 0 and now - rest.last_used_s >= rest.idle_s_max]
            closing = [self._forget(key) for key in idle]
        for rest in closing:
            rest.consumer.close()
        return len(closing)

    def close(self) -> None:
        with self._lock:
            closing = list(self._consumers.values())
            self._consumers.clear()
            self._per_role.clear()
            self._per_namespace.clear()
        for rest in closing:
            rest.consumer.close()


# --- rendering ----------------------------------------------------------------------------------------
def message_json(delivery: Delivery) -> dict[str, Any]:
    message = delivery.message
    return {"messageId": delivery.message_id.to_base64(), "offset": delivery.offset,
            "payload": base64.b64encode(message.payload).decode("ascii"), "key": message.key,
            "properties": message.properties, "publishTime": iso_time(delivery.publish_time_ms),
            "eventTime": iso_time(message.event_time_ms) if message.event_time_ms is not None else None,
            "redeliveryCount": delivery.redelivery_count,
            **({} if delivery.encryption is None else {"encryptionContext": delivery.encryption.as_json()})}


# --- routes ------------------------------------------------------------------------------------------
TOPIC_PATH = "/topics/persistent/{tenant}/{namespace}/{topic}"
PARTITION_PATH = TOPIC_PATH + "/partitions/{partition}"


def router(service: BrokerService, authorizer: Authorizer, limits: EdgeLimits) -> APIRouter:
    registry = RestConsumers(service, limits)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_sweep_forever(registry))
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await run_in_threadpool(registry.close)

    routes = APIRouter(tags=["consume"], lifespan=lifespan)

    def topic_of(caller: Principal, tenant: str, namespace: str, topic: str, partition: int | None) -> TopicName:
        name = TopicName.of(tenant, namespace, topic)
        authorizer.require(caller, Action.CONSUME, name)
        if partition is not None:
            return service.admin.partition_of(name, partition)
        partitions = service.topics.partitions(name)
        if partitions and name.partition_index < 0:
            raise InvalidRequest(f"{name} is a partitioned topic with {partitions} partitions; "
                                 "use .../partitions/{n}/subscription/...")
        return name

    def begin_pull(caller: Principal, where: tuple[str, str, str, int | None], subscription: str,
                   params: PullParams) -> RestConsumer:
        name = topic_of(caller, *where)
        check_subscription_name(subscription)
        settings = ConsumerSettings.of(params)
        if settings.dead_letter_topic is not None:  # the broker writes there on the caller's behalf
            authorizer.require(caller, Action.PRODUCE, TopicName.parse(settings.dead_letter_topic))
        initial = _initial_position(params.initial_position)
        return registry.begin_pull(name, subscription, settings, initial, params.max_messages, caller.role)

    async def pull(caller: Principal, where: tuple[str, str, str, int | None], subscription: str,
                   params: PullParams) -> dict[str, Any]:
        rest = await run_in_threadpool(begin_pull, caller, where, subscription, params)
        taken: list[Delivery] = []
        try:
            taken = await _take_waiting(rest, params.max_messages, limits.pull_response_bytes_max,
                                        params.wait_time_ms)
        finally:
            registry.end_pull(rest, params.max_messages - len(taken))
        return {"messages": [message_json(d) for d in taken]}

    def target(caller: Principal, where: tuple[str, str, str, int | None], subscription: str,
               request: AckRequest) -> tuple[TopicName, list[int], Consumer | None]:
        """The topic, the offsets the request names (all checked) and the REST consumer's
        broker consumer, if it is open."""
        name = topic_of(caller, *where)
        service.admin.cursor(name, subscription)  # NotFound for an unknown subscription
        if not request.messageIds and not request.offsets:
            raise InvalidRequest("give the messages to acknowledge as messageIds and/or offsets")
        rest = registry.get(name, subscription)
        holder = rest.consumer if rest is not None else None
        ids = [(text, MessageId.parse(text)) for text in request.messageIds]
        return name, service.admin.acknowledgeable(name, ids, request.offsets, holder), holder

    def acknowledge(caller: Principal, where: tuple[str, str, str, int | None], subscription: str,
                    request: AckRequest) -> dict[str, Any]:
        name, offsets, holder = target(caller, where, subscription, request)
        held = {offset for offset in offsets if holder is not None and offset in holder.unacked}
        if holder is not None and held:
            holder.ack(sorted(held))  # releases them from the REST consumer and acks the cursor
        # what this REST consumer did not hand out (e.g. it idled out) is acked on the cursor directly;
        # either way the answer waits until the acks are persisted
        service.admin.acknowledge(name, subscription, [offset for offset in offsets if offset not in held])
        return {"acknowledged": len(offsets)}

    def negative_acknowledge(caller: Principal, where: tuple[str, str, str, int | None], subscription: str,
                             request: AckRequest) -> dict[str, Any]:
        _, offsets, holder = target(caller, where, subscription, request)
        held = [offset for offset in offsets if holder is not None and offset in holder.unacked]
        if holder is not None and held:
            holder.nack(held)
        return {"negativelyAcknowledged": len(held)}

    pull_summary = "Pull messages from a subscription (Magnetar extension)"
    ack_summary = "Acknowledge pulled messages, durably (Magnetar extension)"
    nack_summary = "Negatively acknowledge pulled messages: redeliver them after the delay (Magnetar extension)"

    @routes.post(TOPIC_PATH + "/subscription/{subscription}/pull", summary=pull_summary)
    async def pull_topic(tenant: str, namespace: str, topic: str, subscription: str, caller: Caller,
                         params: Annotated[PullParams, Query()]) -> dict[str, Any]:
        return await pull(caller, (tenant, namespace, topic, None), subscription, params)

    @routes.post(PARTITION_PATH + "/subscription/{subscription}/pull", summary=pull_summary + ", one partition")
    async def pull_partition(tenant: str, namespace: str, topic: str, partition: int, subscription: str,
                             caller: Caller, params: Annotated[PullParams, Query()]) -> dict[str, Any]:
        return await pull(caller, (tenant, namespace, topic, partition), subscription, params)

    @routes.post(TOPIC_PATH + "/subscription/{subscription}/ack", summary=ack_summary)
    def ack_topic(tenant: str, namespace: str, topic: str, subscription: str, request: AckRequest,
                  caller: Caller) -> dict[str, Any]:
        return acknowledge(caller, (tenant, namespace, topic, None), subscription, request)

    @routes.post(PARTITION_PATH + "/subscription/{subscription}/ack", summary=ack_summary + ", one partition")
    def ack_partition(tenant: str, namespace: str, topic: str, partition: int, subscription: str,
                      request: AckRequest, caller: Caller) -> dict[str, Any]:
        return acknowledge(caller, (tenant, namespace, topic, partition), subscription, request)

    @routes.post(TOPIC_PATH + "/subscription/{subscription}/negativeAcknowledge", summary=nack_summary)
    def nack_topic(tenant: str, namespace: str, topic: str, subscription: str, request: AckRequest,
                   caller: Caller) -> dict[str, Any]:
        return negative_acknowledge(caller, (tenant, namespace, topic, None), subscription, request)

    @routes.post(PARTITION_PATH + "/subscription/{subscription}/negativeAcknowledge",
                 summary=nack_summary + ", one partition")
    def nack_partition(tenant: str, namespace: str, topic: str, partition: int, subscription: str,
                       request: AckRequest, caller: Caller) -> dict[str, Any]:
        return negative_acknowledge(caller, (tenant, namespace, topic, partition), subscription, request)

    return routes


async def _take_waiting(rest: RestConsumer, messages_max: int, bytes_max: int, wait_time_ms: int) -> list[Delivery]:
    """Take what is there; if nothing, wait (up to ``wait_time_ms``) for the first delivery."""
    loop = asyncio.get_running_loop()
    woken = LoopWakeup(loop)
    rest.add_waker(woken.notify)
    deadline = loop.time() + wait_time_ms / 1000.0
    taken: list[Delivery] = []
    try:
        while True:
            woken.event.clear()
            taken += await run_in_threadpool(rest.take, messages_max - len(taken), bytes_max)
            remaining = deadline - loop.time()
            if taken or remaining <= 0:
                return taken
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.event.wait(), remaining)
    finally:
        rest.remove_waker(woken.notify)


async def _sweep_forever(registry: RestConsumers) -> None:
    while True:
        await asyncio.sleep(REST_CONSUMER_SWEEP_INTERVAL_MS / 1000.0)
        try:
            await run_in_threadpool(registry.sweep)
        except MagnetarError:
            log.exception("closing idle REST consumers failed")
