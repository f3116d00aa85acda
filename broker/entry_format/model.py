"""The value types of the entry format: messages to write, messages and entries read back.

Role: ``Message`` is what the produce path builds (a named tuple: cheap), ``DecodedMessage``
and ``DecodedEntry`` what readers get; ``EntryPayload`` is a verified entry whose payload is not
yet split (the native range-read columns split it themselves). ``EncryptionContext`` is what a
consumer needs to decrypt an end-to-end encrypted entry itself (Pulsar's ``encryptionContext``).

Invariant: an encrypted entry is opaque. Its ``N`` messages decode as ``N`` messages carrying the
clear ``MessageMetadata``'s key, properties and times (so offsets, keys and sequence ids stay
whole for every reader), the first one holding the whole stored payload (ciphertext, as the
producer compressed and encrypted it) and the others none, marked ``compacted_out``: they are
carried by the first.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from broker.entry_format.compression import Compression
from broker.proto import pulsar_entry_pb2 as pb

_EMPTY_PROPERTIES: Mapping[str, str] = MappingProxyType({})

class Message(NamedTuple):
    """One message to write. Immutable (a named tuple: cheap to build on the produce path).

    ``key`` is Pulsar's partition key (``key_b64_encoded`` says it holds base64 of binary
    key bytes); ``ordering_key`` overrides it for Key_Shared ordering. ``null_value`` marks a
    null payload (``payload`` must then be empty); ``null_key`` a key that was explicitly null.
    ``compacted_out`` is set by compaction only.
    """

    payload: bytes
    key: str | None = None
    properties: Mapping[str, str] = _EMPTY_PROPERTIES
    event_time_ms: int | None = None
    sequence_id: int | None = None
    ordering_key: bytes | None = None
    key_b64_encoded: bool = False
    null_value: bool = False
    null_key: bool = False
    compacted_out: bool = False

class DecodedMessage(NamedTuple):
    """One message read from an entry.

    ``batch_index`` is the position in the batch, or -1 for a non-batched entry. ``offset`` is
    derived from the broker entry metadata index (None when the entry has none).
    ``event_time_ms`` is None when the producer set none. ``compacted_out`` also marks the
    messages of an encrypted entry after its first, which carries them (see the module's invariant).
    """

    batch_index: int
    offset: int | None
    payload: bytes
    key: str | None
    properties: dict[str, str]
    event_time_ms: int | None
    sequence_id: int | None
    ordering_key: bytes | None
    key_b64_encoded: bool
    null_value: bool
    null_key: bool
    compacted_out: bool

@dataclass(frozen=True, slots=True)
class EncryptionKey:
    """One encrypted data key of an entry: the name the producer's key reader gave, the data key
    encrypted with that key, and the key's metadata."""

    name: str
    value: bytes
    metadata: Mapping[str, str]

@dataclass(frozen=True, slots=True)
class EncryptionContext:
    """How an end-to-end encrypted entry was encrypted, from its clear ``MessageMetadata``:
    what a consumer without the broker's help needs to decrypt the stored payload."""

    keys: tuple[EncryptionKey, ...]
    param: bytes
    """The cipher's initialization vector."""
    algorithm: str | None
    compression: Compression
    """How the payload was compressed before it was encrypted."""
    uncompressed_size_bytes: int
    batch_size: int | None
    """How many messages the encrypted payload holds when it is a batch, else None."""

    def as_json(self) -> dict[str, Any]:
        """Pulsar's WebSocket ``encryptionContext`` (bytes in base64; ``algorithm`` and
        ``batchSize`` only when set), which Magnetar's REST consumers and readers give too."""
        shown: dict[str, Any] = {
            "keys": {k.name: {"keyValue": base64.b64encode(k.value).decode("ascii"), "metadata": dict(k.metadata)}
                     for k in self.keys},
            "param": base64.b64encode(self.param).decode("ascii"),
            "compressionType": self.compression.name,
            "uncompressedMessageSize": self.uncompressed_size_bytes,
        }
        if self.algorithm is not None:
            shown["algorithm"] = self.algorithm
        if self.batch_size is not None:
            shown["batchSize"] = self.batch_size
        return shown

@dataclass(frozen=True, slots=True)
class BrokerEntryMetadata:
    """The broker's prefix: publish time at the broker, and the offset of the entry's LAST message."""

    broker_timestamp_ms: int
    index: int

@dataclass(slots=True, eq=False)
class EntryPayload:
    """A verified entry whose payload is decompressed but not split into messages. Not frozen
    (a frozen dataclass costs a microsecond more to build, once per entry read or received);
    treat it as a value.

    ``payload`` is the uncompressed payload: for a batched entry the messages in the batch
    format, else the one message's bytes (a view into the entry when it was not compressed).
    ``num_messages`` is the metadata's ``num_messages_in_batch`` as stored (not yet checked
    against the payload), 1 for a non-batched entry.
    """

    broker_metadata: BrokerEntryMetadata | None
    metadata: pb.MessageMetadata
    compression: Compression
    payload: bytes | memoryview
    is_batched: bool
    num_messages: int
    first_offset: int | None
    encryption: EncryptionContext | None = None
    """Set for an end-to-end encrypted entry, whose ``payload`` is then the stored ciphertext."""

@dataclass(frozen=True, slots=True)
class DecodedEntry:
    """A decoded entry: broker metadata, the entry-level ``MessageMetadata``, and its messages.

    Entry-level values are read from ``metadata`` on access (most readers need only the
    messages). ``metadata`` is the parsed protobuf, also for fields not surfaced here
    (replication, chunking, transactions, uuid, ...); treat it as read-only.
    """

    broker_metadata: BrokerEntryMetadata | None
    metadata: pb.MessageMetadata
    compression: Compression
    uncompressed_size_bytes: int
    messages: list[DecodedMessage]
    encryption: EncryptionContext | None = None
    """Set for an end-to-end encrypted entry (see the module's invariant)."""

    @property
    def broker_timestamp_ms(self) -> int | None:
        return None if self.broker_metadata is None else self.broker_metadata.broker_timestamp_ms

    @property
    def index(self) -> int | None:
        """Pulsar's broker index: the offset of the LAST message; None without a prefix."""
        return None if self.broker_metadata is None else self.broker_metadata.index

    @property
    def num_messages(self) -> int:
        return len(self.messages)

    @property
    def first_offset(self) -> int | None:
        """Offset of the first message (``index - num_messages + 1``), None without an index."""
        index = self.index
        return None if index is None else index - len(self.messages) + 1

    @property
    def is_batched(self) -> bool:
        """True for the batch format (``num_messages_in_batch`` present), which we always write."""
        return bool(self.metadata.HasField("num_messages_in_batch"))

    @property
    def producer_name(self) -> str:
        return str(self.metadata.producer_name)

    @property
    def sequence_id(self) -> int:
        return int(self.metadata.sequence_id)

    @property
    def highest_sequence_id(self) -> int | None:
        return self._optional_int("highest_sequence_id")

    @property
    def publish_time_ms(self) -> int:
        return int(self.metadata.publish_time)

    @property
    def event_time_ms(self) -> int | None:
        return self._optional_int("event_time")

    @property
    def deliver_at_time_ms(self) -> int | None:
        return self._optional_int("deliver_at_time")

    @property
    def partition_key(self) -> str | None:
        return str(self.metadata.partition_key) if self.metadata.HasField("partition_key") else None

    @property
    def ordering_key(self) -> bytes | None:
        return bytes(self.metadata.ordering_key) if self.metadata.HasField("ordering_key") else None

    @property
    def schema_version(self) -> bytes | None:
        return bytes(self.metadata.schema_version) if self.metadata.HasField("schema_version") else None

    def _optional_int(self, field: str) -> int | None:
        return int(getattr(self.metadata, field)) if self.metadata.HasField(field) else None
