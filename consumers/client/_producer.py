"""The asyncio producer: pipelined publishes over Pulsar's WebSocket producer API.

Role: turn ``send_async`` calls into send frames (base64 payload, ``context`` = a per-session
counter) and the broker's result frames back into completed futures.

Invariants:
- At most ``max_pending_messages`` publishes are in flight; ``send_async`` waits for room
  (back-pressure) instead of queueing without bound.
- The broker answers in frame order, so futures complete in the order of the ``send_async``
  calls; a result is matched to its future by ``context``, never by position.
- No future waits forever: a publish without an answer after ``send_timeout_ms`` fails with
  ``SendTimeout``; when the connection ends every pending future fails with
  ``ConnectionClosed``, unless the producer reconnects.
- A producer made with a ``connector`` (``AsyncClient.create_producer(reconnect=True)``) that
  loses its connection without closing it (the broker died, or its topic moved
  to another broker) connects again through a lookup, within the connector's bounded time, and
  sends every unanswered publish again, in order, before any new one. With a producer name and
  sequence ids (``initial_sequence_id`` makes the producer number its messages) the broker's
  deduplication stores a resent publish once; without, a resent publish that had been stored
  but not answered is stored again (at least once). ``reconnects`` counts the reconnections.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection

from consumers.client._session import Connector, Reconnection, Session
from consumers.client.errors import ConnectionClosed, KeyVersionMismatch, SendError, SendTimeout
from consumers.client.types import SendResult, iso_time

PENDING_MESSAGES_DEFAULT = 1000
PENDING_MESSAGES_MAX = 10_000  # the broker's own bound on maxPendingMessages
SEND_TIMEOUT_MS_DEFAULT = 30_000
SEND_TIMEOUT_CHECK_S_MAX = 0.5
UNKNOWN_ERROR_RESULT_CODE = 8


@dataclass
class _Pending:
    future: asyncio.Future[SendResult]
    deadline_s: float
    frame: dict[str, Any]
    key: str | None = None


def rest_produce_body(payloads: Sequence[bytes], keys: Sequence[str | None] | None, properties: dict[str, str] | None,
                      producer_name: str | None, sequence_id: int | None) -> dict[str, Any]:
    """A REST produce (PIP-64) request: base64 payloads, each with its key (if any) and the
    properties; ``sequence_id`` on the first message (the broker numbers the rest on)."""
    messages: list[dict[str, Any]] = []
    for index, payload in enumerate(payloads):
        message: dict[str, Any] = {"payload": base64.b64encode(payload).decode("ascii")}
        if keys is not None and keys[index] is not None:
            message["key"] = keys[index]
        if properties:
            message["properties"] = properties
        if sequence_id is not None and index == 0:
            message["sequenceId"] = sequence_id
        messages.append(message)
    body: dict[str, Any] = {"messages": messages, "payloadEncoding": "base64"}
    if producer_name is not None:
        body["producerName"] = producer_name
    return body


class AsyncProducer:
    """Create with ``AsyncClient.create_producer``."""

    def __init__(self, ws: ClientConnection, topic: str, *, max_pending_messages: int, send_timeout_ms: int,
                 connector: Connector | None = None, first_sequence_id: int | None = None) -> None:
        if not 1 <= max_pending_messages <= PENDING_MESSAGES_MAX:
            raise ValueError(f"max_pending_messages must be in 1..{PENDING_MESSAGES_MAX}")
        self.topic = topic
        self._loop = asyncio.get_running_loop()
        self._slots = asyncio.Semaphore(max_pending_messages)
        self._pending: dict[str, _Pending] = {}
        self._contexts = itertools.count()
        self._send_timeout_s = send_timeout_ms / 1000
        self._watchdog = self._loop.create_task(self._expire_loop()) if send_timeout_ms > 0 else None
        self._sequence_ids = itertools.count(first_sequence_id) if first_sequence_id is not None else None
        self._reconnection = Reconnection(connector)
        self._session = Session(ws, f"producer on {topic}", self._on_frame, self._on_end)

    @property
    def reconnects(self) -> int:
        return self._reconnection.count

    @property
    def pending_messages(self) -> int:
        return len(self._pending)

    async def send(self, payload: bytes, *, key: str | None = None, properties: dict[str, str] | None = None,
                   event_time_ms: int | None = None, deliver_after_ms: int | None = None,
                   deliver_at_ms: int | None = None, sequence_id: int | None = None,
                   expected_offset: int | None = None, expected_key_version: int | str | None = None) -> SendResult:
        """Publish one message and wait until it is durable. With ``expected_offset`` the append
        is conditional: the broker refuses it (``offset_mismatch``) unless the message gets that
        offset; with ``expected_key_version`` (a version, -1 or ``"exists"``) unless the key's
        stream is at that version (``KeyVersionMismatch``)."""
        future = await self.send_async(payload, key=key, properties=properties, event_time_ms=event_time_ms,
                                       deliver_after_ms=deliver_after_ms, deliver_at_ms=deliver_at_ms,
                                       sequence_id=sequence_id, expected_offset=expected_offset,
                                       expected_key_version=expected_key_version)
        return await future

    async def send_async(self, payload: bytes, *, key: str | None = None, properties: dict[str, str] | None = None,
                         event_time_ms: int | None = None, deliver_after_ms: int | None = None,
                         deliver_at_ms: int | None = None, sequence_id: int | None = None,
                         expected_offset: int | None = None,
                         expected_key_version: int | str | None = None) -> asyncio.Future[SendResult]:
        """Start a publish; waits only while ``max_pending_messages`` are already in flight."""
        if sequence_id is None and self._sequence_ids is not None:
            sequence_id = next(self._sequence_ids)
        frame = _send_frame(payload, key, properties, event_time_ms, deliver_after_ms, deliver_at_ms, sequence_id)
        if expected_offset is not None:
            frame["expectedOffset"] = expected_offset
        if expected_key_version is not None:
            if key is None:
                raise ValueError("expected_key_version needs a key")
            frame["expectedKeyVersion"] = expected_key_version
        await self._reconnection.ready.wait()  # bounded: a reconnection ends within its connector's time
        self._session.check_open()
        await self._slots.acquire()
        try:
            await self._reconnection.ready.wait()
            self._session.check_open()
        except ConnectionClosed:
            self._slots.release()
            raise
        context = str(next(self._contexts))
        frame["context"] = context
        future: asyncio.Future[SendResult] = self._loop.create_future()
        self._pending[context] = _Pending(future, self._loop.time() + self._send_timeout_s, frame, key)
        try:
            await self._session.send_json(frame)
        except ConnectionClosed:
            if self._reconnection.task is not None:
                return future  # kept pending: the reconnection sends it again
            self._finish(context)
            if future.done():
                future.exception()  # the caller gets the error raised here instead
            raise
        return future

    async def flush(self) -> None:
        """Wait until every publish started so far has an outcome (errors stay on their futures)."""
        waiting = [p.future for p in self._pending.values()]
        if waiting:
            await asyncio.wait(waiting)

    async def close(self) -> None:
        """Flush (bounded by the send timeout), then close the session."""
        if not self._session.closed or self._reconnection.task is not None:
            with contextlib.suppress(ConnectionClosed):
                await self.flush()
        self._reconnection.close()
        if self._watchdog is not None:
            self._watchdog.cancel()
        await self._session.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # --- results ---------------------------------------------------------------------------
    def _finish(self, context: Any) -> _Pending | None:
        pending = self._pending.pop(context, None) if isinstance(context, str) else None
        if pending is None:
            return None
        self._slots.release()
        return pending if not pending.future.done() else None

    async def _on_frame(self, frame: Any) -> None:
        if not isinstance(frame, dict):
            return
        pending = self._finish(frame.get("context"))
        if pending is None:  # a result for a publish that already timed out
            return
        future = pending.future
        result = str(frame.get("result", ""))
        if result == "ok":
            future.set_result(SendResult(message_id=str(frame.get("messageId")), offset=frame.get("offset"),
                                         duplicate=bool(frame.get("duplicate", False)),
                                         key_version=frame.get("keyVersion")))
            return
        if frame.get("errorCode") == KeyVersionMismatch.code and pending.key is not None:
            current = frame.get("currentKeyVersion")
            future.set_exception(KeyVersionMismatch(
                str(frame.get("errorMsg") or result).removeprefix(f"{KeyVersionMismatch.code}: "),
                current_versions={pending.key: int(current)} if isinstance(current, int) else {}))
            return
        _, _, number = result.partition(":")
        result_code = int(number) if number.isdigit() else UNKNOWN_ERROR_RESULT_CODE
        message = str(frame.get("errorMsg") or result)
        code = str(frame.get("errorCode") or f"send_error_{result_code}")
        prefix = f"{code}: "
        future.set_exception(SendError(message.removeprefix(prefix), code=code, result_code=result_code))

    def _on_end(self, error: ConnectionClosed) -> None:
        if self._reconnection.wanted(error, self._session):
            self._reconnection.start(lambda: self._reconnect(error))
            return
        self._fail_pending(error)

    async def _reconnect(self, lost: ConnectionClosed) -> None:
        """Open a new session and send every unanswered publish again, in order; on failure
        fail them all with the error that ended the old session."""
        ws = await self._reconnection.connect(lost, self._fail_pending)
        if ws is None:
            return
        self._session = Session(ws, f"producer on {self.topic}", self._on_frame, self._on_end)
        for pending in list(self._pending.values()):
            try:
                await self._session.send_json(pending.frame)
            except ConnectionClosed:
                return  # the new session ended too: its _on_end started another reconnection
        self._reconnection.finished()

    def _fail_pending(self, error: ConnectionClosed) -> None:
        for context in list(self._pending):
            pending = self._finish(context)
            if pending is not None:
                pending.future.set_exception(error)
        if self._watchdog is not None:
            self._watchdog.cancel()

    async def _expire_loop(self) -> None:
        """Fail publishes whose answer is overdue (the oldest are first in ``_pending``)."""
        interval_s = min(self._send_timeout_s / 2, SEND_TIMEOUT_CHECK_S_MAX)
        while True:
            await asyncio.sleep(interval_s)
            now = self._loop.time()
            for context, pending in list(self._pending.items()):
                if pending.deadline_s > now:
                    break
                overdue = self._finish(context)
                if overdue is not None:
                    overdue.future.set_exception(SendTimeout(
                        f"no answer from the broker within {self._send_timeout_s:g} s on {self.topic}"))


def _send_frame(payload: bytes, key: str | None, properties: dict[str, str] | None, event_time_ms: int | None,
                deliver_after_ms: int | None, deliver_at_ms: int | None, sequence_id: int | None) -> dict[str, Any]:
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
    frame: dict[str, Any] = {"payload": base64.b64encode(payload).decode("ascii")}
    if key is not None:
        frame["key"] = key
    if properties:
        frame["properties"] = dict(properties)
    if event_time_ms is not None:
        frame["eventTime"] = iso_time(event_time_ms)
    if deliver_after_ms is not None:
        frame["deliverAfterMs"] = deliver_after_ms
    if deliver_at_ms is not None:
        frame["deliverAt"] = deliver_at_ms
    if sequence_id is not None:
        frame["sequenceId"] = sequence_id
    return frame
