"""The binary protocol's outgoing frames: what one turn of the event loop writes leaves together.

Checks, on a real asyncio loop with a transport that records its calls: frames written in one
turn (and in callbacks that turn schedules, such as a producer's receipts after a dispatch) go
to the socket in one ``writelines``, in the order written; past the write-buffer bound they go
at once; closing sends what was written before it closes; nothing is sent after the close.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from api.pulsar.server import PulsarProtocol
from api.pulsar.settings import PulsarSettings


class RecordingTransport:
    def __init__(self) -> None:
        self.calls: list[object] = []

    def writelines(self, buffers: list[bytes | memoryview]) -> None:
        self.calls.append([bytes(b) for b in buffers])

    def close(self) -> None:
        self.calls.append("close")


def connection(bound_bytes: int) -> tuple[PulsarProtocol, RecordingTransport]:
    server = SimpleNamespace(settings=PulsarSettings(write_buffer_bytes_max=bound_bytes))
    protocol = PulsarProtocol(cast(Any, server), tls=False)
    transport = RecordingTransport()
    protocol.transport = cast(Any, transport)
    protocol._loop = asyncio.get_running_loop()
    return protocol, transport


async def turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_one_turns_frames_leave_in_one_call() -> None:
    async def scenario() -> None:
        protocol, transport = connection(1 << 20)
        protocol.write([b"message-1", b"payload-1"])
        asyncio.get_running_loop().call_soon(protocol.write, [b"receipt-1"])  # scheduled by this turn
        assert transport.calls == []
        await turns(4)
        assert transport.calls == [[b"message-1", b"payload-1", b"receipt-1"]]
        protocol.write([b"ping"])
        await turns(4)
        assert transport.calls[-1] == [b"ping"]
        assert len(transport.calls) == 2

    asyncio.run(scenario())


def test_past_the_bound_frames_leave_at_once_and_a_close_sends_first() -> None:
    async def scenario() -> None:
        protocol, transport = connection(10)
        protocol.write([b"12345"])
        assert transport.calls == []
        protocol.write([b"67890"])  # 10 bytes waiting: the bound
        assert transport.calls == [[b"12345", b"67890"]]
        protocol.write([b"error frame"])
        protocol.close()
        assert transport.calls[1:] == [[b"error frame"], "close"]
        protocol.write([b"too late"])
        await turns(4)
        assert transport.calls[-1] == "close"

    asyncio.run(scenario())
