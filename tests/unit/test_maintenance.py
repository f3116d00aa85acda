"""The maintenance pass: what follows a pass (the broker's rate sampling) never stops the passes.

A pass that ran while the broker service closed sampled a service that was no longer started:
its ``RuntimeError`` ended the maintenance thread (seen as "Exception in thread
magnetar-maintenance" in a full run). Now the sampler holds the service's parts, not the
service, and a failure after a pass is logged and the next pass runs as usual."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from broker.maintenance import Maintenance


def maintenance(after_pass: Any) -> Maintenance:
    key_index: Any = SimpleNamespace(cleanup=lambda: None)
    cache: Any = SimpleNamespace(evict_expired=lambda: None)
    return Maintenance(3_600_000, lambda: None, lambda: [], key_index, cache, after_pass)


def test_a_failure_after_a_pass_is_logged_and_passes_go_on(caplog: pytest.LogCaptureFixture) -> None:
    def failing() -> None:
        raise RuntimeError("broker service is not started")

    passes = maintenance(failing)
    with caplog.at_level(logging.ERROR, logger="broker.maintenance"):
        passes.run()
        passes.run()
    assert passes.statistics().passes == 2
    assert caplog.text.count("after a maintenance pass") == 2
