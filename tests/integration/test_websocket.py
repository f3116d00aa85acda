"""Pulsar's WebSocket API v2 against a real uvicorn server on an ephemeral port.

Checks, with a client written from Pulsar's docs (tests/integration/ws_client.py): produce and
consume for every subscription type, readers from earliest / latest / a message id, pull mode
with permits, negative acks and the dead-letter topic, server-side batching, multi-topic and
partitioned consumers, end of topic, and that bad frames and refused upgrades get clear errors
while writing nothing.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosedOK

from broker.message_id import MessageId
from broker.reader import StartPosition
from broker.service import BrokerService
from broker.topic_name import TopicName
from tests.integration.server import running_app, running_server, stored
from tests.integration.ws_client import (
    b64,
    open_ws,
    produce,
    receive,
    recv_frame,
    recv_nothing,
    refused_status,
    send_frame,
    unb64,
    ws_base,
)

NS = "persistent/public/default"
RECV_DEADLINE_S = 30.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, BrokerService]]:
    with running_server(str(tmp_path / "data")) as (url, service):
        # keep everything: readers hold no cursor, and test_min rolls ledgers every few entries
        service.namespaces.set_policy("public/default", "retention_policies",
                                      {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
        yield ws_base(url), service




def test_producer_frames_get_pulsar_results_with_ids_and_offsets(server: tuple[str, BrokerService]) -> None:
    url, service = server
    with open_ws(f"{url}/ws/v2/producer/{NS}/orders") as ws:
        results = produce(ws, [b"\x00binary\xff", "two", "three"], key="k1", properties={"a": "1"},
                          eventTime="2026-01-02T03:04:05.678Z")
    assert [r["result"] for r in results] == ["ok"] * 3
    assert [r["context"] for r in results] == ["0", "1", "2"]
    assert [r["offset"] for r in results] == [0, 1, 2]
    ids = [MessageId.from_base64(r["messageId"]) for r in results]
    assert len({(i.ledger_id, i.entry_id) for i in ids}) == 3 and all(i.batch_index == -1 for i in ids)
    assert stored(service, "orders") == [b"\x00binary\xff", b"two", b"three"]
    reader = service.subscriptions.reader("orders", StartPosition.earliest())
    first = reader.read_next()
    assert first is not None and first.message.key == "k1" and first.message.properties == {"a": "1"}
    assert first.message.event_time_ms == 1767323045678


def test_exclusive_consumer_receives_acks_and_resumes_after_reconnect(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    consumer_url = f"{url}/ws/v2/consumer/{NS}/events/sub?subscriptionType=Exclusive"
    with open_ws(consumer_url) as consumer:
        with open_ws(f"{url}/ws/v2/producer/{NS}/events") as producer:
            produce(producer, [f"m{i}" for i in range(6)], key="user-1", properties={"p": "v"})
        got = receive(consumer, 3)  # ack the first three only
        rest = receive(consumer, 3, ack=False)
        assert [unb64(m["payload"]) for m in got + rest] == [f"m{i}".encode() for i in range(6)]
        assert got[0]["key"] == "user-1" and got[0]["properties"] == {"p": "v"}
        assert got[0]["redeliveryCount"] == 0 and got[0]["publishTime"].endswith("Z")
        assert [m["offset"] for m in got + rest] == list(range(6))
        assert refused_status(consumer_url)[0] == 409  # Exclusive: a second consumer is refused
    with open_ws(consumer_url) as again:  # the unacked three come back; the acked ones never do
        back = receive(again, 3)
        assert [unb64(m["payload"]) for m in back] == [b"m3", b"m4", b"m5"]
        assert all(m["redeliveryCount"] == 1 for m in back)
        assert recv_nothing(again)


def test_shared_consumers_split_the_messages_without_overlap(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    sub = f"{url}/ws/v2/consumer/{NS}/work/pool?subscriptionType=Shared&receiverQueueSize=5"
    with open_ws(sub) as first, open_ws(sub) as second:
        with open_ws(f"{url}/ws/v2/producer/{NS}/work") as producer:
            produce(producer, [f"job{i}" for i in range(20)])
        seen: list[bytes] = []
        counts = [0, 0]
        deadline = time.monotonic() + RECV_DEADLINE_S
        while len(seen) < 20:
            assert time.monotonic() < deadline, f"only {len(seen)} of 20 messages arrived"
            for index, ws in enumerate((first, second)):
                try:
                    message = recv_frame(ws, timeout_s=0.2)
                except TimeoutError:
                    continue
                seen.append(unb64(message["payload"]))
                counts[index] += 1
                send_frame(ws, {"messageId": message["messageId"]})
        assert sorted(seen) == sorted(f"job{i}".encode() for i in range(20))
        assert min(counts) > 0  # both got work: receiverQueueSize=5 bounds each one's share in flight


def test_failover_switches_to_the_standby_without_loss(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    base = f"{url}/ws/v2/consumer/{NS}/fo/sub?subscriptionType=Failover"
    with open_ws(f"{base}&consumerName=b-standby") as standby:
        with open_ws(f"{base}&consumerName=a-active") as active:
            with open_ws(f"{url}/ws/v2/producer/{NS}/fo") as producer:
                produce(producer, [f"f{i}" for i in range(4)])
            assert [unb64(m["payload"]) for m in receive(active, 2)] == [b"f0", b"f1"]
            receive(active, 2, ack=False)
            assert recv_nothing(standby)
        taken_over = receive(standby, 2)
        assert [unb64(m["payload"]) for m in taken_over] == [b"f2", b"f3"]


def test_key_shared_keeps_each_key_on_one_consumer(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    sub = f"{url}/ws/v2/consumer/{NS}/keyed/ks?subscriptionType=Key_Shared"
    with open_ws(sub) as first, open_ws(sub) as second:
        with open_ws(f"{url}/ws/v2/producer/{NS}/keyed") as producer:
            for key in ("a", "b", "c", "d", "e", "f"):
                produce(producer, [f"{key}{i}" for i in range(3)], key=key)
        owner: dict[str, int] = {}
        received = 0
        deadline = time.monotonic() + RECV_DEADLINE_S
        while received < 18:
            assert time.monotonic() < deadline, f"only {received} of 18 messages arrived"
            for index, ws in enumerate((first, second)):
                try:
                    message = recv_frame(ws, timeout_s=0.2)
                except TimeoutError:
                    continue
                received += 1
                assert owner.setdefault(message["key"], index) == index
                send_frame(ws, {"messageId": message["messageId"]})
        assert len(owner) == 6


def test_pull_mode_delivers_exactly_the_permits_asked_for(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    with open_ws(f"{url}/ws/v2/consumer/{NS}/pull/sub?pullMode=true&subscriptionType=Shared") as consumer:
        with open_ws(f"{url}/ws/v2/producer/{NS}/pull") as producer:
            produce(producer, [f"p{i}" for i in range(10)])
        assert recv_nothing(consumer)
        send_frame(consumer, {"type": "permit", "permitMessages": 3})
        assert [unb64(m["payload"]) for m in receive(consumer, 3)] == [b"p0", b"p1", b"p2"]
        assert recv_nothing(consumer)  # acks do not grant more in pull mode
        send_frame(consumer, {"type": "permit", "permitMessages": 7})
        assert len(receive(consumer, 7)) == 7


def test_negative_ack_redelivers_then_dead_letters(server: tuple[str, BrokerService]) -> None:
    url, service = server
    consumer_url = (f"{url}/ws/v2/consumer/{NS}/flaky/sub?subscriptionType=Shared&negativeAckRedeliveryDelay=0"
                    f"&maxRedeliverCount=2&deadLetterTopic=persistent://public/default/flaky-dlq")
    with open_ws(consumer_url) as consumer:
        with open_ws(f"{url}/ws/v2/producer/{NS}/flaky") as producer:
            produce(producer, ["poison"])
        counts = []
        for _ in range(3):
            message = recv_frame(consumer)
            counts.append(message["redeliveryCount"])
            send_frame(consumer, {"type": "negativeAcknowledge", "messageId": message["messageId"]})
        assert counts == [0, 1, 2]
        assert recv_nothing(consumer)
    assert stored(service, "flaky-dlq") == [b"poison"]


def test_readers_start_where_asked_and_see_end_of_topic(server: tuple[str, BrokerService]) -> None:
    url, service = server
    with open_ws(f"{url}/ws/v2/producer/{NS}/log") as producer:
        results = produce(producer, [f"r{i}" for i in range(5)])
    with open_ws(f"{url}/ws/v2/reader/{NS}/log?messageId=earliest") as reader:
        assert [unb64(m["payload"]) for m in receive(reader, 5)] == [f"r{i}".encode() for i in range(5)]
    with open_ws(f"{url}/ws/v2/reader/{NS}/log?messageId={results[1]['messageId']}") as reader:
        assert [unb64(m["payload"]) for m in receive(reader, 3)] == [b"r2", b"r3", b"r4"]
    with open_ws(f"{url}/ws/v2/reader/{NS}/log") as reader:  # latest is the default
        assert recv_nothing(reader)
        send_frame(reader, {"type": "isEndOfTopic"})
        assert recv_frame(reader) == {"endOfTopic": False}
        service.topics.topic("log").ml.terminate()
        send_frame(reader, {"type": "isEndOfTopic"})
        assert recv_frame(reader) == {"endOfTopic": True}


def test_reader_flow_control_waits_for_acks(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    with open_ws(f"{url}/ws/v2/producer/{NS}/slow") as producer:
        produce(producer, [f"s{i}" for i in range(6)])
    with open_ws(f"{url}/ws/v2/reader/{NS}/slow?messageId=earliest&receiverQueueSize=2") as reader:
        first = receive(reader, 2, ack=False)
        assert recv_nothing(reader)  # two outstanding: the queue is full
        send_frame(reader, {"messageId": first[0]["messageId"]})
        assert unb64(recv_frame(reader)["payload"]) == b"s2"


def test_batching_producer_stores_frames_that_arrive_together_as_one_entry(
        server: tuple[str, BrokerService]) -> None:
    url, service = server
    with open_ws(f"{url}/ws/v2/producer/{NS}/batched?batchingEnabled=true&batchingMaxMessages=100") as ws:
        results = produce(ws, [f"b{i}" for i in range(300)])
    assert [r["offset"] for r in results] == list(range(300))
    ids = [MessageId.from_base64(r["messageId"]) for r in results]
    entries = {(i.ledger_id, i.entry_id) for i in ids}
    assert len(entries) < 300 and any(i.batch_index >= 0 for i in ids)
    assert stored(service, "batched") == [f"b{i}".encode() for i in range(300)]
    with open_ws(f"{url}/ws/v2/consumer/{NS}/batched/s?subscriptionInitialPosition=Earliest") as consumer:
        got = receive(consumer, 300)
    assert [m["offset"] for m in got] == list(range(300))


def test_partitioned_topic_and_multi_topic_consumers(server: tuple[str, BrokerService]) -> None:
    url, service = server
    service.topics.create_partitioned(TopicName.parse("parts"), 3)
    with open_ws(f"{url}/ws/v2/consumer/{NS}/parts/sub?subscriptionType=Shared") as consumer, \
            open_ws(f"{url}/ws/v3/consumer/multi?topics=persistent://public/default/m1,m2"
                    "&subscriptionType=Shared") as multi:
        with open_ws(f"{url}/ws/v2/producer/{NS}/parts") as producer:
            results = produce(producer, [f"k{i}" for i in range(9)], key=None)
        assert {MessageId.from_base64(r["messageId"]).partition for r in results} == {0, 1, 2}
        assert sorted(unb64(m["payload"]) for m in receive(consumer, 9)) == sorted(f"k{i}".encode() for i in range(9))
        for topic in ("m1", "m2"):
            with open_ws(f"{url}/ws/v2/producer/{NS}/{topic}") as producer:
                produce(producer, [topic])
        assert sorted(unb64(m["payload"]) for m in receive(multi, 2)) == [b"m1", b"m2"]


def test_unsubscribe_removes_the_subscription(server: tuple[str, BrokerService]) -> None:
    url, service = server
    with open_ws(f"{url}/ws/v2/consumer/{NS}/gone/sub") as consumer:
        send_frame(consumer, {"type": "unsubscribe"})
        with pytest.raises(ConnectionClosedOK):
            consumer.recv(timeout=10)
    assert "sub" not in service.topics.topic("gone").cursors.names()


def test_bad_frames_get_send_errors_and_write_nothing(server: tuple[str, BrokerService]) -> None:
    url, service = server
    with open_ws(f"{url}/ws/v2/producer/{NS}/strict") as ws:
        bad_frames: list[tuple[str, str]] = [
            ("not json", "send-error:3"),
            ("[1, 2]", "send-error:3"),
            (json.dumps({"payload": "%%%not-base64", "context": "c1"}), "send-error:7"),
            (json.dumps({"payload": 12, "context": "c2"}), "send-error:7"),
            (json.dumps({"payload": b64("x"), "eventTime": "yesterday", "context": "c3"}), "send-error:7"),
            (json.dumps({"payload": b64("x"), "properties": {"a": 1}, "context": "c4"}), "send-error:3"),
            (json.dumps({"payload": b64("x"), "deliverAfterMs": -5, "context": "c5"}), "send-error:3"),
            (json.dumps({"payload": b64("x" * (5 * 1024 * 1024 + 1)), "context": "big"}), "send-error:8"),
        ]
        for text, expected in bad_frames:
            ws.send(text)
            answer = recv_frame(ws)
            assert answer["result"] == expected, (text[:60], answer)
            assert answer["errorMsg"]
        assert produce(ws, ["fine"])[0]["result"] == "ok"  # the session survives bad frames
    assert stored(service, "strict") == [b"fine"]


def test_consumer_bad_frames_get_error_frames(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    with open_ws(f"{url}/ws/v2/consumer/{NS}/acks/sub?pullMode=true") as consumer:
        for frame in ("{", json.dumps({"messageId": "@@@"}), json.dumps({"type": "permit", "permitMessages": -1}),
                      json.dumps({"messageId": b64(b"\xff\xff")}), json.dumps({"messageId": 5})):
            consumer.send(frame)
            answer = recv_frame(consumer)
            assert answer["result"].startswith("error:") and answer["errorMsg"], answer
        send_frame(consumer, {"type": "permit", "permitMessages": 1})  # still usable
        with open_ws(f"{url}/ws/v2/producer/{NS}/acks") as producer:
            produce(producer, ["after"])
        assert unb64(recv_frame(consumer)["payload"]) == b"after"


@pytest.mark.parametrize(("path", "status"), [
    (f"/ws/v2/producer/{NS}/bad$topic", 400),
    (f"/ws/v2/producer/{NS}/t?maxPendingMessages=lots", 400),
    (f"/ws/v2/producer/{NS}/t?compressionType=BROTLI", 400),
    (f"/ws/v2/consumer/{NS}/t/sub?subscriptionType=Sometimes", 400),
    (f"/ws/v2/consumer/{NS}/t/sub?receiverQueueSize=-1", 400),
    (f"/ws/v2/consumer/{NS}/t/bad%24sub", 400),
    (f"/ws/v2/reader/{NS}/t?messageId=not-an-id", 400),
    ("/ws/v2/producer/persistent/nosuch/ns/t", 404),
    ("/ws/v3/consumer/sub?topics=a&topicsPattern=b.*", 400),
    ("/ws/v2/nothing/here", 404),
])
def test_refused_upgrades_answer_with_http_errors(server: tuple[str, BrokerService], path: str, status: int) -> None:
    url, _ = server
    got_status, body = refused_status(url + path)
    assert got_status == status
    assert body["code"] and body["message"]


def test_a_forced_subscription_delete_closes_the_consumer_session(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    with open_ws(f"{url}/ws/v2/consumer/{NS}/doomed/sub") as consumer:
        http_url = url.replace("ws://", "http://", 1)
        response = httpx.delete(f"{http_url}/admin/v2/{NS}/doomed/subscription/sub?force=true", timeout=30)
        assert response.status_code == 204, response.text
        with pytest.raises(ConnectionClosedOK) as closed:
            consumer.recv(timeout=10)
        assert closed.value.rcvd is not None and "subscription deleted" in closed.value.rcvd.reason


def test_plain_http_on_websocket_paths_gets_426_and_the_paths_are_documented(
        server: tuple[str, BrokerService]) -> None:
    url, _ = server
    http_url = url.replace("ws://", "http://", 1)
    response = httpx.get(f"{http_url}/ws/v2/consumer/{NS}/t/sub", timeout=30)
    assert response.status_code == 426 and response.json()["code"] == "upgrade_required"
    paths = httpx.get(f"{http_url}/openapi.json", timeout=30).json()["paths"]
    for path in ("/ws/v2/producer/persistent/{tenant}/{namespace}/{topic}",
                 "/ws/v2/consumer/persistent/{tenant}/{namespace}/{topic}/{subscription}",
                 "/ws/v3/consumer/{subscription}", "/ws/v2/reader/persistent/{tenant}/{namespace}/{topic}"):
        operation = paths[path]["get"]
        assert "WebSocket" in operation["summary"] and "?" not in operation["summary"]
        assert "query" in operation["description"].lower() or "?topics=" in operation["description"]


def test_a_burst_of_mixed_frames_is_answered_frame_by_frame_in_order(server: tuple[str, BrokerService]) -> None:
    """Frames sent without waiting reach the broker in groups (each frame its own entry, at most
    maxPendingMessages of them unanswered); bad frames, delayed messages and conditional appends
    among them are answered in their place."""
    url, service = server
    frames: list[str] = []
    expected: list[str] = []  # per frame: "ok", or the send-error code
    stored_payloads: list[bytes] = []
    for i in range(150):
        context = f"c{i}"
        if i % 19 == 5:
            frames.append("not json")
            expected.append("send-error:3")
        elif i % 19 == 9:
            frames.append(json.dumps({"payload": "%%%", "context": context}))
            expected.append("send-error:7")
        elif i % 19 == 13:  # a conditional append that holds: the offset it expects is the next one
            frames.append(json.dumps({"payload": b64(context), "context": context,
                                      "expectedOffset": len(stored_payloads)}))
            expected.append("ok")
            stored_payloads.append(context.encode())
        elif i % 19 == 15:  # one that does not: an offset already taken
            frames.append(json.dumps({"payload": b64(context), "context": context, "expectedOffset": 0}))
            expected.append("send-error:8")
        elif i % 19 == 17:
            frames.append(json.dumps({"payload": b64(context), "context": context, "deliverAfterMs": 1}))
            expected.append("ok")
            stored_payloads.append(context.encode())
        else:
            frames.append(json.dumps({"payload": b64(context), "context": context}))
            expected.append("ok")
            stored_payloads.append(context.encode())
    with open_ws(f"{url}/ws/v2/producer/{NS}/burst?maxPendingMessages=7") as ws:
        for text in frames:
            ws.send(text)
        answers = [recv_frame(ws) for _ in frames]
    assert [a["result"] for a in answers] == expected
    contexts = [a.get("context") for a, e in zip(answers, frames, strict=True) if e != "not json"]
    assert contexts == [json.loads(f)["context"] for f in frames if f != "not json"]
    offsets = [a["offset"] for a in answers if a["result"] == "ok"]
    assert offsets == list(range(len(stored_payloads)))
    ids = [MessageId.from_base64(a["messageId"]) for a in answers if a["result"] == "ok"]
    assert len({(i.ledger_id, i.entry_id) for i in ids}) == len(ids)  # each frame its own entry
    assert stored(service, "burst") == stored_payloads


def test_an_upgrade_on_a_connection_that_served_a_request_is_answered_426(
        server: tuple[str, BrokerService]) -> None:
    """Only a connection's first request is handed to the WebSocket edge; an upgrade on a
    kept-alive connection after another request is plain HTTP, answered 426 with its reason."""
    url, _ = server
    host, port = url.removeprefix("ws://").split(":")
    upgrade = (f"GET /ws/v2/reader/{NS}/t HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=RECV_DEADLINE_S) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = _http_answer(sock)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(upgrade)
        second = _http_answer(sock)
    assert second.startswith(b"HTTP/1.1 426 ") and b'"upgrade_required"' in second


def _http_answer(sock: socket.socket) -> bytes:
    """One HTTP answer (its head and a body of its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, body
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_websocket_connection_holds_its_place_in_the_connection_guard_until_it_ends(tmp_path: Path) -> None:
    """An upgraded connection counts against ``maxHttpServerConnections`` like any other, and is
    released once it is lost, whether it was accepted or refused."""
    with running_app(str(tmp_path / "data")) as (url, app, _):
        guard = app.state.connection_guard

        def settles_at(count: int) -> bool:
            deadline = time.monotonic() + RECV_DEADLINE_S
            while guard.statistics().open_connections != count:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
            return True

        base = guard.statistics().open_connections
        with open_ws(f"{ws_base(url)}/ws/v2/reader/{NS}/guarded"):
            assert settles_at(base + 1)
        assert settles_at(base)
        assert refused_status(f"{ws_base(url)}/ws/v2/reader/{NS}/guarded?messageId=nonsense")[0] == 400
        assert settles_at(base)
