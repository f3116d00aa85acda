"""The WebSocket DCB session: reads by query and conditional appends, answered in order.

Role: ``/ws/v2/dcb/persistent/{tenant}/{namespace}/{topic}``, the REST DCB requests
(``api/rest_dcb.py``) on one connection. A frame is ``{type: "read", context, items, after,
limit}`` or ``{type: "append", context, events, condition, producerName, sequenceId}`` (the
REST bodies' fields plus ``type`` and ``context``); it is answered ``{result: "ok", context,
events, head, nextAfter}`` or ``{result: "ok", context, position}``, or ``{result:
"error:<n>", context, errorCode, errorMsg}`` (3: a frame of the wrong shape; 8: the broker's
refusal, with its ``errorCode``, ``dcb_condition_failed`` with the matching event's
``position``). The broker calls read entries and wait for appends: they run on the executor,
never on the event loop.

Invariants: frames are carried out one after another and answered in frame order (a read
sees the appends of the frames before it); at most ``WS_DCB_PENDING_FRAMES_MAX`` frames are being
carried out (the connection stops being read beyond, as a producer's does at
``maxPendingMessages``); a bad frame is answered and never writes anything or closes the
session.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from api.errors import validation_problems
from api.limits import WS_DCB_PENDING_FRAMES_MAX
from api.rest_dcb import AppendRequest, ReadRequest, append_events, items_of, read_json
from api.ws.frames import JSON_DESERIALIZE_ERROR, UNKNOWN_ERROR, FrameError, frame_text, parse_frame, short
from api.ws.session import SessionIO
from broker import BrokerError, BrokerService, InvalidRequest, MagnetarError, TopicName


class DcbSession:
    def __init__(self, io: SessionIO, service: BrokerService, topic: TopicName, read_bytes_max: int) -> None:
        self._io = io
        self._read_bytes_max = read_bytes_max
        self._service = service
        self._topic = topic
        self._pending: deque[tuple[Any, Callable[[], dict[str, Any]] | Exception]] = deque()
        """Frames taken and not yet answered: (context, the broker call, or why the frame is refused)."""
        self._running: asyncio.Future[dict[str, Any]] | None = None
        """The call of the frame at the head, on the executor (one at a time: frames in order)."""
        self._waiting = False
        self._ended = False

    def start(self) -> None:
        pass

    def end(self) -> None:
        self._ended = True

    def on_frames(self, texts: list[str]) -> int:
        taken = 0
        for text in texts:
            if len(self._pending) >= WS_DCB_PENDING_FRAMES_MAX:
                self._waiting = True
                break
            self._pending.append(self._prepared(text))
            taken += 1
        self._advance(None)
        return taken

    def _prepared(self, text: str) -> tuple[Any, Callable[[], dict[str, Any]] | Exception]:
        """(context, the frame's broker call) or (context, why it is refused)."""
        context: Any = None
        try:
            frame = parse_frame(text)
            context = frame.pop("context", None)
            kind = frame.pop("type", None)
            if kind == "read":
                asked = _validated(ReadRequest, frame)
                return context, lambda: read_json(self._service.streams.dcb.read(
                    self._topic, items_of(asked.items), asked.after, asked.limit, self._read_bytes_max))
            if kind == "append":
                request = _validated(AppendRequest, frame)
                return context, lambda: append_events(self._service, self._topic, request)
            raise FrameError(JSON_DESERIALIZE_ERROR, 'type must be "read" or "append"')
        except (FrameError, InvalidRequest) as exc:
            return context, exc

    def _advance(self, done: asyncio.Future[dict[str, Any]] | None) -> None:
        """(On the loop.) Answer the head when its call is ``done``, then the refused frames
        after it, and start the next call: frames are carried out and answered in order."""
        texts = []
        if done is not None and done.cancelled():  # the loop is closing with the connection
            return
        if done is not None:
            context, _ = self._pending.popleft()
            self._running = None
            texts.append(_answer(context, done.exception() or done.result()))
        while self._pending and self._running is None and not self._ended:
            context, work = self._pending[0]
            if isinstance(work, Exception):
                self._pending.popleft()
                texts.append(_answer(context, work))
                continue
            self._running = self._io.loop.run_in_executor(None, work)
            self._running.add_done_callback(self._advance)
        if texts and not self._ended:
            self._io.writer.send(texts)
        if self._waiting and len(self._pending) < WS_DCB_PENDING_FRAMES_MAX and not self._ended:
            self._waiting = False
            self._io.ready()


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], frame: dict[str, Any]) -> M:
    try:
        return model.model_validate(frame)
    except ValidationError as exc:
        raise FrameError(JSON_DESERIALIZE_ERROR, validation_problems(exc.errors()) or "invalid frame") from None


def _answer(context: Any, outcome: Any) -> str:
    if isinstance(outcome, FrameError):
        return frame_text({"result": f"error:{outcome.result_code}", "context": context,
                           "errorMsg": short(str(outcome))})
    if isinstance(outcome, MagnetarError):
        return frame_text({"result": f"error:{UNKNOWN_ERROR}", "context": context, "errorCode": outcome.code,
                           "errorMsg": short(str(outcome)),
                           **(outcome.details() if isinstance(outcome, BrokerError) else {})})
    if isinstance(outcome, BaseException):
        return frame_text({"result": f"error:{UNKNOWN_ERROR}", "context": context, "errorMsg": short(str(outcome))})
    return frame_text({"result": "ok", "context": context, **outcome})
