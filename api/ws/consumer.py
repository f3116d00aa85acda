"""The WebSocket consumer session: a broker ``MultiConsumer``'s deliveries out, acks and commands in.

Role: one connection bound to a subscription of one or more topics (a partitioned topic's
partitions, a topic list, or a namespace pattern). The broker consumer hands out runs of
entries, split into their messages here (``EntryRun.messages``), which leave as Pulsar's message
frames inside the dispatch that made them (one socket write per burst); client frames are acks (a frame
with no or an unknown ``type``), ``negativeAcknowledge``, ``permit`` (pull mode),
``unsubscribe`` and ``isEndOfTopic``, applied as they arrive (``on_frames``, the frames of one
socket read at a time).

Invariants: a push-mode consumer has at most ``receiverQueueSize`` (≤ 1000) messages delivered
and not yet acknowledged, and that credit is recomputed from the broker's own accounting so
redelivered messages never leak it (Pulsar #2731); a pull-mode consumer gets exactly the permits
it asks for; either way the broker stops delivering once ``maxUnackedBytesPerConsumer`` bytes
are outstanding. Deliveries are taken from the broker consumer only while no frame waits
for the peer (``FrameWriter.backlogged``), so a client that stops reading holds the socket's
buffers, one burst of frames and the broker consumer's outbox
(``dispatcherMaxPendingBytesPerConsumer``), no more. The acks of one socket read reach the
subscription together (one cursor update per topic), before the credit is topped up. Frames
after ``unsubscribe`` are not applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from api.limits import DELIVERY_BACKLOG_FRAMES_MAX, SENT_IDS_REMEMBERED_MAX, WS_CREDIT_CHECK_INTERVAL_S
from api.wakeup import LoopSignal
from api.ws.frames import JSON_DESERIALIZE_ERROR, FrameError, frame_text, message_frame, parse_frame
from api.ws.params import ConsumerParams
from api.ws.session import SessionIO, error_frame, permits_of
from broker import BrokerService, MagnetarError, MessageId, MultiConsumer, TopicName

log = logging.getLogger(__name__)


class ConsumerSession:
    """Deliveries of a ``MultiConsumer`` out as frames; acks, nacks and commands in."""

    def __init__(self, io: SessionIO, service: BrokerService, consumer: MultiConsumer,
                 params: ConsumerParams, topics: list[TopicName], subscription: str) -> None:
        self.io = io
        self.service = service
        self.consumer = consumer
        self.params = params
        self.topics = topics
        self.subscription = subscription
        self._writer = io.writer
        self._writer.frames_max = DELIVERY_BACKLOG_FRAMES_MAX
        self._acks: dict[str, list[int]] = {}
        self._sent: OrderedDict[str, tuple[str, tuple[int, ...]]] = OrderedDict()
        self._credit_timer: asyncio.TimerHandle | None = None
        self._ended = False
        # deliveries leave inside the dispatch that made them, ahead of the publisher's result
        self._delivered = LoopSignal(io.loop, self._send_deliveries, direct_on_loop=True)
        consumer.listener = self._delivered.notify

    def start(self) -> None:
        if not self.params.pull_mode:
            self._top_up()
        self._delivered.notify()

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._credit_timer is not None:
            self._credit_timer.cancel()
        self._flush_acks()  # acks that arrived just before the client left still count
        self.consumer.close()

    def on_frames(self, texts: list[str]) -> int:
        """Apply the frames of one read in order (a bad one is answered and skipped); their acks
        reach the subscription together, then the credit is topped up."""
        acted = False
        for text in texts:
            try:
                frame = parse_frame(text)
                if frame.get("type") == "unsubscribe":
                    self._unsubscribe()
                    return len(texts)
                acted = self._apply(frame) or acted
            except (FrameError, MagnetarError) as exc:
                self._writer.send([error_frame(exc)])
        if acted:
            self._flush_acks()
            if not self.params.pull_mode:
                self.consumer.replenish(self.params.receiver_queue_size)
        return len(texts)

    def _send_deliveries(self) -> None:
        """Every delivery the consumer holds, in one write (runs on the loop when the consumer
        has news). While earlier frames still wait for the peer, deliveries stay with the
        consumer (its flow control holds them) until the writer has room."""
        if self._ended:
            return
        if self._writer.backlogged:
            self._writer.when_room(self._delivered.notify)
            return
        frames = []
        for run in self.consumer.poll_all():
            for delivery in run.messages():  # the entry is decoded here, at the edge that needs messages
                message_id = delivery.message_id.to_base64()
                self._remember(message_id, delivery.topic, delivery.offsets)
                frames.append(message_frame(delivery, message_id))
        self._writer.send(frames)
        if self.consumer.closed:
            self.io.loop.call_soon(self._closed_by_broker)

    def _closed_by_broker(self) -> None:
        if self.consumer.unloaded:  # 1012, service restart: reconnect through a lookup
            self.io.close(1012, "topic moved to another broker; look it up again")
        else:
            self.io.close(1000, "the broker closed this consumer (subscription deleted)")

    def _top_up(self) -> None:
        """Keep ``receiverQueueSize`` messages granted or unacknowledged; checked again every
        ``WS_CREDIT_CHECK_INTERVAL_S`` (a redelivery after an ack timeout frees credit without any
        frame arriving)."""
        self.consumer.replenish(self.params.receiver_queue_size)
        self._credit_timer = self.io.loop.call_later(WS_CREDIT_CHECK_INTERVAL_S, self._top_up)

    def _unsubscribe(self) -> None:
        """Close the consumer, remove the subscription from every partition, close the session
        (after the frames already sent)."""
        self._flush_acks()
        self.consumer.close()
        for name in self.topics:
            for partition in self.service.topics.expand_partitions(name):
                self.service.subscriptions.unsubscribe(partition, self.subscription)
        self.io.close(1000, "unsubscribed")

    def _apply(self, frame: dict[str, Any]) -> bool:
        """Apply a client frame; True when it acknowledged (or negatively) a message."""
        kind = frame.get("type")
        if kind == "permit":
            self.consumer.flow(permits_of(frame))
            return False
        if kind == "isEndOfTopic":
            self._writer.send([frame_text({"endOfTopic": self.consumer.end_of_topic()})])
            return False
        topic, offsets = self._locate(frame)
        if kind == "negativeAcknowledge":
            self.consumer.nack(topic, list(offsets))
        else:  # Pulsar: a frame with no (or an unknown) type is an acknowledgement
            self._acks.setdefault(topic, []).extend(offsets)
        return True

    def _flush_acks(self) -> None:
        acks, self._acks = self._acks, {}
        for topic, offsets in acks.items():
            try:
                self.consumer.ack(topic, offsets)
            except MagnetarError:
                log.exception("acknowledging %d messages of %s failed", len(offsets), topic)

    def _remember(self, message_id: str, topic: str, offsets: tuple[int, ...]) -> None:
        """Where a sent message lives (an encrypted entry's: every offset it carries), so its
        ack needs no id parsing (bounded: the oldest go)."""
        self._sent[message_id] = (topic, offsets)
        if len(self._sent) > SENT_IDS_REMEMBERED_MAX:
            self._sent.popitem(last=False)

    def _locate(self, frame: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
        """The (partition topic, offsets) of the message a frame's ``messageId`` names."""
        raw = frame.get("messageId")
        if not isinstance(raw, str):
            raise FrameError(JSON_DESERIALIZE_ERROR, "frame needs a messageId string")
        known = self._sent.pop(raw, None)
        if known is not None:
            return known
        topic, offset = self.consumer.locate(MessageId.from_base64(raw))
        return topic, (offset,)
