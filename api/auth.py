"""Authentication and namespace permissions, in Pulsar's model.

Role: decide who a request is (authentication) and whether it may do what it asks
(authorization). Who a caller is comes from the providers ``authenticationProviders`` names
(``api/authentication.py``): a JWT (``token``: HS256 with a secret key, or RS256 with a public
key) as ``Authorization: Bearer <token>``, ``?token=<token>`` for WebSocket clients, or a
CONNECT of method ``token``; a trusted client certificate on a TLS port (``tls``, its CN is the
role); an htpasswd user's password (``basic``, as ``Authorization: Basic`` or a CONNECT of method
``basic``). Without ``authenticationProviders`` the token provider alone is used. With
``anonymousUserRole`` a caller that presents no credentials at all (no ``Authorization``
header, token, certificate, or a CONNECT naming no method or ``none``) acts as that role, on
every transport; credentials that do not verify are still refused (Pulsar's HTTP front demotes
them to the anonymous role; Magnetar tells the caller its credentials are wrong). Superuser roles may
do everything; a tenant's ``adminRoles`` may administer that tenant's namespaces and topics;
other roles need a namespace grant of ``produce`` or ``consume``, kept in the namespace's
policies (``auth_policies.namespace_auth``, managed by
``/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}``).

Invariants: with authentication off (standalone's default) every request is the anonymous
superuser and nothing is checked. With it on, missing credentials (without an anonymous role)
and invalid ones are ``Unauthorized`` (401) and valid ones without the permission are ``Forbidden`` (403); the checks
run before any broker call, so a refused request never writes anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from api.authentication import (
    BASIC_METHOD,
    TLS_METHOD,
    TOKEN_METHOD,
    AuthenticationProvider,
    BasicProvider,
    BasicUsers,
    Credentials,
    Identity,
    RequestHead,
    TlsProvider,
    TokenProvider,
)
from api.tls import TlsPeer, tls_peer_in
from broker import BrokerService, Forbidden, NotFound, TopicName, Unauthorized

ANONYMOUS_ROLE = "anonymous"
NO_METHOD = ("", "none")
"""What a CONNECT without credentials names as its method (Pulsar's clients send ``none``)."""


class Action(StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"


@dataclass(frozen=True)
class AuthConfig:
    """``enabled`` turns authentication on, with the ``providers`` named (Pulsar's method
    names, in the order they are tried on HTTP); the token provider needs exactly one key."""

    enabled: bool = False
    providers: tuple[str, ...] = (TOKEN_METHOD,)
    secret_key: bytes | None = None  # HS256
    public_key: bytes | None = None  # RS256 (PEM)
    superuser_roles: frozenset[str] = field(default_factory=frozenset)
    role_claim: str = "sub"
    authenticate_metrics: bool = False
    """``/metrics`` needs a superuser's token (Pulsar's ``authenticateMetricsEndpoint``)."""
    anonymous_role: str | None = None
    """``anonymousUserRole``: the role of a caller without credentials (None: such a caller is refused)."""
    basic_users: BasicUsers = field(default_factory=BasicUsers)
    """The htpasswd users of the ``basic`` provider."""

    def __post_init__(self) -> None:
        unknown = set(self.providers) - {TOKEN_METHOD, TLS_METHOD, BASIC_METHOD}
        if unknown:
            raise ValueError(f"unknown authentication methods: {', '.join(sorted(unknown))}")
        if self.enabled and not self.providers:
            raise ValueError("authentication needs at least one provider")
        if self.enabled and TOKEN_METHOD in self.providers and (self.secret_key is None) == (self.public_key is None):
            raise ValueError("token authentication needs exactly one of secret_key or public_key")

    @property
    def algorithm(self) -> str:
        return "HS256" if self.secret_key is not None else "RS256"


@dataclass(frozen=True)
class Principal:
    role: str
    superuser: bool
    expires_at_s: float | None = field(default=None, compare=False)
    """When the token's ``exp`` claim ends it (epoch seconds); None: it does not expire."""


ANONYMOUS_SUPERUSER = Principal(ANONYMOUS_ROLE, superuser=True)


class Authorizer:
    def __init__(self, config: AuthConfig, service: BrokerService) -> None:
        self.config = config
        self._service = service
        self._providers = _providers(config) if config.enabled else []

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    # --- authentication --------------------------------------------------------------------
    def authenticate(self, connection: HTTPConnection) -> Principal:
        """The caller of an HTTP request, as ``api/request_guard.py`` found it (authenticated
        once per request, from the headers); raises what it found."""
        outcome = connection.scope.get(_CALLER_OUTCOME)
        if outcome is None:
            return self.authenticate_headers(connection)
        if isinstance(outcome, Exception):
            raise outcome
        assert isinstance(outcome, Principal)
        return outcome

    def authenticate_headers(self, connection: HTTPConnection) -> Principal:
        """Verify the caller of an HTTP request (see ``authenticate_request``)."""
        return self.authenticate_request(connection, tls_peer_in(connection.scope))

    def authenticate_request(self, head: RequestHead, tls_peer: TlsPeer | None) -> Principal:
        """Verify the caller of an HTTP request or WebSocket handshake: the first provider that
        finds valid credentials (a token, the TLS connection's client certificate) names it."""
        if not self.config.enabled:
            return ANONYMOUS_SUPERUSER
        credentials = Credentials(http=head, tls_peer=tls_peer)
        refusal: Unauthorized | None = None
        for provider in self._providers:
            try:
                identity = provider.authenticate(credentials)
            except Unauthorized as exc:
                refusal = refusal or exc
                continue
            if identity is not None:
                return self._principal(identity)
        if refusal is None and self.config.anonymous_role:
            return self._principal(Identity(self.config.anonymous_role))
        raise refusal or Unauthorized(
            "authentication required: send " + " or ".join(p.wanted for p in self._providers))

    def authenticate_command(self, method: str, data: bytes | None, tls_peer: TlsPeer | None) -> Principal:
        """Verify a binary-protocol caller: the provider of the ``method`` CONNECT (or
        AUTH_RESPONSE) names decides, from its ``auth_data`` and the connection's certificate;
        a CONNECT naming no method acts as the anonymous role, when there is one."""
        if method in NO_METHOD and self.config.anonymous_role:
            return self._principal(Identity(self.config.anonymous_role))
        provider = next((p for p in self._providers if p.method_name == method), None)
        if provider is None:
            accepted = ", ".join(p.method_name for p in self._providers)
            raise Unauthorized(f"authentication method {method or 'none'!r} is not accepted: use {accepted}")
        identity = provider.authenticate(Credentials(command_data=data, tls_peer=tls_peer))
        if identity is None:
            raise Unauthorized(f"authentication method {method!r} needs {provider.wanted}")
        return self._principal(identity)

    def _principal(self, identity: Identity) -> Principal:
        return Principal(identity.role, superuser=identity.role in self.config.superuser_roles,
                         expires_at_s=identity.expires_at_s)

    # --- authorization ---------------------------------------------------------------------
    def require_superuser(self, principal: Principal) -> None:
        if not principal.superuser:
            raise Forbidden(f"role {principal.role!r} is not a superuser")

    def require_tenant_admin(self, principal: Principal, tenant: str) -> None:
        if principal.superuser:
            return
        if principal.role not in self._admin_roles(tenant):
            raise Forbidden(f"role {principal.role!r} is not an admin of tenant {tenant!r}")

    def require(self, principal: Principal, action: Action, topic: TopicName) -> None:
        """``principal`` may ``action`` on ``topic``: superuser, tenant admin, or a namespace grant."""
        if not self.allowed(principal, action, topic.namespace_name):
            raise Forbidden(f"role {principal.role!r} may not {action.value} on {topic.full_name}")

    def require_lookup(self, principal: Principal, topic: TopicName) -> None:
        """``principal`` may look ``topic`` up (its partitions, its broker): produce or consume
        there, as Pulsar's ``TopicOperation.LOOKUP`` asks."""
        namespace = topic.namespace_name
        if not any(self.allowed(principal, action, namespace) for action in Action):
            raise Forbidden(f"role {principal.role!r} may neither produce nor consume on {topic.full_name}")

    def allowed(self, principal: Principal, action: Action, namespace: str) -> bool:
        """Whether ``principal`` may ``action`` on the topics of ``namespace`` (``tenant/ns``)."""
        if principal.superuser:
            return True
        if principal.role in self._admin_roles(namespace.split("/", 1)[0]):
            return True
        return action.value in self.granted(namespace).get(principal.role, [])

    def _admin_roles(self, tenant: str) -> list[str]:
        try:
            roles: list[str] = self._service.namespaces.tenant_info(tenant).get("adminRoles", [])
        except NotFound:
            return []
        return roles

    def granted(self, namespace: str) -> dict[str, list[str]]:
        try:
            policies = self._service.namespaces.policies(namespace)
        except NotFound:
            return {}
        grants: dict[str, list[str]] = policies.get("auth_policies", {}).get("namespace_auth", {})
        return grants


def _providers(config: AuthConfig) -> list[AuthenticationProvider]:
    """The configured providers, in the configured order."""
    def token() -> AuthenticationProvider:
        key = config.secret_key if config.secret_key is not None else config.public_key
        assert key is not None, "checked by AuthConfig"
        return TokenProvider(key, config.algorithm, config.role_claim)

    made: dict[str, Callable[[], AuthenticationProvider]] = {
        TOKEN_METHOD: token, TLS_METHOD: TlsProvider, BASIC_METHOD: lambda: BasicProvider(config.basic_users)}
    return [made[method]() for method in config.providers]


_CALLER_OUTCOME = "magnetar.caller"


def caller_outcome_key() -> str:
    """The ASGI scope key under which the request guard leaves the caller (a ``Principal``) or
    the refusal to answer (an error)."""
    return _CALLER_OUTCOME


def authorizer_of(connection: HTTPConnection) -> Authorizer:
    authorizer: Authorizer = connection.app.state.authorizer
    return authorizer


async def principal(connection: HTTPConnection) -> Principal:
    """FastAPI dependency: the authenticated caller (raises 401 without a valid token). It is a
    coroutine so that it runs on the event loop: FastAPI runs a plain function dependency in a
    worker thread, a round trip through the thread pool for every request, while the caller is
    a lookup in the scope (``api/request_guard.py`` authenticated it, on the loop, before)."""
    return caller_of(connection)


Caller = Annotated[Principal, Depends(principal)]
"""Route parameter type for the authenticated caller: ``def route(..., caller: Caller)``."""


def caller_of(connection: HTTPConnection) -> Principal:
    """The authenticated caller, as ``Caller`` gives it, for the few routes of the data plane a
    client calls for every message it writes (REST produce): solving a FastAPI dependency costs
    such a request about 100 µs of the event loop's CPU, an eighth of the request."""
    return authorizer_of(connection).authenticate(connection)
