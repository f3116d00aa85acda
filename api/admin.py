"""Admin v2 REST API (Pulsar's ``/admin/v2``): the router, and the topic statistics documents.

Role: ``router(service, authorizer)`` assembles the admin API: tenants and namespaces
(``api/admin_namespaces.py``), quotas and rate limits (``api/admin_quotas.py``), topics,
subscriptions, cursor moves, messages, compaction and termination (``api/admin_topics.py``),
non-persistent topics (``api/admin_non_persistent.py``), and, here, ``stats``, ``partitioned-stats`` and
``internalStats``: the broker's statistics views (``BrokerService.admin``) rendered in Pulsar's
``TopicStats``, ``PartitionedTopicStats`` and ``PersistentTopicInternalStats`` shapes, plus
Magnetar's offsets.

Invariants: every route checks that the caller administers the tenant before any broker call;
statistics only read. ``publishers`` is empty (producers are counted per topic for
``maxProducers``, not listed). ``individuallyDeletedMessages`` lists whole entries acknowledged above
the mark-delete position (a partly acknowledged batch is not shown; Pulsar shows those as batch
ack sets).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.admin_namespaces import namespaces_router, tenants_router
from api.admin_non_persistent import non_persistent_router
from api.admin_persistence import persistence_router
from api.admin_quotas import quotas_router
from api.admin_schemas import schemas_router
from api.admin_topics import topic_name, topics_router
from api.auth import Authorizer, Caller
from broker import BrokerService, ConsumerStats, CursorView, InternalStats, SubscriptionStats, TopicStats, iso_time

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
    routes.include_router(quotas_router(service, authorizer))
    routes.include_router(schemas_router(service, authorizer))
    routes.include_router(_stats_router(service, authorizer))
    routes.include_router(topics_router(service, authorizer))
    routes.include_router(non_persistent_router(service, authorizer))
    return routes


def _stats_router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    routes = APIRouter(prefix="/persistent")

    @routes.get("/{tenant}/{namespace}/{topic}/stats", summary="Topic statistics (Pulsar's TopicStats)")
    def stats(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        body = topic_stats_json(service.admin.stats(name))
        body["ownerBroker"] = service.namespaces.owner_of(name)  # a cluster broker's id (this one: it serves the topic)
        return body

    @routes.get("/{tenant}/{namespace}/{topic}/partitioned-stats",
                summary="Statistics summed over a partitioned topic's partitions (perPartition: each too)")
    def partitioned_stats(tenant: str, namespace: str, topic: str, caller: Caller,
                          perPartition: bool = True) -> dict[str, Any]:  # noqa: N803 - Pulsar's parameter
        authorizer.require_tenant_admin(caller, tenant)
        name = topic_name(tenant, namespace, topic)
        parts = {partition: topic_stats_json(stats)
                 for partition, stats in service.admin.partitioned_stats(name).items()}
        body = _summed(list(parts.values()))
        body["metadata"] = {"partitions": service.topics.partitions(name)}
        body["partitions"] = parts if perPartition else {}
        return body

    @routes.get("/{tenant}/{namespace}/{topic}/internalStats",
                summary="Storage-level statistics: ledgers and cursors (Pulsar's PersistentTopicInternalStats)")
    def internal_stats(tenant: str, namespace: str, topic: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return internal_stats_json(service.admin.internal_stats(topic_name(tenant, namespace, topic)))

    return routes


# --- TopicStats ------------------------------------------------------------------------------
def topic_stats_json(stats: TopicStats) -> dict[str, Any]:
    return {
        "msgRateIn": stats.msg_rate_in, "msgThroughputIn": stats.msg_throughput_in,
        "msgRateOut": stats.msg_rate_out, "msgThroughputOut": stats.msg_throughput_out,
        "bytesInCounter": stats.bytes_in_counter, "msgInCounter": stats.msg_in_counter,
        "bytesOutCounter": stats.bytes_out_counter, "msgOutCounter": stats.msg_out_counter,
        "averageMsgSize": stats.msg_throughput_in / stats.msg_rate_in if stats.msg_rate_in else 0.0,
        "storageSize": stats.storage_size_bytes, "offloadedStorageSize": stats.offloaded_size_bytes,
        "backlogSize": stats.backlog_size_bytes,
        "publishers": [], "subscriptions": {s.name: _subscription_json(s) for s in stats.subscriptions},
        "replication": {}, "deduplicationStatus": "Enabled" if stats.dedup_enabled else "Disabled",
        "firstOffset": stats.first_offset, "nextOffset": stats.next_offset, "terminated": stats.terminated,
    }


def _subscription_json(view: SubscriptionStats) -> dict[str, Any]:
    return {
        "msgRateOut": view.msg_rate_out, "msgThroughputOut": view.msg_throughput_out,
        "bytesOutCounter": view.bytes_out_counter, "msgOutCounter": view.msg_out_counter,
        "msgRateRedeliver": view.msg_rate_redeliver, "msgRedeliverCounter": view.msg_redeliver_counter,
        "msgRateExpired": 0.0, "msgBacklog": view.msg_backlog, "backlogSize": view.backlog_size_bytes,
        "unackedMessages": view.unacked_messages, "msgDelayed": view.delayed_messages, "type": view.type,
        "isDurable": view.durable, "isReplicated": False,
        "consumers": [_consumer_json(c) for c in view.consumers],
        "markDeleteOffset": view.mark_delete_offset, "readOffset": view.read_offset,
    }


def _consumer_json(c: ConsumerStats) -> dict[str, Any]:
    """Pulsar's ConsumerStats (the fields Magnetar keeps)."""
    return {"consumerName": c.name, "address": c.address, "connectedSince": iso_time(c.connected_since_ms),
            "availablePermits": c.available_permits, "unackedMessages": c.unacked_messages,
            "msgRateOut": c.msg_rate_out, "msgThroughputOut": c.msg_throughput_out,
            "msgRateRedeliver": c.msg_rate_redeliver, "msgOutCounter": c.msg_out_counter,
            "bytesOutCounter": c.bytes_out_counter, "msgRedeliverCounter": c.msg_redeliver_counter,
            "blockedConsumerOnUnackedMsgs": c.blocked_on_unacked}


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
def internal_stats_json(stats: InternalStats) -> dict[str, Any]:
    body: dict[str, Any] = {
        "entriesAddedCounter": stats.entries_added, "numberOfEntries": stats.number_of_entries,
        "totalSize": stats.total_size_bytes, "currentLedgerEntries": stats.current_ledger_entries,
        "currentLedgerSize": stats.current_ledger_size_bytes,
        "lastLedgerCreatedTimestamp": iso_time(stats.ledgers[-1].created_ms) if stats.ledgers else None,
        "lastConfirmedEntry": str(stats.last_confirmed), "state": "Terminated" if stats.terminated else "LedgerOpened",
        "ledgers": [{"ledgerId": i.ledger_id, "entries": i.entries, "size": i.size_bytes, "offloaded": i.offloaded,
                     "bookkeeperDeleted": i.local_deleted, "firstOffset": i.first_offset, "messages": i.messages}
                    for i in stats.ledgers],
        "cursors": {c.name: _cursor_json(c) for c in stats.cursors},
        "firstOffset": stats.first_offset, "nextOffset": stats.next_offset,
    }
    if stats.offload is not None:  # Magnetar: how the topic's last offload went (GET …/offload)
        body["offload"] = stats.offload.to_json()
    if stats.compaction.ledger_id >= 0:
        body["compactedLedger"] = {"ledgerId": stats.compaction.ledger_id, "entries": stats.compaction.messages,
                                   "size": -1, "offloaded": False}
    return body


def _cursor_json(cursor: CursorView) -> dict[str, Any]:
    return {
        "markDeletePosition": str(cursor.mark_delete_position), "readPosition": str(cursor.read_position),
        "waitingReadOp": False, "pendingReadOps": 0,
        "messagesConsumedCounter": cursor.messages_consumed, "cursorLedger": cursor.cursor_ledger_id,
        "individuallyDeletedMessages": "[" + ",".join(f"({low}..{high}]" for low, high in cursor.deleted_entry_spans)
                                       + "]",
        "totalNonContiguousDeletedMessagesRange": cursor.acked_ranges,
        "state": "Open", "active": cursor.active, "properties": cursor.properties,
        "markDeleteOffset": cursor.mark_delete_offset, "readOffset": cursor.read_offset,
        "ackedOffsetRanges": [[start, end] for start, end in cursor.acked_offset_ranges],
        "persistedStates": cursor.persisted_states,
    }
