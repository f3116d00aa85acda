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


class Holder:
    """What the eventsourcing library's application is to its client: it closes the client from
    its ``__del__``, and sits in a reference cycle with it."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.myself = self

    def __del__(self) -> None:
        self.client.close()


def test_a_client_closed_by_its_holders_finalizer_after_its_own_does_not_hang() -> None:
    """A collection of a cycle runs the client's finalizer (``weakref.finalize``) before its
    holder's ``__del__``, whose ``close()`` then met a loop already stopping: it handed it a
    coroutine and waited forever (158 of 200 tries hung; the suite once hung 300 s in the
    library's Application test). Every try here must end, within a bound."""
    hung = 0
    for _ in range(50):
        Holder(Client("http://127.0.0.1:9"))  # nothing listens: the client never connects
        collector = threading.Thread(target=gc.collect, daemon=True)
        collector.start()
        collector.join(THREAD_END_BOUND_S)
        hung += collector.is_alive()
    assert hung == 0
