"""``kill -9`` of a real ``magnetar standalone`` under a binary-protocol produce load (the
official ``pulsar-client``) loses no message whose send receipt arrived.

Each round starts the broker on the same data directory, sends asynchronously through a
``pulsar-client`` producer (batching on or off, chosen by the seed) and SIGKILLs the process after
a seeded number of receipts, with sends still in flight. After a restart a reader from earliest
must return every receipted message exactly once and nothing that was never sent, and the topic
must take new writes. A failure names the seed (``MAGNETAR_CRASH_SEED`` replays it).
"""

from __future__ import annotations

import collections
import contextlib
import random
import threading
from pathlib import Path

import pulsar
import pytest

from tests.crash.harness import crash_seed
from tests.integration.pulsar_support import binary_broker, client
from tests.standalone import stop

pytestmark = pytest.mark.crash

ROUNDS = 3
RECEIPTS_BEFORE_KILL_MAX = 3000
SENDS_IN_FLIGHT = 500
READ_TIMEOUT_MS = 5000
TOPIC = "crash-binary"


def produce_until_killed(pulsar_url: str, kill: object, label: str, receipts_before_kill: int,
                         batching: bool) -> tuple[set[bytes], set[bytes]]:
    """Send asynchronously until ``receipts_before_kill`` receipts, then kill with more in flight;
    (receipted, sent) payloads."""
    receipted: set[bytes] = set()
    sent: set[bytes] = set()
    lock = threading.Lock()
    enough = threading.Event()
    c = client(pulsar_url)
    try:
        producer = c.create_producer(TOPIC, batching_enabled=batching, batching_max_publish_delay_ms=2,
                                     max_pending_messages=SENDS_IN_FLIGHT * 2, block_if_queue_full=True,
                                     send_timeout_millis=0)

        def done(payload: bytes) -> object:
            def callback(result: pulsar.Result, _: pulsar.MessageId) -> None:
                if result == pulsar.Result.Ok:
                    with lock:
                        receipted.add(payload)
                        if len(receipted) >= receipts_before_kill:
                            enough.set()
            return callback

        seq = 0
        while not enough.is_set():
            for _ in range(SENDS_IN_FLIGHT):
                payload = f"{label}-{seq}".encode()
                sent.add(payload)
                producer.send_async(payload, done(payload))
                seq += 1
            enough.wait(0.05)
        for _ in range(SENDS_IN_FLIGHT):  # more sends in flight at the kill
            payload = f"{label}-{seq}".encode()
            sent.add(payload)
            producer.send_async(payload, done(payload))
            seq += 1
        assert callable(kill)
        kill()
        with lock:
            return set(receipted), sent
    finally:
        with contextlib.suppress(pulsar.PulsarException):
            c.close()


def read_all(pulsar_url: str, limit: int) -> list[bytes]:
    c = client(pulsar_url)
    try:
        reader = c.create_reader(TOPIC, pulsar.MessageId.earliest)
        out: list[bytes] = []
        while reader.has_message_available():
            out.append(reader.read_next(READ_TIMEOUT_MS).data())
            assert len(out) <= limit, f"the reader returned more than the {limit} messages ever sent"
        return out
    finally:
        c.close()


def test_kill9_during_binary_produce_loses_no_receipted_message(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    all_receipted: set[bytes] = set()
    all_sent: set[bytes] = set()
    for round_index in range(ROUNDS):
        receipts_before_kill = rng.randrange(1, RECEIPTS_BEFORE_KILL_MAX)
        batching = rng.random() < 0.5
        with binary_broker(data_dir) as (_, pulsar_url, proc):
            if round_index == 0:  # a durable subscription keeps everything (retention is off, as in Pulsar)
                keeper = client(pulsar_url)
                keeper.subscribe(TOPIC, "keeper", initial_position=pulsar.InitialPosition.Earliest).close()
                keeper.close()
            receipted, sent = produce_until_killed(pulsar_url, lambda p=proc: stop(p, kill=True), f"r{round_index}",
                                                   receipts_before_kill, batching)
        all_receipted |= receipted
        all_sent |= sent
        with binary_broker(data_dir) as (_, pulsar_url, _):
            stored = read_all(pulsar_url, len(all_sent))
            counts = collections.Counter(stored)
            context = f"seed={seed} round={round_index} batching={batching} receipts={receipts_before_kill}"
            assert all_receipted <= set(stored), \
                f"lost {len(all_receipted - set(stored))} receipted messages; {context}"
            assert not [p for p, n in counts.items() if n > 1], f"duplicates after restart; {context}"
            assert set(stored) <= all_sent, f"messages never sent appeared; {context}"
            c = client(pulsar_url)
            try:
                c.create_producer(TOPIC).send(f"after-{round_index}".encode())
            finally:
                c.close()
            all_receipted.add(f"after-{round_index}".encode())
            all_sent.add(f"after-{round_index}".encode())
