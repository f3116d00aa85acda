"""A real uvicorn server on 127.0.0.1 with an ephemeral port, in a thread of the test process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from api.app import SERVER_OPTIONS, create_app
from api.auth import AuthConfig
from broker.service import BrokerConfig, BrokerService

START_TIMEOUT_S = 30.0


@contextmanager
def running_server(data_dir: str, config: BrokerConfig | None = None, *,
                   auth: AuthConfig | None = None) -> Iterator[tuple[str, BrokerService]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    service = BrokerService(data_dir, config or BrokerConfig.test_min())
    server = uvicorn.Server(uvicorn.Config(create_app(service, auth=auth), log_level="warning", **SERVER_OPTIONS))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", service
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)
        sock.close()
