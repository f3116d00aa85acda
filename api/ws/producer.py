"""The WebSocket producer session: frames in, durable publishes out, results back in order.

Role: one connection bound to one broker ``Producer`` (``BrokerService.producer``). Each frame
is read into a message by the broker's rules (``message_of``: payload in base64, event time in
epoch ms or ISO-8601, ``deliverAt``/``deliverAfterMs``, ``sequenceId``, ``expectedOffset``); a
field the frame shape does not know is a ``send-error`` naming it. Without batching every frame
is its own entry; with ``batchingEnabled=true`` the frames that arrived together (up to
``batchingMaxMessages``) become one entry when they can: the group is routed once (the producer
advances round-robin once per group, as Pulsar's batching producers do), a keyless frame joins
any group and a keyed one only a group bound for its key's partition, and frames with their
own sequence id, delivery time or expected offset go alone.

Invariants: at most ``maxPendingMessages`` publishes are unanswered (the session stops reading
frames until results are written); results are written in frame order, once each publish is
durable, by the event-loop callback that learns it finished (one socket write per burst); a bad
frame never closes the session and never writes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect

from api.wakeup import LoopSignal
from api.ws.frames import (
    UNKNOWN_ERROR,
    FrameError,
    frame_error,
    frame_text,
    parse_frame,
    receive_text,
    send_error,
)
from api.ws.params import ProducerParams
from api.ws.protocol import FrameWriter
from api.ws.session import supervise
from broker import (
    MESSAGE_FIELDS,
    BrokerService,
    InvalidRequest,
    MagnetarError,
    MessageId,
    ProducedMessage,
    Producer,
    PublishResult,
    TopicName,
    message_of,
)

log = logging.getLogger(__name__)

FRAME_FIELDS = MESSAGE_FIELDS | {"context", "expectedOffset"}
"""What a producer frame may hold: Pulsar's message fields, its ``context``, and Magnetar's
conditional append."""


@dataclass
class _Send:
    context: Any
    produced: ProducedMessage
    sequence_id: int | None


@dataclass
class _Rejected:
    context: Any
    error: FrameError


Outcome = Future[PublishResult] | MagnetarError | FrameError
"""A publish's outcome: its future, the broker's refusal, or a frame that was never published."""


class ProducerSession:
    def __init__(self, websocket: WebSocket, service: BrokerService, topic: TopicName,
                 params: ProducerParams) -> None:
        self.ws = websocket
        self.service = service
        self.params = params
        self.producer: Producer = service.producer(topic, params.producer_name, routing_mode=params.routing_mode,
                                                   compression=params.compression,
                                                   initial_sequence_id=params.initial_sequence_id)
        self._inbox: asyncio.Queue[_Send | _Rejected | None] = asyncio.Queue(params.pending_messages_max)
        self._pending: deque[tuple[list[Any], Outcome]] = deque()
        self._room = asyncio.Event()
        self._room.set()
        self._answered = asyncio.Event()
        self._writer = FrameWriter(websocket, params.pending_messages_max)
        self._finished = LoopSignal(asyncio.get_running_loop(), self._send_results)

    async def run(self) -> None:
        """Without batching, frames are published as they are read; with it, a publish loop
        takes them from an inbox so that frames which arrived together make one entry."""
        workers = [asyncio.create_task(self._publish_loop())] if self.params.batching else []
        if await supervise(self.ws, self._receive_loop(), workers):
            # the client left: answer what it sent before it did
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                if self.params.batching:
                    await self._inbox.put(None)
                    await asyncio.gather(*workers)
                while self._pending:
                    self._answered.clear()
                    await self._answered.wait()
                await self._writer.flush()

    async def _receive_loop(self) -> None:
        while (text := await receive_text(self.ws)) is not None:
            item = self._read_frame(text)
            if self.params.batching:
                await self._inbox.put(item)
            else:
                await self._wait_for_room()
                self._track(*self._outcome_of(item))

    def _read_frame(self, text: str) -> _Send | _Rejected:
        try:
            frame = parse_frame(text)
        except FrameError as exc:
            return _Rejected(None, exc)
        context = frame.get("context")
        try:
            produced = message_of(frame, encoding="base64", now_ms=int(self.service.clock() * 1000),
                                  known=FRAME_FIELDS, where="the frame")
        except InvalidRequest as exc:
            return _Rejected(context, frame_error(exc))
        sequence_id = produced.message.sequence_id
        return _Send(context, produced, sequence_id if sequence_id is not None else self.producer.next_sequence_id())

    def _outcome_of(self, item: _Send | _Rejected) -> tuple[list[Any], Outcome]:
        """One frame's publish, or its refusal."""
        if isinstance(item, _Rejected):
            return [item.context], item.error
        return [item.context], self._publish([item])

    async def _publish_loop(self) -> None:
        """Take frames in order; with batching, frames already waiting join one entry when the
        entry's route allows them (see the module docstring)."""
        carried: list[_Send | _Rejected | None] = []
        while True:
            first = carried.pop() if carried else await self._inbox.get()
            if first is None:
                break
            await self._wait_for_room()
            if isinstance(first, _Rejected) or not self._batchable(first):
                self._track(*self._outcome_of(first))
                continue
            target = self.producer.route(first.produced.message.key)
            group = [first]
            while len(group) < self.params.batch_messages_max and not self._inbox.empty():
                candidate = self._inbox.get_nowait()
                if isinstance(candidate, _Send) and self._batchable(candidate) and self._routes_to(candidate, target):
                    group.append(candidate)
                else:
                    carried.append(candidate)
                    break
            self._track([s.context for s in group], self._publish(group, target))

    def _routes_to(self, send: _Send, target: TopicName) -> bool:
        key = send.produced.message.key
        return key is None or self.producer.partition_of_key(key) == target

    @staticmethod
    def _batchable(send: _Send) -> bool:
        produced = send.produced
        return send.sequence_id is None and produced.deliver_at_ms is None and produced.expected_offset is None

    def _publish(self, group: list[_Send], target: TopicName | None = None) -> Future[PublishResult] | MagnetarError:
        first = group[0]
        try:
            future = self.producer.send([s.produced.message for s in group], partition=target,
                                        sequence_id=first.sequence_id,
                                        expected_offset=first.produced.expected_offset,
                                        deliver_at_ms=first.produced.deliver_at_ms)
        except MagnetarError as exc:
            return exc
        future.add_done_callback(self._finished.notify)
        return future

    async def _wait_for_room(self) -> None:
        """At most ``maxPendingMessages`` publishes unanswered, and as many results unwritten."""
        while len(self._pending) >= self.params.pending_messages_max:
            self._room.clear()
            await self._room.wait()
        await self._writer.room()

    def _track(self, contexts: list[Any], outcome: Outcome) -> None:
        self._pending.append((contexts, outcome))
        if len(self._pending) == 1 and (not isinstance(outcome, Future) or outcome.done()):
            self._send_results()

    def _send_results(self) -> None:
        """Answer every finished publish at the head of the queue, in order, in one write."""
        frames: list[str] = []
        while self._pending:
            contexts, outcome = self._pending[0]
            if isinstance(outcome, Future) and not outcome.done():
                break
            self._pending.popleft()
            try:
                frames += _outcome_frames(contexts, outcome)
            except Exception as exc:  # not the broker's refusal: a fault, reported as one
                log.exception("publish failed")
                frames += [send_error(c, UNKNOWN_ERROR, "internal_error", str(exc)) for c in contexts]
        self._writer.send(frames)
        if len(self._pending) < self.params.pending_messages_max:
            self._room.set()
        if not self._pending:
            self._answered.set()


def _outcome_frames(contexts: list[Any], outcome: Outcome) -> list[str]:
    """The result frames of a finished publish (or of a refused one)."""
    if isinstance(outcome, FrameError):
        return [send_error(c, outcome.result_code, InvalidRequest.code, str(outcome)) for c in contexts]
    if isinstance(outcome, MagnetarError):
        return [send_error(c, UNKNOWN_ERROR, outcome.code, str(outcome)) for c in contexts]
    error = outcome.exception()
    if error is not None:
        if isinstance(error, MagnetarError):
            return [send_error(c, UNKNOWN_ERROR, error.code, str(error)) for c in contexts]
        raise error
    result = outcome.result()
    if result.duplicate:  # Pulsar acknowledges a deduplicated send with id -1:-1
        dup = MessageId(-1, -1).to_base64()
        return [frame_text({"result": "ok", "messageId": dup, "context": c, "duplicate": True}) for c in contexts]
    return [f'{{"result":"ok","messageId":"{mid.to_base64()}","context":{json.dumps(c)},"offset":{offset}}}'
            for c, mid, offset in zip(contexts, result.message_ids, result.offsets, strict=True)]
