"""A real ``magnetar standalone`` configured exactly as Pulsar's own CI configures the broker its
official Python client is tested against (``pulsar-client-python``: ``tests/test-conf/
standalone-ssl.conf`` and ``build-support/start-test-service-inside-container.sh``), and the
setup that CI runs through admin v2 right after the broker starts.

The configuration is that file's keys with only the ports (free ones) and the paths changed:
``authenticationEnabled=true``, ``authorizationEnabled=true``, ``anonymousUserRole=anonymous``,
``authenticationProviders`` naming the TLS, token and Basic providers, the Basic users from
the ``pulsar.auth.basic.conf`` system property (``PULSAR_EXTRA_OPTS=-Dpulsar.auth.basic.conf=…``,
as the CI script exports it), ``superUserRoles=localhost,superUser,admin``, TLS on both
services with a CA of the test's own. The setup is the CI's ``put`` calls, each with a
``superUser`` token: the cluster ``standalone``, the tenants ``public`` (admin role
``anonymous``) and ``private``, and the namespaces ``public/default``, ``public/default-2``,
``public/default-3``, ``public/default-4`` (``encryption_required``),
``public/test-backlog-quotas`` and ``private/auth`` with the grants in their bodies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pulsar

from consumers.cli.tokens import create_token
from tests.integration.pulsar_support import binary_broker
from tests.standalone import free_port
from tests.tls_material import TlsMaterial, make_material

SECRET = b"pulsar-ci-secret-pulsar-ci-secret"
TOKEN_ROLE = "token-principal"
"""The role of the token the CI writes to ``.test-token.txt`` (granted on ``private/auth``)."""
SUPERUSER = "superUser"
BASIC_USERS = {"admin": "123456", "crypt-user": "crypt-pw", "bcrypt-user": "bcrypt-pw"}
"""The Basic users and their passwords (``admin``/``123456`` as Pulsar's clients' tests use it)."""
TLS_ROLE = "tls-client"
"""The CN of the client certificate (granted on ``private/auth`` by the tests that need it)."""
PROVIDERS = ("org.apache.pulsar.broker.authentication.AuthenticationProviderTls,"
             "org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
             "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic")
REFUSAL_S_MAX = 2.0
"""The longest an official client's call may take when the broker refuses it (no retry loop)."""

SETUP: tuple[tuple[str, dict[str, Any]], ...] = (
    ("clusters/standalone", {"serviceUrl": "http://localhost:8080/", "serviceUrlTls": "https://localhost:8443/",
                             "brokerServiceUrl": "pulsar://localhost:6650/",
                             "brokerServiceUrlTls": "pulsar+ssl://localhost:6651/"}),
    ("tenants/public", {"adminRoles": ["anonymous"], "allowedClusters": ["standalone"]}),
    *((f"namespaces/public/{ns}", {"auth_policies": {"namespace_auth": {"anonymous": ["produce", "consume"]}},
                                   **extra, "replication_clusters": ["standalone"]})
      for ns, extra in (("default", {}), ("default-2", {}), ("default-3", {}),
                        ("default-4", {"encryption_required": True}), ("test-backlog-quotas", {}))),
    ("tenants/private", {"adminRoles": [], "allowedClusters": ["standalone"]}),
    ("namespaces/private/auth", {"auth_policies": {"namespace_auth": {TOKEN_ROLE: ["produce", "consume"],
                                                                       "chained-client": ["produce", "consume"]}},
                                 "replication_clusters": ["standalone"]}),
)
"""The CI's ``put`` calls, in its order: (path under ``/admin/v2/``, JSON body)."""


@dataclass
class CiBroker:
    http_url: str
    pulsar_url: str
    https_url: str
    pulsar_tls_url: str
    material: TlsMaterial
    directory: Path
    setup_statuses: dict[str, int] = field(default_factory=dict)
    """The status each setup ``PUT`` was answered with."""

    @property
    def ca(self) -> str:
        return str(self.material.ca.cert)

    def token(self, role: str) -> str:
        return create_token(role, secret_key=SECRET)

    def headers(self, role: str = SUPERUSER) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(role)}"}

    def admin(self, method: str, path: str, *, role: str | None = SUPERUSER, **options: Any) -> httpx.Response:
        """``method`` on ``/admin/v2/{path}`` (as ``role``; None: without credentials)."""
        headers = self.headers(role) if role is not None else {}
        return httpx.request(method, f"{self.http_url}/admin/v2/{path}", headers=headers, timeout=30, **options)

    def tls_auth(self, role: str = TLS_ROLE) -> pulsar.AuthenticationTLS:
        pair = self.material.client(role)
        return pulsar.AuthenticationTLS(str(pair.cert), str(pair.key))

    def client(self, url: str | None = None, *, operation_timeout_s: int = 15, **options: Any) -> pulsar.Client:
        """An official client of this broker (``pulsar://`` unless ``url``; TLS trusting its CA)."""
        target = url or self.pulsar_url
        if target.startswith(("pulsar+ssl", "https")):
            options.setdefault("tls_trust_certs_file_path", self.ca)
        return pulsar.Client(target, operation_timeout_seconds=operation_timeout_s,
                             logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **options)


def htpasswd_lines() -> str:
    """One user per hash Pulsar's ``AuthenticationProviderBasic`` reads: Apache's MD5
    (``$apr1$``, ``htpasswd -m``), traditional ``crypt`` (``htpasswd -d``); and bcrypt (``-B``)."""
    from passlib.hash import apr_md5_crypt, bcrypt, des_crypt

    hashes = {"admin": apr_md5_crypt.hash(BASIC_USERS["admin"]),
              "crypt-user": des_crypt.hash(BASIC_USERS["crypt-user"]),
              "bcrypt-user": bcrypt.using(rounds=4).hash(BASIC_USERS["bcrypt-user"])}
    return "".join(f"{user}:{hashed}\n" for user, hashed in hashes.items())


def ci_config(directory: Path, material: TlsMaterial, pulsar_tls_port: int, web_tls_port: int,
              **extra: str) -> Path:
    """Pulsar's CI ``standalone-ssl.conf``: its keys and values, the ports and paths made local."""
    secret = directory / "secret.key"
    secret.write_bytes(SECRET)
    keys = {"brokerServicePortTls": str(pulsar_tls_port), "webServicePortTls": str(web_tls_port),
            "bindAddress": "0.0.0.0", "advertisedAddress": "localhost", "clusterName": "standalone",
            "tlsEnabled": "true", "tlsCertificateFilePath": str(material.server.cert),
            "tlsKeyFilePath": str(material.server.key), "tlsTrustCertsFilePath": str(material.ca.cert),
            "tlsAllowInsecureConnection": "false", "anonymousUserRole": "anonymous",
            "authenticationEnabled": "true", "authenticationProviders": PROVIDERS,
            "authorizationEnabled": "true", "tokenSecretKey": f"file://{secret}",
            "superUserRoles": "localhost,superUser,admin", "brokerClientAuthenticationPlugin": "",
            "brokerClientAuthenticationParameters": "", "acknowledgmentAtBatchIndexLevelEnabled": "true",
            "defaultRetentionTimeInMinutes": "0", "defaultRetentionSizeInMB": "0",
            "allowAutoTopicCreation": "true", "allowAutoTopicCreationType": "non-partitioned",
            "maxMessageSize": "1024000", "topicLevelPoliciesEnabled": "false", **extra}
    config = directory / "standalone-ssl.conf"
    config.write_text("".join(f"{key}={value}\n" for key, value in keys.items()))
    return config


def run_setup(broker: CiBroker) -> None:
    """The CI's ``put`` calls (as the CI's ``curl`` makes them: a status is not checked there,
    it is recorded here)."""
    for path, body in SETUP:
        broker.setup_statuses[path] = broker.admin("PUT", path, json=body).status_code


@contextmanager
def ci_broker(directory: Path, *, setup: bool = True, **extra: str) -> Iterator[CiBroker]:
    """A broker configured as Pulsar's client CI configures its own, after that CI's setup."""
    material = make_material(directory / "test-conf")
    htpasswd = directory / "test-conf" / ".htpasswd"
    htpasswd.write_text(htpasswd_lines())
    pulsar_tls_port, web_tls_port = free_port(), free_port()
    config = ci_config(directory, material, pulsar_tls_port, web_tls_port, **extra)
    env = {"PULSAR_EXTRA_OPTS": f"-Dpulsar.auth.basic.conf={htpasswd}"}
    with binary_broker(directory / "data", "--config", str(config), env=env) as (http_url, pulsar_url, _):
        broker = CiBroker(http_url, pulsar_url, f"https://localhost:{web_tls_port}",
                          f"pulsar+ssl://localhost:{pulsar_tls_port}", material, directory)
        if setup:
            run_setup(broker)
        yield broker


T = TypeVar("T")


def timed(call: Callable[[], T]) -> tuple[T | BaseException, float]:
    """``call``'s result (or what it raised) and how long it took, in seconds."""
    started = time.monotonic()
    try:
        outcome: T | BaseException = call()
    except Exception as exc:
        outcome = exc
    return outcome, time.monotonic() - started


def refused_fast(call: Callable[[], object], expected: type[BaseException] | tuple[type[BaseException], ...]) -> float:
    """Assert ``call`` raises ``expected`` within ``REFUSAL_S_MAX``; the seconds it took."""
    outcome, took_s = timed(call)
    assert isinstance(outcome, expected), f"expected {expected}, got {outcome!r} after {took_s:.2f} s"
    assert took_s < REFUSAL_S_MAX, f"{outcome!r} took {took_s:.2f} s (a retry loop?)"
    return took_s
