"""Event streams through the Python client and the ``magnetar`` CLI, against a real uvicorn server.

Checks, through public APIs only: ``append`` with an expected version (-1, a version,
``"exists"``), refusals as ``KeyVersionMismatch`` with the current version (REST and the
WebSocket producer's ``expected_key_version``), a timed-out append retried with the same
producer name and sequence id answered with its first results, ``read_stream`` both ways,
``stream_info``, a live stream reader (blocking and asyncio); ``magnetar produce
--expected-key-version`` and ``magnetar read-stream`` (paged, backward, following) as real
subprocesses.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.service import BrokerService
from consumers.client import AsyncClient, Client, DcbConditionFailed, DcbEvent, DcbQueryItem, KeyVersionMismatch
from tests.integration.server import running_server
from tests.standalone import REPO_ROOT

WAIT_MS = 10_000
CLI_TIMEOUT_S = 60.0
TOPIC = "accounts"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, BrokerService]]:
    with running_server(str(tmp_path / "data")) as (url, service):
        yield url, service


@pytest.fixture
def client(server: tuple[str, BrokerService]) -> Iterator[Client]:
    with Client(server[0]) as made:
        yield made


def test_append_with_expected_versions_and_a_safe_retry(client: Client) -> None:
    opened = client.append(TOPIC, "acct-1", [b"opened", b"deposited 10"], expected_version=-1)
    assert (opened.first_version, opened.version, opened.duplicate) == (0, 1, False)
    assert len(opened.offsets) == 2 and len(set(opened.message_ids)) == 2
    with pytest.raises(KeyVersionMismatch) as refused:
        client.append(TOPIC, "acct-1", [b"late"], expected_version=0)
    assert refused.value.current_versions == {"acct-1": 1}
    with pytest.raises(KeyVersionMismatch):
        client.append(TOPIC, "acct-9", [b"x"], expected_version="exists")
    assert client.append(TOPIC, "acct-1", [b"withdrew 3"], expected_version="exists").version == 2
    first = client.append(TOPIC, "acct-1", [b"closed"], expected_version=2, producer_name="app", sequence_id=5)
    retried = client.append(TOPIC, "acct-1", [b"closed"], expected_version=2, producer_name="app", sequence_id=5)
    assert retried.duplicate and (retried.version, retried.offsets, retried.message_ids) == \
        (3, first.offsets, first.message_ids)
    assert client.stream_info(TOPIC, "acct-1").version == 3  # stored once


def test_read_a_stream_both_ways_and_follow_it(client: Client) -> None:
    for version in range(6):
        client.append(TOPIC, "acct-2", [f"e{version}".encode()], expected_version=version - 1)
        client.append(TOPIC, "other", [b"noise"])
    forward = client.read_stream(TOPIC, "acct-2", from_version=2, max_messages=3)
    assert [(m.key_version, m.data) for m in forward.messages] == [(2, b"e2"), (3, b"e3"), (4, b"e4")]
    assert forward.next_version == 5 and forward.version == 5
    assert all(m.key == "acct-2" and m.offset is not None and m.publish_time_ms for m in forward.messages)
    backward = client.read_stream(TOPIC, "acct-2", max_messages=2, backward=True)
    assert [m.key_version for m in backward.messages] == [5, 4] and backward.next_version == 3
    info = client.stream_info(TOPIC, "acct-2")
    assert (info.version, info.first_version, info.partition) == (5, 0, -1)
    with client.create_stream_reader(TOPIC, "acct-2", 4) as reader:
        assert [reader.read_next(WAIT_MS).key_version for _ in range(2)] == [4, 5]
        assert not reader.has_message_available()
        client.append(TOPIC, "other", [b"noise"])
        client.append(TOPIC, "acct-2", [b"e6"], expected_version=5)
        assert reader.has_message_available()
        followed = reader.read_next(WAIT_MS)
        assert (followed.key_version, followed.data) == (6, b"e6")


def test_the_websocket_producer_appends_conditionally(client: Client) -> None:
    with client.create_producer(TOPIC) as producer:
        assert producer.send(b"a", key="acct-3", expected_key_version=-1).key_version == 0
        assert producer.send(b"b", key="acct-3").key_version == 1
        with pytest.raises(KeyVersionMismatch) as refused:
            producer.send(b"c", key="acct-3", expected_key_version=0)
        assert refused.value.current_versions == {"acct-3": 1}
        with pytest.raises(ValueError):
            producer.send(b"d", expected_key_version=0)
    assert [m.data for m in client.read_stream(TOPIC, "acct-3").messages] == [b"a", b"b"]


def test_the_async_client_appends_and_follows(server: tuple[str, BrokerService]) -> None:
    async def scenario() -> list[tuple[int | None, bytes]]:
        async with AsyncClient(server[0]) as client:
            await client.append(TOPIC, "acct-4", [b"a0"], expected_version=-1)
            reader = await client.create_stream_reader(TOPIC, "acct-4")
            await client.append(TOPIC, "acct-4", [b"a1", b"a2"], expected_version=0)
            seen = [await reader.read_next(WAIT_MS) for _ in range(3)]
            await reader.close()
            return [(m.key_version, m.data) for m in seen]

    assert asyncio.run(scenario()) == [(0, b"a0"), (1, b"a1"), (2, b"a2")]


def _magnetar(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "api.cli", "--service-url", url, *args], cwd=REPO_ROOT,
                            env={k: v for k, v in os.environ.items() if k != "MAGNETAR_SERVICE_URL"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
        return proc.returncode, out, err
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_cli_appends_conditionally_and_reads_and_follows_streams(server: tuple[str, BrokerService],
                                                                     client: Client) -> None:
    url, _ = server
    code, out, err = _finish(_magnetar(url, "produce", TOPIC, "-k", "acct-5", "-m", "opened", "-m", "paid",
                                       "--expected-key-version", "-1"))
    assert code == 0, err
    assert "2 events appended to 'acct-5': versions 0..1" in out
    code, _, err = _finish(_magnetar(url, "produce", TOPIC, "-k", "acct-5", "-m", "again",
                                     "--expected-key-version", "-1"))
    assert code == 1 and "key_version_mismatch" in err
    code, _, err = _finish(_magnetar(url, "produce", TOPIC, "-m", "no key", "--expected-key-version", "0"))
    assert code == 1 and "needs a key" in err
    code, out, err = _finish(_magnetar(url, "read-stream", TOPIC, "acct-5"))
    assert code == 0, err
    assert out.splitlines()[0].startswith("----- version 0 (offset ")
    assert "content:opened" in out and "content:paid" in out and "2 events of 'acct-5' read" in out
    code, out, _ = _finish(_magnetar(url, "read-stream", TOPIC, "acct-5", "--backward", "-n", "1"))
    assert code == 0 and "----- version 1 " in out and "version 0" not in out
    follower = _magnetar(url, "read-stream", TOPIC, "acct-5", "--follow", "--from-version", "1", "-n", "2",
                         "--timeout-s", "30")
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline().startswith("----- version 1 ")  # caught up; now following
        client.append(TOPIC, "acct-5", [b"shipped"], expected_version=1)
    finally:
        code, out, err = _finish(follower)
    assert code == 0, err
    assert "content:shipped" in out and "2 events of 'acct-5' read" in out


def test_the_blocking_clients_stream_and_dcb_calls_are_made_from_the_calling_thread(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends, reads and DCB calls of the blocking client never wait on its event-loop thread
    (``BlockingHttp``, as ``Client.request``): they answer with that thread out of reach."""
    def out_of_reach(coroutine: object) -> None:
        raise AssertionError(f"{coroutine} was handed to the client's loop thread")

    monkeypatch.setattr(client._runner, "call", out_of_reach)
    assert client.append(TOPIC, "acct-5", [b"a", b"b"], expected_version=-1).version == 1
    with pytest.raises(KeyVersionMismatch):
        client.append(TOPIC, "acct-5", [b"c"], expected_version=0)
    assert [m.data for m in client.read_stream(TOPIC, "acct-5").messages] == [b"a", b"b"]
    assert client.stream_info(TOPIC, "acct-5").version == 1
    dcb_topic = "persistent://public/default/dcb-blocking"
    assert client.dcb_append(dcb_topic, [DcbEvent("Opened", b"x", ("acct-5",))]) == 1
    with pytest.raises(DcbConditionFailed):
        client.dcb_append(dcb_topic, [DcbEvent("Opened", b"y")], [DcbQueryItem(("Opened",))], after=0)
    assert [e.position for e in client.dcb_read(dcb_topic, [DcbQueryItem(tags=("acct-5",))]).events] == [1]
