"""Entries as Pulsar's binary protocol carries them, in both directions.

Role: a binary-protocol client encodes each entry itself (one message, a batch, or one chunk
of a large message: ``0x0e01``, CRC32C, ``MessageMetadata``, payload), and the broker stores
exactly those bytes; a consumer receives stored entries exactly as they were stored, minus the
broker's ``0x0e02`` prefix. Dispatch keeps entries as entries (``broker/delivery.py``: a
consumer is handed runs of entries), so the binary protocol writes each run as one MESSAGE:
:func:`consumer_entry` gives the entry as the consumer receives it, and :func:`ack_set_of`
Pulsar's ``ack_set`` marking the messages of the entry that are this consumer's when it gets
only some of them (the client skips the others); :func:`cleared_indexes` reads an ACK's.

Invariants:
- :func:`check_client_entry` accepts only what every reader of the topic can decode later
  (checksum, metadata, compression, batch structure, declared message count), so a client's
  bytes can never make a stored entry unreadable; it raises ``CorruptEntry`` or
  ``InvalidRequest`` (a wrong message count, a broker prefix). An end-to-end encrypted entry is
  checked as far as the broker can read it (checksum, metadata, message count; its payload is
  opaque) and its messages take the clear metadata's key. It checks
  exactly what ``decode_entry`` checks, without building what a reader needs: the common entry
  (uncompressed, only the metadata fields Pulsar's clients set by default) through
  ``common_client_entry``, which never accepts what ``decode_entry`` refuses, anything else
  through ``decode_entry_payload``; an entry that is not a batch is its ``MessageMetadata`` and
  its bytes (splitting such an entry cannot fail), so only a batch is split.
- :func:`consumer_entry` gives a view of the stored bytes, never a copy or a re-encoding, with
  one exception: a lone message stored in the batch format (Magnetar's own edges write every
  entry as a batch) goes out in Pulsar's unbatched form (``as_unbatched``), because Pulsar's
  clients would number it batch index 0 where every other edge, and Pulsar itself for a message
  sent alone, gives it none: so the same message has the same id everywhere.
- ``ack_set`` words are Pulsar's: bit ``i`` of word ``i // 64`` is set for batch index ``i``
  delivered in this MESSAGE, as a signed 64-bit integer; empty when it holds the whole entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from broker.entry_format import (
    as_unbatched,
    common_client_entry,
    decode_entry_payload,
    split_entry_payload,
    split_prefix,
)
from broker.errors import InvalidRequest

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


def consumer_entry(data: bytes, batch_size: int) -> memoryview:
    """The stored entry ``data`` (of ``batch_size`` messages) as a binary consumer receives it:
    from the ``0x0e01`` magic on, a lone message stored in the batch format in Pulsar's
    unbatched form (see the module's invariants)."""
    if batch_size == 1:
        converted = as_unbatched(data)
        if converted is not None:
            return memoryview(converted)
    return memoryview(data)[split_prefix(data)[1]:]


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
