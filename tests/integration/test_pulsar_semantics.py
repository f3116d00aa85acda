"""Pulsar's semantics with the official ``pulsar-client`` against a real ``magnetar standalone``:
refusals that fail at once with Pulsar's own (non-retryable) error, producer access modes,
``GET_LAST_MESSAGE_ID``'s mark-delete position for readers, and a terminated topic's refusals.

One broker process serves the module; every test uses its own topics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pulsar
import pytest

from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client

Earliest = pulsar.InitialPosition.Earliest
Mode = pulsar.ProducerAccessMode
REFUSAL_S_MAX = 2.0
"""How long a refused client call may take: an answer, not a retry loop."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with binary_broker(tmp_path_factory.mktemp("semantics")) as (http_url, pulsar_url, _):
        yield http_url, pulsar_url


@pytest.fixture
def pc(broker: tuple[str, str]) -> Iterator[pulsar.Client]:
    c = client(broker[1])
    yield c
    c.close()


def refused_at_once(call: Callable[[], object], error: type[Exception]) -> None:
    started = time.monotonic()
    with pytest.raises(error):
        call()
    took = time.monotonic() - started
    assert took < REFUSAL_S_MAX, f"refused with {error.__name__} after {took:.1f} s"


def test_each_refusal_is_pulsars_error_at_once(pc: pulsar.Client) -> None:
    """The table in ARCHITECTURE.md ("Refusals on the binary protocol"), walked with the client."""
    bad_topic = "persistent://public/default/bad%name"
    refused_at_once(lambda: pc.create_producer(bad_topic), pulsar.NotAllowedError)
    refused_at_once(lambda: pc.subscribe(bad_topic, "s"), pulsar.NotAllowedError)
    refused_at_once(lambda: pc.create_reader(bad_topic, pulsar.MessageId.earliest), pulsar.NotAllowedError)
    refused_at_once(lambda: pc.create_producer("persistent://public/default/x-partition-99999999"),
                    pulsar.NotAllowedError)
    refused_at_once(lambda: pc.create_producer("persistent://public/nowhere/t"), pulsar.TopicNotFound)
    pc.subscribe("refusals", "held")
    refused_at_once(lambda: pc.subscribe("refusals", "held"), pulsar.ConsumerBusy)
    pc.subscribe("refusals", "shared", consumer_type=pulsar.ConsumerType.Shared)
    refused_at_once(lambda: pc.subscribe("refusals", "shared"), pulsar.ConsumerBusy)
    pc.create_producer("refusals", producer_name="named")
    refused_at_once(lambda: pc.create_producer("refusals", producer_name="named"), pulsar.ProducerBusy)
    pc.create_producer("refusals-exclusive", access_mode=Mode.Exclusive)
    refused_at_once(lambda: pc.create_producer("refusals-exclusive", access_mode=Mode.Exclusive),
                    pulsar.ProducerFenced)
    refused_at_once(lambda: pc.create_producer("refusals-exclusive"), pulsar.ProducerBusy)


def test_a_second_exclusive_producer_is_fenced_and_a_shared_one_busy(pc: pulsar.Client) -> None:
    first = pc.create_producer("exclusive", access_mode=Mode.Exclusive)
    refused_at_once(lambda: pc.create_producer("exclusive", access_mode=Mode.Exclusive), pulsar.ProducerFenced)
    refused_at_once(lambda: pc.create_producer("exclusive"), pulsar.ProducerBusy)
    first.send(b"still mine")
    first.close()
    pc.create_producer("exclusive", access_mode=Mode.Exclusive).send(b"now mine")


def test_exclusive_with_fencing_fails_the_fenced_producers_sends_at_once(pc: pulsar.Client) -> None:
    fenced = pc.create_producer("fencing", access_mode=Mode.Exclusive, batching_enabled=False)
    fenced.send(b"before")
    fencing = pc.create_producer("fencing", access_mode=Mode.ExclusiveWithFencing, batching_enabled=False)
    fencing.send(b"after")
    refused_at_once(lambda: fenced.send(b"late"), pulsar.ProducerFenced)
    refused_at_once(lambda: fenced.send(b"later"), pulsar.ProducerFenced)
    reader = pc.create_reader("fencing", pulsar.MessageId.earliest)
    assert [reader.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(2)] == [b"before", b"after"]
    assert not reader.has_message_available()


def test_wait_for_exclusive_waits_for_the_holder_to_leave(pc: pulsar.Client, broker: tuple[str, str]) -> None:
    holder = pc.create_producer("waiting", access_mode=Mode.Exclusive, batching_enabled=False)
    other = client(broker[1])  # its own connection: the waiting create blocks only its caller
    try:
        created: list[pulsar.Producer] = []
        thread = threading.Thread(target=lambda: created.append(
            other.create_producer("waiting", access_mode=Mode.WaitForExclusive, batching_enabled=False)))
        thread.start()
        thread.join(1.0)
        assert not created, "a WaitForExclusive producer was created while another held the topic"
        holder.send(b"held")
        holder.close()
        thread.join(10)
        assert created
        created[0].send(b"took over")
    finally:
        other.close()


def test_reader_at_latest_inclusive_has_the_last_message(pc: pulsar.Client) -> None:
    producer = pc.create_producer("last-id", batching_enabled=False)
    for i in range(3):
        producer.send(f"{i}".encode())
    reader = pc.create_reader("last-id", pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert reader.has_message_available()
    assert reader.read_next(RECEIVE_TIMEOUT_MS).data() == b"2"
    assert not reader.has_message_available()
    exclusive = pc.create_reader("last-id", pulsar.MessageId.latest)
    assert not exclusive.has_message_available()


def test_reader_at_latest_inclusive_on_an_empty_topic_has_nothing(pc: pulsar.Client) -> None:
    pc.create_producer("last-id-empty").close()
    reader = pc.create_reader("last-id-empty", pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert not reader.has_message_available()


def test_a_terminated_topic_refuses_producers_and_sends_at_once(pc: pulsar.Client, broker: tuple[str, str]) -> None:
    """As in Pulsar: a producer on a terminated topic is refused ``TopicTerminated``, and an open
    producer's next send fails with it (no retry loop, no hang); consumers reach its end."""
    producer = pc.create_producer("terminated", batching_enabled=False)
    producer.send(b"last")
    consumer = pc.subscribe("terminated", "s", initial_position=Earliest)
    answer = httpx.post(f"{broker[0]}/admin/v2/persistent/public/default/terminated/terminate", timeout=10)
    assert answer.status_code == 200, answer.text
    refused_at_once(lambda: producer.send(b"too late"), pulsar.TopicTerminated)
    refused_at_once(lambda: pc.create_producer("terminated"), pulsar.TopicTerminated)
    consumer.acknowledge(consumer.receive(RECEIVE_TIMEOUT_MS))
    assert consumer.is_connected()
