"""``GET /metrics``: the broker's statistics in Prometheus's text exposition format.

Role: one custom collector reads the components' ``statistics()`` snapshots at scrape time —
the embedded bookie (journal, write cache, read cache, entry logs, index, GC), the broker's entry
cache and metadata store, every open topic (managed ledger and publish rates) and its
subscriptions — and renders them. Nothing is counted twice: there are no metric objects to keep
in step with the broker, only the broker's own counters read when Prometheus asks.

Names follow Prometheus's conventions (``magnetar_`` prefix, ``_total`` counters, base units:
seconds and bytes). Topics are labelled ``topic="persistent://tenant/namespace/topic"`` (one
series per partition), subscriptions additionally ``subscription="name"``. Rates are the
broker's own (recomputed every maintenance interval); prefer ``rate()`` over the counters.

Invariants: counters start at zero when the broker process starts (as Pulsar's do) and only
grow while it runs — except ``magnetar_topic_messages_out_total``, the sum over the topic's
subscriptions, which drops when a subscription is deleted (``rate()`` reads that as a reset);
the fsync latency histogram's buckets are cumulative and its ``+Inf`` bucket equals its
``_count``, both from one snapshot; a topic closed or deleted while a scrape runs is left out
of that scrape rather than failing it.

Access: public, also with token authentication on, like Pulsar with its default
``authenticateMetricsEndpoint=false``; the metrics name topics and subscriptions but carry no
message data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from api.auth import Authorizer
from broker.errors import MagnetarError
from broker.service import BrokerService
from broker.subscription import SubscriptionStats
from broker.topic import PersistentTopic

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
def storage_metrics(service: BrokerService) -> list[Metric]:
    """The embedded bookie, from one ``statistics()`` snapshot."""
    stats = service.storage.statistics()
    journal, logs, gc, index = stats.journal, stats.entry_logs, stats.gc, stats.index
    reads, read_cache, latency = stats.read_path, stats.read_cache, stats.journal.fsync_latency
    buffers = {"active": stats.write_cache, "being_flushed": stats.write_cache_being_flushed}
    fsync_buckets = [(str(bound_us / 1e6), float(count)) for bound_us, count in latency.buckets_us()]
    fsync_buckets.append(("+Inf", float(latency.count)))
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
        _gauge("magnetar_journal_queue_depth", "Records waiting for the journal writer", journal.queue_depth),
        _gauge("magnetar_journal_files", "Journal files on disk", journal.files),
        _counter("magnetar_journal_fsyncs", "Journal fdatasync calls", latency.count),
        HistogramMetricFamily("magnetar_journal_fsync_latency_seconds", "Duration of the journal's fdatasync",
                              buckets=fsync_buckets, sum_value=latency.sum_seconds),
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


# --- cluster --------------------------------------------------------------------------------------
def cluster_metrics(service: BrokerService) -> Iterator[Metric]:
    """A cluster broker's remote bookies and re-replication, from one ``statistics()`` snapshot."""
    assert service.cluster is not None
    stats = service.cluster.statistics()
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


# --- broker ---------------------------------------------------------------------------------------
def broker_metrics(service: BrokerService) -> Iterator[Metric]:
    cache = service.cache.statistics()
    yield _gauge("magnetar_entry_cache_size_bytes", "Bytes held in the broker's entry cache", cache.size_bytes)
    yield _counter("magnetar_entry_cache_hits", "Entry reads served by the broker's entry cache", cache.hits)
    yield _counter("magnetar_entry_cache_misses", "Entry reads the broker's entry cache could not serve",
                   cache.misses)
    store = service.store.statistics()
    yield _labelled(CounterMetricFamily, "magnetar_metadata_store_operations", "Metadata store operations", "op",
                    {"get": store.gets, "put": store.puts, "delete": store.deletes})
    yield _counter("magnetar_metadata_store_cas_failures", "Metadata compare-and-set conflicts", store.cas_failures)


@dataclass(frozen=True)
class SubscriptionSample:
    name: str
    backlog_messages: int
    unacked_messages: int
    messages_out: int
    redelivered: int
    msg_rate_out: float
    consumers: int


@dataclass(frozen=True)
class TopicSample:
    """One topic's numbers, all read before any is rendered (a topic is all in or all out)."""

    topic: str
    messages_in: int
    bytes_in: int
    msg_rate_in: float
    throughput_in: float
    storage_bytes: int
    entries: int
    ledgers: int
    subscriptions: tuple[SubscriptionSample, ...]

    @property
    def messages_out(self) -> int:
        return sum(s.messages_out for s in self.subscriptions)

    @property
    def msg_rate_out(self) -> float:
        return sum(s.msg_rate_out for s in self.subscriptions)


def sample_topic(service: BrokerService, topic: PersistentTopic) -> TopicSample:
    ml = topic.ml.statistics()
    rate_in, throughput_in = topic.publish_rates()
    active: dict[str, SubscriptionStats] = {s.name: s.statistics() for s in service.subscriptions_of(topic.name)}
    samples = []
    for name in sorted(set(topic.cursors.names()) | set(active)):
        stats = active.get(name)
        if stats is not None:
            samples.append(SubscriptionSample(name, stats.msg_backlog, stats.unacked_messages, stats.msg_out_counter,
                                              stats.msg_redeliver_counter, stats.msg_rate_out, len(stats.consumers)))
            continue
        cursor = topic.cursors.get(name)
        if cursor is not None:  # durable, with nobody attached since the broker started
            samples.append(SubscriptionSample(name, cursor.backlog_messages(), 0, 0, 0, 0.0, 0))
    return TopicSample(topic.name.full_name, ml.messages_added, ml.bytes_added, rate_in, throughput_in,
                       ml.total_size_bytes, ml.number_of_entries, ml.ledgers, tuple(samples))


def topic_metrics(samples: Iterable[TopicSample]) -> Iterator[Metric]:
    topic_families: list[tuple[Metric, str]] = [
        (CounterMetricFamily("magnetar_topic_messages_in", "Messages published since the broker started",
                             labels=TOPIC_LABELS), "messages_in"),
        (CounterMetricFamily("magnetar_topic_bytes_in", "Entry bytes published since the broker started",
                             labels=TOPIC_LABELS), "bytes_in"),
        (CounterMetricFamily("magnetar_topic_messages_out", "Messages dispatched to consumers since the broker "
                             "started (all subscriptions)", labels=TOPIC_LABELS), "messages_out"),
        (GaugeMetricFamily("magnetar_topic_msg_rate_in", "Messages published per second", labels=TOPIC_LABELS),
         "msg_rate_in"),
        (GaugeMetricFamily("magnetar_topic_msg_throughput_in", "Entry bytes published per second",
                           labels=TOPIC_LABELS), "throughput_in"),
        (GaugeMetricFamily("magnetar_topic_msg_rate_out", "Messages dispatched per second (all subscriptions)",
                           labels=TOPIC_LABELS), "msg_rate_out"),
        (GaugeMetricFamily("magnetar_topic_storage_size_bytes", "Bytes of the topic's ledgers",
                           labels=TOPIC_LABELS), "storage_bytes"),
        (GaugeMetricFamily("magnetar_topic_entries", "Entries in the topic's ledgers", labels=TOPIC_LABELS),
         "entries"),
        (GaugeMetricFamily("magnetar_topic_ledgers", "Ledgers of the topic", labels=TOPIC_LABELS), "ledgers")]
    sub_families: list[tuple[Metric, str]] = [
        (GaugeMetricFamily("magnetar_subscription_backlog_messages", "Messages not yet acknowledged",
                           labels=SUBSCRIPTION_LABELS), "backlog_messages"),
        (GaugeMetricFamily("magnetar_subscription_unacked_messages", "Messages dispatched and not yet acknowledged",
                           labels=SUBSCRIPTION_LABELS), "unacked_messages"),
        (CounterMetricFamily("magnetar_subscription_messages_out", "Messages dispatched since the broker started",
                             labels=SUBSCRIPTION_LABELS), "messages_out"),
        (CounterMetricFamily("magnetar_subscription_messages_redelivered", "Messages dispatched again since the "
                             "broker started", labels=SUBSCRIPTION_LABELS), "redelivered"),
        (GaugeMetricFamily("magnetar_subscription_msg_rate_out", "Messages dispatched per second",
                           labels=SUBSCRIPTION_LABELS), "msg_rate_out"),
        (GaugeMetricFamily("magnetar_subscription_consumers", "Connected consumers", labels=SUBSCRIPTION_LABELS),
         "consumers")]
    for sample in samples:
        for family, field_name in topic_families:
            family.add_metric([sample.topic], float(getattr(sample, field_name)))  # type: ignore[attr-defined]
        for subscription in sample.subscriptions:
            for family, field_name in sub_families:
                family.add_metric([sample.topic, subscription.name],  # type: ignore[attr-defined]
                                  float(getattr(subscription, field_name)))
    yield from (family for family, _ in topic_families)
    yield from (family for family, _ in sub_families)


class BrokerCollector(Collector):
    """Reads the broker's statistics on every scrape."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        if self._service.cluster is None:  # a cluster broker has no embedded bookie
            yield from storage_metrics(self._service)
        else:
            yield from cluster_metrics(self._service)
        yield from broker_metrics(self._service)
        samples = []
        for topic in self._service.open_topics():
            with contextlib.suppress(MagnetarError):  # closed or deleted during the scrape: leave it out
                samples.append(sample_topic(self._service, topic))
        yield from topic_metrics(samples)


def router(service: BrokerService, authorizer: Authorizer) -> APIRouter:
    """``authorizer`` is unused on purpose: the endpoint is public (see the module docstring)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(service))
    routes = APIRouter(tags=["metrics"])

    @routes.get("/metrics", summary="Broker, topic, subscription and storage metrics (Prometheus text format)",
                response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return routes
