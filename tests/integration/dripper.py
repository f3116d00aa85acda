"""A slow-drip client of the binary protocol, in its own process (so that it does not share an
interpreter lock with the test that measures latencies beside it).

``python -m tests.integration.dripper PORT CONNECTIONS SECONDS [TOKEN]`` opens CONNECTIONS
connections (each sending CONNECT with TOKEN first, when given). Each sends most of a 5 MiB
frame at once and then the rest a few bytes per system call, one connection after the other,
pausing between rounds so that the bytes arrive as separate segments rather than coalesced
by the kernel. A connection the broker closes is opened again a little later and starts over.
After SECONDS it prints the bytes dripped and the connections opened, as ``bytes connections``.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

from tests.integration.pulsar_wire import RawConnection, T

FRAME_BYTES = 5 * 1024 * 1024
DRIPPED_BYTES = 200_000
"""The tail of the frame sent a few bytes at a time; the rest goes at once."""
DRIP_BYTES = 3
DRIP_ROUND_S = 0.01
"""Between two rounds of sends over the connections."""
REOPEN_AFTER_S = 0.1
"""A connection the broker closed is opened again this much later."""
BULK = struct.pack(">II", FRAME_BYTES - 4, 64) + bytes(FRAME_BYTES - 8 - DRIPPED_BYTES)
CHUNK = bytes(DRIP_BYTES)


class Slot:
    """One dripping connection, reopened when the broker closes it."""

    def __init__(self, port: int, token: str | None) -> None:
        self.port = port
        self.token = token
        self.conn: RawConnection | None = None
        self.reopen_at_s = 0.0
        self.left = 0
        self.opened = 0

    def drip(self, now_s: float) -> int:
        """Send the next few bytes (opening the connection first when due); the bytes dripped."""
        try:
            if self.conn is None:
                if now_s < self.reopen_at_s:
                    return 0
                self._open()
                return 0
            if self.left <= DRIP_BYTES:  # the frame stays a few bytes short of complete
                return 0
            self.conn.sock.send(CHUNK)
            self.left -= DRIP_BYTES
            return DRIP_BYTES
        except (OSError, AssertionError):
            self.close()
            self.reopen_at_s = now_s + REOPEN_AFTER_S
            return 0

    def _open(self) -> None:
        self.conn = RawConnection(self.port)
        self.opened += 1
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.token is not None:
            assert self.conn.connect(token=self.token).type == T.CONNECTED
        self.conn.send(BULK)
        self.left = DRIPPED_BYTES

    def close(self) -> None:
        if self.conn is not None:
            self.conn.sock.close()
            self.conn = None


def main(argv: list[str]) -> None:
    port, connections, seconds = int(argv[0]), int(argv[1]), float(argv[2])
    slots = [Slot(port, argv[3] if len(argv) > 3 else None) for _ in range(connections)]
    deadline_s = time.monotonic() + seconds
    dripped = 0
    while (now_s := time.monotonic()) < deadline_s:
        dripped += sum(slot.drip(now_s) for slot in slots)
        time.sleep(DRIP_ROUND_S)
    for slot in slots:
        slot.close()
    print(dripped, sum(slot.opened for slot in slots), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
