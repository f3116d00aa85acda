"""Type stub of the optional native accelerator ``_range_columns.c`` (see columns.py)."""

from collections.abc import Callable, Iterator
from typing import Any

from typing_extensions import Buffer

PROPERTIES_PER_MESSAGE_MAX: int
COMMON_ENTRY_API: bool
"""Whether each entry is checked through ``_common_entry.c``'s capsule (else the callable given)."""

class MalformedBatch(ValueError):
    """The batch payload is not what the entry format allows."""

class RangeColumns:
    """Range-read columns built from uncompressed batch payloads; used once, then ``finish``."""

    rows: int
    property_count: int
    key_null_count: int
    event_time_null_count: int

    def __init__(self, first_offset: int) -> None: ...
    @property
    def value_bytes(self) -> int: ...
    def add_batch(self, payload: Buffer, count: int, skip: int, take: int, publish_time_ms: int,
                  id_prefix: Buffer) -> bool:
        """Append messages ``skip..skip+take`` of a batch of ``count`` messages; False (nothing
        appended) when the entry needs the Python decoder. Raises ``MalformedBatch``."""
    def add_entries(self, entries: Iterator[Any], offset: int, partition: int, max_messages: int, max_bytes: int,
                    message_overhead_bytes: int, common_batch: Callable[[bytes], Any],
                    /) -> tuple[Any, int, int] | None:
        """``collect_entries``' loop while each entry is taken natively: None when the read is
        done, else ``(entry, skip, take)`` for the caller. Raises ``MalformedBatch``."""
    def add_row(self, key: bytes | None, value: Buffer, publish_time_ms: int, event_time_ms: int | None,
                properties: dict[str, str], message_id: Buffer) -> None:
        """Append one row decoded elsewhere."""
    def finish(self) -> dict[str, bytes | None]:
        """The column buffers by name (a validity bitmap is None when nothing is null)."""
