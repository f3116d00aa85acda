"""Who a caller is: Pulsar's authentication providers, one per method, tried in turn.

Role: the seam between what a caller presents and the role it acts as. ``Credentials`` is what
one caller brings, whichever the transport (Pulsar's ``AuthenticationDataSource``): an HTTP
request's or WebSocket handshake's headers and query (a ``RequestHead``: Starlette's request,
or the WebSocket edge's handshake), the binary protocol's ``auth_data``, and the client
certificate its TLS connection verified. Each provider reads the part it knows:

- ``token`` (``AuthenticationProviderToken``): a JWT from ``Authorization: Bearer``, ``?token=``
  or a CONNECT of method ``token``; the role is its ``sub`` claim (HS256 or RS256);
- ``tls`` (``AuthenticationProviderTls``): the verified client certificate of a TLS connection
  (mutual TLS, as the official clients' ``AuthenticationTLS`` presents it); the role is its CN;
- ``basic`` (``AuthenticationProviderBasic``): a user and password, as ``Authorization: Basic
  <base64 user:password>`` or a CONNECT of method ``basic`` holding ``user:password``; the role
  is the user. The users are an htpasswd file's (``BasicUsers``): Apache's MD5 (``$apr1$``,
  ``htpasswd -m``) and traditional ``crypt`` (``htpasswd -d``) as Pulsar reads them, and bcrypt
  (``htpasswd -B``), which Pulsar's provider does not read. A verified password is remembered
  (a digest of it, at most ``BASIC_VERIFIED_ENTRIES_MAX``) so a client that sends it with every
  HTTP request pays the slow hash once.

``api/auth.py`` picks the providers ``authenticationProviders`` names: on HTTP the first one
that finds valid credentials decides; on the binary protocol CONNECT names its method, and that
provider alone decides. A provider is one small class; adding a method adds one class here.

Invariants: a provider answers None when the credentials hold nothing of its kind and raises
``Unauthorized`` when they hold something invalid; it never answers a role it did not verify.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jwt
from passlib.hash import apr_md5_crypt, bcrypt, des_crypt

from api.limits import BASIC_VERIFIED_ENTRIES_MAX
from api.tls import TlsPeer
from broker import Unauthorized

TOKEN_METHOD = "token"
TLS_METHOD = "tls"
BASIC_METHOD = "basic"
PROVIDER_CLASSES = {
    "org.apache.pulsar.broker.authentication.AuthenticationProviderToken": TOKEN_METHOD,
    "org.apache.pulsar.broker.authentication.AuthenticationProviderTls": TLS_METHOD,
    "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic": BASIC_METHOD,
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


HASH_SCHEMES = (("$apr1$", apr_md5_crypt), ("$2a$", bcrypt), ("$2b$", bcrypt), ("$2y$", bcrypt))
"""htpasswd hash prefixes and their schemes; a 13-character hash without a prefix is ``crypt``'s."""


def _scheme_of(hashed: str) -> Any:
    """The passlib scheme that verifies ``hashed``; None for a hash Magnetar does not read."""
    for prefix, scheme in HASH_SCHEMES:
        if hashed.startswith(prefix):
            return scheme
    return des_crypt if des_crypt.identify(hashed) else None


@dataclass(frozen=True)
class BasicUsers:
    """An htpasswd file's users and their password hashes."""

    hashes: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> BasicUsers:
        """``user:hash`` lines (blank lines skipped); ``ValueError`` naming the first bad line."""
        users: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            fields = line.strip().split(":")
            if len(fields) != 2 or not fields[0]:
                raise ValueError(f"line {number}: expected user:hash")
            if _scheme_of(fields[1]) is None:
                raise ValueError(f"line {number}: the hash of {fields[0]!r} is none of $apr1$ (htpasswd -m), "
                                 "crypt (htpasswd -d) or bcrypt (htpasswd -B)")
            users[fields[0]] = fields[1]
        return cls(tuple(users.items()))


class BasicProvider:
    """Pulsar's ``AuthenticationProviderBasic``: the role is the user whose password verifies."""

    method_name = BASIC_METHOD
    wanted = "a user and password ('Authorization: Basic <base64 user:password>')"

    def __init__(self, users: BasicUsers) -> None:
        self._hashes = dict(users.hashes)
        self._verified: OrderedDict[bytes, None] = OrderedDict()

    def authenticate(self, credentials: Credentials) -> Identity | None:
        pair = self._pair_in(credentials)
        if pair is None:
            return None
        user, password = pair
        if not self._verifies(user, password):
            raise Unauthorized("unknown user or invalid password")
        return Identity(user)

    def _verifies(self, user: str, password: str) -> bool:
        hashed = self._hashes.get(user)
        if hashed is None:
            return False
        key = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        if key in self._verified:
            self._verified.move_to_end(key)
            return True
        scheme = _scheme_of(hashed)
        if scheme is None or not scheme.verify(password, hashed):
            return False
        self._verified[key] = None
        if len(self._verified) > BASIC_VERIFIED_ENTRIES_MAX:
            self._verified.popitem(last=False)
        return True

    @staticmethod
    def _pair_in(credentials: Credentials) -> tuple[str, str] | None:
        if credentials.command_data is not None:
            text = credentials.command_data
        elif credentials.http is not None:
            header = credentials.http.headers.get("authorization")
            scheme, _, value = (header or "").partition(" ")
            if scheme.lower() != "basic":
                return None
            try:
                text = base64.b64decode(value.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise Unauthorized("the Basic credentials are not base64") from None
        else:
            return None
        try:
            user, password = text.decode().split(":")
        except (UnicodeDecodeError, ValueError):
            raise Unauthorized("Basic credentials must be user:password") from None
        return user, password
