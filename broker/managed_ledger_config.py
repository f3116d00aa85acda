"""A managed ledger's settings: when its current ledger rolls over, how long consumed ledgers are
kept, when closed ledgers are offloaded, how densely offsets are indexed, and how large an
entry may be.

Role: ``BrokerConfig`` (``broker/config.py``) holds the broker's, and
``ManagedLedgerFactory.open`` (``broker/managed_ledger_factory.py``) gives one to each managed
ledger (``broker/managed_ledger.py``); the topic registry derives each topic's from the broker's
with its namespace's retention, TTL and quorum policies.
Invariant: immutable; every bound names its unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.bookkeeper.bookie import QuorumConfig

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024


@dataclass(frozen=True)
class ManagedLedgerConfig:
    ledger_entries_max: int = 50_000
    """Entries a ledger takes before it rolls over (as Pulsar's ``managedLedgerMaxEntriesPerLedger``)."""
    ledger_size_bytes_max: int = 2 * GiB
    """Bytes a ledger takes before it rolls over (as Pulsar's ``managedLedgerMaxSizePerLedgerMbytes``)."""
    ledger_age_ms_max: int = 240 * 60_000
    """Age at which a ledger rolls over at its next add (as Pulsar's ``managedLedgerMaxLedgerRolloverTimeMinutes``)."""
    ledger_age_ms_min: int = 10 * 60_000
    """A ledger is not rolled over by size or entries before this age (as Pulsar's
    ``managedLedgerMinLedgerRolloverTimeMinutes``)."""
    retention_time_ms: int = 0
    """Keep fully consumed ledgers this long (-1: forever)."""
    retention_size_bytes: int = 0
    """Keep fully consumed ledgers up to this total size (-1: unlimited)."""
    message_ttl_ms: int = 0
    """Messages older than this are expired from every cursor's backlog (0: never)."""
    index_interval_entries: int = 64
    """Every this many entries one is sampled for offset and time lookups."""
    index_interval_bytes: int = 1 * MiB
    """An entry is also sampled once this many bytes of entries since the last sample were
    written: large entries would otherwise make a lookup read up to 63 of them."""
    entry_size_bytes_max: int = 5 * MiB + 64 * KiB
    """An entry's bytes at most (a 5 MiB message and its metadata, as Pulsar's ``maxMessageSize``)."""
    quorum: QuorumConfig = field(default_factory=QuorumConfig)
    offload_threshold_bytes: int = -1
    """Closed ledgers are offloaded, oldest first, while the topic's ledgers hold more than this
    (Pulsar's ``managedLedgerOffloadThresholdInBytes`` and the namespace's ``offloadThreshold``;
    -1: never by size, 0: every closed ledger)."""
    offload_threshold_seconds: int = -1
    """Closed ledgers older than this are offloaded (``managedLedgerOffloadThresholdInSeconds``;
    -1: never by age)."""
    offload_deletion_lag_ms: int = 4 * 60 * 60_000
    """The bookies' copy of an offloaded ledger is deleted this long after the offload completed
    (``managedLedgerOffloadDeletionLagMs``, Pulsar's 4 hours; 0: at once)."""

    @classmethod
    def test_min(cls) -> ManagedLedgerConfig:
        """Rollover every few entries so ledger boundaries appear in ordinary tests."""
        return cls(ledger_entries_max=5, ledger_size_bytes_max=64 * KiB, ledger_age_ms_max=60_000,
                   ledger_age_ms_min=0, index_interval_entries=2)
