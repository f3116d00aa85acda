"""Entries as Pulsar's binary protocol carries them, in both directions.

Role: a binary-protocol client encodes each entry itself (one message, a batch, or one chunk
of a large message: ``0x0e01``, CRC32C, ``MessageMetadata``, payload), and the broker stores
exactly those bytes; a consumer receives stored entries exactly as they were stored, minus the
broker's ``0x0e02`` prefix. Between the two, delivery is per message (``broker/subscription.py``
hands each message to a consumer as its own delivery), so this module turns a consumer's deliveries back into
entry frames: the consecutive deliveries of one stored entry with one redelivery count become
one :class:`EntryFrame`, with Pulsar's ``ack_set`` marking the messages of the entry that are
this consumer's when it holds only some of them (the client skips the others).

Invariants:
- :func:`check_client_entry` accepts only what every reader of the topic can decode later
  (checksum, metadata, compression, batch structure, declared message count), so a client's
  bytes can never make a stored entry unreadable; it raises ``CorruptEntry`` or
  ``InvalidRequest`` (an encrypted entry, a wrong message count, a broker prefix). It checks
  exactly what ``decode_entry`` checks, without building what a reader needs: the common entry
  (uncompressed, only the metadata fields Pulsar's clients set by default) through
  ``common_client_entry``, which never accepts what ``decode_entry`` refuses, anything else
  through ``decode_entry_payload``; an entry that is not a batch is its ``MessageMetadata`` and
  its bytes (splitting such an entry cannot fail), so only a batch is split.
- An :class:`EntryFrame`'s ``data`` is a view of the stored bytes, never a copy or a re-encoding,
  with two exceptions: messages of a compacted view, which have no stored entry of their own,
  and a lone message stored in the batch format (Magnetar's own edges write every entry as a
  batch), which goes out in Pulsar's unbatched form (``as_unbatched``), because Pulsar's
  clients would number it batch index 0 where every other edge, and Pulsar itself for a message
  sent alone, gives it none: so the same message has the same id everywhere.
- ``ack_set`` words are Pulsar's: bit ``i`` of word ``i // 64`` is set for batch index ``i``
  delivered in this frame, as a signed 64-bit integer; empty when the frame holds the whole entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from broker.entry_format import (
    Message,
    as_unbatched,
    common_client_entry,
    decode_entry_payload,
    encode_entry,
    split_entry_payload,
    split_prefix,
)
from broker.errors import InvalidRequest
from broker.subscription import Delivery

ACK_SET_WORD_BITS = 64
_UINT64_MOD = 1 << 64
_INT64_MAX = (1 << 63) - 1


@dataclass(slots=True, eq=False)
class ClientEntry:
    """What the broker needs to know of a client's entry before storing it. Not frozen (a frozen
    dataclass costs a microsecond more to build, once per SEND); treat it as a value."""

    message_count: int
    producer_name: str
    chunk_id: int | None
    """The chunk's index when the entry is one chunk of a larger message, else None."""
    chunks: int
    """How many chunks the message has (1 when it is not chunked)."""
    keys: tuple[str | None, ...]
    """Each message's partition key (None: no key), in batch order: what the key index needs."""

    @property
    def partial_chunk(self) -> bool:
        """A chunk other than the last of its message."""
        return self.chunk_id is not None and self.chunk_id < self.chunks - 1


def check_client_entry(data: bytes, declared_messages: int) -> ClientEntry:
    """Verify a client's entry in full (see the module's invariants)."""
    common = common_client_entry(data)
    if common is not None:  # the usual entry, verified without the general parser
        producer, keys = common
        checked = ClientEntry(len(keys), producer, None, 1, keys)
    else:
        checked = _check_any_client_entry(data)
    if checked.message_count != declared_messages:
        raise InvalidRequest(f"the entry holds {checked.message_count} messages, the command declares "
                             f"{declared_messages}")
    return checked


def _check_any_client_entry(data: bytes) -> ClientEntry:
    entry = decode_entry_payload(data)
    if entry.broker_metadata is not None:
        raise InvalidRequest("a client's entry must not carry broker entry metadata")
    metadata = entry.metadata
    keys: tuple[str | None, ...]
    if entry.is_batched:
        messages = split_entry_payload(entry).messages
        keys = tuple(m.key for m in messages)
    else:
        keys = (metadata.partition_key if metadata.HasField("partition_key") else None,)
    chunked = metadata.HasField("chunk_id") and metadata.HasField("num_chunks_from_msg")
    chunks = int(metadata.num_chunks_from_msg) if chunked else 1
    chunk_id = int(metadata.chunk_id) if chunked else None
    if chunk_id is not None and not 0 <= chunk_id < chunks:
        raise InvalidRequest(f"chunk {chunk_id} of a message of {chunks} chunks")
    return ClientEntry(len(keys), metadata.producer_name, chunk_id, chunks, keys)


@dataclass(frozen=True, slots=True)
class EntryFrame:
    """Deliveries of one stored entry to one consumer, as one Pulsar MESSAGE payload."""

    topic: str
    ledger_id: int
    entry_id: int
    partition: int
    data: memoryview
    """The entry as its producer wrote it (from the ``0x0e01`` magic on)."""
    redelivery_count: int
    batch_size: int
    ack_set: tuple[int, ...]
    offsets: tuple[int, ...]
    """The offsets of the messages delivered in this frame, in batch order."""
    first_offset: int
    """The offset of the entry's first message (batch index 0)."""


def frames_of_deliveries(deliveries: Iterable[Delivery]) -> list[EntryFrame]:
    """Group deliveries (in the order a consumer received them) into entry frames: a run of
    messages of one stored entry (the same bytes object, so the same ledger and entry), one
    topic and one redelivery count is one frame; a message without an entry is a frame alone."""
    frames: list[EntryFrame] = []
    group: list[Delivery] = []
    data: bytes | None = None
    count = 0
    topic = ""
    for delivery in deliveries:
        if group and (delivery.entry_data is not data or data is None or delivery.redelivery_count != count
                      or delivery.topic != topic):
            frames.append(_frame_of(group))
            group = []
        if not group:
            data, count, topic = delivery.entry_data, delivery.redelivery_count, delivery.topic
        group.append(delivery)
    if group:
        frames.append(_frame_of(group))
    return frames


def _frame_of(group: list[Delivery]) -> EntryFrame:
    first = group[0]
    message_id = first.message_id
    first_offset = first.offset - max(message_id.batch_index, 0)
    if first.entry_data is None:  # a compacted view's message: a one-message entry of its own
        data, batch_size = memoryview(_unbatched(_single_entry(first))), 1
    else:
        prefix, start = split_prefix(first.entry_data)
        batch_size = 1 if prefix is None else prefix.index - first_offset + 1
        data = memoryview(first.entry_data)[start:]
        if batch_size == 1 and first.message.batch_index == 0:  # a lone message in the batch format
            data = memoryview(_unbatched(first.entry_data))
    offsets = tuple(d.offset for d in group)
    ack_set = () if len(group) >= batch_size or message_id.batch_index < 0 else \
        ack_set_of([o - first_offset for o in offsets], batch_size)
    return EntryFrame(first.topic, message_id.ledger_id, message_id.entry_id, message_id.partition, data,
                      first.redelivery_count, batch_size, ack_set, offsets, first_offset)


def ack_set_of(indexes: Iterable[int], batch_size: int) -> tuple[int, ...]:
    """Pulsar's ack-set words with the bits of ``indexes`` set, as signed 64-bit integers."""
    words = [0] * ((batch_size + ACK_SET_WORD_BITS - 1) // ACK_SET_WORD_BITS)
    for index in indexes:
        words[index // ACK_SET_WORD_BITS] |= 1 << (index % ACK_SET_WORD_BITS)
    return tuple(w - _UINT64_MOD if w > _INT64_MAX else w for w in words)


def cleared_indexes(ack_set: Iterable[int], batch_size: int) -> list[int]:
    """The batch indexes whose bits are clear in ``ack_set`` (in an ACK: the acknowledged ones)."""
    words = [w % _UINT64_MOD for w in ack_set]
    return [i for i in range(batch_size)
            if i // ACK_SET_WORD_BITS >= len(words) or not words[i // ACK_SET_WORD_BITS] >> (i % ACK_SET_WORD_BITS) & 1]


def _unbatched(data: bytes) -> bytes:
    converted = as_unbatched(data)
    assert converted is not None  # called for one-message batches only
    return converted


def _single_entry(delivery: Delivery) -> bytes:
    message = delivery.message
    return encode_entry([Message(message.payload, message.key, message.properties, message.event_time_ms,
                                 message.sequence_id, message.ordering_key, message.key_b64_encoded,
                                 message.null_value, message.null_key)],
                        producer_name="compacted", sequence_id=message.sequence_id or 0,
                        publish_time_ms=delivery.publish_time_ms)
