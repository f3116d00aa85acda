"""The Arrow pool Magnetar's own Arrow work prefers (``consumers/arrow_pool.py``), asked in a
fresh interpreter for each setting of Arrow's own ``ARROW_DEFAULT_MEMORY_POOL``."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

JEMALLOC_OR_DEFAULT = "jemalloc" if "jemalloc" in pa.supported_memory_backends() else \
    pa.default_memory_pool().backend_name


@pytest.mark.parametrize(("setting", "backend"), [(None, JEMALLOC_OR_DEFAULT), ("", JEMALLOC_OR_DEFAULT),
                                                  ("system", "system"), ("mimalloc", "mimalloc")])
def test_jemalloc_unless_the_process_chose_arrows_default_pool(setting: str | None, backend: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if setting is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = setting
    chosen = subprocess.run([sys.executable, "-c", "from consumers.arrow_pool import preferred_memory_pool; "
                             "print(preferred_memory_pool().backend_name)"], env=env, capture_output=True, text=True,
                            check=True)
    assert chosen.stdout.strip() == backend
