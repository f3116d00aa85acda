"""One broker face for every transport: the rules a user meets are the same on every edge.

Against a real server:

- a batching WebSocket producer on a partitioned topic routes each batch once: a burst of
  keyless messages makes few entries, every entry's messages sit in one partition, and all are
  consumed exactly once; keyed messages stay on their key's partition, in order;
- names follow one rule, stated in every refusal, which never shows an internal path;
- every error names a topic as ``persistent://tenant/namespace/topic``;
- a field a request shape does not know is refused naming it, so a misplaced
  ``expectedOffset`` is never silently ignored; ``expectedOffset`` works in WebSocket frames and
  from the Python client; event times are epoch ms or ISO-8601 on every produce path;
- every JSON message carries ISO-8601 ``publishTime``;
- a malformed message id is refused without a parser's internals.
"""

from __future__ import annotations

import base64
import collections
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from broker import BrokerService, MessageId, TopicName
from consumers.client import Client, SendError
from tests.integration.server import running_server
from tests.integration.ws_client import b64, open_ws, produce, recv_frame, send_frame, unb64, ws_base

WAIT_S = 30.0
BURST = 2000
PARTITIONS = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BrokerService]]:
    with running_server(str(tmp_path_factory.mktemp("face") / "data")) as (url, service):
        service.namespaces.set_policy("public/default", "retention_policies", {"retentionTimeInMinutes": -1,
                                                                               "retentionSizeInMB": -1})
        yield url, service


def _burst(url: str, topic: str, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every frame at once (pipelined) to a batching producer; the results in order. A
    batch holds at most a tenth of the burst, so there are at least ten however the frames
    arrive (on a loaded machine a whole burst may be waiting when a batch is cut)."""
    with open_ws(f"{ws_base(url)}/ws/v2/producer/persistent/public/default/{topic}?batchingEnabled=true"
                 f"&batchingMaxMessages={BURST // 10}&maxPendingMessages={BURST}") as producer:
        for index, frame in enumerate(frames):
            send_frame(producer, {**frame, "context": str(index)})
        return [recv_frame(producer, WAIT_S) for _ in frames]


def _consume_all(url: str, topic: str, count: int) -> list[dict[str, Any]]:
    with open_ws(f"{ws_base(url)}/ws/v2/consumer/persistent/public/default/{topic}/all"
                 "?subscriptionInitialPosition=Earliest&subscriptionType=Shared") as consumer:
        got = []
        for _ in range(count):
            message = recv_frame(consumer, WAIT_S)
            got.append(message)
            send_frame(consumer, {"messageId": message["messageId"]})
        assert _nothing_more(consumer)
        return got


def _nothing_more(ws: Any) -> bool:
    try:
        ws.recv(timeout=1.0)
    except TimeoutError:
        return True
    return False


def _entries(results: list[dict[str, Any]]) -> dict[tuple[int, int], set[int]]:
    """(ledger, entry) → the partitions the messages stored in that entry report."""
    entries: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    for result in results:
        assert result["result"] == "ok", result
        message_id = MessageId.from_base64(result["messageId"])
        entries[(message_id.ledger_id, message_id.entry_id)].add(message_id.partition)
    return entries


def test_a_batching_producer_routes_each_batch_once(served: tuple[str, BrokerService]) -> None:
    url, service = served
    service.topics.create_partitioned(TopicName.parse("batched"), PARTITIONS)
    results = _burst(url, "batched", [{"payload": b64(f"m{i}")} for i in range(BURST)])
    entries = _entries(results)
    assert len(entries) <= BURST // 10, f"{len(entries)} entries for {BURST} messages: batches were split"
    assert all(len(partitions) == 1 for partitions in entries.values())
    assert len({p for partitions in entries.values() for p in partitions}) > 1  # round-robin across batches
    consumed = sorted(unb64(m["payload"]).decode() for m in _consume_all(url, "batched", BURST))
    assert consumed == sorted(f"m{i}" for i in range(BURST))


def test_keyed_messages_stay_on_their_partition_in_order(served: tuple[str, BrokerService]) -> None:
    url, service = served
    service.topics.create_partitioned(TopicName.parse("keyed-batches"), PARTITIONS)
    frames = [{"payload": b64(f"k{i % 20}:{i}"), "key": f"k{i % 20}"} for i in range(BURST)]
    results = _burst(url, "keyed-batches", frames)
    entries = _entries(results)
    assert len(entries) < BURST // 2 and all(len(p) == 1 for p in entries.values())
    partition_of_key: dict[str, set[int]] = collections.defaultdict(set)
    sequence: dict[str, list[int]] = collections.defaultdict(list)
    for partition in range(PARTITIONS):
        path = f"/topics/persistent/public/default/keyed-batches/partitions/{partition}/messages"
        body = httpx.get(f"{url}{path}", params={"offset": 0, "maxMessages": BURST}, timeout=WAIT_S).json()
        for message in body["messages"]:
            key, number = base64.b64decode(message["payload"]).decode().split(":")
            partition_of_key[key].add(partition)
            sequence[key].append(int(number))
    assert all(len(p) == 1 for p in partition_of_key.values())
    assert all(numbers == sorted(numbers) and len(numbers) == BURST // 20 for numbers in sequence.values())


@pytest.mark.parametrize("local_name", [".", "..", "has%pct", "x" * 600, "x-partition-²", "x-partition-٣", "sp ace"])
def test_names_follow_one_rule_stated_in_every_refusal(served: tuple[str, BrokerService], local_name: str) -> None:
    url, service = served
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        quoted = httpx.URL(f"/topics/persistent/public/default/{local_name}").raw_path.decode()
        answer = http.post(quoted, json={"messages": [{"payload": "x"}]})
        assert answer.status_code in (400, 404), answer.text  # "." and ".." are path segments to HTTP
        if answer.status_code == 400:
            body = answer.json()
            assert body["code"] == "invalid_request"
            assert "ASCII letters, digits and - _ = : ." in body["message"]
            assert "/managed-ledgers" not in body["message"] and "/admin/" not in body["message"]
    with pytest.raises(Exception, match="ASCII letters, digits"):
        TopicName.of("public", "default", local_name)
    assert not any(local_name in name for name in service.topics.names("public/default"))


def test_subscription_names_follow_the_same_rule_everywhere(served: tuple[str, BrokerService]) -> None:
    url, _ = served
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        pulled = http.post("/topics/persistent/public/default/subs/subscription/bad%25name/pull")
        created = http.put("/admin/v2/persistent/public/default/subs/subscription/bad%25name")
    for answer in (pulled, created):
        assert answer.status_code == 400 and "ASCII letters, digits" in answer.json()["message"], answer.text


def test_errors_name_topics_as_users_spell_them(served: tuple[str, BrokerService]) -> None:
    url, _ = served
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        assert http.post("/topics/persistent/public/default/term1", json={"messages": [{"payload": "x"}]}).is_success
        assert http.post("/admin/v2/persistent/public/default/term1/terminate").is_success
        refused = http.post("/topics/persistent/public/default/term1", json={"messages": [{"payload": "y"}]})
    assert refused.status_code == 409
    assert "persistent://public/default/term1" in refused.json()["message"]


def test_an_unknown_field_is_refused_by_name(served: tuple[str, BrokerService]) -> None:
    url, service = served
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        misplaced = http.post("/topics/persistent/public/default/strict",
                              json={"messages": [{"payload": "x", "expectedOffset": 5}]})
        assert misplaced.status_code == 400 and "expectedOffset" in misplaced.json()["message"]
        top = http.post("/topics/persistent/public/default/strict", json={"messages": [{"payload": "x"}], "nope": 1})
        assert top.status_code == 400 and "nope" in top.json()["message"]
    with open_ws(f"{ws_base(url)}/ws/v2/producer/persistent/public/default/strict") as producer:
        answer = produce(producer, [b"x"], unknownField=1)[0]
        assert answer["result"] == "send-error:3" and "unknownField" in answer["errorMsg"]
    assert service.admin.offsets(TopicName.parse("strict"), None)["persistent://public/default/strict"]["next"] == 0


def test_expected_offset_works_in_frames_and_in_the_client(served: tuple[str, BrokerService]) -> None:
    url, _ = served
    with open_ws(f"{ws_base(url)}/ws/v2/producer/persistent/public/default/conditional") as producer:
        first = produce(producer, [b"a"], expectedOffset=0)[0]
        assert first["result"] == "ok" and first["offset"] == 0
        clash = produce(producer, [b"b"], expectedOffset=0)[0]
        assert clash["result"] == "send-error:8" and clash["errorCode"] == "offset_mismatch"
    with Client(url) as client:
        producer_handle = client.create_producer("conditional")
        assert producer_handle.send(b"c", expected_offset=1).offset == 1
        with pytest.raises(SendError) as refused:
            producer_handle.send(b"d", expected_offset=1)
        assert refused.value.code == "offset_mismatch"
        producer_handle.close()


def test_event_times_and_publish_times_have_one_format_per_shape(served: tuple[str, BrokerService]) -> None:
    url, _ = served
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        answer = http.post("/topics/persistent/public/default/times", json={"messages": [
            {"payload": "iso", "eventTime": "2023-11-14T22:13:20.123Z"},
            {"payload": "ms", "eventTime": 1700000000123}]})
        assert answer.status_code == 200, answer.text
        read = http.get("/topics/persistent/public/default/times/messages", params={"offset": 0}).json()["messages"]
        pulled = http.post("/topics/persistent/public/default/times/subscription/s/pull",
                           params={"subscriptionInitialPosition": "Earliest"}).json()["messages"]
    with open_ws(f"{ws_base(url)}/ws/v2/reader/persistent/public/default/times?messageId=earliest") as reader:
        streamed = [recv_frame(reader, WAIT_S) for _ in range(2)]
    for message in (*read, *pulled, *streamed):
        assert message["eventTime"] == "2023-11-14T22:13:20.123Z"
        assert message["publishTime"].endswith("Z") and "T" in message["publishTime"]
    assert all(m["eventTimeMs"] == 1700000000123 for m in read)  # epoch ms under its own name


def test_a_malformed_message_id_is_refused_without_parser_internals(served: tuple[str, BrokerService]) -> None:
    url, _ = served
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        http.post("/topics/persistent/public/default/ids", json={"messages": [{"payload": "x"}]})
        answer = http.get("/topics/persistent/public/default/ids/offsetOf",
                          params={"messageId": base64.b64encode(b"\xff\xff\xff").decode()})
    assert answer.status_code == 400
    text = json.dumps(answer.json())
    assert "MessageIdData" in text and "Error parsing" not in text and "DecodeError" not in text
