"""The WebSocket reader session: one broker ``Reader`` per partition, from a start position on.

Role: a non-durable read of a topic (every partition of a partitioned one, in turns) from
``earliest``, ``latest``, a message id or the compacted view; or, with ``?key=``, of one key's
event stream from ``fromKeyVersion`` on (a broker ``KeyReader``, whose messages carry their
``keyVersion``). It follows new messages as they are confirmed. Reader frames other than
``isEndOfTopic`` only free flow credit.

Invariant: at most ``receiverQueueSize`` messages and ``maxUnackedBytesPerConsumer`` payload
bytes (but always one message) are sent and not yet acknowledged; a message that does not fit
waits in its reader. Acknowledgements refill the window from half of it on (as Pulsar's clients
refill their receiver queue), new messages whenever there is room. Messages are taken from the
readers ``READER_SEND_BYTES_MAX`` of payload at a time (one message always), each batch only
once the writer has room (``FrameWriter.room()``): a client that stops reading holds the
socket's buffers, one batch, the writer's bounded backlog and one read ahead per reader.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import WebSocket

from api.wakeup import LoopWakeup
from api.ws.frames import JSON_DESERIALIZE_ERROR, FrameError, frame_text, message_frame
from api.ws.protocol import FrameWriter
from api.ws.session import command_loop, supervise
from broker import BrokerService, Delivery, KeyReader, MessageId, Reader

READER_FILL_MESSAGES_MAX = 1000
READER_SEND_BYTES_MAX = 1024 * 1024
"""Payload bytes taken from the readers and turned into frames at once (one message always)."""


def refill_due(outstanding: int, outstanding_bytes: int, limit: int, bytes_limit: int) -> bool:
    """Whether an acknowledgement should wake the sender: once half the window is free by both
    bounds, so a catching-up reader reads in large batches (one thread hop each), not one per
    ack. Small messages fill the window by count (their bytes stay far below the bound), large
    ones by bytes (their count stays far below); waking while either bound still has its window
    nearly full would read a message or two per acknowledgement."""
    return outstanding <= limit // 2 and outstanding_bytes <= bytes_limit // 2


class ReaderSession:
    """Readers (one per partition) from a start position; acks only free flow credit: at most
    ``receiverQueueSize`` messages and ``outstanding_bytes_max`` payload bytes (but always one
    message) are sent and not yet acknowledged."""

    def __init__(self, websocket: WebSocket, service: BrokerService, readers: Sequence[Reader | KeyReader],
                 receiver_queue_size: int, outstanding_bytes_max: int) -> None:
        self.ws = websocket
        self.service = service
        self.readers = readers
        self._limit = max(receiver_queue_size, 1)
        self._bytes_limit = outstanding_bytes_max
        self._sent: OrderedDict[str, int] = OrderedDict()  # message id -> payload bytes, oldest first
        self._outstanding_bytes = 0
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._published = LoopWakeup(self._loop, self._wake)
        self._writer = FrameWriter(websocket, self._limit)
        self._listeners: list[tuple[Reader | KeyReader, Callable[[], None]]] = []

    def _notify(self) -> None:
        self._published.notify()

    async def run(self) -> None:
        for reader in self.readers:
            reader.add_listener(self._notify)
            self._listeners.append((reader, self._notify))
        sender = asyncio.create_task(self._send_loop())
        try:
            await supervise(self.ws, self._receive_loop(), [sender])
        finally:
            sender.cancel()
            for reader, listener in self._listeners:
                reader.remove_listener(listener)
            for reader in self.readers:
                reader.close()

    async def _send_loop(self) -> None:
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while len(self._sent) < self._limit and self._outstanding_bytes < self._bytes_limit:
                room = self._limit - len(self._sent)
                batch = await asyncio.to_thread(self._read, min(room, READER_FILL_MESSAGES_MAX),
                                                self._bytes_limit - self._outstanding_bytes)
                if not batch:
                    break
                frames = []
                for delivery in batch:
                    message_id = delivery.message_id.to_base64()
                    self._sent[message_id] = len(delivery.message.payload)
                    self._outstanding_bytes += len(delivery.message.payload)
                    frames.append(message_frame(delivery, message_id))
                self._writer.send(frames)
                await self._writer.room()

    def _read(self, count: int, bytes_room: int) -> list[Delivery]:
        """Up to ``count`` messages within ``bytes_room`` payload bytes (at least one while none
        is outstanding) and ``READER_SEND_BYTES_MAX`` (at least one), taking turns over the
        partitions; a message that does not fit waits in its reader."""
        out: list[Delivery] = []
        size = 0
        progress = True
        while len(out) < count and progress:
            progress = False
            for reader in self.readers:
                delivery = reader.peek_next()
                if delivery is None:
                    continue
                payload_bytes = len(delivery.message.payload)
                if (out or self._sent) and size + payload_bytes > bytes_room:
                    return out
                if out and size + payload_bytes > READER_SEND_BYTES_MAX:
                    return out
                reader.read_next()
                out.append(delivery)
                size += payload_bytes
                progress = True
                if len(out) >= count:
                    break
        return out

    async def _receive_loop(self) -> None:
        await command_loop(self.ws, self._handle, self._writer, self._apply)

    async def _handle(self, frame: dict[str, Any]) -> bool:
        self._apply(frame)
        return False

    def _apply(self, frame: dict[str, Any]) -> bool:
        """Apply one client frame (nothing a reader does waits): an acknowledgement or
        ``isEndOfTopic``."""
        if frame.get("type") == "isEndOfTopic":
            self._writer.send([frame_text({"endOfTopic": self._end_of_topic()})])
            return True
        message_id = frame.get("messageId")
        if not isinstance(message_id, str):
            raise FrameError(JSON_DESERIALIZE_ERROR, "an acknowledgement needs a messageId string")
        size = self._sent.pop(message_id, None)  # an id this session wrote is valid: no parse
        if size is None:
            MessageId.from_base64(message_id)  # refuses what is not a message id
        if size is None and self._sent:  # not an id it was sent: frees the oldest credit
            size = self._sent.popitem(last=False)[1]
        if size is not None:
            self._outstanding_bytes -= size
            if refill_due(len(self._sent), self._outstanding_bytes, self._limit, self._bytes_limit):
                self._wake.set()
        return True

    def _end_of_topic(self) -> bool:
        return all(r.end_of_topic() for r in self.readers)
