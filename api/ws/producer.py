"""The WebSocket producer session: frames in, durable publishes out, results back in order.

Role: one connection bound to one broker ``Producer`` (``TopicRegistry.producer``). Each frame
is read into a message by the broker's rules (``message_of``: payload in base64, event time in
epoch ms or ISO-8601, ``deliverAt``/``deliverAfterMs``, ``sequenceId``, ``expectedOffset``,
``expectedKeyVersion``); a field the frame shape does not know is a ``send-error`` naming it. A
result carries the message's ``keyVersion`` when it has a key; a refused ``expectedKeyVersion``
is a ``send-error`` carrying the key's ``currentKeyVersion``. The frames of one socket read are
handled at once (``on_frames``). Without batching every frame is its own entry, and the plain
ones of a read go to the broker in one call (``Producer.append`` of ``entries_of_messages``); with
``batchingEnabled=true`` the frames of a read (up to ``batchingMaxMessages``) are batched per
partition, as Pulsar's batching producers keep a batch per partition: a keyed frame joins its
key's partition's batch, the keyless frames of the read one partition's batch chosen once
(round-robin advances once per read), each batch is one entry; frames with their own sequence
id, delivery time, expected offset or expected key version go alone.

Over the topic's publish rate (``Producer.publish_delay_s``) the session takes no frame for as
long as the broker says, as Pulsar's broker stops reading a throttled producer's connection; the
broker producer (one of the topic's ``maxProducers``) is closed when the session ends.

Invariants: at most ``maxPendingMessages`` frames are unanswered, and none is published while
the broker's publish buffer (``maxMessagePublishBufferSizeInMB``) refuses or while the writer
holds its bound of results for a slow peer: the session leaves the frames it cannot take with
the connection (which stops reading) until it can; results are written in frame order, once
each frame's entry is durable, by the event-loop callback that learns it finished (one socket
write per burst); a bad frame never closes the session and never writes anything.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from api.wakeup import LoopSignal
from api.ws.frames import (
    UNKNOWN_ERROR,
    FrameError,
    frame_error,
    frame_text,
    json_text,
    parse_frame,
    send_error,
)
from api.ws.params import ProducerParams
from api.ws.session import SessionIO
from broker import (
    MESSAGE_FIELDS,
    BrokerService,
    InvalidRequest,
    KeyVersionMismatch,
    MagnetarError,
    MessageId,
    ProducedMessage,
    Producer,
    PublishResult,
    TopicName,
    entries_of_messages,
    entry_of_messages,
    entry_result,
    message_of,
)

log = logging.getLogger(__name__)

_DUPLICATE_ID = MessageId(-1, -1).to_base64()
FRAME_FIELDS = MESSAGE_FIELDS | {"context", "expectedOffset", "expectedKeyVersion"}
"""What a producer frame may hold: Pulsar's message fields, its ``context``, and Magnetar's
conditional appends."""


@dataclass(slots=True)
class _Send:
    context: Any
    produced: ProducedMessage
    sequence_id: int | None


@dataclass(slots=True)
class _Rejected:
    context: Any
    error: FrameError


Outcome = Future[PublishResult] | Future[list[PublishResult | MagnetarError]] | MagnetarError | FrameError
"""A publish's outcome: its future (one entry, or one per frame from one ``Producer.append``, with each
frame's result or refusal), the broker's refusal, or a frame that was never published."""


class ProducerSession:
    def __init__(self, io: SessionIO, service: BrokerService, topic: TopicName, params: ProducerParams) -> None:
        self.io = io
        self.service = service
        self.params = params
        self._writer = io.writer
        self._writer.frames_max = params.pending_messages_max
        self.producer: Producer = service.topics.producer(topic, params.producer_name, routing_mode=params.routing_mode,
                                                          compression=params.compression,
                                                          initial_sequence_id=params.initial_sequence_id)
        self._pending: deque[tuple[Any, Outcome, int]] = deque()
        """Frames waiting for their answer, in frame order: context, the outcome of the entry that
        holds the frame, and the frame's index in that entry."""
        self._left = False
        """Frames were left with the connection: it is told (``ready``) once the session has room."""
        self._throttled = False
        self._ended = False
        loop = io.loop
        self._finished = LoopSignal(loop, self._send_results)
        self._buffer_admits = LoopSignal(loop, self._room_again)
        clock = service.clock
        self._clock_ms: Callable[[], int] = lambda: int(clock() * 1000)

    def start(self) -> None:
        """Nothing to begin: the session answers frames."""

    def end(self) -> None:
        self._ended = True
        self.producer.close()

    def on_frames(self, texts: list[str]) -> int:
        """Publish what there is room for (the frames of a read at once); leave the rest."""
        room = self._room()
        taken = texts if len(texts) <= room else texts[:max(room, 0)]
        if len(taken) < len(texts):
            self._left = True
        if not taken:
            return 0
        items = [self._read_frame(t) for t in taken]
        if self.params.batching:
            self._publish_batched(items)
        else:
            self._publish_each(items)
        delay_s = self.producer.publish_delay_s()
        if delay_s > 0:  # over the topic's publish rate: take no frame for a while, as Pulsar throttles
            self._throttled = True
            self.io.loop.call_later(delay_s, self._throttle_over)
        return len(taken)

    def _room(self) -> int:
        """Frames the session may take now: none while throttled, while the broker's publish
        buffer refuses or while the writer holds its bound; else up to ``maxPendingMessages``
        unanswered."""
        if self._throttled:
            return 0
        buffer = self.service.publish_buffer
        if not buffer.admits() and buffer.wait(self._buffer_admits.notify):
            return 0  # woken once it admits again (unless it did meanwhile: then go on)
        if not self._writer.has_room:
            self._writer.when_room(self._room_again)
            return 0
        return self.params.pending_messages_max - len(self._pending)

    def _throttle_over(self) -> None:
        self._throttled = False
        self._room_again()

    def _room_again(self) -> None:
        if self._left and not self._ended:
            self._left = False
            self.io.ready()

    def _publish_batched(self, items: list[_Send | _Rejected]) -> None:
        """With batching: consecutive batchable frames make bursts of at most
        ``batchingMaxMessages``, each stored as one entry per partition."""
        self._in_runs(items, self._batchable, self._publish_burst, self.params.batch_messages_max)

    def _publish_each(self, items: list[_Send | _Rejected]) -> None:
        """Without batching: each frame its own entry, the plain ones (no delivery time, no
        expected offset) in one broker call."""
        self._in_runs(items, self._plain, self._track_each, len(items))

    def _in_runs(self, items: list[_Send | _Rejected], joins: Callable[[_Send], bool],
                 publish_run: Callable[[list[_Send]], None], run_max: int) -> None:
        """Consecutive frames that ``joins`` accepts go to ``publish_run`` together (at most
        ``run_max`` at a time); the others, and refusals, alone; all in frame order."""
        run: list[_Send] = []
        for item in items:
            if isinstance(item, _Send) and joins(item):
                run.append(item)
                if len(run) >= run_max:
                    publish_run(run)
                    run = []
                continue
            if run:
                publish_run(run)
                run = []
            self._track_alone(item)
        if run:
            publish_run(run)

    @staticmethod
    def _plain(send: _Send) -> bool:
        produced = send.produced
        return produced.deliver_at_ms is None and produced.expected_offset is None \
            and produced.expected_key_version is None

    def _track_each(self, sends: list[_Send]) -> None:
        try:
            future = self.producer.append(entries_of_messages([s.produced.message for s in sends],
                                                              [s.sequence_id for s in sends],
                                                              compression=self.producer.compression))
        except MagnetarError as exc:
            self._track(sends, exc)
            return
        future.add_done_callback(self._finished.notify)
        self._track(sends, future)

    def _read_frame(self, text: str) -> _Send | _Rejected:
        try:
            frame = parse_frame(text)
        except FrameError as exc:
            return _Rejected(None, exc)
        context = frame.get("context")
        try:
            produced = message_of(frame, encoding="base64", clock_ms=self._clock_ms, known=FRAME_FIELDS,
                                  where="the frame")
        except InvalidRequest as exc:
            return _Rejected(context, frame_error(exc))
        sequence_id = produced.message.sequence_id
        return _Send(context, produced, sequence_id if sequence_id is not None else self.producer.next_sequence_id())

    def _track_alone(self, item: _Send | _Rejected) -> None:
        """One frame's own entry, or its refusal."""
        if isinstance(item, _Rejected):
            self._track([item], item.error)
        else:
            self._track([item], self._publish([item]))

    def _publish_burst(self, burst: list[_Send]) -> None:
        """One entry per partition the burst's frames go to; answers stay in frame order."""
        producer = self.producer
        keyless_target: TopicName | None = None
        batches: dict[TopicName, list[int]] = {}
        for position, send in enumerate(burst):
            key = send.produced.message.key
            if key is not None:
                target = producer.partition_of_key(key)
            else:
                if keyless_target is None:
                    keyless_target = producer.route(None)
                target = keyless_target
            batches.setdefault(target, []).append(position)
        if len(batches) == 1:  # the usual burst: one entry
            target = next(iter(batches))
            outcome = self._publish(burst, target)
            self._pending.extend((send.context, outcome, index) for index, send in enumerate(burst))
        else:
            answers: list[tuple[Any, Outcome, int]] = [None] * len(burst)  # type: ignore[list-item]
            for target, positions in batches.items():
                outcome = self._publish([burst[p] for p in positions], target)
                for index, position in enumerate(positions):
                    answers[position] = (burst[position].context, outcome, index)
            self._pending.extend(answers)
        self._answer_if_done()

    @staticmethod
    def _batchable(send: _Send) -> bool:
        produced = send.produced
        return send.sequence_id is None and produced.deliver_at_ms is None and produced.expected_offset is None \
            and produced.expected_key_version is None

    def _publish(self, group: list[_Send], target: TopicName | None = None) -> Future[PublishResult] | MagnetarError:
        first = group[0]
        produced = first.produced
        expected_version = produced.expected_key_version  # such a frame goes alone, and has a key
        try:
            entry = entry_of_messages([s.produced.message for s in group], sequence_id=first.sequence_id,
                                      compression=self.producer.compression, deliver_at_time_ms=produced.deliver_at_ms)
            appended = self.producer.append([entry], partition=target, expected_offset=produced.expected_offset,
                                            expected_key_versions=None if expected_version is None else
                                            {produced.message.key or "": expected_version})
        except MagnetarError as exc:
            return exc
        future = entry_result(appended)
        future.add_done_callback(self._finished.notify)
        return future

    def _track(self, items: Sequence[_Send | _Rejected], outcome: Outcome) -> None:
        for index, item in enumerate(items):
            self._pending.append((item.context, outcome, index))
        self._answer_if_done()

    def _answer_if_done(self) -> None:
        if self._pending:
            _, outcome, _ = self._pending[0]
            if not isinstance(outcome, Future) or outcome.done():
                self._send_results()

    def _send_results(self) -> None:
        """Answer every frame at the head of the queue whose entry finished, in order, in one write
        (an entry's outcome is read once for all its frames)."""
        frames: list[str] = []
        pending = self._pending
        last: Outcome | None = None
        answer: _EntryAnswer | None = None
        while pending:
            context, outcome, index = pending[0]
            if outcome is not last:
                if isinstance(outcome, Future) and not outcome.done():
                    break
                last, answer = outcome, _EntryAnswer(outcome)
            pending.popleft()
            assert answer is not None
            frames.append(answer.frame(context, index))
        self._writer.send(frames)
        if len(pending) < self.params.pending_messages_max:
            self._room_again()


class _EntryAnswer:
    """The result frames of one finished (or refused) entry, one per message."""

    __slots__ = ("_current_version", "_duplicate", "_each", "_error", "_first_offset", "_ids", "_versions")

    def __init__(self, outcome: Outcome) -> None:
        self._each: list[PublishResult | MagnetarError] | None = None
        self._error: tuple[int, str, str] | None = None
        """(result code, error code, message) of a refused or failed entry."""
        self._ids: Sequence[str] = ()
        self._first_offset = 0
        self._duplicate = False
        self._versions: Sequence[int | None] = ()
        self._current_version: int | None = None
        """A refused ``expectedKeyVersion``: where the key's stream is."""
        if isinstance(outcome, FrameError):
            self._error = (outcome.result_code, InvalidRequest.code, str(outcome))
        elif isinstance(outcome, MagnetarError):
            self._refused(outcome)
        elif (error := outcome.exception()) is not None:
            if isinstance(error, MagnetarError):
                self._refused(error)
            else:  # not the broker's refusal: a fault, reported as one
                log.error("publish failed", exc_info=error)
                self._error = (UNKNOWN_ERROR, "internal_error", str(error))
        else:
            result = outcome.result()
            if isinstance(result, list):  # one entry per frame
                self._each = result
            else:
                self._ids, self._first_offset, self._duplicate = (result.message_id_texts(), result.first_offset,
                                                                  result.duplicate)
                self._versions = result.key_versions

    def _refused(self, error: MagnetarError) -> None:
        self._error = (UNKNOWN_ERROR, error.code, str(error))
        if isinstance(error, KeyVersionMismatch) and len(error.current_key_versions) == 1:
            self._current_version = next(iter(error.current_key_versions.values()))

    def frame(self, context: Any, index: int) -> str:
        if self._each is not None:
            return _each_frame(context, self._each[index])
        if self._error is not None:
            if self._current_version is not None:
                return send_error(context, *self._error, currentKeyVersion=self._current_version)
            return send_error(context, *self._error)
        if self._duplicate:  # Pulsar acknowledges a deduplicated send with id -1:-1
            return frame_text({"result": "ok", "messageId": _DUPLICATE_ID, "context": context, "duplicate": True})
        version = self._versions[index] if self._versions else None
        return _ok_frame(context, self._ids[index], self._first_offset + index, version)


def _ok_frame(context: Any, message_id: str, offset: int, version: int | None) -> str:
    return (f'{{"result":"ok","messageId":"{message_id}","context":{json_text(context)},"offset":{offset}'
            + ("}" if version is None else f',"keyVersion":{version}}}'))


def _each_frame(context: Any, outcome: PublishResult | MagnetarError) -> str:
    """The result frame of a frame stored as its own entry."""
    if isinstance(outcome, MagnetarError):
        return send_error(context, UNKNOWN_ERROR, outcome.code, str(outcome))
    if outcome.duplicate:
        return frame_text({"result": "ok", "messageId": _DUPLICATE_ID, "context": context, "duplicate": True})
    version = outcome.key_versions[0] if outcome.key_versions else None
    return _ok_frame(context, outcome.message_id_texts()[0], outcome.first_offset, version)
