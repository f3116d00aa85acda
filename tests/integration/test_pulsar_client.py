"""The official ``pulsar-client`` (Python, over the C++ library) against a real ``magnetar
standalone`` on its binary-protocol port: producing, consuming, acknowledging, readers.

One broker process serves the module; every test uses its own topics.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pulsar
import pytest

from tests.integration.pulsar_support import (
    RECEIVE_TIMEOUT_MS,
    binary_broker,
    client,
    create_partitioned,
    drain,
    nothing_more,
    receive_all,
)

Earliest = pulsar.InitialPosition.Earliest


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with binary_broker(tmp_path_factory.mktemp("binary")) as (http_url, pulsar_url, _):
        yield http_url, pulsar_url


@pytest.fixture
def pc(broker: tuple[str, str]) -> Iterator[pulsar.Client]:
    c = client(broker[1])
    yield c
    c.close()


def test_sync_send_then_consume_with_keys_properties_and_event_time(pc: pulsar.Client) -> None:
    producer = pc.create_producer("plain", batching_enabled=False)
    sent = [producer.send(f"m{i}".encode(), properties={"i": str(i)}, partition_key=f"k{i}",
                          event_timestamp=1_700_000_000_000 + i) for i in range(5)]
    consumer = pc.subscribe("plain", "s", initial_position=Earliest)
    received = receive_all(consumer, 5)
    assert [m.data() for m in received] == [f"m{i}".encode() for i in range(5)]
    assert [m.properties() for m in received] == [{"i": str(i)} for i in range(5)]
    assert [m.partition_key() for m in received] == [f"k{i}" for i in range(5)]
    assert [m.event_timestamp() for m in received] == [1_700_000_000_000 + i for i in range(5)]
    assert [str(m.message_id()) for m in received] == [str(i) for i in sent]
    assert all(m.publish_timestamp() > 0 for m in received)
    assert nothing_more(consumer)


def test_async_send_with_batching_arrives_as_one_entry(pc: pulsar.Client) -> None:
    producer = pc.create_producer("batched", batching_enabled=True, batching_max_messages=100,
                                  batching_max_publish_delay_ms=50)
    results: list[tuple[pulsar.Result, pulsar.MessageId]] = []
    for i in range(20):
        producer.send_async(f"b{i}".encode(), lambda res, mid: results.append((res, mid)))
    producer.flush()
    assert len(results) == 20 and all(res == pulsar.Result.Ok for res, _ in results)
    consumer = pc.subscribe("batched", "s", initial_position=Earliest)
    received = receive_all(consumer, 20)
    assert [m.data() for m in received] == [f"b{i}".encode() for i in range(20)]
    entries = {(m.message_id().ledger_id(), m.message_id().entry_id()) for m in received}
    assert len(entries) < 20  # batched: several messages share an entry
    assert sorted(m.message_id().batch_index() for m in received if
                  (m.message_id().ledger_id(), m.message_id().entry_id()) == min(entries))[0] == 0


@pytest.mark.parametrize("sub_type", [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Shared])
def test_batches_larger_than_the_receiver_queue_are_consumed_and_acknowledged(
        pc: pulsar.Client, broker: tuple[str, str], sub_type: pulsar.ConsumerType) -> None:
    """Entries of 50 messages against a receiver queue of 20: each batch arrives whole (the
    client acknowledges a batch only once it holds all of it), so every ack lands and the
    backlog drains."""
    topic = f"big-batches-{sub_type.name}"
    producer = pc.create_producer(topic, batching_enabled=True, batching_max_messages=50,
                                  batching_max_publish_delay_ms=1000, block_if_queue_full=True)
    for i in range(200):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    consumer = pc.subscribe(topic, "s", initial_position=Earliest, receiver_queue_size=20, consumer_type=sub_type)
    assert [m.data() for m in receive_all(consumer, 200)] == [f"{i}".encode() for i in range(200)]
    stats_url = f"{broker[0]}/admin/v2/persistent/public/default/{topic}/stats"
    deadline = time.monotonic() + 30
    backlog = None
    while backlog != 0 and time.monotonic() < deadline:  # the client sends its acks in groups
        backlog = httpx.get(stats_url, timeout=10).json()["subscriptions"]["s"]["msgBacklog"]
        time.sleep(0.05)
    assert backlog == 0
    consumer.close()


@pytest.mark.parametrize("compression", [pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib,
                                         pulsar.CompressionType.ZSTD, pulsar.CompressionType.SNAPPY])
def test_every_compression_type_round_trips(pc: pulsar.Client, compression: pulsar.CompressionType) -> None:
    topic = f"compressed-{compression.name}"
    payloads = [(f"payload {i} " * 50).encode() for i in range(30)]
    producer = pc.create_producer(topic, compression_type=compression, batching_enabled=True,
                                  batching_max_publish_delay_ms=20)
    for payload in payloads:
        producer.send_async(payload, None)
    producer.flush()
    single = pc.create_producer(topic, compression_type=compression, batching_enabled=False)
    single.send(b"alone " * 100)
    consumer = pc.subscribe(topic, "s", initial_position=Earliest)
    assert [m.data() for m in receive_all(consumer, 31)] == [*payloads, b"alone " * 100]


def test_partitioned_topic_routing_modes(broker: tuple[str, str], pc: pulsar.Client) -> None:
    create_partitioned(broker[0], "parted", 3)
    round_robin = pc.create_producer("parted", batching_enabled=False,
                                     message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(30):
        round_robin.send(f"rr{i}".encode())
    single = pc.create_producer("parted", batching_enabled=False,
                                message_routing_mode=pulsar.PartitionsRoutingMode.UseSinglePartition)
    for i in range(10):
        single.send(f"sp{i}".encode())
    keyed = pc.create_producer("parted", batching_enabled=False)
    for i in range(12):
        keyed.send(f"key{i % 3}-{i}".encode(), partition_key=f"key{i % 3}")
    custom = pc.create_producer("parted", batching_enabled=False, message_router=lambda message, n: 2)
    custom.send(b"custom")
    consumer = pc.subscribe("parted", "s", initial_position=Earliest)
    received = receive_all(consumer, 53)
    partitions = {m.data(): m.message_id().partition() for m in received}
    assert set(Counter(partitions[f"rr{i}".encode()] for i in range(30)).values()) == {10}
    assert len({partitions[f"sp{i}".encode()] for i in range(10)}) == 1
    for key in range(3):
        assert len({p for d, p in partitions.items() if d.startswith(f"key{key}-".encode())}) == 1
    assert partitions[b"custom"] == 2
    assert all(m.topic_name().endswith(f"parted-partition-{m.message_id().partition()}") for m in received)


def test_exclusive_subscription_refuses_a_second_consumer(pc: pulsar.Client) -> None:
    pc.subscribe("excl", "s", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        pc.subscribe("excl", "s", consumer_type=pulsar.ConsumerType.Exclusive)


def test_shared_subscription_splits_messages_between_consumers(pc: pulsar.Client) -> None:
    first = pc.subscribe("shared", "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    second = pc.subscribe("shared", "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    producer = pc.create_producer("shared", batching_enabled=False)
    for i in range(40):
        producer.send(f"{i}".encode())
    got: list[bytes] = []
    counts = []
    for consumer in (first, second):
        mine = [message.data() for message in drain(consumer)]
        counts.append(len(mine))
        got += mine
    assert sorted(got, key=int) == [f"{i}".encode() for i in range(40)]
    assert all(count > 0 for count in counts)


def test_failover_subscription_delivers_to_one_consumer_then_the_other(pc: pulsar.Client) -> None:
    active = pc.subscribe("failover", "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a")
    standby = pc.subscribe("failover", "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    producer = pc.create_producer("failover", batching_enabled=False)
    for i in range(5):
        producer.send(f"{i}".encode())
    assert [m.data() for m in receive_all(active, 5)] == [f"{i}".encode() for i in range(5)]
    assert nothing_more(standby)
    active.close()
    for i in range(5, 8):
        producer.send(f"{i}".encode())
    assert [m.data() for m in receive_all(standby, 3)] == [b"5", b"6", b"7"]


def test_key_shared_keeps_each_key_on_one_consumer(pc: pulsar.Client) -> None:
    consumers = [pc.subscribe("keyshared", "s", consumer_type=pulsar.ConsumerType.KeyShared) for _ in range(2)]
    producer = pc.create_producer("keyshared", batching_enabled=False)
    for i in range(60):
        producer.send(f"{i}".encode(), partition_key=f"key-{i % 6}")
    owner: dict[str, int] = {}
    order: dict[str, list[int]] = {}
    total = 0
    for index, consumer in enumerate(consumers):
        for message in drain(consumer):
            total += 1
            key = message.partition_key()
            assert owner.setdefault(key, index) == index
            order.setdefault(key, []).append(int(message.data()))
    assert total == 60
    assert all(values == sorted(values) for values in order.values())


def test_ordering_key_overrides_the_key_for_key_shared(pc: pulsar.Client) -> None:
    consumer = pc.subscribe("orderingkey", "s", consumer_type=pulsar.ConsumerType.KeyShared)
    producer = pc.create_producer("orderingkey", batching_enabled=False)
    producer.send(b"x", partition_key="p", ordering_key="o")
    message = consumer.receive(RECEIVE_TIMEOUT_MS)
    assert (message.partition_key(), message.ordering_key()) == ("p", "o")


def test_individual_acks_survive_a_new_consumer(pc: pulsar.Client) -> None:
    producer = pc.create_producer("acks", batching_enabled=False)
    for i in range(6):
        producer.send(f"{i}".encode())
    consumer = pc.subscribe("acks", "s", initial_position=Earliest, consumer_type=pulsar.ConsumerType.Shared)
    received = receive_all(consumer, 6, ack=False)
    for message in received[::2]:
        consumer.acknowledge(message)
    consumer.close()
    again = pc.subscribe("acks", "s", consumer_type=pulsar.ConsumerType.Shared)
    assert sorted(m.data() for m in receive_all(again, 3)) == [b"1", b"3", b"5"]
    assert nothing_more(again)


def test_cumulative_ack_acknowledges_everything_before(pc: pulsar.Client) -> None:
    producer = pc.create_producer("cumulative", batching_enabled=True, batching_max_publish_delay_ms=20)
    for i in range(10):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    for i in range(10, 15):
        producer.send(f"{i}".encode())
    consumer = pc.subscribe("cumulative", "s", initial_position=Earliest)
    received = receive_all(consumer, 15, ack=False)
    consumer.acknowledge_cumulative(received[12])
    consumer.close()
    again = pc.subscribe("cumulative", "s")
    assert [m.data() for m in receive_all(again, 2)] == [b"13", b"14"]


def test_batch_index_acks_redeliver_only_the_unacknowledged_messages(pc: pulsar.Client) -> None:
    producer = pc.create_producer("batchindex", batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(10):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    consumer = pc.subscribe("batchindex", "s", initial_position=Earliest, batch_index_ack_enabled=True,
                            consumer_type=pulsar.ConsumerType.Shared)
    received = receive_all(consumer, 10, ack=False)
    assert received[0].message_id().entry_id() == received[9].message_id().entry_id()  # one batch
    for message in received[:7]:
        consumer.acknowledge(message)
    consumer.close()
    again = pc.subscribe("batchindex", "s", batch_index_ack_enabled=True, consumer_type=pulsar.ConsumerType.Shared)
    assert [m.data() for m in receive_all(again, 3)] == [b"7", b"8", b"9"]
    assert nothing_more(again)


def test_readers_from_earliest_latest_and_an_id(pc: pulsar.Client) -> None:
    producer = pc.create_producer("readers", batching_enabled=False)
    ids = [producer.send(f"{i}".encode()) for i in range(5)]
    earliest = pc.create_reader("readers", pulsar.MessageId.earliest)
    assert earliest.has_message_available()
    assert [earliest.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(5)] == [f"{i}".encode() for i in range(5)]
    assert not earliest.has_message_available()
    latest = pc.create_reader("readers", pulsar.MessageId.latest)
    after = pc.create_reader("readers", ids[2])
    inclusive = pc.create_reader("readers", ids[2], start_message_id_inclusive=True)
    producer.send(b"5")
    assert latest.read_next(RECEIVE_TIMEOUT_MS).data() == b"5"
    assert [after.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(3)] == [b"3", b"4", b"5"]
    assert [inclusive.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(4)] == [b"2", b"3", b"4", b"5"]


def test_reader_from_an_id_inside_a_batch(pc: pulsar.Client) -> None:
    # one batch of six, whatever the machine's pace: sent when the sixth is added (or on flush),
    # never cut by the publish delay's timer
    producer = pc.create_producer("batchreader", batching_enabled=True, batching_max_messages=6,
                                  batching_max_publish_delay_ms=60_000)
    ids: list[pulsar.MessageId] = []
    for i in range(6):
        producer.send_async(f"{i}".encode(), lambda res, mid: ids.append(mid))
    producer.flush()
    assert len({(m.ledger_id(), m.entry_id()) for m in ids}) == 1, ids  # one batch entry
    reader = pc.create_reader("batchreader", sorted(ids, key=lambda m: m.batch_index())[3])
    assert [reader.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(2)] == [b"4", b"5"]


def test_get_last_message_id(pc: pulsar.Client) -> None:
    producer = pc.create_producer("lastid", batching_enabled=False)
    consumer = pc.subscribe("lastid", "s")
    for i in range(3):
        last = producer.send(f"{i}".encode())
    found = consumer.get_last_message_id()
    assert (found.ledger_id(), found.entry_id()) == (last.ledger_id(), last.entry_id())


def test_seek_by_message_id_and_by_time(pc: pulsar.Client) -> None:
    producer = pc.create_producer("seek", batching_enabled=False)
    ids = [producer.send(f"{i}".encode()) for i in range(5)]
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(5, 8):
        producer.send(f"{i}".encode())
    consumer = pc.subscribe("seek", "s", initial_position=Earliest)
    receive_all(consumer, 8)
    consumer.seek(ids[2])  # as in Pulsar, reading goes on after the id given
    assert [m.data() for m in receive_all(consumer, 5)] == [f"{i}".encode() for i in range(3, 8)]
    assert nothing_more(consumer)
    consumer.seek(middle_ms)
    assert [m.data() for m in receive_all(consumer, 3)] == [b"5", b"6", b"7"]


def test_negative_ack_redelivers_with_a_count(pc: pulsar.Client) -> None:
    producer = pc.create_producer("nack", batching_enabled=False)
    consumer = pc.subscribe("nack", "s", consumer_type=pulsar.ConsumerType.Shared,
                            negative_ack_redelivery_delay_ms=100)
    producer.send(b"again")
    first = consumer.receive(RECEIVE_TIMEOUT_MS)
    assert first.redelivery_count() == 0
    consumer.negative_acknowledge(first)
    second = consumer.receive(RECEIVE_TIMEOUT_MS)
    assert (second.data(), second.redelivery_count()) == (b"again", 1)
    consumer.acknowledge(second)


def test_ack_timeout_redelivers(pc: pulsar.Client) -> None:
    producer = pc.create_producer("acktimeout", batching_enabled=False)
    consumer = pc.subscribe("acktimeout", "s", consumer_type=pulsar.ConsumerType.Shared,
                            unacked_messages_timeout_ms=10_000)  # the client's minimum
    producer.send(b"late")
    assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"late"
    again = consumer.receive(3 * RECEIVE_TIMEOUT_MS)
    assert (again.data(), again.redelivery_count()) == (b"late", 1)
    consumer.acknowledge(again)


def test_dead_letter_policy_moves_a_message_after_its_redeliveries(pc: pulsar.Client,
                                                                   broker: tuple[str, str]) -> None:
    """The client's dead-letter producer asks for an initial subscription on the dead-letter
    topic: a consumer subscribing there later (at the latest position) still finds the message."""
    producer = pc.create_producer("dlq-source", batching_enabled=False)
    consumer = pc.subscribe("dlq-source", "s", consumer_type=pulsar.ConsumerType.Shared,
                            negative_ack_redelivery_delay_ms=100,
                            dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
                                max_redeliver_count=2, dead_letter_topic="dlq-target",
                                initial_subscription_name="kept"))
    producer.send(b"poison", properties={"p": "1"})
    counts = []
    for _ in range(3):
        message = consumer.receive(RECEIVE_TIMEOUT_MS)
        counts.append(message.redelivery_count())
        consumer.negative_acknowledge(message)
    assert counts == [0, 1, 2]
    assert nothing_more(consumer, 500)
    stats_url = f"{broker[0]}/admin/v2/persistent/public/default/dlq-target/stats"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the client moved the message
        stats = httpx.get(stats_url, timeout=10)
        if stats.status_code == 200 and stats.json()["subscriptions"].get("kept", {}).get("msgBacklog") == 1:
            break
        time.sleep(0.1)
    dlq = pc.subscribe("dlq-target", "kept")  # at the latest position: only an existing subscription holds it
    moved = dlq.receive(RECEIVE_TIMEOUT_MS)
    assert moved.data() == b"poison" and moved.properties()["p"] == "1"


def test_delayed_delivery_waits_for_its_time(pc: pulsar.Client) -> None:
    producer = pc.create_producer("delayed", batching_enabled=False)
    consumer = pc.subscribe("delayed", "s", consumer_type=pulsar.ConsumerType.Shared)
    sent_s = time.time()
    from datetime import timedelta
    producer.send(b"later", deliver_after=timedelta(milliseconds=1500))
    producer.send(b"now")
    assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"now"
    later = consumer.receive(RECEIVE_TIMEOUT_MS)
    assert later.data() == b"later" and time.time() - sent_s >= 1.4


def test_regex_subscription_picks_up_new_topics(pc: pulsar.Client) -> None:
    """The Python client checks ``pattern_auto_discovery_period`` but never passes it on, so the
    C++ library polls GET_TOPICS_OF_NAMESPACE every 60 s: the new topic shows up within that."""
    pc.create_producer("regex-a", batching_enabled=False).send(b"a")
    consumer = pc.subscribe(re.compile("public/default/regex-.*"), "s", initial_position=Earliest)
    assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"a"
    pc.create_producer("regex-b", batching_enabled=False).send(b"b")
    deadline = time.monotonic() + 90
    got = None
    while got is None and time.monotonic() < deadline:
        try:
            got = consumer.receive(1000)
        except pulsar.Timeout:
            continue
    assert got is not None and got.data() == b"b"


def test_dedup_across_a_reconnect(pc: pulsar.Client, broker: tuple[str, str]) -> None:
    producer = pc.create_producer("dedup", producer_name="writer", batching_enabled=False)
    for i in range(3):
        producer.send(f"{i}".encode(), sequence_id=i)
    assert producer.last_sequence_id() == 2
    producer.close()
    again = pc.create_producer("dedup", producer_name="writer", batching_enabled=False)
    assert again.last_sequence_id() == 2
    again.send(b"1-again", sequence_id=1)  # a resend the broker already holds: dropped
    again.send(b"3", sequence_id=3)
    consumer = pc.subscribe("dedup", "s", initial_position=Earliest)
    assert [m.data() for m in receive_all(consumer, 4)] == [b"0", b"1", b"2", b"3"]
    assert nothing_more(consumer)


def test_chunked_message_larger_than_the_maximum(pc: pulsar.Client) -> None:
    payload = bytes(range(256)) * (6 * 1024 * 1024 // 256 + 7)
    producer = pc.create_producer("chunked", chunking_enabled=True, batching_enabled=False)
    producer.send(payload)
    producer.send(b"small")
    consumer = pc.subscribe("chunked", "s", initial_position=Earliest)
    big = consumer.receive(RECEIVE_TIMEOUT_MS * 3)
    assert big.data() == payload
    consumer.acknowledge(big)
    assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"small"


def test_a_dcb_event_sent_in_chunks_is_refused_and_nothing_is_stored(pc: pulsar.Client) -> None:
    """Each chunk would be indexed and answered by DCB reads as an event of its own: a chunked
    message carrying ``dcb-type`` fails its send; a whole one after it is stored alone."""
    payload = b"e" * (6 * 1024 * 1024)
    producer = pc.create_producer("chunked-dcb", chunking_enabled=True, batching_enabled=False,
                                  send_timeout_millis=10_000)
    with pytest.raises(pulsar.PulsarException):
        producer.send(payload, properties={"dcb-type": "Big", "dcb-tags": '["t"]'})
    producer.send(b"whole", properties={"dcb-type": "Small", "dcb-tags": '["t"]'})
    consumer = pc.subscribe("chunked-dcb", "s", initial_position=Earliest)
    assert consumer.receive(RECEIVE_TIMEOUT_MS).data() == b"whole"
    assert nothing_more(consumer)


def test_exclusive_producer_access(pc: pulsar.Client) -> None:
    first = pc.create_producer("exclusive-producer", access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerFenced):
        pc.create_producer("exclusive-producer", access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        pc.create_producer("exclusive-producer")
    first.close()
    pc.create_producer("exclusive-producer", access_mode=pulsar.ProducerAccessMode.Exclusive).send(b"x")


def test_unsubscribe_removes_the_subscription(pc: pulsar.Client, broker: tuple[str, str]) -> None:
    import httpx
    consumer = pc.subscribe("unsub", "gone")
    consumer.unsubscribe()
    subscriptions = httpx.get(f"{broker[0]}/admin/v2/persistent/public/default/unsub/subscriptions", timeout=10)
    assert subscriptions.json() == []


def test_message_ids_are_pulsars_everywhere(pc: pulsar.Client, broker: tuple[str, str]) -> None:
    import httpx
    producer = pc.create_producer("ids", batching_enabled=False)
    sent = producer.send(b"x")
    last = httpx.get(f"{broker[0]}/admin/v2/persistent/public/default/ids/lastMessageId", timeout=10).json()
    assert (last["ledgerId"], last["entryId"]) == (sent.ledger_id(), sent.entry_id())


def _event_record(**fields: object) -> type:
    """A ``Record`` class named ``Event`` (Avro compares record names) with ``fields``."""
    from pulsar.schema import Integer, Record, String
    return type("Event", (Record,), {"name": String(), "count": Integer(), **fields})


def test_string_schema_round_trips_and_is_registered(pc: pulsar.Client, broker: tuple[str, str]) -> None:
    import httpx
    from pulsar.schema import StringSchema
    producer = pc.create_producer("schema-string", schema=StringSchema())
    consumer = pc.subscribe("schema-string", "s", schema=StringSchema())
    producer.send("héllo")
    assert consumer.receive(RECEIVE_TIMEOUT_MS).value() == "héllo"
    schema = httpx.get(f"{broker[0]}/admin/v2/schemas/public/default/schema-string/schema", timeout=10).json()
    assert (schema["type"], schema["version"]) == ("STRING", 0)


def test_json_schema_round_trips(pc: pulsar.Client) -> None:
    from pulsar.schema import JsonSchema
    event = _event_record()
    producer = pc.create_producer("schema-json", schema=JsonSchema(event))
    consumer = pc.subscribe("schema-json", "s", schema=JsonSchema(event))
    producer.send(event(name="a", count=1))
    value = consumer.receive(RECEIVE_TIMEOUT_MS).value()
    assert (value.name, value.count) == ("a", 1)


def test_avro_schema_evolves_compatibly_and_an_incompatible_one_is_refused(pc: pulsar.Client,
                                                                            broker: tuple[str, str]) -> None:
    import httpx
    from pulsar.schema import AvroSchema, String
    v1 = _event_record()
    producer = pc.create_producer("schema-avro", schema=AvroSchema(v1))
    consumer = pc.subscribe("schema-avro", "s", schema=AvroSchema(v1), initial_position=Earliest)
    producer.send(v1(name="first", count=1))
    assert consumer.receive(RECEIVE_TIMEOUT_MS).value().name == "first"
    v2 = _event_record(note=String(required_default=True))  # a field with a default: FULL-compatible
    pc.create_producer("schema-avro", schema=AvroSchema(v2)).send(v2(name="second", count=2, note="n"))
    assert consumer.receive(RECEIVE_TIMEOUT_MS).value().name == "second"
    v3 = _event_record(extra=String(required=True))  # a required field without default: not compatible
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer("schema-avro", schema=AvroSchema(v3))
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer("schema-avro", schema=pulsar.schema.StringSchema())
    versions = httpx.get(f"{broker[0]}/admin/v2/schemas/public/default/schema-avro/schemas", timeout=10).json()
    assert [v["version"] for v in versions["getSchemaResponses"]] == [0, 1]
    assert all(v["type"] == "AVRO" for v in versions["getSchemaResponses"])
