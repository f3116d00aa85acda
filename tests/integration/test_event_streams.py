"""Event streams over HTTP and WebSocket, against a real uvicorn server with real clients.

Two writers race on one key with the same expected version, 1,000 rounds over REST and 1,000
over WebSocket: exactly one wins each round, the other is refused (409 ``key_version_mismatch``
or ``send-error``) with the current version, and the key's stream ends up with no gap and no
duplicate. A multi-key request is all-or-nothing. Stream reads go forwards and backwards from
any version with limits, as JSON and Arrow, on partitioned and unpartitioned topics across
ledger rollovers, and after retention trimmed the oldest versions (410 with the first version
kept). A live key reader gets its catch-up, then new appends of its key only, in order. Bad
input is a 400 with ``{code, message}``.
"""

from __future__ import annotations

import base64
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from api.rest_read import ARROW_STREAM_MEDIA_TYPE
from broker import KEY_BYTES_MAX
from broker.service import BrokerConfig, BrokerService
from broker.topic_name import TopicName
from tests.integration.server import running_server
from tests.integration.ws_client import b64, open_ws, recv_frame, refused_status, send_frame, unb64, ws_base

ROUNDS = 1000
TOPIC = "public/default/accounts"
TOPIC_URL = f"/topics/persistent/{TOPIC}"
KEEP_NOTHING = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
BARRIER_TIMEOUT_S = 30.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, BrokerService]]:
    with running_server(str(tmp_path / "data"), BrokerConfig.test_min()) as running:
        yield running


def key_url(key: str, topic_url: str = TOPIC_URL) -> str:
    return f"{topic_url}/keys/{urllib.parse.quote(key, safe='')}"


def append_request(key: str, payloads: list[str], expected: int | str | None, producer: str = "w") -> dict[str, Any]:
    body: dict[str, Any] = {"producerName": producer, "messages": [{"payload": p, "key": key} for p in payloads]}
    if expected is not None:
        body["expectedKeyVersions"] = {key: expected}
    return body


def read_all(client: httpx.Client, key: str, topic_url: str = TOPIC_URL, page: int = 300) -> list[dict[str, Any]]:
    """The whole stream of ``key`` through JSON pages, following ``nextVersion``."""
    messages: list[dict[str, Any]] = []
    version = 0
    while True:
        answer = client.get(f"{key_url(key, topic_url)}/messages", params={"fromVersion": version, "maxMessages": page})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        messages.extend(body["messages"])
        if not body["messages"]:
            return messages
        version = body["nextVersion"]


def run_two(writer: Callable[[int], None]) -> None:
    """``writer(0)`` and ``writer(1)`` on two threads, until both end."""
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_two_rest_writers_race_on_one_key_and_exactly_one_wins_each_round(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT_S)
    answers: list[list[httpx.Response]] = [[], []]

    def writer(index: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            for round_index in range(ROUNDS):
                barrier.wait()
                answers[index].append(client.post(TOPIC_URL, json=append_request(
                    "race", [f"w{index}-{round_index}"], round_index - 1, producer=f"w{index}")))

    run_two(writer)
    winners = []
    for round_index, pair in enumerate(zip(*answers, strict=True)):
        won = [i for i, answer in enumerate(pair) if answer.status_code == 200]
        assert len(won) == 1, f"round {round_index}: {[a.status_code for a in pair]}"
        winner, loser = pair[won[0]], pair[1 - won[0]]
        assert winner.json()["messagePublishResults"][0]["keyVersion"] == round_index
        assert loser.status_code == 409 and loser.json()["code"] == "key_version_mismatch"
        assert loser.json()["currentKeyVersions"] == {"race": round_index}
        winners.append(f"w{won[0]}-{round_index}")
    with httpx.Client(base_url=url, timeout=30) as client:
        stored = read_all(client, "race")
    assert [m["keyVersion"] for m in stored] == list(range(ROUNDS))  # no gap, no duplicate
    assert [base64.b64decode(m["payload"]).decode() for m in stored] == winners


def test_two_websocket_writers_race_on_one_key_and_exactly_one_wins_each_round(
        server: tuple[str, BrokerService]) -> None:
    url, _ = server
    barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT_S)
    answers: list[list[dict[str, Any]]] = [[], []]

    def writer(index: int) -> None:
        with open_ws(f"{ws_base(url)}/ws/v2/producer/persistent/{TOPIC}?producerName=ws{index}") as ws:
            for round_index in range(ROUNDS):
                barrier.wait()
                send_frame(ws, {"payload": b64(f"w{index}-{round_index}"), "key": "race-ws",
                                "expectedKeyVersion": round_index - 1, "context": str(round_index)})
                answers[index].append(recv_frame(ws))

    run_two(writer)
    winners = []
    for round_index, pair in enumerate(zip(*answers, strict=True)):
        won = [i for i, answer in enumerate(pair) if answer["result"] == "ok"]
        assert len(won) == 1, f"round {round_index}: {pair}"
        winner, loser = pair[won[0]], pair[1 - won[0]]
        assert winner["keyVersion"] == round_index and winner["context"] == str(round_index)
        assert loser["result"] == "send-error:8" and loser["errorCode"] == "key_version_mismatch"
        assert loser["currentKeyVersion"] == round_index
        winners.append(f"w{won[0]}-{round_index}")
    with httpx.Client(base_url=url, timeout=30) as client:
        stored = read_all(client, "race-ws")
    assert [m["keyVersion"] for m in stored] == list(range(ROUNDS))
    assert [base64.b64decode(m["payload"]).decode() for m in stored] == winners


def test_a_burst_of_plain_keyed_websocket_frames_gets_dense_versions(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    keys = [f"burst-{i % 3}" for i in range(30)]  # frames that arrive together go to the broker as one group
    with open_ws(f"{ws_base(url)}/ws/v2/producer/persistent/{TOPIC}?producerName=burst") as producer:
        for index, key in enumerate(keys):
            send_frame(producer, {"payload": b64(f"{key}:{index}"), "key": key, "context": str(index)})
        results = [recv_frame(producer) for _ in keys]
    assert all(r["result"] == "ok" for r in results), results
    assert [r["keyVersion"] for r in results] == [i // 3 for i in range(30)]
    with httpx.Client(base_url=url, timeout=30) as client:
        for key in sorted(set(keys)):
            stored = read_all(client, key)
            assert [m["keyVersion"] for m in stored] == list(range(10))
            assert [m["offset"] for m in stored] == [r["offset"] for r, k in zip(results, keys, strict=True)
                                                     if k == key]


def test_a_multi_key_request_is_all_or_nothing(server: tuple[str, BrokerService]) -> None:
    url, service = server
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post(TOPIC_URL, json=append_request("a", ["a0"], -1)).status_code == 200
        both = {"producerName": "w", "messages": [{"payload": "a1", "key": "a"}, {"payload": "b0", "key": "b"},
                                                  {"payload": "plain"}]}
        next_offset = service.topics.topic(TopicName.parse(TOPIC)).ml.next_offset
        refused = client.post(TOPIC_URL, json={**both, "expectedKeyVersions": {"a": 0, "b": 0}})
        assert refused.status_code == 409
        assert refused.json()["currentKeyVersions"] == {"a": 0, "b": -1}
        assert service.topics.topic(TopicName.parse(TOPIC)).ml.next_offset == next_offset
        assert client.get(key_url("b")).json()["version"] == -1
        accepted = client.post(TOPIC_URL, json={**both, "expectedKeyVersions": {"a": 0, "b": -1}})
        assert accepted.status_code == 200, accepted.text
        results = accepted.json()["messagePublishResults"]
        assert [r.get("keyVersion") for r in results] == [1, 0, None]
        assert [r["offset"] for r in results] == [next_offset, next_offset + 1, next_offset + 2]


def test_a_retried_conditional_request_answers_its_first_results(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    with httpx.Client(base_url=url, timeout=30) as client:
        body = append_request("k", ["e0", "e1"], -1, producer="app")
        body["messages"][0]["sequenceId"] = 41
        first = client.post(TOPIC_URL, json=body).json()["messagePublishResults"]
        again = client.post(TOPIC_URL, json=body)
        assert again.status_code == 200, again.text  # not 409: dedup answers before the check
        assert [{k: v for k, v in r.items() if k != "duplicate"} for r in again.json()["messagePublishResults"]] \
            == first
        assert all(r["duplicate"] for r in again.json()["messagePublishResults"])
        assert [m["keyVersion"] for m in read_all(client, "k")] == [0, 1]


def test_reads_by_version_both_ways_in_json_and_arrow_across_rollovers_and_partitions(
        server: tuple[str, BrokerService]) -> None:
    url, service = server
    service.topics.create_partitioned(TopicName.parse("public/default/ledgers"), 4)
    with httpx.Client(base_url=url, timeout=30) as client:
        for topic_url in (TOPIC_URL, "/topics/persistent/public/default/ledgers"):
            for version in range(25):
                for key in ("x", "y/with slash"):
                    answer = client.post(topic_url, json=append_request(key, [f"{key}:{version}"], version - 1))
                    assert answer.status_code == 200, answer.text
            info = client.get(key_url("y/with slash", topic_url)).json()
            assert info["version"] == 24 and info["firstVersion"] == 0 and info["key"] == "y/with slash"
            forward = client.get(f"{key_url('x', topic_url)}/messages", params={"fromVersion": 7, "maxMessages": 5})
            body = forward.json()
            assert [m["keyVersion"] for m in body["messages"]] == [7, 8, 9, 10, 11] and body["nextVersion"] == 12
            assert [unb64(m["payload"]) for m in body["messages"]] == [f"x:{v}".encode() for v in range(7, 12)]
            assert all(m["key"] == "x" and m["publishTime"] and m["messageId"] for m in body["messages"])
            backward = client.get(f"{key_url('x', topic_url)}/messages",
                                  params={"direction": "backward", "maxMessages": 4}).json()
            assert [m["keyVersion"] for m in backward["messages"]] == [24, 23, 22, 21]
            assert backward["nextVersion"] == 20 and backward["version"] == 24
            arrow = client.get(f"{key_url('y/with slash', topic_url)}/messages",
                               params={"fromVersion": 3, "direction": "backward"},
                               headers={"accept": ARROW_STREAM_MEDIA_TYPE})
            assert arrow.status_code == 200 and arrow.headers["x-magnetar-next-version"] == "-1"
            table = pa.ipc.open_stream(arrow.content).read_all()
            assert table.column("keyVersion").to_pylist() == [3, 2, 1, 0]
            assert table.column("value").to_pylist() == [f"y/with slash:{v}".encode() for v in (3, 2, 1, 0)]
            offsets = table.column("offset").to_pylist()
            assert offsets == sorted(offsets, reverse=True) and info["lastOffset"] > offsets[0]
            assert client.get(f"{key_url('x', topic_url)}/messages", params={"fromVersion": 99}).json()["messages"] \
                == []
        partition = client.get(key_url("x", "/topics/persistent/public/default/ledgers")).json()["partition"]
        assert 0 <= partition < 4
        stats = service.topics.topic(TopicName.parse(f"public/default/ledgers-partition-{partition}")).ml.statistics()
        assert stats.ledgers > 2  # the stream crossed ledger rollovers


def test_trimmed_versions_are_gone_with_the_first_version_kept(server: tuple[str, BrokerService]) -> None:
    url, service = server
    service.namespaces.set_policy("public/default", "retention_policies", KEEP_NOTHING)
    with httpx.Client(base_url=url, timeout=30) as client:
        for version in range(20):
            client.post(TOPIC_URL, json=append_request("old", [f"v{version}"], version - 1)).raise_for_status()
        service.key_index.flush()
        service.maintenance.run()
        info = client.get(key_url("old")).json()
        assert 0 < info["firstVersion"] <= 19 and info["version"] == 19
        gone = client.get(f"{key_url('old')}/messages", params={"fromVersion": 0})
        assert gone.status_code == 410
        assert gone.json()["code"] == "data_lost" and gone.json()["firstVersion"] == info["firstVersion"]
        kept = client.get(f"{key_url('old')}/messages").json()
        assert [m["keyVersion"] for m in kept["messages"]] == list(range(info["firstVersion"], 20))
        status, body = refused_status(f"{ws_base(url)}/ws/v2/reader/persistent/{TOPIC}?key=old&fromKeyVersion=0")
        assert status == 410 and body["firstVersion"] == info["firstVersion"]
        assert client.post(TOPIC_URL, json=append_request("old", ["v20"], 19)).json()[
            "messagePublishResults"][0]["keyVersion"] == 20


def test_a_live_key_reader_catches_up_then_follows_its_key_only(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    with httpx.Client(base_url=url, timeout=30) as client:
        for version in range(5):
            client.post(TOPIC_URL, json=append_request("acct-1", [f"a{version}"], version - 1)).raise_for_status()
            client.post(TOPIC_URL, json=append_request("acct-2", [f"b{version}"], None)).raise_for_status()
        with open_ws(f"{ws_base(url)}/ws/v2/reader/persistent/{TOPIC}?key=acct-1&fromKeyVersion=2") as reader:
            caught_up = []
            for _ in range(3):
                frame = recv_frame(reader)
                send_frame(reader, {"messageId": frame["messageId"]})
                caught_up.append((frame["keyVersion"], unb64(frame["payload"]), frame["key"]))
            assert caught_up == [(2, b"a2", "acct-1"), (3, b"a3", "acct-1"), (4, b"a4", "acct-1")]
            for version in range(5, 8):  # another key's appends in between are not delivered
                client.post(TOPIC_URL, json=append_request("acct-2", [f"b{version}"], None)).raise_for_status()
                client.post(TOPIC_URL, json=append_request("acct-1", [f"a{version}"], version - 1)).raise_for_status()
            followed = []
            for _ in range(3):
                frame = recv_frame(reader)
                send_frame(reader, {"messageId": frame["messageId"]})
                followed.append((frame["keyVersion"], unb64(frame["payload"])))
            assert followed == [(5, b"a5"), (6, b"a6"), (7, b"a7")]
            client.post(TOPIC_URL, json=append_request("acct-1", ["a8"], 7)).raise_for_status()
            assert recv_frame(reader)["keyVersion"] == 8  # nothing of acct-2's came first


def test_bad_event_stream_input_is_a_400_naming_the_problem(server: tuple[str, BrokerService]) -> None:
    url, _ = server
    long_key = "k" * (KEY_BYTES_MAX + 1)
    with httpx.Client(base_url=url, timeout=30) as client:
        for body in ({"messages": [{"payload": "x", "key": "k"}], "expectedKeyVersions": {"k": -2}},
                     {"messages": [{"payload": "x", "key": "k"}], "expectedKeyVersions": {"k": "5"}},
                     {"messages": [{"payload": "x", "key": "k"}], "expectedKeyVersions": {"k": True}},
                     {"messages": [{"payload": "x", "key": "k"}], "expectedKeyVersions": {}},
                     {"messages": [{"payload": "x", "key": "k"}], "expectedKeyVersions": []},
                     {"messages": [{"payload": "x", "key": long_key}]},
                     {"messages": [{"payload": "x", "key": "k", "expectedKeyVersions": {"k": 0}}]}):
            answer = client.post(TOPIC_URL, json=body)
            assert answer.status_code == 400, (body, answer.text)
            assert answer.json()["code"] == "invalid_request" and answer.json()["message"]
        for params in ({"fromVersion": -1}, {"maxMessages": 0}, {"maxMessages": 10_001}, {"direction": "sideways"},
                       {"fromVersion": "x"}):
            answer = client.get(f"{key_url('k')}/messages", params=params)
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_request", (params, answer.text)
        assert client.get(key_url(long_key)).status_code == 400
        assert client.get(key_url("k", "/topics/persistent/public/default/never")).status_code == 404
    with open_ws(f"{ws_base(url)}/ws/v2/producer/persistent/{TOPIC}") as producer:
        send_frame(producer, {"payload": b64("x"), "expectedKeyVersion": 0, "context": "no-key"})
        refusal = recv_frame(producer)
        assert refusal["result"] == "send-error:3" and "key" in refusal["errorMsg"]
        send_frame(producer, {"payload": b64("x"), "key": "k", "expectedKeyVersion": "zero", "context": "bad"})
        assert recv_frame(producer)["result"] == "send-error:3"
    for query in ("key=k&messageId=earliest", "fromKeyVersion=3", "key=k&fromKeyVersion=-1"):
        status, body = refused_status(f"{ws_base(url)}/ws/v2/reader/persistent/{TOPIC}?{query}")
        assert status == 400 and body["code"] == "invalid_request", query
