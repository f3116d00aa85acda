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
``brokerServicePort`` (6650; 0 turns it off), ``brokerServicePortTls`` (6651 when
``tlsCertificateFilePath`` and ``tlsKeyFilePath`` are set), ``tlsTrustCertsFilePath``,
``advertisedAddress``, ``maxMessageSize`` and ``authenticationRefreshCheckSeconds``; plus
``dataDir``, the edge bounds of ``api/limits.py`` (``CONFIG_KEYS``) and the broker's memory
bounds (``BROKER_BOUNDS``: ``dispatcherMaxReadSizeBytes``,
``dispatcherMaxPendingBytesPerConsumer``, ``managedLedgerMaxReadsInFlightSizeInMB``,
``maxMessagePublishBufferSizeInMB``). Keys Magnetar does not use are ignored, so a full Pulsar
``standalone.conf`` loads, and named in one warning, so a misspelt key does not go unnoticed.

Invariant: a bad value (not a number, an unreadable key file, authentication on without a key)
raises ``ConfigError`` naming the key, before anything starts.
"""

from __future__ import annotations

import binascii
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.auth import AuthConfig
from api.limits import CONFIG_KEYS, LIMIT_RANGES, EdgeLimits
from api.pulsar import PulsarSettings
from broker import BrokerConfig
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
KNOWN_KEYS = ("webServicePort", "bindAddress", "dataDir", "authenticationEnabled", "authorizationEnabled",
              "superUserRoles", "tokenSecretKey", "tokenPublicKey", "allowAutoTopicCreation",
              "brokerDeduplicationEnabled", "authenticateMetricsEndpoint", "journalDirectory",
              "defaultRetentionTimeInMinutes", "defaultRetentionSizeInMB", "brokerServicePort",
              "brokerServicePortTls", "tlsCertificateFilePath", "tlsKeyFilePath", "tlsTrustCertsFilePath",
              "advertisedAddress", "maxMessageSize", "authenticationRefreshCheckSeconds", *CONFIG_KEYS,
              *(bound[0] for bound in BROKER_BOUNDS))
RETENTION_LIMIT_MAX = 2**31 - 1
PULSAR_TLS_PORT = 6651
MESSAGE_SIZE_BYTES_RANGE = (1024, 5 * 1024 * 1024)
AUTH_REFRESH_CHECK_S_RANGE = (1, 86_400)
"""``maxMessageSize``: the broker stores messages of at most 5 MiB (larger ones are chunked)."""


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


@dataclass(frozen=True)
class StandaloneConfig:
    data_dir: str = "./data"
    journal_dir: str | None = None
    host: str = "0.0.0.0"
    port: int = 8080
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: EdgeLimits = field(default_factory=EdgeLimits)
    pulsar: PulsarSettings = field(default_factory=PulsarSettings)

    @classmethod
    def load(cls, path: str | None = None, overrides: Mapping[str, str] | None = None) -> StandaloneConfig:
        """The file's settings (when given), then ``overrides`` (same keys) on top."""
        values = parse_properties(Path(path).read_text()) if path else {}
        values.update(overrides or {})
        unused = sorted(set(values) - set(KNOWN_KEYS))
        if unused:
            log.warning("configuration keys Magnetar does not use, ignored: %s", ", ".join(unused))
        return cls(
            data_dir=values.get("dataDir", cls.data_dir),
            journal_dir=values.get("journalDirectory") or None,
            host=values.get("bindAddress", cls.host),
            port=_integer(values, "webServicePort", cls.port),
            broker=dataclasses.replace(
                BrokerConfig(),
                auto_create_topics=_flag(values, "allowAutoTopicCreation", True),
                dedup_enabled=_flag(values, "brokerDeduplicationEnabled", True),
                default_retention_time_minutes=_retention(values, "defaultRetentionTimeInMinutes"),
                default_retention_size_mb=_retention(values, "defaultRetentionSizeInMB"),
                **_broker_bounds(values)),
            auth=_auth(values),
            limits=_limits(values),
            pulsar=_pulsar(values, values.get("bindAddress", cls.host)),
        )


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
    if not -1 <= value <= RETENTION_LIMIT_MAX:
        raise ConfigError(f"{key} must be -1 (unlimited) or in 0..{RETENTION_LIMIT_MAX}, not {value}")
    return value


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


def _pulsar(values: Mapping[str, str], host: str) -> PulsarSettings:
    defaults = PulsarSettings()
    cert = values.get("tlsCertificateFilePath") or None
    key = values.get("tlsKeyFilePath") or None
    if (cert is None) != (key is None):
        raise ConfigError("TLS needs both tlsCertificateFilePath and tlsKeyFilePath")
    for name, path in (("tlsCertificateFilePath", cert), ("tlsKeyFilePath", key),
                       ("tlsTrustCertsFilePath", values.get("tlsTrustCertsFilePath") or None)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{name}: {path} is not a readable file")
    size = _integer(values, "maxMessageSize", defaults.max_message_size_bytes)
    if not MESSAGE_SIZE_BYTES_RANGE[0] <= size <= MESSAGE_SIZE_BYTES_RANGE[1]:
        raise ConfigError(f"maxMessageSize must lie in {MESSAGE_SIZE_BYTES_RANGE[0]}..{MESSAGE_SIZE_BYTES_RANGE[1]}")
    refresh_s = _integer(values, "authenticationRefreshCheckSeconds", int(defaults.auth_refresh_check_s))
    if not AUTH_REFRESH_CHECK_S_RANGE[0] <= refresh_s <= AUTH_REFRESH_CHECK_S_RANGE[1]:
        raise ConfigError(f"authenticationRefreshCheckSeconds must lie in {AUTH_REFRESH_CHECK_S_RANGE[0]}.."
                          f"{AUTH_REFRESH_CHECK_S_RANGE[1]}, not {refresh_s}")
    ports = {}
    for name, default in (("brokerServicePort", defaults.port),
                          ("brokerServicePortTls", PULSAR_TLS_PORT if cert else 0)):
        ports[name] = _integer(values, name, default)
        if not 0 <= ports[name] <= 65535:
            raise ConfigError(f"{name} must lie in 0..65535, not {ports[name]}")
    return PulsarSettings(host=host, port=ports["brokerServicePort"], tls_port=ports["brokerServicePortTls"],
                          tls_cert_file=cert, tls_key_file=key,
                          tls_trust_certs_file=values.get("tlsTrustCertsFilePath") or None,
                          advertised_host=values.get("advertisedAddress") or None, max_message_size_bytes=size,
                          auth_refresh_check_s=float(refresh_s))


def _read_key(key: str, value: str) -> bytes:
    """A key given as ``file:///path``, ``data:;base64,<b64>`` or a plain file path."""
    try:
        return read_key(value)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{key}: the data: URL does not hold valid base64") from None
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {value.removeprefix('file://')}: {exc.strerror}") from None


def _auth(values: Mapping[str, str]) -> AuthConfig:
    enabled = _flag(values, "authenticationEnabled", False) or _flag(values, "authorizationEnabled", False)
    secret = values.get("tokenSecretKey") or None
    public = values.get("tokenPublicKey") or None
    roles = frozenset(r.strip() for r in values.get("superUserRoles", "").split(",") if r.strip())
    metrics = _flag(values, "authenticateMetricsEndpoint", False)
    if not enabled:
        return AuthConfig(superuser_roles=roles)
    if (secret is None) == (public is None):
        raise ConfigError("authenticationEnabled=true needs exactly one of tokenSecretKey or tokenPublicKey")
    return AuthConfig(enabled=True, superuser_roles=roles, authenticate_metrics=metrics,
                      secret_key=_read_key("tokenSecretKey", secret) if secret else None,
                      public_key=_read_key("tokenPublicKey", public) if public else None)
