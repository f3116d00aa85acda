"""The broker's rate history: a sample at most once per interval, at most ``RATE_HISTORY_SAMPLES_MAX``
kept, oldest first, each the sum of the loaded topics' rates at that moment."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from broker.limits import RATE_HISTORY_SAMPLES_MAX
from broker.rate_history import RateHistory


def topics(rate_in: float) -> list[Any]:
    return [SimpleNamespace(msg_rate_in=rate_in, msg_rate_out=1.0, msg_throughput_in=100.0, msg_throughput_out=10.0)
            for _ in range(2)]


def test_a_sample_per_interval_summed_over_topics_and_bounded() -> None:
    now = [1000.0]
    history = RateHistory(lambda: now[0], interval_s=5.0)
    history.maybe_sample(lambda: topics(3.0))
    now[0] += 1.0
    history.maybe_sample(lambda: topics(99.0))  # within the interval: no sample
    assert [(s.at_ms, s.msg_rate_in, s.msg_rate_out, s.msg_throughput_in) for s in history.samples()] == [
        (1_000_000, 6.0, 2.0, 200.0)]
    for i in range(RATE_HISTORY_SAMPLES_MAX + 5):
        now[0] += 5.0
        history.maybe_sample(functools.partial(topics, float(i)))
    samples = history.samples()
    assert len(samples) == RATE_HISTORY_SAMPLES_MAX
    assert [s.at_ms for s in samples] == sorted(s.at_ms for s in samples)
    assert samples[-1].msg_rate_in == 2.0 * (RATE_HISTORY_SAMPLES_MAX + 4)
