"""The binary front end's asyncio adapter: listeners on :6650 and/or :6651 (TLS), bytes to frames.

Role: ``PulsarServer`` listens on the API's event loop (the broker's dispatch runs there too, so
deliveries leave inside the dispatch that made them). Each accepted connection is a
``PulsarProtocol``: it feeds received bytes to a ``FrameDecoder`` and the frames to a
``PulsarSession``, and is the session's ``Outbound`` (writes, read pausing, congestion). The TLS
listener's context comes from ``api/tls.py`` (TLS 1.2+, client certificates verified against
``tlsTrustCertsFilePath``); a connection's verified client certificate goes to its session for
``AuthenticationProviderTls``.

Invariants:
- Bounded: at most ``connections_max`` connections (more are closed at once); one frame in
  the decoder, and before the handshake completed only a small one, within a budget shared by
  all such connections and for a limited time (``handshakes.py``); at most
  ``pending_sends_max`` sends unanswered per connection (reading pauses); outgoing bytes
  above ``write_buffer_bytes_max`` make the session congested (deliveries stop until the
  transport drained, and resume then).
- What one turn of the loop writes to a connection, and what the callbacks that turn schedules
  write (a producer's receipts after the dispatch that delivered its messages), leaves in one
  system call, in the order written, at the end of that turn; at once when
  ``write_buffer_bytes_max`` bytes wait; before the connection closes.
- A protocol violation or an unexpected failure closes that connection (logged once, counted
  in ``statistics()``); nothing a client sends reaches past its own connection.
- Lookups are answered by ``lookups.py`` (on lookup threads in a cluster, never blocking the
  loop); on a cluster broker, topics that stop being served here (unload, split, lost session)
  have their producers and consumers closed on every connection (``_topics_unloaded``).
- A closed connection's partial frame is dropped at once (its memory does not wait for the
  cycle collector).
- With authentication on, every change of policies makes each session check again what its
  role may do and close the producers, consumers and watches it no longer may hold
  (``_policies_changed``); a role holds at most its share of the connections and topic-list
  watches (``shares.py``).
- A connection silent for two keep-alive intervals is closed; one quiet for one interval is
  sent a PING. With authentication on, every ``auth_refresh_check_s`` each session checks
  whether its token expired (``PulsarSession.check_credentials``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from api.auth import Authorizer
from api.pulsar import commands
from api.pulsar.context import ConnectionContext
from api.pulsar.framing import FrameDecoder, ProtocolViolation
from api.pulsar.handshakes import PendingHandshakes
from api.pulsar.listeners import named_listener
from api.pulsar.lookups import Listener, LookupAnswer, LookupRunner, lookup_answer
from api.pulsar.schemas import ProtocolSchemas
from api.pulsar.session import PulsarSession, State, Verdicts
from api.pulsar.settings import PulsarSettings
from api.pulsar.shares import RolePools
from api.tls import tls_peer_of
from broker import BrokerAddress, BrokerService, MagnetarError, TopicName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PulsarServerStats:
    connections_open: int
    connections_accepted: int
    connections_refused: int
    protocol_violations: int
    frames_received: int
    bytes_received: int
    producers: int
    consumers: int
    sends: int
    send_errors: int
    messages_out: int
    authentication_failures: int


class PulsarServer:
    def __init__(self, service: BrokerService, authorizer: Authorizer, settings: PulsarSettings) -> None:
        self.service = service
        self.authorizer = authorizer
        self.settings = settings
        self.access = service.producer_access
        self.schemas = ProtocolSchemas(service.schemas)
        self.pools = RolePools.of(settings.connections_per_role_max, settings.topic_list_watchers_per_role_max)
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[PulsarProtocol] = set()
        self._ids = itertools.count(1)
        self._keepalive: asyncio.Task[None] | None = None
        self._auth_refresh: asyncio.Task[None] | None = None
        self.ports: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.lookups: LookupRunner | None = None
        self.handshakes = PendingHandshakes(settings.handshake_buffer_bytes_max, settings.handshake_timeout_s)
        self.accepted = self.refused = self.violations = self.frames = self.bytes_in = 0
        self.totals: dict[str, int] = {}

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        settings = self.settings
        self.lookups = LookupRunner(loop, threads=settings.lookup_threads, pending_max=settings.lookups_pending_max,
                                    inline=not self.service.namespaces.clustered)
        if self.service.namespaces.clustered:
            self.service.add_unload_listener(self._topics_unloaded)
        if self.authorizer.enabled:
            self.service.add_policy_listener(self._policies_changed)
        host = settings.host
        if settings.port:
            server = await loop.create_server(lambda: PulsarProtocol(self, tls=False), host, settings.port)
            self._servers.append(server)
            self.ports["pulsar"] = server.sockets[0].getsockname()[1]
        if settings.tls_enabled:
            server = await loop.create_server(lambda: PulsarProtocol(self, tls=True), host, settings.tls_port,
                                              ssl=settings.tls.server_context(),
                                              ssl_handshake_timeout=settings.handshake_timeout_s)
            self._servers.append(server)
            self.ports["pulsar+ssl"] = server.sockets[0].getsockname()[1]
        self._keepalive = asyncio.create_task(self._keepalive_loop())
        if self.authorizer.enabled:
            self._auth_refresh = asyncio.create_task(self._auth_refresh_loop())
        log.info("Pulsar's binary protocol listening on %s",
                 ", ".join(f"{scheme}://{_url_host(host)}:{port}" for scheme, port in self.ports.items()))

    async def close(self) -> None:
        self._closed = True
        if self.lookups is not None:
            self.lookups.close()
        for task in (self._keepalive, self._auth_refresh):
            if task is not None:
                task.cancel()
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()

    def listener_for(self, host: str, name: str = "") -> Listener:
        """This broker's URLs for a client that reached it at ``host`` and names listener
        ``name`` (''): that advertised listener's, else the internal one's when
        ``advertisedListeners`` is set, else this host's (or ``advertisedAddress``'s)."""
        settings = self.settings
        if name or settings.advertised_listeners:
            own = BrokerAddress("", "", listeners=settings.advertised_listeners)
            chosen = named_listener(own, name or settings.internal_listener_name)
            return Listener(chosen.service_url or None, chosen.service_url_tls or None)
        host = settings.advertised_host or host
        plain = self.ports.get("pulsar")
        tls = self.ports.get("pulsar+ssl")
        return Listener(f"pulsar://{host}:{plain}" if plain else None,
                        f"pulsar+ssl://{host}:{tls}" if tls else None)

    def lookup_answer(self, topic: TopicName, host: str, *, tls: bool, listener: str = "") -> LookupAnswer:
        """What LOOKUP answers a client that reached this broker at ``host``: the broker's one
        lookup (``NamespaceService.lookup``, as HTTP's) in Pulsar's terms, Connect with this
        broker's listeners or Redirect to the owner's (``lookups.lookup_answer``). In a cluster
        it reads ZooKeeper: called on the lookup threads, never on the event loop."""
        found = self.service.namespaces.lookup(topic)
        own = self.listener_for(host, listener) if found.local else Listener(None, None)
        return lookup_answer(found, own, tls=tls, listener=listener)

    def _topics_unloaded(self, names: list[TopicName]) -> None:
        """The broker's unload listener (any thread): the sessions on these topics close their
        producers and consumers on the loop."""
        loop = self._loop
        if loop is None or self._closed:
            return
        gone = set(names)

        def on_loop() -> None:
            for connection in list(self._connections):
                connection.topics_unloaded(gone)

        with contextlib.suppress(RuntimeError):  # the loop is closed: so are the connections
            loop.call_soon_threadsafe(on_loop)

    def _policies_changed(self) -> None:
        """The broker's policy listener (any thread): every session checks again what its role
        may still do, on the loop, and closes the rest (``PulsarSession.revalidate``)."""
        loop = self._loop
        if loop is None or self._closed:
            return

        def on_loop() -> None:
            verdicts: Verdicts = {}
            for connection in list(self._connections):
                connection.revalidate(verdicts)

        with contextlib.suppress(RuntimeError):  # the loop is closed: so are the connections
            loop.call_soon_threadsafe(on_loop)

    def admit(self, connection: PulsarProtocol) -> bool:
        if len(self._connections) >= self.settings.connections_max:
            self.refused += 1
            return False
        self._connections.add(connection)
        self.accepted += 1
        return True

    def forget(self, connection: PulsarProtocol) -> None:
        self._connections.discard(connection)
        for name, value in connection.context.counters.items() if connection.context else ():
            self.totals[name] = self.totals.get(name, 0) + value

    async def _keepalive_loop(self) -> None:
        interval_s = self.settings.keepalive_interval_s
        while True:
            await asyncio.sleep(interval_s / 2)
            now = time.monotonic()
            for connection in list(self._connections):
                connection.keepalive(now, interval_s)

    async def _auth_refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.auth_refresh_check_s)
            now_s = time.time()
            for connection in list(self._connections):
                connection.check_credentials(now_s)

    def statistics(self) -> PulsarServerStats:
        live: dict[str, int] = dict(self.totals)
        producers = consumers = 0
        for connection in self._connections:
            if connection.context is not None:
                for name, value in connection.context.counters.items():
                    live[name] = live.get(name, 0) + value
            if connection.session is not None:
                producers += len(connection.session.producers)
                consumers += len(connection.session.consumers)
        return PulsarServerStats(len(self._connections), self.accepted, self.refused, self.violations,
                                 self.frames, self.bytes_in, producers, consumers, live.get("sends", 0),
                                 live.get("send_errors", 0), live.get("messages_out", 0),
                                 live.get("authentication_failures", 0))


class PulsarProtocol(asyncio.Protocol):
    """One connection: bytes in through the decoder to the session; the session's ``Outbound``."""

    def __init__(self, server: PulsarServer, *, tls: bool) -> None:
        self.server = server
        self.tls = tls
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(server.settings.handshake_frame_bytes_max)
        self._handshaking = True
        self.context: ConnectionContext | None = None
        self.session: PulsarSession | None = None
        self._writing_paused = False
        self._reading_paused = False
        self._closing = False
        self._unsent: list[bytes | memoryview] | None = None
        """Frames written during this turn of the loop, sent together at its end (None: none)."""
        self._unsent_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not subclasses of asyncio.Transport, only alike)
        self.transport = transport = cast(asyncio.Transport, transport)
        if not self.server.admit(self):
            transport.abort()
            return
        server = self.server
        transport.set_write_buffer_limits(high=server.settings.write_buffer_bytes_max)
        host = transport.get_extra_info("sockname")[0]
        self._loop = loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        address = f"/{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
        self.context = ConnectionContext(server.service, server.authorizer, server.settings, self, loop,
                                         next(server._ids), server.pools, tls_peer=tls_peer_of(transport),
                                         address=address)
        assert server.lookups is not None, "connections are accepted only once the server started"
        tls = self.tls
        self.session = PulsarSession(self.context, server.lookups,
                                     lambda topic, listener: server.lookup_answer(topic, host, tls=tls,
                                                                                  listener=listener),
                                     server.access,
                                     server.schemas)
        server.handshakes.open(self, loop, self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.session is None or self._closing:
            return
        try:
            frames = self.decoder.feed(data)
            self.server.bytes_in += len(data)
            self.server.frames += len(frames)
            self.session.handle_all(frames)
            if self._handshaking:
                self._handshake_progress()
        except ProtocolViolation as exc:
            self.server.violations += 1
            log.info("closing a binary-protocol connection: %s", exc)
            self.close()
        except MagnetarError as exc:
            log.warning("closing a binary-protocol connection after a broker error: %s", exc)
            self.close()
        except Exception:
            log.exception("closing a binary-protocol connection after an unexpected failure")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.decoder.release()
        self.server.handshakes.finish(self)
        if self.session is not None:
            try:
                self.session.connection_lost()
            except Exception:
                log.exception("releasing a binary-protocol connection's producers and consumers failed")
        self.server.forget(self)

    def _handshake_progress(self) -> None:
        """After a read before the handshake completed: once CONNECTED, frames up to the maximum
        message size are read; until then, what the decoder holds must fit the budget."""
        assert self.session is not None
        if self.session.state is State.CONNECTED:
            self._handshaking = False
            self.server.handshakes.finish(self)
            self.decoder.frame_bytes_max = self.server.settings.frame_bytes_max
        elif not self.server.handshakes.hold(self, self.decoder.buffered_bytes):
            log.info("closing a binary-protocol connection: its handshake's partial frame does not fit the %d bytes "
                     "all handshakes may hold", self.server.handshakes.buffer_bytes_max)
            self.close()

    def _handshake_timed_out(self) -> None:
        log.info("closing a binary-protocol connection whose handshake did not complete within %.1f s",
                 self.server.handshakes.timeout_s)
        self.close()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self.session is not None and not self._closing:
            self.session.writable_again()

    # --- Outbound ------------------------------------------------------------------------
    def write(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Queue ``buffers`` for the socket: what one turn of the event loop writes (a receipt and
        a delivery, say, for a client whose producer and consumer share the connection) leaves
        in one system call, at the end of the turn, or at once past the write-buffer bound."""
        if self.transport is None or self._loop is None or self._closing or not buffers:
            return
        if self._unsent is None:
            self._unsent = list(buffers)
            self._loop.call_soon(self._loop.call_soon, self._send_unsent)  # after what this turn schedules
        else:
            self._unsent.extend(buffers)
        self._unsent_bytes += sum(map(len, buffers))
        if self._unsent_bytes >= self.server.settings.write_buffer_bytes_max:
            self._send_unsent()

    def _send_unsent(self) -> None:
        unsent, self._unsent, self._unsent_bytes = self._unsent, None, 0
        if unsent and self.transport is not None and not self._closing:
            self.transport.writelines(unsent)

    @property
    def congested(self) -> bool:
        return self._writing_paused

    def pause_reading(self) -> None:
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self._reading_paused and not self._closing:
            self._reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self._closing:
            self._send_unsent()  # what was written goes out before the connection closes
            self._closing = True
            self.transport.close()

    def topics_unloaded(self, names: set[TopicName]) -> None:
        if self.session is None or self._closing:
            return
        try:
            self.session.topics_unloaded(names)
        except Exception:
            log.exception("closing a binary-protocol connection after a failure to close its moved topics")
            self.close()

    def revalidate(self, verdicts: Verdicts) -> None:
        if self.session is None or self._closing:
            return
        try:
            self.session.revalidate(verdicts)
        except Exception:
            log.exception("closing a binary-protocol connection after a failure to re-check its permissions")
            self.close()

    def check_credentials(self, now_s: float) -> None:
        if self.session is None or self._closing:
            return
        try:
            self.session.check_credentials(now_s)
        except ProtocolViolation as exc:
            self.server.violations += 1
            log.info("closing a binary-protocol connection: %s", exc)
            self.close()

    def keepalive(self, now_s: float, interval_s: float) -> None:
        if self.session is None or self._closing:
            return
        silent_s = now_s - self.session.last_frame_s
        if silent_s >= 2 * interval_s:
            log.info("closing a binary-protocol connection silent for %.0f s", silent_s)
            self.close()
        elif silent_s >= interval_s:
            self.write([commands.ping()])


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
