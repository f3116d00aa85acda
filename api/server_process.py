"""A server process's runtime: interpreter settings for a broker, and a graceful exit on SIGTERM.

Role: shared by ``magnetar standalone`` (``api/cli.py``) and the cluster's ``magnetar broker``
(``api/cli_cluster.py``), which set them up before uvicorn runs.
"""

from __future__ import annotations

import gc
import logging
import sys

import pyarrow as pa

from consumers.arrow_pool import preferred_memory_pool

GC_GEN0_ALLOCATIONS = 100_000
GC_GEN1_COLLECTIONS = 50
GC_GEN2_COLLECTIONS = 1000
THREAD_SWITCH_INTERVAL_S = 0.001
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Magnetar's own loggers print at ``level`` and above on stderr (uvicorn's keep their own
    handlers), from before the configuration is read, so its warnings are seen."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def tune_runtime() -> None:
    """Interpreter settings for a broker process, chosen by measuring latency at 2,000 msg/s.

    Every message allocates short-lived futures, tuples and frames: with the default collector
    thresholds (a young collection every 700 allocations) full collections come often and show
    as 10 to 50 ms latency spikes. A message also hands work between threads (event loop,
    journal, dispatch); a 1 ms switch interval (5 ms by default) bounds how long a thread that
    was woken waits for the interpreter lock. Objects from startup are frozen out of collection.
    Arrow allocates from jemalloc (``use_jemalloc_for_arrow``).
    """
    gc.freeze()
    gc.set_threshold(GC_GEN0_ALLOCATIONS, GC_GEN1_COLLECTIONS, GC_GEN2_COLLECTIONS)
    sys.setswitchinterval(THREAD_SWITCH_INTERVAL_S)
    use_jemalloc_for_arrow()


def use_jemalloc_for_arrow() -> str:
    """Make ``preferred_memory_pool()`` Arrow's default pool (jemalloc unless
    ``ARROW_DEFAULT_MEMORY_POOL`` chooses or it is not built in): range reads' Arrow answers are
    built in it. The backend Arrow then allocates from."""
    pa.set_memory_pool(preferred_memory_pool())
    return str(pa.default_memory_pool().backend_name)


def exit_cleanly(signum: int, _frame: object) -> None:
    raise SystemExit(0)
