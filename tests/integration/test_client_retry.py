"""The Python client's retry-letter topic policy against a real ``magnetar standalone`` process.

Checks, through the client's public API only: a consumer with ``retry_enable`` gets a message it
hands back with ``reconsume_later`` again, from the retry-letter topic (default
``<topic>-<subscription>-RETRY``), not before the delay, with Pulsar's properties
(``RECONSUMETIMES`` counting up, ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID`` kept from the first
consumption, ``DELAY_TIME``), its data, key and own properties intact; after
``max_redeliver_count`` reconsumes the next one sends it to the dead-letter topic (default
``<topic>-<subscription>-DLQ``) instead, and nothing comes back on the consumer; the original is
acknowledged each time (a new consumer of the subscription gets nothing); with the policy on
and no count given, a message negatively acknowledged goes to the same dead-letter topic after
Pulsar's default of 16 redeliveries, as a reconsumed one would; and ``reconsume_later`` without
the policy is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.client import Client, ClientError, ReceiveTimeout
from tests.standalone import standalone_process

WAIT_MS = 15_000
QUIET_MS = 500
DELAY_MS = 700
TOPIC = "persistent://public/default/orders"
SUBSCRIPTION = "billing"
MAX_RECONSUMES = 2
RECONSUMES_DEFAULT = 16


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data: Path = tmp_path_factory.mktemp("retry") / "data"
    with standalone_process(data) as (service_url, _):
        yield service_url


def test_reconsume_later_redelivers_after_the_delay_then_dead_letters(url: str) -> None:
    with Client(url) as client:
        dead = client.subscribe(f"{TOPIC}-{SUBSCRIPTION}-DLQ", "audit", initial_position="earliest")
        consumer = client.subscribe(TOPIC, SUBSCRIPTION, subscription_type="Shared", retry_enable=True,
                                    max_redeliver_count=MAX_RECONSUMES)
        client.create_producer(TOPIC).send(b"invoice-7", key="customer-3", properties={"app": "kept"})

        first = consumer.receive(WAIT_MS)
        assert first.data == b"invoice-7" and "RECONSUMETIMES" not in first.properties
        origin = first.message_id
        message = first
        for times in range(1, MAX_RECONSUMES + 1):
            handed_back_s = time.monotonic()
            assert consumer.reconsume_later(message, DELAY_MS) == f"{TOPIC}-{SUBSCRIPTION}-RETRY"
            message = consumer.receive(WAIT_MS)
            waited_ms = (time.monotonic() - handed_back_s) * 1000
            assert waited_ms >= DELAY_MS * 0.9, f"delivered again after {waited_ms:.0f} ms"
            assert (message.data, message.key) == (b"invoice-7", "customer-3")
            assert message.properties == {"app": "kept", "RECONSUMETIMES": str(times), "REAL_TOPIC": TOPIC,
                                          "ORIGIN_MESSAGE_ID": origin, "DELAY_TIME": str(DELAY_MS)}

        assert consumer.reconsume_later(message, DELAY_MS) == f"{TOPIC}-{SUBSCRIPTION}-DLQ"
        dead_lettered = dead.receive(WAIT_MS)
        assert dead_lettered.data == b"invoice-7" and dead_lettered.key == "customer-3"
        assert dead_lettered.properties["RECONSUMETIMES"] == str(MAX_RECONSUMES + 1)
        assert dead_lettered.properties["ORIGIN_MESSAGE_ID"] == origin
        assert dead_lettered.properties["REAL_TOPIC"] == TOPIC
        with pytest.raises(ReceiveTimeout):
            consumer.receive(DELAY_MS + QUIET_MS)  # nothing comes back once dead-lettered
        consumer.close()

        again = client.subscribe(TOPIC, SUBSCRIPTION, subscription_type="Shared", retry_enable=True,
                                 max_redeliver_count=MAX_RECONSUMES)
        with pytest.raises(ReceiveTimeout):
            again.receive(QUIET_MS)  # every copy and the original were acknowledged


def test_the_retry_policy_dead_letters_nacked_messages_after_pulsars_default_count(url: str) -> None:
    topic = "persistent://public/default/nacked"
    with Client(url) as client:
        dead = client.subscribe(f"{topic}-{SUBSCRIPTION}-DLQ", "audit", initial_position="earliest")
        consumer = client.subscribe(topic, SUBSCRIPTION, subscription_type="Shared", retry_enable=True,
                                    negative_ack_redelivery_delay_ms=10)
        client.create_producer(topic).send(b"poison")
        for _ in range(RECONSUMES_DEFAULT + 1):  # the first delivery and 16 redeliveries
            message = consumer.receive(WAIT_MS)
            assert message.data == b"poison"
            consumer.negative_acknowledge(message)
        moved = dead.receive(WAIT_MS)
        assert moved.data == b"poison" and moved.properties["REAL_TOPIC"] == topic
        with pytest.raises(ReceiveTimeout):
            consumer.receive(QUIET_MS)


def test_reconsume_later_needs_the_policy(url: str) -> None:
    with Client(url) as client:
        consumer = client.subscribe("plain", "s", subscription_type="Shared")
        client.create_producer("plain").send(b"x")
        message = consumer.receive(WAIT_MS)
        with pytest.raises(ClientError):
            consumer.reconsume_later(message, 10)
        with pytest.raises(ValueError):
            client.subscribe(["a", "b"], "s", retry_enable=True)
