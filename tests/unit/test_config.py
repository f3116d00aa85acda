"""Standalone configuration from Pulsar-style ``key=value`` files (api/config.py), TLS keys included."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from api.config import ConfigError, StandaloneConfig, parse_properties
from tests.tls_material import TlsMaterial, make_material


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


def test_bounds_before_authentication_have_keys() -> None:
    default = StandaloneConfig.load()
    assert (default.pulsar.handshake_frame_bytes_max, default.pulsar.handshake_buffer_bytes_max,
            default.pulsar.handshake_timeout_s, default.limits.header_bytes_max) == (65536, 16 << 20, 10.0, 8192)
    config = StandaloneConfig.load(None, {"maxHandshakeFrameBytes": "32768", "maxHandshakeBufferBytes": "1048576",
                                          "handshakeTimeoutMillis": "2500", "httpMaxRequestHeaderSize": "16384"})
    assert (config.pulsar.handshake_frame_bytes_max, config.pulsar.handshake_buffer_bytes_max,
            config.pulsar.handshake_timeout_s, config.limits.header_bytes_max) == (32768, 1048576, 2.5, 16384)


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
    ({"maxHandshakeFrameBytes": "100"}, "maxHandshakeFrameBytes must lie in"),
    ({"handshakeTimeoutMillis": "0"}, "handshakeTimeoutMillis must lie in"),
    ({"httpMaxRequestHeaderSize": "10"}, "httpMaxRequestHeaderSize must lie in"),
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


def test_quota_keys_set_the_brokers_default_quotas() -> None:
    config = StandaloneConfig.load(overrides={"maxProducersPerTopic": "2", "maxTopicsPerNamespace": "100",
                                              "maxPublishRatePerTopicInMessages": "1000",
                                              "dispatchThrottlingRatePerTopicInByte": "1048576"})
    quotas = config.broker.quotas
    assert (quotas.max_producers_per_topic, quotas.max_topics_per_namespace) == (2, 100)
    assert (quotas.publish_rate_messages, quotas.dispatch_rate_bytes) == (1000, 1 << 20)
    assert quotas.max_consumers_per_topic == quotas.max_subscriptions_per_topic == 0  # unlimited by default
    with pytest.raises(ConfigError, match="maxConsumersPerTopic"):
        StandaloneConfig.load(overrides={"maxConsumersPerTopic": "-1"})


def test_the_binary_protocols_per_role_shares_are_read_and_checked() -> None:
    defaults = StandaloneConfig.load(None).pulsar
    assert (defaults.connections_per_role_max, defaults.topic_list_watchers_per_role_max) == (1000, 1000)
    settings = StandaloneConfig.load(None, {"brokerMaxConnectionsPerRole": "7", "maxTopicListWatchersPerRole": "9"})
    assert (settings.pulsar.connections_per_role_max, settings.pulsar.topic_list_watchers_per_role_max) == (7, 9)
    for key in ("brokerMaxConnectionsPerRole", "maxTopicListWatchersPerRole"):
        with pytest.raises(ConfigError, match=key):
            StandaloneConfig.load(None, {key: "0"})


# --- listeners and TLS -------------------------------------------------------------------------------
TOKEN_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
TLS_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderTls"


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_material(tmp_path_factory.mktemp("certs"))


def tls_keys(material: TlsMaterial, **more: str) -> dict[str, str]:
    return {"tlsCertificateFilePath": str(material.server.cert), "tlsKeyFilePath": str(material.server.key),
            "tlsTrustCertsFilePath": str(material.ca.cert), **more}


def test_certificates_turn_the_tls_listeners_on_beside_the_plain_ones(material: TlsMaterial) -> None:
    config = StandaloneConfig.load(None, tls_keys(material))
    assert (config.port, config.tls_port, config.pulsar.port, config.pulsar.tls_port) == (8080, 8443, 6650, 6651)
    assert config.pulsar.tls_enabled and config.tls.protocols == ("TLSv1.3", "TLSv1.2")
    assert not config.tls.require_trusted_client_cert and config.tls.verifies_clients


def test_an_empty_port_key_turns_its_listener_off(material: TlsMaterial) -> None:
    config = StandaloneConfig.load(None, tls_keys(material, webServicePort="", brokerServicePort="",
                                                  webServicePortTls="9443", brokerServicePortTls="0"))
    assert (config.port, config.tls_port, config.pulsar.port, config.pulsar.tls_port) == (0, 9443, 0, 0)
    assert StandaloneConfig.load(None, {}).tls_port == 0  # no certificate, no TLS listener


def test_providers_and_handshake_keys(material: TlsMaterial) -> None:
    config = StandaloneConfig.load(None, tls_keys(
        material, authenticationEnabled="true", authenticationProviders=f" {TLS_PROVIDER} ",
        tlsRequireTrustedClientCertOnConnect="true", tlsProtocols="TLSv1.3"))
    assert config.auth.providers == ("tls",) and config.auth.secret_key is None  # no token key needed
    assert config.tls.require_trusted_client_cert and config.tls.protocols == ("TLSv1.3",)
    both = StandaloneConfig.load(None, tls_keys(material, authenticationEnabled="true", tokenSecretKey="data:;base64,"
                                                + base64.b64encode(b"k" * 32).decode(),
                                                authenticationProviders=f"{TOKEN_PROVIDER},{TLS_PROVIDER}"))
    assert both.auth.providers == ("token", "tls")


@pytest.mark.parametrize(("keys", "message"), [
    ({"webServicePort": "", "webServicePortTls": ""}, "nothing would serve HTTP"),
    ({"webServicePort": "0"}, "nothing would serve HTTP"),
    ({"webServicePortTls": "8443"}, "webServicePortTls needs tlsCertificateFilePath"),
    ({"brokerServicePortTls": "6651"}, "brokerServicePortTls needs tlsCertificateFilePath"),
    ({"tlsCertificateFilePath": "CERT"}, "both tlsCertificateFilePath and tlsKeyFilePath"),
    ({"tls": "yes", "tlsProtocols": "TLSv1.1"}, "tlsProtocols .*not TLSv1.1"),
    ({"tls": "yes", "tlsTrustCertsFilePath": "", "tlsRequireTrustedClientCertOnConnect": "true"},
     "tlsRequireTrustedClientCertOnConnect=true needs tlsTrustCertsFilePath"),
    ({"tls": "yes", "tlsAllowInsecureConnection": "true", "tlsRequireTrustedClientCertOnConnect": "true"},
     "tlsAllowInsecureConnection=false"),
    ({"tls": "yes", "tlsKeyFilePath": "CA_KEY"}, "tlsCertificateFilePath, tlsKeyFilePath or tlsTrustCertsFilePath"),
    ({"authenticationEnabled": "true", "authenticationProviders": TLS_PROVIDER}, "AuthenticationProviderTls needs"),
    ({"authenticationEnabled": "true", "authenticationProviders": "org.example.Basic"}, "not org.example.Basic"),
    ({"tls": "yes", "webServicePortTls": "8080"}, "are both 8080"),
])
def test_bad_listener_and_tls_values_name_the_key(material: TlsMaterial, keys: dict[str, str], message: str) -> None:
    values = tls_keys(material) if keys.pop("tls", None) else {}
    replacements = {"CERT": str(material.server.cert), "CA_KEY": str(material.ca.key)}
    values.update({k: replacements.get(v, v) for k, v in keys.items()})
    with pytest.raises(ConfigError, match=message):
        StandaloneConfig.load(None, values)


def test_memory_bounds_are_pulsar_keys_in_their_units() -> None:
    config = StandaloneConfig.load(None, {"managedLedgerMaxReadsInFlightSizeInMB": "64",
                                          "maxMessagePublishBufferSizeInMB": "0",
                                          "dispatcherMaxReadSizeBytes": "524288",
                                          "dispatcherMaxPendingBytesPerConsumer": "2097152"})
    broker = config.broker
    assert broker.reads_in_flight_bytes_max == 64 * 1024 * 1024 and broker.publish_buffer_bytes_max == 0
    assert (broker.dispatch_read_bytes_max, broker.consumer_pending_bytes_max) == (524288, 2097152)


BASIC = "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic"
HTPASSWD = "superuser:$apr1$GBIYZYFZ$MzLcPrvoUky16mLcK6UtX/\n"


def test_basic_users_come_from_basic_auth_conf_or_the_system_property(tmp_path: Path) -> None:
    htpasswd = tmp_path / ".htpasswd"
    htpasswd.write_text(HTPASSWD)
    keys = {"authenticationEnabled": "true", "authenticationProviders": BASIC, "anonymousUserRole": "anonymous"}
    encoded = base64.b64encode(HTPASSWD.encode()).decode()
    for source in (str(htpasswd), f"file://{htpasswd}", f"data:;base64,{encoded}", encoded):
        config = StandaloneConfig.load(None, keys | {"basicAuthConf": source}, environ={})
        assert dict(config.auth.basic_users.hashes) == {"superuser": HTPASSWD.split(":")[1].strip()}
        assert config.auth.anonymous_role == "anonymous" and config.auth.providers == ("basic",)
    environ = {"PULSAR_EXTRA_OPTS": f"-Xmx1g -Dpulsar.auth.basic.conf={htpasswd} -Dother=1"}
    assert StandaloneConfig.load(None, keys, environ=environ).auth.basic_users.hashes[0][0] == "superuser"


@pytest.mark.parametrize(("extra", "message"), [
    ({}, "needs basicAuthConf or -Dpulsar.auth.basic.conf"),
    ({"basicAuthConf": "/no/such/file"}, "basicAuthConf: /no/such/file is neither a readable file"),
    ({"basicAuthConf": base64.b64encode(b"user-only").decode()}, "basicAuthConf: line 1: expected user:hash"),
])
def test_a_basic_provider_without_usable_users_is_refused(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StandaloneConfig.load(None, {"authenticationEnabled": "true", "authenticationProviders": BASIC, **extra},
                              environ={})


def test_the_schema_compatibility_strategy_is_pulsars_key_full_by_default() -> None:
    assert StandaloneConfig.load().broker.schema_compatibility_strategy == "FULL"
    loaded = StandaloneConfig.load(overrides={"schemaCompatibilityStrategy": "backward_transitive"})
    assert loaded.broker.schema_compatibility_strategy == "BACKWARD_TRANSITIVE"
    for wrong in ("UNDEFINED", "SIDEWAYS"):
        with pytest.raises(ConfigError, match="schemaCompatibilityStrategy"):
            StandaloneConfig.load(overrides={"schemaCompatibilityStrategy": wrong})


def test_the_schema_admission_flags_are_pulsars_keys() -> None:
    default = StandaloneConfig.load().broker
    assert (default.allow_auto_update_schema, default.schema_validation_enforced) == (True, False)
    loaded = StandaloneConfig.load(overrides={"isAllowAutoUpdateSchemaEnabled": "false",
                                              "isSchemaValidationEnforced": "true"}).broker
    assert (loaded.allow_auto_update_schema, loaded.schema_validation_enforced) == (False, True)
