"""Tiered storage's settings: standalone.conf keys (Pulsar's names) become the managed ledgers'
rollover and offload settings and the driver's keys, and pulsar-admin's ``topics offload -s``
picks the message id Pulsar's does.

Checks: the rollover and offload keys set ``ManagedLedgerConfig`` in their units, Pulsar's
newer size threshold key wins over the older one, a value out of range is refused naming the
key, the driver keys pass as given (and are not reported unused), no driver means no offload;
``first_ledger_within`` keeps at most the threshold's bytes of the newest ledgers.
"""

from __future__ import annotations

import argparse
import logging

import pytest

from api.config import ConfigError, StandaloneConfig
from consumers.cli.admin import first_ledger_within, size_bytes


def test_rollover_and_offload_keys_set_the_managed_ledger_settings(caplog: pytest.LogCaptureFixture) -> None:
    overrides = {"managedLedgerMaxEntriesPerLedger": "5", "managedLedgerMaxSizePerLedgerMbytes": "16",
                 "managedLedgerMinLedgerRolloverTimeMinutes": "0", "managedLedgerMaxLedgerRolloverTimeMinutes": "30",
                 "managedLedgerOffloadAutoTriggerSizeThresholdBytes": "1",
                 "managedLedgerOffloadThresholdInBytes": "4096",
                 "managedLedgerOffloadThresholdInSeconds": "3600", "managedLedgerOffloadDeletionLagMs": "0",
                 "managedLedgerOffloadDriver": "aws-s3", "s3ManagedLedgerOffloadBucket": "b",
                 "s3ManagedLedgerOffloadServiceEndpoint": "http://127.0.0.1:9000", "fileSystemURI": "file:///x"}
    with caplog.at_level(logging.WARNING):
        config = StandaloneConfig.load(overrides=overrides, environ={}).broker
    ml = config.managed_ledger
    assert (ml.ledger_entries_max, ml.ledger_size_bytes_max, ml.ledger_age_ms_min, ml.ledger_age_ms_max) == \
        (5, 16 * 1024 * 1024, 0, 30 * 60_000)
    assert (ml.offload_threshold_bytes, ml.offload_threshold_seconds, ml.offload_deletion_lag_ms) == (4096, 3600, 0)
    assert config.offload_driver == "aws-s3"
    assert config.offload_settings == {"managedLedgerOffloadDriver": "aws-s3", "s3ManagedLedgerOffloadBucket": "b",
                                       "s3ManagedLedgerOffloadServiceEndpoint": "http://127.0.0.1:9000",
                                       "fileSystemURI": "file:///x"}
    assert "not use" not in caplog.text


def test_defaults_are_pulsars_and_no_driver_means_no_offload() -> None:
    config = StandaloneConfig.load(overrides={}, environ={}).broker
    ml = config.managed_ledger
    assert (ml.ledger_entries_max, ml.ledger_size_bytes_max, ml.ledger_age_ms_min, ml.ledger_age_ms_max) == \
        (50_000, 2048 * 1024 * 1024, 10 * 60_000, 240 * 60_000)
    assert (ml.offload_threshold_bytes, ml.offload_threshold_seconds, ml.offload_deletion_lag_ms) == \
        (-1, -1, 4 * 3600 * 1000)
    assert config.offload_driver == ""


def test_a_value_out_of_range_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="managedLedgerMaxEntriesPerLedger"):
        StandaloneConfig.load(overrides={"managedLedgerMaxEntriesPerLedger": "0"}, environ={})
    with pytest.raises(ConfigError, match="managedLedgerOffloadDeletionLagMs"):
        StandaloneConfig.load(overrides={"managedLedgerOffloadDeletionLagMs": "soon"}, environ={})


def test_offload_size_threshold_keeps_at_most_that_many_bytes_of_the_newest_ledgers() -> None:
    ledgers = [{"ledgerId": i, "size": 100} for i in range(1, 6)]
    assert first_ledger_within(ledgers, 250) == {"ledgerId": 4, "entryId": 0, "partitionIndex": -1}
    assert first_ledger_within(ledgers, 0) == {"ledgerId": 5, "entryId": 0, "partitionIndex": -1}
    assert first_ledger_within(ledgers, 500) is None
    assert (size_bytes("10M"), size_bytes("4096"), size_bytes("-1")) == (10 * 1024 * 1024, 4096, -1)
    with pytest.raises(argparse.ArgumentTypeError):
        size_bytes("ten")


def test_unusable_offload_keys_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="managedLedgerOffloadDriver 'tape'"):
        StandaloneConfig.load(overrides={"managedLedgerOffloadDriver": "tape"}, environ={})
    with pytest.raises(ConfigError, match="fileSystemURI"):
        StandaloneConfig.load(overrides={"managedLedgerOffloadDriver": "filesystem"}, environ={})
    with pytest.raises(ConfigError, match="s3ManagedLedgerOffloadBucket"):
        StandaloneConfig.load(overrides={"managedLedgerOffloadDriver": "aws-s3"}, environ={})
