"""Types of ``_notifications.c``, the optional native maker of a recorder's notifications."""

from typing import Any
from uuid import UUID

def uuids(uuid_type: type[UUID], set_int: Any, set_is_safe: Any, is_safe: Any, bits: bytes, /) -> list[UUID | str]: ...
def notifications(notification_type: type[Any], offsets: list[int], originator_ids: list[Any], versions: list[Any],
                  topics: list[Any], states: list[Any], /) -> list[Any]: ...
