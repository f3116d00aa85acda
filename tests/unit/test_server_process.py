"""A broker process's runtime settings (``api/server_process.py``), each in a fresh interpreter:
they are process-wide, and the test process keeps its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

TUNED = ("import gc, sys, pyarrow as pa; from api.server_process import tune_runtime; tune_runtime(); "
         "print(pa.default_memory_pool().backend_name, gc.get_threshold()[0], sys.getswitchinterval())")


def tuned(arrow_pool_setting: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if arrow_pool_setting is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = arrow_pool_setting
    return subprocess.run([sys.executable, "-c", TUNED], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def test_a_tuned_broker_allocates_arrow_from_jemalloc_and_keeps_its_collector_and_switch_settings() -> None:
    jemalloc_or_default = "jemalloc" if "jemalloc" in pa.supported_memory_backends() else \
        pa.default_memory_pool().backend_name
    assert tuned(None) == [jemalloc_or_default, "100000", "0.001"]
    assert tuned("")[0] == jemalloc_or_default


@pytest.mark.parametrize("setting", ["system", "mimalloc"])
def test_arrows_own_setting_chooses_the_brokers_pool(setting: str) -> None:
    assert tuned(setting)[0] == setting
