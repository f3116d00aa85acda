"""Bad input on the binary protocol, byte by byte, against a real ``magnetar standalone``.

Each class of bad input has its own test with the answer Pulsar's broker gives (the connection
closed, or an error command and the connection goes on); then a seeded fuzz sends mutated
sessions (truncated frames, wrong sizes, wrong checksums, unknown commands, commands out of
order, ids of other connections' producers and consumers, garbage that checksums correctly)
and checks after every case that the broker still serves and that no topic was corrupted.
``MAGNETAR_FUZZ_SEED`` replays one seed.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator

import httpx
import pulsar
import pytest

from api.pulsar.framing import command_frame
from api.pulsar.proto import pulsar_api_pb2 as pb
from tests.integration.pulsar_support import RECEIVE_TIMEOUT_MS, binary_broker, client
from tests.integration.pulsar_wire import RawConnection, T, command, entry, send_frame

FUZZ_CASES = int(os.environ.get("MAGNETAR_FUZZ_CASES", "150"))
TOPIC = "persistent://public/default/fuzzed"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with binary_broker(tmp_path_factory.mktemp("framing")) as (http_url, pulsar_url, _):
        yield http_url, int(pulsar_url.rsplit(":", 1)[1])


def open_producer(conn: RawConnection, producer_id: int = 1, topic: str = TOPIC) -> pb.BaseCommand:
    conn.send_command(command(T.PRODUCER, producer={"topic": topic, "producer_id": producer_id, "request_id": 1}))
    return conn.expect(T.PRODUCER_SUCCESS, T.ERROR)


def test_handshake_negotiates_the_lower_protocol_version(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        connected = conn.connect(protocol_version=21)
        assert connected.type == T.CONNECTED
        assert connected.connected.protocol_version == 19
        assert connected.connected.max_message_size == 5 * 1024 * 1024
    with RawConnection(broker[1]) as conn:
        assert conn.connect(protocol_version=6).connected.protocol_version == 6


def test_a_command_before_connect_closes_the_connection(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.send_command(command(T.PRODUCER, producer={"topic": TOPIC, "producer_id": 1, "request_id": 1}))
        assert conn.closes()


def test_a_second_connect_closes_the_connection(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        conn.send_command(command(T.CONNECT, connect={"client_version": "again"}))
        assert conn.closes()


def test_ping_is_answered_with_pong(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        conn.send_command(command(T.PING, ping={}))
        assert conn.expect(T.PONG).type == T.PONG


def test_a_frame_above_the_bound_closes_the_connection(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        conn.send(struct.pack(">I", 64 * 1024 * 1024))  # only the header: refused before any body
        assert conn.closes()


def test_a_command_size_larger_than_its_frame_closes_the_connection(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        conn.send(struct.pack(">II", 8, 1000) + b"\x08\x12\x92\x01\x00")
        assert conn.closes()


def test_an_unknown_command_type_closes_the_connection(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        body = b"\x08\xe7\x07"  # type = 999
        conn.send(struct.pack(">II", 4 + len(body), len(body)) + body)
        assert conn.closes()


def test_a_wrong_checksum_is_answered_with_send_error_and_stores_nothing(broker: tuple[str, int]) -> None:
    topic = "persistent://public/default/checksums"
    with RawConnection(broker[1]) as conn:
        conn.connect()
        assert open_producer(conn, topic=topic).type == T.PRODUCER_SUCCESS
        conn.send(send_frame(1, 0, entry(b"broken", corrupt_checksum=True)))
        error = conn.expect(T.SEND_ERROR)
        assert error.send_error.error == pb.ChecksumError
        conn.send(send_frame(1, 1, entry(b"fine", sequence_id=1)))
        receipt = conn.expect(T.SEND_RECEIPT)
        assert receipt.send_receipt.sequence_id == 1
    messages = httpx.get(f"{broker[0]}/topics/persistent/public/default/checksums/messages",
                         params={"offset": 0}, timeout=10).json()["messages"]
    assert len(messages) == 1


def test_close_producer_is_answered_after_the_receipts_of_its_sends(broker: tuple[str, int]) -> None:
    """As Pulsar's broker: sends still being stored are answered before the close's SUCCESS, so
    no receipt names a producer the client already forgot."""
    with RawConnection(broker[1]) as conn:
        conn.connect()
        open_producer(conn, topic="persistent://public/default/close-after-sends")
        conn.send(b"".join(send_frame(1, i, entry(f"{i}".encode(), sequence_id=i)) for i in range(50)) +
                  command_frame(command(T.CLOSE_PRODUCER, close_producer={"producer_id": 1, "request_id": 2})))
        answers = [conn.expect(T.SEND_RECEIPT, T.SUCCESS) for _ in range(51)]
    assert [a.type for a in answers] == [T.SEND_RECEIPT] * 50 + [T.SUCCESS]
    assert [a.send_receipt.sequence_id for a in answers[:50]] == list(range(50))


def test_garbage_with_a_correct_checksum_is_refused(broker: tuple[str, int]) -> None:
    import crc32c
    garbage = b"\xff" * 20
    size = struct.pack(">I", 7)
    data = struct.pack(">HI", 0x0E01, crc32c.crc32c(size + garbage)) + size + garbage
    with RawConnection(broker[1]) as conn:
        conn.connect()
        open_producer(conn, topic="persistent://public/default/garbage")
        conn.send(send_frame(1, 0, data))
        assert conn.expect(T.SEND_ERROR).send_error.error == pb.ChecksumError


def test_a_send_for_a_producer_this_connection_did_not_open_closes_it(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as owner, RawConnection(broker[1]) as other:
        owner.connect()
        other.connect()
        assert open_producer(owner, producer_id=7).type == T.PRODUCER_SUCCESS
        other.send(send_frame(7, 0, entry(b"not mine")))
        assert other.closes()
        owner.send(send_frame(7, 0, entry(b"mine")))
        assert owner.expect(T.SEND_RECEIPT).send_receipt.sequence_id == 0


def test_commands_for_a_consumer_this_connection_did_not_open_are_refused(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        conn.send_command(command(T.FLOW, flow={"consumer_id": 42, "messagePermits": 10}))  # ignored, as Pulsar
        conn.send_command(command(T.ACK, ack={"consumer_id": 42, "ack_type": 0, "request_id": 5}))
        response = conn.expect(T.ACK_RESPONSE)
        assert response.ackResponse.HasField("error")
        conn.send_command(command(T.SEEK, seek={"consumer_id": 42, "request_id": 6}))
        assert conn.expect(T.ERROR).error.request_id == 6


def test_an_unsupported_request_is_answered_with_an_error(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        conn.send(_raw_command(T.NEW_TXN, 50, b"\x08\x07"))  # transactions: not served, request 7 answered
        error = conn.expect(T.ERROR)
        assert (error.error.request_id, error.error.error) == (7, pb.NotAllowedError)
        conn.send_command(command(T.PING, ping={}))
        assert conn.expect(T.PONG).type == T.PONG


def test_a_command_only_a_broker_sends_closes_the_connection(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        body = pb.BaseCommand(type=T.ERROR)
        body.error.request_id, body.error.error, body.error.message = 3, pb.UnknownError, "x"
        conn.send_command(body)
        assert conn.closes()


def _raw_command(kind: int, field_number: int, body: bytes) -> bytes:
    """A frame whose command has ``type`` and a body in field ``field_number`` (for commands the
    test proto module does not model)."""
    data = b"\x08" + bytes([kind]) + bytes([(field_number << 3 | 2) & 0x7F | 0x80, field_number >> 4]) \
        + bytes([len(body)]) + body
    return struct.pack(">II", 4 + len(data), len(data)) + data


def test_a_lookup_of_a_bad_topic_name_fails_without_closing(broker: tuple[str, int]) -> None:
    with RawConnection(broker[1]) as conn:
        conn.connect()
        conn.send_command(command(T.LOOKUP, lookupTopic={"topic": "persistent://no such/name", "request_id": 9}))
        response = conn.expect(T.LOOKUP_RESPONSE)
        assert response.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed
        conn.send_command(command(T.PING, ping={}))
        assert conn.expect(T.PONG).type == T.PONG


# --- seeded fuzz ------------------------------------------------------------------------
def _valid_session(rng: random.Random, case: int) -> list[bytes]:
    """A plausible session: connect, produce a few messages, subscribe, flow, ack."""
    frames = [command_frame(command(T.CONNECT, connect={"client_version": "fuzz", "protocol_version": 19})),
              command_frame(command(T.PRODUCER, producer={"topic": TOPIC, "producer_id": 1, "request_id": 1,
                                                          "producer_name": f"fuzz-{case}"}))]
    frames += [send_frame(1, seq, entry(rng.randbytes(rng.randrange(1, 64)), producer=f"fuzz-{case}",
                                        sequence_id=seq)) for seq in range(rng.randrange(1, 4))]
    frames.append(command_frame(command(T.SUBSCRIBE, subscribe={
        "topic": TOPIC, "subscription": "fuzz", "subType": 1, "consumer_id": 1, "request_id": 2})))
    frames.append(command_frame(command(T.FLOW, flow={"consumer_id": 1, "messagePermits": 10})))
    return frames


def _mutate(rng: random.Random, frames: list[bytes]) -> tuple[str, bytes]:
    kind = rng.choice(["truncate", "flip", "size", "checksum", "unknown", "order", "foreign", "garbage"])
    data = list(frames)
    if kind == "truncate":
        joined = b"".join(data)
        return kind, joined[: rng.randrange(1, len(joined))]
    if kind == "flip":
        target = rng.randrange(len(data))
        raw = bytearray(data[target])
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        data[target] = bytes(raw)
    elif kind == "size":
        target = rng.randrange(len(data))
        raw = bytearray(data[target])
        raw[0:4] = struct.pack(">I", rng.choice([0, 1, 3, len(raw) + rng.randrange(1, 100), 0xFFFFFFFF]))
        data[target] = bytes(raw)
    elif kind == "checksum":
        data.insert(3, send_frame(1, 99, entry(b"bad", corrupt_checksum=True)))
    elif kind == "unknown":
        body = struct.pack(">B", 0x08) + bytes([rng.randrange(69, 127)])
        data.insert(rng.randrange(len(data) + 1), struct.pack(">II", 4 + len(body), len(body)) + body)
    elif kind == "order":
        rng.shuffle(data)
    elif kind == "foreign":
        data.insert(2, send_frame(rng.randrange(2, 1000), 0, entry(b"foreign")))
    else:
        data.insert(rng.randrange(1, len(data) + 1), rng.randbytes(rng.randrange(1, 200)))
    return kind, b"".join(data)


def _fuzz_one(port: int, seed: int) -> str:
    rng = random.Random(seed)
    kind, data = _mutate(rng, _valid_session(rng, seed))
    with RawConnection(port) as conn:
        try:
            conn.send(data)
        except OSError:
            return kind  # closed while we were still sending: a refusal
        try:
            while (got := conn.next(0.3)) is not None:
                assert got.type != T.SEND_RECEIPT or got.send_receipt.message_id.ledgerId < (1 << 63)
        except TimeoutError:
            pass  # the connection is still open, waiting for more: fine
    return kind


def test_seeded_fuzz_never_crashes_the_broker_or_corrupts_a_topic(broker: tuple[str, int]) -> None:
    http_url, port = broker
    c = client(f"pulsar://127.0.0.1:{port}")
    try:
        control = c.create_producer("control", batching_enabled=False)
        for i in range(5):
            control.send(f"before-{i}".encode())
        seeds = [int(os.environ["MAGNETAR_FUZZ_SEED"])] if "MAGNETAR_FUZZ_SEED" in os.environ else range(FUZZ_CASES)
        kinds: set[str] = set()
        for seed in seeds:
            try:
                kinds.add(_fuzz_one(port, seed))
                assert httpx.get(f"{http_url}/healthz", timeout=10).status_code == 200
            except AssertionError as exc:
                raise AssertionError(f"fuzz seed {seed} failed (replay: MAGNETAR_FUZZ_SEED={seed}): {exc}") from exc
        if "MAGNETAR_FUZZ_SEED" not in os.environ:
            assert kinds == {"truncate", "flip", "size", "checksum", "unknown", "order", "foreign", "garbage"}
        for i in range(5, 8):
            control.send(f"after-{i}".encode())
        reader = c.create_reader("control", pulsar.MessageId.earliest)
        assert [reader.read_next(RECEIVE_TIMEOUT_MS).data() for _ in range(8)] == \
            [*(f"before-{i}".encode() for i in range(5)), *(f"after-{i}".encode() for i in range(5, 8))]
        fuzzed = c.create_reader("fuzzed", pulsar.MessageId.earliest)
        count = 0
        while fuzzed.has_message_available():
            fuzzed.read_next(RECEIVE_TIMEOUT_MS)
            count += 1
        stored = httpx.get(f"{http_url}/topics/persistent/public/default/fuzzed/offsets", timeout=10).json()
        assert count == stored["offsets"][TOPIC]["next"] > 0  # every stored message reads back
    finally:
        c.close()
