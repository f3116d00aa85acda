"""Standalone configuration: Pulsar's ``standalone.conf`` keys, read from a ``key=value`` file.

Role: turn a configuration file (and command-line overrides) into the ``BrokerConfig`` and
``AuthConfig`` that ``magnetar standalone`` runs with. Pulsar users can reuse the keys they know:
``webServicePort``, ``bindAddress``, ``authenticationEnabled``, ``authorizationEnabled``,
``superUserRoles``, ``tokenSecretKey`` / ``tokenPublicKey`` (``file:///path``, ``data:;base64,…``
or a plain path), ``allowAutoTopicCreation``, ``brokerDeduplicationEnabled``,
``journalDirectory`` (BookKeeper's key: the embedded bookie's journal on its own disk); plus
``dataDir``. Keys Magnetar does not use are logged and ignored, so a
full Pulsar ``standalone.conf`` loads.

Invariant: a bad value (not a number, an unreadable key file, authentication on without a key)
raises ``ConfigError`` naming the key, before anything starts.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from api.auth import AuthConfig
from broker.service import BrokerConfig

log = logging.getLogger(__name__)

KNOWN_KEYS = ("webServicePort", "bindAddress", "dataDir", "authenticationEnabled", "authorizationEnabled",
              "superUserRoles", "tokenSecretKey", "tokenPublicKey", "allowAutoTopicCreation",
              "brokerDeduplicationEnabled", "journalDirectory")


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

    @classmethod
    def load(cls, path: str | None = None, overrides: Mapping[str, str] | None = None) -> StandaloneConfig:
        """The file's settings (when given), then ``overrides`` (same keys) on top."""
        values = parse_properties(Path(path).read_text()) if path else {}
        values.update(overrides or {})
        for key in sorted(set(values) - set(KNOWN_KEYS)):
            log.info("configuration key %s is not used by Magnetar; ignored", key)
        return cls(
            data_dir=values.get("dataDir", cls.data_dir),
            journal_dir=values.get("journalDirectory") or None,
            host=values.get("bindAddress", cls.host),
            port=_integer(values, "webServicePort", cls.port),
            broker=dataclasses.replace(
                BrokerConfig(),
                auto_create_topics=_flag(values, "allowAutoTopicCreation", True),
                dedup_enabled=_flag(values, "brokerDeduplicationEnabled", True)),
            auth=_auth(values),
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


def read_key(key: str, value: str) -> bytes:
    """A key given as ``file:///path``, ``data:;base64,<b64>`` or a plain file path."""
    if value.startswith("data:"):
        _, _, encoded = value.partition(",")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{key}: the data: URL does not hold valid base64") from None
    path = value.removeprefix("file://")
    try:
        return Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from None


def _auth(values: Mapping[str, str]) -> AuthConfig:
    enabled = _flag(values, "authenticationEnabled", False) or _flag(values, "authorizationEnabled", False)
    secret = values.get("tokenSecretKey") or None
    public = values.get("tokenPublicKey") or None
    roles = frozenset(r.strip() for r in values.get("superUserRoles", "").split(",") if r.strip())
    if not enabled:
        return AuthConfig(superuser_roles=roles)
    if (secret is None) == (public is None):
        raise ConfigError("authenticationEnabled=true needs exactly one of tokenSecretKey or tokenPublicKey")
    return AuthConfig(enabled=True, superuser_roles=roles,
                      secret_key=read_key("tokenSecretKey", secret) if secret else None,
                      public_key=read_key("tokenPublicKey", public) if public else None)
