"""Pulsar's ``managedLedgerOffloadFlowPermitsPerSecond``: every offload of one offloader
together reads at most that many bytes per second from the bookies.

Checks, with a clock that only the throttle's own waits move (no timing in the test): the key is
read from the broker's configuration and a value below -1 is refused naming it; an offload of
10,000 bytes in runs of 500 at 1,000 bytes per second waits 8.5 s in all (each run starts once
the bytes read before it are paid for, the first second's permits being there at once: the
last run starts after 9,500 bytes), reads every entry once and writes a copy equal to the
source; two offloads share the
permits; -1 reads without waiting; the wait is in ``statistics()``.

And Magnetar's ``managedLedgerOffloadFlowPermitsPerSecondWhilePublishing`` (8 MB/s unless set):
while the broker takes publishes an offload reads at most that many bytes per second, while it
takes none it reads at full speed; a publishing spell is not charged with what was read before
it; once publishing stops, a waiting offload goes on within one pacing slice; the waits for
publishing are counted apart.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from api.config import ConfigError, StandaloneConfig
from broker.limits import OFFLOAD_PACING_SLICE_S
from broker.offload import create_offloader
from broker.offload.blob_offloader import BlobStoreOffloader, _FlowPermits
from broker.offload.settings import OffloadSettings
from tests.unit.test_offload_format import BytesLedger


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0
        self.slept_s: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.slept_s.append(seconds)
        self.now_s += seconds


def _offloader(tmp_path: Path, permits: int, clock: _Clock, *, while_publishing: int = -1,
               publishing: Callable[[], bool] | None = None) -> BlobStoreOffloader:
    offloader = create_offloader(OffloadSettings(driver="filesystem", file_system_uri=str(tmp_path),
                                                 read_buffer_size_bytes=500, flow_permits_per_second=permits))
    assert isinstance(offloader, BlobStoreOffloader)
    offloader.flow_permits = _FlowPermits(permits, clock, clock.sleep, while_publishing_per_second=while_publishing,
                                          publishing=publishing)
    return offloader


def test_the_key_is_read_and_a_value_below_minus_one_is_refused() -> None:
    base = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": "/tmp/offload"}
    settings = OffloadSettings.from_config({**base, "managedLedgerOffloadFlowPermitsPerSecond": "5000000"})
    assert settings.flow_permits_per_second == 5_000_000
    assert OffloadSettings.from_config(base).flow_permits_per_second == -1
    with pytest.raises(ConfigError, match="managedLedgerOffloadFlowPermitsPerSecond"):
        StandaloneConfig.load(overrides={**base, "managedLedgerOffloadFlowPermitsPerSecond": "-2"}, environ={})


def test_an_offload_reads_at_most_the_permits_per_second(tmp_path: Path) -> None:
    clock = _Clock()
    offloader = _offloader(tmp_path, 1000, clock)
    entries = [bytes([i]) * 100 for i in range(100)]  # 10,000 bytes in runs of 5 entries (500 bytes)
    source = BytesLedger(3, entries)
    offloader.offload(source, "u", {})
    assert sum(clock.slept_s) == pytest.approx(8.5, abs=0.01)
    assert source.reads == [(first, first + 4) for first in range(0, 100, 5)]
    assert offloader.open(3, "u", {}).read(0, 99) == entries
    assert offloader.statistics()["flow_waited_ms"] == pytest.approx(8500, abs=10)


def test_two_offloads_share_the_permits(tmp_path: Path) -> None:
    clock = _Clock()
    offloader = _offloader(tmp_path, 1000, clock)
    for ledger_id in (1, 2):
        offloader.offload(BytesLedger(ledger_id, [b"x" * 100] * 30), "u", {})
    assert sum(clock.slept_s) == pytest.approx(4.5, abs=0.01)  # the last run starts after 5,500 bytes


def test_minus_one_reads_without_waiting(tmp_path: Path) -> None:
    clock = _Clock()
    offloader = _offloader(tmp_path, -1, clock)
    offloader.offload(BytesLedger(1, [b"x" * 100] * 100), "u", {})
    assert clock.slept_s == [] and offloader.statistics()["flow_waited_ms"] == 0


def test_the_while_publishing_key_is_read_with_its_default_and_a_value_below_minus_one_is_refused() -> None:
    base = {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": "/tmp/offload"}
    key = "managedLedgerOffloadFlowPermitsPerSecondWhilePublishing"
    assert OffloadSettings.from_config(base).flow_permits_per_second_while_publishing == 8_000_000
    assert OffloadSettings.from_config({**base, key: "-1"}).flow_permits_per_second_while_publishing == -1
    assert OffloadSettings.from_config({**base, key: "5000"}).flow_permits_per_second_while_publishing == 5000
    with pytest.raises(ConfigError, match=key):
        StandaloneConfig.load(overrides={**base, key: "-2"}, environ={})


def test_while_publishing_an_offload_reads_at_most_the_while_publishing_permits(tmp_path: Path) -> None:
    clock = _Clock()
    offloader = _offloader(tmp_path, -1, clock, while_publishing=1000, publishing=lambda: True)
    entries = [bytes([i]) * 100 for i in range(100)]
    offloader.offload(BytesLedger(3, entries), "u", {})
    assert sum(clock.slept_s) == pytest.approx(8.5, abs=0.01)
    assert max(clock.slept_s) <= OFFLOAD_PACING_SLICE_S
    assert offloader.open(3, "u", {}).read(0, 99) == entries
    stats = offloader.statistics()
    assert stats["flow_waited_for_publishing_ms"] == pytest.approx(8500, abs=10)
    assert stats["flow_waited_ms"] == pytest.approx(8500, abs=10)


def test_without_publishing_an_offload_reads_at_full_speed(tmp_path: Path) -> None:
    clock = _Clock()
    offloader = _offloader(tmp_path, -1, clock, while_publishing=1000, publishing=lambda: False)
    offloader.offload(BytesLedger(1, [b"x" * 100] * 100), "u", {})
    assert clock.slept_s == [] and offloader.statistics()["flow_waited_for_publishing_ms"] == 0


def test_a_publishing_spell_is_not_charged_with_what_was_read_before_it(tmp_path: Path) -> None:
    clock = _Clock()
    publishing = [False]
    offloader = _offloader(tmp_path, -1, clock, while_publishing=1000, publishing=lambda: publishing[0])
    offloader.offload(BytesLedger(1, [b"x" * 100] * 100), "u", {})  # 10,000 bytes while idle: no wait
    assert clock.slept_s == []
    publishing[0] = True
    offloader.offload(BytesLedger(2, [b"x" * 100] * 30), "u", {})
    assert sum(clock.slept_s) == pytest.approx(1.5, abs=0.01)  # the last run starts after 2,500 bytes


def test_once_publishing_stops_a_waiting_offload_goes_on_within_a_slice(tmp_path: Path) -> None:
    clock = _Clock()
    stop_at_s = clock.now_s + 1.0
    offloader = _offloader(tmp_path, -1, clock, while_publishing=1000, publishing=lambda: clock.now_s < stop_at_s)
    offloader.offload(BytesLedger(1, [b"x" * 100] * 100), "u", {})  # 10 s of permits while publishing
    assert 1.0 <= sum(clock.slept_s) <= 1.0 + OFFLOAD_PACING_SLICE_S + 0.01


def test_the_cap_at_all_times_still_holds_while_publishing(tmp_path: Path) -> None:
    clock = _Clock()
    offloader = _offloader(tmp_path, 500, clock, while_publishing=1000, publishing=lambda: True)
    offloader.offload(BytesLedger(1, [b"x" * 100] * 30), "u", {})  # 3,000 bytes: the 500 B/s cap binds
    assert sum(clock.slept_s) == pytest.approx(4.0, abs=0.01)  # the last run starts after 2,500 bytes
    assert offloader.statistics()["flow_waited_for_publishing_ms"] == 0



def test_a_wait_the_cap_at_all_times_needs_anyway_is_not_counted_as_waited_for_publishing(tmp_path: Path) -> None:
    clock = _Clock()
    offloader = _offloader(tmp_path, 500, clock, while_publishing=400, publishing=lambda: True)
    offloader.offload(BytesLedger(1, [b"x" * 100] * 30), "u", {})  # 3,000 bytes; runs of 500
    # the last run starts after 2,500 bytes: alone, the cap would have waited (2,500 - 500) / 500
    # = 4.0 s; with the slower rate while publishing (2,500 - 400) / 400 = 5.25 s
    assert sum(clock.slept_s) == pytest.approx(5.25, abs=0.01)
    stats = offloader.statistics()
    assert stats["flow_waited_ms"] == pytest.approx(5250, abs=10)
    # counted slice by slice: the part of each the cap alone would not have needed; at least the
    # 1.25 s the cap alone would not have waited, never the time the cap held the offload
    assert 1250 - 10 <= stats["flow_waited_for_publishing_ms"] < stats["flow_waited_ms"]
