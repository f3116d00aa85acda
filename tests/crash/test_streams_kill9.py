"""``kill -9`` of a real ``magnetar standalone`` under a conditional-append load on event streams.

Each round starts the broker on the same data directory; REST writers (PIP-64 with
``expectedKeyVersions``) and a WebSocket writer (``expectedKeyVersion`` frames) each append to
keys of their own, always expecting the version they last saw, until a seeded number of appends
were acknowledged; then the broker is SIGKILLed with appends in flight. After a restart:

- every acknowledged append is readable at its version, with its offset and payload;
- every stream's versions are dense (0, 1, 2, … with no gap and no repeat);
- a stream's version is its last acknowledged one, or, when an append was in flight at the
  kill, that append's (it became durable without its answer arriving), and then the stored
  events are exactly the in-flight ones;
- the next conditional append against that version succeeds, with the next version.

The key index is rebuilt from the entries after its last indexed offset on each start, which is
what this exercises. A failure names the seed (``MAGNETAR_CRASH_SEED`` replays it).
"""

from __future__ import annotations

import base64
import random
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.crash.harness import crash_seed
from tests.integration.ws_client import b64, open_ws, recv_frame, send_frame, ws_base
from tests.standalone import standalone_process, stop

pytestmark = pytest.mark.crash

ROUNDS = 3
REST_WRITERS = 3
KEYS_PER_WRITER = 6
WAIT_S = 60.0
TOPIC = "public/default/ledger-events"
TOPIC_URL = f"/topics/persistent/{TOPIC}"


@dataclass
class Stream:
    """What the clients were told about one key: acknowledged versions, and the append in flight."""

    acked: dict[int, tuple[int, str]] = field(default_factory=dict)
    """version → (offset, payload) of every acknowledged event."""
    version: int = -1
    """The last version the writer saw."""
    in_flight: list[str] | None = None
    """Payloads of the append sent and not answered."""


@dataclass
class Load:
    streams: dict[str, Stream]
    acks: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    enough: threading.Event = field(default_factory=threading.Event)
    threshold: int = 0
    errors: list[str] = field(default_factory=list)
    """What a writer saw that it should not have (a refused append of a key it owns)."""

    def acked(self, stream: Stream, versions: list[int], offsets: list[int], payloads: list[str]) -> None:
        with self.lock:
            for version, offset, payload in zip(versions, offsets, payloads, strict=True):
                stream.acked[version] = (offset, payload)
            stream.version, stream.in_flight = versions[-1], None
            self.acks += 1
            if self.acks >= self.threshold:
                self.enough.set()


def _rest_writer(url: str, load: Load, keys: list[str], rng: random.Random, label: str) -> None:
    try:
        with httpx.Client(base_url=url, timeout=WAIT_S) as client:
            for serial in range(10**9):
                key = rng.choice(keys)
                stream = load.streams[key]
                payloads = [f"{label}-{serial}-{i}" for i in range(rng.randrange(1, 4))]
                stream.in_flight = payloads
                answer = client.post(TOPIC_URL, json={
                    "producerName": label, "expectedKeyVersions": {key: stream.version},
                    "messages": [{"payload": p, "key": key} for p in payloads]})
                if answer.status_code != 200:  # a writer owns its keys: nothing else moves them
                    load.errors.append(f"{key}: {answer.text}")
                    return
                results = answer.json()["messagePublishResults"]
                load.acked(stream, [r["keyVersion"] for r in results], [r["offset"] for r in results], payloads)
    except httpx.TransportError:
        return  # the broker died under the writer


def _ws_writer(url: str, load: Load, keys: list[str], rng: random.Random) -> None:
    try:
        with open_ws(f"{ws_base(url)}/ws/v2/producer/persistent/{TOPIC}?producerName=ws-writer") as ws:
            for serial in range(10**9):
                key = rng.choice(keys)
                stream = load.streams[key]
                payload = f"ws-{serial}"
                stream.in_flight = [payload]
                send_frame(ws, {"payload": b64(payload), "key": key, "expectedKeyVersion": stream.version,
                                "context": str(serial)})
                answer = recv_frame(ws, timeout_s=WAIT_S)
                if answer["result"] != "ok":
                    load.errors.append(f"{key}: {answer}")
                    return
                load.acked(stream, [answer["keyVersion"]], [answer["offset"]], [payload])
    except (OSError, ConnectionClosed):
        return  # the broker died under the writer


def _read_stream(client: httpx.Client, key: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    version = 0
    while True:
        answer = client.get(f"{TOPIC_URL}/keys/{urllib.parse.quote(key, safe='')}/messages",
                            params={"fromVersion": version, "maxMessages": 1000})
        assert answer.status_code == 200, answer.text
        page = answer.json()["messages"]
        if not page:
            return events
        events.extend(page)
        version = answer.json()["nextVersion"]


def _check_after_restart(url: str, load: Load, context: str) -> None:
    with httpx.Client(base_url=url, timeout=WAIT_S) as client:
        for key, stream in load.streams.items():
            events = _read_stream(client, key)
            versions = [e["keyVersion"] for e in events]
            assert versions == list(range(len(events))), f"{key} is not dense: {versions[:20]}; {context}"
            stored = {e["keyVersion"]: (e["offset"], base64.b64decode(e["payload"]).decode()) for e in events}
            for version, acked in stream.acked.items():
                assert stored.get(version) == acked, f"{key} v{version}: acked {acked}, stored " \
                                                     f"{stored.get(version)}; {context}"
            head = len(events) - 1
            if head != stream.version:  # an append in flight at the kill became durable
                assert stream.in_flight is not None and head == stream.version + len(stream.in_flight), \
                    f"{key}: version {head}, last acknowledged {stream.version}; {context}"
                assert [stored[v][1] for v in range(stream.version + 1, head + 1)] == stream.in_flight, context
                for version in range(stream.version + 1, head + 1):
                    stream.acked[version] = stored[version]
            answer = client.post(TOPIC_URL, json={"producerName": "checker", "expectedKeyVersions": {key: head},
                                                  "messages": [{"payload": f"check-{context}", "key": key}]})
            assert answer.status_code == 200, f"{key} at {head}: {answer.text}; {context}"
            result = answer.json()["messagePublishResults"][0]
            assert result["keyVersion"] == head + 1, context
            stream.acked[head + 1] = (result["offset"], f"check-{context}")
            stream.version, stream.in_flight = head + 1, None


def test_conditional_appends_survive_kill9(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    data = tmp_path / "data"
    rest_keys = [[f"acct-{w}-{k}" for k in range(KEYS_PER_WRITER)] for w in range(REST_WRITERS)]
    ws_keys = [f"acct-ws-{k}" for k in range(KEYS_PER_WRITER)]
    streams = {key: Stream() for key in [*(k for keys in rest_keys for k in keys), *ws_keys]}
    for round_index in range(ROUNDS):
        context = f"seed={seed} round={round_index}"
        load = Load(streams, threshold=rng.randrange(100, 1500))
        with standalone_process(data) as (url, proc):
            writers = [threading.Thread(target=_rest_writer, args=(url, load, keys, random.Random(rng.random()),
                                                                   f"rest{w}-r{round_index}"))
                       for w, keys in enumerate(rest_keys)]
            writers.append(threading.Thread(target=_ws_writer, args=(url, load, ws_keys, random.Random(rng.random()))))
            for writer in writers:
                writer.start()
            assert load.enough.wait(WAIT_S * 2), f"only {load.acks} appends acknowledged; {context}"
            stop(proc, kill=True)
            for writer in writers:
                writer.join(WAIT_S)
                assert not writer.is_alive(), context
        assert not load.errors, f"{load.errors[:3]}; {context}"
        with standalone_process(data) as (url, _):
            _check_after_restart(url, load, context)
