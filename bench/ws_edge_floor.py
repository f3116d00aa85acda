"""The WebSocket edge's floor: what a bare Python server spends per message on the frames alone.

Role: the anchor for the WebSocket figures of ``bench/e2e_bench.py``. ``--serve PORT`` runs a
server that speaks just enough of Pulsar's WebSocket API v2 for the same clients
(``bench/magnetar_e2e.py``'s ``ws_publish`` and ``ws_catch_up``) and stores nothing. It does per
message what any Python edge for that API must do, the way Magnetar's edge does it (uvloop, a
plain ``asyncio.Protocol``, whole masked text frames split here and unmasked with websockets'
C ``apply_mask``, orjson, the frames of one socket read answered in one write):

- producer: parse the JSON frame, decode the base64 payload, answer ``{"result": "ok",
  "messageId", "context", "offset"}``;
- reader: build a message frame (message id and payload in base64, properties, publish time,
  redelivery count, offset), keep it outstanding until its acknowledgement, parse the
  acknowledgement, refill the window when half of it is free.

The run measures that server and ``magnetar standalone`` with the same clients, one after the
other, and prints each one's CPU per message and Magnetar's excess over the floor. Run from the
repository root: ``.venv/bin/python bench/ws_edge_floor.py [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import struct
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import uvloop
from common import DEFAULT_WORK_ROOT, Row, machine_summary, render_table, report, scratch_dir
from e2e_support import NORMAL_PLAN, QUICK_PLAN, Plan, ServerProcess, Throughput, free_port, running, started
from magnetar_e2e import start_magnetar, ws_catch_up, ws_publish
from websockets.speedups import apply_mask

SECTION_HEADING = "## WebSocket edge floor (bench/ws_edge_floor.py)"
PAYLOAD_BYTES = 100
HANDSHAKE_BYTES_MAX = 16 * 1024
FRAME_BYTES_MAX = 1024 * 1024
READER_WINDOW_MAX = 1000
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PUBLISH_TIME = "2026-11-24T00:00:00.000Z"
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


def text_frame(text: str) -> bytes:
    payload = text.encode()
    size = len(payload)
    if size < 126:
        return bytes((0x81, size)) + payload
    if size < 65536:
        return b"\x81\x7e" + _U16.pack(size) + payload
    return b"\x81\x7f" + _U64.pack(size) + payload


def message_id_of(index: int) -> str:
    return base64.b64encode(_U64.pack(index)).decode("ascii")


class FloorProtocol(asyncio.Protocol):
    """One connection: the upgrade, then producer or reader frames (see the module docstring)."""

    def __init__(self, messages_for_readers: int) -> None:
        self._buffer = b""
        self._upgraded = False
        self._reader = False
        self._messages_for_readers = messages_for_readers
        self._next = 0
        self._window = 1
        self._outstanding: dict[str, int] = {}
        self._payload = os.urandom(PAYLOAD_BYTES)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport: a Transport in all but name

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._upgraded:
            self._upgrade()
            return
        self._frames()

    def _upgrade(self) -> None:
        assert self._transport is not None
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > HANDSHAKE_BYTES_MAX:
                self._transport.close()
            return
        head, self._buffer = self._buffer[:end].decode("latin-1"), self._buffer[end + 4:]
        lines = head.split("\r\n")
        target = lines[0].split(" ")[1]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + WS_GUID).digest())
        self._transport.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        self._upgraded = True
        url = urlsplit(target)
        self._reader = "/reader/" in url.path
        if self._reader:
            size = int(parse_qs(url.query).get("receiverQueueSize", ["1000"])[0])
            self._window = max(1, min(size, READER_WINDOW_MAX))
            self._transport.write(self._refill())
        if self._buffer:
            self._frames()

    def _frames(self) -> None:
        assert self._transport is not None
        buf, pos, end = self._buffer, 0, len(self._buffer)
        out: list[bytes] = []
        while end - pos >= 6:
            first, second = buf[pos], buf[pos + 1]
            length, head = second & 0x7F, pos + 2
            if length == 126:
                length, head = _U16.unpack_from(buf, head)[0], head + 2
            elif length == 127:
                if end - head < 8:
                    break
                length, head = _U64.unpack_from(buf, head)[0], head + 8
            if length > FRAME_BYTES_MAX or not second & 0x80:
                self._transport.close()
                return
            start = head + 4
            if end - start < length:
                break
            pos = start + length
            if first & 0x0F == 0x8:  # close
                self._transport.write(b"\x88\x00")
                self._transport.close()
                return
            if first != 0x81:
                continue
            frame = orjson.loads(apply_mask(buf[start:start + length], buf[head:start]))
            if self._reader:
                self._outstanding.pop(frame["messageId"], None)
            else:
                base64.b64decode(frame["payload"])
                out.append(text_frame(orjson.dumps({"result": "ok", "messageId": message_id_of(self._next),
                                                    "context": frame.get("context"),
                                                    "offset": self._next}).decode()))
                self._next += 1
        self._buffer = buf[pos:]
        if self._reader and len(self._outstanding) <= self._window // 2:
            out.append(self._refill())
        if out:
            self._transport.write(b"".join(out))

    def _refill(self) -> bytes:
        frames = []
        while len(self._outstanding) < self._window and self._next < self._messages_for_readers:
            message_id = message_id_of(self._next)
            payload = base64.b64encode(self._payload).decode("ascii")
            frames.append(text_frame(
                f'{{"messageId":"{message_id}","payload":"{payload}","properties":{{}},'
                f'"publishTime":"{PUBLISH_TIME}","redeliveryCount":0,"offset":{self._next}}}'))
            self._outstanding[message_id] = len(self._payload)
            self._next += 1
        return b"".join(frames)


def serve(port: int, messages_for_readers: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: FloorProtocol(messages_for_readers), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def start_floor(work_dir: Path, messages_for_readers: int) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, __file__, "--serve", str(port), "--reader-messages", str(messages_for_readers)]
    return started(ServerProcess("floor", argv, port, work_dir / "floor.log"), lambda s: s.wait_for_port())


def rows_for(measure: str, floor: Throughput, magnetar: Throughput) -> list[Row]:
    floor_us, magnetar_us = (r.cpu.server_s / max(r.messages, 1) * 1e6 for r in (floor, magnetar))
    return [
        Row(f"floor {measure}", f"{floor.messages_per_s:,.0f} msg/s", "1.00x (anchor)",
            f"server CPU {floor_us:.1f} µs/msg; {floor.detail}"),
        Row(f"magnetar {measure}", f"{magnetar.messages_per_s:,.0f} msg/s",
            f"{magnetar.messages_per_s / max(floor.messages_per_s, 1e-9):.2f}x floor",
            f"server CPU {magnetar_us:.1f} µs/msg, {magnetar_us - floor_us:.1f} above the floor "
            f"({magnetar_us / max(floor_us, 1e-9):.1f}x); {magnetar.detail}"),
    ]


async def measure(plan: Plan, work_dir: Path) -> list[Row]:
    with running(start_magnetar(work_dir)) as magnetar:
        written = await ws_publish(magnetar, plan, PAYLOAD_BYTES, "floor-publish", batching=False)
        with running(start_floor(work_dir, written.messages)) as floor:
            floor_publish = await ws_publish(floor, plan, PAYLOAD_BYTES, "floor-publish", batching=False)
            floor_read = await ws_catch_up(floor, plan, "floor-publish", written.messages)
        magnetar_read = await ws_catch_up(magnetar, plan, "floor-publish", written.messages)
    return rows_for("WebSocket publish 100 B, one frame per message", floor_publish, written) + \
        rows_for("WebSocket reader catch-up 100 B, one ack frame per message", floor_read, magnetar_read)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--reader-messages", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--out", type=Path, help="write the table into this markdown file's section")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_ROOT)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.reader_messages)
        return 0
    plan = QUICK_PLAN if args.quick else NORMAL_PLAN
    with scratch_dir(args.work_dir, "edge-floor") as work_dir:
        rows = asyncio.run(measure(plan, work_dir))
        config = (f"{PAYLOAD_BYTES} B payloads, publish {plan.publish_duration_s:.0f} s with a window of "
                  f"{plan.publish_window_messages} frames, reader receiverQueueSize {plan.receiver_queue_size}; "
                  "the floor stores nothing; both servers measured with the same clients, one after the other")
        report(SECTION_HEADING, machine_summary(work_dir), config, render_table(rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
