"""The broker's rates over its last minutes, so a chart opened now shows what came before.

Role: ``BrokerService``'s maintenance pass calls :meth:`RateHistory.maybe_sample` after every
pass; at most once per ``RATE_HISTORY_SAMPLE_INTERVAL_S`` it sums the loaded topics' rates (the
same figures the overview's ``rates`` give) into one :class:`RateSample`. The admin overview
answers the samples as ``history`` and the console's charts begin with them.

Invariants: at most ``RATE_HISTORY_SAMPLES_MAX`` samples are kept (the oldest go first), in time
order; a sample is the broker's own rates at that moment (topics loaded then), nothing is
extrapolated; reading returns a copy.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker.limits import RATE_HISTORY_SAMPLE_INTERVAL_S, RATE_HISTORY_SAMPLES_MAX
from broker.topic_stats import TopicStats


@dataclass(frozen=True)
class RateSample:
    at_ms: int
    msg_rate_in: float
    msg_rate_out: float
    msg_throughput_in: float
    msg_throughput_out: float


class RateHistory:
    def __init__(self, clock: Callable[[], float], interval_s: float = RATE_HISTORY_SAMPLE_INTERVAL_S) -> None:
        """``clock()``: seconds since the epoch (the broker's clock)."""
        self._clock = clock
        self._interval_s = interval_s
        self._samples: deque[RateSample] = deque(maxlen=RATE_HISTORY_SAMPLES_MAX)
        self._last_s: float | None = None
        self._lock = threading.Lock()

    def maybe_sample(self, topics: Callable[[], Sequence[TopicStats]]) -> None:
        """Add a sample of ``topics()``' summed rates when the interval has passed since the last."""
        now_s = self._clock()
        if self._last_s is not None and now_s - self._last_s < self._interval_s:
            return
        stats = topics()
        sample = RateSample(int(now_s * 1000), sum(t.msg_rate_in for t in stats), sum(t.msg_rate_out for t in stats),
                            sum(t.msg_throughput_in for t in stats), sum(t.msg_throughput_out for t in stats))
        with self._lock:
            self._samples.append(sample)
            self._last_s = now_s

    def samples(self) -> tuple[RateSample, ...]:
        with self._lock:
            return tuple(self._samples)
