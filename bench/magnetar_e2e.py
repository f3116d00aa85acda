"""Magnetar's side of the end-to-end benchmark: a real ``magnetar standalone`` and Python clients.

Role: the phases ``bench/e2e_bench.py`` runs against Magnetar, each the counterpart of an
anchor phase in ``bench/anchors.py`` and bounded by the same :class:`Plan`:

- publish over REST produce (Pulsar PIP-64, ``api/rest_produce.py``): every request carries
  ``rest_messages_per_request`` base64 payloads and is one entry; ``rest_requests_in_flight``
  keep-alive connections each keep one request in flight;
- publish over the WebSocket producer (Pulsar WebSocket API v2, ``api/ws/``): one frame per
  message, ``publish_window_messages`` frames sent and not yet answered; with
  ``batchingEnabled=true`` the server stores frames that arrive together as one batch entry;
- catch-up with a WebSocket reader from ``earliest``: every message arrives as a JSON frame and
  is acknowledged (Pulsar's readers ack to free flow credit; ``receiverQueueSize`` is capped at
  1000), and with the HTTP range read (``api/rest_read.py``, Arrow IPC stream);
- end-to-end latency: a WebSocket consumer subscribed before a paced WebSocket producer starts,
  acknowledging every message.

Every publish counts only acknowledged messages (``result: ok`` with an offset, or a 200 with
``errorCode`` 0 for every message); every reader decodes and touches every payload. The server
is started with ``--log-level warning`` (no per-request access log) and stopped by its PID.
WebSocket compression is off on both sides, as for the anchors' protocols.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import websockets
from e2e_support import (
    START_TIMEOUT_S,
    CpuSpent,
    Latency,
    LatencyRecorder,
    Plan,
    ServerProcess,
    Throughput,
    free_port,
    measured_cpu,
    paced_due_s,
    probe_payload,
    seconds_until,
    started,
)

NAMESPACE_PATH = "persistent/public/default"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
NEXT_OFFSET_HEADER = "X-Magnetar-Next-Offset"
HEALTH_POLL_INTERVAL_S = 0.1
HTTP_TIMEOUT_S = 60.0
REST_BODIES_PER_CONNECTION = 2
SUBSCRIBE_SETTLE_S = 0.2
DRAIN_POLL_S = 0.001
LATENCY_SUBSCRIPTION = "e2e-latency"
WS_OPTIONS: dict[str, Any] = {"compression": None, "max_size": None, "open_timeout": START_TIMEOUT_S}


def start_magnetar(work_dir: Path) -> ServerProcess:
    """``magnetar standalone`` from this interpreter's environment, waited for on ``/healthz``."""
    executable = Path(sys.executable).parent / "magnetar"
    port = free_port()
    argv = [str(executable), "standalone", "--data-dir", str(work_dir / "magnetar"), "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning"]
    return started(ServerProcess("magnetar", argv, port, work_dir / "magnetar.log"), wait_for_health)


def wait_for_health(server: ServerProcess) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            if httpx.get(f"{http_base(server)}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(HEALTH_POLL_INTERVAL_S)
    raise RuntimeError(f"magnetar did not answer /healthz within {START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


def http_base(server: ServerProcess) -> str:
    return f"http://127.0.0.1:{server.port}"


def ws_url(server: ServerProcess, kind: str, topic: str, query: str = "") -> str:
    suffix = f"?{query}" if query else ""
    return f"ws://127.0.0.1:{server.port}/ws/v2/{kind}/{NAMESPACE_PATH}/{topic}{suffix}"


# --- publish: REST produce ----------------------------------------------------------------


def rest_body(producer_name: str, messages: int, payload_bytes: int) -> bytes:
    payload = base64.b64encode(os.urandom(payload_bytes)).decode("ascii")
    body = {"producerName": producer_name, "payloadEncoding": "base64",
            "messages": [{"payload": payload} for _ in range(messages)]}
    return json.dumps(body, separators=(",", ":")).encode()


def checked_rest_results(response: httpx.Response, expected: int) -> int:
    """The number of messages a produce response acknowledges; anything else is an error."""
    if response.status_code != 200:
        raise RuntimeError(f"REST produce answered {response.status_code}: {response.text[:300]}")
    results = response.json()["messagePublishResults"]
    acked = sum(1 for r in results if r["errorCode"] == 0 and r["offset"] is not None)
    if acked != expected or len(results) != expected:
        raise RuntimeError(f"REST produce acknowledged {acked} of {expected} messages")
    return acked


async def rest_publish(server: ServerProcess, plan: Plan, payload_bytes: int, topic: str) -> Throughput:
    connections, per_request = plan.rest_requests_in_flight, plan.rest_messages_per_request
    url = f"{http_base(server)}/topics/{NAMESPACE_PATH}/{topic}"
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    bodies = [[rest_body(f"e2e-rest-{c}", per_request, payload_bytes) for _ in range(REST_BODIES_PER_CONNECTION)]
              for c in range(connections)]
    cpu: list[CpuSpent] = []
    async with httpx.AsyncClient(limits=limits, timeout=HTTP_TIMEOUT_S) as client:
        await client.get(f"{http_base(server)}/healthz")

        async def connection(own_bodies: list[bytes], deadline_s: float) -> int:
            acked = requests = 0
            while time.perf_counter() < deadline_s:
                body = own_bodies[requests % len(own_bodies)]
                acked += checked_rest_results(await client.post(url, content=body, headers=headers), per_request)
                requests += 1
            return acked

        with measured_cpu(server, cpu):
            started = time.perf_counter()
            deadline_s = started + plan.publish_duration_s
            counts = await asyncio.gather(*(connection(b, deadline_s) for b in bodies))
            duration_s = time.perf_counter() - started
    return Throughput(sum(counts), payload_bytes, duration_s, cpu[0],
                      f"{connections} keep-alive connections x 1 request in flight, {per_request} messages "
                      f"per request (one entry), base64 payloads")


# --- publish: WebSocket producer ----------------------------------------------------------


def send_frame(payload_b64: str, context: int) -> str:
    return f'{{"payload":"{payload_b64}","context":"{context}"}}'


class ProducerAcks:
    """Reads a WebSocket producer's results: in order, each ``ok`` with an offset."""

    def __init__(self, window: asyncio.Semaphore) -> None:
        self.window = window
        self.acked = 0

    def check(self, text: str | bytes) -> None:
        result = json.loads(text)
        if result.get("result") != "ok" or result.get("offset") is None:
            raise RuntimeError(f"WebSocket producer answered {str(result)[:300]}")
        if result.get("context") != str(self.acked):
            raise RuntimeError(f"result for context {result.get('context')!r}, expected {self.acked}")
        self.acked += 1
        self.window.release()


async def ws_publish(server: ServerProcess, plan: Plan, payload_bytes: int, topic: str, *,
                     batching: bool) -> Throughput:
    window = plan.publish_window_messages
    query = f"maxPendingMessages={window}" + ("&batchingEnabled=true&batchingMaxMessages=1000" if batching else "")
    payload_b64 = base64.b64encode(os.urandom(payload_bytes)).decode("ascii")
    outstanding = asyncio.Semaphore(window)
    acks = ProducerAcks(outstanding)
    cpu: list[CpuSpent] = []
    async with websockets.connect(ws_url(server, "producer", topic, query), **WS_OPTIONS) as producer:

        async def receive() -> None:
            async for text in producer:
                acks.check(text)

        with measured_cpu(server, cpu):
            receiving = asyncio.create_task(receive())
            started = time.perf_counter()
            deadline_s = started + plan.publish_duration_s
            sent = 0
            while time.perf_counter() < deadline_s:
                await outstanding.acquire()
                await producer.send(send_frame(payload_b64, sent))
                sent += 1
            await _wait_until(lambda: acks.acked >= sent, [receiving], plan.drain_timeout_s)
            duration_s = time.perf_counter() - started
    mode = "batchingEnabled=true (frames that arrive together become one entry)" if batching else \
        "no batching (one entry per frame)"
    return Throughput(acks.acked, payload_bytes, duration_s, cpu[0],
                      f"1 connection, window {window} frames; {mode}")


async def _wait_until(done: Callable[[], bool], tasks: list[asyncio.Task[None]], timeout_s: float) -> None:
    """Wait for ``done()`` while ``tasks`` run, bounded by ``timeout_s``; then cancel them. A
    task's error, or a task ending before ``done()``, is raised."""
    deadline = time.monotonic() + timeout_s
    try:
        while not done():
            for task in tasks:
                if task.done():
                    task.result()
                    raise RuntimeError("a receiving side stopped early")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done within {timeout_s:.0f} s")
            await asyncio.sleep(DRAIN_POLL_S)
    finally:
        for task in tasks:
            task.cancel()


# --- catch-up -----------------------------------------------------------------------------


def ack_frame(message_id: str) -> str:
    return f'{{"messageId":"{message_id}"}}'


async def ws_catch_up(server: ServerProcess, plan: Plan, topic: str, expected: int) -> Throughput:
    """A WebSocket reader from ``earliest``, acknowledging each message, until ``expected``
    messages or the deadline."""
    query = f"messageId=earliest&receiverQueueSize={plan.receiver_queue_size}"
    read = payload_total_bytes = 0
    cpu: list[CpuSpent] = []
    async with websockets.connect(ws_url(server, "reader", topic, query), **WS_OPTIONS) as reader:
        with measured_cpu(server, cpu):
            started = time.perf_counter()
            deadline_s = started + plan.catch_up_duration_s_max
            while read < expected and (now := time.perf_counter()) < deadline_s:
                try:
                    text = await asyncio.wait_for(reader.recv(), deadline_s - now)
                except TimeoutError:
                    break
                frame = json.loads(text)
                payload_total_bytes += len(base64.b64decode(frame["payload"]))
                await reader.send(ack_frame(frame["messageId"]))
                read += 1
            duration_s = time.perf_counter() - started
    return Throughput(read, payload_total_bytes // max(read, 1), duration_s, cpu[0],
                      f"WebSocket reader from earliest, receiverQueueSize {plan.receiver_queue_size}, "
                      f"one ack frame per message")


def http_range_read(server: ServerProcess, plan: Plan, topic: str, expected: int) -> Throughput:
    """``GET .../messages?offset=&maxMessages=`` as Arrow IPC streams from offset 0 on."""
    url = f"{http_base(server)}/topics/{NAMESPACE_PATH}/{topic}/messages"
    read = payload_total_bytes = offset = 0
    cpu: list[CpuSpent] = []
    with httpx.Client(timeout=HTTP_TIMEOUT_S, headers={"accept": ARROW_STREAM}) as client, measured_cpu(server, cpu):
        started = time.perf_counter()
        deadline_s = started + plan.catch_up_duration_s_max
        while read < expected and time.perf_counter() < deadline_s:
            response = client.get(url, params={"offset": offset, "maxMessages": plan.catch_up_batch_messages})
            if response.status_code != 200:
                raise RuntimeError(f"range read answered {response.status_code}: {response.text[:300]}")
            table = pa.ipc.open_stream(response.content).read_all()
            if table.num_rows == 0:
                break
            payload_total_bytes += pc.sum(pc.binary_length(table.column("value"))).as_py()
            read += table.num_rows
            offset = int(response.headers[NEXT_OFFSET_HEADER])
        duration_s = time.perf_counter() - started
    return Throughput(read, payload_total_bytes // max(read, 1), duration_s, cpu[0],
                      f"Arrow IPC stream, maxMessages {plan.catch_up_batch_messages} per request")


# --- latency ------------------------------------------------------------------------------


async def ws_latency(server: ServerProcess, plan: Plan, topic: str) -> Latency:
    """Paced WebSocket producer → WebSocket consumer (subscribed first) acking every message."""
    consumer_query = f"receiverQueueSize={plan.receiver_queue_size}"
    consumer_url = ws_url(server, "consumer", f"{topic}/{LATENCY_SUBSCRIPTION}", consumer_query)
    recorder = LatencyRecorder(plan.latency_warmup_messages)
    outstanding = asyncio.Semaphore(plan.publish_window_messages)
    acks = ProducerAcks(outstanding)
    cpu: list[CpuSpent] = []
    async with websockets.connect(consumer_url, **WS_OPTIONS) as consumer, \
            websockets.connect(ws_url(server, "producer", topic), **WS_OPTIONS) as producer:

        async def consume() -> None:
            async for text in consumer:
                received_ns = time.perf_counter_ns()
                frame = json.loads(text)
                recorder.record(base64.b64decode(frame["payload"]), received_ns)
                await consumer.send(ack_frame(frame["messageId"]))

        async def producer_results() -> None:
            async for text in producer:
                acks.check(text)

        with measured_cpu(server, cpu):
            tasks = [asyncio.create_task(consume()), asyncio.create_task(producer_results())]
            await asyncio.sleep(SUBSCRIBE_SETTLE_S)
            started = time.perf_counter()
            for index in range(plan.latency_messages):
                await asyncio.sleep(seconds_until(paced_due_s(started, index, plan.latency_rate_per_s)))
                await outstanding.acquire()
                payload_b64 = base64.b64encode(probe_payload(index, plan.latency_payload_bytes)).decode("ascii")
                await producer.send(send_frame(payload_b64, index))
            send_duration_s = time.perf_counter() - started
            await _wait_until(lambda: recorder.received >= plan.latency_messages
                              and acks.acked >= plan.latency_messages, tasks, plan.drain_timeout_s)
    return Latency(recorder.latencies_us, plan.latency_messages, recorder.received, send_duration_s, cpu[0],
                   "WebSocket producer (results not awaited per probe) → WebSocket consumer acking each message")
