"""Producers and consumers of many topics on a broker cluster, through the Python client.

Role: the load the serving-side failover tests run while they kill, stop or unload brokers.
One background thread runs an event loop with one ``AsyncClient`` (every broker listed in its
service URL); each topic has a named producer that numbers its messages (so a publish resent
after a reconnection is deduplicated) and an Exclusive consumer that acknowledges what it
receives. Both reconnect through lookups when their broker dies or their topic moves.

What it records: per topic, the payloads whose publish the broker acknowledged, and how many
times each payload was delivered; the time of the last acknowledgement per topic. Every wait is
bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import threading
import time
from dataclasses import dataclass, field

import httpx

from consumers.client import AsyncClient, AsyncConsumer, AsyncProducer, ClientError, ReceiveTimeout, SendResult

WINDOW = 8
"""Publishes in flight per producer."""
RATE_PER_TOPIC_S = 25.0
"""Publishes started per topic and second (the machine is shared: the load is paced, not flat out)."""
SEND_TIMEOUT_MS = 90_000
FAILOVER_TIMEOUT_S = 60.0
RECEIVE_TIMEOUT_MS = 500
READ_BATCH = 1000
READS_MAX = 10_000


def stored_payloads(http: httpx.Client, broker_url: str, namespace: str, topic: str) -> list[bytes]:
    """Every payload of ``namespace/topic`` in offset order, read over REST through
    ``broker_url`` (``http`` follows 307s to the owner)."""
    payloads: list[bytes] = []
    offset = 0
    for _ in range(READS_MAX):
        response = http.get(f"{broker_url}/topics/persistent/{namespace}/{topic}/messages",
                            params={"offset": offset, "maxMessages": READ_BATCH})
        response.raise_for_status()
        messages = response.json()["messages"]
        if not messages:
            return payloads
        payloads += [base64.b64decode(m["payload"]) for m in messages]
        offset = int(response.headers["X-Magnetar-Next-Offset"])
    raise AssertionError(f"{topic} did not end within {READS_MAX} reads")


@dataclass
class TopicRecord:
    acked: set[bytes] = field(default_factory=set)
    delivered: collections.Counter[bytes] = field(default_factory=collections.Counter)
    last_ack_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class ClusterLoad:
    def __init__(self, service_url: str, topics: list[str], *, subscription: str = "load") -> None:
        self.service_url = service_url
        self.topics = topics
        self.subscription = subscription
        self.records = {topic: TopicRecord() for topic in topics}
        self.lock = threading.Lock()
        self.reconnects = 0
        self._producing = threading.Event()
        self._producing.set()
        self._stop = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="cluster-load", daemon=True)
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    # --- control (test thread) ----------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("the load did not start")
        if self._failure is not None:
            raise self._failure

    def pause_producing(self) -> None:
        self._producing.clear()

    def resume_producing(self) -> None:
        self._producing.set()

    def stop(self) -> None:
        self._stop.set()
        self._producing.set()
        self._thread.join(120)

    def acked_counts(self) -> dict[str, int]:
        with self.lock:
            return {t: len(r.acked) for t, r in self.records.items()}

    def wait_acks(self, at_least: dict[str, int], deadline_s: float) -> bool:
        """True once every topic has at least ``at_least[topic]`` acknowledged publishes."""
        while time.monotonic() < deadline_s:
            counts = self.acked_counts()
            if all(counts[t] >= n for t, n in at_least.items()):
                return True
            time.sleep(0.1)
        return False

    def wait_all_delivered(self, deadline_s: float) -> bool:
        """True once every acknowledged payload was delivered at least once."""
        while time.monotonic() < deadline_s:
            if not self.missing():
                return True
            time.sleep(0.2)
        return False

    def missing(self) -> dict[str, set[bytes]]:
        with self.lock:
            return {t: r.acked - set(r.delivered) for t, r in self.records.items() if r.acked - set(r.delivered)}

    def duplicates(self) -> dict[str, int]:
        """Deliveries beyond the first, per topic."""
        with self.lock:
            return {t: sum(n - 1 for n in r.delivered.values() if n > 1) for t, r in self.records.items()}

    # --- the load (its own thread) ------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # reported by start() or by the test's checks
            self._failure = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        async with AsyncClient(self.service_url, failover_timeout_s=FAILOVER_TIMEOUT_S) as client:
            consumers = [await client.subscribe(t, self.subscription, initial_position="earliest", reconnect=True)
                         for t in self.topics]
            producers = [await client.create_producer(t, producer_name=f"load-{i}", initial_sequence_id=0,
                                                      send_timeout_ms=SEND_TIMEOUT_MS, reconnect=True)
                         for i, t in enumerate(self.topics)]
            self._ready.set()
            tasks = [asyncio.create_task(self._produce(t, p)) for t, p in zip(self.topics, producers, strict=True)]
            tasks += [asyncio.create_task(self._consume(t, c)) for t, c in zip(self.topics, consumers, strict=True)]
            while not self._stop.is_set():
                await asyncio.sleep(0.1)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.reconnects = sum(p.reconnects for p in producers) + sum(c.reconnects for c in consumers)

    async def _produce(self, topic: str, producer: AsyncProducer) -> None:
        record = self.records[topic]
        sequence = 0
        in_flight: set[asyncio.Future[None]] = set()
        while not self._stop.is_set():
            if not self._producing.is_set() or len(in_flight) >= WINDOW:
                if in_flight:
                    await asyncio.wait(in_flight, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
                else:
                    await asyncio.sleep(0.05)
                continue
            sequence += 1
            await asyncio.sleep(1.0 / RATE_PER_TOPIC_S)
            payload = f"{topic}:{sequence}".encode()
            try:
                future = await producer.send_async(payload)
            except ClientError as exc:
                record.errors.append(f"send {sequence}: {exc}")
                await asyncio.sleep(0.2)
                continue
            task: asyncio.Future[None] = asyncio.ensure_future(self._settle(record, payload, future))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)

    async def _settle(self, record: TopicRecord, payload: bytes, future: asyncio.Future[SendResult]) -> None:
        try:
            await future
        except ClientError as exc:
            with self.lock:
                record.errors.append(f"{payload!r}: {exc}")
            return
        with self.lock:
            record.acked.add(payload)
            record.last_ack_s = time.monotonic()

    async def _consume(self, topic: str, consumer: AsyncConsumer) -> None:
        record = self.records[topic]
        while not self._stop.is_set():
            try:
                message = await consumer.receive(RECEIVE_TIMEOUT_MS)
            except ReceiveTimeout:
                continue
            except ClientError as exc:
                with self.lock:
                    record.errors.append(f"receive: {exc}")
                await asyncio.sleep(0.2)
                continue
            with self.lock:
                record.delivered[message.data] += 1
            with contextlib.suppress(ClientError):
                await consumer.acknowledge(message)
