"""Serving benchmark: aggregate publish over many topics with two brokers against one, same bookies.

Role: the measure behind ``bench/cluster_bench.py --serving``. One cluster (ZooKeeper, three
bookies at E=3 Qw=2 Qa=2, two ``magnetar broker``) runs both layouts, alternating rounds so
drift on the shared machine falls on both alike: "one broker" publishes to ``TOPICS`` topics
of a namespace with a single bundle (every topic on one broker, the other idle); "two brokers"
to ``TOPICS`` fresh topics of a namespace with ``BUNDLES_SPREAD`` bundles, which the first
lookups spread over both. Each topic has one WebSocket producer on its owner (found by a
lookup), ``WINDOW`` publishes in flight, one entry per message.

Reported per layout: acknowledged msg/s summed over topics, the ratio two/one, the brokers'
CPU per message (summed over brokers: it must not grow with their number), the bookies' CPU
per message, and the share of a core each process got (the machine has 2 cores shared by
every process of the cluster and the load generator, so two brokers compete with the rest
for the same cores: the ratio says what a second broker buys here, not on a second machine).

A broker's CPU per message falls as its load rises (more frames per socket read, more entries
per request to a bookie, more work per loop turn), so splitting one fixed load over two brokers
raises it for a reason that has nothing to do with the number of brokers. The paced rounds
separate the two: every topic is offered ``PACED_RATE_PER_TOPIC`` msg/s, and "one broker" with
``TOPICS`` topics, "two brokers" with ``TOPICS`` topics and "one broker, half the topics" (the
load each of the two brokers carries) are measured side by side.
"""

from __future__ import annotations

import asyncio
import base64
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx
import websockets
from common import Row, system_busy_cpu_s
from e2e_support import Plan, ServerProcess, process_cpu_s

TOPICS = 20
BUNDLES_SPREAD = 8
WINDOW = 50
ROUNDS = 2
PACED_RATE_PER_TOPIC = 300
"""msg/s offered to each topic in the paced rounds (well below what the cluster sustains here)."""
PACED_TICK_S = 0.01
PAYLOAD_BYTES = 100
LOOKUP_TIMEOUT_S = 30.0
WS_OPTIONS: dict[str, Any] = {"compression": None, "max_size": None, "open_timeout": 30.0}


@dataclass(frozen=True)
class Layout:
    messages: int
    wall_s: float
    brokers_cpu_s: dict[str, float]
    bookies_cpu_s: float
    zookeeper_cpu_s: float
    client_cpu_s: float
    other_cpu_s: float
    topics_per_broker: dict[str, int]

    @property
    def messages_per_s(self) -> float:
        return self.messages / max(self.wall_s, 1e-9)


async def _publish_topic(url: str, seconds: float, payload_b64: str, rate_per_s: float | None) -> int:
    """Publish for ``seconds``: as fast as the window allows, or ``rate_per_s`` on a schedule
    (the messages due are sent every ``PACED_TICK_S``)."""
    acked = 0
    window = asyncio.Semaphore(WINDOW)
    async with websockets.connect(f"{url}?maxPendingMessages={WINDOW}", **WS_OPTIONS) as ws:

        async def receive() -> None:
            nonlocal acked
            async for text in ws:
                if '"ok"' not in str(text):
                    raise RuntimeError(f"publish failed: {str(text)[:200]}")
                acked += 1
                window.release()

        receiving = asyncio.create_task(receive())
        started_s = time.perf_counter()
        deadline_s = started_s + seconds
        sent = 0
        while (now_s := time.perf_counter()) < deadline_s:
            due = sent + 1 if rate_per_s is None else int((now_s - started_s) * rate_per_s) + 1
            if sent >= due:
                await asyncio.sleep(PACED_TICK_S)
                continue
            await window.acquire()
            await ws.send(f'{{"payload":"{payload_b64}","context":"{sent}"}}')
            sent += 1
        drain_deadline_s = time.monotonic() + 30
        while acked < sent and time.monotonic() < drain_deadline_s:
            if receiving.done():
                receiving.result()
            await asyncio.sleep(0.01)
        receiving.cancel()
    return acked


async def _publish_all(owners: dict[str, str], namespace: str, seconds: float, rate_per_s: float | None) -> int:
    payload_b64 = base64.b64encode(os.urandom(PAYLOAD_BYTES)).decode("ascii")
    counts = await asyncio.gather(*(
        _publish_topic(f"{owner.replace('http://', 'ws://')}/ws/v2/producer/persistent/{namespace}/{topic}",
                       seconds, payload_b64, rate_per_s) for topic, owner in owners.items()))
    return sum(counts)


def _lookups(first: str, namespace: str, topics: list[str]) -> dict[str, str]:
    owners = {}
    with httpx.Client(timeout=LOOKUP_TIMEOUT_S) as http:
        for topic in topics:
            response = http.get(f"{first}/lookup/v2/topic/persistent/{namespace}/{topic}")
            response.raise_for_status()
            owners[topic] = str(response.json()["httpUrl"])
    return owners


def _layout(brokers: list[ServerProcess], bookies: list[ServerProcess], zookeeper: ServerProcess,
            namespace: str, bundles: int, round_index: int, plan: Plan, *, topic_count: int = TOPICS,
            rate_per_s: float | None = None) -> Layout:
    first = f"http://127.0.0.1:{brokers[0].port}"
    response = httpx.put(f"{first}/admin/v2/namespaces/{namespace}", json={"bundles": {"numBundles": bundles}},
                         timeout=LOOKUP_TIMEOUT_S)
    if response.status_code not in (204, 409):
        raise RuntimeError(f"cannot create {namespace}: {response.status_code} {response.text}")
    topics = [f"r{round_index}-t{i}" for i in range(topic_count)]
    owners = _lookups(first, namespace, topics)
    # warm-up: every topic loaded (ledger opened) and its connection path exercised before measuring
    asyncio.run(_publish_all(owners, namespace, 0.5, rate_per_s))
    brokers_before = {b.name: process_cpu_s(b.pid) for b in brokers}
    bookies_before, zk_before = sum(process_cpu_s(b.pid) for b in bookies), process_cpu_s(zookeeper.pid)
    busy_before, client_before, started = system_busy_cpu_s(), time.process_time(), time.perf_counter()
    messages = asyncio.run(_publish_all(owners, namespace, plan.publish_duration_s, rate_per_s))
    wall_s = time.perf_counter() - started
    brokers_cpu = {b.name: process_cpu_s(b.pid) - brokers_before[b.name] for b in brokers}
    bookies_cpu = sum(process_cpu_s(b.pid) for b in bookies) - bookies_before
    zk_cpu = process_cpu_s(zookeeper.pid) - zk_before
    client_cpu = time.process_time() - client_before
    other = system_busy_cpu_s() - busy_before - sum(brokers_cpu.values()) - bookies_cpu - zk_cpu - client_cpu
    by_url = {f"http://127.0.0.1:{b.port}": b.name for b in brokers}
    per_broker = {b.name: 0 for b in brokers}
    for owner in owners.values():
        per_broker[by_url[owner]] += 1
    return Layout(messages, wall_s, brokers_cpu, bookies_cpu, zk_cpu, client_cpu, other, per_broker)


ONE, TWO = "one broker", "two brokers"
PACED_ONE, PACED_TWO, PACED_HALF = "paced, one broker", "paced, two brokers", "paced, one broker, half the topics"


def run_serving(brokers: list[ServerProcess], bookies: list[ServerProcess], zookeeper: ServerProcess,
                plan: Plan) -> dict[str, list[Layout]]:
    results: dict[str, list[Layout]] = {ONE: [], TWO: [], PACED_ONE: [], PACED_TWO: [], PACED_HALF: []}
    layouts: tuple[tuple[str, str, int, int, float | None], ...] = (
        (ONE, "public/serving-one", 1, TOPICS, None),
        (TWO, "public/serving-two", BUNDLES_SPREAD, TOPICS, None),
        (PACED_ONE, "public/paced-one", 1, TOPICS, PACED_RATE_PER_TOPIC),
        (PACED_TWO, "public/paced-two", BUNDLES_SPREAD, TOPICS, PACED_RATE_PER_TOPIC),
        (PACED_HALF, "public/paced-half", 1, TOPICS // 2, PACED_RATE_PER_TOPIC))
    for round_index in range(ROUNDS):
        for label, namespace, bundles, topic_count, rate_per_s in layouts:
            print(f"serving, {label}, round {round_index + 1} ...", flush=True)
            results[label].append(_layout(brokers, bookies, zookeeper, namespace, bundles, round_index, plan,
                                          topic_count=topic_count, rate_per_s=rate_per_s))
    return results


def _share(cpu_s: float, wall_s: float) -> str:
    return f"{cpu_s / max(wall_s, 1e-9):.0%}"


def _brokers_us(layout: Layout) -> float:
    return sum(layout.brokers_cpu_s.values()) / max(layout.messages, 1) * 1e6


def _mean(layouts: list[Layout], measure: Any) -> float:
    return statistics.mean(measure(layout) for layout in layouts) if layouts else 0.0


def serving_rows(results: dict[str, list[Layout]]) -> list[Row]:
    rows = []
    one = _mean(results[ONE], lambda r: r.messages_per_s)
    paced_one_us = _mean(results[PACED_ONE], _brokers_us)
    half_us = _mean(results[PACED_HALF], _brokers_us)
    for label, layouts in results.items():
        topic_count = TOPICS // 2 if label == PACED_HALF else TOPICS
        for index, layout in enumerate(layouts):
            per_message = max(layout.messages, 1)
            brokers_us = _brokers_us(layout)
            ratio = ""
            if label == TWO:
                ratio = f"{layout.messages_per_s / max(one, 1e-9):.2f}x of one broker (mean)"
            elif label == PACED_TWO:
                ratio = (f"brokers CPU/msg {brokers_us / max(paced_one_us, 1e-9):.2f}x of paced one broker, "
                         f"{brokers_us / max(half_us, 1e-9):.2f}x of one broker with half the topics (means)")
            shares = ", ".join(f"{name} {_share(cpu, layout.wall_s)} ({layout.topics_per_broker[name]} topics)"
                               for name, cpu in layout.brokers_cpu_s.items())
            note = (f"brokers CPU {brokers_us:,.1f} µs/msg, bookies {layout.bookies_cpu_s / per_message * 1e6:,.1f} "
                    f"µs/msg; share of a core: {shares}, bookies {_share(layout.bookies_cpu_s, layout.wall_s)}, "
                    f"ZooKeeper {_share(layout.zookeeper_cpu_s, layout.wall_s)}, load generator "
                    f"{_share(layout.client_cpu_s, layout.wall_s)}, other processes "
                    f"{_share(max(layout.other_cpu_s, 0.0), layout.wall_s)}")
            rows.append(Row(f"{label}, round {index + 1}: {topic_count} topics", f"{layout.messages_per_s:,.0f} msg/s",
                            ratio, note))
    return rows
