"""WebSocket handshake query parameters: typed, bounded, and explained when wrong.

Role: Pulsar's WebSocket API configures a session through its handshake's query string
(``producerName``, ``batchingEnabled``, ``subscriptionType``, ``receiverQueueSize``,
``messageId``, …). ``QueryParams`` reads one value at a time with its type and bounds;
``ProducerParams`` and ``ConsumerParams`` collect what a session needs, and ``reader_start``
where a reader begins. A bad value raises ``InvalidRequest`` (the handshake is answered 400).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.limits import RECEIVER_QUEUE_MESSAGES_MAX, WS_BATCH_MESSAGES_MAX, WS_PENDING_MESSAGES_MAX, EdgeLimits
from broker import (
    ROUTING_MODES,
    Compression,
    ConsumerConfig,
    InvalidRequest,
    MessageId,
    StartPosition,
    SubscriptionType,
)

_COMPRESSIONS = {"NONE": Compression.NONE, "LZ4": Compression.LZ4, "ZLIB": Compression.ZLIB,
                 "ZSTD": Compression.ZSTD, "SNAPPY": Compression.SNAPPY}


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
            batch_messages_max=query.integer("batchingMaxMessages", 1000, 1, WS_BATCH_MESSAGES_MAX),
            pending_messages_max=query.integer("maxPendingMessages", 1000, 1, WS_PENDING_MESSAGES_MAX),
            routing_mode=query.choice("messageRoutingMode", {mode: mode for mode in ROUTING_MODES},
                                      "RoundRobinPartition"),
            compression=query.choice("compressionType", _COMPRESSIONS, "NONE"),
        )


@dataclass(frozen=True)
class ConsumerParams:
    sub_type: SubscriptionType
    durable: bool
    initial: str
    receiver_queue_size: int
    pull_mode: bool
    config: ConsumerConfig

    @classmethod
    def parse(cls, query: QueryParams, limits: EdgeLimits, peer: str = "") -> ConsumerParams:
        receiver_queue = query.integer("receiverQueueSize", RECEIVER_QUEUE_MESSAGES_MAX, 0, 2**31 - 1)
        receiver_queue = min(receiver_queue, RECEIVER_QUEUE_MESSAGES_MAX)  # Pulsar caps it at 1000
        config = ConsumerConfig(
            name=query.text("consumerName") or f"ws-consumer-{uuid.uuid4().hex[:12]}",
            receiver_queue_size=receiver_queue,
            priority_level=query.integer("priorityLevel", 0, 0, 2**31 - 1),
            ack_timeout_ms=query.integer("ackTimeoutMillis", 0, 0, 2**31 - 1),
            negative_ack_redelivery_delay_ms=query.integer("negativeAckRedeliveryDelay", 60_000, 0, 2**31 - 1),
            max_redeliver_count=query.integer("maxRedeliverCount", 0, 0, 2**31 - 1),
            dead_letter_topic=query.text("deadLetterTopic"),
            unacked_bytes_max=limits.consumer_unacked_bytes_max,
            address=f"/{peer}" if peer else "",
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


def reader_start(query: QueryParams) -> StartPosition:
    raw = query.text("messageId", "latest")
    assert raw is not None
    if raw.lower() == "earliest":
        return StartPosition.earliest()
    if raw.lower() == "latest":
        return StartPosition.latest()
    return StartPosition("message_id", message_id=MessageId.parse(raw), inclusive=False)

