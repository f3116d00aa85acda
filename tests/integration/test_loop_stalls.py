"""The event loop's stall histogram and the gc's pauses in ``/metrics`` and the console's overview.

Checks: a real ``magnetar standalone`` process started with ``MAGNETAR_TEST_HOOKS=1`` is made to
hold its event loop for 50 ms (the test-only ``loop-stall`` route); afterwards
``magnetar_event_loop_stall_seconds`` has a sample above 25 ms that it did not have before, its
``_max`` gauge reads at least 40 ms, and the overview the web console polls lists the stall among
its longest and as its maximum. The gc pause histogram is there by generation. Without the
environment flag the route does not exist, and a stall longer than the hook's bound is refused
with a 400.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.limits import INJECTED_STALL_MS_MAX
from api.loop_stalls import TEST_HOOKS_ENV
from tests.integration.server import running_server
from tests.standalone import standalone_process

STALL_MILLIS = 50
STALL_SEEN_MIN_S = 0.040  # the heartbeat due during the stall runs at most one interval (10 ms) short of it
ABOVE_S = 0.025
OVERVIEW = "/admin/v2/broker-stats/overview"
HOOK = "/admin/v2/broker-stats/loop-stall"
SEEN_DEADLINE_S = 10.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    data = tmp_path_factory.mktemp("stalls") / "data"
    with standalone_process(data, env={TEST_HOOKS_ENV: "1"}) as (url, _), \
            httpx.Client(base_url=url, timeout=30) as http:
        yield http


def scrape(http: httpx.Client) -> Samples:
    response = http.get("/metrics")
    assert response.status_code == 200, response.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def stalls_above(samples: Samples, seconds: float) -> float:
    """Heartbeats later than ``seconds`` (``seconds`` must be a bucket bound)."""
    total = samples[("magnetar_event_loop_stall_seconds_count", ())]
    return total - samples[("magnetar_event_loop_stall_seconds_bucket", (("le", str(seconds)),))]


def overview(http: httpx.Client) -> dict[str, Any]:
    response = http.get(OVERVIEW)
    assert response.status_code == 200, response.text
    loop: dict[str, Any] = response.json()["eventLoop"]
    return loop


def test_an_injected_stall_shows_in_metrics_and_the_overview(broker: httpx.Client) -> None:
    before = scrape(broker)
    assert before[("magnetar_event_loop_stall_seconds_count", ())] > 0  # the heartbeat runs from start-up
    injected_at_ms = time.time() * 1000
    response = broker.post(HOOK, params={"millis": STALL_MILLIS})
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + SEEN_DEADLINE_S
    after = scrape(broker)
    while stalls_above(after, ABOVE_S) == stalls_above(before, ABOVE_S) and time.monotonic() < deadline:
        time.sleep(0.05)
        after = scrape(broker)
    assert stalls_above(after, ABOVE_S) >= stalls_above(before, ABOVE_S) + 1
    assert after[("magnetar_event_loop_stall_max_seconds", ())] >= STALL_SEEN_MIN_S
    assert after[("magnetar_event_loop_stall_seconds_sum", ())] >= \
        before[("magnetar_event_loop_stall_seconds_sum", ())] + STALL_SEEN_MIN_S
    for generation in ("0", "1", "2"):
        assert ("magnetar_python_gc_pause_seconds_count", (("generation", generation),)) in after

    loop = overview(broker)
    assert loop["stallUs"]["max"] >= STALL_SEEN_MIN_S * 1e6
    assert loop["samples"] >= after[("magnetar_event_loop_stall_seconds_count", ())]
    long_ones = [s for s in loop["longestStalls"] if s["us"] >= STALL_SEEN_MIN_S * 1e6]
    assert long_ones, loop["longestStalls"]
    assert [g["generation"] for g in loop["gcPauses"]] == [0, 1, 2]
    buckets = dict((bound, count) for bound, count in loop["stallBucketsUs"])
    assert loop["samples"] - buckets[int(ABOVE_S * 1e6)] >= 1
    # the hook sleeps: the loop's thread blocked rather than ran
    assert any(injected_at_ms - 5000 <= _epoch_ms(s["at"]) and s["windowUs"] >= s["us"] and s["loopWaits"] >= 1
               and s["loopCpuUs"] < STALL_MILLIS * 1000 / 2 for s in long_ones), long_ones


def test_the_hook_refuses_a_stall_beyond_its_bound(broker: httpx.Client) -> None:
    response = broker.post(HOOK, params={"millis": INJECTED_STALL_MS_MAX + 1})
    assert response.status_code == 400
    assert set(response.json()) >= {"code", "message"}


def test_without_the_environment_flag_there_is_no_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_HOOKS_ENV, raising=False)
    with running_server(str(tmp_path / "data")) as (url, _), httpx.Client(base_url=url, timeout=30) as http:
        assert http.post(HOOK, params={"millis": STALL_MILLIS}).status_code in (404, 405)
        assert "eventLoop" in http.get(OVERVIEW).json()


def _epoch_ms(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000
