"""Which Arrow memory pool Magnetar's own Arrow work allocates from: jemalloc, unless the process
chose Arrow's default pool (``ARROW_DEFAULT_MEMORY_POOL``) or this pyarrow has no jemalloc.

Role: one choice for the broker (``api/server_process.py`` makes it Arrow's default pool) and the
``eventsourcing`` recorder (which passes it to its own kernels, the application's default pool
left as it is). Measured: from mimalloc, pyarrow's default on Linux, a broker's first range-read
answers of some 600 KB took 5-9 ms to write in about half the broker processes (0.3 ms from
jemalloc), and a recorder's first window of 2,000 rows 6-14 ms more to decode in some
processes; later ones cost the same from either.
"""

from __future__ import annotations

import contextlib
import os

import pyarrow as pa

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
"""Arrow's own setting for its default pool: when set, it is the process's choice, kept."""


def preferred_memory_pool() -> pa.MemoryPool:
    """jemalloc's pool, or Arrow's default when the process chose one or jemalloc is not built in."""
    if not os.environ.get(ARROW_POOL_ENV):
        with contextlib.suppress(NotImplementedError):  # a pyarrow built without jemalloc
            return pa.jemalloc_memory_pool()
    return pa.default_memory_pool()
