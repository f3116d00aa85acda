"""The retry-letter topic policy: ``reconsume_later`` re-publishes a message to be delivered again.

Role: Pulsar's clients let a consumer hand a message back for a later try without holding it
unacknowledged: with the policy on (``retry_enable`` of ``AsyncClient.subscribe``) the consumer
subscribes to its topic and to the retry-letter topic (default ``<topic>-<subscription>-RETRY``);
``reconsume_later(message, delay_ms)`` publishes the message's data, key and properties to the
retry-letter topic, delivered after ``delay_ms``, then acknowledges the original. The copy
carries Pulsar's properties:

- ``RECONSUMETIMES``: how many times the message was reconsumed (1 on the first);
- ``REAL_TOPIC``: the topic the message was first consumed from;
- ``ORIGIN_MESSAGE_ID``: the id of the first message (the project's base64 id), kept as it is
  on every later reconsume;
- ``DELAY_TIME``: the delay asked for, in milliseconds.

Once a message was reconsumed ``max_redeliver_count`` times (default
``RECONSUME_TIMES_MAX_DEFAULT``, Pulsar's), the next ``reconsume_later`` sends it to the
dead-letter topic instead (default ``<topic>-<subscription>-DLQ``, the name the broker's own
dead-lettering uses), with the same properties and no delay.

Invariants: the original is acknowledged only after its copy is durable (a failure to publish
raises and leaves the original unacknowledged, so it comes back: at least once); the consumer's
producers for the two topics are made on first use and closed with the consumer; the delay is
the broker's delayed delivery, which applies to Shared (and Key_Shared) subscriptions, as in
Pulsar.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from consumers.client._producer import AsyncProducer
from consumers.client.types import Message

RECONSUME_TIMES = "RECONSUMETIMES"
REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
DELAY_TIME = "DELAY_TIME"
RETRY_SUFFIX = "-RETRY"
DLQ_SUFFIX = "-DLQ"
RECONSUME_TIMES_MAX_DEFAULT = 16
"""Pulsar's default for a retry-letter policy that names no ``maxRedeliverCount``."""
DELAY_MS_MAX = 2**31 - 1


def retry_topic_of(topic: str, subscription: str) -> str:
    """The default retry-letter topic of ``subscription`` on ``topic`` (a full name)."""
    return f"{topic}-{subscription}{RETRY_SUFFIX}"


def dead_letter_topic_of(topic: str, subscription: str) -> str:
    """The default dead-letter topic of ``subscription`` on ``topic`` (a full name)."""
    return f"{topic}-{subscription}{DLQ_SUFFIX}"


@dataclass(frozen=True)
class RetryLetterPolicy:
    """Where reconsumed messages go and how often a message may be reconsumed."""

    topic: str
    """The consumer's own topic (full name): what ``REAL_TOPIC`` names."""
    retry_letter_topic: str
    dead_letter_topic: str
    max_redeliver_count: int

    @classmethod
    def of(cls, topic: str, subscription: str, *, retry_letter_topic: str | None,
           dead_letter_topic: str | None, max_redeliver_count: int | None) -> RetryLetterPolicy:
        count = RECONSUME_TIMES_MAX_DEFAULT if max_redeliver_count is None else max_redeliver_count
        if count < 1:
            raise ValueError("max_redeliver_count must be at least 1 with a retry-letter topic")
        return cls(topic, retry_letter_topic or retry_topic_of(topic, subscription),
                   dead_letter_topic or dead_letter_topic_of(topic, subscription), count)


def reconsumed_properties(message: Message, policy: RetryLetterPolicy, delay_ms: int) -> tuple[dict[str, str], int]:
    """The properties of ``message``'s copy and how many times it was reconsumed with this one."""
    properties = dict(message.properties)
    try:
        times = int(properties.get(RECONSUME_TIMES, "0")) + 1
    except ValueError:
        times = 1  # not a count this policy wrote: start over
    properties[RECONSUME_TIMES] = str(times)
    properties.setdefault(REAL_TOPIC, policy.topic)
    properties.setdefault(ORIGIN_MESSAGE_ID, message.message_id)
    properties[DELAY_TIME] = str(delay_ms)
    return properties, times


ProducerFactory = Callable[[str], Awaitable[AsyncProducer]]


class RetryLetter:
    """One consumer's retry-letter and dead-letter producers, made on first use."""

    def __init__(self, policy: RetryLetterPolicy, make_producer: ProducerFactory) -> None:
        self.policy = policy
        self._make_producer = make_producer
        self._producers: dict[str, AsyncProducer] = {}
        self._creating = asyncio.Lock()

    async def publish(self, message: Message, delay_ms: int) -> str:
        """Publish ``message``'s copy where it goes next (durable on return); the topic it went to."""
        if not 0 <= delay_ms <= DELAY_MS_MAX:
            raise ValueError(f"delay_ms must lie in 0..{DELAY_MS_MAX}, not {delay_ms}")
        properties, times = reconsumed_properties(message, self.policy, delay_ms)
        if times > self.policy.max_redeliver_count:
            target = self.policy.dead_letter_topic
            producer = await self._producer(target)
            await producer.send(message.data, key=message.key, properties=properties,
                                event_time_ms=message.event_time_ms)
        else:
            target = self.policy.retry_letter_topic
            producer = await self._producer(target)
            await producer.send(message.data, key=message.key, properties=properties,
                                event_time_ms=message.event_time_ms, deliver_after_ms=delay_ms or None)
        return target

    async def _producer(self, topic: str) -> AsyncProducer:
        async with self._creating:  # two first calls at once make one producer, not two
            producer = self._producers.get(topic)
            if producer is None:
                producer = self._producers[topic] = await self._make_producer(topic)
            return producer

    async def close(self) -> None:
        producers = list(self._producers.values())
        self._producers.clear()
        for producer in producers:
            await producer.close()
