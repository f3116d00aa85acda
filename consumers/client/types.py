"""Value types of the client: topics, message ids, sent and received messages.

Invariants: a ``message_id`` is always Pulsar's WebSocket form, standard base64 of a serialized
``MessageIdData`` (``CAAQAw==`` is ledger 0, entry 3), whether it came over WebSocket or REST
(REST's ``"ledger:entry:partition[:batch]"`` is converted), so ids from either path compare and
can be passed back to the broker. ``MessageIdParts`` orders ids by (ledger, entry, batch index),
the order the broker stores them in one partition. Times are epoch milliseconds (UTC).
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from dataclasses import dataclass, field
from datetime import UTC, datetime

DEFAULT_NAMESPACE = "public/default"
PARTITION_SUFFIX = "-partition-"
MESSAGE_ID_TEXT_LEN_MAX = 256

_UINT64_MOD = 1 << 64
_INT64_MAX = (1 << 63) - 1
_VARINT_BYTES_MAX = 10
# MessageIdData field numbers (Pulsar's PulsarApi.proto)
_LEDGER_ID, _ENTRY_ID, _PARTITION, _BATCH_INDEX = 1, 2, 3, 4
_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LENGTH, _WIRE_FIXED32 = 0, 1, 2, 5


# --- topics ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Topic:
    """``persistent://tenant/namespace/local``; short names mean ``public/default``, as in Pulsar."""

    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, name: str) -> Topic:
        text = name.strip()
        if "://" in text:
            domain, _, text = text.partition("://")
            if domain != "persistent":
                raise ValueError(f"topic {name!r}: only persistent:// topics are supported")
        parts = text.split("/")
        if len(parts) == 1 and parts[0]:
            parts = [*DEFAULT_NAMESPACE.split("/"), parts[0]]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"invalid topic {name!r}: expected topic, tenant/namespace/topic or "
                             "persistent://tenant/namespace/topic")
        return cls(*parts)

    @property
    def full_name(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def path(self) -> str:
        """``persistent/{tenant}/{namespace}/{local}`` with each segment URL-quoted."""
        return "persistent/" + "/".join(urllib.parse.quote(p, safe="") for p in
                                        (self.tenant, self.namespace, self.local))

    def partition(self, index: int) -> Topic:
        return Topic(self.tenant, self.namespace, f"{self.local}{PARTITION_SUFFIX}{index}") if index >= 0 else self


# --- message ids -------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class MessageIdParts:
    """A decoded message id; ``-1`` partition / batch index mean "none", as in Pulsar."""

    ledger_id: int
    entry_id: int
    batch_index: int = -1
    partition: int = field(default=-1, compare=False)

    @classmethod
    def from_base64(cls, text: str) -> MessageIdParts:
        stripped = text.strip()
        if not stripped or len(stripped) > MESSAGE_ID_TEXT_LEN_MAX:
            raise ValueError(f"message id {text!r} is not a base64 MessageIdData")
        normalized = stripped.replace("-", "+").replace("_", "/")
        try:
            raw = base64.b64decode(normalized + "=" * (-len(normalized) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"message id {text!r} is not valid base64") from None
        fields = _decode_varint_fields(raw)
        if _LEDGER_ID not in fields or _ENTRY_ID not in fields:
            raise ValueError(f"message id {text!r} lacks a ledger or entry id")
        return cls(ledger_id=_signed(fields[_LEDGER_ID]), entry_id=_signed(fields[_ENTRY_ID]),
                   batch_index=_signed(fields.get(_BATCH_INDEX, _UINT64_MOD - 1)),
                   partition=_signed(fields.get(_PARTITION, _UINT64_MOD - 1)))

    @classmethod
    def parse(cls, text: str) -> MessageIdParts:
        """``ledger:entry[:partition[:batch]]`` or base64 ``MessageIdData``."""
        if ":" not in text:
            return cls.from_base64(text)
        parts = text.strip().split(":")
        if not 2 <= len(parts) <= 4:
            raise ValueError(f"message id {text!r} must look like ledger:entry[:partition[:batchIndex]]")
        try:
            numbers = [int(p) for p in parts] + [-1] * (4 - len(parts))
        except ValueError:
            raise ValueError(f"message id {text!r} has a non-integer part") from None
        return cls(ledger_id=numbers[0], entry_id=numbers[1], partition=numbers[2], batch_index=numbers[3])

    def to_base64(self) -> str:
        """Serialize the way the broker does: defaults (-1 partition / batch index) omitted."""
        out = bytearray()
        for number, value in ((_LEDGER_ID, self.ledger_id), (_ENTRY_ID, self.entry_id),
                              (_PARTITION, self.partition), (_BATCH_INDEX, self.batch_index)):
            if number in (_LEDGER_ID, _ENTRY_ID) or value >= 0:
                out += _varint(number << 3 | _WIRE_VARINT) + _varint(value % _UINT64_MOD)
        return base64.b64encode(bytes(out)).decode("ascii")

    def __str__(self) -> str:
        text = f"{self.ledger_id}:{self.entry_id}:{self.partition}"
        return f"{text}:{self.batch_index}" if self.batch_index >= 0 else text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(raw: bytes, index: int) -> tuple[int, int]:
    value = shift = 0
    for count in range(_VARINT_BYTES_MAX):
        if index + count >= len(raw):
            break
        byte = raw[index + count]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, index + count + 1
    raise ValueError("message id has a truncated or overlong varint")


def _decode_varint_fields(raw: bytes) -> dict[int, int]:
    """The varint fields of a protobuf message; other wire types are skipped."""
    fields: dict[int, int] = {}
    index = 0
    while index < len(raw):
        tag, index = _read_varint(raw, index)
        number, wire = tag >> 3, tag & 7
        if wire == _WIRE_VARINT:
            fields[number], index = _read_varint(raw, index)
        elif wire == _WIRE_LENGTH:
            length, index = _read_varint(raw, index)
            index += length
        elif wire in (_WIRE_FIXED64, _WIRE_FIXED32):
            index += 8 if wire == _WIRE_FIXED64 else 4
        else:
            raise ValueError(f"message id has an unsupported wire type {wire}")
    if index != len(raw):
        raise ValueError("message id is truncated")
    return fields


def _signed(value: int) -> int:
    value %= _UINT64_MOD
    return value - _UINT64_MOD if value > _INT64_MAX else value


# --- messages ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SendResult:
    """Where a published message was stored: its id and its partition offset."""

    message_id: str
    offset: int | None
    duplicate: bool = False
    """A deduplicated resend: acknowledged, not stored again (id ``-1:-1``, no offset)."""
    key_version: int | None = None
    """The message's version in its key's event stream (None: no key)."""

    @property
    def parts(self) -> MessageIdParts:
        return MessageIdParts.from_base64(self.message_id)


@dataclass(frozen=True)
class Message:
    """A received message."""

    data: bytes
    message_id: str
    offset: int | None
    key: str | None
    properties: dict[str, str]
    publish_time_ms: int | None
    event_time_ms: int | None
    redelivery_count: int
    topic: str | None
    """The topic (partition) it came from; None on a multi-topic consumer."""
    key_version: int | None = None
    """Its version in its key's event stream, when read from a stream."""

    @property
    def parts(self) -> MessageIdParts:
        return MessageIdParts.from_base64(self.message_id)


@dataclass(frozen=True)
class AppendResult:
    """Where an append to a key's event stream went: the versions and offsets it got."""

    key: str
    first_version: int
    version: int
    """The stream's version after the append (its last event's)."""
    offsets: list[int]
    message_ids: list[str]
    duplicate: bool = False
    """A resend of the producer's last append, answered with its first results."""


@dataclass(frozen=True)
class StreamInfo:
    """Where a key's event stream stands (version -1: no event yet)."""

    key: str
    version: int
    partition: int
    first_version: int
    """The first version retention kept."""
    first_offset: int | None
    last_offset: int | None


@dataclass(frozen=True)
class StreamBatch:
    """Events of one stream, in the order read, and where the next read starts."""

    key: str
    version: int
    first_version: int
    next_version: int
    messages: list[Message]


def epoch_ms(value: object) -> int | None:
    """Epoch milliseconds of a frame's time field: a number or ISO-8601 text (``...Z``)."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return int((stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp() * 1000)
    return None


def iso_time(epoch_ms_value: int) -> str:
    """Pulsar's WebSocket timestamps: ISO-8601 with milliseconds, UTC."""
    text = datetime.fromtimestamp(epoch_ms_value / 1000, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")
