"""When a WebSocket reader's acknowledgements wake its sender: in batches, by whichever bound binds."""

from __future__ import annotations

from api.ws.reader import refill_due

LIMIT = 1000
BYTES_LIMIT = 16 * 1024 * 1024


def acks_until_refill(outstanding: int, message_bytes: int) -> int:
    """Acknowledgements of a full window (``outstanding`` messages of ``message_bytes``) before
    one wakes the sender."""
    for acked in range(1, outstanding + 1):
        left = outstanding - acked
        if refill_due(left, left * message_bytes, LIMIT, BYTES_LIMIT):
            return acked
    raise AssertionError("the window emptied without a refill")


def test_small_messages_refill_once_half_the_count_is_free() -> None:
    assert acks_until_refill(LIMIT, 100) == LIMIT // 2  # not on every ack: bytes stay far below their bound


def test_large_messages_refill_once_half_the_bytes_are_free() -> None:
    per_window = BYTES_LIMIT // (1024 * 1024)  # 16 messages of 1 MiB fill the bytes bound
    assert acks_until_refill(per_window, 1024 * 1024) == per_window // 2


def test_an_empty_window_always_refills() -> None:
    assert refill_due(0, 0, LIMIT, BYTES_LIMIT)
    assert refill_due(0, 0, 1, 1)
