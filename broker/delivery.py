"""What dispatch hands a consumer: runs of entries, split into messages only at the edge that needs them.

Role: a subscription's dispatcher (``broker/subscription.py``) reads stored entries and hands
each consumer :class:`EntryRun`s: an entry, or the part of it this consumer gets (Key_Shared
splits a batch by key, a consumer's permits or limits may cut it, acknowledged messages of a
batch are left out), with the entry's stored bytes, its position, first offset and batch size,
the offsets delivered and their redelivery count. The binary protocol writes a MESSAGE straight
from a run (:meth:`EntryRun.frame_data`, :meth:`EntryRun.ack_set`: the stored bytes with
Pulsar's ack set); the edges that need messages (WebSocket, REST, dead letters) split it with
:meth:`EntryRun.messages`, which decodes the entry there, once. :class:`Delivery` is one message
as those edges see it (readers hand them out too).

Invariants:
- A run's ``offsets`` are ascending, non-empty and within its entry (``first_offset`` to
  ``first_offset + batch_size - 1``); a whole entry's are a ``range``. Its messages share one
  redelivery count (the dispatcher cuts runs where the counts differ).
- ``data`` is the stored entry byte for byte (broker prefix included), never copied by dispatch.
- A message's id has a batch index only when its entry holds more than one message, as Pulsar
  gives a message sent alone none. An end-to-end encrypted entry cannot be split: its run is
  one message (the stored ciphertext, an id without batch index, its ``EncryptionContext``)
  whose acknowledgement acknowledges the run, as Pulsar's client hands out an entry it cannot
  decrypt.
- A run costs :func:`footprint` while dispatch holds it: its share of the entry's bytes (the
  entry's bytes over its messages, for each message of the run), a record per run and a slot per
  message. Decoded messages cost :func:`decoded_footprint` (readers hold those).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from broker.entry_format import DecodedMessage, EncryptionContext, decode_delivered
from broker.entry_frames import ack_set_of, consumer_entry
from broker.message_id import MessageId

RUN_BYTES = 512
"""What dispatch holds per run beside its messages: the run, the entry waiting for dispatch it
came from, the position its consumer keeps and their numbers (about 450 bytes by
``sys.getsizeof``, rounded up)."""
MESSAGE_BYTES = 48
"""What dispatch holds per message of a run beside its bytes: its offset in the run's list (a
slot and an ``int``), and on a Key_Shared subscription its key hash (rounded up)."""
DECODED_MESSAGE_BYTES = 640
"""What one decoded message holds beside its payload: its ``DecodedMessage``, ``Delivery`` and
message id (about 600 bytes measured with tracemalloc)."""


def footprint(runs: int, messages: int, entry_bytes: int) -> int:
    """The memory ``runs`` runs of ``messages`` messages in all hold in dispatch, ``entry_bytes``
    being their share of their entries' bytes. Linear, so a sum of runs' footprints is the
    footprint of their sums."""
    return entry_bytes + runs * RUN_BYTES + messages * MESSAGE_BYTES


def decoded_footprint(messages: int, payload_bytes: int) -> int:
    """The memory ``messages`` decoded messages with ``payload_bytes`` of payloads hold: each
    payload twice (in the stored entry and as the message's copy) and each message's objects."""
    return 2 * payload_bytes + messages * DECODED_MESSAGE_BYTES


class Delivery(NamedTuple):
    """One message handed to an edge that needs messages (a named tuple: one is built per message)."""

    message_id: MessageId
    offset: int
    message: DecodedMessage
    publish_time_ms: int
    redelivery_count: int
    topic: str
    key_version: int | None = None
    """The message's version in its key's stream, when a key reader delivers it."""
    encryption: EncryptionContext | None = None
    """Set for an end-to-end encrypted entry, delivered whole as this one message (its payload
    the stored ciphertext), as Pulsar hands out an entry its consumer cannot decrypt."""
    carried: tuple[int, ...] = ()
    """The offsets of the run delivered with this message (an encrypted entry's others):
    acknowledged with it."""

    @property
    def offsets(self) -> tuple[int, ...]:
        """Every offset an acknowledgement of this message acknowledges."""
        return (self.offset, *self.carried)


_new_delivery = tuple.__new__
"""``Delivery(...)`` without the named tuple's Python-level ``__new__`` (one is built per message)."""


class EntryRun(NamedTuple):
    """An entry, or the part of it, handed to one consumer (a named tuple: one is built per run)."""

    topic: str
    ledger_id: int
    entry_id: int
    partition: int
    data: bytes
    """The stored entry, broker prefix included."""
    first_offset: int
    """The offset of the entry's first message (batch index 0)."""
    batch_size: int
    """How many messages the entry holds."""
    offsets: Sequence[int]
    """The offsets of the messages of this run, ascending."""
    redelivery_count: int
    publish_time_ms: int

    @property
    def whole(self) -> bool:
        """The run is its whole entry."""
        return len(self.offsets) == self.batch_size

    @property
    def size(self) -> int:
        """Bytes counted for each of its messages: its entry's bytes over the entry's messages."""
        return len(self.data) // self.batch_size

    def message_id(self, offset: int) -> MessageId:
        return MessageId.of_stored(self.ledger_id, self.entry_id, self.partition,
                                   -1 if self.batch_size == 1 else offset - self.first_offset)

    def messages(self) -> list[Delivery]:
        """The run's messages, its entry decoded (``CorruptEntry`` for a malformed one); an
        encrypted entry's run is one message (see :class:`Delivery`)."""
        decoded, encryption = decode_delivered(self.data)
        first, lone = self.first_offset, self.batch_size == 1
        if lone or encryption is not None:  # most runs: one message, whose id has no batch index
            offsets = self.offsets
            return [_new_delivery(Delivery, (MessageId.of_stored(self.ledger_id, self.entry_id, self.partition, -1),
                                             offsets[0], decoded[0], self.publish_time_ms, self.redelivery_count,
                                             self.topic, None, encryption, tuple(offsets[1:])))]
        of_stored, ledger_id, entry_id, partition = MessageId.of_stored, self.ledger_id, self.entry_id, self.partition
        count, publish_ms, topic = self.redelivery_count, self.publish_time_ms, self.topic
        return [_new_delivery(Delivery, (of_stored(ledger_id, entry_id, partition, offset - first),
                                         offset, decoded[offset - first], publish_ms, count, topic, None, None, ()))
                for offset in self.offsets]

    def frame_data(self) -> memoryview:
        """The entry as Pulsar's binary protocol carries it to a consumer (``consumer_entry``)."""
        return consumer_entry(self.data, self.batch_size)

    def ack_set(self) -> tuple[int, ...]:
        """Pulsar's ack set of the run's messages in its entry; empty for a whole entry (and
        for an entry of one message, whose id has no batch index)."""
        if self.whole:
            return ()
        first = self.first_offset
        return ack_set_of([offset - first for offset in self.offsets], self.batch_size)
