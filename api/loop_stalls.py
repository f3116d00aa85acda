"""How long the server's event loop is held: loop-stall and garbage-collection pause histograms.

Role: every session, dispatch and publish completion of a server process runs on one asyncio
event loop (``api/app.py``); while a callback runs, or another thread holds the interpreter lock,
nothing else on that loop moves, and every message in flight waits. :class:`LoopStallMonitor`
measures that wait as the loop's own clients see it, and ``/metrics`` and the broker-stats
overview (the web console) show it.

How it measures: a heartbeat callback on the loop, due every ``LOOP_STALL_SAMPLE_INTERVAL_S``,
records how late it ran (the time from when it was due to when it started). A timer is late
exactly as long as the loop was busy with other callbacks, or its thread was blocked (the
interpreter lock, a system call such as an ``fdatasync`` on the loop) or not scheduled, so the
histogram is the delay an event arriving at a random moment would see (Node.js's
``monitorEventLoopDelay`` works the same way). A stall of ``d`` seconds is recorded as
one sample between ``d - interval`` and ``d``; a stall shorter than the interval is sampled with
probability ``d / interval``, so short stalls are counted in proportion to the time they take.
It costs one timer wake-up per interval (100 a second), a ``getrusage`` of the loop's thread and
one bucket increment, on the loop, with no thread of its own (which would compete for the
interpreter lock it measures). A stall of ``LONGEST_STALL_MIN_S`` or more is kept with the CPU
time the loop's thread and the whole process used since the heartbeat before it, and how often
the loop's thread blocked or was preempted: a loop busy with its own callbacks, one kept waiting
by other threads, by a blocking system call or by a busy machine each look different. uvloop
rounds timers to the millisecond and may fire one up to a millisecond early: early counts as 0.

A ``gc.callbacks`` hook times every collection of Python's cyclic garbage collector by
generation, on whichever thread triggered it, so a stall can be matched with the collection that
caused it.

Invariants: the histograms only grow while the monitor runs; the longest stalls kept are the
``LONGEST_STALLS_KEPT`` latest samples at or above ``LONGEST_STALL_MIN_S`` (a bounded deque);
the heartbeat runs only between ``start`` and ``stop`` and the gc hook is installed only then.

A test-only route (``POST /admin/v2/broker-stats/loop-stall?millis=N``, superuser) holds the
loop for N milliseconds so a test can see a stall arrive in both views. It exists only when the
process's environment sets ``MAGNETAR_TEST_HOOKS=1``; no configuration file can enable it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter

from api.auth import Authorizer, Caller
from api.limits import INJECTED_STALL_MS_MAX, LONGEST_STALL_MIN_S
from broker import InvalidRequest, LatencyHistogram, LatencySnapshot

LOOP_STALL_SAMPLE_INTERVAL_S = 0.01
LOOP_STALL_BUCKETS_US = (100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000)
GC_PAUSE_BUCKETS_US = LOOP_STALL_BUCKETS_US
GC_GENERATIONS = (0, 1, 2)
LONGEST_STALLS_KEPT = 16
"""Stalls of at least ``LONGEST_STALL_MIN_S`` kept with their attribution (the latest)."""
TEST_HOOKS_ENV = "MAGNETAR_TEST_HOOKS"


@dataclass(frozen=True)
class Stall:
    at_s: float
    """Wall-clock time (seconds since the epoch) when the late heartbeat ran."""
    seconds: float
    """How late the heartbeat ran."""
    window_s: float
    """Since the heartbeat before it (the interval plus ``seconds``)."""
    loop_cpu_s: float
    """CPU time the loop's thread used in ``window_s``: near it, the loop ran callbacks."""
    process_cpu_s: float
    """CPU time every thread of the process used in ``window_s``: well above ``loop_cpu_s``,
    other threads ran (holding the interpreter lock, or in C code that released it); both low,
    the loop's thread was blocked in a system call or not scheduled (a busy machine)."""
    loop_waits: int
    """Times the loop's thread gave up the CPU in ``window_s`` (blocked: a system call, the
    interpreter lock, the loop's own poll before the heartbeat was due)."""
    loop_preemptions: int
    """Times the kernel took the CPU from the loop's thread in ``window_s`` (a busy machine)."""


@dataclass(frozen=True)
class LoopStallStats:
    stalls: LatencySnapshot
    max_seconds: float
    longest: tuple[Stall, ...]
    """The latest stalls of at least ``LONGEST_STALL_MIN_S``, oldest first."""
    gc_pauses: dict[int, LatencySnapshot]
    """Collections of the cyclic garbage collector by generation, timed."""


@dataclass(frozen=True)
class _ThreadUsage:
    cpu_s: float
    waits: int
    preemptions: int


def _thread_usage() -> _ThreadUsage:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return _ThreadUsage(usage.ru_utime + usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw)


class LoopStallMonitor:
    """Heartbeat on one event loop; ``statistics()`` from any thread."""

    def __init__(self, interval_s: float = LOOP_STALL_SAMPLE_INTERVAL_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._stalls = LatencyHistogram(LOOP_STALL_BUCKETS_US)
        self._gc_pauses = {generation: LatencyHistogram(GC_PAUSE_BUCKETS_US) for generation in GC_GENERATIONS}
        self._longest: deque[Stall] = deque(maxlen=LONGEST_STALLS_KEPT)
        self._max_s = 0.0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due_s = 0.0
        self._last_beat = (0.0, _ThreadUsage(0.0, 0, 0), 0.0)  # clock, the loop's thread, process CPU
        self._gc_started_s: float | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._schedule(self._clock())
        gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop = None
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _schedule(self, now_s: float) -> None:
        assert self._loop is not None
        self._due_s = now_s + self._interval_s
        self._last_beat = (now_s, _thread_usage(), time.process_time())
        self._timer = self._loop.call_later(self._interval_s, self._beat)

    def _beat(self) -> None:
        now_s = self._clock()
        late_s = max(now_s - self._due_s, 0.0)
        self._stalls.record(late_s)
        self._max_s = max(self._max_s, late_s)
        if late_s >= LONGEST_STALL_MIN_S:
            was_s, was_loop, was_process_cpu_s = self._last_beat
            loop = _thread_usage()
            stall = Stall(time.time(), late_s, now_s - was_s, loop.cpu_s - was_loop.cpu_s,
                          time.process_time() - was_process_cpu_s, loop.waits - was_loop.waits,
                          loop.preemptions - was_loop.preemptions)
            with self._lock:
                self._longest.append(stall)
        if self._loop is not None:
            self._schedule(now_s)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started_s = self._clock()
        elif self._gc_started_s is not None:  # "stop"
            self._gc_pauses[info["generation"]].record(self._clock() - self._gc_started_s)
            self._gc_started_s = None

    def statistics(self) -> LoopStallStats:
        stalls = self._stalls.snapshot()
        with self._lock:
            longest = tuple(self._longest)
        return LoopStallStats(stalls, self._max_s, longest,
                              {generation: h.snapshot() for generation, h in self._gc_pauses.items()})


def test_hooks_enabled() -> bool:
    return os.environ.get(TEST_HOOKS_ENV) == "1"


def stall_hook_router(authorizer: Authorizer) -> APIRouter:
    """The test-only route that holds the event loop (mounted only with ``MAGNETAR_TEST_HOOKS=1``)."""
    routes = APIRouter(prefix="/admin/v2/broker-stats", tags=["admin"])

    @routes.post("/loop-stall", summary="Hold the event loop for N milliseconds (test hook; Magnetar)")
    async def loop_stall(caller: Caller, millis: int) -> dict[str, Any]:
        authorizer.require_superuser(caller)
        if not 0 < millis <= INJECTED_STALL_MS_MAX:
            raise InvalidRequest(f"millis must be between 1 and {INJECTED_STALL_MS_MAX}, not {millis}")
        time.sleep(millis / 1000)  # on the loop, on purpose: this is the stall
        return {"stalledMillis": millis}

    return routes
