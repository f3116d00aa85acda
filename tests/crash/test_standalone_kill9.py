"""``kill -9`` of a real ``magnetar standalone`` under a WebSocket produce load loses nothing acked.

Each round starts the broker on the same data directory, pipelines sends over the WebSocket
producer (plain or with server-side batching, chosen by the seed) and SIGKILLs the process after a
seeded number of acknowledgements, with sends still in flight. After a restart a reader from
earliest must return every acknowledged message exactly once, nothing that was never sent, and
the topic must take new writes. A failure names the seed (``MAGNETAR_CRASH_SEED`` replays it).
"""

from __future__ import annotations

import collections
import random
from pathlib import Path

import pytest

from tests.crash.harness import crash_seed
from tests.integration.ws_client import b64, open_ws, recv_frame, send_frame, unb64, ws_base
from tests.standalone import standalone_process, stop

pytestmark = pytest.mark.crash

ROUNDS = 3
WINDOW_MESSAGES = 200
ACKS_BEFORE_KILL_MAX = 3000
QUIET_READ_S = 1.5
READ_MESSAGES_MAX = ROUNDS * (ACKS_BEFORE_KILL_MAX + 2 * WINDOW_MESSAGES) + ROUNDS
TOPIC = "persistent/public/default/crash-log"


def produce_until_killed(url: str, proc_pid_kill: object, label: str, acks_before_kill: int,
                         batching: bool) -> tuple[set[bytes], set[bytes]]:
    """Send pipelined until ``acks_before_kill`` acks, then kill; (acknowledged, sent) payloads."""
    acked: set[bytes] = set()
    sent: set[bytes] = set()
    outstanding = 0
    query = "?batchingEnabled=true" if batching else ""
    with open_ws(f"{ws_base(url)}/ws/v2/producer/{TOPIC}{query}") as ws:
        seq = 0
        while len(acked) < acks_before_kill:
            while outstanding < WINDOW_MESSAGES:
                payload = f"{label}-{seq}".encode()
                send_frame(ws, {"payload": b64(payload), "context": payload.decode()})
                sent.add(payload)
                seq += 1
                outstanding += 1
            result = recv_frame(ws)
            outstanding -= 1
            assert result["result"] == "ok", result
            acked.add(result["context"].encode())
        for _ in range(WINDOW_MESSAGES // 2):  # more sends in flight at the kill
            payload = f"{label}-{seq}".encode()
            send_frame(ws, {"payload": b64(payload), "context": payload.decode()})
            sent.add(payload)
            seq += 1
        assert callable(proc_pid_kill)
        proc_pid_kill()
    return acked, sent


def read_all(url: str) -> list[bytes]:
    out: list[bytes] = []
    with open_ws(f"{ws_base(url)}/ws/v2/reader/{TOPIC}?messageId=earliest") as ws:
        while len(out) <= READ_MESSAGES_MAX:
            try:
                message = recv_frame(ws, timeout_s=QUIET_READ_S)
            except TimeoutError:
                return out
            out.append(unb64(message["payload"]))
            send_frame(ws, {"messageId": message["messageId"]})
    raise AssertionError(f"the reader returned more than the {READ_MESSAGES_MAX} messages ever sent")


def test_kill9_during_websocket_produce_loses_no_acknowledged_message(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    all_acked: set[bytes] = set()
    all_sent: set[bytes] = set()
    for round_index in range(ROUNDS):
        acks_before_kill = rng.randrange(1, ACKS_BEFORE_KILL_MAX)
        batching = rng.random() < 0.5
        with standalone_process(data_dir) as (url, proc):
            if round_index == 0:  # a durable subscription keeps everything (retention is off, as in Pulsar)
                with open_ws(f"{ws_base(url)}/ws/v2/consumer/{TOPIC}/keeper?subscriptionInitialPosition=Earliest"
                             "&pullMode=true"):
                    pass
            acked, sent = produce_until_killed(url, lambda p=proc: stop(p, kill=True), f"r{round_index}",
                                               acks_before_kill, batching)
        all_acked |= acked
        all_sent |= sent
        with standalone_process(data_dir) as (url, _):
            stored = read_all(url)
            counts = collections.Counter(stored)
            context = f"seed={seed} round={round_index} batching={batching} acks={acks_before_kill}"
            assert all_acked <= set(stored), f"lost {len(all_acked - set(stored))} acknowledged messages; {context}"
            assert not [p for p, n in counts.items() if n > 1], f"duplicates after restart; {context}"
            assert set(stored) <= all_sent, f"messages never sent appeared; {context}"
            with open_ws(f"{ws_base(url)}/ws/v2/producer/{TOPIC}") as ws:
                send_frame(ws, {"payload": b64(f"after-{round_index}"), "context": "after"})
                assert recv_frame(ws)["result"] == "ok"
            all_acked.add(f"after-{round_index}".encode())
            all_sent.add(f"after-{round_index}".encode())
