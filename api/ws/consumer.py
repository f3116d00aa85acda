"""The WebSocket consumer session: a broker ``MultiConsumer``'s deliveries out, acks and commands in.

Role: one connection bound to a subscription of one or more topics (a partitioned topic's
partitions, a topic list, or a namespace pattern). The broker consumer hands out runs of
entries, split into their messages here (``EntryRun.messages``), which leave as Pulsar's message
frames inside the dispatch that made them (one socket write per burst); client frames are acks (a frame
with no or an unknown ``type``), ``negativeAcknowledge``, ``permit`` (pull mode),
``unsubscribe`` and ``isEndOfTopic``.

Invariants: a push-mode consumer has at most ``receiverQueueSize`` (≤ 1000) messages delivered
and not yet acknowledged, and that credit is recomputed from the broker's own accounting so
redelivered messages never leak it (Pulsar #2731); a pull-mode consumer gets exactly the permits
it asks for; either way the broker stops delivering once ``maxUnackedBytesPerConsumer`` bytes
are outstanding. Deliveries are taken from the broker consumer only while no frame waits
for the peer (``FrameWriter``), so a client that stops reading holds the socket's buffers, one
burst of frames and the broker consumer's outbox (``dispatcherMaxPendingBytesPerConsumer``), no
more. Acks of one burst of frames reach the subscription together.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from fastapi import WebSocket

from api.wakeup import LoopSignal
from api.ws.frames import JSON_DESERIALIZE_ERROR, FrameError, frame_text, message_frame
from api.ws.params import RECEIVER_QUEUE_SIZE_MAX, ConsumerParams
from api.ws.protocol import FrameWriter
from api.ws.session import command_loop, permits_of, supervise
from broker import BrokerService, MagnetarError, MessageId, MultiConsumer, TopicName

log = logging.getLogger(__name__)

CREDIT_CHECK_INTERVAL_S = 1.0
SENT_IDS_REMEMBERED_MAX = 4 * RECEIVER_QUEUE_SIZE_MAX
DELIVERY_BACKLOG_FRAMES_MAX = RECEIVER_QUEUE_SIZE_MAX


class _Credit:
    """Flow credit of a push session: keep ``limit`` messages granted-or-unacknowledged, split
    evenly over the consumer's topic partitions (``MultiConsumer.replenish``), so permits parked
    on an idle partition never starve a busy one."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int, replenish: Callable[[int], None]) -> None:
        self._loop = loop
        self._limit = limit
        self._replenish = replenish
        self._scheduled = False

    def top_up_soon(self) -> None:
        """Top up once the frames already received are handled (one flow per burst of acks)."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.top_up)

    def top_up(self) -> None:
        self._scheduled = False
        self._replenish(self._limit)


class ConsumerSession:
    """Deliveries of a ``MultiConsumer`` out as frames; acks, nacks and commands in."""

    def __init__(self, websocket: WebSocket, service: BrokerService, consumer: MultiConsumer,
                 params: ConsumerParams, topics: list[TopicName], subscription: str) -> None:
        self.ws = websocket
        self.service = service
        self.consumer = consumer
        self.params = params
        self.topics = topics
        self.subscription = subscription
        self._consumer_closed = asyncio.Event()
        self._acks: dict[str, list[int]] = {}
        self._acks_scheduled = False
        self._sent: OrderedDict[str, tuple[str, int]] = OrderedDict()
        loop = asyncio.get_running_loop()
        self._credit = _Credit(loop, params.receiver_queue_size, consumer.replenish)

        # deliveries leave inside the dispatch that made them, ahead of the publisher's result
        self._delivered = LoopSignal(loop, self._send_deliveries, direct_on_loop=True)
        self._writer = FrameWriter(websocket, DELIVERY_BACKLOG_FRAMES_MAX, on_drained=self._delivered.notify)
        consumer.listener = self._delivered.notify

    async def run(self) -> None:
        if not self.params.pull_mode:
            self._credit.top_up()
        self._delivered.notify()
        workers = [asyncio.create_task(self._close_when_consumer_closes())]
        if not self.params.pull_mode:
            workers.append(asyncio.create_task(self._credit_loop()))
        try:
            await supervise(self.ws, self._receive_loop(), workers)
        finally:
            for worker in workers:
                worker.cancel()
            self._flush_acks()  # acks that arrived just before the client left still count
            self.consumer.close()

    def _send_deliveries(self) -> None:
        """Every delivery the consumer holds, in one write (runs on the loop when the consumer
        has news). While earlier frames still wait for the peer, deliveries stay with the
        consumer (its flow control holds them) until the writer has drained."""
        if self._writer.backlogged:
            return
        frames = []
        for run in self.consumer.poll_all():
            for delivery in run.messages():  # the entry is decoded here, at the edge that needs messages
                message_id = delivery.message_id.to_base64()
                self._remember(message_id, delivery.topic, delivery.offset)
                frames.append(message_frame(delivery, message_id))
        self._writer.send(frames)
        if self.consumer.closed:
            self._consumer_closed.set()

    async def _close_when_consumer_closes(self) -> None:
        await self._consumer_closed.wait()
        await self._writer.flush()
        if self.consumer.unloaded:  # 1012, service restart: reconnect through a lookup
            await self.ws.close(1012, "topic moved to another broker; look it up again")
        else:
            await self.ws.close(1000, "the broker closed this consumer (subscription deleted)")

    async def _credit_loop(self) -> None:
        """Redelivery after an ack timeout frees credit without any frame arriving."""
        while True:
            await asyncio.sleep(CREDIT_CHECK_INTERVAL_S)
            self._credit.top_up()

    async def _receive_loop(self) -> None:
        await command_loop(self.ws, self._handle, self._writer, self._apply)

    async def _handle(self, frame: dict[str, Any]) -> bool:
        """Apply one client frame; True when the session is over (unsubscribed)."""
        if self._apply(frame):
            return False
        self.consumer.close()  # unsubscribe, the one frame that waits
        for name in self.topics:
            for partition in self.service.expand_partitions(name):
                self.service.unsubscribe(partition, self.subscription)
        await self._writer.flush()
        await self.ws.close(1000, "unsubscribed")
        return True

    def _apply(self, frame: dict[str, Any]) -> bool:
        """Apply a client frame that needs no waiting; False for ``unsubscribe``, which does."""
        kind = frame.get("type")
        if kind == "permit":
            self.consumer.flow(permits_of(frame))
        elif kind == "isEndOfTopic":
            self._writer.send([frame_text({"endOfTopic": self._end_of_topic()})])
        elif kind == "unsubscribe":
            return False
        elif kind == "negativeAcknowledge":
            topic, offset = self._locate(frame)
            self.consumer.nack(topic, [offset])
            self._credit_after_ack()
        else:  # Pulsar: a frame with no (or an unknown) type is an acknowledgement
            topic, offset = self._locate(frame)
            self._queue_ack(topic, offset)
        return True

    def _queue_ack(self, topic: str, offset: int) -> None:
        """Acks of one burst of frames reach the subscription together: one cursor update and
        one dispatch per burst, not per message."""
        self._acks.setdefault(topic, []).append(offset)
        if not self._acks_scheduled:
            self._acks_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._acks_scheduled = False
        acks, self._acks = self._acks, {}
        for topic, offsets in acks.items():
            try:
                self.consumer.ack(topic, offsets)
            except MagnetarError:
                log.exception("acknowledging %d messages of %s failed", len(offsets), topic)
        self._credit_after_ack()

    def _credit_after_ack(self) -> None:
        if not self.params.pull_mode:
            self._credit.top_up_soon()

    def _remember(self, message_id: str, topic: str, offset: int) -> None:
        """Where a sent message lives, so its ack needs no id parsing (bounded: the oldest go)."""
        self._sent[message_id] = (topic, offset)
        if len(self._sent) > SENT_IDS_REMEMBERED_MAX:
            self._sent.popitem(last=False)

    def _locate(self, frame: dict[str, Any]) -> tuple[str, int]:
        """The (partition topic, offset) of the message a frame's ``messageId`` names."""
        raw = frame.get("messageId")
        if not isinstance(raw, str):
            raise FrameError(JSON_DESERIALIZE_ERROR, "frame needs a messageId string")
        known = self._sent.pop(raw, None)
        if known is not None:
            return known
        return self.consumer.locate(MessageId.from_base64(raw))

    def _end_of_topic(self) -> bool:
        return self.consumer.end_of_topic()
