"""Who a caller is: Pulsar's authentication providers, one per method, tried in turn.

Role: the seam between what a caller presents and the role it acts as. ``Credentials`` is what
one caller brings, whichever the transport (Pulsar's ``AuthenticationDataSource``): an HTTP
request's or WebSocket handshake's headers and query (a ``RequestHead``: Starlette's request,
or the WebSocket edge's handshake), the binary protocol's ``auth_data``, and the client
certificate its TLS connection verified. Each provider reads the part it knows:

- ``token`` (``AuthenticationProviderToken``): a JWT from ``Authorization: Bearer``, ``?token=``
  or a CONNECT of method ``token``; the role is its ``sub`` claim (HS256 or RS256);
- ``tls`` (``AuthenticationProviderTls``): the verified client certificate of a TLS connection
  (mutual TLS, as the official clients' ``AuthenticationTLS`` presents it); the role is its CN.

``api/auth.py`` picks the providers ``authenticationProviders`` names: on HTTP the first one
that finds valid credentials decides; on the binary protocol CONNECT names its method, and that
provider alone decides. A provider is one small class; adding a method adds one class here.

Invariants: a provider answers None when the credentials hold nothing of its kind and raises
``Unauthorized`` when they hold something invalid; it never answers a role it did not verify.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import jwt

from api.tls import TlsPeer
from broker import Unauthorized

TOKEN_METHOD = "token"
TLS_METHOD = "tls"
PROVIDER_CLASSES = {
    "org.apache.pulsar.broker.authentication.AuthenticationProviderToken": TOKEN_METHOD,
    "org.apache.pulsar.broker.authentication.AuthenticationProviderTls": TLS_METHOD,
}
"""``authenticationProviders`` values (Pulsar's class names) and the method each serves."""
TOKEN_COMMAND_PREFIX = "token:"
"""Some clients send the binary protocol's token as ``token:<jwt>``."""


@dataclass(frozen=True)
class Identity:
    """A verified caller: its role and when its credentials end (epoch seconds; None: never)."""

    role: str
    expires_at_s: float | None = None


class RequestHead(Protocol):
    """What a provider reads of an HTTP request or a WebSocket handshake."""

    @property
    def headers(self) -> Mapping[str, str]:
        """Case-insensitive."""

    @property
    def query_params(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Credentials:
    """What one caller presents (any part may be absent)."""

    http: RequestHead | None = None
    """An HTTP request or WebSocket handshake: its headers and query."""
    command_data: bytes | None = None
    """The binary protocol's ``auth_data`` (CONNECT, AUTH_RESPONSE) for the provider's method."""
    tls_peer: TlsPeer | None = None
    """The client certificate the connection's TLS handshake verified."""


class AuthenticationProvider(Protocol):
    method_name: str
    """Pulsar's name of the method (a CONNECT's ``auth_method_name``)."""
    wanted: str
    """What a caller must present, for the answer to one that presented nothing."""

    def authenticate(self, credentials: Credentials) -> Identity | None:
        """The caller; None when ``credentials`` hold nothing for this provider; ``Unauthorized``
        when they hold something that does not verify."""


class TokenProvider:
    method_name = TOKEN_METHOD
    wanted = "a token ('Authorization: Bearer <token>')"

    def __init__(self, key: bytes, algorithm: str, role_claim: str) -> None:
        self._key = key
        self._algorithm = algorithm
        self._role_claim = role_claim

    def authenticate(self, credentials: Credentials) -> Identity | None:
        token = self._token_in(credentials)
        if not token:
            return None
        try:
            claims = jwt.decode(token, self._key, algorithms=[self._algorithm])
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid token: {exc}") from exc
        role = claims.get(self._role_claim)
        if not isinstance(role, str) or not role:
            raise Unauthorized(f"token has no '{self._role_claim}' claim")
        expiry = claims.get("exp")
        return Identity(role, float(expiry) if isinstance(expiry, int | float) else None)

    @staticmethod
    def _token_in(credentials: Credentials) -> str | None:
        if credentials.command_data is not None:
            try:
                return credentials.command_data.decode().removeprefix(TOKEN_COMMAND_PREFIX)
            except UnicodeDecodeError:
                raise Unauthorized("the token is not text") from None
        if credentials.http is None:
            return None
        header = credentials.http.headers.get("authorization")
        if header:
            scheme, _, value = header.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise Unauthorized("the Authorization header must be 'Bearer <token>'")
            return value.strip()
        return credentials.http.query_params.get("token")


class TlsProvider:
    """Pulsar's ``AuthenticationProviderTls``: the role is the CN of the verified client certificate."""

    method_name = TLS_METHOD
    wanted = "a client certificate the broker trusts (on a TLS port)"

    def authenticate(self, credentials: Credentials) -> Identity | None:
        peer = credentials.tls_peer
        if peer is None:
            return None
        role = peer.common_name
        if not role:
            raise Unauthorized("the client certificate has no CN to take the role from")
        return Identity(role)
