"""A failed ``accept()`` on the broker's listener: one warning, never a traceback, even when the
listener closes (a shutdown) before asyncio's accept retry runs."""

from __future__ import annotations

import asyncio
import asyncio.constants
import errno
import logging
import socket

import pytest

from api.connection_guard import quiet_accept_errors

POLL_S = 0.01
POLLS_MAX = 500


class _ExhaustedSocket(socket.socket):
    """A listener whose every accept() fails as it does when the process is out of descriptors."""

    def accept(self) -> tuple[socket.socket, object]:
        raise OSError(errno.EMFILE, "Too many open files")


async def _flood_then_close(caplog: pytest.LogCaptureFixture) -> int:
    loop = asyncio.get_running_loop()
    handler = quiet_accept_errors(loop)
    listener = _ExhaustedSocket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.setblocking(False)
    server = await loop.create_server(asyncio.Protocol, sock=listener)
    client = socket.create_connection(listener.getsockname())
    try:
        for _ in range(POLLS_MAX):  # until the failed accept was reported
            if any("accepting connections failed" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(POLL_S)
        server.close()  # the listener goes away before the retry
        await server.wait_closed()
        for _ in range(POLLS_MAX):  # until asyncio's retry ran against the closed listener
            if handler.retries_after_close:
                break
            await asyncio.sleep(POLL_S)
    finally:
        client.close()
    return handler.retries_after_close


def test_an_accept_retry_after_the_listener_closed_logs_no_traceback(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio.constants, "ACCEPT_RETRY_DELAY", 0.05)  # asyncio reads it at each retry
    with caplog.at_level(logging.DEBUG):
        retries = asyncio.run(_flood_then_close(caplog))
    assert retries >= 1
    warnings = [r for r in caplog.records if "accepting connections failed" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not any(r.exc_info for r in caplog.records)
