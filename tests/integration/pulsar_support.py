"""A real ``magnetar standalone`` with its binary-protocol listener, and the official
``pulsar-client`` against it (the tests of ``api/pulsar/``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import pulsar

from tests.standalone import free_port, standalone_process

RECEIVE_TIMEOUT_MS = 10_000
OPERATION_TIMEOUT_S = 15


@contextmanager
def binary_broker(data_dir: str | Path, *extra: str, env: dict[str, str] | None = None,
                  output: IO[bytes] | int = subprocess.DEVNULL) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """``(http url, pulsar url, process)`` of a broker serving the binary protocol on a free port."""
    port = free_port()
    with standalone_process(data_dir, "--pulsar-port", str(port), *extra, env=env, output=output) as (url, proc):
        yield url, f"pulsar://127.0.0.1:{port}", proc


def client(service_url: str, **options: Any) -> pulsar.Client:
    return pulsar.Client(service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **options)


def create_partitioned(http_url: str, topic: str, partitions: int, *, token: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.put(f"{http_url}/admin/v2/persistent/public/default/{topic}/partitions", json=partitions,
                         headers=headers, timeout=30)
    assert response.status_code in (200, 204), response.text


def receive_all(consumer: pulsar.Consumer, count: int, *, ack: bool = True) -> list[pulsar.Message]:
    """Exactly ``count`` messages (each within the receive timeout), acknowledged unless told."""
    received = []
    for _ in range(count):
        message = consumer.receive(RECEIVE_TIMEOUT_MS)
        if ack:
            consumer.acknowledge(message)
        received.append(message)
    return received


DRAINED_MESSAGES_MAX = 10_000


def drain(consumer: pulsar.Consumer, timeout_ms: int = 1000) -> list[pulsar.Message]:
    """Every message until none arrives within ``timeout_ms``, each acknowledged (at most
    ``DRAINED_MESSAGES_MAX``: more fails the test rather than looping on)."""
    received: list[pulsar.Message] = []
    for _ in range(DRAINED_MESSAGES_MAX):
        try:
            message = consumer.receive(timeout_ms)
        except pulsar.Timeout:
            return received
        consumer.acknowledge(message)
        received.append(message)
    raise AssertionError(f"more than {DRAINED_MESSAGES_MAX} messages")


def nothing_more(consumer: pulsar.Consumer, timeout_ms: int = 300) -> bool:
    """True when no message arrives within ``timeout_ms`` (a bounded wait, for "nothing else")."""
    try:
        consumer.receive(timeout_ms)
    except pulsar.Timeout:
        return True
    return False
