"""``GET /metrics``: the broker's statistics in Prometheus's text exposition format.

Role: one custom collector reads ``BrokerService.statistics()`` at scrape time — the event
loop's stalls and the garbage collector's pauses (``api/loop_stalls.py``), the embedded
bookie (journal, write cache, read cache, entry logs, index, GC), the broker's entry cache and
metadata store, every open topic (managed ledger and publish rates) and its subscriptions — and
renders them. Nothing is counted twice: there are no metric objects to keep
in step with the broker, only the broker's own counters read when Prometheus asks.

Names follow Prometheus's conventions (``magnetar_`` prefix, ``_total`` counters, base units:
seconds and bytes). Topics are labelled ``topic="persistent://tenant/namespace/topic"`` (one
series per partition), subscriptions additionally ``subscription="name"``. Rates are the
broker's own (recomputed every maintenance interval); prefer ``rate()`` over the counters.

Invariants: counters start at zero when the broker process starts (as Pulsar's do) and only
grow while it runs — except ``magnetar_topic_messages_out_total``, the sum over the topic's
subscriptions, which drops when a subscription is deleted (``rate()`` reads that as a reset);
every histogram's (fsync latency, loop stalls, gc pauses) buckets are cumulative and its
``+Inf`` bucket equals its ``_count``, both from one snapshot; a topic closed or deleted while a scrape runs is left out
of that scrape rather than failing it.

Access: public, also with token authentication on, like Pulsar with its default
``authenticateMetricsEndpoint=false``; the metrics name topics and subscriptions but carry no
message data. With ``authenticateMetricsEndpoint=true`` a scrape needs a superuser's token.

Cost: a scrape reads each topic's and subscription's counters once (the service indexes
subscriptions by topic), so it is linear in topics plus subscriptions and holds no broker-wide
lock while rendering; scrapes that arrive while one is being rendered wait for it and share
its text, so a burst of concurrent scrapes costs one rendering.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from api.auth import Authorizer, Caller
from api.limits import METRIC_ERROR_LABEL_CHARS_MAX
from api.loop_stalls import LoopStallMonitor, LoopStallStats
from broker import (
    BrokerService,
    BrokerStats,
    ByteBudgetStats,
    LatencySnapshot,
    StorageStats,
    SubscriptionStats,
    TopicStats,
)

if TYPE_CHECKING:
    from broker.cluster import ClusterStats

TOPIC_LABELS = ("topic",)
SUBSCRIPTION_LABELS = ("topic", "subscription")


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _labelled(kind: type[CounterMetricFamily | GaugeMetricFamily], name: str, doc: str, label: str,
              values: dict[str, int]) -> Metric:
    family = kind(name, doc, labels=[label])
    for label_value, value in values.items():
        family.add_metric([label_value], value)
    return family


# --- storage --------------------------------------------------------------------------------------
def histogram_buckets(snapshot: LatencySnapshot) -> list[tuple[str, float]]:
    """A fixed-bucket snapshot as Prometheus's cumulative ``le`` buckets in seconds, ``+Inf`` last."""
    buckets = [(str(bound_us / 1e6), float(count)) for bound_us, count in snapshot.buckets_us()]
    buckets.append(("+Inf", float(snapshot.count)))
    return buckets


def storage_metrics(stats: StorageStats) -> list[Metric]:
    """The embedded bookie, from one ``statistics()`` snapshot."""
    journal, logs, gc, index = stats.journal, stats.entry_logs, stats.gc, stats.index
    reads, read_cache, latency = stats.read_path, stats.read_cache, stats.journal.fsync_latency
    buffers = {"active": stats.write_cache, "being_flushed": stats.write_cache_being_flushed}
    fsync_buckets, flush = histogram_buckets(latency), stats.flush_latency
    return [
        _gauge("magnetar_storage_ledgers", "Ledgers in the embedded bookie", stats.ledgers),
        _counter("magnetar_storage_entries_added", "Entries added to the bookie", stats.entries_added),
        _gauge("magnetar_storage_read_only", "1 when the bookie went read-only after an I/O error",
               1 if stats.read_only else 0),
        _counter("magnetar_storage_flushes", "Write-cache flushes to entry logs", stats.flushes),
        _counter("magnetar_storage_checkpoints", "Journal checkpoints", stats.checkpoints),
        _counter("magnetar_journal_records", "Records written to the journal", journal.records_written),
        _counter("magnetar_journal_bytes_written", "Bytes written to the journal", journal.bytes_written),
        _counter("magnetar_journal_groups_committed", "Journal group commits", journal.groups_committed),
        _counter("magnetar_journal_groups_on_caller_thread",
                 "Journal group commits made by the event loop that appended them (the journal was idle)",
                 journal.groups_on_caller_thread),
        _gauge("magnetar_journal_queue_depth", "Records waiting for the journal writer", journal.queue_depth),
        _gauge("magnetar_journal_files", "Journal files on disk", journal.files),
        _counter("magnetar_journal_fsyncs", "Journal fdatasync calls", latency.count),
        HistogramMetricFamily("magnetar_journal_fsync_latency_seconds", "Duration of the journal's fdatasync",
                              buckets=fsync_buckets, sum_value=latency.sum_seconds),
        HistogramMetricFamily("magnetar_storage_flush_seconds", "Duration of a write-cache flush (entries to the "
                              "entry logs, their sync, the index batch)",
                              buckets=histogram_buckets(flush), sum_value=flush.sum_seconds),
        _labelled(GaugeMetricFamily, "magnetar_write_cache_size_bytes", "Bytes held in a write-cache buffer",
                  "buffer", {name: b.size_bytes for name, b in buffers.items()}),
        _labelled(GaugeMetricFamily, "magnetar_write_cache_entries", "Entries held in a write-cache buffer",
                  "buffer", {name: b.entries for name, b in buffers.items()}),
        _counter("magnetar_write_cache_hits", "Entry reads served by either write-cache buffer",
                 reads.write_cache_hits + reads.flushing_cache_hits),
        _counter("magnetar_write_cache_misses", "Entry reads that went past both write-cache buffers",
                 read_cache.hits + read_cache.misses),
        _counter("magnetar_read_cache_hits", "Entry reads served by the read cache", read_cache.hits),
        _counter("magnetar_read_cache_misses", "Entry reads the read cache could not serve", read_cache.misses),
        _counter("magnetar_read_cache_evictions", "Entries evicted from the read cache", read_cache.evictions),
        _gauge("magnetar_read_cache_size_bytes", "Bytes held in the read cache", read_cache.size_bytes),
        _labelled(CounterMetricFamily, "magnetar_storage_reads", "Entry reads by the level that served them",
                  "served_by", {"write_cache": reads.write_cache_hits,
                                "write_cache_being_flushed": reads.flushing_cache_hits,
                                "read_cache": reads.read_cache_hits, "entry_log": reads.entry_log_reads}),
        _gauge("magnetar_entry_logs", "Entry log files on disk", logs.logs),
        _gauge("magnetar_entry_log_disk_bytes", "Bytes of entry log files on disk", logs.disk_bytes),
        _counter("magnetar_entry_log_bytes_appended", "Bytes appended to entry logs", logs.bytes_appended),
        _counter("magnetar_entry_log_entries_appended", "Entries appended to entry logs", logs.entries_appended),
        _counter("magnetar_entry_log_syncs", "Entry log syncs", logs.syncs),
        _counter("magnetar_entry_log_reads", "Entry reads from entry logs", logs.reads),
        _counter("magnetar_index_locations_written", "Entry locations written to the RocksDB index",
                 index.locations_written),
        _counter("magnetar_index_lookups", "Entry location lookups in the RocksDB index", index.lookups),
        _counter("magnetar_gc_runs", "Entry log garbage collection runs", gc.runs),
        _counter("magnetar_gc_logs_removed", "Entry logs removed by garbage collection", gc.logs_removed),
        _counter("magnetar_gc_logs_compacted", "Entry logs compacted", gc.logs_compacted),
        _counter("magnetar_gc_reclaimed_bytes", "Disk bytes reclaimed by garbage collection", gc.bytes_reclaimed),
    ]


# --- event loop -----------------------------------------------------------------------------------
def loop_stall_metrics(stats: LoopStallStats) -> Iterator[Metric]:
    """The server's event loop (``api/loop_stalls.py``) and Python's garbage collector."""
    yield HistogramMetricFamily("magnetar_event_loop_stall_seconds",
                                "How late the event loop ran a heartbeat due every 10 ms (callbacks and the "
                                "interpreter lock holding it)", buckets=histogram_buckets(stats.stalls),
                                sum_value=stats.stalls.sum_seconds)
    yield _gauge("magnetar_event_loop_stall_max_seconds", "The longest event loop stall since the broker started",
                 stats.max_seconds)
    pauses = HistogramMetricFamily("magnetar_python_gc_pause_seconds",
                                   "Duration of the cyclic garbage collector's collections", labels=["generation"])
    for generation, snapshot in stats.gc_pauses.items():
        pauses.add_metric([str(generation)], histogram_buckets(snapshot), snapshot.sum_seconds)
    yield pauses


# --- cluster --------------------------------------------------------------------------------------
def cluster_metrics(stats: ClusterStats) -> Iterator[Metric]:
    """A cluster broker's remote bookies and re-replication, from one ``statistics()`` snapshot."""
    yield _gauge("magnetar_bookies_available", "Bookies registered in ZooKeeper", stats.bookies_available)
    by_bookie = {c.address: c for c in stats.connections}
    for name, doc, field in (("requests", "Requests sent to a bookie", "requests"),
                             ("responses", "Responses received from a bookie", "responses"),
                             ("timeouts", "Bookie requests that timed out", "timeouts"),
                             ("connection_failures", "Bookie connections that failed", "failures")):
        yield _labelled(CounterMetricFamily, f"magnetar_bookie_{name}", doc, "bookie",
                        {address: getattr(c, field) for address, c in by_bookie.items()})
    recovery = stats.autorecovery
    if recovery is not None:
        yield _counter("magnetar_autorecovery_entries_copied", "Entries copied by re-replication",
                       recovery.entries_copied)
        yield _counter("magnetar_autorecovery_ledgers_replicated", "Ledgers re-replicated",
                       recovery.ledgers_replicated)
        yield _gauge("magnetar_autorecovery_underreplicated_ledgers", "Ledgers marked under-replicated",
                     recovery.underreplicated)
    ownership = stats.ownership
    if ownership is not None:
        yield _gauge("magnetar_bundles_owned", "Namespace bundles this broker owns", ownership.owned_bundles)
        yield _gauge("magnetar_serving", "1 while its ZooKeeper session lets this broker serve", int(ownership.serving))
        yield _counter("magnetar_lookups", "Topic lookups answered", ownership.lookups)
        yield _counter("magnetar_lookup_redirects", "Lookups answered with another broker", ownership.redirects)
        yield _counter("magnetar_bundles_acquired", "Bundles this broker took", ownership.acquired)
        yield _counter("magnetar_bundles_released", "Bundles this broker gave up (unload, split)", ownership.released)
        yield _counter("magnetar_zookeeper_sessions_lost", "ZooKeeper sessions this broker lost",
                       ownership.sessions_lost)


# --- broker ---------------------------------------------------------------------------------------
def broker_metrics(broker: BrokerStats) -> Iterator[Metric]:
    cache = broker.entry_cache
    yield _gauge("magnetar_entry_cache_size_bytes", "Bytes held in the broker's entry cache", cache.size_bytes)
    yield _counter("magnetar_entry_cache_hits", "Entry reads served by the broker's entry cache", cache.hits)
    yield _counter("magnetar_entry_cache_misses", "Entry reads the broker's entry cache could not serve",
                   cache.misses)
    store = broker.metadata_store
    yield _labelled(CounterMetricFamily, "magnetar_metadata_store_operations", "Metadata store operations", "op",
                    {"get": store.gets, "put": store.puts, "delete": store.deletes})
    yield _counter("magnetar_metadata_store_cas_failures", "Metadata compare-and-set conflicts", store.cas_failures)
    yield _counter("magnetar_appends_fenced", "Appends refused because another broker recovered their topic "
                   "(fenced its ledger or rewrote its ledger list)", broker.appends_fenced)
    yield from _budget_metrics("magnetar_reads_in_flight", "read by dispatch (and decoded by readers) and not yet "
                               "taken by a connection (managedLedgerMaxReadsInFlightSizeInMB)",
                               "Reads that waited for the budget",
                               broker.reads_in_flight)
    yield from _budget_metrics("magnetar_publish_buffer", "of publishes sent to the managed ledgers and not yet "
                               "stored (maxMessagePublishBufferSizeInMB)", "Times producers' connections stopped "
                               "being read because the buffer was full", broker.publish_buffer)
    for name, value in sorted((broker.offloader or {}).items()):
        if isinstance(value, int) and not isinstance(value, bool):
            yield _counter(f"magnetar_offloader_{name}", f"The offloader's {name.replace('_', ' ')} since the broker "
                           "started (managedLedgerOffloadDriver)", value)
    keys = broker.key_index
    if keys is not None:
        yield _counter("magnetar_key_index_rows_indexed", "Key versions written to key index segments",
                       keys.rows_indexed)
        yield _counter("magnetar_key_index_checkpoints", "Key index checkpoints written", keys.checkpoints)
        yield _gauge("magnetar_key_index_segments", "Key index segments of the open partitions", keys.segments)
        yield _gauge("magnetar_key_index_pending_rows", "Key versions not yet in a segment", keys.pending_rows)
        yield _counter("magnetar_key_index_version_mismatches", "Conditional appends refused on a key version",
                       keys.version_mismatches)


def _budget_metrics(name: str, what: str, waits_help: str, budget: ByteBudgetStats | None) -> Iterator[Metric]:
    if budget is None:
        return
    yield _gauge(f"{name}_bytes", f"Bytes {what}", budget.used_bytes)
    yield _gauge(f"{name}_bytes_max", f"The bound on bytes {what}; 0: none", budget.bytes_max)
    yield _gauge(f"{name}_peak_bytes", f"The most bytes {what} since the broker started", budget.peak_bytes)
    yield _counter(f"{name}_waits", waits_help, budget.waits)


def topic_metrics(samples: Iterable[TopicStats]) -> Iterator[Metric]:
    topic_families: list[tuple[Metric, Callable[[TopicStats], float]]] = [
        (CounterMetricFamily("magnetar_topic_messages_in", "Messages published since the broker started",
                             labels=TOPIC_LABELS), lambda t: t.msg_in_counter),
        (CounterMetricFamily("magnetar_topic_bytes_in", "Entry bytes published since the broker started",
                             labels=TOPIC_LABELS), lambda t: t.bytes_in_counter),
        (CounterMetricFamily("magnetar_topic_messages_out", "Messages dispatched to consumers since the broker "
                             "started (all subscriptions)", labels=TOPIC_LABELS), lambda t: t.msg_out_counter),
        (GaugeMetricFamily("magnetar_topic_msg_rate_in", "Messages published per second", labels=TOPIC_LABELS),
         lambda t: t.msg_rate_in),
        (GaugeMetricFamily("magnetar_topic_msg_throughput_in", "Entry bytes published per second",
                           labels=TOPIC_LABELS), lambda t: t.msg_throughput_in),
        (GaugeMetricFamily("magnetar_topic_msg_rate_out", "Messages dispatched per second (all subscriptions)",
                           labels=TOPIC_LABELS), lambda t: t.msg_rate_out),
        (GaugeMetricFamily("magnetar_topic_storage_size_bytes", "Bytes of the topic's ledgers",
                           labels=TOPIC_LABELS), lambda t: t.storage_size_bytes),
        (GaugeMetricFamily("magnetar_topic_entries", "Entries in the topic's ledgers", labels=TOPIC_LABELS),
         lambda t: t.entries),
        (GaugeMetricFamily("magnetar_topic_ledgers", "Ledgers of the topic", labels=TOPIC_LABELS), lambda t: t.ledgers),
        (GaugeMetricFamily("pulsar_storage_offloaded_size", "Bytes of the topic's ledgers offloaded to the object "
                           "store", labels=TOPIC_LABELS), lambda t: t.offloaded_size_bytes),
        (CounterMetricFamily("magnetar_topic_offloaded_ledgers", "Ledgers offloaded since the topic was loaded",
                             labels=TOPIC_LABELS), lambda t: t.ledgers_offloaded),
        (CounterMetricFamily("magnetar_topic_offloaded_bytes", "Bytes offloaded since the topic was loaded",
                             labels=TOPIC_LABELS), lambda t: t.bytes_offloaded),
        (CounterMetricFamily("magnetar_topic_offload_errors", "Offloads that failed since the topic was loaded",
                             labels=TOPIC_LABELS), lambda t: t.offload_errors)]
    failing = GaugeMetricFamily("magnetar_topic_offload_failing", "1 while the topic's last offload failed; "
                                "error: its message", labels=(*TOPIC_LABELS, "error"))
    sub_families: list[tuple[Metric, Callable[[SubscriptionStats], float]]] = [
        (GaugeMetricFamily("magnetar_subscription_backlog_messages", "Messages not yet acknowledged",
                           labels=SUBSCRIPTION_LABELS), lambda s: s.msg_backlog),
        (GaugeMetricFamily("magnetar_subscription_unacked_messages", "Messages dispatched and not yet acknowledged",
                           labels=SUBSCRIPTION_LABELS), lambda s: s.unacked_messages),
        (CounterMetricFamily("magnetar_subscription_messages_out", "Messages dispatched since the broker started",
                             labels=SUBSCRIPTION_LABELS), lambda s: s.msg_out_counter),
        (CounterMetricFamily("magnetar_subscription_messages_redelivered", "Messages dispatched again since the "
                             "broker started", labels=SUBSCRIPTION_LABELS), lambda s: s.msg_redeliver_counter),
        (GaugeMetricFamily("magnetar_subscription_msg_rate_out", "Messages dispatched per second",
                           labels=SUBSCRIPTION_LABELS), lambda s: s.msg_rate_out),
        (GaugeMetricFamily("magnetar_subscription_consumers", "Connected consumers", labels=SUBSCRIPTION_LABELS),
         lambda s: len(s.consumers))]
    for sample in samples:
        for family, value in topic_families:
            family.add_metric([sample.topic], float(value(sample)))  # type: ignore[attr-defined]
        if sample.offload_last_error:
            failing.add_metric([sample.topic, sample.offload_last_error[:METRIC_ERROR_LABEL_CHARS_MAX]], 1.0)
        for subscription in sample.subscriptions:
            for family, sub_value in sub_families:
                family.add_metric([sample.topic, subscription.name],  # type: ignore[attr-defined]
                                  float(sub_value(subscription)))
    yield from (family for family, _ in topic_families)
    yield failing
    yield from (family for family, _ in sub_families)


class BrokerCollector(Collector):
    """Reads the broker's statistics on every scrape."""

    def __init__(self, service: BrokerService, stalls: LoopStallMonitor) -> None:
        self._service = service
        self._stalls = stalls

    def collect(self) -> Iterator[Metric]:
        stats = self._service.statistics()
        yield from loop_stall_metrics(self._stalls.statistics())
        if stats.storage is not None:
            yield from storage_metrics(stats.storage)
        if stats.cluster is not None:  # a cluster broker has no embedded bookie
            yield from cluster_metrics(stats.cluster)
        yield from broker_metrics(stats)
        yield from topic_metrics(stats.topics)


class SharedScrape:
    """One rendering at a time; scrapes that arrive during it get its text."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._running: Future[bytes] | None = None
        self.renderings = 0

    def render(self) -> bytes:
        with self._lock:
            running = self._running
            if running is None:
                running = self._running = Future()
                owner = True
            else:
                owner = False
        if not owner:
            return running.result()
        try:
            text = generate_latest(self._registry)
            self.renderings += 1
            running.set_result(text)
            return text
        except BaseException as exc:
            running.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._running = None


def router(service: BrokerService, authorizer: Authorizer, stalls: LoopStallMonitor) -> APIRouter:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(service, stalls))
    cache = SharedScrape(registry)
    routes = APIRouter(tags=["metrics"])
    summary = "Broker, topic, subscription and storage metrics (Prometheus text format)"

    if authorizer.config.authenticate_metrics:
        @routes.get("/metrics", summary=summary + "; superusers only", response_class=Response)
        def authenticated_metrics(caller: Caller) -> Response:
            authorizer.require_superuser(caller)
            return Response(cache.render(), media_type=CONTENT_TYPE_LATEST)
    else:
        @routes.get("/metrics", summary=summary, response_class=Response)
        def metrics() -> Response:
            return Response(cache.render(), media_type=CONTENT_TYPE_LATEST)

    return routes
