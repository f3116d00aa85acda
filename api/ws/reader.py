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
readers ``READER_SEND_BYTES_MAX`` of payload at a time (one message always), on a worker thread
(a read may reach storage), one read at a time, each only once the writer has room
(``FrameWriter.has_room``): a client that stops reading holds the socket's buffers, one batch,
the writer's bounded backlog and one read ahead per reader.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from api.limits import READER_FILL_MESSAGES_MAX, READER_SEND_BYTES_MAX
from api.wakeup import LoopSignal
from api.ws.frames import JSON_DESERIALIZE_ERROR, FrameError, frame_text, message_frame, parse_frame
from api.ws.session import SessionIO, error_frame
from broker import BrokerService, Delivery, KeyReader, MagnetarError, MessageId, Reader


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

    def __init__(self, io: SessionIO, service: BrokerService, readers: Sequence[Reader | KeyReader],
                 receiver_queue_size: int, outstanding_bytes_max: int) -> None:
        self.io = io
        self.service = service
        self.readers = readers
        self._limit = max(receiver_queue_size, 1)
        self._bytes_limit = outstanding_bytes_max
        self._sent: OrderedDict[str, int] = OrderedDict()  # message id -> payload bytes, oldest first
        self._outstanding_bytes = 0
        self._writer = io.writer
        self._writer.frames_max = self._limit
        self._published = LoopSignal(io.loop, self._fill, direct_on_loop=True)
        self._reading = False
        """A read runs on a worker thread."""
        self._wanted = False
        """``_fill`` was asked for while a read ran: read again when it is done."""
        self._ended = False

    def start(self) -> None:
        for reader in self.readers:
            reader.add_listener(self._published.notify)
        self._fill()

    def end(self) -> None:
        self._ended = True
        for reader in self.readers:
            reader.remove_listener(self._published.notify)
            reader.close()

    def _fill(self) -> None:
        """Read what the window has room for, on a worker thread, once the writer has room."""
        self._wanted = True
        if self._reading or self._ended:
            return
        if len(self._sent) >= self._limit or self._outstanding_bytes >= self._bytes_limit:
            return
        if not self._writer.has_room:
            self._writer.when_room(self._fill)
            return
        self._wanted = False
        self._reading = True
        room = self._limit - len(self._sent)
        read = self.io.loop.run_in_executor(None, self._read, min(room, READER_FILL_MESSAGES_MAX),
                                            self._bytes_limit - self._outstanding_bytes)
        read.add_done_callback(self._read_done)

    def _read_done(self, read: asyncio.Future[list[Delivery]]) -> None:
        self._reading = False
        if self._ended or read.cancelled():
            return
        batch = read.result()
        if batch:
            frames = []
            for delivery in batch:
                message_id = delivery.message_id.to_base64()
                payload_bytes = len(delivery.message.payload)
                self._sent[message_id] = payload_bytes
                self._outstanding_bytes += payload_bytes
                frames.append(message_frame(delivery, message_id))
            self._writer.send(frames)
        if batch or self._wanted:
            self._fill()

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

    def on_frames(self, texts: list[str]) -> int:
        """Apply each frame (nothing a reader does waits): an acknowledgement or ``isEndOfTopic``;
        a bad frame is answered and skipped."""
        for text in texts:
            try:
                self._apply(parse_frame(text))
            except (FrameError, MagnetarError) as exc:
                self._writer.send([error_frame(exc)])
        return len(texts)

    def _apply(self, frame: dict[str, Any]) -> None:
        if frame.get("type") == "isEndOfTopic":
            self._writer.send([frame_text({"endOfTopic": all(r.end_of_topic() for r in self.readers)})])
            return
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
                self._fill()
