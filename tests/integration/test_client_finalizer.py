"""A blocking ``Client`` dropped without ``close()`` (as the eventsourcing library drops the
factory of a projection's view) closes its connections and ends its thread once collected."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

from consumers.client import Client
from tests.standalone import standalone_process

THREAD_END_BOUND_S = 10.0


def client_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "magnetar-client" and t.is_alive())


def test_a_dropped_client_closes_its_connections_and_ends_its_thread(tmp_path: Path) -> None:
    with standalone_process(tmp_path) as (url, _):
        before = client_threads()
        client = Client(url)
        client.request("GET", "/admin/v2/tenants")
        reader = client.create_reader("dropped", "latest")
        assert client_threads() == before + 1
        del client, reader
        gc.collect()
        deadline_s = time.monotonic() + THREAD_END_BOUND_S
        while client_threads() > before and time.monotonic() < deadline_s:
            time.sleep(0.05)
        assert client_threads() == before
        gc.collect()  # the loop, its transports and sockets go now: closed, so no ResourceWarning
