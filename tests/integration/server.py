"""A real uvicorn server on 127.0.0.1 with an ephemeral port, in a thread of the test process:
plain HTTP, or HTTPS only (``tls``) as a broker with ``webServicePort=`` empty serves it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI

from api.app import create_app
from api.auth import AuthConfig
from api.limits import EdgeLimits
from api.tls import TlsConfig
from api.web_server import WebListener, web_server
from broker.delivery import Delivery
from broker.reader import StartPosition
from broker.service import BrokerConfig, BrokerService
from broker.topic_name import TopicName

START_TIMEOUT_S = 30.0


@contextmanager
def running_app(data_dir: str, config: BrokerConfig | None = None, *, auth: AuthConfig | None = None,
                limits: EdgeLimits | None = None,
                tls: TlsConfig | None = None) -> Iterator[tuple[str, FastAPI, BrokerService]]:
    """``(url, app, service)`` of a server answering on an ephemeral port; with ``tls`` only on
    HTTPS (the URL says ``https://``)."""
    service = BrokerService(data_dir, config or BrokerConfig.test_min())
    app = create_app(service, auth=auth, limits=limits)
    listener = WebListener("127.0.0.1", 0, None if tls is None else tls.server_context())
    server = web_server(app, [listener], log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield server.urls[0], app, service
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)


@contextmanager
def running_server(data_dir: str, config: BrokerConfig | None = None, *, auth: AuthConfig | None = None,
                   limits: EdgeLimits | None = None,
                   tls: TlsConfig | None = None) -> Iterator[tuple[str, BrokerService]]:
    with running_app(data_dir, config, auth=auth, limits=limits, tls=tls) as (url, _, service):
        yield url, service


def stored_deliveries(service: BrokerService, topic: str) -> list[Delivery]:
    """Everything a topic holds (every partition of a partitioned one), read from earliest;
    empty when the topic was never created."""
    out: list[Delivery] = []
    for partition in service.topics.expand_partitions(TopicName.parse(topic)):
        if not service.topics.exists(partition):
            continue
        reader = service.subscriptions.reader(partition, StartPosition.earliest())
        while (delivery := reader.read_next()) is not None:
            out.append(delivery)
    return out


def stored(service: BrokerService, topic: str) -> list[bytes]:
    """The payloads a topic holds, in order (see :func:`stored_deliveries`)."""
    return [delivery.message.payload for delivery in stored_deliveries(service, topic)]
