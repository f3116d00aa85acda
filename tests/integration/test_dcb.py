"""Dynamic consistency boundaries in the broker, over REST, against a real ``magnetar standalone``.

A read by tag after a position returns exactly the matching events in order; an append whose
condition an earlier event breaks is a 409 ``dcb_condition_failed`` and writes nothing; too many
query items, an oversized tag, too many tags or events are a 400 and write nothing. Two writers
racing with the same condition: exactly one wins each round. A read by tag, and a condition, among
10,000 other events read a handful of index rows and entries (the broker's ``keyIndex``
statistics), not the topic. After ``kill -9`` the derived index is rebuilt from the log, and after
a graceful restart it is read from its segments: a condition still sees the events appended before.
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.standalone import standalone_process, stop

TOPIC_URL = "/topics/persistent/public/default/courses"
ROUNDS = 100
QUERY_ITEMS_MAX = 32  # the broker's DCB_QUERY_ITEMS_MAX
TAG_BYTES_MAX = 256  # the broker's DCB_TAG_BYTES_MAX
TAGS_PER_EVENT_MAX = 32
EVENTS_PER_APPEND_MAX = 1000


def event(event_type: str, tags: list[str], data: bytes = b"") -> dict[str, Any]:
    return {"type": event_type, "tags": tags, "data": base64.b64encode(data).decode()}


def append(client: httpx.Client, events: list[dict[str, Any]], items: list[dict[str, Any]] | None = None,
           after: int = 0, topic_url: str = TOPIC_URL) -> httpx.Response:
    body: dict[str, Any] = {"events": events}
    if items is not None:
        body["condition"] = {"failIfEventsMatch": {"items": items}, "after": after}
    return client.post(f"{topic_url}/dcb/append", json=body)


def read(client: httpx.Client, items: list[dict[str, Any]], after: int = 0, limit: int | None = None,
         topic_url: str = TOPIC_URL) -> dict[str, Any]:
    body: dict[str, Any] = {"items": items, "after": after}
    if limit is not None:
        body["limit"] = limit
    answer = client.post(f"{topic_url}/dcb/read", json=body)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def summary(answer: dict[str, Any]) -> list[tuple[str, list[str], bytes, int]]:
    return [(e["type"], e["tags"], base64.b64decode(e["data"]), e["position"]) for e in answer["events"]]


def dcb_counters(client: httpx.Client) -> tuple[int, int]:
    """(rows of derived streams read, entries read) by DCB reads and conditions so far."""
    keys = client.get("/admin/v2/broker-stats/overview").json()["keyIndex"]
    return keys["dcbRowsRead"], keys["dcbEntriesRead"]


def test_reads_by_query_after_a_position_and_conditions_refusing_what_follows(tmp_path: Path) -> None:
    with standalone_process(tmp_path) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        assert append(client, [event("CourseDefined", ["course-1"], b"c1"),
                               event("StudentJoined", ["student-1"], b"s1")]).json() == {"position": 2}
        assert append(client, [event("StudentSubscribed", ["course-1", "student-1"], b"sub1"),
                               event("StudentSubscribed", ["course-2", "student-1"], b"sub2"),
                               event("CourseDefined", ["course-2"], b"c2")]).json() == {"position": 5}
        course1 = read(client, [{"tags": ["course-1"]}])
        assert summary(course1) == [("CourseDefined", ["course-1"], b"c1", 1),
                                    ("StudentSubscribed", ["course-1", "student-1"], b"sub1", 3)]
        assert course1["head"] == 5 and course1["nextAfter"] is None
        assert [e[3] for e in summary(read(client, [{"tags": ["course-1"]}], after=1))] == [3]
        either = read(client, [{"types": ["CourseDefined"], "tags": ["course-2"]},
                               {"types": ["StudentSubscribed"], "tags": ["student-1", "course-1"]}])
        assert [e[2] for e in summary(either)] == [b"sub1", b"c2"]
        assert [e[2] for e in summary(read(client, [{"types": ["StudentJoined", "CourseDefined"]}]))] == \
            [b"c1", b"s1", b"c2"]
        assert [e[3] for e in summary(read(client, [], after=3))] == [4, 5]
        limited = read(client, [{"tags": ["student-1"]}], limit=2)
        assert [e[3] for e in summary(limited)] == [2, 3] and limited["nextAfter"] == 3

        capacity = [{"types": ["StudentSubscribed"], "tags": ["course-1"]}]
        refused = append(client, [event("StudentSubscribed", ["course-1", "student-2"])], capacity, after=2)
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "dcb_condition_failed" and refused.json()["position"] == 3
        assert read(client, [])["head"] == 5, "a refused append wrote something"
        matching_all = append(client, [event("X", [])], [], after=4)
        assert matching_all.status_code == 409 and matching_all.json()["position"] == 5
        assert append(client, [event("StudentSubscribed", ["course-1", "student-2"])], capacity,
                      after=3).json() == {"position": 6}
        assert append(client, [event("X", [])], [], after=6).json() == {"position": 7}


def test_bad_dcb_input_is_a_400_and_writes_nothing(tmp_path: Path) -> None:
    with standalone_process(tmp_path) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        assert append(client, [event("A", ["t"])]).status_code == 200
        too_many_items = [{"tags": [f"t{i}"]} for i in range(QUERY_ITEMS_MAX + 1)]
        long_tag = "t" * (TAG_BYTES_MAX + 1)
        cases = [
            append(client, [event("A", ["u"])], too_many_items),
            append(client, [event("A", ["u"]), event("B", [long_tag])]),
            append(client, [event("A", [f"t{i}" for i in range(TAGS_PER_EVENT_MAX + 1)])]),
            append(client, [event("A", [])] * (EVENTS_PER_APPEND_MAX + 1)),
            append(client, [event("A", ["u"])], [{"tags": [long_tag]}]),
            append(client, []),
            client.post(f"{TOPIC_URL}/dcb/append", json={"events": [{"type": "A", "data": "not base64!"}]}),
            client.post(f"{TOPIC_URL}/dcb/append", json={"events": [{"type": "A"}], "expectedOffset": 1}),
            client.post(f"{TOPIC_URL}/dcb/read", json={"items": too_many_items}),
            client.post(f"{TOPIC_URL}/dcb/read", json={"items": [{"tags": [long_tag]}]}),
            client.post(f"{TOPIC_URL}/dcb/read", json={"after": -1}),
            client.post(f"{TOPIC_URL}/dcb/read", content=b"{not json"),
        ]
        for answer in cases:
            assert answer.status_code == 400, answer.text
            assert set(answer.json()) >= {"code", "message"} and answer.json()["code"] == "invalid_request"
        assert read(client, [])["head"] == 1, "a refused append wrote something"
        client.put("/admin/v2/persistent/public/default/sharded/partitions", json=2)
        partitioned = append(client, [event("A", [])], topic_url="/topics/persistent/public/default/sharded")
        assert partitioned.status_code == 400 and "partition" in partitioned.json()["message"]


def test_two_writers_with_the_same_condition_exactly_one_wins_each_round(tmp_path: Path) -> None:
    with standalone_process(tmp_path) as (url, _), httpx.Client(base_url=url, timeout=30) as one, \
            httpx.Client(base_url=url, timeout=30) as other:
        assert append(one, [event("Opened", [])]).is_success
        for round_ in range(ROUNDS):
            seat = [{"types": ["SeatBooked"], "tags": [f"seat-{round_}"]}]
            head = read(one, seat)["head"] or 0
            barrier = threading.Barrier(2)
            answers: dict[str, int] = {}

            def book(client: httpx.Client, who: str, seat: list[dict[str, Any]] = seat, head: int = head,
                     barrier: threading.Barrier = barrier, answers: dict[str, int] = answers) -> None:
                barrier.wait(timeout=30)
                answers[who] = append(client, [event("SeatBooked", [seat[0]["tags"][0]], who.encode())], seat,
                                      after=head).status_code

            threads = [threading.Thread(target=book, args=(c, w)) for c, w in ((one, "ann"), (other, "bob"))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            assert sorted(answers.values()) == [200, 409], (round_, answers)
            booked = summary(read(one, seat))
            assert len(booked) == 1 and booked[0][2].decode() == next(w for w, s in answers.items() if s == 200)
        assert read(one, [])["head"] == ROUNDS + 1


def test_a_read_by_tag_and_a_condition_among_10000_other_events_read_no_more_than_their_matches(
        tmp_path: Path) -> None:
    """Before the broker indexed tags, the DCB recorder read the whole topic for a tag read
    (10,001 messages for 1 match here) and a condition read everything after its position."""
    with standalone_process(tmp_path) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        for batch in range(10):
            assert append(client, [event("Other", [f"other-{batch}-{i}", "others"]) for i in range(1000)]).is_success
        needle = append(client, [event("Needle", ["needle"], b"found")]).json()["position"]
        for batch in range(2):
            assert append(client, [event("Other", [f"later-{batch}-{i}"]) for i in range(1000)]).is_success
        rows, entries = dcb_counters(client)
        found = read(client, [{"tags": ["needle"]}])
        assert summary(found) == [("Needle", ["needle"], b"found", needle)]
        after_rows, after_entries = dcb_counters(client)
        assert after_entries - entries <= 1 and after_rows - rows <= 1, (after_rows - rows, after_entries - entries)
        both = read(client, [{"types": ["Needle"], "tags": ["needle"]}])
        assert [e[3] for e in summary(both)] == [needle]
        refused = append(client, [event("Needle", ["needle"])], [{"tags": ["needle"]}], after=0)
        assert refused.status_code == 409 and refused.json()["position"] == needle
        assert append(client, [event("Needle", ["needle"])], [{"tags": ["needle"]}], after=needle).is_success
        final_rows, final_entries = dcb_counters(client)
        assert final_entries - entries <= 3 and final_rows - rows <= 6, (final_rows - rows, final_entries - entries)


def test_the_derived_index_is_rebuilt_after_kill_9_and_read_from_segments_after_a_restart(tmp_path: Path) -> None:
    booked = [{"types": ["SeatBooked"], "tags": ["seat-1"]}]
    with standalone_process(tmp_path) as (url, proc), httpx.Client(base_url=url, timeout=30) as client:
        assert append(client, [event("Other", [f"o-{i}"]) for i in range(500)]).is_success
        assert append(client, [event("SeatBooked", ["seat-1", "show-1"], b"ann")], booked).json() == {"position": 501}
        stop(proc, kill=True)
    with standalone_process(tmp_path) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        refused = append(client, [event("SeatBooked", ["seat-1"], b"bob")], booked, after=500)
        assert refused.status_code == 409 and refused.json()["position"] == 501, refused.text
        assert [e[2] for e in summary(read(client, [{"tags": ["show-1"]}]))] == [b"ann"]
    with standalone_process(tmp_path) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        refused = append(client, [event("SeatBooked", ["seat-1"], b"bob")], booked, after=500)
        assert refused.status_code == 409 and refused.json()["position"] == 501, refused.text
        keys = client.get("/admin/v2/broker-stats/overview").json()["keyIndex"]
        assert keys["segments"] >= 1 and keys["entriesReplayed"] == 0, \
            f"a graceful stop writes the index's last checkpoint as a segment: {keys}"
        assert [e[2] for e in summary(read(client, [{"tags": ["show-1"]}]))] == [b"ann"]
        assert append(client, [event("SeatBooked", ["seat-2"], b"bob")], [{"tags": ["seat-2"]}]).json() == \
            {"position": 502}


def test_events_from_pulsar_clients_are_indexed_as_on_replay_batched_compressed_or_not(tmp_path: Path) -> None:
    """A binary client's own entries carry DCB events too: single, batched, and LZ4-compressed
    batches (whose properties are only visible once decompressed) are found by tag at once, and
    again after ``kill -9`` when the index is rebuilt from the log."""
    import pulsar

    from tests.integration.pulsar_support import binary_broker
    from tests.integration.pulsar_support import client as pulsar_client

    def properties(tag: str) -> dict[str, str]:
        return {"dcb-type": "Seen", "dcb-tags": f'["{tag}", "pulsar"]'}

    topic = "persistent://public/default/courses"
    with binary_broker(tmp_path) as (url, pulsar_url, proc), httpx.Client(base_url=url, timeout=30) as http:
        official = pulsar_client(pulsar_url)
        try:
            single = official.create_producer(topic, batching_enabled=False)
            single.send(b"one", properties=properties("single"))
            batched = official.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                               batching_max_publish_delay_ms=1000)
            compressed = official.create_producer(topic, batching_enabled=True, batching_max_messages=2,
                                                  batching_max_publish_delay_ms=1000,
                                                  compression_type=pulsar.CompressionType.LZ4)
            for i in range(3):
                batched.send_async(b"b%d" % i, None, properties=properties("batched"))
            batched.flush()
            for i in range(2):
                compressed.send_async(b"c%d" % i, None, properties=properties("compressed"))
            compressed.flush()
        finally:
            official.close()
        expected = {"single": [b"one"], "batched": [b"b0", b"b1", b"b2"], "compressed": [b"c0", b"c1"]}
        for tag, payloads in expected.items():
            assert [e[2] for e in summary(read(http, [{"tags": [tag]}]))] == payloads, tag
        assert len(read(http, [{"types": ["Seen"], "tags": ["pulsar"]}])["events"]) == 6
        stop(proc, kill=True)
    with standalone_process(tmp_path) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        for tag, payloads in expected.items():
            assert [e[2] for e in summary(read(http, [{"tags": [tag]}]))] == payloads, tag


def test_the_websocket_dcb_socket_reads_and_appends_answering_in_frame_order(tmp_path: Path) -> None:
    """Forty frames pipelined on one socket (more than it carries out at once): reads and
    conditional appends answered in frame order with their contexts; a refused condition and a
    bad frame are answered as errors and write nothing, and the socket goes on."""
    from tests.integration.ws_client import open_ws, recv_frame, send_frame, ws_base

    with standalone_process(tmp_path) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        assert append(client, [event("Opened", [])]).is_success
        with open_ws(f"{ws_base(url)}/ws/v2/dcb/persistent/public/default/courses") as ws:
            seat = [{"tags": ["seat-1"]}]
            frames: list[dict[str, Any]] = []
            for i in range(20):  # each books seat-1 on the condition nothing booked it after position 1
                frames.append({"type": "append", "context": f"a{i}", "events": [event("SeatBooked", ["seat-1"])],
                               "condition": {"failIfEventsMatch": {"items": seat}, "after": 1}})
                frames.append({"type": "read", "context": f"r{i}", "items": seat})
            frames.append({"type": "append", "context": "bad", "events": [event("A", ["t" * (TAG_BYTES_MAX + 1)])]})
            frames.append({"type": "teleport", "context": "unknown"})
            for frame in frames:
                send_frame(ws, frame)
            answers = [recv_frame(ws) for _ in frames]
        assert [a["context"] for a in answers] == [f["context"] for f in frames]
        assert answers[0] == {"result": "ok", "context": "a0", "position": 2}
        assert all(a["result"] == "error:8" and a["errorCode"] == "dcb_condition_failed" and a["position"] == 2
                   for a in answers[2:40:2]), answers[2:40:2]
        assert all(a["result"] == "ok" and [e["position"] for e in a["events"]] == [2] for a in answers[1:40:2])
        assert answers[40]["result"] == "error:8" and answers[40]["errorCode"] == "invalid_request"
        assert answers[41]["result"] == "error:3"
        assert read(client, [])["head"] == 2, "a refused frame wrote something"
