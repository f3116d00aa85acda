"""Times as Magnetar's APIs write and read them: one format per shape, in one place.

Role: every JSON message Magnetar writes (WebSocket deliveries, REST pulls, range reads, admin
answers) carries Pulsar's ISO-8601 ``publishTime`` (milliseconds, UTC, ``Z``); where a number
is useful it also carries epoch milliseconds under a name that says so (``publishTimeMs``).
Every produce path accepts an event time either way: epoch milliseconds (a number or a string
of ASCII digits, Pulsar's REST shape) or ISO-8601 text (Pulsar's WebSocket shape).

Invariant: a parsed time is an integer in ``0..TIME_MS_MAX`` (a Java long, and an Arrow
timestamp on reads); anything else is ``InvalidRequest`` naming the field.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

from broker.errors import InvalidRequest
from broker.limits import ISO_TIME_TEXTS_CACHED_MAX

TIME_MS_MAX = (1 << 63) - 1


def iso_time(epoch_ms: int) -> str:
    """``2026-11-24T02:10:32.123Z`` (UTC, milliseconds), Pulsar's JSON timestamps."""
    seconds, millis = divmod(epoch_ms, 1000)
    return f"{_iso_second(seconds)}.{millis:03d}Z"


@functools.lru_cache(maxsize=ISO_TIME_TEXTS_CACHED_MAX)
def _iso_second(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def parse_time_ms(value: Any, field: str) -> int | None:
    """``value`` as epoch milliseconds: a non-negative integer, a string of ASCII digits, or
    ISO-8601 text (a time without a zone is UTC); None and "" mean no time."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidRequest(f"{field} must be epoch milliseconds or ISO-8601 text, not a boolean", field=field)
    if isinstance(value, int):
        parsed = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        parsed = int(value)
    elif isinstance(value, str):
        parsed = _parse_iso(value, field)
    else:
        raise InvalidRequest(f"{field} must be epoch milliseconds or ISO-8601 text", field=field)
    if not 0 <= parsed <= TIME_MS_MAX:
        raise InvalidRequest(f"{field} must lie in 0..{TIME_MS_MAX} ms, not {parsed}", field=field)
    return parsed


def _parse_iso(text: str, field: str) -> int:
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"{field} {text[:40]!r} is neither epoch milliseconds nor ISO-8601", field=field) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return int(stamp.timestamp() * 1000)
