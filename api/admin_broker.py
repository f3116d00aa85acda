"""Broker-wide statistics as JSON: ``/admin/v2/broker-stats/overview`` and a namespace's topic list.

Role: what a dashboard shows at a glance (the web console's overview and namespace pages),
read from ``BrokerService.statistics()`` and the topic statistics views, as ``/metrics`` and the
topic ``stats`` are: nothing is counted here.

- ``GET /admin/v2/broker-stats/overview`` (superuser): health and uptime; the event loop's
  stalls and the garbage collector's pauses (``eventLoop``, from ``api/loop_stalls.py``); the embedded bookie
  (journal with fsync latency percentiles, write and read caches with hit ratios, entry logs,
  the RocksDB index, GC, read-only state), or on a cluster broker (``storage`` null) its
  bookies and re-replication (``cluster``); the broker's entry cache and key index, and how
  many maintenance passes ran (``maintenancePasses``) and how many appends were refused
  because another broker recovered their topic (``appendsFenced``); how many topics,
  subscriptions and consumers are loaded, and how many subscriptions every topic has, loaded
  or not (``subscriptions``: ``total`` null until the first count, ``broker/subscription_census.py``);
  the message and byte rates and counters in and
  out, summed over the loaded topics; and those rates over the last minutes (``history``,
  ``broker/rate_history.py``), oldest first.
- ``GET /admin/v2/broker-stats/namespaces/{tenant}/{namespace}/topics`` (tenant admin): every
  topic of the namespace, a partitioned topic as one row summed over its partitions, with rates,
  storage size, backlog and producer, subscription and consumer counts.

Invariants: both routes only read. Rates are the broker's own (over its last maintenance
interval), as in ``stats``. Fsync latency and loop stall percentiles are estimated from the journal's
fixed-bucket histogram by linear interpolation inside the bucket that holds the rank (as
Prometheus's ``histogram_quantile`` does); a rank beyond the last bucket reads as that bucket's
bound. A topic's ``backlog`` is its slowest subscription's (Pulsar's ``backlogSize`` is the same
maximum, in bytes). A namespace lists at most ``TOPICS_LISTED_MAX`` rows (``truncated`` says
when there were more); listing loads the topics it shows, as their ``stats`` would. Uptime
counts from when the HTTP application was built, which is when its broker starts.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from api.admin_namespaces import namespace_name
from api.auth import Authorizer, Caller
from api.limits import TOPICS_LISTED_MAX
from api.loop_stalls import LoopStallMonitor, LoopStallStats
from broker import (
    BrokerService,
    BrokerStats,
    ByteBudgetStats,
    LatencySnapshot,
    MagnetarError,
    StorageStats,
    TopicName,
    TopicStats,
    iso_time,
)

if TYPE_CHECKING:
    from broker.cluster import ClusterStats

FSYNC_PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))


def _ratio(hits: int, total: int) -> float | None:
    return hits / total if total else None


def latency_percentile_us(bounds_us: tuple[int, ...], cumulative: tuple[int, ...], count: int,
                          quantile: float) -> float | None:
    """The ``quantile`` of a cumulative fixed-bucket histogram, interpolated inside its bucket;
    None without observations."""
    if count == 0:
        return None
    rank = quantile * count
    below, lower_us = 0, 0
    for bound_us, at_or_under in zip(bounds_us, cumulative, strict=True):
        if at_or_under >= rank:
            inside = at_or_under - below
            share = (rank - below) / inside if inside else 1.0
            return lower_us + (bound_us - lower_us) * share
        below, lower_us = at_or_under, bound_us
    return float(bounds_us[-1])


def storage_overview(stats: StorageStats) -> dict[str, Any]:
    journal, latency, reads = stats.journal, stats.journal.fsync_latency, stats.read_path
    read_cache, logs, index, gc = stats.read_cache, stats.entry_logs, stats.index, stats.gc
    served = reads.write_cache_hits + reads.flushing_cache_hits + reads.read_cache_hits + reads.entry_log_reads
    percentiles = _percentiles_us(latency)
    return {
        "readOnly": stats.read_only, "ledgers": stats.ledgers, "entriesAdded": stats.entries_added,
        "flushes": stats.flushes, "checkpoints": stats.checkpoints,
        "flushLatencyUs": _percentiles_us(stats.flush_latency),
        "flushLatencyBucketsUs": [[bound, count] for bound, count in stats.flush_latency.buckets_us()],
        "journal": {
            "recordsWritten": journal.records_written, "bytesWritten": journal.bytes_written,
            "fsyncs": latency.count, "groupsCommitted": journal.groups_committed,
            "groupsOnCallerThread": journal.groups_on_caller_thread,
            "largestGroupRecords": journal.largest_group_records, "queueDepth": journal.queue_depth,
            "files": journal.files,
            "fsyncLatencyUs": percentiles | {"mean": latency.sum_seconds * 1e6 / latency.count
                                             if latency.count else None},
            "fsyncLatencyBucketsUs": [[bound, count] for bound, count in latency.buckets_us()],
        },
        "writeCache": {
            "sizeBytes": stats.write_cache.size_bytes, "capacityBytes": stats.write_cache.capacity_bytes,
            "entries": stats.write_cache.entries,
            "beingFlushedBytes": stats.write_cache_being_flushed.size_bytes,
            "hits": reads.write_cache_hits + reads.flushing_cache_hits,
            "hitRatio": _ratio(reads.write_cache_hits + reads.flushing_cache_hits, served),
        },
        "readCache": {
            "sizeBytes": read_cache.size_bytes, "capacityBytes": read_cache.capacity_bytes,
            "entries": read_cache.entries, "hits": read_cache.hits, "misses": read_cache.misses,
            "evictions": read_cache.evictions, "hitRatio": _ratio(read_cache.hits, read_cache.hits + read_cache.misses),
        },
        "reads": {"writeCache": reads.write_cache_hits, "writeCacheBeingFlushed": reads.flushing_cache_hits,
                  "readCache": reads.read_cache_hits, "entryLog": reads.entry_log_reads},
        "entryLogs": {"logs": logs.logs, "diskBytes": logs.disk_bytes, "bytesAppended": logs.bytes_appended,
                      "entriesAppended": logs.entries_appended},
        "index": {"sstBytes": index.sst_bytes, "memtableBytes": index.memtable_bytes,
                  "locationsWritten": index.locations_written, "lookups": index.lookups},
        "gc": {"runs": gc.runs, "logsRemoved": gc.logs_removed, "logsCompacted": gc.logs_compacted,
               "reclaimedBytes": gc.bytes_reclaimed},
    }


def _percentiles_us(snapshot: LatencySnapshot) -> dict[str, float | None]:
    return {name: latency_percentile_us(snapshot.bounds_us, snapshot.cumulative_counts, snapshot.count, q)
            for name, q in FSYNC_PERCENTILES}


def event_loop_overview(stats: LoopStallStats) -> dict[str, Any]:
    """The event loop's stalls (percentiles, the longest, the latest long ones) and the gc's pauses."""
    stalls = stats.stalls
    return {
        "stallUs": _percentiles_us(stalls) | {"max": stats.max_seconds * 1e6},
        "samples": stalls.count,
        "stallBucketsUs": [[bound, count] for bound, count in stalls.buckets_us()],
        "longestStalls": [{"at": iso_time(int(s.at_s * 1000)), "us": s.seconds * 1e6, "windowUs": s.window_s * 1e6,
                           "loopCpuUs": s.loop_cpu_s * 1e6, "processCpuUs": s.process_cpu_s * 1e6,
                           "loopWaits": s.loop_waits, "loopPreemptions": s.loop_preemptions}
                          for s in stats.longest],
        "gcPauses": [{"generation": generation, "collections": pauses.count, "totalUs": pauses.sum_seconds * 1e6,
                      "pauseUs": _percentiles_us(pauses)} for generation, pauses in stats.gc_pauses.items()],
    }


def cluster_overview(stats: ClusterStats) -> dict[str, Any]:
    """A cluster broker's bookies as it sees them, and its re-replication worker's progress."""
    recovery = stats.autorecovery
    return {
        "bookiesAvailable": stats.bookies_available,
        "bookies": [{"address": c.address, "connected": c.connected, "inflight": c.inflight,
                     "requests": c.requests, "responses": c.responses, "timeouts": c.timeouts,
                     "failures": c.failures} for c in stats.connections],
        "autorecovery": None if recovery is None else {
            "underreplicatedLedgers": recovery.underreplicated, "ledgersReplicated": recovery.ledgers_replicated,
            "entriesCopied": recovery.entries_copied, "failures": recovery.failures},
    }


def traffic_overview(broker: BrokerStats) -> dict[str, Any]:
    """Rates and counters summed over the loaded topics, and how many of everything are loaded."""
    topics = broker.topics
    return {"rates": {"msgRateIn": sum(t.msg_rate_in for t in topics),
                      "msgThroughputIn": sum(t.msg_throughput_in for t in topics),
                      "msgRateOut": sum(t.msg_rate_out for t in topics),
                      "msgThroughputOut": sum(t.msg_throughput_out for t in topics)},
            "counters": {"msgInCounter": sum(t.msg_in_counter for t in topics),
                         "bytesInCounter": sum(t.bytes_in_counter for t in topics),
                         "msgOutCounter": sum(t.msg_out_counter for t in topics),
                         "bytesOutCounter": sum(t.bytes_out_counter for t in topics)},
            "loaded": {"topics": len(topics), "subscriptions": sum(len(t.subscriptions) for t in topics),
                       "consumers": sum(len(s.consumers) for t in topics for s in t.subscriptions)},
            "subscriptions": _subscription_count(broker)}


def _subscription_count(broker: BrokerStats) -> dict[str, Any]:
    count = broker.subscription_count
    if count is None:
        return {"total": None, "topicsCounted": 0, "complete": False, "countedAtMs": None}
    return {"total": count.total, "topicsCounted": count.topics_counted, "complete": count.complete,
            "countedAtMs": count.counted_at_ms}


def _topic_row(service: BrokerService, name: TopicName, partitions: int) -> dict[str, Any]:
    parts: list[TopicStats] = list(service.admin.partitioned_stats(name).values()) if partitions else \
        [service.admin.stats(name)]
    backlogs: dict[str, int] = {}
    consumers: dict[str, int] = {}
    for part in parts:
        for sub in part.subscriptions:
            backlogs[sub.name] = backlogs.get(sub.name, 0) + sub.msg_backlog
            consumers[sub.name] = consumers.get(sub.name, 0) + len(sub.consumers)
    return {
        "name": name.full_name, "localName": name.local_name, "partitions": partitions,
        "msgRateIn": sum(p.msg_rate_in for p in parts), "msgThroughputIn": sum(p.msg_throughput_in for p in parts),
        "msgRateOut": sum(p.msg_rate_out for p in parts), "msgThroughputOut": sum(p.msg_throughput_out for p in parts),
        "storageSize": sum(p.storage_size_bytes for p in parts), "msgInCounter": sum(p.msg_in_counter for p in parts),
        "backlog": max(backlogs.values(), default=0),
        "producers": 0,
        "subscriptions": len(backlogs),
        "consumers": sum(consumers.values()),
        "terminated": bool(parts) and all(p.terminated for p in parts),
    }


def namespace_topics(service: BrokerService, namespace: str) -> dict[str, Any]:
    service.namespaces.policies(namespace)  # NotFound for an unknown namespace
    partitioned = {TopicName.parse(n): service.topics.partitions(TopicName.parse(n))
                   for n in service.topics.partitioned_names(namespace)}
    plain = [TopicName.parse(n) for n in service.topics.names(namespace)]
    rows: dict[TopicName, int] = dict(partitioned)
    for name in plain:
        if name.partition_index < 0 or name.base not in partitioned:
            rows.setdefault(name, 0)
    names = sorted(rows, key=lambda n: n.full_name)
    listed = []
    for name in names[:TOPICS_LISTED_MAX]:
        with contextlib.suppress(MagnetarError):  # deleted meanwhile: left out
            listed.append(_topic_row(service, name, rows[name]))
    return {"namespace": namespace, "topics": listed, "truncated": len(names) > TOPICS_LISTED_MAX}


def router(service: BrokerService, authorizer: Authorizer, stalls: LoopStallMonitor) -> APIRouter:
    routes = APIRouter(prefix="/admin/v2/broker-stats", tags=["admin"])
    started_s, started_monotonic_s = time.time(), time.monotonic()

    @routes.get("/overview", summary="Health, uptime, storage statistics and broker-wide rates (Magnetar)")
    def overview(caller: Caller) -> dict[str, Any]:
        authorizer.require_superuser(caller)
        health = service.health()
        stats = service.statistics()
        return {
            "status": health.status, "startedAt": iso_time(int(started_s * 1000)),
            "uptimeSeconds": time.monotonic() - started_monotonic_s, "timestamp": int(time.time() * 1000),
            "eventLoop": event_loop_overview(stalls.statistics()),
            "storage": None if stats.storage is None else storage_overview(stats.storage),
            "cluster": None if stats.cluster is None else cluster_overview(stats.cluster),
            "entryCache": _entry_cache(stats),
            "keyIndex": None if stats.key_index is None else _key_index(stats),
            "maintenancePasses": stats.maintenance_passes,
            "appendsFenced": stats.appends_fenced,
            "readsInFlight": _budget(stats.reads_in_flight),
            "publishBuffer": _budget(stats.publish_buffer),
            "history": [{"timestamp": s.at_ms, "msgRateIn": s.msg_rate_in, "msgRateOut": s.msg_rate_out,
                         "msgThroughputIn": s.msg_throughput_in, "msgThroughputOut": s.msg_throughput_out}
                        for s in stats.rate_history],
            **traffic_overview(stats),
        }

    @routes.get("/namespaces/{tenant}/{namespace}/topics",
                summary="The namespace's topics with rates, storage, backlog and counts (Magnetar)")
    def topics(tenant: str, namespace: str, caller: Caller) -> dict[str, Any]:
        authorizer.require_tenant_admin(caller, tenant)
        return namespace_topics(service, namespace_name(tenant, namespace))

    return routes


def _key_index(broker: BrokerStats) -> dict[str, Any]:
    keys = broker.key_index
    assert keys is not None
    return {"partitions": keys.partitions, "pendingRows": keys.pending_rows, "rowsIndexed": keys.rows_indexed,
            "checkpoints": keys.checkpoints, "segments": keys.segments, "entriesReplayed": keys.entries_replayed,
            "versionMismatches": keys.version_mismatches, "rowsCleaned": keys.rows_cleaned,
            "compactions": keys.compactions, "blockCacheHits": keys.block_cache_hits,
            "blockCacheMisses": keys.block_cache_misses, "dcbRowsRead": keys.dcb_rows_read,
            "dcbEntriesRead": keys.dcb_entries_read}


def _budget(budget: ByteBudgetStats | None) -> dict[str, Any] | None:
    if budget is None:
        return None
    return {"usedBytes": budget.used_bytes, "maxBytes": budget.bytes_max, "peakBytes": budget.peak_bytes,
            "waits": budget.waits, "waiting": budget.waiting}


def _entry_cache(broker: BrokerStats) -> dict[str, Any]:
    cache = broker.entry_cache
    return {"sizeBytes": cache.size_bytes, "capacityBytes": cache.capacity_bytes, "entries": cache.entries,
            "hits": cache.hits, "misses": cache.misses, "hitRatio": _ratio(cache.hits, cache.hits + cache.misses)}
