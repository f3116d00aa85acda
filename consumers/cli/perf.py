"""``magnetar perf produce|consume``: load generator and consumer with live rates and latency
percentiles, in the spirit of ``pulsar-perf``.

Role: drive the asyncio client (``consumers.client.AsyncClient``) as fast as it goes, or at a
fixed rate, and report once a second (msg/s, MB/s) and at the end (totals and latency
percentiles p50/p95/p99/p99.9/max in ms). ``produce`` measures publish latency (send to durable
acknowledgement), over WebSocket or REST; ``consume`` measures end-to-end latency from the send
time that ``perf produce`` writes at the start of each payload (``PAYLOAD_MAGIC`` + epoch µs),
or from the broker's publish time for other messages.

Invariants: in-flight work is bounded (``--max-pending`` publishes, ``REST_REQUESTS_IN_FLIGHT_MAX``
requests); the latency histogram has a bounded number of buckets (log-spaced,
``HISTOGRAM_PRECISION`` relative error); Ctrl-C stops the run and still prints the summary; the
run ends after ``-m`` messages, ``-time`` seconds, or (consume) ``--timeout-s`` without a
message. Options are pulsar-perf's: ``-m/--num-messages`` counts messages over all producers
(consumers), ``-n/--num-producers`` (``--num-consumers``) opens that many on one connection, and
``-r/--rate`` is the total rate, shared by them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from consumers.cli.options import EXIT_FAILURE, add_subscription_type, positive, tls_options
from consumers.client import AsyncClient, ClientError, Message, ReceiveTimeout, SendResult

PAYLOAD_MAGIC = b"MGPF"
PAYLOAD_HEADER = struct.Struct(">4sQ")  # magic, send time in epoch microseconds
REPORT_INTERVAL_S = 1.0
HISTOGRAM_PRECISION = 0.01
REST_REQUESTS_IN_FLIGHT_MAX = 16
REST_BATCH_MESSAGES_DEFAULT = 100
RECEIVE_POLL_MS = 200
PERCENTILES = ((50.0, "p50"), (95.0, "p95"), (99.0, "p99"), (99.9, "p99.9"))
BYTES_PER_MB = 1024 * 1024


class LatencyHistogram:
    """Latencies in log-spaced buckets: percentiles within ``HISTOGRAM_PRECISION``, exact max."""

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.max_ms = 0.0
        self._log_base = math.log1p(HISTOGRAM_PRECISION)

    def record(self, latency_ms: float) -> None:
        micros = max(latency_ms * 1000, 1.0)
        bucket = int(math.log(micros) / self._log_base)
        self._buckets[bucket] = self._buckets.get(bucket, 0) + 1
        self.count += 1
        self.max_ms = max(self.max_ms, latency_ms)

    def percentile_ms(self, percent: float) -> float:
        if not self.count:
            return 0.0
        rank = math.ceil(self.count * percent / 100)
        seen = 0
        for bucket in sorted(self._buckets):
            seen += self._buckets[bucket]
            if seen >= rank:
                return min(math.exp((bucket + 1) * self._log_base) / 1000, self.max_ms)
        return self.max_ms

    def summary(self) -> str:
        parts = [f"{label} {self.percentile_ms(p):.3f}" for p, label in PERCENTILES]
        return " - ".join([*parts, f"max {self.max_ms:.3f}"])


@dataclass
class Meter:
    """Counts for the live report (since the last report) and the final one (since the start)."""

    verb: str
    started_s: float = field(default_factory=time.monotonic)
    messages: int = 0
    size_bytes: int = 0
    errors: int = 0
    first_error: str | None = None
    _window_messages: int = 0
    _window_bytes: int = 0
    _window_start_s: float = field(default_factory=time.monotonic)

    def add(self, size_bytes: int) -> None:
        self.messages += 1
        self.size_bytes += size_bytes
        self._window_messages += 1
        self._window_bytes += size_bytes

    def fail(self, error: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = str(error)

    def report(self, histogram: LatencyHistogram, extra: str = "") -> str:
        now = time.monotonic()
        elapsed_s = max(now - self._window_start_s, 1e-9)
        line = (f"{self.verb}: {self._window_messages / elapsed_s:10.1f} msg/s --- "
                f"{self._window_bytes / elapsed_s / BYTES_PER_MB:8.3f} MB/s --- total {self.messages}"
                f" --- errors {self.errors}{extra} --- latency ms: {histogram.summary()}")
        self._window_messages = self._window_bytes = 0
        self._window_start_s = now
        return line

    def final(self, histogram: LatencyHistogram, latency_name: str) -> str:
        elapsed_s = max(time.monotonic() - self.started_s, 1e-9)
        lines = [f"Aggregated: {self.messages} messages {self.verb} in {elapsed_s:.2f} s --- "
                 f"{self.messages / elapsed_s:.1f} msg/s --- {self.size_bytes / elapsed_s / BYTES_PER_MB:.3f} MB/s"
                 f" --- errors {self.errors}",
                 f"{latency_name} latency ms: {histogram.summary()}"]
        if self.first_error:
            lines.append(f"first error: {self.first_error}")
        return "\n".join(lines)


def make_payload(size_bytes: int) -> bytes:
    """``size_bytes`` of payload starting with the send time (when there is room for it)."""
    if size_bytes < PAYLOAD_HEADER.size:
        return b"x" * size_bytes
    header = PAYLOAD_HEADER.pack(PAYLOAD_MAGIC, time.time_ns() // 1000)
    return header + b"x" * (size_bytes - PAYLOAD_HEADER.size)


def end_to_end_ms(message: Message, now_us: int) -> float | None:
    if len(message.data) >= PAYLOAD_HEADER.size:
        magic, sent_us = PAYLOAD_HEADER.unpack_from(message.data)
        if magic == PAYLOAD_MAGIC:
            return max(now_us - int(sent_us), 0) / 1000
    if message.publish_time_ms is not None:
        return max(now_us / 1000 - message.publish_time_ms, 0.0)
    return None


# --- the run harness -----------------------------------------------------------------------------
class _Run:
    """Stop conditions, the once-a-second reporter and Ctrl-C handling shared by both commands."""

    def __init__(self, args: argparse.Namespace, meter: Meter, histogram: LatencyHistogram,
                 extra: Callable[[], str] = lambda: "") -> None:
        self.stop = asyncio.Event()
        self._args = args
        self._meter = meter
        self._histogram = histogram
        self._extra = extra
        self._deadline_s = None if args.time_s is None else time.monotonic() + args.time_s

    def more(self, done: int) -> bool:
        if self.stop.is_set() or (self._args.num_messages and done >= self._args.num_messages):
            return False
        return self._deadline_s is None or time.monotonic() < self._deadline_s

    def remaining_s(self) -> float | None:
        return None if self._deadline_s is None else max(self._deadline_s - time.monotonic(), 0.0)

    async def run(self, body: Awaitable[object]) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self.stop.set)
        reporter = loop.create_task(self._report())
        try:
            await body
        finally:
            reporter.cancel()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(REPORT_INTERVAL_S)
            print(self._meter.report(self._histogram, self._extra()), flush=True)


# --- produce -----------------------------------------------------------------------------------
def _perf_produce(args: argparse.Namespace) -> int:
    meter, histogram = Meter("produced"), LatencyHistogram()
    asyncio.run(_produce_main(args, meter, histogram))
    print(meter.final(histogram, "Publish"), flush=True)
    return EXIT_FAILURE if meter.errors else 0


async def _pace(run: _Run, index: int, start_s: float, rate: float) -> None:
    if rate > 0:
        delay_s = start_s + index / rate - time.monotonic()
        if delay_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.stop.wait(), delay_s)


async def _produce_main(args: argparse.Namespace, meter: Meter, histogram: LatencyHistogram) -> None:
    async with AsyncClient(args.service_url, args.token or None, **tls_options(args)) as client:
        if args.rest:
            run = _Run(args, meter, histogram)
            await run.run(_produce_rest(client, args, run, meter, histogram))
            return
        producers = [await client.create_producer(args.topic, batching=args.batching,
                                                  max_pending_messages=args.max_pending)
                     for _ in range(args.num_producers)]
        run = _Run(args, meter, histogram, lambda: f" --- pending {sum(p.pending_messages for p in producers)}")
        print(f"Created {len(producers)} producers", flush=True)

        def on_done(size_bytes: int, sent_s: float) -> Callable[[asyncio.Future[SendResult]], None]:
            def done(future: asyncio.Future[SendResult]) -> None:
                error = future.exception()
                if error is not None:
                    meter.fail(error)
                else:
                    histogram.record((time.perf_counter() - sent_s) * 1000)
                    meter.add(size_bytes)
            return done

        start_s, sent = time.monotonic(), [0]  # messages sent by all producers: -m and -r count them all

        async def one(producer: Any) -> None:
            while run.more(sent[0]):
                index = sent[0]
                sent[0] += 1
                await _pace(run, index, start_s, args.rate)
                payload = make_payload(args.size)
                sent_s = time.perf_counter()
                future = await producer.send_async(payload)
                future.add_done_callback(on_done(len(payload), sent_s))
            await producer.flush()

        await run.run(asyncio.gather(*(one(p) for p in producers)))
        for producer in producers:
            await producer.close()


async def _produce_rest(client: AsyncClient, args: argparse.Namespace, run: _Run, meter: Meter,
                        histogram: LatencyHistogram) -> None:
    """One PIP-64 request per message (``--batching``: up to ``--batch-max`` per request)."""
    in_flight = asyncio.Semaphore(REST_REQUESTS_IN_FLIGHT_MAX)
    per_request = args.batch_max if args.batching else 1
    tasks: set[asyncio.Task[None]] = set()

    async def post(payloads: list[bytes]) -> None:
        sent_s = time.perf_counter()
        try:
            await client.produce_batch(args.topic, payloads)
        except ClientError as exc:
            for _ in payloads:
                meter.fail(exc)
        else:
            latency_ms = (time.perf_counter() - sent_s) * 1000
            for payload in payloads:
                histogram.record(latency_ms)
                meter.add(len(payload))
        finally:
            in_flight.release()

    start_s, index = time.monotonic(), 0
    while run.more(index):
        await _pace(run, index, start_s, args.rate)
        count = per_request if not args.num_messages else min(per_request, args.num_messages - index)
        batch = [make_payload(args.size) for _ in range(count)]
        await in_flight.acquire()
        task = asyncio.get_running_loop().create_task(post(batch))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        index += count
    if tasks:
        await asyncio.wait(tasks)


# --- consume -----------------------------------------------------------------------------------
def _perf_consume(args: argparse.Namespace) -> int:
    meter, histogram = Meter("consumed"), LatencyHistogram()
    timed_out = asyncio.run(_consume_main(args, meter, histogram))
    print(meter.final(histogram, "End-to-end"), flush=True)
    if timed_out and args.num_messages and meter.messages < args.num_messages:
        print(f"no message for {args.timeout_s:g} s", file=sys.stderr)
        return EXIT_FAILURE
    return 0


async def _consume_main(args: argparse.Namespace, meter: Meter, histogram: LatencyHistogram) -> bool:
    """Consume until a stop condition; True when it ended because no message came in time."""
    idle_timed_out = False
    async with AsyncClient(args.service_url, args.token or None, **tls_options(args)) as client:
        consumers = [await client.subscribe(args.topic, args.subscription, subscription_type=args.subscription_type,
                                            initial_position=args.subscription_position,
                                            receiver_queue_size=args.receiver_queue_size)
                     for _ in range(args.num_consumers)]
        run = _Run(args, meter, histogram)
        print(f"Created {len(consumers)} consumers", flush=True)
        idle_since_s = time.monotonic()  # the last message any consumer received

        async def one(consumer: Any) -> None:
            nonlocal idle_timed_out, idle_since_s
            while run.more(meter.messages):
                remaining_s = run.remaining_s()
                wait_ms = RECEIVE_POLL_MS if remaining_s is None else min(RECEIVE_POLL_MS, int(remaining_s * 1000))
                try:
                    message = await consumer.receive(wait_ms)
                except ReceiveTimeout:
                    if args.timeout_s is not None and time.monotonic() - idle_since_s >= args.timeout_s:
                        idle_timed_out = True
                        run.stop.set()
                        return
                    continue
                idle_since_s = time.monotonic()
                if not run.more(meter.messages):
                    return  # another consumer took the last of -m: this one stays unacknowledged
                latency_ms = end_to_end_ms(message, time.time_ns() // 1000)
                if latency_ms is not None:
                    histogram.record(latency_ms)
                meter.add(len(message.data))
                await consumer.acknowledge(message)

        await run.run(asyncio.gather(*(one(c) for c in consumers)))
        for consumer in consumers:
            await consumer.close()
    return idle_timed_out


# --- arguments ---------------------------------------------------------------------------------
def _add_run_limits(parser: argparse.ArgumentParser) -> None:
    limits = parser.add_mutually_exclusive_group()
    limits.add_argument("-m", "--num-messages", type=int, default=0,
                        help="stop after this many, over all of them (0 = no limit)")
    limits.add_argument("-time", "--test-duration", "--time-s", dest="time_s", type=float, default=None,
                        help="stop after this many seconds")


def add_perf_commands(commands: Any, connection: argparse.ArgumentParser) -> None:
    perf = commands.add_parser("perf", help="load test: live rates and latency percentiles (like pulsar-perf)")
    modes = perf.add_subparsers(dest="perf_command", required=True)
    produce = modes.add_parser("produce", parents=[connection], help="publish as fast as possible or at a rate")
    produce.add_argument("topic")
    produce.add_argument("-r", "--rate", type=float, default=0, help="messages per second (0 = as fast as possible)")
    produce.add_argument("-s", "--size", type=int, default=1024, help="payload size in bytes (default 1024)")
    produce.add_argument("--batching", action="store_true", help="let the broker batch publishes that arrive together "
                                                                 "(with --rest: several messages per request)")
    produce.add_argument("--batch-max", type=int, default=REST_BATCH_MESSAGES_DEFAULT,
                         help="messages per REST request with --rest --batching")
    produce.add_argument("--max-pending", type=int, default=1000, help="publishes in flight (WebSocket)")
    produce.add_argument("--rest", action="store_true", help="publish over REST (PIP-64)")
    produce.add_argument("-n", "--num-producers", type=positive, default=1,
                         help="producers on the topic, sharing -m and -r (default 1; WebSocket)")
    _add_run_limits(produce)
    produce.set_defaults(handler=_checked(_perf_produce))
    consume = modes.add_parser("consume", parents=[connection], help="consume and acknowledge, measuring latency")
    consume.add_argument("topic")
    consume.add_argument("-s", "--subscription", required=True)
    add_subscription_type(consume)
    consume.add_argument("-p", "--subscription-position", default="latest", type=str.lower,
                         choices=["latest", "earliest"])
    consume.add_argument("-q", "--receiver-queue-size", type=int, default=1000)
    consume.add_argument("-n", "--num-consumers", type=positive, default=1,
                         help="consumers of the subscription, sharing -m (default 1)")
    consume.add_argument("--timeout-s", type=float, default=None, help="stop when no message comes for this long")
    _add_run_limits(consume)
    consume.set_defaults(handler=_checked(_perf_consume))


def _checked(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if args.num_messages < 0 or (args.time_s is not None and args.time_s <= 0):
            raise ValueError("-m must be 0 or more and -time positive")
        if getattr(args, "size", 0) < 0 or getattr(args, "rate", 0) < 0:
            raise ValueError("--size and --rate must not be negative")
        if getattr(args, "rest", False) and args.num_producers > 1:
            raise ValueError("--rest publishes from one client: -n (producers) must be 1 with it")
        if getattr(args, "batch_max", 1) < 1:
            raise ValueError("--batch-max must be at least 1")
        return handler(args)
    return run
