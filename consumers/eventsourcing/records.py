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
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

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

from consumers.client import ClientError, HttpError, Message

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


def is_notification(properties: dict[str, str], topics: frozenset[str]) -> bool:
    """Whether a message is a stored event whose topic is among ``topics`` (empty: any)."""
    return not is_tracking(properties) and (not topics or properties.get(TOPIC_PROPERTY) in topics)


def stored_event_of(key: str, payload: bytes, properties: dict[str, str]) -> StoredEvent:
    return StoredEvent(originator_id=_originator_id(key, properties),
                       originator_version=int(properties[VERSION_PROPERTY]),
                       topic=properties[TOPIC_PROPERTY], state=payload)


def stored_event_of_message(message: Message) -> StoredEvent:
    return stored_event_of(message.key or "", message.data, message.properties)


def notification_of(answer: dict[str, Any]) -> Notification:
    """The notification of one message of a JSON range read (not a tracking message)."""
    properties = answer["properties"]
    return Notification(id=int(answer["offset"]) + 1, originator_id=_originator_id(answer["key"], properties),
                        originator_version=int(properties[VERSION_PROPERTY]), topic=properties[TOPIC_PROPERTY],
                        state=base64.b64decode(answer["payload"]))


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
