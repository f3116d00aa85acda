"""Token authentication and namespace permissions, in Pulsar's model.

Role: decide who a request is (authentication) and whether it may do what it asks
(authorization). A client presents a JWT (HS256 with a secret key, or RS256 with a public key)
as ``Authorization: Bearer <token>``; WebSocket clients may pass ``?token=<token>`` instead. The
token's ``sub`` claim is the role. Superuser roles may do everything; a tenant's ``adminRoles``
may administer that tenant's namespaces and topics; other roles need a namespace grant of
``produce`` or ``consume``, kept in the namespace's policies (``auth_policies.namespace_auth``,
managed by ``/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}``).

Invariants: with authentication off (standalone's default) every request is the anonymous
superuser and nothing is checked. With it on, a missing or invalid token is ``Unauthorized``
(401) and a valid token without the permission is ``Forbidden`` (403); the checks run before
any broker call, so a refused request never writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated

import jwt
from fastapi import Depends
from starlette.requests import HTTPConnection

from broker import BrokerService, Forbidden, NotFound, TopicName, Unauthorized

ANONYMOUS_ROLE = "anonymous"


class Action(StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"


@dataclass(frozen=True)
class AuthConfig:
    """``enabled`` turns token checks on; then exactly one of the keys must be set."""

    enabled: bool = False
    secret_key: bytes | None = None  # HS256
    public_key: bytes | None = None  # RS256 (PEM)
    superuser_roles: frozenset[str] = field(default_factory=frozenset)
    role_claim: str = "sub"
    authenticate_metrics: bool = False
    """``/metrics`` needs a superuser's token (Pulsar's ``authenticateMetricsEndpoint``)."""

    def __post_init__(self) -> None:
        if self.enabled and (self.secret_key is None) == (self.public_key is None):
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

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    # --- authentication --------------------------------------------------------------------
    def authenticate(self, connection: HTTPConnection) -> Principal:
        """The caller of an HTTP request or WebSocket handshake, as ``api/request_guard.py``
        found it (authenticated once per request, from the headers); raises what it found."""
        outcome = connection.scope.get(_CALLER_OUTCOME)
        if outcome is None:
            return self.authenticate_headers(connection)
        if isinstance(outcome, Exception):
            raise outcome
        assert isinstance(outcome, Principal)
        return outcome

    def authenticate_headers(self, connection: HTTPConnection) -> Principal:
        """Verify the caller's token (``Authorization: Bearer`` or ``?token=``)."""
        if not self.config.enabled:
            return ANONYMOUS_SUPERUSER
        return self.principal_of(_token_of(connection))

    def principal_of(self, token: str | None) -> Principal:
        if not token:
            raise Unauthorized("authentication required: send 'Authorization: Bearer <token>'")
        key = self.config.secret_key if self.config.secret_key is not None else self.config.public_key
        assert key is not None
        try:
            claims = jwt.decode(token, key, algorithms=[self.config.algorithm])
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid token: {exc}") from exc
        role = claims.get(self.config.role_claim)
        if not isinstance(role, str) or not role:
            raise Unauthorized(f"token has no '{self.config.role_claim}' claim")
        expiry = claims.get("exp")
        return Principal(role, superuser=role in self.config.superuser_roles,
                         expires_at_s=float(expiry) if isinstance(expiry, int | float) else None)

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

    def allowed(self, principal: Principal, action: Action, namespace: str) -> bool:
        """Whether ``principal`` may ``action`` on the topics of ``namespace`` (``tenant/ns``)."""
        if principal.superuser:
            return True
        if principal.role in self._admin_roles(namespace.split("/", 1)[0]):
            return True
        return action.value in self.granted(namespace).get(principal.role, [])

    def _admin_roles(self, tenant: str) -> list[str]:
        try:
            roles: list[str] = self._service.tenant_info(tenant).get("adminRoles", [])
        except NotFound:
            return []
        return roles

    def granted(self, namespace: str) -> dict[str, list[str]]:
        try:
            policies = self._service.policies(namespace)
        except NotFound:
            return {}
        grants: dict[str, list[str]] = policies.get("auth_policies", {}).get("namespace_auth", {})
        return grants


def _token_of(connection: HTTPConnection) -> str | None:
    header = connection.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        return value.strip()
    return connection.query_params.get("token")


_CALLER_OUTCOME = "magnetar.caller"


def caller_outcome_key() -> str:
    """The ASGI scope key under which the request guard leaves the caller (a ``Principal``) or
    the refusal to answer (an error)."""
    return _CALLER_OUTCOME


def authorizer_of(connection: HTTPConnection) -> Authorizer:
    authorizer: Authorizer = connection.app.state.authorizer
    return authorizer


def principal(connection: HTTPConnection) -> Principal:
    """FastAPI dependency: the authenticated caller (raises 401 without a valid token)."""
    return authorizer_of(connection).authenticate(connection)


Caller = Annotated[Principal, Depends(principal)]
"""Route parameter type for the authenticated caller: ``def route(..., caller: Caller)``."""
