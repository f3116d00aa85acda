"""FrameWriter: a connection's frames leave in order, one write per turn of the loop while the peer
keeps up, and wait here, bounded in frames and in bytes, while it does not.

A recording transport stands in for the socket (the writer's own logic is what is tested) and
websockets' sans-I/O client reads what was written; the real writer runs under every WebSocket
integration test.
"""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from api.ws.writer import FrameWriter


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))


def read_back(transport: RecordingTransport) -> list[str]:
    """Every frame written, as the client reads it (text, or ``<ping>`` for a ping)."""
    client = ClientProtocol(parse_uri("ws://broker/"), state=State.OPEN, max_size=None)
    client.receive_data(b"".join(transport.writes))
    frames = [event for event in client.events_received() if isinstance(event, Frame)]
    return [bytes(f.data).decode() if f.opcode is Opcode.TEXT else f"<{f.opcode.name.lower()}>" for f in frames]


async def turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_a_burst_goes_out_in_one_write_at_the_end_of_the_turn() -> None:
    async def scenario() -> None:
        transport = RecordingTransport()
        writer = FrameWriter(transport, asyncio.get_running_loop(), frames_max=4)
        writer.send(["a", "b"])
        writer.send([])
        writer.send(["c"])
        assert transport.writes == []  # not yet: what this turn hands over leaves together
        await turn()
        assert read_back(transport) == ["a", "b", "c"] and len(transport.writes) == 1 and not writer.backlogged
    asyncio.run(scenario())


def test_paused_writes_wait_in_order_and_the_bound_holds_the_session_back() -> None:
    async def scenario() -> None:
        transport = RecordingTransport()
        writer = FrameWriter(transport, asyncio.get_running_loop(), frames_max=3)
        room_again: list[int] = []
        writer.send(["1"])
        await turn()
        writer.pause()  # the transport's buffer is full: the peer reads slowly
        writer.send(["2", "3"])
        await turn()
        assert writer.has_room and writer.backlogged  # two wait, under the bound of three
        writer.send(["4"])
        assert not writer.has_room
        writer.when_room(lambda: room_again.append(len(read_back(transport))))
        await turn()
        assert read_back(transport) == ["1"] and room_again == []  # the session must wait
        writer.resume()
        writer.send(["5"])  # behind what waited, not before it
        await turn()
        assert read_back(transport) == ["1", "2", "3", "4", "5"]
        assert room_again == [4] and writer.has_room and not writer.backlogged
    asyncio.run(scenario())


def test_control_frames_leave_in_turn_with_the_text_frames() -> None:
    async def scenario() -> None:
        transport = RecordingTransport()
        writer = FrameWriter(transport, asyncio.get_running_loop())
        writer.send(["before"])
        writer.send_bytes([Frame(Opcode.PING, b"p").serialize(mask=False), b""])
        writer.send(["after"])
        await turn()
        assert read_back(transport) == ["before", "<ping>", "after"]
    asyncio.run(scenario())


def test_a_departed_peer_drops_what_waits_and_nothing_more_is_written() -> None:
    async def scenario() -> None:
        transport = RecordingTransport()
        writer = FrameWriter(transport, asyncio.get_running_loop(), frames_max=1)
        writer.pause()
        writer.send(["lost", "also lost"])
        writer.when_room(lambda: None)
        writer.stop()
        assert writer.has_room and not writer.backlogged
        writer.resume()
        writer.send(["after"])  # ignored: nobody is there
        writer.flush()
        await turn()
        assert transport.writes == []
    asyncio.run(scenario())


def test_a_few_large_frames_hold_the_session_back_by_their_bytes() -> None:
    async def scenario() -> None:
        transport = RecordingTransport()
        writer = FrameWriter(transport, asyncio.get_running_loop(), frames_max=1000, bytes_max=100)
        writer.pause()
        writer.send(["x" * 60])
        assert writer.has_room  # 60 bytes wait, under the bound of 100
        writer.send(["y" * 60])
        assert not writer.has_room  # two frames, far under 1,000 frames, but 120 bytes
        writer.resume()
        await turn()
        assert read_back(transport) == ["x" * 60, "y" * 60] and writer.has_room
    asyncio.run(scenario())
