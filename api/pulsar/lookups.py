"""Binary LOOKUP and PARTITIONED_METADATA: which broker a client must use for a topic.

Role: the binary protocol's spelling of the broker's one lookup answer (``NamespaceService.lookup``,
the same answer HTTP's ``/lookup/v2/topic/...`` gives: in a cluster it assigns an unowned bundle
to the least-loaded live broker, and takes the bundle when it is assigned here). As Pulsar's
broker answers ``CommandLookupTopic``:

- this broker serves the topic: Connect, with this broker's own listeners;
- another broker owns it: Connect, with the owner's listeners (the client connects there);
- the client names an advertised listener (``advertised_listener_name``, ``listeners.py``):
  the URLs of that listener of the broker answered; Failed with ServiceNotReady and Pulsar's
  words ("the broker do not have NAME listener") when that broker has no such listener;
- nobody owns it and another broker was just chosen to take it: Redirect to that broker's
  ``brokerServiceUrl``, authoritative (the assignment is the cluster's, not a guess); the client
  sends its LOOKUP there, which takes the bundle and answers Connect;
- nobody can serve it from here now (this broker is cut off from ZooKeeper, the bundle is
  between owners, the owner runs no binary listener of the kind the client uses): Failed with
  ServiceNotReady and a message saying why; the client retries its lookup.

``proxy_through_service_url`` is always false: clients connect to the owner itself.
PARTITIONED_METADATA is answered by any broker from the shared metadata (as Pulsar's), the
partitions being looked up one by one afterwards.

``lookup_answer`` is the pure part. ``LookupRunner`` (one per server) works the answers out: on
a cluster broker the answer needs ZooKeeper, so it runs on a small pool of lookup threads, never
on the event loop, and is written back on the loop; a standalone broker answers at once.
``Lookups`` is one connection's share.

Invariants: at most ``lookups_pending_max`` lookups in flight per server (more are answered
TooManyRequests, as Pulsar's ``maxConcurrentLookupRequest``); every request is answered exactly
once while its connection is open; a lookup needs the right to produce or to consume there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from api.errors import TooManyRequests
from api.pulsar import commands
from api.pulsar.context import ConnectionContext
from api.pulsar.listeners import named_listener
from api.pulsar.permissions import require_for
from api.pulsar.proto import pulsar_api_pb2 as pb
from broker import BrokerAddress, LookupResult, MagnetarError, ServiceUnitNotReady, TopicName

log = logging.getLogger(__name__)
T = pb.BaseCommand.Type


@dataclass(frozen=True)
class Listener:
    """How lookups name a broker: the URLs of its plain and TLS listeners."""

    service_url: str | None
    service_url_tls: str | None


@dataclass(frozen=True)
class LookupAnswer:
    """A successful LOOKUP answer: Connect here, or Redirect to the owner."""

    service_url: str
    service_url_tls: str
    redirect: bool
    authoritative: bool = True


def lookup_answer(found: LookupResult, own: Listener, *, tls: bool, listener: str = "") -> LookupAnswer:
    """What LOOKUP answers a client connected with (``tls``) or without TLS that names the
    advertised ``listener`` (''), given the broker's lookup result and this broker's own
    listener for that client; ``ServiceUnitNotReady`` when no broker can serve that client the
    topic now (Pulsar's "the broker do not have NAME listener" when the owner has no such
    listener)."""
    if found.local:
        plain, secure = own.service_url or "", own.service_url_tls or ""
        broker = "this broker"
    else:
        plain, secure = _owner_urls(found.owner, listener)
        broker = f"broker {found.owner.broker_id}"
    if not (secure if tls else plain):
        kind = "pulsar+ssl://" if tls else "pulsar://"
        raise ServiceUnitNotReady(f"{found.topic} is served by {broker}, which has no {kind} listener "
                                  f"(started without a binary protocol port of that kind)")
    return LookupAnswer(plain or secure, secure, redirect=found.assigned and not found.local)


def _owner_urls(owner: BrokerAddress, listener: str) -> tuple[str, str]:
    """(plain, TLS) URLs of another broker, under its advertised ``listener`` when one is named."""
    if not listener:
        return owner.pulsar_service_url, owner.pulsar_service_url_tls
    named = named_listener(owner, listener)
    return named.service_url, named.service_url_tls


class LookupRunner:
    """Works lookup answers out for every connection of one server (on the event loop's thread,
    except the work itself in a cluster)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, threads: int, pending_max: int, inline: bool) -> None:
        self._loop = loop
        self._pending_max = pending_max
        self._pool = None if inline else ThreadPoolExecutor(max_workers=threads, thread_name_prefix="magnetar-lookup")
        self.in_flight = 0
        self.refused = 0

    def run(self, work: Callable[[], bytes], reply: Callable[[bytes], None], refusal: Callable[[], bytes]) -> None:
        """``reply(work())`` on the loop; ``reply(refusal())`` at once when too many are in flight.
        ``work`` turns every failure into its own answer (it never raises)."""
        if self._pool is None:
            reply(work())
            return
        if self.in_flight >= self._pending_max:
            self.refused += 1
            reply(refusal())
            return
        self.in_flight += 1
        try:
            future = self._pool.submit(work)
        except RuntimeError:  # the pool is shut down: the server is closing
            self.in_flight -= 1
            return
        future.add_done_callback(lambda done: self._finished(done, reply))

    def _finished(self, done: Future[bytes], reply: Callable[[bytes], None]) -> None:
        def on_loop() -> None:
            self.in_flight -= 1
            if not done.cancelled() and done.exception() is None:
                reply(done.result())

        with contextlib.suppress(RuntimeError):  # the loop is closed: so is the connection
            self._loop.call_soon_threadsafe(on_loop)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class Lookups:
    """One connection's LOOKUP and PARTITIONED_METADATA requests."""

    def __init__(self, context: ConnectionContext, runner: LookupRunner,
                 answer: Callable[[TopicName, str], LookupAnswer]) -> None:
        self._context = context
        self._runner = runner
        self._answer = answer
        """The server's answer for ``topic`` to this connection naming an advertised listener
        ('': none; ``PulsarServer.lookup_answer``)."""

    def _allowed(self, kind: int, topic: TopicName) -> None:
        """A lookup needs the right to produce or to consume there (``permissions.COMMANDS``),
        checked here, on the thread the lookup works on."""
        require_for(self._context, kind, topic.full_name)

    def lookup(self, request: pb.CommandLookupTopic) -> None:
        request_id = request.request_id

        def work() -> bytes:
            try:
                topic = TopicName.parse(request.topic)
                self._allowed(T.LOOKUP, topic)
                found = self._answer(topic, request.advertised_listener_name)
            except Exception as exc:
                return commands.lookup_failed(request_id, _logged(exc, "a lookup"))
            return commands.lookup(request_id, found.service_url, found.service_url_tls, redirect=found.redirect,
                                   authoritative=found.authoritative)

        self._runner.run(work, self._reply, lambda: commands.lookup_failed(request_id, _too_many()))

    def partitioned_metadata(self, request: pb.CommandPartitionedTopicMetadata) -> None:
        request_id = request.request_id
        service = self._context.service

        def work() -> bytes:
            try:
                topic = TopicName.parse(request.topic)
                self._allowed(T.PARTITIONED_METADATA, topic)
                service.namespaces.policies(topic.namespace_name)  # NotFound for an unknown namespace
                partitions = service.topics.partitions(topic) if topic.partition_index < 0 else 0
            except Exception as exc:
                return commands.partitioned_metadata_failed(request_id, _logged(exc, "a partitioned-metadata lookup"))
            return commands.partitioned_metadata(request_id, partitions)

        self._runner.run(work, self._reply, lambda: commands.partitioned_metadata_failed(request_id, _too_many()))

    def _reply(self, frame: bytes) -> None:
        self._context.out.write([frame])


def _too_many() -> TooManyRequests:
    return TooManyRequests("too many lookups in flight on this broker; retry")


def _logged(exc: Exception, what: str) -> Exception:
    """``exc`` to answer with; an unexpected one (not the broker's) is logged, once, here."""
    if not isinstance(exc, MagnetarError):
        log.exception("%s failed unexpectedly", what, exc_info=exc)
    return exc
