"""Verify and decode one stored entry: prefix, checksum, metadata, decompression, messages.

Role: ``decode_entry_payload`` verifies an entry (broker prefix, checksum, ``MessageMetadata``,
encryption, decompression, broker index) without splitting it; ``split_entry_payload`` splits
a verified payload into messages; ``decode_entry`` is the two together. ``message_count`` reads
the count alone, cheaply. Readers of the broker's own common entries go through
``common_entry.py`` first, which falls back here for anything else. See the package docstring
for the layout.

Invariants: nothing malformed or checksum-failing decodes (``CorruptEntry``, never garbage).
An end-to-end encrypted entry is checked as far as the broker can read it (prefix, checksum,
``MessageMetadata``, a known compression, the message count) and is otherwise opaque: its
payload is neither decompressed nor split, and it decodes as ``model.py`` says (one message
holding the stored payload, carrying the others), with its ``EncryptionContext``.
"""

from __future__ import annotations

import crc32c
from google.protobuf.message import DecodeError

from broker.entry_format.batch import decode_batch
from broker.entry_format.broker_metadata import split_prefix
from broker.entry_format.compression import COMPRESSIONS, Compression, decompress
from broker.entry_format.model import (
    DecodedEntry,
    DecodedMessage,
    EncryptionContext,
    EncryptionKey,
    EntryPayload,
)
from broker.entry_format.wire import CHECKSUM_HEADER, MAGIC_CRC32C, Buffer
from broker.errors import CorruptEntry
from broker.proto import pulsar_entry_pb2 as pb


def message_count(data: Buffer) -> int:
    """Number of messages in an encoded entry, from its ``MessageMetadata`` alone.

    Cheap (no checksum verification, no decompression); use :func:`decode_entry` to verify.
    Raises ``CorruptEntry`` when the entry's structure is malformed.
    """
    start = split_prefix(data)[1]
    if len(data) - start < CHECKSUM_HEADER.size:
        raise CorruptEntry(f"entry of {len(data)} bytes is too short")
    magic, _, metadata_size = CHECKSUM_HEADER.unpack_from(data, start)
    if magic != MAGIC_CRC32C:
        raise CorruptEntry(f"entry does not start with the checksum magic 0x0e01 (found {magic:#06x})")
    metadata_start = start + CHECKSUM_HEADER.size
    if metadata_start + metadata_size > len(data):
        raise CorruptEntry(f"MessageMetadata of {metadata_size} bytes runs past the {len(data)}-byte entry")
    metadata = parse_metadata(bytes(data[metadata_start : metadata_start + metadata_size]))
    count: int = metadata.num_messages_in_batch
    if count <= 0:
        raise CorruptEntry(f"entry declares {count} messages")
    return count

def parse_metadata(raw: bytes) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata()
    try:
        metadata.ParseFromString(raw)
    except (DecodeError, ValueError) as exc:
        raise CorruptEntry(f"malformed MessageMetadata: {exc}") from None
    if not metadata.IsInitialized():
        missing = ", ".join(metadata.FindInitializationErrors())
        raise CorruptEntry(f"MessageMetadata lacks required fields: {missing}")
    return metadata

def _verified_metadata_and_payload(data: bytes, start: int) -> tuple[pb.MessageMetadata, memoryview]:
    if len(data) - start < CHECKSUM_HEADER.size:
        raise CorruptEntry(f"entry of {len(data)} bytes is too short")
    magic, stored_checksum, metadata_size = CHECKSUM_HEADER.unpack_from(data, start)
    if magic != MAGIC_CRC32C:
        raise CorruptEntry(f"entry does not start with the checksum magic 0x0e01 (found {magic:#06x})")
    view = memoryview(data)
    checksum = crc32c.crc32c(view[start + 6 :])
    if checksum != stored_checksum:
        raise CorruptEntry(f"entry checksum mismatch: stored {stored_checksum:#010x}, computed {checksum:#010x}")
    metadata_start = start + CHECKSUM_HEADER.size
    payload_start = metadata_start + metadata_size
    if payload_start > len(data):
        raise CorruptEntry(f"MessageMetadata of {metadata_size} bytes runs past the {len(data)}-byte entry")
    metadata = parse_metadata(data[metadata_start:payload_start])
    return metadata, view[payload_start:]

def _single_message(metadata: pb.MessageMetadata, payload: bytes, offset: int | None) -> DecodedMessage:
    has = metadata.HasField
    return DecodedMessage(
        batch_index=-1,
        offset=offset,
        payload=payload,
        key=metadata.partition_key if has("partition_key") else None,
        properties={kv.key: kv.value for kv in metadata.properties},
        event_time_ms=metadata.event_time if has("event_time") else None,
        sequence_id=metadata.sequence_id,
        ordering_key=metadata.ordering_key if has("ordering_key") else None,
        key_b64_encoded=metadata.partition_key_b64_encoded,
        null_value=metadata.null_value,
        null_key=metadata.null_partition_key,
        compacted_out=False,
    )

def _first_offset(index: int, count: int) -> int:
    first = index - count + 1
    if first < 0:
        raise CorruptEntry(f"broker index {index} is too small for an entry of {count} messages")
    return first

def decode_entry_payload(data: Buffer) -> EntryPayload:
    """Verify one stored entry and decompress its payload, without splitting it into messages.

    Everything :func:`decode_entry` checks before it splits the batch is checked here
    (prefix, checksum, ``MessageMetadata``, encryption, decompression, broker index), so a
    reader that splits the payload itself (the native range-read columns) is as strict.
    Raises ``CorruptEntry`` for anything malformed. An encrypted entry's payload is the stored
    ciphertext, with its ``encryption`` context.
    """
    raw = data if isinstance(data, bytes) else bytes(data)
    broker, start = split_prefix(raw)
    metadata, compressed = _verified_metadata_and_payload(raw, start)
    code = metadata.compression
    if not 0 <= code < len(COMPRESSIONS):
        raise CorruptEntry(f"unknown compression type {code}")
    compression = COMPRESSIONS[code]
    is_batched = metadata.HasField("num_messages_in_batch")
    count = metadata.num_messages_in_batch if is_batched else 1
    first_offset = None if broker is None else _first_offset(broker.index, count)
    encryption = encryption_context(metadata)
    if encryption is not None and count <= 0:  # a batch the broker splits says so itself
        raise CorruptEntry(f"entry declares {count} messages")
    payload: bytes | memoryview
    if compression is Compression.NONE or encryption is not None:
        payload = compressed
    else:
        payload = decompress(compression, compressed, metadata.uncompressed_size)
    return EntryPayload(broker, metadata, compression, payload, is_batched, count, first_offset, encryption)


def encryption_context(metadata: pb.MessageMetadata) -> EncryptionContext | None:
    """The encryption context of an entry's ``MessageMetadata``, None when it is not encrypted."""
    if not metadata.encryption_keys:
        return None
    keys = tuple(EncryptionKey(k.key, bytes(k.value), {kv.key: kv.value for kv in k.metadata})
                 for k in metadata.encryption_keys)
    batched = metadata.HasField("num_messages_in_batch")
    return EncryptionContext(keys, bytes(metadata.encryption_param),
                             metadata.encryption_algo if metadata.HasField("encryption_algo") else None,
                             COMPRESSIONS[metadata.compression], metadata.uncompressed_size,
                             metadata.num_messages_in_batch if batched else None)

def decode_entry(data: Buffer) -> DecodedEntry:
    """Verify and decode one stored entry. Raises ``CorruptEntry`` for anything malformed."""
    return split_entry_payload(decode_entry_payload(data))

def split_entry_payload(entry: EntryPayload) -> DecodedEntry:
    """The messages of an entry :func:`decode_entry_payload` verified (``CorruptEntry`` when its
    batch is malformed)."""
    payload = entry.payload if isinstance(entry.payload, bytes) else entry.payload.tobytes()
    if entry.encryption is not None:
        messages = _opaque_messages(entry, payload)
    elif entry.is_batched:
        messages = decode_batch(payload, entry.num_messages, entry.first_offset, entry.metadata.sequence_id)
    else:
        messages = [_single_message(entry.metadata, payload, entry.first_offset)]
    return DecodedEntry(entry.broker_metadata, entry.metadata, entry.compression, len(payload), messages,
                        entry.encryption)


def _opaque_messages(entry: EntryPayload, payload: bytes) -> list[DecodedMessage]:
    """An encrypted entry's messages (see ``model.py``): the first holds the stored payload and
    carries the others, each with the clear metadata's key, properties and times."""
    first = _single_message(entry.metadata, payload, entry.first_offset)
    if not entry.is_batched:
        return [first]
    offset, sequence_id = entry.first_offset, entry.metadata.sequence_id
    return [first._replace(batch_index=0)] + [
        first._replace(batch_index=i, offset=None if offset is None else offset + i, payload=b"",
                       sequence_id=sequence_id + i, compacted_out=True)
        for i in range(1, entry.num_messages)]
