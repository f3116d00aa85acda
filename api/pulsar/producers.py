"""The producer half of a binary-protocol connection: PRODUCER, SEND, CLOSE_PRODUCER.

Role: each client producer (one per topic partition; the client routes) is one broker
``Producer``. A SEND's payload is the client's own entry: checked in full
(``entry_of_client``) and stored byte for byte, deduplicated by producer name and sequence
id; its receipt carries the entry's ledger and entry id. The SENDs of one socket read reach
``send_group`` together and each producer's share goes to the broker as one group
(``Producer.append``: one managed-ledger append, one journal write and one future for all of
them), each SEND still its own entry with its own message id.
Pulsar's access modes (Shared, Exclusive, WaitForExclusive, ExclusiveWithFencing) and unique
producer names are the broker's (``broker/producer_access.py``, with each topic's durable
epoch): PRODUCER translates its ``producer_access_mode`` and ``topic_epoch`` there.

Invariants:
- Receipts (and send errors) of one producer leave in the order of its sends; Pulsar's clients
  match them to their pending queue by sequence id and drop the connection on a mismatch.
- A connection has at most ``pending_sends_max`` sends unanswered; at the bound it stops being
  read until half of them are answered (one read's group may pass the bound by what it holds,
  at most ``SEND_GROUP_COMMANDS_MAX`` SENDs, see ``session.py``). It also stops being read while the
  broker's publish buffer (``maxMessagePublishBufferSizeInMB``) refuses, until it admits again;
  it is read again only once nothing holds it back.
- A producer whose topic's publish rate is exceeded stops the connection being read for as long
  as the broker says (``Producer.publish_delay_s``), as Pulsar throttles: its sends are never
  refused for it. Each broker ``Producer`` is closed when its client producer goes (its slot
  of the topic's ``maxProducers`` given back).
- A producer whose topic moved to another broker (an unload) is closed with CLOSE_PRODUCER
  after the receipts of its stored sends; its sends after that are dropped unanswered, as
  Pulsar's broker drops sends for a producer it closed: the client resends them to the new
  owner through a new lookup, and deduplication stores each once. A PRODUCER for a topic this
  broker does not serve is refused with ServiceNotReady before anything is registered.
- A producer whose role lost the right to produce there (a revocation, ``revoked``) is closed
  the same way; its sends after that are refused (SEND_ERROR, AuthorizationError), never stored.
- Opening, sending with and closing a producer cost the same however many producers its topic
  and its connection hold: the broker's ``ProducerAccess`` keeps each topic's producers by name, and the
  receipts visit only the producers with something to answer.
- A client entry the broker would not be able to read back is answered ``ChecksumError`` (the
  client drops that message) and never stored; a storage failure is a ``PersistenceError``
  (the client reconnects and resends, deduplication keeps that exactly-once).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from api.auth import Action
from api.limits import CLOSED_PRODUCERS_REMEMBERED_MAX
from api.pulsar import commands
from api.pulsar.context import ConnectionContext
from api.pulsar.framing import Frame, ProtocolViolation
from api.pulsar.hot_commands import SendCommand
from api.pulsar.proto import pulsar_api_pb2 as pb
from api.pulsar.schemas import ProtocolSchemas
from api.wakeup import LoopSignal
from broker import (
    AccessHolder,
    AccessMode,
    AlreadyExists,
    CorruptEntry,
    Forbidden,
    InvalidRequest,
    MagnetarError,
    PreparedEntry,
    Producer,
    ProducerAccess,
    ProducerBusy,
    ProducerFenced,
    PublishResult,
    TopicName,
    entry_of_client,
)

log = logging.getLogger(__name__)

Mode = pb.ProducerAccessMode
_Why = TypeVar("_Why")
PENDING, THROTTLED, FULL = "pending sends", "publish rate", "publish buffer"
"""Why a connection's producers stop it being read (``ProducerHalf._hold``)."""
"""Producer ids of one connection closed by an unload (whose late sends are dropped quietly) or
by a revocation (whose late sends are refused), each."""


_Outcome = Future[list[PublishResult | MagnetarError]] | BaseException
"""A send's answer to be: its group's Future (its result at the send's index) or its refusal."""


def _checked_send(state: _ClientProducer, sequence_id: int, num_messages: int, highest_sequence_id: int,
                  payload: memoryview) -> tuple[int, int, PreparedEntry | MagnetarError]:
    """(sequence id, highest sequence id, the entry to store or why it is refused) of one SEND."""
    highest = highest_sequence_id if highest_sequence_id >= sequence_id else sequence_id + max(num_messages, 1) - 1
    try:
        if not state.ready:
            raise ProducerFenced("the producer is waiting for exclusive access and may not send yet")
        entry = entry_of_client(bytes(payload), num_messages, sequence_id, highest_sequence_id,
                                encryption_required=state.encryption_required)
    except InvalidRequest as exc:  # the client drops the message on ChecksumError
        return sequence_id, highest, CorruptEntry(str(exc))
    except MagnetarError as exc:
        return sequence_id, highest, exc
    return sequence_id, highest, entry


def _client_outcome(outcome: PublishResult | MagnetarError) -> PublishResult | MagnetarError:
    """A stored send's answer: a refusal of the entry's bytes or ids is a ``ChecksumError`` (the
    client drops that message rather than resending it forever)."""
    return CorruptEntry(str(outcome)) if isinstance(outcome, InvalidRequest) else outcome


@dataclass
class _ClientProducer:
    producer_id: int
    topic: TopicName
    producer: Producer
    holder: AccessHolder
    schema_version: bytes | None
    encryption_required: bool = False
    """The namespace takes only encrypted messages: a send without encryption keys is refused."""
    pending: deque[tuple[int, int, _Outcome, int]] = field(default_factory=deque)
    """(sequence id, highest sequence id, outcome, index in its group) of each send, in send order."""
    ready: bool = True
    closed: bool = False
    close_request_id: int | None = None
    """A CLOSE_PRODUCER waiting for the receipts of the sends before it (then SUCCESS)."""
    unloaded: bool = False
    """Its topic moved to another broker: CLOSE_PRODUCER goes to the client once the sends
    before are answered; sends after it are dropped unanswered (the client resends them to the
    new owner, where deduplication keeps what was stored here once)."""
    silenced: bool = False
    """An unloaded producer's send failed: it and every later send stay unanswered (an error
    would make the client drop the connection, and a later receipt would skip one)."""
    revoked: Forbidden | None = None
    """Its role lost the right to produce here: CLOSE_PRODUCER goes to the client once the sends
    before are answered; sends after it are refused with this error, never stored."""


class ProducerHalf:
    """Every producer of one connection."""

    _names = itertools.count()

    def __init__(self, context: ConnectionContext, access: ProducerAccess, schemas: ProtocolSchemas) -> None:
        self._context = context
        self._access = access
        self._schemas = schemas
        self._producers: dict[int, _ClientProducer] = {}
        self._unloaded: OrderedDict[int, None] = OrderedDict()
        """Producer ids closed by an unload, until the client opens them again (bounded)."""
        self._revoked: OrderedDict[int, Forbidden] = OrderedDict()
        """Producer ids closed by a revocation, and why (bounded, as ``_unloaded``)."""
        self._answering: dict[int, _ClientProducer] = {}
        """The producers (by ``id()``) with sends to answer or a close to tell: the receipts
        visit only these, so a send costs the same however many producers are open."""
        self._pending_sends = 0
        self._holds: set[str] = set()
        """Why the connection is not read now (``_hold``): ``PENDING`` sends at their bound, a
        ``THROTTLED`` publish rate, the broker's publish buffer ``FULL``; read again once none holds."""
        self._answer = LoopSignal(context.loop, self._send_receipts)
        self._buffer_room = LoopSignal(context.loop, lambda: self._unhold(FULL))

    def __len__(self) -> int:
        return len(self._producers)

    @property
    def pending_sends(self) -> int:
        return self._pending_sends

    # --- PRODUCER ----------------------------------------------------------------------
    def open(self, command: pb.CommandProducer) -> None:
        context = self._context
        out = context.out
        self._unloaded.pop(command.producer_id, None)
        self._revoked.pop(command.producer_id, None)
        if command.producer_id in self._producers:
            out.write([commands.error(command.request_id, ProducerBusy(
                f"producer id {command.producer_id} is already in use on this connection"))])
            return
        producer: Producer | None = None
        try:
            topic = TopicName.parse(command.topic)  # the right to produce there: see permissions.py
            # ServiceNotReady elsewhere: the client looks it up again
            context.service.namespaces.check_served_here(topic)
            name = command.producer_name or f"standalone-{context.connection_id}-{next(self._names)}"
            schema_version = self._schemas.for_producer(topic, command.schema if command.HasField("schema") else None)
            producer = context.service.topics.producer(topic, name, encrypted=command.encrypted)
            if command.initial_subscription_name:
                self._initial_subscription(topic, command.initial_subscription_name)
            last_sequence_id = producer.last_sequence_id()
            holder = AccessHolder(name, AccessMode(command.producer_access_mode),
                                  lambda: self._fenced(command.producer_id),
                                  lambda epoch: self._now_ready(command.producer_id, command.request_id, epoch))
            state = _ClientProducer(command.producer_id, topic, producer, holder, schema_version,
                                    context.service.topics.encryption_required(topic))
            ready, epoch = self._access.acquire(topic.full_name, holder,
                                               command.topic_epoch if command.HasField("topic_epoch") else None)
        except MagnetarError as exc:
            if producer is not None:
                producer.close()
            out.write([commands.error(command.request_id, exc)])
            return
        state.ready = ready
        self._producers[command.producer_id] = state
        exclusive = command.producer_access_mode != Mode.Shared
        out.write([commands.producer_success(command.request_id, name, last_sequence_id, schema_version,
                                             epoch if exclusive else None, ready=ready)])
        context.count("producers_opened")

    def _initial_subscription(self, topic: TopicName, subscription: str) -> None:
        """A producer may ask for a subscription to exist from the topic's start (the client's
        dead-letter producer does, so moved messages are kept for their reader); as in Pulsar,
        this needs the right to consume too, and an existing subscription is left as it is."""
        self._context.authorize(Action.CONSUME, topic)
        with contextlib.suppress(AlreadyExists):
            self._context.service.admin.create_subscription(topic, subscription, "earliest")

    def _now_ready(self, producer_id: int, request_id: int, epoch: int) -> None:
        state = self._producers.get(producer_id)
        if state is None or state.closed:
            return
        state.ready = True
        self._context.out.write([commands.producer_success(
            request_id, state.holder.name, state.producer.last_sequence_id(), state.schema_version, epoch)])

    def _fenced(self, producer_id: int) -> None:
        """Another producer took the topic with ExclusiveWithFencing: this one is closed."""
        state = self._producers.pop(producer_id, None)
        if state is not None:
            state.closed = True
            state.producer.close()
            self._answering.pop(id(state), None)  # its sends in flight go unanswered
            self._pending_sends -= len(state.pending)
            state.pending.clear()
            self._context.out.write([commands.close_producer(producer_id, 0)])

    # --- SEND --------------------------------------------------------------------------
    def send_group(self, frames: Sequence[Frame]) -> None:
        """SENDs read together (one socket read's, in order): each producer's checked entries go
        to the broker as one group (``Producer.append``), each still its own entry with its
        own receipt, in send order. A SEND for a producer not open here, or without a payload,
        is a protocol violation: the SENDs before it are taken, then it raises."""
        groups: dict[int, list[tuple[int, int, PreparedEntry | MagnetarError]]] = {}
        violation: ProtocolViolation | None = None
        for frame in frames:
            hot = frame.hot
            command = hot if isinstance(hot, SendCommand) else frame.command.send
            state = self._producers.get(command.producer_id)
            if (state is not None and state.unloaded) or (state is None and command.producer_id in self._unloaded):
                self._context.count("sends_dropped")
                continue  # sent before the client heard of the unload: it resends them to the new owner
            refusal = state.revoked if state is not None else self._revoked.get(command.producer_id)
            if refusal is not None:
                self._refuse_send(state, command.producer_id, command.sequence_id, refusal)
                continue
            if state is None or state.closed or frame.payload is None:
                violation = ProtocolViolation(
                    "SEND without a payload" if state is not None and not state.closed else
                    f"SEND for producer {command.producer_id}, which is not open here")
                break
            groups.setdefault(command.producer_id, []).append(
                _checked_send(state, command.sequence_id, command.num_messages, command.highest_sequence_id,
                              frame.payload))
        for producer_id, sends in groups.items():
            self._store(self._producers[producer_id], sends)
        self._throttle([self._producers[producer_id].producer for producer_id in groups])
        if violation is not None:
            raise violation
        if self._pending_sends >= self._context.settings.pending_sends_max:
            self._hold(PENDING)
        buffer = self._context.service.publish_buffer
        if FULL not in self._holds and not buffer.admits():
            self._hold(FULL)
            if not buffer.wait(self._buffer_room.notify):
                self._unhold(FULL)

    def _hold(self, reason: str) -> None:
        """Stop reading the connection for ``reason`` (the first hold pauses it; ``_unhold`` ends it)."""
        if not self._holds:
            self._context.out.pause_reading()
        self._holds.add(reason)

    def _unhold(self, reason: str) -> None:
        """``reason`` no longer holds the connection back (the last release resumes reading)."""
        if reason in self._holds:
            self._holds.discard(reason)
            if not self._holds:
                self._context.out.resume_reading()

    def _throttle(self, producers: list[Producer]) -> None:
        """Stop reading while a producer's topic is over its publish rate (resumed by a timer)."""
        if THROTTLED in self._holds:
            return
        delay_s = max((p.publish_delay_s() for p in producers), default=0.0)
        if delay_s > 0:
            self._hold(THROTTLED)
            self._context.loop.call_later(delay_s, self._throttle_over, producers)

    def _throttle_over(self, producers: list[Producer]) -> None:
        delay_s = max((p.publish_delay_s() for p in producers), default=0.0)
        if delay_s > 0:  # still over (another connection published meanwhile): wait again
            self._context.loop.call_later(delay_s, self._throttle_over, producers)
        else:
            self._unhold(THROTTLED)

    def _store(self, state: _ClientProducer, sends: list[tuple[int, int, PreparedEntry | MagnetarError]]) -> None:
        """One producer's sends of a group: the checked ones stored together, every one queued
        for its answer in send order."""
        entries = [entry for _, _, entry in sends if isinstance(entry, PreparedEntry)]
        group: Future[list[PublishResult | MagnetarError]] | MagnetarError | None = None
        if entries:
            try:
                group = state.producer.append(entries)
            except MagnetarError as exc:
                group = exc
        pending = state.pending
        index = 0
        for sequence_id, highest, entry in sends:
            if isinstance(entry, PreparedEntry):
                assert group is not None
                pending.append((sequence_id, highest, group, index))
                index += 1
            else:
                pending.append((sequence_id, highest, entry, 0))
        self._pending_sends += len(sends)
        self._answering[id(state)] = state
        self._context.count("sends", len(sends))
        if isinstance(group, Future):
            group.add_done_callback(self._answer.notify)
        if not isinstance(group, Future) or len(entries) < len(sends):
            self._answer.notify()

    def _refuse_send(self, state: _ClientProducer | None, producer_id: int, sequence_id: int,
                     refusal: Forbidden) -> None:
        """A send of a revoked producer: refused, after the answers its earlier sends wait for."""
        self._context.count("send_errors")
        if state is None or not state.pending:
            self._context.out.write([commands.send_error(producer_id, sequence_id, refusal)])
            return
        state.pending.append((sequence_id, sequence_id, refusal, 0))
        self._pending_sends += 1

    def _send_receipts(self) -> None:
        """Answer, per producer and in order, every send at the head of its queue that finished."""
        buffers: list[bytes | memoryview] = []
        for state in list(self._answering.values()):
            pending = state.pending
            while pending:
                sequence_id, highest, outcome, index = pending[0]
                if isinstance(outcome, Future):
                    if not outcome.done():
                        break
                    error = outcome.exception()
                    answer = error if error is not None else _client_outcome(outcome.result()[index])
                else:
                    answer = outcome
                pending.popleft()
                self._pending_sends -= 1
                if state.unloaded and not isinstance(answer, PublishResult):
                    state.silenced = True
                if not state.silenced:
                    buffers.append(self._receipt(state, sequence_id, highest, answer))
            if pending:
                continue
            del self._answering[id(state)]
            if state.closed:
                if self._producers.get(state.producer_id) is state:
                    del self._producers[state.producer_id]
                buffers.extend(self._closed(state))
        if buffers:
            self._context.out.write(buffers)
        if self._pending_sends <= self._context.settings.pending_sends_max // 2:
            self._unhold(PENDING)

    def _closed(self, state: _ClientProducer) -> list[bytes]:
        """What tells the client a producer closed once its sends are answered: SUCCESS for its
        own CLOSE_PRODUCER, else CLOSE_PRODUCER when the broker closed it (unload, revocation)."""
        if state.close_request_id is not None:
            request_id, state.close_request_id = state.close_request_id, None
            return [commands.success(request_id)]
        if state.unloaded:
            _remember(self._unloaded, state.producer_id, None)
        elif state.revoked is not None:
            _remember(self._revoked, state.producer_id, state.revoked)
        else:
            return []
        return [commands.close_producer(state.producer_id, 0)]

    def _receipt(self, state: _ClientProducer, sequence_id: int, highest: int,
                 outcome: PublishResult | BaseException) -> bytes:
        if isinstance(outcome, PublishResult):
            return commands.send_receipt(state.producer_id, sequence_id, highest, outcome.position.ledger_id,
                                         outcome.position.entry_id, state.topic.partition_index)
        if not isinstance(outcome, MagnetarError):
            log.error("a send failed", exc_info=outcome)
        self._context.count("send_errors")
        return commands.send_error(state.producer_id, sequence_id, outcome)

    # --- CLOSE_PRODUCER, connection end --------------------------------------------------
    def close(self, command: pb.CommandCloseProducer) -> None:
        """As Pulsar's broker: the producer's sends still being stored are answered first, then
        the close (a receipt after the close would name a producer the client forgot)."""
        state = self._producers.get(command.producer_id)
        if state is not None:
            self._release(state)
            if state.pending:
                state.close_request_id = command.request_id
                return
            del self._producers[command.producer_id]
            self._answering.pop(id(state), None)  # closed by the client: nothing more to tell it
        self._context.out.write([commands.success(command.request_id)])

    def _release(self, state: _ClientProducer) -> None:
        if not state.closed:
            state.closed = True
            state.producer.close()
            self._access.release(state.topic.full_name, state.holder)

    def unloaded(self, names: set[TopicName]) -> None:
        """The topics stopped being served here: their producers are closed and the client told
        with CLOSE_PRODUCER once the sends already taken are answered (as Pulsar's broker waits
        for the pending acknowledgements); it looks the topic up again and resends the rest."""
        for state in self._producers_of(names):
            state.unloaded = True

    def revoked(self, names: set[TopicName], refusal: Forbidden) -> None:
        """The role may no longer produce to these topics: their producers are closed as on an
        unload (CLOSE_PRODUCER once the sends already taken are answered), and every later send
        of theirs is refused with ``refusal`` (SEND_ERROR, AuthorizationError), never stored."""
        for state in self._producers_of(names):
            state.revoked = refusal
            self._context.count("producers_revoked")

    def _producers_of(self, names: set[TopicName]) -> list[_ClientProducer]:
        """The open producers of ``names``, released and queued to be closed."""
        closing = [state for state in self._producers.values() if state.topic in names and not state.closed]
        for state in closing:
            self._release(state)
            self._answering[id(state)] = state
        if closing:
            self._answer.notify()
        return closing

    def topics(self) -> set[TopicName]:
        """The topics of the producers open here."""
        return {state.topic for state in self._producers.values() if not state.closed}

    def close_all(self) -> None:
        for state in self._producers.values():
            self._release(state)
        self._producers.clear()
        self._answering.clear()


def _remember(closed: OrderedDict[int, _Why], producer_id: int, why: _Why) -> None:
    """Keep ``producer_id`` among the producers closed by the broker (the oldest forgotten past
    ``CLOSED_PRODUCERS_REMEMBERED_MAX``)."""
    closed[producer_id] = why
    if len(closed) > CLOSED_PRODUCERS_REMEMBERED_MAX:
        closed.popitem(last=False)
