"""What the parts of one binary-protocol connection share: the broker, the caller, the way out.

Role: a session (``session.py``) owns one ``ConnectionContext`` and hands it to its producer and
consumer halves (``producers.py``, ``consumers.py``). ``Outbound`` is the only thing they know
of the socket: the asyncio adapter (``server.py``) implements it, a test can implement it with
a list. ``RolePools`` are the server's per-role shares (``shares.py``) every connection draws on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from api.auth import ANONYMOUS_ROLE, Action, Authorizer, Principal
from api.pulsar.settings import PulsarSettings
from api.pulsar.shares import RolePools
from api.tls import TlsPeer
from broker import BrokerService, TopicName


class Outbound(Protocol):
    """The connection as the session sees it."""

    def write(self, buffers: Sequence[bytes | memoryview]) -> None:
        """Queue ``buffers`` for the peer, in order, in one write."""

    @property
    def congested(self) -> bool:
        """More than the bound is queued for a slow peer: produce nothing more until it drains."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        """Close the connection (after what is queued)."""


@dataclass
class ConnectionContext:
    service: BrokerService
    authorizer: Authorizer
    settings: PulsarSettings
    out: Outbound
    loop: asyncio.AbstractEventLoop
    connection_id: int
    pools: RolePools
    """The server's per-role shares (connections, topic-list watches)."""
    principal: Principal | None = None
    tls_peer: TlsPeer | None = None
    address: str = ""
    """The client's address as Pulsar's stats show it (``/host:port``)."""
    """The client certificate the connection's TLS handshake verified (``AuthenticationProviderTls``)."""
    counters: dict[str, int] = field(default_factory=dict)

    def authorize(self, action: Action, topic: TopicName) -> None:
        """``Forbidden`` unless the connection's role may ``action`` on ``topic``."""
        if self.authorizer.enabled:
            assert self.principal is not None
            self.authorizer.require(self.principal, action, topic)

    @property
    def counted_role(self) -> str | None:
        """The role whose shares this connection draws on: None with authentication off."""
        if not self.authorizer.enabled or self.principal is None or self.principal.role == ANONYMOUS_ROLE:
            return None
        return self.principal.role

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + amount
