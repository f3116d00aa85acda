"""``LoopStallMonitor`` on a real event loop: a callback that holds the loop shows as one late
heartbeat of about its length, kept with the loop thread's use of the CPU (a sleep: blocked, not
busy); collections of the garbage collector are timed by generation;
``stop`` cancels the heartbeat and removes the gc hook."""

from __future__ import annotations

import asyncio
import gc
import time

from api.limits import LONGEST_STALL_MIN_S
from api.loop_stalls import LoopStallMonitor

INTERVAL_S = 0.005
HOLD_S = 0.030
GC_ATTEMPTS_MAX = 100


def test_a_held_loop_is_one_late_heartbeat_of_about_the_hold() -> None:
    monitor = LoopStallMonitor(interval_s=INTERVAL_S)

    async def scenario() -> None:
        monitor.start(asyncio.get_running_loop())
        await asyncio.sleep(0.05)
        time.sleep(HOLD_S)  # holds the loop
        await asyncio.sleep(0.05)
        monitor.stop()

    asyncio.run(scenario())
    stats = monitor.statistics()
    assert stats.stalls.count >= 10  # beats every 5 ms for 130 ms
    assert stats.max_seconds >= HOLD_S - INTERVAL_S
    assert any(stall.seconds >= HOLD_S - INTERVAL_S for stall in stats.longest)
    assert all(stall.seconds >= LONGEST_STALL_MIN_S for stall in stats.longest)
    held = max(stats.longest, key=lambda stall: stall.seconds)
    assert held.window_s >= held.seconds
    assert held.loop_cpu_s < HOLD_S / 2  # a sleep holds the loop without using the CPU
    assert held.loop_waits >= 1  # the sleep blocked the loop's thread
    assert stats.stalls.sum_seconds >= HOLD_S - INTERVAL_S


def test_gc_collections_are_timed_by_generation_while_running() -> None:
    monitor = LoopStallMonitor()

    def collect(generation: int) -> None:
        """``gc.collect`` returns at once, running no collection and no callback, while another
        thread's collection is under way (threads of earlier tests live on in a full run): collect
        until one of ``generation`` was timed, a bounded number of times."""
        before = monitor.statistics().gc_pauses[generation].count
        for _ in range(GC_ATTEMPTS_MAX):
            gc.collect(generation)
            if monitor.statistics().gc_pauses[generation].count > before:
                return

    async def scenario() -> None:
        monitor.start(asyncio.get_running_loop())
        collect(2)
        collect(0)
        monitor.stop()

    asyncio.run(scenario())
    pauses = monitor.statistics().gc_pauses
    assert pauses[2].count >= 1 and pauses[0].count >= 1 and pauses[2].sum_seconds > 0
    gc.collect(2)  # stopped: no longer counted
    assert monitor.statistics().gc_pauses[2].count == pauses[2].count
    assert monitor._on_gc not in gc.callbacks
