"""The bookie wire protocol: length-prefixed binary frames, sans-I/O (no sockets, no event loop).

Role: ``magnetar bookie`` serves one ``LedgerStorage`` over TCP, and the broker's remote bookie
client speaks to it. Both sides use only this module to turn requests and responses into bytes
and back; the asyncio adapters (``storage/bookie_server.py``, ``broker/bookkeeper/bookie_network.py``) move
the bytes, and tests drive the codec with plain byte strings.

Frame (all integers big-endian)::

    [length u32]  bytes after this field
    [kind u8]     request kind; a response has the kind of its request | 0x80
    [request_id u64]
    request body:  ADD        [ledger u64][flags u8][count u32] ([entry u64][size u32][data])*
                              (flags bit 0: recovery) entries strictly increasing (a run, or a
                              striped ledger's share); a single entry is an ADD of one
                   READ       [ledger u64][entry i64]       entry -1: the last entry stored
                   READ_RANGE [ledger u64][first u64][last u64][entries_max u32][bytes_max u32]
                   FENCE      [ledger u64]
                   DELETE     [ledger u64]
    response body: [status u8] then, for OK:  ADD [entry u64] (the last one);
                   READ [entry u64][data ...];
                   READ_RANGE ([entry u64][size u32][data])*; FENCE, DELETE nothing;
                   for an error: [message utf-8 ...]

Request ids let a client pipeline: responses may come back in any order (an add answers when its
journal group is synced, a read at once). An ADD carries the entries of one writer's group for
this bookie, each exactly as the ledger layer packs it (the bookie never looks inside): they are
stored as one journal item and answered once, when all of them are durable (or refused together).

Invariants: a frame is never longer than ``FRAME_BYTES_MAX``; a decoder fed bytes in arbitrary
pieces yields the same frames as one fed them whole; a malformed frame raises ``ProtocolError``
(the connection is then dropped, never half-read).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum

from storage.errors import (
    CorruptEntry,
    InvalidArgument,
    LedgerFenced,
    MagnetarError,
    NoSuchEntry,
    NoSuchLedger,
    StorageClosed,
    StorageError,
    StorageIOError,
    StorageReadOnly,
    WriteCacheFull,
)
from storage.limits import FRAME_BYTES_MAX

RESPONSE_FLAG = 0x80
FLAG_RECOVERY = 0x01

_LENGTH = struct.Struct(">I")
_HEAD = struct.Struct(">BQ")  # kind, request id
_LEDGER = struct.Struct(">Q")
_ADD = struct.Struct(">QBI")  # ledger, flags, count
_ADD_ITEM = struct.Struct(">QI")
_READ = struct.Struct(">Qq")
_RANGE = struct.Struct(">QQQII")
_STATUS = struct.Struct(">B")
_ENTRY = struct.Struct(">Q")
_RANGE_ITEM = struct.Struct(">QI")


class ProtocolError(StorageError):
    """Bytes on a bookie connection that are not a valid frame; the connection is dropped."""

    code = "bookie_protocol_error"
    http_status = 502


class Kind(IntEnum):
    ADD = 1
    READ = 2
    READ_RANGE = 3
    FENCE = 4
    DELETE = 5


class Status(IntEnum):
    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    CORRUPT = 4
    READ_ONLY = 5
    IO_ERROR = 6
    WRITE_CACHE_FULL = 7
    INVALID = 8
    CLOSED = 9
    ERROR = 10


_ERROR_STATUS: tuple[tuple[type[MagnetarError], Status], ...] = (
    (NoSuchLedger, Status.NO_SUCH_LEDGER),
    (NoSuchEntry, Status.NO_SUCH_ENTRY),
    (LedgerFenced, Status.FENCED),
    (CorruptEntry, Status.CORRUPT),
    (StorageIOError, Status.IO_ERROR),  # before its base class StorageReadOnly
    (StorageReadOnly, Status.READ_ONLY),
    (WriteCacheFull, Status.WRITE_CACHE_FULL),
    (InvalidArgument, Status.INVALID),
    (StorageClosed, Status.CLOSED),
)
_STATUS_ERROR: dict[Status, type[MagnetarError]] = {status: cls for cls, status in _ERROR_STATUS}


def status_of(error: BaseException) -> Status:
    """The status a bookie answers for ``error``."""
    for cls, status in _ERROR_STATUS:
        if isinstance(error, cls):
            return status
    return Status.ERROR


def error_of(status: Status, message: str) -> MagnetarError:
    """The storage error a client raises for a non-OK ``status``."""
    return _STATUS_ERROR.get(status, StorageError)(message)


# --- requests -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    kind: Kind
    request_id: int
    ledger_id: int
    entry_id: int = 0
    """ADD: the first entry; READ: the entry (-1: the last one stored); READ_RANGE: the first."""
    last_entry_id: int = 0
    entries_max: int = 0
    bytes_max: int = 0
    recovery: bool = False
    entry_ids: tuple[int, ...] = ()
    """ADD: the entries' ids, strictly increasing, one per ``datas``."""
    datas: tuple[bytes, ...] = ()


def _frame(kind: int, request_id: int, body_size: int) -> bytes:
    length = _HEAD.size + body_size
    if length > FRAME_BYTES_MAX:
        raise InvalidArgument(f"bookie frame of {length} bytes exceeds {FRAME_BYTES_MAX}")
    return _LENGTH.pack(length) + _HEAD.pack(kind, request_id)


def encode_add(request_id: int, ledger_id: int, entries: Sequence[tuple[int, Sequence[bytes]]], *,
               recovery: bool = False) -> list[bytes]:
    """An ADD of ``entries`` (entry id, the parts of its data), as parts to be written
    together: the data is not copied."""
    parts: list[bytes] = []
    size = _ADD.size
    item = _ADD_ITEM.pack
    for entry_id, data in entries:
        data_size = sum(len(part) for part in data)
        parts.append(item(entry_id, data_size))
        parts.extend(data)
        size += _ADD_ITEM.size + data_size
    flags = FLAG_RECOVERY if recovery else 0
    return [_frame(Kind.ADD, request_id, size) + _ADD.pack(ledger_id, flags, len(entries)), *parts]


def encode_read(request_id: int, ledger_id: int, entry_id: int) -> bytes:
    return _frame(Kind.READ, request_id, _READ.size) + _READ.pack(ledger_id, entry_id)


def encode_read_range(request_id: int, ledger_id: int, first_entry_id: int, last_entry_id: int, *,
                      entries_max: int, bytes_max: int) -> bytes:
    return _frame(Kind.READ_RANGE, request_id, _RANGE.size) + _RANGE.pack(
        ledger_id, first_entry_id, last_entry_id, entries_max, bytes_max)


def encode_ledger_op(kind: Kind, request_id: int, ledger_id: int) -> bytes:
    """A FENCE or DELETE."""
    return _frame(kind, request_id, _LEDGER.size) + _LEDGER.pack(ledger_id)


def decode_request(frame: memoryview) -> Request:
    """A request from one frame's bytes (after the length field)."""
    kind_value, request_id = _unpack(_HEAD, frame, 0)
    body = frame[_HEAD.size :]
    try:
        kind = Kind(kind_value)
    except ValueError:
        raise ProtocolError(f"unknown bookie request kind {kind_value}") from None
    if kind is Kind.ADD:
        return _decode_add(request_id, body)
    if kind is Kind.READ:
        ledger_id, entry_id = _unpack(_READ, body, 0, exact=True)
        return Request(kind, request_id, ledger_id, entry_id)
    if kind is Kind.READ_RANGE:
        ledger_id, first, last, entries_max, bytes_max = _unpack(_RANGE, body, 0, exact=True)
        return Request(kind, request_id, ledger_id, first, last, entries_max, bytes_max)
    (ledger_id,) = _unpack(_LEDGER, body, 0, exact=True)
    return Request(kind, request_id, ledger_id)


def _decode_add(request_id: int, body: memoryview) -> Request:
    ledger_id, flags, count = _unpack(_ADD, body, 0)
    entry_ids: list[int] = []
    datas: list[bytes] = []
    offset = _ADD.size
    end = len(body)
    previous = -1
    for _ in range(count):
        entry_id, size = _unpack(_ADD_ITEM, body, offset)
        offset += _ADD_ITEM.size
        if offset + size > end:
            raise ProtocolError("an ADD entry runs past its frame")
        if entry_id <= previous:
            raise ProtocolError("ADD entry ids must be strictly increasing")
        entry_ids.append(entry_id)
        datas.append(bytes(body[offset : offset + size]))
        offset += size
        previous = entry_id
    if not count or offset != end:
        raise ProtocolError(f"an ADD of {count} entries does not fill its frame of {end} bytes")
    return Request(Kind.ADD, request_id, ledger_id, entry_ids[0], recovery=bool(flags & FLAG_RECOVERY),
                   entry_ids=tuple(entry_ids), datas=tuple(datas))


# --- responses ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    kind: Kind
    request_id: int
    status: Status
    entry_id: int = 0
    data: bytes = b""
    entries: tuple[tuple[int, bytes], ...] = ()
    message: str = ""

    def error(self) -> MagnetarError | None:
        return None if self.status is Status.OK else error_of(self.status, self.message)


def encode_ok(kind: Kind, request_id: int, *, entry_id: int | None = None, data: bytes = b"") -> list[bytes]:
    """An OK response: ADD carries the entry id, READ the entry id and data, FENCE/DELETE nothing."""
    extra = b"" if entry_id is None else _ENTRY.pack(entry_id)
    head = _frame(kind | RESPONSE_FLAG, request_id, _STATUS.size + len(extra) + len(data))
    return [head + _STATUS.pack(Status.OK) + extra, data] if data else [head + _STATUS.pack(Status.OK) + extra]


def encode_range(request_id: int, entries: list[tuple[int, bytes]]) -> list[bytes]:
    """An OK READ_RANGE response holding ``entries`` (entry id, data) in order."""
    parts: list[bytes] = []
    size = _STATUS.size
    for entry_id, data in entries:
        parts.append(_RANGE_ITEM.pack(entry_id, len(data)))
        parts.append(data)
        size += _RANGE_ITEM.size + len(data)
    return [_frame(Kind.READ_RANGE | RESPONSE_FLAG, request_id, size) + _STATUS.pack(Status.OK), *parts]


def encode_error(kind: Kind, request_id: int, error: BaseException) -> bytes:
    message = str(error).encode("utf-8", errors="replace")[:1024]
    return _frame(kind | RESPONSE_FLAG, request_id, _STATUS.size + len(message)) + _STATUS.pack(status_of(error)) \
        + message


def decode_response(frame: memoryview) -> Response:
    """A response from one frame's bytes (after the length field)."""
    kind_value, request_id = _unpack(_HEAD, frame, 0)
    if not kind_value & RESPONSE_FLAG:
        raise ProtocolError(f"expected a response, got request kind {kind_value}")
    try:
        kind = Kind(kind_value & ~RESPONSE_FLAG)
        (status_value,) = _unpack(_STATUS, frame, _HEAD.size)
        status = Status(status_value)
    except ValueError:
        raise ProtocolError(f"unknown bookie response kind {kind_value} or status") from None
    body = frame[_HEAD.size + _STATUS.size :]
    if status is not Status.OK:
        return Response(kind, request_id, status, message=bytes(body).decode("utf-8", errors="replace"))
    if kind is Kind.ADD:
        (entry_id,) = _unpack(_ENTRY, body, 0, exact=True)
        return Response(kind, request_id, status, entry_id)
    if kind is Kind.READ:
        (entry_id,) = _unpack(_ENTRY, body, 0)
        return Response(kind, request_id, status, entry_id, bytes(body[_ENTRY.size :]))
    if kind is Kind.READ_RANGE:
        return Response(kind, request_id, status, entries=tuple(_range_items(body)))
    if len(body):
        raise ProtocolError(f"unexpected body in a {kind.name} response")
    return Response(kind, request_id, status)


def _range_items(body: memoryview) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset < len(body):
        entry_id, size = _unpack(_RANGE_ITEM, body, offset)
        offset += _RANGE_ITEM.size
        if offset + size > len(body):
            raise ProtocolError("a READ_RANGE item runs past its frame")
        yield entry_id, bytes(body[offset : offset + size])
        offset += size


def _unpack(layout: struct.Struct, data: memoryview, offset: int, *, exact: bool = False) -> tuple[int, ...]:
    if len(data) < offset + layout.size or (exact and len(data) != offset + layout.size):
        raise ProtocolError(f"bookie frame of {len(data)} bytes does not fit its layout")
    values: tuple[int, ...] = layout.unpack_from(data, offset)
    return values


# --- framing --------------------------------------------------------------------------------------


class FrameDecoder:
    """Cuts a byte stream into frames: ``feed(bytes)`` returns the complete frames' bodies."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self._buffer = bytearray()
        self._frame_bytes_max = frame_bytes_max

    def feed(self, data: bytes) -> list[memoryview]:
        buffer = self._buffer
        buffer += data
        frames: list[memoryview] = []
        offset = 0
        size = len(buffer)
        while size - offset >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if length > self._frame_bytes_max or length < _HEAD.size:
                raise ProtocolError(f"bookie frame length {length} out of range")
            end = offset + _LENGTH.size + length
            if end > size:
                break
            frames.append(memoryview(bytes(buffer[offset + _LENGTH.size : end])))
            offset = end
        if offset:
            del buffer[:offset]
        return frames

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)
