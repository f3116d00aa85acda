"""Types of the native common-entry check (``_common_entry.c``)."""

from typing import Any

def common_batch(data: bytes, /) -> tuple[int, int, int, int, int | None, tuple[Any, ...] | None] | None: ...
def common_metadata(
    data: bytes, start: int, /
) -> tuple[int, int, int, int | None, tuple[Any, ...] | None, str] | None: ...
