"""How the ``eventsourcing`` library's records are stored as Magnetar messages.

Role: the one place that maps the library's ``StoredEvent`` and ``Tracking`` onto messages of a
topic and back, and broker answers onto the library's errors. A stored event is one message:
key = the originator id as text, payload = the event's state, properties = the event's topic,
its originator version and whether the id is a UUID. A tracking record is one message keyed
``TRACKING_KEY_PREFIX + application name`` whose property holds the notification id. The
notification id of a message is its offset + 1 (offsets are gap-free from 0, so ids are
increasing from 1 and never reused; tracking messages take an id that no notification has).

Invariants: an originator's messages have strictly increasing originator versions, so the last
message of a key holds its highest version; the same holds for a tracking key's notification ids.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID, SafeUUID

import pyarrow as pa
import pyarrow.compute as pc
from eventsourcing.persistence import (
    DataError,
    IntegrityError,
    Notification,
    OperationalError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
    Tracking,
)

from consumers.arrow_pool import preferred_memory_pool
from consumers.client import ClientError, HttpError, Message

try:  # the optional native maker of notifications and UUIDs (setup.py builds it when it can)
    import consumers.eventsourcing._notifications as native_notifications
    NATIVE_NOTIFICATIONS = True
except ImportError:  # pragma: no cover - exercised where no C compiler was at hand
    NATIVE_NOTIFICATIONS = False

TOPIC_PROPERTY = "es-topic"
VERSION_PROPERTY = "es-version"
ID_TYPE_PROPERTY = "es-id-type"
TRACKING_PROPERTY = "es-tracking-id"
UUID_ID_TYPE = "uuid"
TRACKING_KEY_PREFIX = "__tracking__/"
KEY_BYTES_MAX = 1024  # the broker's bound on a message key
OPERATIONAL_STATUSES = frozenset({408, 409, 429})
"""4xx answers that say "not now" rather than "not this": a timeout, a busy producer, a rate limit
(a 409 for a conditional append is handled before, as a conflict)."""


ARROW_POOL = preferred_memory_pool()
"""The pool the recorder's Arrow work allocates from (``consumers/arrow_pool.py``); the
process's default pool is the application's and stays as it is."""


@dataclass(frozen=True)
class Head:
    """Where one key's stream stands: its last message's key version (-1: none) and the value
    it carries (an originator version, or a tracked notification id; None: no message)."""

    key_version: int
    value: int | None


NEW_STREAM = Head(-1, None)


def originator_key(originator_id: UUID | str) -> str:
    key = str(originator_id)
    if key.startswith(TRACKING_KEY_PREFIX):
        raise DataError(f"originator id {key!r}: ids starting with {TRACKING_KEY_PREFIX!r} are reserved")
    if not key or len(key.encode()) > KEY_BYTES_MAX:
        raise DataError(f"originator id {key[:64]!r}: must be 1..{KEY_BYTES_MAX} bytes as text")
    return key


def tracking_key(application_name: str) -> str:
    key = TRACKING_KEY_PREFIX + application_name
    if len(key.encode()) > KEY_BYTES_MAX:
        raise DataError(f"application name {application_name[:64]!r} is too long for a tracking key")
    return key


def event_message(event: StoredEvent) -> dict[str, Any]:
    """The PIP-64 message of one stored event."""
    properties = {TOPIC_PROPERTY: event.topic, VERSION_PROPERTY: str(event.originator_version)}
    if isinstance(event.originator_id, UUID):
        properties[ID_TYPE_PROPERTY] = UUID_ID_TYPE
    return {"payload": base64.b64encode(event.state).decode("ascii"), "key": originator_key(event.originator_id),
            "properties": properties}


def tracking_message(tracking: Tracking) -> dict[str, Any]:
    return {"payload": "", "key": tracking_key(tracking.application_name),
            "properties": {TRACKING_PROPERTY: str(tracking.notification_id)}}


def is_tracking(properties: dict[str, str]) -> bool:
    return TRACKING_PROPERTY in properties


def stored_event_of(key: str, payload: bytes, properties: dict[str, str]) -> StoredEvent:
    return StoredEvent(originator_id=_originator_id(key, properties),
                       originator_version=int(properties[VERSION_PROPERTY]),
                       topic=properties[TOPIC_PROPERTY], state=payload)


def stored_event_of_message(message: Message) -> StoredEvent:
    return stored_event_of(message.key or "", message.data, message.properties)


def notifications_of(rows: pa.Table, topics: frozenset[str], limit: int) -> list[Notification]:
    """The first ``limit`` notifications among the rows of an Arrow range read (tracking
    messages, and events whose topic is not among ``topics`` (empty: any), left out). Rows are
    selected and properties found by Arrow's kernels over the rows' flattened properties (each
    event has one topic and one version property, in row order); Python runs once a row, only
    to make its ``Notification`` (from its fields' dict: ``_notification_of``; in C, the same,
    with ``NATIVE_NOTIFICATIONS``). No rows (a topic not created yet reads as a table without
    columns) are no notifications."""
    if not rows.num_rows:
        return []
    events = _events_among(rows, topics).slice(0, limit)
    properties = _Properties.of(events)
    topic_names, versions = properties.values_of(_TOPIC), properties.values_of(_VERSION)
    if len(topic_names) != events.num_rows or len(versions) != events.num_rows:
        raise DataError(f"offsets {_offsets_text(events)} hold messages that are not stored events "
                        f"(one {TOPIC_PROPERTY!r} and one {VERSION_PROPERTY!r} property each)")
    originator_ids = _originator_ids(pc.cast(events.column("key"), pa.string(), memory_pool=ARROW_POOL),
                                     properties.rows_where(_ID_TYPE, _UUID_ID_TYPE))
    try:
        version_numbers = pc.cast(versions, pa.int64(), memory_pool=ARROW_POOL).to_pylist()
    except pa.ArrowInvalid as exc:
        raise DataError(f"offsets {_offsets_text(events)} hold a {VERSION_PROPERTY!r} that is not a number: "
                        f"{exc}") from None
    offsets, topic_texts, states = events.column("offset").to_pylist(), topic_names.to_pylist(), \
        events.column("value").to_pylist()
    if _NOTIFICATION_OF_FIELDS and NATIVE_NOTIFICATIONS:
        made: list[Notification] = native_notifications.notifications(
            Notification, offsets, originator_ids, version_numbers, topic_texts, states)
        return made
    fields = zip(offsets, originator_ids, version_numbers, topic_texts, states, strict=True)
    if not _NOTIFICATION_OF_FIELDS:
        return [Notification(id=offset + 1, originator_id=originator_id, originator_version=version, topic=topic,
                             state=state) for offset, originator_id, version, topic, state in fields]
    return [_notification_of({"originator_id": originator_id, "originator_version": version, "topic": topic,
                              "state": state, "id": offset + 1})
            for offset, originator_id, version, topic, state in fields]


def _made_by_generated_init(cls: type) -> bool:
    """Whether ``cls`` is a dataclass whose instances its generated ``__init__`` makes by setting
    each field, in order, in the instance's ``__dict__`` and nothing else: no ``__slots__``, no
    ``__post_init__``, every field given to ``__init__`` (a frozen dataclass sets each through
    ``object.__setattr__``: half the time a page of notifications takes to decode)."""
    return (dataclasses.is_dataclass(cls) and "__slots__" not in vars(cls) and not hasattr(cls, "__post_init__")
            and all(f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                    for f in dataclasses.fields(cls)))


_NOTIFICATION_FIELDS = ("originator_id", "originator_version", "topic", "state", "id")
_NOTIFICATION_OF_FIELDS = _made_by_generated_init(Notification) and \
    tuple(f.name for f in dataclasses.fields(Notification)) == _NOTIFICATION_FIELDS
"""Whether notifications are made from their fields' dict (the library's ``Notification`` as
9.5 defines it), else by its ``__init__``."""


def _notification_of(fields: dict[str, Any]) -> Notification:
    """The ``Notification`` that ``Notification(**fields)`` makes, made as its generated
    ``__init__`` makes it (``fields`` in the order of its fields)."""
    notification = _new_object(Notification)
    _set_slot(notification, "__dict__", fields)
    return notification


_new_object = object.__new__
_set_slot = object.__setattr__
_UUID_INT = vars(UUID)["int"]
_UUID_IS_SAFE = vars(UUID)["is_safe"]
"""``UUID``'s slots (``__slots__ = ('int', 'is_safe', ...)``), set through their descriptors."""
_SET_UUID_INT = _UUID_INT.__set__
_SET_UUID_IS_SAFE = _UUID_IS_SAFE.__set__
_SAFE_UNKNOWN = SafeUUID.unknown
_UUID_HALVES = struct.Struct(">QQ")


def _originator_ids(keys: pa.ChunkedArray, uuid_rows: set[int]) -> list[UUID | str]:
    """The originator id of each row: a ``UUID`` for the rows marked so, else the key's text."""
    count = len(keys)
    made = _uuids_of(keys) if count and len(uuid_rows) == count else None
    if made is not None:
        return made
    return [UUID(text) if row in uuid_rows else text for row, text in enumerate(keys.to_pylist())]


def _uuids_of(keys: pa.ChunkedArray) -> list[UUID | str] | None:
    """What ``UUID(key)`` makes of each key, when every key is 32 hex digits besides its dashes
    (None otherwise: then ``UUID`` parses each). The digits of all keys are read at once
    (``bytes.fromhex``, which also refuses any other character) and each ``UUID`` is made from
    its 128 bits as ``UUID.__init__`` makes it, its two slots set: parsing each key's text in
    ``UUID.__init__`` took a third of a page's decoding."""
    digits = _combined(pc.replace_substring(keys, "-", "", memory_pool=ARROW_POOL))
    count = len(digits)
    lengths = pc.min_max(pc.binary_length(digits, memory_pool=ARROW_POOL), memory_pool=ARROW_POOL)
    if digits.null_count or lengths.as_py() != {"min": 32, "max": 32}:
        return None
    value_offsets, data = digits.buffers()[1:3]
    first = int.from_bytes(memoryview(value_offsets)[4 * digits.offset:4 * digits.offset + 4], "little")
    try:
        bits = bytes.fromhex(str(memoryview(data)[first:first + 32 * count], "ascii"))
    except ValueError:  # a character that is not a hex digit (UnicodeDecodeError included)
        return None
    if len(bits) != 16 * count:  # fromhex skips whitespace between pairs of digits
        return None
    if NATIVE_NOTIFICATIONS:
        native: list[UUID | str] = native_notifications.uuids(UUID, _UUID_INT, _UUID_IS_SAFE, _SAFE_UNKNOWN, bits)
        return native
    made: list[UUID | str] = []
    for high, low in _UUID_HALVES.iter_unpack(bits):
        uuid = _new_object(UUID)
        _SET_UUID_INT(uuid, high << 64 | low)
        _SET_UUID_IS_SAFE(uuid, _SAFE_UNKNOWN)
        made.append(uuid)
    return made


def last_notification_offset(rows: pa.Table) -> int | None:
    """The offset of the last row of an Arrow range read that is a notification (None: none is)."""
    offsets = _events_among(rows, frozenset()).column("offset")
    return int(offsets[-1].as_py()) if len(offsets) else None


_TOPIC = pa.scalar(TOPIC_PROPERTY)
_VERSION = pa.scalar(VERSION_PROPERTY)
_ID_TYPE = pa.scalar(ID_TYPE_PROPERTY)
_UUID_ID_TYPE = pa.scalar(UUID_ID_TYPE)
_TRACKING = pa.scalar(TRACKING_PROPERTY)
"""Arrow scalars made once: a kernel given a Python string converts it on every call."""


@dataclass(frozen=True)
class _Properties:
    """The properties of a range read's rows, flattened: name, value and row of each."""

    names: pa.Array
    values: pa.Array
    rows: pa.Array

    @classmethod
    def of(cls, rows: pa.Table) -> _Properties:
        column = _combined(rows.column("properties"))
        entries = pa.ListArray.from_arrays(column.offsets, column.values, pool=ARROW_POOL)  # a map's kernels are fewer
        flat = pc.list_flatten(entries, memory_pool=ARROW_POOL)
        return cls(flat.field("key"), flat.field("value"), pc.list_parent_indices(entries, memory_pool=ARROW_POOL))

    def values_of(self, name: pa.Scalar) -> pa.Array:
        return _filtered(self.values, _equal(self.names, name))

    def rows_with(self, name: pa.Scalar) -> pa.Array:
        return _filtered(self.rows, _equal(self.names, name))

    def rows_where(self, name: pa.Scalar, value: pa.Scalar) -> set[int]:
        return set(_filtered(self.rows, pc.and_(_equal(self.names, name), _equal(self.values, value),
                                                memory_pool=ARROW_POOL)).to_pylist())


def _events_among(rows: pa.Table, topics: frozenset[str]) -> pa.Table:
    """The rows that are stored events (not tracking records) of ``topics`` (empty: any)."""
    properties = _Properties.of(rows)
    tracking = properties.rows_with(_TRACKING)
    of_topics = None
    if topics:
        of_topics = _filtered(properties.rows, pc.and_(
            _equal(properties.names, _TOPIC),
            pc.is_in(properties.values, value_set=pa.array(sorted(topics)), memory_pool=ARROW_POOL),
            memory_pool=ARROW_POOL))
    if not len(tracking) and of_topics is None:
        return rows
    row_numbers = pa.array(range(rows.num_rows), pa.int64(), memory_pool=ARROW_POOL)
    wanted = pc.invert(_is_in(row_numbers, tracking), memory_pool=ARROW_POOL)
    if of_topics is not None:
        wanted = pc.and_(wanted, _is_in(row_numbers, of_topics), memory_pool=ARROW_POOL)
    return _filtered(rows, wanted)


def _combined(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its chunk when it has one (no copy), else its chunks joined in
    the recorder's pool (``combine_chunks`` copies even one chunk, from the default pool)."""
    if column.num_chunks == 1:
        return column.chunk(0)
    if not column.num_chunks:
        return pa.array([], column.type)
    return pa.concat_arrays(column.chunks, memory_pool=ARROW_POOL)


def _equal(values: pa.Array, value: pa.Scalar) -> pa.Array:
    return pc.equal(values, value, memory_pool=ARROW_POOL)


def _is_in(row_numbers: pa.Array, rows: pa.Array) -> pa.Array:
    return pc.is_in(row_numbers, value_set=pc.cast(rows, pa.int64(), memory_pool=ARROW_POOL), memory_pool=ARROW_POOL)


def _filtered(values: Any, mask: pa.Array) -> Any:
    """The rows (of an array or a table) where ``mask`` is true, in the recorder's pool."""
    return pc.filter(values, mask, memory_pool=ARROW_POOL)


def _offsets_text(rows: pa.Table) -> str:
    offsets = rows.column("offset")
    return f"{offsets[0].as_py()}..{offsets[-1].as_py()}" if len(offsets) else "(none)"


def head_of(message: Message) -> Head:
    """The head a stream's last message makes."""
    assert message.key_version is not None
    if is_tracking(message.properties):
        return Head(message.key_version, int(message.properties[TRACKING_PROPERTY]))
    return Head(message.key_version, int(message.properties[VERSION_PROPERTY]))


def _originator_id(key: str, properties: dict[str, str]) -> UUID | str:
    return UUID(key) if properties.get(ID_TYPE_PROPERTY) == UUID_ID_TYPE else key


def check_increasing(values: Sequence[int], what: str) -> None:
    """The values one request appends to one stream must increase (a repeat is a conflict)."""
    for before, after in itertools.pairwise(values):
        if after <= before:
            raise IntegrityError(f"{what}: {after} follows {before} in one insert")


def persistence_error(error: ClientError) -> PersistenceError:
    """The library's error for a broker's answer: unreachable, timed out or failing brokers are
    ``OperationalError``s (try again later), as are a timed-out request, a busy producer slot
    and a rate limit; refused input is a ``DataError``, a refused call (authentication,
    permission) a ``ProgrammingError``."""
    if isinstance(error, HttpError) and 400 <= error.status < 500:
        if error.status in (401, 403):
            return ProgrammingError(str(error))
        if error.status not in OPERATIONAL_STATUSES:
            return DataError(str(error))
    return OperationalError(str(error))
