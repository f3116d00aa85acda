"""``kill -9`` of a real ``magnetar standalone`` during dedup, dead-lettering and compaction.

Each test runs seeded rounds on one data directory; in each round the broker is SIGKILLed at a
seeded moment while the feature is at work, then restarted, and the feature's promise is
checked against what the clients were told:

- **dedup**: a WebSocket producer sends pipelined messages with explicit sequence ids; after
  the kill and a restart, resending every sequence id sent so far answers each acknowledged
  one as a duplicate, and the topic holds every sequence id exactly once;
- **dead-lettering**: a REST consumer negatively acknowledges everything (redelivery after 0
  ms, ``maxRedeliverCount`` 3) while the broker is killed again and again; the dead-letter
  topic ends up holding every message exactly once, and redelivery counts survive restarts
  (the first delivery after a restart counts at least as far as the last one before it, less
  the one bump that may not have been persisted);
- **compaction**: keyed messages and tombstones are produced and compacted while the broker is
  killed; after a restart the last completed compaction is still in force (its horizon never
  goes back), the compacted view holds at most one message per key below the horizon, and
  folding the whole compacted read by key gives exactly the acknowledged messages' latest
  value per key.

A failure names the seed (``MAGNETAR_CRASH_SEED`` replays the rounds' choices).
"""

from __future__ import annotations

import collections
import functools
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.crash.harness import crash_seed
from tests.integration.ws_client import b64, open_ws, recv_frame, send_frame, unb64, ws_base
from tests.standalone import read_all, standalone_process, stop

pytestmark = pytest.mark.crash

ROUNDS = 3
WAIT_S = 60.0
WINDOW = 50
RETAIN = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}


def _retain_everything(url: str) -> None:
    answer = httpx.post(f"{url}/admin/v2/namespaces/public/default/retention", json=RETAIN, timeout=WAIT_S)
    assert answer.status_code == 204


def _kill_later(kill: Callable[[], object], delay_s: float) -> threading.Timer:
    timer = threading.Timer(delay_s, kill)
    timer.start()
    return timer


# --- dedup -------------------------------------------------------------------------------------
DEDUP_TOPIC = "persistent/public/default/dedup-crash"
DEDUP_PRODUCER = f"/ws/v2/producer/{DEDUP_TOPIC}?producerName=dedup-p"


def _send_sequence(url: str, seqs: range, *, kill_after_acks: int | None = None,
                   kill: Callable[[], object] | None = None) -> dict[int, dict[str, Any]]:
    """Send ``seqs`` pipelined (``WINDOW`` in flight); the answer per acknowledged sequence id.
    With ``kill_after_acks``, kill the broker once that many answers came (sends in flight)."""
    answers: dict[int, dict[str, Any]] = {}
    pending: collections.deque[int] = collections.deque()
    upcoming = iter(seqs)
    try:
        with open_ws(f"{ws_base(url)}{DEDUP_PRODUCER}") as ws:
            while True:
                while len(pending) < WINDOW and (seq := next(upcoming, None)) is not None:
                    send_frame(ws, {"payload": b64(f"seq-{seq}"), "sequenceId": seq, "context": str(seq)})
                    pending.append(seq)
                if not pending:
                    return answers
                if kill_after_acks is not None and len(answers) >= kill_after_acks:
                    assert kill is not None
                    kill()
                    return answers
                answer = recv_frame(ws, timeout_s=WAIT_S)
                assert answer["result"] == "ok", answer
                answers[int(answer["context"])] = answer
                pending.popleft()
    except OSError:
        return answers  # the broker died under the client


def test_dedup_survives_kill9(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    data = tmp_path / "data"
    sent = 0
    for round_index in range(ROUNDS):
        context = f"seed={seed} round={round_index}"
        with standalone_process(data) as (url, proc):
            if round_index == 0:
                _retain_everything(url)
            count = rng.randrange(50, 600)
            acked = _send_sequence(url, range(sent, sent + count), kill_after_acks=rng.randrange(1, count),
                                   kill=functools.partial(stop, proc, kill=True))
        first_round_seqs = range(sent, sent + count)
        sent += count
        with standalone_process(data) as (url, _):
            again = _send_sequence(url, range(sent))
            assert sorted(again) == list(range(sent)), context
            for seq in acked:
                assert again[seq].get("duplicate") is True, f"acknowledged sequence id {seq} stored twice; {context}"
            stored = [m["payload"].decode() for m in read_all(url, f"/topics/{DEDUP_TOPIC}")]
            duplicates = [p for p, n in collections.Counter(stored).items() if n > 1]
            assert not duplicates, f"{duplicates[:5]}; {context}"
            assert set(stored) == {f"seq-{s}" for s in range(sent)}, context
            assert all(f"seq-{s}" in stored for s in first_round_seqs)


# --- dead-lettering ------------------------------------------------------------------------------
DLQ_SOURCE = "/topics/persistent/public/default/dlq-src"
DLQ_TOPIC = "/topics/persistent/public/default/dlq-src-workers-DLQ"
MAX_REDELIVER = 3
DLQ_MESSAGES = 20
PULL: dict[str, str | int] = {
    "subscriptionType": "Shared", "maxRedeliverCount": MAX_REDELIVER, "negativeAckRedeliveryDelay": 0,
    "subscriptionInitialPosition": "Earliest", "maxMessages": 10, "waitTimeMs": 200}


def _nack_everything(url: str, counts: dict[str, list[int]], stop_event: threading.Event) -> None:
    """Pull and negatively acknowledge until told to stop or the broker dies; record each
    delivery's redelivery count per payload."""
    with httpx.Client(base_url=url, timeout=10) as http:
        while not stop_event.is_set():
            try:
                pulled = http.post(f"{DLQ_SOURCE}/subscription/workers/pull", params=PULL)
                if pulled.status_code != 200:
                    return
                messages = pulled.json()["messages"]
                for message in messages:
                    counts[unb64(message["payload"]).decode()].append(message["redeliveryCount"])
                if messages:
                    http.post(f"{DLQ_SOURCE}/subscription/workers/negativeAcknowledge",
                              json={"messageIds": [m["messageId"] for m in messages]})
            except httpx.TransportError:
                return


def test_dead_lettering_survives_kill9(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    data = tmp_path / "data"
    before: dict[str, int] = {}
    for round_index in range(ROUNDS + 1):
        final = round_index == ROUNDS
        with standalone_process(data) as (url, proc):
            if round_index == 0:
                _retain_everything(url)
                for i in range(DLQ_MESSAGES):
                    assert httpx.post(f"{url}{DLQ_SOURCE}", json={"messages": [{"payload": f"m-{i}"}]},
                                      timeout=WAIT_S).status_code == 200
            counts: dict[str, list[int]] = collections.defaultdict(list)
            stop_event = threading.Event()
            worker = threading.Thread(target=_nack_everything, args=(url, counts, stop_event))
            worker.start()
            if final:
                deadline = time.monotonic() + WAIT_S
                while len(read_all(url, DLQ_TOPIC, missing_ok=True)) < DLQ_MESSAGES and time.monotonic() < deadline:
                    time.sleep(0.2)
                stop_event.set()
                worker.join(WAIT_S)
                dead = [m["payload"].decode() for m in read_all(url, DLQ_TOPIC, missing_ok=True)]
            else:
                timer = _kill_later(functools.partial(stop, proc, kill=True), rng.uniform(0.2, 2.0))
                worker.join(WAIT_S)
                timer.join(WAIT_S)
        context = f"seed={seed} round={round_index}"
        for payload, seen in counts.items():
            if payload in before and seen:  # counts survive a restart, less one unpersisted bump at most
                assert seen[0] >= before[payload] - 1, f"{payload}: {before[payload]} then {seen[0]}; {context}"
            assert all(c <= MAX_REDELIVER for c in seen), f"{payload} delivered after its last chance; {context}"
            if seen:
                before[payload] = max(seen)
    duplicates = [p for p, n in collections.Counter(dead).items() if n > 1]
    assert not duplicates, f"dead-lettered twice: {duplicates}; seed={seed}"
    assert sorted(dead) == sorted(f"m-{i}" for i in range(DLQ_MESSAGES)), f"seed={seed}"
    assert any(c >= 2 for c in before.values()), f"the kills never met a redelivered message; seed={seed}"


# --- compaction ----------------------------------------------------------------------------------
COMPACT_TOPIC = "persistent/public/default/compact-crash"
KEYS = 12


def _compaction(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/admin/v2/{COMPACT_TOPIC}/compaction", timeout=WAIT_S)
    assert answer.status_code == 200, answer.text
    status: dict[str, Any] = answer.json()
    return status


def _wait_compacted(url: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while (status := _compaction(url))["status"] == "RUNNING":
        assert time.monotonic() < deadline, "compaction did not finish"
        time.sleep(0.05)
    return status


def _read_compacted(url: str, status: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole compacted view: the compaction's messages below its horizon, then every
    message from the horizon to the topic's end."""
    offsets = httpx.get(f"{url}/topics/{COMPACT_TOPIC}/offsets", timeout=WAIT_S).json()["offsets"]
    expected = status["messages"] + next(iter(offsets.values()))["next"] - status["horizonOffset"]
    out: list[dict[str, Any]] = []
    with open_ws(f"{ws_base(url)}/ws/v2/reader/{COMPACT_TOPIC}?messageId=earliest&readCompacted=true") as ws:
        while len(out) < expected:
            message = recv_frame(ws, timeout_s=WAIT_S)
            out.append(message)
            send_frame(ws, {"messageId": message["messageId"]})
    return out


def _fold(messages: list[tuple[str, bytes]]) -> dict[str, bytes]:
    state: dict[str, bytes] = {}
    for key, payload in messages:
        if payload:
            state[key] = payload
        else:
            state.pop(key, None)
    return state


def test_compaction_survives_kill9(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    data = tmp_path / "data"
    acked: list[tuple[str, bytes]] = []
    horizon = 0
    for round_index in range(ROUNDS):
        context = f"seed={seed} round={round_index}"
        with standalone_process(data) as (url, proc), httpx.Client(base_url=url, timeout=WAIT_S) as http:
            if round_index == 0:
                _retain_everything(url)
            for i in range(rng.randrange(40, 120)):
                key = f"k{rng.randrange(KEYS)}"
                payload = b"" if rng.random() < 0.1 else f"{key}-r{round_index}-{i}".encode()
                answer = http.post(f"/topics/{COMPACT_TOPIC}",
                                   json={"messages": [{"payload": payload.decode(), "key": key}]})
                assert answer.status_code == 200
                acked.append((key, payload))
            assert http.put(f"/admin/v2/{COMPACT_TOPIC}/compaction").status_code == 204
            if rng.random() < 0.5:  # let it finish, then kill while another runs
                horizon = max(horizon, _wait_compacted(url)["horizonOffset"])
                assert http.put(f"/admin/v2/{COMPACT_TOPIC}/compaction").status_code == 204
            time.sleep(rng.uniform(0.0, 0.3))
            stop(proc, kill=True)
        with standalone_process(data) as (url, _):
            status = _wait_compacted(url)
            assert status["status"] in ("SUCCESS", "NOT_RUN") and status["horizonOffset"] >= horizon, context
            if horizon:
                assert status["status"] == "SUCCESS", context
            horizon = status["horizonOffset"]
            read = _read_compacted(url, status)
            below = [m.get("key") for m in read if m["offset"] < horizon]
            assert len(below) == len(set(below)), f"a key twice in the compacted part; {context}"
            folded = _fold([(m["key"], unb64(m["payload"])) for m in read if m.get("key") is not None])
            assert folded == _fold(acked), context
