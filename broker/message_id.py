"""Message ids and managed-ledger positions, with Pulsar's text and binary forms.

Role: every stored message is addressed by ``MessageId(ledger_id, entry_id, partition,
batch_index)``; the API layer renders it as Pulsar does: base64 of a serialized
``MessageIdData`` on WebSocket (``CAAQAw==`` is ledger 0, entry 3) and ``"ledger:entry:partition"``
in REST produce results. ``Position`` is a bare (ledger, entry) address inside a managed ledger.

Invariants:
- ``partition == -1`` means "not a partition of a partitioned topic"; ``batch_index == -1``
  means "the whole entry" (a non-batched message). Both are Pulsar's proto defaults and are
  left out of the serialized ``MessageIdData`` when default, exactly as Pulsar's client writes
  them, so ``MessageId(0, 3).to_base64() == "CAAQAw=="``.
- Ledger and entry ids are Java longs in Pulsar (``-1`` is used for "earliest" sentinels and
  ``2**63 - 1`` for "latest"); they are written as uint64 two's complement, as Java does.
- Ordering is by (ledger_id, entry_id, batch_index); partition breaks ties only so that
  ordering agrees with equality (ids of different partitions are not meaningfully ordered).
- Bad input raises ``InvalidRequest`` (HTTP 400) with a message saying what was wrong.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from broker.entry_format.wire import encode_varint
from broker.errors import InvalidRequest
from broker.limits import MESSAGE_ID_TEXT_CHARS_MAX
from broker.proto.pulsar_entry_pb2 import MessageIdData

__all__ = ["MessageId", "Position", "message_id_bytes"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MOD = 1 << 64
_INT32_MAX = (1 << 31) - 1


def _check_long(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer, got {type(value).__name__}")
    if not -1 <= value <= _INT64_MAX:
        raise InvalidRequest(f"{name} must be between -1 and {_INT64_MAX}, got {value}")


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer, got {type(value).__name__}")
    if not -1 <= value <= _INT32_MAX:
        raise InvalidRequest(f"{name} must be between -1 and {_INT32_MAX}, got {value}")


def _to_uint64(value: int) -> int:
    return value % _UINT64_MOD


def message_id_bytes(ledger_id: int, entry_id: int, partition: int = -1, batch_index: int = -1,
                     batch_size: int | None = None) -> bytes:
    """``MessageId(...).to_bytes(batch_size=...)`` for values already known to be valid (the
    broker's own positions), without building the id."""
    data = b"\x08" + encode_varint(_to_uint64(ledger_id)) + b"\x10" + encode_varint(_to_uint64(entry_id))
    if partition >= 0:
        data += b"\x18" + encode_varint(partition)
    if batch_index >= 0:
        data += b"\x20" + encode_varint(batch_index)
    if batch_size is not None:
        data += b"\x30" + encode_varint(_to_uint64(batch_size))  # a negative int32 is sign-extended
    return data


_BATCH_INDEX_TAG = b"\x20"  # MessageIdData field 4 (batch_index), varint
_BATCH_INDEX_SUFFIXES: list[bytes] = []
"""``MessageIdData`` field 4 (batch_index) for index ``i``, built once per index ever needed."""


def _batch_index_suffixes(stop: int) -> list[bytes]:
    suffixes = _BATCH_INDEX_SUFFIXES
    if len(suffixes) < stop:  # appends only: a concurrent reader sees a valid prefix of the table
        suffixes.extend(_BATCH_INDEX_TAG + encode_varint(i) for i in range(len(suffixes), stop))
    return suffixes


def message_ids_of_entry(ledger_id: int, entry_id: int, partition: int, count: int, start: int = 0,
                         stop: int | None = None) -> list[bytes]:
    """Base64 ``MessageIdData`` (ASCII bytes) of messages ``start..stop`` of one entry of ``count``
    messages, equal to ``MessageId.to_base64()``.

    The entry's fields are serialized once; batch index is the last field written, so each
    message's id is that prefix plus its batch index (a lone message has none, as in Pulsar).
    """
    prefix = message_id_bytes(ledger_id, entry_id, partition)
    if count == 1:
        return [binascii.b2a_base64(prefix, newline=False)]
    stop = count if stop is None else stop
    b2a = binascii.b2a_base64
    return [b2a(prefix + suffix, newline=False) for suffix in _batch_index_suffixes(stop)[start:stop]]


def _to_int64(value: int) -> int:
    return value - _UINT64_MOD if value > _INT64_MAX else value


@dataclass(frozen=True, slots=True)
class Position:
    """A managed-ledger position: one entry of one ledger. Ordered by (ledger_id, entry_id).

    ``entry_id == -1`` is legal and means "before the first entry of the ledger" (Pulsar's
    ``3:-1`` in internalStats).
    """

    ledger_id: int
    entry_id: int

    def __post_init__(self) -> None:
        _check_long("ledger_id", self.ledger_id)
        _check_long("entry_id", self.entry_id)

    @classmethod
    def of_stored(cls, ledger_id: int, entry_id: int) -> Position:
        """The position of an entry the broker read from its own storage, whose ids are in range
        by construction: built without the checks of ``__init__`` (one position per entry read)."""
        position = _new_message_id(cls)
        _set(position, "ledger_id", ledger_id)
        _set(position, "entry_id", entry_id)
        return position

    def __lt__(self, other: Position) -> bool:
        return (self.ledger_id, self.entry_id) < (other.ledger_id, other.entry_id)

    def __le__(self, other: Position) -> bool:
        return (self.ledger_id, self.entry_id) <= (other.ledger_id, other.entry_id)

    def __gt__(self, other: Position) -> bool:
        return (self.ledger_id, self.entry_id) > (other.ledger_id, other.entry_id)

    def __ge__(self, other: Position) -> bool:
        return (self.ledger_id, self.entry_id) >= (other.ledger_id, other.entry_id)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


_new_message_id = object.__new__
_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class MessageId:
    """The id of one message: its entry, the topic partition, and its index in the entry's batch."""

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1

    def __post_init__(self) -> None:
        _check_long("ledger_id", self.ledger_id)
        _check_long("entry_id", self.entry_id)
        _check_int("partition", self.partition)
        _check_int("batch_index", self.batch_index)

    @classmethod
    def of_stored(cls, ledger_id: int, entry_id: int, partition: int, batch_index: int) -> MessageId:
        """The id of a message the broker read from its own storage, whose parts are in range
        by construction: built without the checks of ``__init__`` (one id per message read)."""
        message_id = _new_message_id(cls)
        _set(message_id, "ledger_id", ledger_id)
        _set(message_id, "entry_id", entry_id)
        _set(message_id, "partition", partition)
        _set(message_id, "batch_index", batch_index)
        return message_id

    # -- ordering ---------------------------------------------------------------------------

    def _sort_key(self) -> tuple[int, int, int, int]:
        return (self.ledger_id, self.entry_id, self.batch_index, self.partition)

    def __lt__(self, other: MessageId) -> bool:
        return self._sort_key() < other._sort_key()

    def __le__(self, other: MessageId) -> bool:
        return self._sort_key() <= other._sort_key()

    def __gt__(self, other: MessageId) -> bool:
        return self._sort_key() > other._sort_key()

    def __ge__(self, other: MessageId) -> bool:
        return self._sort_key() >= other._sort_key()

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id)

    # -- binary form (WebSocket) -------------------------------------------------------------

    def to_bytes(self, *, batch_size: int | None = None) -> bytes:
        """Serialize as Pulsar's ``MessageIdData``; defaults (-1) are omitted, as Pulsar does.

        ``batch_size`` (the number of messages in the entry) is written only when given: Pulsar
        uses it for batch-index acknowledgement; ids without it are equally valid.

        Written by hand (one id per delivered message and per publish result): the bytes are
        exactly protobuf's, fields in number order, negative ``int32`` values as the ten-byte
        two's-complement varint protobuf writes.
        """
        if batch_size is not None:
            _check_int("batch_size", batch_size)
        return message_id_bytes(self.ledger_id, self.entry_id, self.partition, self.batch_index, batch_size)

    def to_base64(self, *, batch_size: int | None = None) -> str:
        """Pulsar's WebSocket message id: standard base64 (with padding) of :meth:`to_bytes`."""
        return base64.b64encode(self.to_bytes(batch_size=batch_size)).decode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes) -> MessageId:
        """Parse a serialized ``MessageIdData``; ack sets, batch size and chunk ids are ignored."""
        parsed = MessageIdData()
        try:
            parsed.ParseFromString(data)
        except (DecodeError, ValueError):
            raise InvalidRequest("message id is not a valid MessageIdData (base64 of Pulsar's protobuf message id)",
                                 field="messageId") from None
        if not parsed.IsInitialized():
            missing = ", ".join(parsed.FindInitializationErrors())
            raise InvalidRequest(f"message id is not a valid MessageIdData: missing {missing}")
        return cls(
            ledger_id=_to_int64(parsed.ledgerId),
            entry_id=_to_int64(parsed.entryId),
            partition=parsed.partition,
            batch_index=parsed.batch_index,
        )

    @classmethod
    def from_base64(cls, text: str) -> MessageId:
        """Parse Pulsar's base64 message id (standard or URL-safe alphabet, padding optional)."""
        stripped = text.strip()
        if not stripped or len(stripped) > MESSAGE_ID_TEXT_CHARS_MAX:
            raise InvalidRequest(f"message id {text!r} is not a base64 MessageIdData")
        normalized = stripped.replace("-", "+").replace("_", "/")
        normalized += "=" * (-len(normalized) % 4)
        try:
            raw = base64.b64decode(normalized, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"message id {text!r} is not valid base64") from None
        return cls.from_bytes(raw)

    # -- text form (REST) --------------------------------------------------------------------

    def to_rest(self) -> str:
        """Pulsar's REST produce result form ``"ledger:entry:partition"`` (no batch index)."""
        return f"{self.ledger_id}:{self.entry_id}:{self.partition}"

    def __str__(self) -> str:
        if self.batch_index >= 0:
            return f"{self.ledger_id}:{self.entry_id}:{self.partition}:{self.batch_index}"
        return self.to_rest()

    @classmethod
    def parse(cls, text: Any) -> MessageId:
        """Parse ``"l:e"``, ``"l:e:p"``, ``"l:e:p:b"`` or a base64 ``MessageIdData``."""
        if not isinstance(text, str):
            raise InvalidRequest(f"message id must be a string, got {type(text).__name__}")
        if ":" not in text:
            return cls.from_base64(text)
        parts = text.strip().split(":")
        if not 2 <= len(parts) <= 4 or len(text) > MESSAGE_ID_TEXT_CHARS_MAX:
            raise InvalidRequest(
                f"message id {text!r} must look like 'ledger:entry', 'ledger:entry:partition' "
                "or 'ledger:entry:partition:batchIndex'"
            )
        numbers = [_parse_int(text, part) for part in parts]
        return cls(*numbers)


def _parse_int(text: str, part: str) -> int:
    stripped = part.strip()
    body = stripped[1:] if stripped.startswith("-") else stripped
    if not body.isascii() or not body.isdigit():
        raise InvalidRequest(f"message id {text!r} has a non-integer component {part!r}")
    return int(stripped)
