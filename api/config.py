"""Standalone configuration: Pulsar's ``standalone.conf`` keys, read from a ``key=value`` file.

Role: turn a configuration file (and command-line overrides) into the ``BrokerConfig`` and
``AuthConfig`` that ``magnetar standalone`` runs with. Pulsar users can reuse the keys they know:
``webServicePort``, ``bindAddress``, ``authenticationEnabled``, ``authorizationEnabled``,
``superUserRoles``, ``tokenSecretKey`` / ``tokenPublicKey`` (``file:///path``, ``data:;base64,…``
or a plain path), ``allowAutoTopicCreation``, ``brokerDeduplicationEnabled``,
``authenticateMetricsEndpoint``, ``maxHttpServerConnections``, ``httpMaxRequestSize``,
``journalDirectory`` (BookKeeper's key: the embedded bookie's journal on its own disk),
``defaultRetentionTimeInMinutes`` / ``defaultRetentionSizeInMB`` (the retention of a namespace
without a policy: -1 by default, keep everything, as an event store must; 0 and 0 are Pulsar's
defaults, which keep nothing that no subscription holds), the binary protocol's
``brokerServicePort`` (6650), ``advertisedAddress``, ``advertisedListeners`` and
``internalListenerName`` (``api/pulsar/listeners.py``), ``maxMessageSize`` and
``authenticationRefreshCheckSeconds``, its bounds before a connection's handshake
(``HANDSHAKE_KEYS``: Pulsar has none of its own) and its per-role shares
(``brokerMaxConnectionsPerRole``, ``maxTopicListWatchersPerRole``); the topic quotas and rate
limits of Pulsar's broker.conf (``maxProducersPerTopic``, ``maxConsumersPerTopic``,
``maxSubscriptionsPerTopic``, ``maxTopicsPerNamespace``, ``maxPublishRatePerTopicInMessages`` /
``InBytes``, ``dispatchThrottlingRatePerTopicInMsg`` / ``InByte``: ``QUOTA_CONFIG_KEYS``, 0
unlimited); the broker's memory bounds (``BROKER_BOUNDS``: ``dispatcherMaxReadSizeBytes``,
``dispatcherMaxPendingBytesPerConsumer``, ``managedLedgerMaxReadsInFlightSizeInMB``,
``maxMessagePublishBufferSizeInMB``); the managed ledgers' rollover and offload keys (``ML_KEYS``:
``managedLedgerMaxEntriesPerLedger``, ``managedLedgerMaxSizePerLedgerMbytes``,
``managedLedgerMin``/``MaxLedgerRolloverTimeMinutes``, ``managedLedgerOffloadThresholdInBytes``
(or ``…AutoTriggerSizeThresholdBytes``), ``…ThresholdInSeconds``, ``…DeletionLagMs``) and the
offload driver's keys (``managedLedgerOffloadDriver``, ``s3ManagedLedgerOffload*``,
``gcsManagedLedgerOffload*``, ``fileSystemURI``: handed to ``broker/offload/`` as given);
``schemaCompatibilityStrategy`` (the schema
compatibility strategy where neither topic nor namespace sets one, FULL by default, as Pulsar's),
``isAllowAutoUpdateSchemaEnabled`` and ``isSchemaValidationEnforced``;
plus ``dataDir`` and the edge bounds of ``api/limits.py``
(``CONFIG_KEYS``). Keys Magnetar does not use are ignored, so a full Pulsar ``standalone.conf``
loads, and named in one warning, so a misspelt key does not go unnoticed.

TLS (``TLS_KEYS``, ``api/tls.py``): with ``tlsCertificateFilePath`` and ``tlsKeyFilePath`` the
web service also listens with TLS on ``webServicePortTls`` (8443: HTTPS and WSS) and the binary
protocol on ``brokerServicePortTls`` (6651: ``pulsar+ssl://``); ``tlsTrustCertsFilePath``,
``tlsRequireTrustedClientCertOnConnect``, ``tlsAllowInsecureConnection`` and ``tlsProtocols``
shape the handshake. A listener's port key left empty (or 0) turns that listener off, as in
Pulsar: with ``webServicePort=`` and ``brokerServicePort=`` only the TLS listeners remain.

Authentication (``api/auth.py``): ``authenticationProviders`` names any of the token, TLS and
Basic providers; ``anonymousUserRole`` is the role of callers without credentials; the Basic
provider's htpasswd users come from ``basicAuthConf`` (``file:///path``, ``data:;base64,…``, a
path, or the file's content in base64), else from the ``pulsar.auth.basic.conf`` system property
that Pulsar's scripts pass as ``-Dpulsar.auth.basic.conf=…`` in ``PULSAR_EXTRA_OPTS``.

Invariant: a bad value (not a number, an unreadable key file, authentication on without a key,
a TLS port without a certificate, no web listener at all) raises ``ConfigError`` naming the key,
before anything starts.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
import os
import shlex
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.auth import AuthConfig
from api.authentication import BASIC_METHOD, PROVIDER_CLASSES, TLS_METHOD, TOKEN_METHOD, BasicUsers
from api.limits import CONFIG_KEYS, LIMIT_RANGES, RETENTION_MINUTES_OR_MB_MAX, EdgeLimits
from api.pulsar import PulsarSettings
from api.pulsar.listeners import parse_advertised_listeners
from api.pulsar.settings import ROLE_SHARE_KEYS, ROLE_SHARE_RANGE
from api.tls import TLS_PROTOCOLS, TlsConfig
from broker import (
    QUOTA_CONFIG_KEYS,
    QUOTA_CONFIG_VALUE_MAX,
    SCHEMA_STRATEGIES,
    BrokerConfig,
    MagnetarError,
    ManagedLedgerConfig,
    QuotaDefaults,
    check_offload_settings,
)
from consumers.cli.tokens import read_key

log = logging.getLogger(__name__)

MIB = 1024 * 1024
BROKER_BOUNDS = (  # standalone.conf key, BrokerConfig field, unit in bytes, accepted range in that unit
    ("dispatcherMaxReadSizeBytes", "dispatch_read_bytes_max", 1, (4096, 256 * MIB)),
    ("dispatcherMaxPendingBytesPerConsumer", "consumer_pending_bytes_max", 1, (4096, 256 * MIB)),
    ("managedLedgerMaxReadsInFlightSizeInMB", "reads_in_flight_bytes_max", MIB, (0, 1024 * 1024)),
    ("maxMessagePublishBufferSizeInMB", "publish_buffer_bytes_max", MIB, (0, 1024 * 1024)),
)
"""The broker's memory bounds: Pulsar's keys where Pulsar has them
(``dispatcherMaxPendingBytesPerConsumer`` is Magnetar's); 0 turns a broker-wide budget off."""
ML_KEYS = (  # standalone.conf key, ManagedLedgerConfig field, unit of the key in the field's, accepted range
    ("managedLedgerMaxEntriesPerLedger", "ledger_entries_max", 1, (1, 2**31 - 1)),
    ("managedLedgerMaxSizePerLedgerMbytes", "ledger_size_bytes_max", MIB, (1, 1024 * 1024)),
    ("managedLedgerMinLedgerRolloverTimeMinutes", "ledger_age_ms_min", 60_000, (0, 525_600)),
    ("managedLedgerMaxLedgerRolloverTimeMinutes", "ledger_age_ms_max", 60_000, (1, 525_600)),
    ("managedLedgerOffloadAutoTriggerSizeThresholdBytes", "offload_threshold_bytes", 1, (-1, 2**63 - 1)),
    ("managedLedgerOffloadThresholdInBytes", "offload_threshold_bytes", 1, (-1, 2**63 - 1)),
    ("managedLedgerOffloadThresholdInSeconds", "offload_threshold_seconds", 1, (-1, 2**63 - 1)),
    ("managedLedgerOffloadDeletionLagMs", "offload_deletion_lag_ms", 1, (0, 2**63 - 1)),
)
"""When ledgers roll over and are offloaded: Pulsar's keys and defaults (50,000 entries, 2,048 MB,
10 and 240 minutes; offload thresholds -1, off; deletion lag 4 hours). Of the two size threshold
keys, Pulsar's newer ``managedLedgerOffloadThresholdInBytes`` wins when both are set."""
OFFLOAD_KEY_PREFIXES = ("managedLedgerOffload", "s3ManagedLedgerOffload", "gcsManagedLedgerOffload", "fileSystemURI")
"""Keys handed as they are to the offload drivers (``BrokerConfig.offload_settings``)."""
KNOWN_KEYS = ("webServicePort", "bindAddress", "dataDir", "authenticationEnabled", "authorizationEnabled",
              "superUserRoles", "tokenSecretKey", "tokenPublicKey", "allowAutoTopicCreation",
              "brokerDeduplicationEnabled", "authenticateMetricsEndpoint", "journalDirectory",
              "defaultRetentionTimeInMinutes", "defaultRetentionSizeInMB", "brokerServicePort",
              "brokerServicePortTls", "tlsCertificateFilePath", "tlsKeyFilePath", "tlsTrustCertsFilePath",
              "advertisedAddress", "advertisedListeners", "internalListenerName", "maxMessageSize",
              "authenticationRefreshCheckSeconds", "anonymousUserRole",
              "basicAuthConf", "schemaCompatibilityStrategy", "isAllowAutoUpdateSchemaEnabled",
              "isSchemaValidationEnforced", *CONFIG_KEYS,
              *QUOTA_CONFIG_KEYS, "maxHandshakeFrameBytes", "maxHandshakeBufferBytes", "handshakeTimeoutMillis",
              *ROLE_SHARE_KEYS, *(bound[0] for bound in BROKER_BOUNDS), *(key[0] for key in ML_KEYS))
TLS_KEYS = ("webServicePortTls", "tlsRequireTrustedClientCertOnConnect", "tlsAllowInsecureConnection",
            "tlsProtocols", "authenticationProviders")
BASIC_AUTH_PROPERTY = "pulsar.auth.basic.conf"
"""The system property Pulsar's Basic provider reads when ``basicAuthConf`` is unset."""
EXTRA_OPTS_ENV = "PULSAR_EXTRA_OPTS"
"""The environment variable whose ``-Dkey=value`` words are Pulsar's system properties."""
PULSAR_TLS_PORT = 6651
WEB_TLS_PORT = 8443
MESSAGE_SIZE_BYTES_RANGE = (1024, 5 * 1024 * 1024)
AUTH_REFRESH_CHECK_S_RANGE = (1, 86_400)
"""``maxMessageSize``: the broker stores messages of at most 5 MiB (larger ones are chunked)."""
HANDSHAKE_KEYS: dict[str, tuple[int, int]] = {
    "maxHandshakeFrameBytes": (1024, 1024 * 1024),
    "maxHandshakeBufferBytes": (64 * 1024, 1024 * 1024 * 1024),
    "handshakeTimeoutMillis": (100, 600_000),
}
"""The binary protocol's bounds before a connection's handshake completed, and their ranges."""
PULSAR_SETTING_KEYS: dict[str, str] = {
    "maxMessageSize": "max_message_size_bytes",
    "authenticationRefreshCheckSeconds": "auth_refresh_check_s",
    "maxHandshakeFrameBytes": "handshake_frame_bytes_max",
    "maxHandshakeBufferBytes": "handshake_buffer_bytes_max",
    "handshakeTimeoutMillis": "handshake_timeout_s",
    **ROLE_SHARE_KEYS,
}
"""``standalone.conf`` key → the bound of ``PulsarSettings`` it sets."""
RETENTION_KEYS = {"defaultRetentionTimeInMinutes": "default_retention_time_minutes",
                  "defaultRetentionSizeInMB": "default_retention_size_mb"}
"""``standalone.conf`` key → the ``BrokerConfig`` retention default it sets."""


def setting_keys() -> dict[str, str]:
    """``Class.field`` → the ``standalone.conf`` key that sets it, for every bound a key sets
    (README's "All limits" table names them, ``tools/limits_table.py``)."""
    keys = {f"EdgeLimits.{name}": key for key, name in CONFIG_KEYS.items()}
    keys |= {f"PulsarSettings.{name}": key for key, name in PULSAR_SETTING_KEYS.items()}
    keys |= {f"BrokerConfig.{name}": key for key, name, _, _ in BROKER_BOUNDS}
    keys |= {f"BrokerConfig.{name}": key for key, name in RETENTION_KEYS.items()}
    keys |= {f"QuotaDefaults.{name}": key for key, name in QUOTA_CONFIG_KEYS.items()}
    keys |= {f"ManagedLedgerConfig.{name}": key for key, name, _, _ in ML_KEYS
             if key != "managedLedgerOffloadAutoTriggerSizeThresholdBytes"}
    return keys


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


@dataclass(frozen=True)
class StandaloneConfig:
    data_dir: str = "./data"
    journal_dir: str | None = None
    host: str = "0.0.0.0"
    port: int = 8080
    """``webServicePort``: plain HTTP and WebSocket; 0 = off."""
    tls_port: int = 0
    """``webServicePortTls``: HTTPS and WSS (8443 when the TLS keys are set); 0 = off."""
    tls: TlsConfig = field(default_factory=TlsConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: EdgeLimits = field(default_factory=EdgeLimits)
    pulsar: PulsarSettings = field(default_factory=PulsarSettings)

    @classmethod
    def load(cls, path: str | None = None, overrides: Mapping[str, str] | None = None,
             environ: Mapping[str, str] | None = None) -> StandaloneConfig:
        """The file's settings (when given), then ``overrides`` (same keys) on top; the system
        properties from ``environ``'s ``PULSAR_EXTRA_OPTS`` (the process's environment by default)."""
        values = parse_properties(Path(path).read_text()) if path else {}
        values.update(overrides or {})
        unused = sorted(k for k in set(values) - set(KNOWN_KEYS) - set(TLS_KEYS)
                        if not k.startswith(OFFLOAD_KEY_PREFIXES))
        if unused:
            log.warning("configuration keys Magnetar does not use, ignored: %s", ", ".join(unused))
        tls = _tls(values)
        port, tls_port = _web_ports(values, tls)
        return cls(
            data_dir=values.get("dataDir", cls.data_dir),
            journal_dir=values.get("journalDirectory") or None,
            host=values.get("bindAddress", cls.host),
            port=port,
            tls_port=tls_port,
            tls=tls,
            broker=dataclasses.replace(
                BrokerConfig(),
                auto_create_topics=_flag(values, "allowAutoTopicCreation", True),
                dedup_enabled=_flag(values, "brokerDeduplicationEnabled", True),
                default_retention_time_minutes=_retention(values, "defaultRetentionTimeInMinutes"),
                default_retention_size_mb=_retention(values, "defaultRetentionSizeInMB"),
                schema_compatibility_strategy=_schema_strategy(values),
                allow_auto_update_schema=_flag(values, "isAllowAutoUpdateSchemaEnabled", True),
                schema_validation_enforced=_flag(values, "isSchemaValidationEnforced", False),
                quotas=_quotas(values), managed_ledger=_managed_ledger(values),
                offload_settings=_offload_settings(values), **_broker_bounds(values)),
            auth=_auth(values, tls, system_properties(os.environ if environ is None else environ)),
            limits=_limits(values),
            pulsar=_role_shares(values, _pulsar(values, values.get("bindAddress", cls.host), tls)),
        )


def _schema_strategy(values: Mapping[str, str]) -> str:
    """``schemaCompatibilityStrategy``: one of Pulsar's strategies but UNDEFINED (FULL when unset)."""
    raw = values.get("schemaCompatibilityStrategy") or BrokerConfig.schema_compatibility_strategy
    strategy = raw.strip().upper()
    if strategy not in SCHEMA_STRATEGIES or strategy == "UNDEFINED":
        raise ConfigError(f"schemaCompatibilityStrategy={raw!r}: use one of "
                          f"{', '.join(s for s in SCHEMA_STRATEGIES if s != 'UNDEFINED')}")
    return strategy


def parse_properties(text: str) -> dict[str, str]:
    """Java-properties-style ``key=value`` lines; ``#`` and ``!`` start comments."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"line {number}: expected key=value, got {raw!r}")
        values[key.strip()] = value.strip()
    return values


def _integer(values: Mapping[str, str], key: str, default: int) -> int:
    raw = values.get(key)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{key} must be an integer, not {raw!r}") from None


def _flag(values: Mapping[str, str], key: str, default: bool) -> bool:
    raw = values.get(key)
    if raw in (None, ""):
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ConfigError(f"{key} must be true or false, not {raw!r}")


def _retention(values: Mapping[str, str], key: str) -> int:
    """A default retention limit: -1 (none) or a count of minutes or megabytes."""
    value = _integer(values, key, -1)
    if not -1 <= value <= RETENTION_MINUTES_OR_MB_MAX:
        raise ConfigError(f"{key} must be -1 (unlimited) or in 0..{RETENTION_MINUTES_OR_MB_MAX}, not {value}")
    return value


def _quotas(values: Mapping[str, str]) -> QuotaDefaults:
    """The broker's default topic quotas and rate limits (each 0..2^31-1, 0: unlimited)."""
    given = {}
    for key, name in QUOTA_CONFIG_KEYS.items():
        value = _integer(values, key, 0)
        if not 0 <= value <= QUOTA_CONFIG_VALUE_MAX:
            raise ConfigError(f"{key} must lie in 0..{QUOTA_CONFIG_VALUE_MAX} (0: unlimited), not {value}")
        given[name] = value
    return QuotaDefaults(**given)


def _broker_bounds(values: Mapping[str, str]) -> dict[str, Any]:
    """The ``BrokerConfig`` fields ``BROKER_BOUNDS`` keys set (Any: ``dataclasses.replace`` takes them by name)."""
    settings: dict[str, Any] = {}
    for key, name, unit, (low, high) in BROKER_BOUNDS:
        if values.get(key) in (None, ""):
            continue
        value = _integer(values, key, 0)
        if not low <= value <= high:
            raise ConfigError(f"{key} must lie in {low}..{high}, not {value}")
        settings[name] = value * unit
    return settings


def _managed_ledger(values: Mapping[str, str]) -> ManagedLedgerConfig:
    """The managed ledgers' rollover and offload settings (``ML_KEYS``)."""
    settings: dict[str, Any] = {}
    for key, name, unit, (low, high) in ML_KEYS:
        if values.get(key) in (None, ""):
            continue
        value = _integer(values, key, 0)
        if not low <= value <= high:
            raise ConfigError(f"{key} must lie in {low}..{high}, not {value}")
        settings[name] = value * unit if value > 0 else value
    return dataclasses.replace(ManagedLedgerConfig(), **settings)


def _offload_settings(values: Mapping[str, str]) -> dict[str, str]:
    """The offload driver's keys as given (``managedLedgerOffloadDriver`` empty or unset: no offload)."""
    ml_keys = {key for key, *_ in ML_KEYS}
    settings = {k: v for k, v in values.items() if k.startswith(OFFLOAD_KEY_PREFIXES) and k not in ml_keys}
    try:
        check_offload_settings(settings)
    except MagnetarError as exc:  # OffloadConfigError: one line naming the key
        raise ConfigError(str(exc)) from None
    return settings


def _limits(values: Mapping[str, str]) -> EdgeLimits:
    settings: dict[str, int] = {}
    for key, name in CONFIG_KEYS.items():
        if values.get(key) in (None, ""):
            continue
        value = _integer(values, key, 0)
        low, high = LIMIT_RANGES[name]
        if not low <= value <= high:
            raise ConfigError(f"{key} must lie in {low}..{high}, not {value}")
        settings[name] = value
    return EdgeLimits(**settings)


def _pulsar(values: Mapping[str, str], host: str, tls: TlsConfig) -> PulsarSettings:
    defaults = PulsarSettings()
    size = _integer(values, "maxMessageSize", defaults.max_message_size_bytes)
    if not MESSAGE_SIZE_BYTES_RANGE[0] <= size <= MESSAGE_SIZE_BYTES_RANGE[1]:
        raise ConfigError(f"maxMessageSize must lie in {MESSAGE_SIZE_BYTES_RANGE[0]}..{MESSAGE_SIZE_BYTES_RANGE[1]}")
    refresh_s = _integer(values, "authenticationRefreshCheckSeconds", int(defaults.auth_refresh_check_s))
    if not AUTH_REFRESH_CHECK_S_RANGE[0] <= refresh_s <= AUTH_REFRESH_CHECK_S_RANGE[1]:
        raise ConfigError(f"authenticationRefreshCheckSeconds must lie in {AUTH_REFRESH_CHECK_S_RANGE[0]}.."
                          f"{AUTH_REFRESH_CHECK_S_RANGE[1]}, not {refresh_s}")
    frame_bytes, buffer_bytes, timeout_ms = _handshake(values, defaults)
    port = _port(values, "brokerServicePort", defaults.port)
    tls_port = _tls_port(values, "brokerServicePortTls", PULSAR_TLS_PORT, tls)
    try:
        listeners, internal = parse_advertised_listeners(values.get("advertisedListeners", ""),
                                                         values.get("internalListenerName", ""))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return PulsarSettings(host=host, port=port, tls_port=tls_port, tls=tls,
                          advertised_host=values.get("advertisedAddress") or None, advertised_listeners=listeners,
                          internal_listener_name=internal, max_message_size_bytes=size,
                          auth_refresh_check_s=float(refresh_s), handshake_frame_bytes_max=frame_bytes,
                          handshake_buffer_bytes_max=buffer_bytes, handshake_timeout_s=timeout_ms / 1000)


def _handshake(values: Mapping[str, str], defaults: PulsarSettings) -> tuple[int, int, int]:
    """``HANDSHAKE_KEYS``' values (frame bytes, buffer bytes, timeout ms), each within its range."""
    given = (_integer(values, "maxHandshakeFrameBytes", defaults.handshake_frame_bytes_max),
             _integer(values, "maxHandshakeBufferBytes", defaults.handshake_buffer_bytes_max),
             _integer(values, "handshakeTimeoutMillis", round(defaults.handshake_timeout_s * 1000)))
    for (key, (low, high)), value in zip(HANDSHAKE_KEYS.items(), given, strict=True):
        if not low <= value <= high:
            raise ConfigError(f"{key} must lie in {low}..{high}, not {value}")
    return given


def _role_shares(values: Mapping[str, str], settings: PulsarSettings) -> PulsarSettings:
    """``settings`` with the per-role shares the file sets (``ROLE_SHARE_KEYS``)."""
    shares: dict[str, int] = {}
    for key, name in ROLE_SHARE_KEYS.items():
        if values.get(key) in (None, ""):
            continue
        shares[name] = _integer(values, key, 0)
        if not ROLE_SHARE_RANGE[0] <= shares[name] <= ROLE_SHARE_RANGE[1]:
            raise ConfigError(f"{key} must lie in {ROLE_SHARE_RANGE[0]}..{ROLE_SHARE_RANGE[1]}, not {shares[name]}")
    return dataclasses.replace(settings, **shares)  # type: ignore[arg-type]


# --- listeners and TLS -------------------------------------------------------------------------
def _port(values: Mapping[str, str], key: str, default: int) -> int:
    """A listener's port: ``default`` when the key is absent; 0 (off) when it is empty or 0."""
    if key not in values:
        return default
    if values[key] == "":
        return 0
    port = _integer(values, key, default)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{key} must lie in 0..65535, not {port}")
    return port


def _tls_port(values: Mapping[str, str], key: str, default: int, tls: TlsConfig) -> int:
    """A TLS listener's port: ``default`` when certificates are configured and the key is absent."""
    port = _port(values, key, default if tls.configured else 0)
    if port and not tls.configured:
        raise ConfigError(f"{key} needs tlsCertificateFilePath and tlsKeyFilePath")
    return port


def _web_ports(values: Mapping[str, str], tls: TlsConfig) -> tuple[int, int]:
    """(``webServicePort``, ``webServicePortTls``): at least one of them must be on."""
    port = _port(values, "webServicePort", StandaloneConfig.port)
    tls_port = _tls_port(values, "webServicePortTls", WEB_TLS_PORT, tls)
    if not port and not tls_port:
        raise ConfigError("webServicePort and webServicePortTls are both off: nothing would serve HTTP")
    if port and port == tls_port:
        raise ConfigError(f"webServicePort and webServicePortTls are both {port}")
    return port, tls_port


def _tls(values: Mapping[str, str]) -> TlsConfig:
    cert = values.get("tlsCertificateFilePath") or None
    key = values.get("tlsKeyFilePath") or None
    trust = values.get("tlsTrustCertsFilePath") or None
    if (cert is None) != (key is None):
        raise ConfigError("TLS needs both tlsCertificateFilePath and tlsKeyFilePath")
    for name, path in (("tlsCertificateFilePath", cert), ("tlsKeyFilePath", key), ("tlsTrustCertsFilePath", trust)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{name}: {path} is not a readable file")
    protocols = tuple(p.strip() for p in values.get("tlsProtocols", "").split(",") if p.strip())
    wrong = [p for p in protocols if p not in TLS_PROTOCOLS]
    if wrong:
        raise ConfigError(f"tlsProtocols may name {' and '.join(TLS_PROTOCOLS)} (older versions are refused), "
                          f"not {', '.join(wrong)}")
    tls = TlsConfig(cert, key, trust, require_trusted_client_cert=_flag(values, "tlsRequireTrustedClientCertOnConnect",
                                                                          False),
                    allow_insecure_connection=_flag(values, "tlsAllowInsecureConnection", False),
                    protocols=protocols or TlsConfig.protocols)
    if tls.require_trusted_client_cert and not tls.verifies_clients:
        raise ConfigError("tlsRequireTrustedClientCertOnConnect=true needs tlsTrustCertsFilePath "
                          "and tlsAllowInsecureConnection=false")
    if tls.configured:
        try:
            tls.server_context()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tlsCertificateFilePath, tlsKeyFilePath or tlsTrustCertsFilePath: {exc}") from None
    return tls


def _providers(values: Mapping[str, str], tls: TlsConfig) -> tuple[str, ...]:
    """The methods ``authenticationProviders`` names (Pulsar's class names); the token alone by default."""
    names = [n.strip() for n in values.get("authenticationProviders", "").split(",") if n.strip()]
    wrong = [n for n in names if n not in PROVIDER_CLASSES]
    if wrong:
        raise ConfigError(f"authenticationProviders may name {', '.join(PROVIDER_CLASSES)}, not {', '.join(wrong)}")
    methods = tuple(dict.fromkeys(PROVIDER_CLASSES[n] for n in names)) or (TOKEN_METHOD,)
    if TLS_METHOD in methods and not (tls.configured and tls.verifies_clients):
        raise ConfigError("AuthenticationProviderTls needs the TLS keys and tlsTrustCertsFilePath (the authorities "
                          "that sign client certificates), with tlsAllowInsecureConnection=false")
    return methods


def _read_key(key: str, value: str) -> bytes:
    """A key given as ``file:///path``, ``data:;base64,<b64>`` or a plain file path."""
    try:
        return read_key(value)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{key}: the data: URL does not hold valid base64") from None
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {value.removeprefix('file://')}: {exc.strerror}") from None


def system_properties(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``-Dkey=value`` words of ``PULSAR_EXTRA_OPTS``, as Pulsar's scripts hand them to the JVM."""
    try:
        words = shlex.split(environ.get(EXTRA_OPTS_ENV, ""))
    except ValueError as exc:
        raise ConfigError(f"{EXTRA_OPTS_ENV}: {exc}") from None
    pairs = (word[2:].partition("=") for word in words if word.startswith("-D"))
    return {key: value for key, _, value in pairs if key}


def _basic_users(values: Mapping[str, str], properties: Mapping[str, str]) -> BasicUsers:
    """The htpasswd users of ``basicAuthConf`` (else the ``pulsar.auth.basic.conf`` property)."""
    key = "basicAuthConf" if values.get("basicAuthConf") else f"-D{BASIC_AUTH_PROPERTY}"
    source = values.get("basicAuthConf") or properties.get(BASIC_AUTH_PROPERTY)
    if not source:
        raise ConfigError(f"AuthenticationProviderBasic needs basicAuthConf or -D{BASIC_AUTH_PROPERTY}=<htpasswd "
                          f"file> in {EXTRA_OPTS_ENV}")
    try:
        if source.startswith(("data:", "file:")) or os.path.exists(source):
            text = _read_key(key, source).decode()
        else:
            text = base64.b64decode(source, validate=True).decode()
        return BasicUsers.parse(text)
    except (binascii.Error, UnicodeDecodeError):
        raise ConfigError(f"{key}: {source} is neither a readable file nor an htpasswd file in base64") from None
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _auth(values: Mapping[str, str], tls: TlsConfig, properties: Mapping[str, str]) -> AuthConfig:
    enabled = _flag(values, "authenticationEnabled", False) or _flag(values, "authorizationEnabled", False)
    secret = values.get("tokenSecretKey") or None
    public = values.get("tokenPublicKey") or None
    roles = frozenset(r.strip() for r in values.get("superUserRoles", "").split(",") if r.strip())
    metrics = _flag(values, "authenticateMetricsEndpoint", False)
    if not enabled:
        return AuthConfig(superuser_roles=roles)
    providers = _providers(values, tls)
    if TOKEN_METHOD not in providers:
        secret = public = None
    elif (secret is None) == (public is None):
        raise ConfigError("authenticationEnabled=true needs exactly one of tokenSecretKey or tokenPublicKey")
    return AuthConfig(enabled=True, providers=providers, superuser_roles=roles, authenticate_metrics=metrics,
                      secret_key=_read_key("tokenSecretKey", secret) if secret else None,
                      public_key=_read_key("tokenPublicKey", public) if public else None,
                      anonymous_role=values.get("anonymousUserRole") or None,
                      basic_users=_basic_users(values, properties) if BASIC_METHOD in providers else BasicUsers())
