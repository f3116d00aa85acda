"""Quotas and rate limits of topics: how many producers, consumers and subscriptions a topic may
have, how many topics a namespace may hold, and how fast a topic is published to and dispatched from.

Role: every limit is resolved once per topic partition, the topic's own policy first (``broker/
topic_policies.py``: ``maxProducers``, ``maxConsumers``, ``maxSubscriptionsPerTopic``,
``publishRate``, ``dispatchRate``), then its namespace's (``max_producers_per_topic``,
``max_consumers_per_topic``, ``max_subscriptions_per_topic``, ``publishMaxMessageRate``,
``topicDispatchRate``), then the broker's default (``QuotaDefaults``, the standalone.conf keys
of Pulsar's broker.conf in ``CONFIG_KEYS``); 0 (or a rate of -1 or 0) means unlimited, as in
Pulsar. Each ``PersistentTopic`` holds one ``TopicQuotas`` with the resolved limits, its counts
of producers and consumers, and its two rate limiters; the broker core takes a slot or consumes
tokens there, so every transport meets the same limits:

- a producer beyond the limit is refused with ``ProducerBusy`` ("Topic reached max producers
  limit"), a consumer with ``ConsumerBusy`` ("Topic reached max consumers limit"), a new
  subscription or a new topic with ``QuotaExceeded`` (Pulsar's NotAllowed / 412);
- publishing beyond the publish rate is not refused: the topic's ``publish_delay_s`` tells the
  transport how long to stop reading from the producer (Pulsar pauses the connection's reads);
- dispatching beyond the dispatch rate waits: a subscription delivers while the topic's
  dispatch limiter has tokens and asks again once it will have (``delay_s``).

``RateLimiter`` is a token bucket per unit (messages and bytes) holding at most one period's
worth (``ratePeriodInSecond``), filled continuously from the injected clock; consuming is O(1)
and may drive the tokens below zero (a large entry is never split), which later waits repay.

Invariants: a count never exceeds its limit through this module (taking a slot checks and counts
under one lock); a slot is given back once for each taken; a limit lowered below the current
count refuses new comers and leaves the present ones connected, as Pulsar does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.errors import ConsumerBusy, InvalidRequest, ProducerBusy, QuotaExceeded
from broker.limits import (
    QUOTA_COUNT_MAX,
    QUOTA_RATE_BYTES_MAX,
    QUOTA_RATE_MESSAGES_MAX,
    QUOTA_RATE_PERIOD_S_MAX,
)

UNLIMITED_RATE = -1


@dataclass(frozen=True)
class PublishRate:
    """Pulsar's ``PublishRate``: messages and bytes per second a topic accepts (-1 or 0: unlimited)."""

    messages: int = UNLIMITED_RATE
    size_bytes: int = UNLIMITED_RATE

    @property
    def limited(self) -> bool:
        return self.messages > 0 or self.size_bytes > 0

    def to_policy(self) -> dict[str, int]:
        return {"publishThrottlingRateInMsg": self.messages, "publishThrottlingRateInByte": self.size_bytes}


@dataclass(frozen=True)
class DispatchRate:
    """Pulsar's ``DispatchRate``: messages and bytes a topic dispatches per ``period_s`` (-1 or 0:
    unlimited); ``relative_to_publish_rate`` adds the topic's current publish rate to both."""

    messages: int = UNLIMITED_RATE
    size_bytes: int = UNLIMITED_RATE
    period_s: int = 1
    relative_to_publish_rate: bool = False

    @property
    def limited(self) -> bool:
        return self.messages > 0 or self.size_bytes > 0

    def to_policy(self) -> dict[str, Any]:
        return {"dispatchThrottlingRateInMsg": self.messages, "dispatchThrottlingRateInByte": self.size_bytes,
                "ratePeriodInSecond": self.period_s, "relativeToPublishRate": self.relative_to_publish_rate}


# --- policy values: the checks broker/namespace/policies.py and broker/namespace/topic_policies.py apply ---
def _integer(name: str, value: Any, low: int, high: int, bound: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be {bound}, not {value!r}", field=name)
    return value


def count_limit(name: str) -> Callable[[Any], int | None]:
    """The check of a count policy ``name``: null (not set) or 0..2^31-1 (0: unlimited)."""
    def check(value: Any) -> int | None:
        if value is None:
            return None
        return _integer(name, value, 0, QUOTA_COUNT_MAX, f"0..{QUOTA_COUNT_MAX} (0: unlimited)")
    return check


def _object(name: str, value: Any, fields: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{name} must be an object with {', '.join(sorted(fields))}", field=name)
    unknown = sorted(set(value) - fields)
    if unknown:
        raise InvalidRequest(f"{name} has unknown fields {unknown}; known: {sorted(fields)}", field=name)
    return value


def publish_rate_of(value: Any) -> PublishRate:
    """A ``PublishRate`` body as Pulsar's admin API takes it (absent fields: unlimited)."""
    body = _object("publishRate", value, {"publishThrottlingRateInMsg", "publishThrottlingRateInByte"})
    return PublishRate(
        _integer("publishThrottlingRateInMsg", body.get("publishThrottlingRateInMsg", UNLIMITED_RATE),
                 UNLIMITED_RATE, QUOTA_RATE_MESSAGES_MAX, f"-1 (unlimited) or 0..{QUOTA_RATE_MESSAGES_MAX} messages/s"),
        _integer("publishThrottlingRateInByte", body.get("publishThrottlingRateInByte", UNLIMITED_RATE),
                 UNLIMITED_RATE, QUOTA_RATE_BYTES_MAX, f"-1 (unlimited) or 0..{QUOTA_RATE_BYTES_MAX} bytes/s"))


def dispatch_rate_of(value: Any) -> DispatchRate:
    """A ``DispatchRate`` body as Pulsar's admin API takes it (absent fields: Pulsar's defaults)."""
    body = _object("dispatchRate", value, {"dispatchThrottlingRateInMsg", "dispatchThrottlingRateInByte",
                                           "ratePeriodInSecond", "relativeToPublishRate"})
    relative = body.get("relativeToPublishRate", False)
    if not isinstance(relative, bool):
        raise InvalidRequest(f"relativeToPublishRate must be true or false, not {relative!r}",
                             field="relativeToPublishRate")
    return DispatchRate(
        _integer("dispatchThrottlingRateInMsg", body.get("dispatchThrottlingRateInMsg", UNLIMITED_RATE),
                 UNLIMITED_RATE, QUOTA_RATE_MESSAGES_MAX, f"-1 (unlimited) or 0..{QUOTA_RATE_MESSAGES_MAX} messages"),
        _integer("dispatchThrottlingRateInByte", body.get("dispatchThrottlingRateInByte", UNLIMITED_RATE),
                 UNLIMITED_RATE, QUOTA_RATE_BYTES_MAX, f"-1 (unlimited) or 0..{QUOTA_RATE_BYTES_MAX} bytes"),
        _integer("ratePeriodInSecond", body.get("ratePeriodInSecond", 1), 1, QUOTA_RATE_PERIOD_S_MAX,
                 f"1..{QUOTA_RATE_PERIOD_S_MAX} seconds"),
        relative)


def checked_publish_rate(value: Any) -> dict[str, int] | None:
    return None if value is None else publish_rate_of(value).to_policy()


def checked_dispatch_rate(value: Any) -> dict[str, Any] | None:
    return None if value is None else dispatch_rate_of(value).to_policy()


# --- the broker's defaults and the resolved limits of one topic -----------------------------
@dataclass(frozen=True)
class QuotaDefaults:
    """Limits of a topic whose topic and namespace set none (0: unlimited), Pulsar's broker.conf keys."""

    max_producers_per_topic: int = 0
    """Producers of one topic partition."""
    max_consumers_per_topic: int = 0
    """Consumers of one topic partition, over all its subscriptions."""
    max_subscriptions_per_topic: int = 0
    """Subscriptions of one topic partition."""
    max_topics_per_namespace: int = 0
    """Topics of one namespace (a partitioned topic counts its partitions)."""
    publish_rate_messages: int = 0
    """Messages per second published to one topic partition (producers are throttled beyond)."""
    publish_rate_bytes: int = 0
    """Bytes per second published to one topic partition."""
    dispatch_rate_messages: int = 0
    """Messages per second dispatched from one topic partition, shared by its subscriptions."""
    dispatch_rate_bytes: int = 0
    """Entry bytes per second dispatched from one topic partition."""


CONFIG_KEYS: dict[str, str] = {
    "maxProducersPerTopic": "max_producers_per_topic",
    "maxConsumersPerTopic": "max_consumers_per_topic",
    "maxSubscriptionsPerTopic": "max_subscriptions_per_topic",
    "maxTopicsPerNamespace": "max_topics_per_namespace",
    "maxPublishRatePerTopicInMessages": "publish_rate_messages",
    "maxPublishRatePerTopicInBytes": "publish_rate_bytes",
    "dispatchThrottlingRatePerTopicInMsg": "dispatch_rate_messages",
    "dispatchThrottlingRatePerTopicInByte": "dispatch_rate_bytes",
}
"""standalone.conf key → ``QuotaDefaults`` field (each 0..``QUOTA_CONFIG_VALUE_MAX``, 0: unlimited)."""


@dataclass(frozen=True)
class TopicLimits:
    """One topic's resolved limits (0: unlimited)."""

    producers_max: int = 0
    consumers_max: int = 0
    subscriptions_max: int = 0
    publish: PublishRate = PublishRate()
    dispatch: DispatchRate = DispatchRate()


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def resolve_limits(defaults: QuotaDefaults, namespace: Mapping[str, Any], topic: Mapping[str, Any]) -> TopicLimits:
    """The limits a topic lives by: its own policies, else its namespace's, else the broker's."""
    publish = _first(topic.get("publishRate"), namespace.get("publishMaxMessageRate"))
    dispatch = _first(topic.get("dispatchRate"), namespace.get("topicDispatchRate"))
    return TopicLimits(
        producers_max=_first(topic.get("maxProducers"), namespace.get("max_producers_per_topic"),
                             defaults.max_producers_per_topic),
        consumers_max=_first(topic.get("maxConsumers"), namespace.get("max_consumers_per_topic"),
                             defaults.max_consumers_per_topic),
        subscriptions_max=_first(topic.get("maxSubscriptionsPerTopic"), namespace.get("max_subscriptions_per_topic"),
                                 defaults.max_subscriptions_per_topic),
        publish=publish_rate_of(publish) if publish is not None else
        PublishRate(defaults.publish_rate_messages or UNLIMITED_RATE, defaults.publish_rate_bytes or UNLIMITED_RATE),
        dispatch=dispatch_rate_of(dispatch) if dispatch is not None else
        DispatchRate(defaults.dispatch_rate_messages or UNLIMITED_RATE, defaults.dispatch_rate_bytes or UNLIMITED_RATE))


def topics_max(defaults: QuotaDefaults, namespace: Mapping[str, Any]) -> int:
    """How many topics (a partitioned topic counts its partitions) the namespace may hold; 0: any."""
    value = namespace.get("max_topics_per_namespace")
    return defaults.max_topics_per_namespace if value is None else int(value)


def check_topics_room(namespace: str, limit: int, existing: int, adding: int) -> None:
    """``QuotaExceeded`` when ``adding`` more topics would take the namespace past ``limit``."""
    if limit > 0 and existing + adding > limit:
        raise QuotaExceeded(f"Exceed maximum number of topics in namespace. {namespace} holds {existing} of "
                            f"{limit} topics; {adding} more do not fit")


# --- rate limiting ------------------------------------------------------------------------------
class RateLimiter:
    """A token bucket per unit (messages, bytes), each holding at most one period's worth."""

    __slots__ = (
        "_at",
        "_byte_cap",
        "_byte_rate",
        "_bytes",
        "_clock",
        "_message_cap",
        "_message_rate",
        "_messages",
    )

    def __init__(self, messages_per_period: int, bytes_per_period: int, period_s: float,
                 clock: Callable[[], float]) -> None:
        self._clock = clock
        self._messages = self._bytes = float("inf")
        self.retune(messages_per_period, bytes_per_period, period_s)
        self._at = clock()

    def retune(self, messages_per_period: int, bytes_per_period: int, period_s: float) -> None:
        """New rates (0: that unit unlimited); the tokens held stay, at most the new capacity."""
        self._message_cap = float(max(messages_per_period, 0))
        self._byte_cap = float(max(bytes_per_period, 0))
        self._message_rate = self._message_cap / period_s  # tokens per second
        self._byte_rate = self._byte_cap / period_s
        self._messages = min(self._messages, self._message_cap)
        self._bytes = min(self._bytes, self._byte_cap)

    def refill(self, now: float | None = None) -> None:
        """Add the tokens earned since the last refill (a clock going back earns none)."""
        now = self._clock() if now is None else now
        elapsed = now - self._at
        if elapsed <= 0:
            return
        self._at = now
        self._messages = min(self._message_cap, self._messages + elapsed * self._message_rate)
        self._bytes = min(self._byte_cap, self._bytes + elapsed * self._byte_rate)

    def consume(self, messages: int, size_bytes: int) -> None:
        """Take the tokens of ``messages`` and ``size_bytes`` (below zero if need be)."""
        self._messages -= messages
        self._bytes -= size_bytes

    def delay_s(self) -> float:
        """Seconds until every limited unit has a token again (0: now), as of the last refill."""
        waits = [0.0]
        if self._message_rate > 0 and self._messages <= 0:
            waits.append((1 - self._messages) / self._message_rate)
        if self._byte_rate > 0 and self._bytes <= 0:
            waits.append((1 - self._bytes) / self._byte_rate)
        return max(waits)


class TopicQuotas:
    """One topic partition's limits, its producer and consumer counts, and its rate limiters."""

    def __init__(self, topic: str, clock: Callable[[], float] = time.time) -> None:
        self._topic = topic
        self._clock = clock
        self._lock = threading.Lock()
        self.limits = TopicLimits()
        self.producers = 0
        self.consumers = 0
        self.publish: RateLimiter | None = None
        """The publish limiter, None while the topic's publish rate is unlimited."""
        self.dispatch: RateLimiter | None = None
        """The dispatch limiter (shared by the topic's subscriptions), None while unlimited."""

    def apply(self, limits: TopicLimits, publish_rates: tuple[float, float] = (0.0, 0.0)) -> None:
        """Live by ``limits`` from now on; a limiter whose rate changed keeps its tokens (at most
        its new capacity). ``publish_rates``: the topic's current messages/s and bytes/s, added to
        a dispatch rate relative to them."""
        with self._lock:
            self.limits = limits
            publish = limits.publish
            self.publish = self._retuned(self.publish, publish.messages, publish.size_bytes, 1, publish.limited)
            rate = limits.dispatch
            extra_messages, extra_bytes = (round(r * rate.period_s) for r in publish_rates) \
                if rate.relative_to_publish_rate else (0, 0)
            self.dispatch = self._retuned(self.dispatch, rate.messages + extra_messages if rate.messages > 0 else 0,
                                          rate.size_bytes + extra_bytes if rate.size_bytes > 0 else 0,
                                          rate.period_s, rate.limited)

    def _retuned(self, limiter: RateLimiter | None, messages: int, size_bytes: int, period_s: int,
                 limited: bool) -> RateLimiter | None:
        if not limited:
            return None
        if limiter is None:
            return RateLimiter(messages, size_bytes, period_s, self._clock)
        limiter.retune(messages, size_bytes, period_s)
        return limiter

    # --- counts --------------------------------------------------------------------------
    def add_producer(self) -> None:
        with self._lock:
            limit = self.limits.producers_max
            if limit > 0 and self.producers >= limit:
                raise ProducerBusy(f"Topic reached max producers limit: {self._topic} has {self.producers} of "
                                   f"{limit} producers")
            self.producers += 1

    def remove_producer(self) -> None:
        with self._lock:
            self.producers = max(self.producers - 1, 0)

    def add_consumer(self) -> None:
        with self._lock:
            limit = self.limits.consumers_max
            if limit > 0 and self.consumers >= limit:
                raise ConsumerBusy(f"Topic reached max consumers limit: {self._topic} has {self.consumers} of "
                                   f"{limit} consumers")
            self.consumers += 1

    def remove_consumer(self) -> None:
        with self._lock:
            self.consumers = max(self.consumers - 1, 0)

    def check_subscription_room(self, existing: int) -> None:
        """``QuotaExceeded`` when the topic, holding ``existing`` subscriptions, may have no more."""
        limit = self.limits.subscriptions_max
        if limit > 0 and existing >= limit:
            raise QuotaExceeded(f"Exceed the maximum number of subscriptions of the topic: {self._topic} has "
                                f"{existing} of {limit}")

    # --- publish rate ----------------------------------------------------------------------
    def published(self, messages: int, size_bytes: int) -> None:
        """Count a publish against the publish rate (nothing while it is unlimited)."""
        limiter = self.publish
        if limiter is not None:
            with self._lock:
                limiter.refill()
                limiter.consume(messages, size_bytes)

    def dispatch_delay_s(self, now: float) -> float:
        """How long the topic's subscriptions should wait before delivering more (0: deliver)."""
        limiter = self.dispatch
        if limiter is None:
            return 0.0
        with self._lock:
            limiter.refill(now)
            return limiter.delay_s()

    def dispatched(self, messages: int, size_bytes: int) -> None:
        """Count a delivery against the dispatch rate (nothing while it is unlimited)."""
        limiter = self.dispatch
        if limiter is not None:
            with self._lock:
                limiter.consume(messages, size_bytes)

    def publish_delay_s(self) -> float:
        """How long the topic's producers should stop sending (0: not throttled)."""
        limiter = self.publish
        if limiter is None:
            return 0.0
        with self._lock:
            limiter.refill()
            return limiter.delay_s()
