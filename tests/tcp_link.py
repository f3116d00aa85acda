"""A TCP link between a client and a server that a test can cut without either end noticing.

Role: tests route one broker's ZooKeeper connection through it. :meth:`TcpLink.cut` is a
network partition (tests/unit/test_ownership.py: the broker must stop serving before another
takes over). :meth:`TcpLink.hold` hides one connection's end (tests/crash/test_cluster_failover.py:
a broker paused with SIGSTOP while its session expires never hears ZooKeeper close it, so after
it resumes it still believes it owns its topics until its own heartbeat times out, and appends
to its old ledgers, which the broker that took them over has fenced).

Invariants:
- Until :meth:`hold` or :meth:`cut`, bytes are forwarded unchanged in both directions, and a
  close on one side closes the other.
- :meth:`hold` freezes the connections open at that moment: nothing more is read from or written
  to them and neither side's close is passed on, so each end sees an open, silent connection.
  Connections made later (a client reconnecting) are forwarded normally.
- :meth:`cut` holds the open connections and every later one as well (accepted, never
  forwarded): nothing passes until the link is closed.
- One thread serves every connection; what waits for a side is bounded (a connection whose side
  falls that far behind is closed: ZooKeeper's traffic never comes near); :meth:`close` stops the
  thread and closes every socket.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

CHUNK_BYTES = 65536
PENDING_BYTES_MAX = 1 << 20
"""What one direction buffers for a side that is slow to read; past it the connection is closed."""
HELD_CONNECTIONS_MAX = 64
"""Connections accepted while cut and held; later ones are closed at once (a client retrying)."""
SELECT_TIMEOUT_S = 0.05


@dataclass(eq=False)
class _Pipe:
    """One accepted connection and its connection to the server."""

    client: socket.socket
    server: socket.socket
    to_server: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    client_sent_ns: int = 0
    """When bytes from the client were last forwarded (0: never)."""
    server_sent_ns: int = 0
    held: bool = False
    ended: bool = False


class TcpLink:
    """Listens on 127.0.0.1 (``address``) and forwards each connection to ``target``."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._pipes: list[_Pipe] = []
        self._held_clients: list[socket.socket] = []
        self._lock = threading.Lock()
        self._hold_requested = False
        self._cut = False
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="tcp-link", daemon=True)

    def start(self) -> TcpLink:
        self._thread.start()
        return self

    def __enter__(self) -> TcpLink:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stopping = True
        if self._thread.is_alive():
            self._thread.join(10)
        for pipe in self._pipes:
            pipe.client.close()
            pipe.server.close()
        for client in self._held_clients:
            client.close()
        self._listener.close()
        self._selector.close()

    def answered(self) -> bool:
        """Whether every open connection's server spoke after its client last did: no request
        of the client is waiting for an answer at this moment."""
        with self._lock:
            return all(p.server_sent_ns >= p.client_sent_ns for p in self._pipes if not p.held)

    def connections(self) -> int:
        with self._lock:
            return sum(1 for p in self._pipes if not p.held)

    def cut(self) -> None:
        """Hold every connection, open or to come (a partition)."""
        self._cut = True
        self.hold()

    def hold(self, timeout_s: float = 10.0) -> int:
        """Freeze the open connections (see the module's invariants); returns how many."""
        self._hold_requested = True
        deadline_s = time.monotonic() + timeout_s
        while self._hold_requested:
            if time.monotonic() > deadline_s:
                raise TimeoutError("the link did not hold its connections in time")
            time.sleep(0.001)
        with self._lock:
            return sum(1 for p in self._pipes if p.held)

    # --- the thread ----------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stopping:
            if self._hold_requested:
                self._hold_now()
            for key, events in self._selector.select(SELECT_TIMEOUT_S):
                if key.fileobj is self._listener:
                    self._accept()
                    continue
                pipe, side = key.data
                if not (pipe.held or pipe.ended) and events & selectors.EVENT_READ:
                    self._read(pipe, side)
                if not (pipe.held or pipe.ended) and events & selectors.EVENT_WRITE:
                    self._flush(pipe, side)

    def _hold_now(self) -> None:
        with self._lock:
            for pipe in self._pipes:
                if not pipe.held:
                    pipe.held = True
                    for sock in (pipe.client, pipe.server):
                        self._selector.unregister(sock)
        self._hold_requested = False

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._cut:
            if len(self._held_clients) < HELD_CONNECTIONS_MAX:
                self._held_clients.append(client)  # silent: never answered, never closed before the end
            else:
                client.close()
            return
        try:
            server = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipe = _Pipe(client, server)
        with self._lock:
            self._pipes.append(pipe)
        self._selector.register(client, selectors.EVENT_READ, (pipe, "client"))
        self._selector.register(server, selectors.EVENT_READ, (pipe, "server"))

    def _read(self, pipe: _Pipe, side: str) -> None:
        source = pipe.client if side == "client" else pipe.server
        pending = pipe.to_server if side == "client" else pipe.to_client
        try:
            data = source.recv(CHUNK_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._end(pipe)
            return
        now_ns = time.monotonic_ns()
        with self._lock:
            if side == "client":
                pipe.client_sent_ns = now_ns
            else:
                pipe.server_sent_ns = now_ns
        pending.extend(data)
        self._flush(pipe, "server" if side == "client" else "client")

    def _flush(self, pipe: _Pipe, side: str) -> None:
        """Write what waits for ``side``; watch it for writability while some still waits."""
        target = pipe.client if side == "client" else pipe.server
        pending = pipe.to_client if side == "client" else pipe.to_server
        if len(pending) > PENDING_BYTES_MAX:
            self._end(pipe)
            return
        try:
            sent = target.send(pending) if pending else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            self._end(pipe)
            return
        del pending[:sent]
        self._selector.modify(target, selectors.EVENT_READ | (selectors.EVENT_WRITE if pending else 0),
                              (pipe, side))

    def _end(self, pipe: _Pipe) -> None:
        with self._lock:
            if pipe.ended:
                return
            pipe.ended = True
            self._pipes.remove(pipe)
        for sock, pending in ((pipe.client, pipe.to_client), (pipe.server, pipe.to_server)):
            self._selector.unregister(sock)
            if pending:  # best effort: what the other side sent before it closed
                with contextlib.suppress(OSError):
                    sock.send(pending)
            sock.close()
