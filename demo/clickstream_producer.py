"""The clickstream demo's producer: a bounded, seeded stream of click events sent to a topic.

Role: publish JSON click events ``{"userId", "page", "action", "eventTimeMs"}`` to the topic
``clickstream`` (keyed by user id, with the message's event time set to ``eventTimeMs``) through
the Python client's WebSocket producer, paced at ``--rate`` events per second, until ``--count``
events are sent or ``--duration-s`` has passed.

Event time is simulated: the site's clock starts at ``--start-ms`` (default: now) and advances
``--event-interval-ms`` per click (default ``1000 / rate``, so a paced run's event times follow
the wall clock). Clicks arrive out of order in two ways:

- late clicks: a seeded fraction (``--late-fraction``) arrive up to ``--max-lateness-ms`` behind
  the clock; a consumer whose watermark delay exceeds that never drops one;
- stragglers: every ``--straggler-every``-th click arrives ``--straggler-lateness-ms`` behind
  (only once the clock has run that long, so a straggler belongs to an earlier window of the
  same run); a watermark shorter than that drops them.

A bounded run ends with one end marker (page ``(end)``, action ``end``) whose event time is
``--end-marker-advance-ms`` past the latest click, so a consumer's event-time watermark moves past
every window of the run and those windows can close.

Invariants: the same seed and options give the same events in the same order, whatever the
pacing or the broker; every run is bounded (by count, duration, or both; ``CLICKS_MAX`` at
most); at most ``PENDING_SENDS_MAX`` publishes are in flight; the process exits 0 only when
every event was acknowledged by the broker, and prints a one-line JSON summary last.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from consumers.client import Client, ClientError, SendResult

DEFAULT_TOPIC = "clickstream"
CLICKS_MAX = 10_000_000
PENDING_SENDS_MAX = 500
PROGRESS_INTERVAL_S = 2.0
FLUSH_TIMEOUT_S = 60.0
USER_ID_FORMAT = "user-{:03d}"
END_MARKER_PAGE = "(end)"
END_MARKER_ACTION = "end"
PAGES: tuple[tuple[str, int], ...] = (
    ("/", 30), ("/search", 20), ("/product/lamp", 12), ("/product/chair", 10), ("/product/desk", 8),
    ("/cart", 10), ("/checkout", 6), ("/help", 4),
)
"""Pages with their relative popularity."""
ACTIONS: tuple[tuple[str, int], ...] = (("view", 70), ("click", 20), ("add_to_cart", 7), ("purchase", 3))

KIND_ON_TIME, KIND_LATE, KIND_STRAGGLER, KIND_END = "on_time", "late", "straggler", "end_marker"


@dataclass(frozen=True)
class StreamShape:
    """What the generated stream looks like; everything but pacing and bounds."""

    start_ms: int
    seed: int = 7
    users: int = 50
    event_interval_ms: int = 100
    late_fraction: float = 0.2
    max_lateness_ms: int = 3_000
    straggler_every: int = 50
    """0 turns stragglers off."""
    straggler_lateness_ms: int = 60_000
    end_marker_advance_ms: int = 60_000

    def check(self) -> None:
        if self.users < 1 or self.event_interval_ms < 1:
            raise ValueError("users and event interval must be at least 1")
        if not 0.0 <= self.late_fraction <= 1.0:
            raise ValueError(f"late fraction must be within 0..1, not {self.late_fraction}")
        if min(self.max_lateness_ms, self.straggler_every, self.straggler_lateness_ms,
               self.end_marker_advance_ms) < 0:
            raise ValueError("lateness, straggler and end-marker settings must not be negative")


@dataclass(frozen=True)
class Click:
    user_id: str
    page: str
    action: str
    event_time_ms: int
    kind: str
    """on_time, late, straggler or end_marker (not sent: the payload has only what a site knows)."""

    def payload(self) -> bytes:
        return json.dumps({"userId": self.user_id, "page": self.page, "action": self.action,
                           "eventTimeMs": self.event_time_ms}, separators=(",", ":")).encode()


def generate_clicks(shape: StreamShape) -> Iterator[Click]:
    """The clicks of ``shape``, in sending order (at most ``CLICKS_MAX``); no end marker."""
    shape.check()
    rng = random.Random(shape.seed)
    pages, page_weights = zip(*PAGES, strict=True)
    actions, action_weights = zip(*ACTIONS, strict=True)
    for index in range(CLICKS_MAX):
        clock_ms = shape.start_ms + index * shape.event_interval_ms
        user = USER_ID_FORMAT.format(rng.randrange(shape.users))
        page = rng.choices(pages, page_weights)[0]
        action = rng.choices(actions, action_weights)[0]
        is_late = rng.random() < shape.late_fraction
        lateness_ms = rng.randint(1, shape.max_lateness_ms) if shape.max_lateness_ms else 0
        if _is_straggler(shape, index, clock_ms):
            yield Click(user, page, action, clock_ms - shape.straggler_lateness_ms, KIND_STRAGGLER)
        elif is_late and lateness_ms:
            yield Click(user, page, action, clock_ms - lateness_ms, KIND_LATE)
        else:
            yield Click(user, page, action, clock_ms, KIND_ON_TIME)


def _is_straggler(shape: StreamShape, index: int, clock_ms: int) -> bool:
    return (shape.straggler_every > 0 and index % shape.straggler_every == shape.straggler_every - 1
            and clock_ms - shape.start_ms >= shape.straggler_lateness_ms)


def end_marker(shape: StreamShape, latest_event_time_ms: int) -> Click:
    return Click(END_MARKER_PAGE, END_MARKER_PAGE, END_MARKER_ACTION,
                 latest_event_time_ms + shape.end_marker_advance_ms, KIND_END)


# --- sending ------------------------------------------------------------------------------------


@dataclass
class SendReport:
    topic: str
    kinds: Counter[str]
    first_event_time_ms: int | None = None
    latest_event_time_ms: int | None = None
    elapsed_s: float = 0.0

    def add(self, click: Click) -> None:
        self.kinds[click.kind] += 1
        if click.kind != KIND_END:
            first = self.first_event_time_ms
            self.first_event_time_ms = click.event_time_ms if first is None else min(first, click.event_time_ms)
            latest = self.latest_event_time_ms
            self.latest_event_time_ms = click.event_time_ms if latest is None else max(latest, click.event_time_ms)

    @property
    def clicks(self) -> int:
        return sum(n for kind, n in self.kinds.items() if kind != KIND_END)

    def summary(self) -> dict[str, object]:
        return {"topic": self.topic, "clicks": self.clicks, "onTime": self.kinds[KIND_ON_TIME],
                "late": self.kinds[KIND_LATE], "stragglers": self.kinds[KIND_STRAGGLER],
                "endMarker": self.kinds[KIND_END] > 0, "firstEventTimeMs": self.first_event_time_ms,
                "latestEventTimeMs": self.latest_event_time_ms, "elapsedS": round(self.elapsed_s, 3)}


class _InFlight:
    """Publishes not acknowledged yet, oldest first; an error surfaces at the next check."""

    def __init__(self) -> None:
        self._futures: deque[Future[SendResult]] = deque()

    def add(self, future: Future[SendResult]) -> None:
        self._futures.append(future)
        while self._futures and (self._futures[0].done() or len(self._futures) > PENDING_SENDS_MAX):
            self._futures.popleft().result(timeout=FLUSH_TIMEOUT_S)

    def drain(self) -> None:
        while self._futures:
            self._futures.popleft().result(timeout=FLUSH_TIMEOUT_S)


def send_clicks(client: Client, topic: str, shape: StreamShape, *, count: int | None, duration_s: float | None,
                rate: float, end_with_marker: bool = True, say: Callable[[str], None] = print) -> SendReport:
    """Send clicks until ``count`` are sent or ``duration_s`` has passed, paced at ``rate`` per
    second (0: as fast as the broker acknowledges); then the end marker. Returns what was sent."""
    if count is None and duration_s is None:
        raise ValueError("give a count, a duration or both: the stream is bounded")
    report = SendReport(topic=topic, kinds=Counter())
    in_flight = _InFlight()
    started_s = time.monotonic()
    next_progress_s = started_s + PROGRESS_INTERVAL_S
    with client.create_producer(topic, max_pending_messages=PENDING_SENDS_MAX, reconnect=True) as producer:
        for index, click in enumerate(generate_clicks(shape)):
            now_s = time.monotonic()
            if (count is not None and index >= count) or (duration_s is not None and now_s - started_s >= duration_s):
                break
            if rate > 0:
                time.sleep(max(0.0, started_s + index / rate - now_s))
            in_flight.add(producer.send_async(click.payload(), key=click.user_id, event_time_ms=click.event_time_ms))
            report.add(click)
            if now_s >= next_progress_s:
                say(f"clickstream: sent {report.clicks} clicks ({report.clicks / (now_s - started_s):.0f}/s), "
                    f"{report.kinds[KIND_LATE]} late, {report.kinds[KIND_STRAGGLER]} stragglers")
                next_progress_s = now_s + PROGRESS_INTERVAL_S
        if end_with_marker and report.latest_event_time_ms is not None:
            marker = end_marker(shape, report.latest_event_time_ms)
            in_flight.add(producer.send_async(marker.payload(), key=marker.user_id,
                                              event_time_ms=marker.event_time_ms))
            report.add(marker)
        producer.flush()
        in_flight.drain()
    report.elapsed_s = time.monotonic() - started_s
    return report


# --- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Send a bounded, seeded stream of click events to Magnetar.")
    parser.add_argument("--service-url", default="http://127.0.0.1:8080",
                        help="broker URL (http://host:port; a cluster: several, comma-separated)")
    parser.add_argument("--topic", default=DEFAULT_TOPIC)
    parser.add_argument("--count", type=int, help="clicks to send (the end marker is extra)")
    parser.add_argument("--duration-s", type=float, help="stop sending after this many seconds")
    parser.add_argument("--rate", type=float, default=50.0, help="clicks per second; 0 sends as fast as possible")
    parser.add_argument("--seed", type=int, default=StreamShape.seed)
    parser.add_argument("--users", type=int, default=StreamShape.users)
    parser.add_argument("--start-ms", type=int, help="event time of the first click (default: now)")
    parser.add_argument("--event-interval-ms", type=int,
                        help="event time between clicks (default 1000/rate, or 100 when unpaced)")
    parser.add_argument("--late-fraction", type=float, default=StreamShape.late_fraction)
    parser.add_argument("--max-lateness-ms", type=int, default=StreamShape.max_lateness_ms)
    parser.add_argument("--straggler-every", type=int, default=StreamShape.straggler_every,
                        help="every N-th click is a straggler (0: none)")
    parser.add_argument("--straggler-lateness-ms", type=int, default=StreamShape.straggler_lateness_ms)
    parser.add_argument("--end-marker-advance-ms", type=int, default=StreamShape.end_marker_advance_ms)
    parser.add_argument("--no-end-marker", action="store_true", help="do not send the closing end marker")
    return parser


def shape_from_args(args: argparse.Namespace) -> StreamShape:
    interval_ms = args.event_interval_ms or (max(1, round(1000 / args.rate)) if args.rate > 0 else 100)
    return StreamShape(
        start_ms=args.start_ms if args.start_ms is not None else int(time.time() * 1000), seed=args.seed,
        users=args.users, event_interval_ms=interval_ms, late_fraction=args.late_fraction,
        max_lateness_ms=args.max_lateness_ms, straggler_every=args.straggler_every,
        straggler_lateness_ms=args.straggler_lateness_ms, end_marker_advance_ms=args.end_marker_advance_ms)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.count is None and args.duration_s is None:
        parser.error("give --count, --duration-s or both: the stream is bounded")
    if (args.count is not None and not 0 <= args.count <= CLICKS_MAX) or args.rate < 0:
        parser.error(f"--count must be within 0..{CLICKS_MAX} and --rate must not be negative")
    try:
        shape = shape_from_args(args)
        shape.check()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        with Client(args.service_url) as client:
            report = send_clicks(client, args.topic, shape, count=args.count, duration_s=args.duration_s,
                                 rate=args.rate, end_with_marker=not args.no_end_marker)
    except (ClientError, OSError, TimeoutError) as exc:
        print(f"clickstream: sending to {args.service_url} failed: {exc}", file=sys.stderr)
        return 1
    print(f"clickstream: done, {report.clicks} clicks to {args.topic} in {report.elapsed_s:.1f} s")
    print("summary: " + json.dumps(report.summary(), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
