"""Retention: which of a managed ledger's consumed ledgers may go, and which messages expired.

Role: trimming deletes whole ledgers strictly before the slowest durable cursor's persisted
mark-delete, never the current one, and only as far as the namespace's retention allows: keep
consumed ledgers for ``retention_time_ms`` after they closed and/or up to
``retention_size_bytes`` in all (-1 in either: no limit on that one; both -1: keep everything;
both 0: delete as soon as consumed, Pulsar's default). A message TTL moves every cursor past
messages older than ``message_ttl_ms``.

Invariant: a ledger that is not wholly consumed, not closed, or is the last one is never
deletable, whatever the policy says.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.offset_index import LedgerInfo


def retention_allows_delete(info: LedgerInfo, now_ms: int, kept_size_bytes: int, *,
                            time_limit_ms: int, size_limit_bytes: int) -> bool:
    if time_limit_ms < 0 and size_limit_bytes < 0:
        return False
    expired_by_time = time_limit_ms >= 0 and now_ms - info.closed_ms >= time_limit_ms
    over_size = size_limit_bytes >= 0 and kept_size_bytes > size_limit_bytes
    if time_limit_ms < 0:
        return over_size
    if size_limit_bytes < 0:
        return expired_by_time
    return expired_by_time or over_size


def deletable_ledgers(infos: Sequence[LedgerInfo], slowest_offset: int, now_ms: int, *, time_limit_ms: int,
                      size_limit_bytes: int) -> list[LedgerInfo]:
    """The leading ledgers that every durable cursor consumed (none at or past
    ``slowest_offset``) and that retention lets go; never the last ledger."""
    deletable: list[LedgerInfo] = []
    kept_size = sum(i.size_bytes for i in infos)
    for info in infos[:-1]:
        if info.next_offset > slowest_offset or info.closed_ms == 0:
            break
        if not retention_allows_delete(info, now_ms, kept_size, time_limit_ms=time_limit_ms,
                                       size_limit_bytes=size_limit_bytes):
            break
        deletable.append(info)
        kept_size -= info.size_bytes
    return deletable


def expiry_cutoff_ms(now_ms: int, message_ttl_ms: int) -> int | None:
    """With a TTL: messages published before this time are expired (None: no TTL)."""
    return None if message_ttl_ms <= 0 else now_ms - message_ttl_ms
