"""Admin v2 REST API (Pulsar's ``/admin/v2``): the router, and the topic statistics documents.

Role: ``router(service, authorizer)`` assembles the admin API: tenants and namespaces
(``api/admin_namespaces.py``), topics, subscriptions, cursor moves, messages, compaction and
termination (``api/admin_topics.py``), and, here, ``stats``, ``partitioned-stats`` and
``internalStats`` in Pulsar's ``TopicStats``, ``PartitionedTopicStats`` and
``PersistentTopicInternalStats`` shapes, filled with the broker's real numbers (managed
ledger, cursor and subscription ``statistics()``), plus Magnetar's offsets.

Invariants: every route checks that the caller administers the tenant before any broker call;
statistics only read. Counters count since the topic was loaded (as Pulsar's do); rates are
over the broker's last maintenance interval. Magnetar tracks no long-lived producers (REST
produce is stateless), so ``publishers`` is empty. ``individuallyDeletedMessages`` lists whole
entries acknowledged above the mark-delete position (a partly acknowledged batch is not shown;
Pulsar shows those as batch ack sets), at most ``DELETED_RANGES_SHOWN_MAX`` ranges.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.admin_namespaces import namespaces_router, tenants_router
from api.admin_persistence import persistence_router
from api.admin_topics import iso_time, single_topic, topic_name, topics_router
from api.auth import Authorizer, Caller
from broker.cursor import ManagedCursor
from broker.errors import DataLost, NoSuchEntry, NotFound
from broker.message_id import Position
from broker.service import BrokerService
from broker.subscription import Subscription
from broker.topic import PersistentTopic

DELETED_RANGES_SHOWN_MAX = 100
_SUMMED_TOPIC_FIELDS = ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "bytesInCounter",
                        "msgInCounter", "bytesOutCounter", "msgOutCounter", "storageSize", "backlogSize")
_SUMMED_SUBSCRIPTION_FIELDS = ("msgRateOut", "msgThroughputOut", "bytesOutCounter", "msgOutCounter",
                               "msgRateRedeliver", "msgRedeliverCounter", "msgBacklog", "backlogSize",
                               "unackedMessages", "msgDelayed")


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(prefix="/admin/v2", tags=["admin"])
    routes.include_router(tenants_router(service, authorizer))
    routes.include_router(namespaces_router(service, authorizer))
    routes.include_router(persistence_router(service, authorizer))
    routes.include_router(_stats_router(service, authorizer))
    routes.include_router(topics_router(service, authorizer))
    return routes


def _stats_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(prefix="/persistent")

    @routes.get("/{tenant}/{namespace}/{topic}/stats", summary="Topic statistics (Pulsar's TopicStats)")
    def stats(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return topic_stats(service, single_topic(service, topic_name(tenant, namespace, topic), "stats"))

    @routes.get("/{tenant}/{namespace}/{topic}/partitioned-stats",
                summary="Statistics summed over a partitioned topic's partitions (perPartition: each too)")
    def partitioned_stats(tenant: str, namespace: str, topic: str, caller: Caller,
                          perPartition: bool = True) -> dict[str, Any]:  # noqa: N803 - Pulsar's parameter
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        count = service.partitions(name)
        if count == 0:
            raise NotFound(f"partitioned topic {name} does not exist")
        parts = {p.full_name: topic_stats(service, service.topic(p, create=False))
                 for p in service.expand_partitions(name) if service.topic_exists(p)}
        body = _summed(list(parts.values()))
        body["metadata"] = {"partitions": count}
        body["partitions"] = parts if perPartition else {}
        return body

    @routes.get("/{tenant}/{namespace}/{topic}/internalStats",
                summary="Storage-level statistics: ledgers and cursors (Pulsar's PersistentTopicInternalStats)")
    def internal_stats(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        return topic_internal_stats(service, single_topic(service, name, "internalStats"))

    return routes


# --- TopicStats ------------------------------------------------------------------------------
def topic_stats(service: BrokerService, topic: PersistentTopic) -> dict[str, Any]:
    ml = topic.ml.statistics()
    rate_msgs, rate_bytes = topic.publish_rates()
    active = {s.name: s for s in service.subscriptions_of(topic.name)}
    subscriptions = {name: _subscription_stats(topic.cursors.get(name), active.get(name))
                     for name in topic.cursors.names()}
    subscriptions = {name: stats for name, stats in subscriptions.items() if stats}
    out = list(subscriptions.values())
    return {
        "msgRateIn": rate_msgs, "msgThroughputIn": rate_bytes,
        "msgRateOut": sum(s["msgRateOut"] for s in out),
        "msgThroughputOut": sum(s["msgThroughputOut"] for s in out),
        "bytesInCounter": ml.bytes_added, "msgInCounter": ml.messages_added,
        "bytesOutCounter": sum(s["bytesOutCounter"] for s in out),
        "msgOutCounter": sum(s["msgOutCounter"] for s in out),
        "averageMsgSize": rate_bytes / rate_msgs if rate_msgs else 0.0,
        "storageSize": ml.total_size_bytes, "offloadedStorageSize": 0,
        "backlogSize": max((s["backlogSize"] for s in out), default=0),
        "publishers": [], "subscriptions": subscriptions, "replication": {},
        "deduplicationStatus": "Enabled" if topic.dedup is not None else "Disabled",
        "firstOffset": ml.first_offset, "nextOffset": ml.next_offset, "terminated": ml.terminated,
    }


def _subscription_stats(cursor: ManagedCursor | None, active: Subscription | None) -> dict[str, Any]:
    if cursor is None:  # deleted meanwhile
        return {}
    body: dict[str, Any] = {
        "msgRateOut": 0.0, "msgThroughputOut": 0.0, "bytesOutCounter": 0, "msgOutCounter": 0,
        "msgRateRedeliver": 0.0, "msgRedeliverCounter": 0, "msgRateExpired": 0.0,
        "msgBacklog": cursor.backlog_messages(), "backlogSize": cursor.backlog_bytes(), "unackedMessages": 0,
        "msgDelayed": 0, "type": None, "isDurable": cursor.durable, "isReplicated": False, "consumers": [],
        "markDeleteOffset": cursor.mark_delete_offset, "readOffset": cursor.read_offset,
    }
    if active is not None:
        stats = active.statistics()
        body.update({
            "msgRateOut": stats.msg_rate_out, "msgThroughputOut": stats.msg_throughput_out,
            "bytesOutCounter": stats.bytes_out_counter, "msgOutCounter": stats.msg_out_counter,
            "msgRateRedeliver": stats.msg_rate_redeliver, "msgRedeliverCounter": stats.msg_redeliver_counter,
            "msgBacklog": stats.msg_backlog, "backlogSize": stats.backlog_size_bytes,
            "unackedMessages": stats.unacked_messages, "msgDelayed": stats.delayed_messages, "type": stats.type,
            "consumers": [{"consumerName": c.consumer_name, "availablePermits": c.available_permits,
                           "unackedMessages": c.unacked_messages, "msgOutCounter": c.msg_out_counter,
                           "bytesOutCounter": c.bytes_out_counter, "msgRedeliverCounter": c.msg_redeliver_counter,
                           "blockedConsumerOnUnackedMsgs": c.blocked_on_unacked} for c in stats.consumers],
        })
    return body


def _summed(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Pulsar's partitioned stats: counters and rates summed, subscriptions merged by name."""
    body: dict[str, Any] = {field: sum(p[field] for p in parts) for field in _SUMMED_TOPIC_FIELDS}
    body["averageMsgSize"] = body["msgThroughputIn"] / body["msgRateIn"] if body["msgRateIn"] else 0.0
    body["publishers"] = [publisher for p in parts for publisher in p["publishers"]]
    subscriptions: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, sub in part["subscriptions"].items():
            merged = subscriptions.setdefault(name, {field: 0 for field in _SUMMED_SUBSCRIPTION_FIELDS}
                                              | {"type": None, "consumers": []})
            for field in _SUMMED_SUBSCRIPTION_FIELDS:
                merged[field] += sub[field]
            merged["type"] = merged["type"] or sub["type"]
            merged["consumers"] = merged["consumers"] + sub["consumers"]
    body["subscriptions"] = subscriptions
    return body


# --- PersistentTopicInternalStats ----------------------------------------------------------
def topic_internal_stats(service: BrokerService, topic: PersistentTopic) -> dict[str, Any]:
    ml = topic.ml
    stats = ml.statistics()
    infos = ml.ledger_infos()
    last = stats.last_confirmed
    if last.ledger_id < 0 and infos:
        last = Position(infos[-1].ledger_id, -1)
    body: dict[str, Any] = {
        "entriesAddedCounter": stats.entries_added, "numberOfEntries": stats.number_of_entries,
        "totalSize": stats.total_size_bytes, "currentLedgerEntries": stats.current_ledger_entries,
        "currentLedgerSize": stats.current_ledger_size_bytes,
        "lastLedgerCreatedTimestamp": iso_time(infos[-1].created_ms) if infos else None,
        "lastConfirmedEntry": str(last), "state": "Terminated" if stats.terminated else "LedgerOpened",
        "ledgers": [{"ledgerId": i.ledger_id, "entries": i.entries, "size": i.size_bytes, "offloaded": False,
                     "firstOffset": i.first_offset, "messages": i.messages} for i in infos],
        "cursors": {},
        "firstOffset": stats.first_offset, "nextOffset": stats.next_offset,
    }
    active = {s.name: s for s in service.subscriptions_of(topic.name)}
    for name in topic.cursors.names():
        cursor = topic.cursors.get(name)
        if cursor is not None:
            body["cursors"][name] = _cursor_internal_stats(topic, cursor, active.get(name))
    compaction = service.compaction_status(topic.name)
    if compaction.ledger_id >= 0:
        body["compactedLedger"] = {"ledgerId": compaction.ledger_id, "entries": compaction.messages, "size": -1,
                                   "offloaded": False}
    return body


def _cursor_internal_stats(topic: PersistentTopic, cursor: ManagedCursor,
                           active: Subscription | None) -> dict[str, Any]:
    stats = cursor.statistics()
    ranges = cursor.acked_ranges()
    return {
        "markDeletePosition": str(cursor.mark_delete_position()),
        "readPosition": str(_read_position(topic, stats.read_offset)),
        "waitingReadOp": False, "pendingReadOps": 0,
        "messagesConsumedCounter": stats.messages_consumed,
        "cursorLedger": stats.cursor_ledger_id,
        "individuallyDeletedMessages": _deleted_entries(topic, ranges[:DELETED_RANGES_SHOWN_MAX]),
        "totalNonContiguousDeletedMessagesRange": stats.acked_ranges,
        "state": "Open", "active": bool(active is not None and active.consumers),
        "properties": dict(cursor.properties),
        "markDeleteOffset": stats.mark_delete_offset, "readOffset": stats.read_offset,
        "ackedOffsetRanges": [[start, end] for start, end in ranges[:DELETED_RANGES_SHOWN_MAX]],
        "persistedStates": stats.persisted_states,
    }


def _read_position(topic: PersistentTopic, read_offset: int) -> Position:
    ml = topic.ml
    if read_offset < ml.confirmed_next_offset():
        return ml.offset_to_position(max(read_offset, ml.first_offset))[0]
    return ml.next_position(ml.last_confirmed)


def _deleted_entries(topic: PersistentTopic, ranges: list[tuple[int, int]]) -> str:
    """Pulsar's ``[(l:e..l:e],...]``: entries wholly inside the acknowledged offset ranges."""
    shown = []
    for start, end in ranges:
        span = _whole_entries(topic, start, end)
        if span is not None:
            shown.append(f"({span[0]}..{span[1]}]")
    return "[" + ",".join(shown) + "]"


def _whole_entries(topic: PersistentTopic, start: int, end: int) -> tuple[Position, Position] | None:
    """(position before the first, last) entry whose messages all lie in ``[start, end)``."""
    ml = topic.ml
    try:
        first_position, index = ml.offset_to_position(start)
        first = ml.read_entry(first_position)
        low = start if index == 0 else first.last_offset + 1
        last_position, _ = ml.offset_to_position(end - 1)
        last = ml.read_entry(last_position)
        high = end - 1 if last.last_offset == end - 1 else last.first_offset - 1
        if low > high:
            return None
        low_position = first_position if low == start else ml.offset_to_position(low)[0]
        high_position = last_position if high == end - 1 else ml.offset_to_position(high)[0]
    except (DataLost, NoSuchEntry):  # trimmed meanwhile
        return None
    return Position(low_position.ledger_id, low_position.entry_id - 1), high_position

