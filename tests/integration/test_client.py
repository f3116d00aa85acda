"""The Python client (``consumers.client``) against a real uvicorn server on an ephemeral port.

Checks, through the client's public API only: produce/consume round trips for Exclusive and
Shared subscriptions with keys, properties, event times, offsets and topics; acknowledgements
and negative acknowledgements (redelivery count); receive timeouts; readers from earliest, latest
and a message id, with ``has_message_available``; pipelined ``send_async`` bounded by
``max_pending_messages`` with results in order; the batching producer; broker refusals carried
as ``SendError`` / ``ConnectError`` with the broker's code; REST produce ids that match the
WebSocket ids; token authentication; the asyncio client; and that a broker going away fails
waiting calls with ``ConnectionClosed`` instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from api.auth import AuthConfig
from broker.service import BrokerService
from broker.topic_name import TopicName
from consumers.cli.tokens import create_token
from consumers.client import (
    AsyncClient,
    Client,
    ConnectError,
    ConnectionClosed,
    ConsumerError,
    HttpError,
    Message,
    ReceiveTimeout,
    SendError,
)
from tests.integration.server import running_server, stored

WAIT_MS = 10_000
QUIET_MS = 300
MESSAGE_SIZE_BYTES_MAX = 5 * 1024 * 1024


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, BrokerService]]:
    with running_server(str(tmp_path / "data")) as (url, service):
        yield url, service


@pytest.fixture
def client(server: tuple[str, BrokerService]) -> Iterator[Client]:
    with Client(server[0]) as made:
        yield made




def hold(client: Client, topic: str) -> None:
    """A durable subscription that keeps the topic's messages from being trimmed (retention 0)."""
    client.subscribe(topic, "hold").close()


def nothing_arrives(receive: Callable[[int], Message]) -> bool:
    try:
        receive(QUIET_MS)
    except ReceiveTimeout:
        return True
    return False


def test_exclusive_round_trip_carries_every_field(client: Client) -> None:
    consumer = client.subscribe("orders", "sub", subscription_type="Exclusive")
    producer = client.create_producer("orders", producer_name="p1")
    results = [producer.send(f"m{i}".encode(), key="user-1", properties={"i": str(i)}, event_time_ms=1_700_000_000_123)
               for i in range(3)]
    assert [r.offset for r in results] == [0, 1, 2]
    got = [consumer.receive(WAIT_MS) for _ in range(3)]
    assert [m.data for m in got] == [b"m0", b"m1", b"m2"]
    assert [m.message_id for m in got] == [r.message_id for r in results]
    first = got[0]
    assert first.key == "user-1" and first.properties == {"i": "0"} and first.offset == 0
    assert first.event_time_ms == 1_700_000_000_123 and first.redelivery_count == 0
    assert first.topic == "persistent://public/default/orders"
    assert first.publish_time_ms is not None and first.publish_time_ms > 1_700_000_000_000
    with pytest.raises(ConnectError) as refused:  # Exclusive: a second consumer is refused with the broker's code
        client.subscribe("orders", "sub", subscription_type="Exclusive")
    assert refused.value.status == 409 and refused.value.code == "consumer_busy"


def test_shared_consumers_split_the_messages_without_overlap(client: Client) -> None:
    first = client.subscribe("work", "pool", subscription_type="Shared", receiver_queue_size=5)
    second = client.subscribe("work", "pool", subscription_type="Shared", receiver_queue_size=5)
    producer = client.create_producer("work")
    for future in [producer.send_async(f"job{i}".encode()) for i in range(30)]:
        future.result(WAIT_MS / 1000)
    seen: list[bytes] = []
    counts = [0, 0]
    for _ in range(200):  # bounded: each pass waits at most 2 x 100 ms
        if len(seen) == 30:
            break
        for index, consumer in enumerate((first, second)):
            try:
                message = consumer.receive(100)
            except ReceiveTimeout:
                continue
            seen.append(message.data)
            counts[index] += 1
            consumer.acknowledge(message)
    assert sorted(seen) == sorted(f"job{i}".encode() for i in range(30))
    assert min(counts) > 0


def test_acks_stick_and_nacks_redeliver_with_a_growing_count(client: Client) -> None:
    consumer = client.subscribe("flaky", "sub", subscription_type="Shared", negative_ack_redelivery_delay_ms=0)
    producer = client.create_producer("flaky")
    producer.send(b"good")
    producer.send(b"poison")
    good, poison = consumer.receive(WAIT_MS), consumer.receive(WAIT_MS)
    assert (good.data, poison.data) == (b"good", b"poison")
    consumer.acknowledge(good)
    counts = [poison.redelivery_count]
    for _ in range(2):
        consumer.negative_acknowledge(poison)
        poison = consumer.receive(WAIT_MS)
        assert poison.data == b"poison"
        counts.append(poison.redelivery_count)
    assert counts == [0, 1, 2]
    consumer.close()
    again = client.subscribe("flaky", "sub", subscription_type="Shared")
    back = again.receive(WAIT_MS)  # the unacknowledged one comes back; the acknowledged one never does
    assert back.data == b"poison" and back.redelivery_count >= 2
    again.acknowledge(back)
    assert nothing_arrives(again.receive)


def test_receive_timeout_raises_and_later_messages_still_arrive(client: Client) -> None:
    consumer = client.subscribe("quiet", "sub")
    with pytest.raises(ReceiveTimeout) as waited:
        consumer.receive(200)
    assert isinstance(waited.value, TimeoutError) and waited.value.code == "receive_timeout"
    client.create_producer("quiet").send(b"late")
    assert consumer.receive(WAIT_MS).data == b"late"


def test_readers_start_at_earliest_latest_or_after_a_message_id(client: Client) -> None:
    hold(client, "log")
    producer = client.create_producer("log")
    results = [producer.send(f"r{i}".encode()) for i in range(5)]
    earliest = client.create_reader("log", "earliest")
    assert earliest.has_message_available()
    assert [earliest.read_next(WAIT_MS).data for _ in range(5)] == [f"r{i}".encode() for i in range(5)]
    assert not earliest.has_message_available()
    after = client.create_reader("log", results[2].message_id)
    assert after.has_message_available()
    assert [after.read_next(WAIT_MS).data for _ in range(2)] == [b"r3", b"r4"]
    assert not after.has_message_available()
    at_end = client.create_reader("log", results[4].message_id)
    assert not at_end.has_message_available()
    latest = client.create_reader("log", "latest")
    assert not latest.has_message_available()
    with pytest.raises(ReceiveTimeout):
        latest.read_next(QUIET_MS)
    producer.send(b"r5")
    assert latest.read_next(WAIT_MS).data == b"r5" and earliest.read_next(WAIT_MS).data == b"r5"
    assert not latest.has_message_available()


def test_reader_flow_credit_returns_automatically(client: Client) -> None:
    hold(client, "credit")
    producer = client.create_producer("credit")
    for future in [producer.send_async(f"c{i}".encode()) for i in range(12)]:
        future.result(WAIT_MS / 1000)
    reader = client.create_reader("credit", "earliest", receiver_queue_size=2)  # 12 messages through a queue of 2
    assert [reader.read_next(WAIT_MS).data for _ in range(12)] == [f"c{i}".encode() for i in range(12)]


def test_pipelined_sends_are_bounded_and_complete_in_order(client: Client) -> None:
    producer = client.create_producer("pipe", max_pending_messages=8)
    futures = []
    most_pending = 0
    for i in range(300):
        futures.append(producer.send_async(f"p{i}".encode()))
        most_pending = max(most_pending, producer.pending_messages)
    completion_order: list[int] = []
    lock = threading.Lock()
    for index, future in enumerate(futures):
        def record(_: object, index: int = index) -> None:
            with lock:
                completion_order.append(index)
        future.add_done_callback(record)
    producer.flush()
    assert most_pending <= 8
    results = [f.result(0) for f in futures]
    assert [r.offset for r in results] == list(range(300))
    assert completion_order == list(range(300))  # futures complete in the order of the calls
    assert [r.parts for r in results] == sorted(r.parts for r in results)


def test_batching_producer_batches_and_consumers_see_every_message(client: Client, server: tuple[str, BrokerService],
                                                                   ) -> None:
    consumer = client.subscribe("batched", "s")  # holds the messages against retention
    producer = client.create_producer("batched", batching=True, batching_max_messages=100)
    futures = [producer.send_async(f"b{i}".encode()) for i in range(400)]
    results = [f.result(WAIT_MS / 1000) for f in futures]
    assert [r.offset for r in results] == list(range(400))
    parts = [r.parts for r in results]
    assert any(p.batch_index >= 0 for p in parts)
    assert len({(p.ledger_id, p.entry_id) for p in parts}) < 400
    assert stored(server[1], "batched") == [f"b{i}".encode() for i in range(400)]
    got = []
    for _ in range(400):
        message = consumer.receive(WAIT_MS)
        consumer.acknowledge(message)
        got.append(message.offset)
    assert got == list(range(400))


def test_oversized_message_fails_with_the_brokers_code_and_writes_nothing(
        client: Client, server: tuple[str, BrokerService]) -> None:
    hold(client, "big")
    producer = client.create_producer("big")
    producer.send(b"small")
    with pytest.raises(SendError) as refused:
        producer.send(b"x" * (MESSAGE_SIZE_BYTES_MAX + 1))
    assert refused.value.code == "message_too_large" and refused.value.result_code == 8
    assert "exceeds" in refused.value.message
    assert producer.send(b"after").offset == 1  # the session survives the refusal
    assert stored(server[1], "big") == [b"small", b"after"]


def test_rest_produce_ids_match_the_websocket_ids(client: Client) -> None:
    consumer = client.subscribe("rest", "sub")
    results = client.produce_batch("rest", [b"\x00bin", b"two"], keys=["k1", None], properties={"via": "rest"})
    assert [r.offset for r in results] == [0, 1]
    got = [consumer.receive(WAIT_MS) for _ in range(2)]
    assert [m.data for m in got] == [b"\x00bin", b"two"]
    assert [m.message_id for m in got] == [r.message_id for r in results]
    assert got[0].key == "k1" and got[1].key is None and got[1].properties == {"via": "rest"}
    with pytest.raises(HttpError) as conflict:
        client.produce_batch("rest", [b"x"], expected_offset=0)
    assert conflict.value.status == 409 and conflict.value.code == "offset_mismatch"


def test_unsubscribe_deletes_the_subscription_and_ends_the_consumer(
        client: Client, server: tuple[str, BrokerService]) -> None:
    consumer = client.subscribe("gone", "sub", subscription_type="Shared")
    other = client.subscribe("gone", "sub", subscription_type="Shared")
    with pytest.raises(ConsumerError) as busy:  # refused while another consumer is attached
        consumer.unsubscribe()
    assert busy.value.code == "consumer_busy"
    other.close()
    # the client's close returns once the close handshake is done; the broker detaches that
    # consumer as its session ends, a moment later: wait for it, bounded, before unsubscribing
    subscription = next(s for s in server[1].subscriptions.of(TopicName.parse("gone")) if s.name == "sub")
    deadline = time.monotonic() + WAIT_MS / 1000
    while len(subscription.consumers) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    consumer.unsubscribe()
    assert "sub" not in server[1].topics.topic("gone").cursors.names()
    with pytest.raises(ConnectionClosed) as closed:
        consumer.receive(WAIT_MS)
    assert closed.value.by_client


def test_multi_topic_consumer_receives_from_every_topic(client: Client) -> None:
    consumer = client.subscribe(["m1", "public/default/m2"], "multi", subscription_type="Shared")
    client.create_producer("m1").send(b"one")
    client.create_producer("persistent://public/default/m2").send(b"two")
    got = [consumer.receive(WAIT_MS) for _ in range(2)]
    assert sorted(m.data for m in got) == [b"one", b"two"]


def test_token_authentication_is_passed_on_http_and_websocket(tmp_path: Path) -> None:
    secret = b"0123456789abcdef0123456789abcdef"
    auth = AuthConfig(enabled=True, secret_key=secret, superuser_roles=frozenset({"admin"}))
    with running_server(str(tmp_path / "data"), auth=auth) as (url, _):
        with Client(url) as anonymous:
            with pytest.raises(ConnectError) as missing:
                anonymous.create_producer("secure")
            assert missing.value.status == 401 and missing.value.code == "unauthorized"
            with pytest.raises(HttpError) as missing_http:
                anonymous.produce_batch("secure", [b"x"])
            assert missing_http.value.status == 401
        with Client(url, token=create_token("app", secret_key=secret)) as app:
            with pytest.raises(ConnectError) as denied:
                app.subscribe("secure", "sub")
            assert denied.value.status == 403 and denied.value.code == "forbidden"
        with Client(url, token=create_token("admin", secret_key=secret)) as admin:
            consumer = admin.subscribe("secure", "sub")
            admin.create_producer("secure").send(b"ws")
            admin.produce_batch("secure", [b"rest"])
            assert [consumer.receive(WAIT_MS).data for _ in range(2)] == [b"ws", b"rest"]
            assert admin.request("GET", "/admin/v2/tenants").json() == ["public"]


def test_async_client_produces_and_iterates(server: tuple[str, BrokerService]) -> None:
    async def scenario() -> list[Message]:
        async with AsyncClient(server[0]) as client:
            consumer = await client.subscribe("async", "sub", subscription_type="Shared")
            producer = await client.create_producer("async", max_pending_messages=4)
            futures = [await producer.send_async(f"a{i}".encode(), key="k") for i in range(20)]
            results = await asyncio.gather(*futures)
            assert [r.offset for r in results] == list(range(20))
            got: list[Message] = []
            async for message in consumer:
                await consumer.acknowledge(message)
                got.append(message)
                if len(got) == 20:
                    break
            await consumer.close()
            with pytest.raises(ConnectionClosed):
                await consumer.receive(WAIT_MS)
            return got

    got = asyncio.run(scenario())
    assert [m.data for m in got] == [f"a{i}".encode() for i in range(20)]


def test_a_broker_going_away_fails_waiting_calls_instead_of_hanging(tmp_path: Path) -> None:
    with Client("http://127.0.0.1:1") as nowhere, pytest.raises(ConnectError) as unreachable:
        nowhere.create_producer("t")
    assert unreachable.value.status == 0 and unreachable.value.code == "unreachable"
    with contextlib.ExitStack() as stack:
        url, _ = stack.enter_context(running_server(str(tmp_path / "data")))
        client = Client(url)
        try:
            consumer = client.subscribe("t", "sub")
            producer = client.create_producer("t")
            outcome: list[BaseException] = []

            def wait_without_timeout() -> None:
                try:
                    consumer.receive()
                except BaseException as exc:
                    outcome.append(exc)

            waiter = threading.Thread(target=wait_without_timeout)
            waiter.start()
            stack.close()  # the broker shuts down under the waiting consumer
            waiter.join(WAIT_MS / 1000)
            assert not waiter.is_alive()
            assert len(outcome) == 1 and isinstance(outcome[0], ConnectionClosed) and not outcome[0].by_client
            with pytest.raises(ConnectionClosed):
                producer.send(b"too late")
        finally:
            client.close()
