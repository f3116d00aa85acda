"""The asyncio consumer and reader over Pulsar's WebSocket consumer and reader APIs.

Role: pushed message frames become ``Message`` objects in a bounded local queue; ``receive`` /
``read_next`` take them out. Consumers acknowledge explicitly (``acknowledge``,
``negative_acknowledge``); a reader acknowledges each message as it hands it out, which only
returns flow credit to the broker.

Invariants:
- The local queue holds at most ``receiver_queue_size + QUEUE_SLACK`` items. The broker keeps at
  most ``receiver_queue_size`` unacknowledged messages out (its flow control); should more
  arrive, the frame task waits for room and stops reading, so TCP pushes back.
- ``receive(timeout_ms)`` waits at most ``timeout_ms`` and then raises ``ReceiveTimeout``; once
  the session has ended and the queue is drained it raises ``ConnectionClosed`` at once.
- An error frame from the broker (a refused ack or command) is raised by the next ``receive``
  (or by the pending ``unsubscribe``), never dropped. Commands that expect an answer wait at
  most ``CONTROL_TIMEOUT_S``.
- Made with a ``connector`` (``reconnect=True`` of ``AsyncClient.subscribe`` and ``create_reader``), a
  session lost without being closed (the broker died, or the topic moved to another broker) is
  opened again through a lookup within the connector's bounded time: a consumer rejoins its
  subscription, whose unacknowledged messages the broker delivers again (at least once;
  acknowledgements wait for the new session); a reader starts after the last message it
  returned. ``reconnects`` counts the reconnections.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Self

from websockets.asyncio.client import ClientConnection

from consumers.client._retry import RetryLetter
from consumers.client._session import Connector, Reconnection, Session
from consumers.client.errors import ClientError, ConnectionClosed, ConsumerError, ReceiveTimeout
from consumers.client.types import Message, MessageIdParts, Topic, epoch_ms

RECEIVER_QUEUE_SIZE_DEFAULT = 1000
RECEIVER_QUEUE_SIZE_MAX = 1000  # the broker caps it here, as Pulsar does
QUEUE_SLACK = 16
CONTROL_TIMEOUT_S = 10.0

_Item = Message | ClientError
OffsetsFetcher = Callable[[], Awaitable[dict[str, dict[str, int]]]]
"""Per partition full name: ``{"first": first retained offset, "next": next offset}``."""
IdProbe = Callable[[str, int], Awaitable[str | None]]
"""The message id stored at an offset of a partition, or None."""


def _error_of(frame: dict[str, Any]) -> ConsumerError:
    result = str(frame.get("result", "error"))
    return ConsumerError(str(frame.get("errorMsg") or result), code=str(frame.get("errorCode") or result))


def _message_id_of(message: Message | str) -> str:
    return message if isinstance(message, str) else message.message_id


class _Receiving:
    """What consumers and readers share: the session, the bounded queue, message parsing, and
    ``async for`` / ``async with`` (until the session ends; closing it on the way out)."""

    def __init__(self, ws: ClientConnection, description: str, topics: list[Topic], receiver_queue_size: int,
                 connector: Connector | None = None) -> None:
        self._topics = topics
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(receiver_queue_size + QUEUE_SLACK)
        self._queued_messages = 0
        self._control: asyncio.Future[dict[str, Any]] | None = None
        self._ended: ConnectionClosed | None = None
        self._description = description
        self._reconnection = Reconnection(connector)
        self._session = Session(ws, description, self._on_frame, self._on_end)

    @property
    def reconnects(self) -> int:
        return self._reconnection.count

    async def _send(self, frame: dict[str, Any]) -> None:
        """Send on the current session, waiting (bounded by the connector) for a reconnection."""
        await self._reconnection.ready.wait()
        await self._session.send_json(frame)

    async def _close(self) -> None:
        self._reconnection.close()
        await self._session.close()

    async def _next_message(self) -> Message:
        """What ``async for`` yields next (the subclass's receive or read)."""
        raise NotImplementedError

    async def close(self) -> None:
        await self._close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self._next_message()
        except ConnectionClosed:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _receive(self, timeout_ms: int | None) -> Message:
        if self._queue.empty() and self._ended is not None:
            raise self._ended
        if timeout_ms is None:
            item = await self._queue.get()
        else:
            try:
                item = await asyncio.wait_for(self._queue.get(), max(timeout_ms, 0) / 1000)
            except TimeoutError:
                raise ReceiveTimeout(f"no message within {timeout_ms} ms") from None
        if isinstance(item, ConnectionClosed):
            self._queue.put_nowait(item)  # for the next waiter too (the slot was just freed)
            raise item
        if isinstance(item, ClientError):
            raise item
        self._queued_messages -= 1
        return item

    async def _control_request(self, frame: dict[str, Any], *, ends_session: bool = False) -> dict[str, Any] | None:
        """Send a command the broker answers with a frame (or, ``ends_session``, by closing the
        session); wait at most ``CONTROL_TIMEOUT_S``."""
        loop = asyncio.get_running_loop()
        control: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._control = control
        ended = loop.create_task(self._session.wait_ended(CONTROL_TIMEOUT_S)) if ends_session else None
        self._session.expect_close(ends_session)
        try:
            await self._session.send_json(frame)
            waiters: list[asyncio.Future[Any]] = [control] if ended is None else [control, ended]
            await asyncio.wait(waiters, timeout=CONTROL_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._control = None
            if ended is not None:
                ended.cancel()
        if control.done() and not control.cancelled():
            self._session.expect_close(False)
            answer = control.result()
            if "result" in answer:
                raise _error_of(answer)
            return answer
        control.cancel()
        if self._ended is not None:
            if ends_session:
                return None
            raise self._ended
        self._session.expect_close(False)
        raise ConsumerError(f"no answer to {frame.get('type', 'a command')} within {CONTROL_TIMEOUT_S:g} s",
                            code="command_timeout")

    async def _on_frame(self, frame: Any) -> None:
        if not isinstance(frame, dict):
            return
        if "payload" in frame and "messageId" in frame:
            try:
                message = self._message(frame)
            except (ValueError, TypeError, AttributeError, binascii.Error) as exc:
                await self._queue.put(ConsumerError(f"unreadable message frame: {exc}", code="bad_frame"))
                return
            self._queued_messages += 1
            await self._queue.put(message)
        elif self._control is not None and not self._control.done() and ("result" in frame or "endOfTopic" in frame):
            self._control.set_result(frame)
        elif "result" in frame:
            await self._queue.put(_error_of(frame))

    def _on_end(self, error: ConnectionClosed) -> None:
        if self._reconnection.wanted(error, self._session):
            if self._control is not None:
                self._control.cancel()
            self._reconnection.start(lambda: self._reconnect(error))
            return
        self._finish(error)

    async def _reconnect(self, lost: ConnectionClosed) -> None:
        ws = await self._reconnection.connect(lost, self._finish)
        if ws is not None:
            self._session = Session(ws, self._description, self._on_frame, self._on_end)
            self._reconnection.finished()

    def _finish(self, error: ConnectionClosed) -> None:
        self._ended = error
        if self._control is not None:
            self._control.cancel()
        if not self._queue.full():  # wakes a waiting receive; otherwise receive finds _ended once drained
            self._queue.put_nowait(error)

    def _message(self, frame: dict[str, Any]) -> Message:
        message_id = str(frame["messageId"])
        properties = frame.get("properties") or {}
        return Message(data=base64.b64decode(frame["payload"], validate=True), message_id=message_id,
                       offset=frame.get("offset"), key=frame.get("key"),
                       properties={str(k): str(v) for k, v in properties.items()},
                       publish_time_ms=epoch_ms(frame.get("publishTime")),
                       event_time_ms=epoch_ms(frame.get("eventTime")),
                       redelivery_count=int(frame.get("redeliveryCount") or 0), topic=self._topic_of(message_id),
                       key_version=frame.get("keyVersion"))

    def _topic_of(self, message_id: str) -> str | None:
        if len(self._topics) != 1:
            return None
        try:
            partition = MessageIdParts.from_base64(message_id).partition
        except ValueError:
            return None
        return self._topics[0].partition(partition).full_name


class AsyncConsumer(_Receiving):
    """A subscription's consumer; create with ``AsyncClient.subscribe``. ``async for`` yields
    messages until the session ends."""

    def __init__(self, ws: ClientConnection, topics: list[Topic], subscription: str, receiver_queue_size: int,
                 connector: Connector | None = None, *, retry: RetryLetter | None = None) -> None:
        self.subscription = subscription
        self._retry = retry
        self.topics = [t.full_name for t in topics]
        super().__init__(ws, f"consumer {subscription} on {', '.join(self.topics)}", topics, receiver_queue_size,
                         connector)

    async def receive(self, timeout_ms: int | None = None) -> Message:
        """The next message; ``ReceiveTimeout`` after ``timeout_ms`` (None: wait until one comes)."""
        return await self._receive(timeout_ms)

    async def acknowledge(self, message: Message | str) -> None:
        await self._send({"messageId": _message_id_of(message)})

    async def negative_acknowledge(self, message: Message | str) -> None:
        """Ask for redelivery (after the subscription's negative-ack delay); ``redelivery_count`` grows."""
        await self._send({"type": "negativeAcknowledge", "messageId": _message_id_of(message)})

    async def reconsume_later(self, message: Message, delay_ms: int) -> str:
        """Hand ``message`` back to be delivered again after ``delay_ms``: a copy goes to the
        retry-letter topic (to the dead-letter topic once it was reconsumed
        ``max_redeliver_count`` times) and the original is acknowledged (see ``_retry.py``).
        The topic the copy went to; ``ClientError`` without ``retry_enable``."""
        if self._retry is None:
            raise ClientError("reconsume_later needs a consumer subscribed with retry_enable=True")
        target = await self._retry.publish(message, delay_ms)
        await self.acknowledge(message)
        return target

    async def unsubscribe(self) -> None:
        """Delete the subscription (refused while other consumers are attached); ends this consumer."""
        self._reconnection.closing = True
        await self._control_request({"type": "unsubscribe"}, ends_session=True)
        await self._close()

    async def close(self) -> None:
        """Leave the subscription; unacknowledged messages go to other consumers or come back later."""
        if self._retry is not None:
            await self._retry.close()
        await self._close()

    async def _next_message(self) -> Message:
        return await self.receive()


class AsyncReader(_Receiving):
    """Reads a topic from a start position without a subscription; create with
    ``AsyncClient.create_reader``."""

    def __init__(self, ws: ClientConnection, topic: Topic, receiver_queue_size: int, *, start: str,
                 start_offsets: dict[str, dict[str, int]], offsets: OffsetsFetcher, probe: IdProbe,
                 connector: Callable[[str], Awaitable[ClientConnection]] | None = None) -> None:
        self.topic = topic.full_name
        self._start = start
        self._start_offsets = start_offsets
        self._offsets = offsets
        self._probe = probe
        self._next_offsets: dict[str, int] = {}
        self._last_id: str | None = None
        reopen = None if connector is None else (lambda: connector(self._last_id or start))
        super().__init__(ws, f"reader on {self.topic}", [topic], receiver_queue_size, reopen)

    async def read_next(self, timeout_ms: int | None = None) -> Message:
        """The next message; ``ReceiveTimeout`` after ``timeout_ms`` (None: wait until one comes)."""
        message = await self._receive(timeout_ms)
        if message.topic is not None and message.offset is not None:
            self._next_offsets[message.topic] = message.offset + 1
        self._last_id = message.message_id
        with contextlib.suppress(ConnectionClosed):  # the message is good; the next read reports the end
            await self._send({"messageId": message.message_id})  # returns the flow credit
        return message

    async def has_message_available(self) -> bool:
        """Whether ``read_next`` has a message to return now or the topic holds one past this
        reader's position (asks the broker for the partitions' offsets)."""
        if self._queued_messages > 0:
            return True
        for partition, found in (await self._offsets()).items():
            if found["next"] > await self._position(partition, found):
                return True
        return False

    async def _position(self, partition: str, found: dict[str, int]) -> int:
        """The offset of the next message this reader would return from ``partition``."""
        if partition in self._next_offsets:
            return self._next_offsets[partition]
        if self._start == "earliest":
            return found["first"]
        if self._start == "latest":
            return self._start_offsets.get(partition, found)["next"]
        if found["next"] <= found["first"]:
            return found["next"]
        last_id = await self._probe(partition, found["next"] - 1)  # ids grow with offsets
        after_start = last_id is not None and MessageIdParts.from_base64(last_id) > MessageIdParts.parse(self._start)
        return found["next"] - 1 if after_start else found["next"]

    async def _next_message(self) -> Message:
        return await self.read_next()
