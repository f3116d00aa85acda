"""Entries as every transport builds them: the one shape the append path takes.

Role: the first step of the append path. Every writer of a topic builds each entry it appends
here, then hands a group of them to the one append path::

    entry_builder (this module) → Producer.append → PersistentTopic.append → ManagedLedger.append
      → LedgerHandle.append → Bookie.add_entries → LedgerStorage.add_entries → Journal.append

A REST produce request is one entry holding all its messages (``entry_of_messages``: a batch);
a WebSocket frame's message is an entry of its own (``entries_of_messages``); a binary-protocol
SEND is the client's own bytes, checked here and passed through untouched (``entry_of_client``);
the broker's own writers (dead letters) build theirs with ``entry_of_messages``. A single message
is a group of one.

An entry built from messages is encoded when its sequence id is known; one whose sequence id is
the producer's next (``sequence_id`` None) is encoded by the topic under its publish lock, where
that number is given (``PreparedEntry.encoded``).

Invariants:
- :func:`entry_of_client` accepts only what every reader of the topic can decode later
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
- A prepared entry knows each message's key (the key index numbers keyed messages as it is
  appended) and its sequence ids (deduplication), whichever way it was built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.entry_format import (
    Compression,
    Message,
    common_client_entry,
    decode_entry_payload,
    encode_entry,
    encode_single_entry,
    split_entry_payload,
)
from broker.errors import EncryptionRequired, InvalidRequest, MagnetarError, MessageTooLarge
from broker.key_index.derived import MARK, TYPE_PROPERTY, keys_of_messages
from broker.limits import CLIENT_ENTRY_OVERHEAD_BYTES_MAX

SEQUENCE_ID_MAX = 2**63 - 1
"""Pulsar's sequence ids are signed 64-bit."""


@dataclass(slots=True, eq=False)
class PreparedEntry:
    """One entry to append. Not frozen (one is built per message on the WebSocket path, and a
    frozen dataclass costs a microsecond more to build); treat it as a value, except that
    :meth:`encoded` fills ``data`` once."""

    data: bytes | None
    """The bytes to store: a client's checked entry, or the encoded messages (None until the
    topic encodes them with the producer's next sequence id)."""
    messages: Sequence[Message]
    """The messages the entry was built from (empty for a client's entry)."""
    message_count: int
    keys: tuple[str | None, ...]
    """Each message's partition key (None: no key), in batch order."""
    sequence_id: int | None
    """The first message's sequence id; None: the producer's next, given by the topic."""
    highest_sequence_id: int | None
    """The last message's; None: ``sequence_id + message_count - 1``."""
    partial_chunk: bool = False
    """A chunk other than the last of its message (every chunk carries its message's sequence
    id; only the last one claims it)."""
    compression: Compression = Compression.NONE
    deliver_at_time_ms: int | None = None
    size_bytes: int = 0
    """What the size bound is checked against: the largest payload of the messages, or the
    client's whole entry."""
    dcb: tuple[frozenset[bytes], ...] = ()
    """Each message's derived streams in the key index (``broker/key_index/derived.py``);
    empty when no message is a DCB event."""

    def encoded(self, producer_name: str, sequence_id: int, publish_time_ms: int) -> bytes:
        """The entry's bytes with ``sequence_id`` as its first message's (messages without
        their own get the ones that follow): what it stores."""
        data = self.data
        if data is None:
            messages = self.messages
            if len(messages) == 1 and self.compression is Compression.NONE and self.deliver_at_time_ms is None:
                data = encode_single_entry(messages[0], producer_name=producer_name, sequence_id=sequence_id,
                                           publish_time_ms=publish_time_ms)
            else:
                data = encode_entry(messages, producer_name=producer_name, sequence_id=sequence_id,
                                    publish_time_ms=publish_time_ms, compression=self.compression,
                                    deliver_at_time_ms=self.deliver_at_time_ms)
            self.data = data
        return data

    def refusal(self, message_size_bytes_max: int) -> MagnetarError | None:
        """Why the topic refuses this entry before anything is stored, or None."""
        if self.messages:
            if self.size_bytes > message_size_bytes_max:
                return MessageTooLarge(f"message of {self.size_bytes} bytes exceeds {message_size_bytes_max} bytes")
        elif self.size_bytes > message_size_bytes_max + CLIENT_ENTRY_OVERHEAD_BYTES_MAX:
            return MessageTooLarge(f"entry of {self.size_bytes} bytes exceeds {message_size_bytes_max} bytes")
        return None


def entry_of_messages(messages: Sequence[Message], *, sequence_id: int | None = None,
                      compression: Compression = Compression.NONE,
                      deliver_at_time_ms: int | None = None) -> PreparedEntry:
    """One entry holding ``messages`` (a batch, compressed as asked). ``sequence_id`` is the
    first message's when the first message has none of its own (None: the producer's next)."""
    if not messages:
        raise InvalidRequest("a publish needs at least one message")
    own = messages[0].sequence_id
    first = own if own is not None else sequence_id
    size = max(len(m.payload) for m in messages)
    return PreparedEntry(None, messages, len(messages), tuple(m.key for m in messages), first, None, False,
                         compression, deliver_at_time_ms, size, keys_of_messages([m.properties for m in messages]))


def entries_of_messages(messages: Sequence[Message], sequence_ids: Sequence[int | None], *,
                        compression: Compression = Compression.NONE) -> list[PreparedEntry]:
    """Each of ``messages`` as an entry of its own, with its sequence id (None: the producer's
    next); encoded here when it is known."""
    entries: list[PreparedEntry] = []
    for message, given in zip(messages, sequence_ids, strict=True):
        own = message.sequence_id
        first = own if own is not None else given
        entries.append(PreparedEntry(None, (message,), 1, (message.key,), first, first, False, compression, None,
                                     len(message.payload), keys_of_messages((message.properties,))))
    return entries


def entry_of_client(data: bytes, declared_messages: int, sequence_id: int, highest_sequence_id: int, *,
                    encryption_required: bool = False) -> PreparedEntry:
    """A binary-protocol client's own entry, checked in full (see the module's invariants) and
    stored as it is. ``highest_sequence_id`` below ``sequence_id`` means the client gave none
    (an old client): the entry's messages then number on from ``sequence_id``. With
    ``encryption_required`` (the namespace's policy) an entry without encryption keys is
    ``EncryptionRequired``, as Pulsar refuses it ("Messages must be encrypted")."""
    common = common_client_entry(data)
    if encryption_required and (common is not None or not decode_entry_payload(data).metadata.encryption_keys):
        raise EncryptionRequired("Messages must be encrypted")
    dcb: tuple[frozenset[bytes], ...] = ()
    if common is not None:  # the usual entry, verified without the general parser
        keys: tuple[str | None, ...] = common[1]
        partial = False
        if MARK in data:  # it may hold DCB events: their properties are read as the general parser reads them
            _, _, dcb = _check_any_client_entry(data)
    else:
        keys, partial, dcb = _check_any_client_entry(data)
    if len(keys) != declared_messages:
        raise InvalidRequest(f"the entry holds {len(keys)} messages, the command declares {declared_messages}")
    highest = highest_sequence_id if highest_sequence_id >= sequence_id else sequence_id + max(declared_messages, 1) - 1
    if not 0 <= sequence_id <= highest <= SEQUENCE_ID_MAX:
        raise InvalidRequest(f"sequence ids must lie in 0..{SEQUENCE_ID_MAX} and the highest must not be below "
                             f"the first, not {sequence_id}..{highest}")
    return PreparedEntry(data, (), len(keys), keys, sequence_id, highest, partial, Compression.NONE, None, len(data),
                         dcb)


def _check_any_client_entry(data: bytes) -> tuple[tuple[str | None, ...], bool, tuple[frozenset[bytes], ...]]:
    """(each message's key, whether the entry is a chunk other than its message's last, each
    message's derived streams)."""
    entry = decode_entry_payload(data)
    if entry.broker_metadata is not None:
        raise InvalidRequest("a client's entry must not carry broker entry metadata")
    metadata = entry.metadata
    keys: tuple[str | None, ...]
    messages = split_entry_payload(entry).messages if entry.is_batched or MARK in data else None
    if entry.is_batched and messages is not None:
        keys = tuple(m.key for m in messages)
    else:
        keys = (metadata.partition_key if metadata.HasField("partition_key") else None,)
    dcb = keys_of_messages([m.properties for m in messages]) if messages is not None else ()
    if not (metadata.HasField("chunk_id") and metadata.HasField("num_chunks_from_msg")):
        return keys, False, dcb
    chunks, chunk_id = int(metadata.num_chunks_from_msg), int(metadata.chunk_id)
    if not 0 <= chunk_id < chunks:
        raise InvalidRequest(f"chunk {chunk_id} of a message of {chunks} chunks")
    if dcb:  # each chunk would be indexed, and answered, as an event of its own
        raise InvalidRequest(f"a DCB event ({TYPE_PROPERTY} property) cannot be sent in chunks; send it whole "
                             "(below maxMessageSize) or without chunking")
    return keys, chunk_id < chunks - 1, dcb
