"""The broker's settings: what ``magnetar standalone`` and ``magnetar broker`` read from
standalone.conf (``api/config.py``) and hand to ``BrokerService``.

Role: one frozen value with production defaults and a ``test_min`` preset (tiny segments and
caches, so rollover, flush, eviction and GC happen in ordinary tests). Each bound carries its
unit in its name; where Pulsar has the setting, its standalone.conf key is named beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.managed_ledger_config import ManagedLedgerConfig
from broker.quotas import QuotaDefaults
from storage import StorageConfig


@dataclass(frozen=True)
class BrokerConfig:
    storage: StorageConfig = field(default_factory=StorageConfig.production)
    managed_ledger: ManagedLedgerConfig = field(default_factory=ManagedLedgerConfig)
    entry_cache_bytes_max: int = 64 * 1024 * 1024
    """Recently added entries kept in memory for the readers that follow the writers."""
    entry_cache_age_ms_max: int = 1000
    """Cached entries older than this are evicted."""
    auto_create_topics: bool = True
    dedup_enabled: bool = True
    maintenance_interval_ms: int = 1000
    """How often the maintenance pass runs (ack timeouts, redeliveries, TTL, retention, cache ageing)."""
    default_retention_time_minutes: int = -1
    """Retention of a namespace without a policy (Pulsar's ``defaultRetentionTimeInMinutes``;
    -1: forever, 0: consumed ledgers go at once, Pulsar's own default)."""
    default_retention_size_mb: int = -1
    """Likewise for size (``defaultRetentionSizeInMB``; -1: unlimited)."""
    schema_compatibility_strategy: str = "FULL"
    """The strategy new schemas are checked by where neither the topic nor its namespace sets
    one (Pulsar's ``schemaCompatibilityStrategy``, FULL by default; ``broker/schema_compatibility.py``)."""
    allow_auto_update_schema: bool = True
    """Whether a producer's new schema may become a topic's next version where the namespace does
    not say (Pulsar's ``isAllowAutoUpdateSchemaEnabled``); off, only uploads add versions."""
    schema_validation_enforced: bool = False
    """Whether producers without a schema are refused on topics that have one, whatever the
    namespace says (Pulsar's ``isSchemaValidationEnforced``)."""
    quotas: QuotaDefaults = field(default_factory=QuotaDefaults)
    """Topic quotas and rate limits where neither topic nor namespace sets one (``broker/quotas.py``)."""
    dispatch_read_bytes_max: int = 1024 * 1024
    """Entry bytes one subscription or reader reads at a time (``dispatcherMaxReadSizeBytes``;
    one entry is always read, however large)."""
    consumer_pending_bytes_max: int = 1024 * 1024
    """Footprint of runs of entries waiting for one consumer's connection to take them
    (``dispatcherMaxPendingBytesPerConsumer``): a consumer whose client stops reading holds this
    much, and its connection's own outgoing buffer, and no more."""
    reads_in_flight_bytes_max: int = 256 * 1024 * 1024
    """Broker-wide: bytes read by dispatch (and decoded by readers) and not yet taken by a connection
    (``managedLedgerMaxReadsInFlightSizeInMB``); past it, new reads wait. 0: no bound."""
    publish_buffer_bytes_max: int = 256 * 1024 * 1024
    """Broker-wide: bytes of publishes sent to the managed ledgers and not yet stored
    (``maxMessagePublishBufferSizeInMB``); past it, transports stop reading producers until it
    has fallen to half. 0: no bound."""

    offload_settings: dict[str, str] = field(default_factory=dict)
    """The offload driver's standalone.conf keys as given (``managedLedgerOffloadDriver``,
    ``s3ManagedLedgerOffload*``, ``gcsManagedLedgerOffload*``, ``fileSystemURI``; no driver: closed
    ledgers stay on the bookies), read by ``broker/offload/`` (``OffloadSettings.from_config``)."""

    @property
    def offload_driver(self) -> str:
        return self.offload_settings.get("managedLedgerOffloadDriver", "").strip()

    @classmethod
    def test_min(cls) -> BrokerConfig:
        return cls(storage=StorageConfig.test_min(), managed_ledger=ManagedLedgerConfig.test_min(),
                   entry_cache_bytes_max=1 << 20, maintenance_interval_ms=200)
