"""A produce request's fields, in Pulsar's names, turned into messages: one place for the rules.

Role: REST produce (PIP-64 messages), WebSocket producer frames and any later front end name a
message's parts the same way (``payload``, ``key``, ``properties``, ``eventTime``,
``sequenceId``, ``deliverAt``, ``deliverAfterMs``, ``replicationClusters``,
``disableReplication``), plus Magnetar's conditional appends (``expectedOffset``, and per key
``expectedKeyVersion`` on a frame or ``expectedKeyVersions`` on a request). This module says
what each may hold and builds the ``Message``:

- ``payload``: a UTF-8 string (REST's default) or base64 (WebSocket's, and REST's with
  ``payloadEncoding: "base64"``);
- ``eventTime``: epoch milliseconds (a number or a string of digits) or ISO-8601 text, on every
  transport (``broker/time_format.py``);
- ``deliverAt`` (epoch ms) or ``deliverAfterMs`` (from now): one delivery time per entry, the
  latest any of its messages asks for;
- ``expectedOffset``: the offset the entry's first message must get (409 otherwise);
- ``expectedKeyVersion(s)``: the version a key's stream must be at (``-1``: no message yet, or
  ``"exists"``: at least one), checked with the append (409 ``key_version_mismatch``). A key is
  at most ``KEY_BYTES_MAX`` bytes of UTF-8 wherever it is used as a stream's name.

A field a transport does not know is an ``InvalidRequest`` naming it, so a misplaced field (a
conditional append inside a message, say) is never silently ignored. Errors carry the field's
name (``InvalidRequest.field``); transports map it onto their own codes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from broker.entry_format import Message
from broker.errors import InvalidRequest
from broker.limits import EXPECTED_KEYS_MAX, KEY_BYTES_MAX
from broker.time_format import TIME_MS_MAX, parse_time_ms

SEQUENCE_ID_MAX = 2**63 - 1  # Pulsar's sequence ids are signed 64-bit
OFFSET_MAX = 2**63 - 1
MESSAGE_FIELDS = frozenset({"payload", "key", "properties", "eventTime", "sequenceId", "deliverAt",
                            "deliverAfterMs", "replicationClusters", "disableReplication"})
"""Pulsar's names for the parts of one message (REST produce's message objects)."""
PAYLOAD_ENCODINGS = ("utf-8", "utf8", "string", "base64")
VERSION_MAX = 2**63 - 1
EXISTS: Literal["exists"] = "exists"
ExpectedVersion = int | Literal["exists"]
"""What a conditional append expects of a key's stream: its version (-1: no message yet), or
``"exists"`` (at least one message)."""
_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


class ProducedMessage(NamedTuple):
    """A message to store, with what its request asked for besides the message itself."""

    message: Message
    deliver_at_ms: int | None = None
    expected_offset: int | None = None
    expected_key_version: ExpectedVersion | None = None


def check_fields(fields: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    """``InvalidRequest`` naming the first field of ``fields`` not in ``known``."""
    unknown = fields.keys() - known
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidRequest(f"{where} has the field {name!r}, which is not known here; known fields: "
                             f"{', '.join(sorted(known))}", field=name)


def payload_of(value: Any, encoding: str, field: str = "payload") -> bytes:
    if not isinstance(value, str):
        raise InvalidRequest(f"{field} must be a string", field=field)
    if encoding == "base64":
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{field} is not valid base64", field=field) from None
    if encoding in ("utf-8", "utf8", "string"):
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise InvalidRequest(f"{field} is not valid Unicode (a lone surrogate)", field=field) from None
    raise InvalidRequest(f"payloadEncoding must be 'utf-8' or 'base64', not {encoding!r}", field="payloadEncoding")


def key_of(value: Any, field: str = "key") -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"{field} must be a string", field=field)
    return value


def check_key(key: str, field: str = "key") -> str:
    """``key`` when it can name an event stream: at most ``KEY_BYTES_MAX`` bytes of UTF-8."""
    if len(key) * 4 > KEY_BYTES_MAX and len(key.encode(errors="surrogatepass")) > KEY_BYTES_MAX:
        raise InvalidRequest(f"{field} is longer than {KEY_BYTES_MAX} bytes", field=field)
    return key


def expected_version_of(value: Any, field: str) -> ExpectedVersion:
    """A key's expected version: an integer in -1..2^63-1 or ``"exists"``."""
    if value == EXISTS:
        return EXISTS
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= VERSION_MAX:
        raise InvalidRequest(f"{field} must be an integer in -1..{VERSION_MAX} or \"exists\"", field=field)
    return value


def expected_key_versions_of(value: Any, field: str = "expectedKeyVersions") -> dict[str, ExpectedVersion]:
    """A request's ``{key: expected version}``: 1..``EXPECTED_KEYS_MAX`` keys, each a valid key."""
    if not isinstance(value, dict) or not 1 <= len(value) <= EXPECTED_KEYS_MAX:
        raise InvalidRequest(f"{field} must be an object of 1..{EXPECTED_KEYS_MAX} keys", field=field)
    for key, version in value.items():  # the common case costs two type checks a key (it is per message)
        if type(key) is not str or len(key) * 4 > KEY_BYTES_MAX:
            if not isinstance(key, str):
                raise InvalidRequest(f"{field} keys must be strings", field=field)
            check_key(key, f"{field} key")
        if type(version) is not int or not -1 <= version <= VERSION_MAX:
            expected_version_of(version, f"{field}[{key[:64]!r}]")
    return dict(value)


def properties_of(value: Any, field: str = "properties") -> Mapping[str, str]:
    if value is None or value == {}:
        return _NO_PROPERTIES
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidRequest(f"{field} must be an object of strings", field=field)
    return value


def integer_of(value: Any, field: str, high: int) -> int | None:
    """A non-negative integer up to ``high`` (None when absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise InvalidRequest(f"{field} must be an integer in 0..{high}", field=field)
    return value


def deliver_at_ms(deliver_at: int | None, deliver_after_ms: int | None, now_ms: int) -> int | None:
    """The delivery time a message asks for: ``deliverAt`` (epoch ms) wins over
    ``deliverAfterMs`` (from ``now_ms``); None when it asks for none."""
    if deliver_at is not None:
        return deliver_at or None
    if deliver_after_ms:
        return min(now_ms + deliver_after_ms, TIME_MS_MAX)
    return None


def latest_delivery(times: Iterable[int | None]) -> int | None:
    """One entry has one delivery time: the latest any of its messages asks for."""
    asked = [t for t in times if t is not None]
    return max(asked) if asked else None


def build_message(payload: bytes, key: str | None = None, properties: Mapping[str, str] = _NO_PROPERTIES,
                  event_time_ms: int | None = None, sequence_id: int | None = None) -> Message:
    """The ``Message`` of already-checked parts (the produce paths' hot constructor)."""
    return Message(payload, key, properties, event_time_ms, sequence_id)


def message_of(fields: Mapping[str, Any], *, encoding: str, clock_ms: Callable[[], int],
               known: frozenset[str] = MESSAGE_FIELDS, where: str = "the message") -> ProducedMessage:
    """The message ``fields`` describe, checked field by field (``InvalidRequest`` naming the
    field at fault); ``known`` is what the transport accepts (``MESSAGE_FIELDS`` plus its own);
    ``clock_ms`` is read only for a ``deliverAfterMs``. A field that is absent costs nothing
    (this runs once per WebSocket frame)."""
    if not known.issuperset(fields):
        check_fields(fields, known, where)
    get = fields.get
    payload = get("payload")
    if payload is None:
        raise InvalidRequest(f"{where} needs a payload", field="payload")
    key = get("key")
    if key is not None and not isinstance(key, str):
        key_of(key)
    properties = get("properties")
    event_time = get("eventTime")
    sequence_id = get("sequenceId")
    message = Message(
        payload_of(payload, encoding), key, _NO_PROPERTIES if properties is None else properties_of(properties),
        None if event_time is None else parse_time_ms(event_time, "eventTime"),
        None if sequence_id is None else integer_of(sequence_id, "sequenceId", SEQUENCE_ID_MAX))
    delivery = expected = expected_version = None
    if "deliverAt" in fields or "deliverAfterMs" in fields:
        after_ms = integer_of(get("deliverAfterMs"), "deliverAfterMs", TIME_MS_MAX)
        delivery = deliver_at_ms(integer_of(get("deliverAt"), "deliverAt", TIME_MS_MAX), after_ms,
                                 clock_ms() if after_ms else 0)
    if "expectedOffset" in fields:
        expected = integer_of(get("expectedOffset"), "expectedOffset", OFFSET_MAX)
    if "expectedKeyVersion" in fields:
        if key is None:
            raise InvalidRequest(f"{where} has an expectedKeyVersion but no key", field="expectedKeyVersion")
        expected_version = expected_version_of(get("expectedKeyVersion"), "expectedKeyVersion")
    return ProducedMessage(message, delivery, expected, expected_version)
