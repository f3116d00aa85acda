"""Standalone configuration from Pulsar-style ``key=value`` files (api/config.py)."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from api.config import ConfigError, StandaloneConfig, parse_properties


def test_defaults_run_without_auth_on_port_8080() -> None:
    config = StandaloneConfig.load()
    assert (config.data_dir, config.port, config.auth.enabled) == ("./data", 8080, False)
    assert config.broker.auto_create_topics and config.broker.dedup_enabled


def test_pulsar_keys_configure_auth_and_the_broker(tmp_path: Path) -> None:
    secret = tmp_path / "secret.key"
    secret.write_bytes(b"s" * 31 + b"\n")  # a random key may end in a whitespace byte: it is part of the key
    conf = tmp_path / "standalone.conf"
    conf.write_text("# Pulsar's standalone.conf keys\n"
                    "webServicePort=9090\nbindAddress=127.0.0.1\ndataDir=/tmp/x\n"
                    "authenticationEnabled=true\nauthorizationEnabled=true\nsuperUserRoles=admin, ops\n"
                    f"tokenSecretKey=file://{secret}\nallowAutoTopicCreation=false\n"
                    "managedLedgerDefaultEnsembleSize=1\n")
    config = StandaloneConfig.load(str(conf), {"webServicePort": "9191"})
    assert (config.host, config.port, config.data_dir) == ("127.0.0.1", 9191, "/tmp/x")
    assert config.auth.enabled and config.auth.secret_key == b"s" * 31 + b"\n"
    assert config.auth.superuser_roles == frozenset({"admin", "ops"})
    assert not config.broker.auto_create_topics


def test_keys_magnetar_does_not_use_are_named_in_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="api.config"):
        config = StandaloneConfig.load(None, {"clusterName": "standalone", "webServicePort": "9090",
                                              "managedLedgerDefaultEnsembleSize": "1"})
    assert config.port == 9090
    warnings = [r for r in caplog.records if r.name == "api.config" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "clusterName, managedLedgerDefaultEnsembleSize" in warnings[0].getMessage()
    assert "webServicePort" not in warnings[0].getMessage()


def test_data_urls_hold_keys_inline() -> None:
    key = base64.b64encode(b"k" * 32).decode()
    config = StandaloneConfig.load(None, {"authenticationEnabled": "true", "tokenSecretKey": f"data:;base64,{key}"})
    assert config.auth.secret_key == b"k" * 32


@pytest.mark.parametrize(("overrides", "message"), [
    ({"webServicePort": "eighty"}, "webServicePort"),
    ({"authenticationEnabled": "yes"}, "authenticationEnabled"),
    ({"authenticationEnabled": "true"}, "tokenSecretKey"),
    ({"authenticationEnabled": "true", "tokenSecretKey": "file:///nonexistent/key"}, "cannot read"),
    ({"authenticationEnabled": "true", "tokenSecretKey": "data:;base64,@@@"}, "base64"),
    ({"managedLedgerMaxReadsInFlightSizeInMB": "-1"}, "managedLedgerMaxReadsInFlightSizeInMB"),
    ({"dispatcherMaxPendingBytesPerConsumer": "100"}, "dispatcherMaxPendingBytesPerConsumer"),
])
def test_bad_values_name_the_key(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StandaloneConfig.load(None, overrides)


def test_lines_without_equals_are_errors() -> None:
    assert parse_properties("a=1\n! comment\n\nb = two words\n") == {"a": "1", "b": "two words"}
    with pytest.raises(ConfigError, match="line 2"):
        parse_properties("a=1\njust-a-word\n")


def test_memory_bounds_are_pulsar_keys_in_their_units() -> None:
    config = StandaloneConfig.load(None, {"managedLedgerMaxReadsInFlightSizeInMB": "64",
                                          "maxMessagePublishBufferSizeInMB": "0",
                                          "dispatcherMaxReadSizeBytes": "524288",
                                          "dispatcherMaxPendingBytesPerConsumer": "2097152"})
    broker = config.broker
    assert broker.reads_in_flight_bytes_max == 64 * 1024 * 1024 and broker.publish_buffer_bytes_max == 0
    assert (broker.dispatch_read_bytes_max, broker.consumer_pending_bytes_max) == (524288, 2097152)
