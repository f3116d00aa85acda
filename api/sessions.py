"""Open WebSocket sessions and the permissions they were admitted with.

Role: a WebSocket session is authorized once, at its handshake, and may then live for days. When
an administrator revokes a grant (a namespace permission, a tenant's admin roles, a deleted
namespace), sessions admitted under it must end then, not whenever they happen to reconnect.
Each session registers what its handshake checked (the caller and each (action, topic) pair);
the broker service tells the registry when policies change, and the registry checks every
session again and closes the ones no longer allowed with code 1008 (policy violation) and a
reason naming what was revoked.

On a cluster broker, a session also ends when its topic stops being served here (its bundle was
unloaded, split, or lost with the ZooKeeper session): code 1012 (service restart), so the
client connects again through a lookup and reaches the topic's new owner.

Invariants: a session is in the registry from its acceptance until it ends; a re-check reads
the policies as they are after the change; closing happens on the session's own event loop
(``Closable.close`` is called there, never from the thread that changed the policies).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from api.auth import Action, Authorizer, Principal
from broker import Forbidden, TopicName

log = logging.getLogger(__name__)

POLICY_VIOLATION = 1008
SERVICE_RESTART = 1012


class Closable(Protocol):
    """A session's connection, as the registry closes it (on its event loop)."""

    def close(self, code: int, reason: str) -> None: ...


@dataclass(frozen=True)
class Admission:
    """What a session's handshake was authorized for."""

    principal: Principal
    checks: tuple[tuple[Action, TopicName], ...]


class SessionRegistry:
    def __init__(self, authorizer: Authorizer) -> None:
        self._authorizer = authorizer
        self._sessions: dict[int, tuple[Admission, Closable, asyncio.AbstractEventLoop]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.revoked = 0

    def opened(self, admission: Admission, connection: Closable, loop: asyncio.AbstractEventLoop) -> int:
        session_id = next(self._ids)
        with self._lock:
            self._sessions[session_id] = (admission, connection, loop)
        return session_id

    def ended(self, session_id: int) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def revalidate(self) -> None:
        """Check every open session against the policies as they are now (any thread); close
        those whose caller lost a permission the session needs."""
        with self._lock:
            sessions = list(self._sessions.items())
        for session_id, (admission, connection, loop) in sessions:
            reason = self._refusal(admission)
            if reason is None:
                continue
            self.ended(session_id)
            self.revoked += 1
            log.info("closing a WebSocket session of role %r: %s", admission.principal.role, reason)
            with contextlib.suppress(RuntimeError):  # the loop is gone: so is the session
                loop.call_soon_threadsafe(connection.close, POLICY_VIOLATION, reason)

    def topics_unloaded(self, names: list[TopicName]) -> None:
        """End (1012) every session on one of ``names`` (any thread)."""
        gone = set(names)
        with self._lock:
            sessions = [(i, entry) for i, entry in self._sessions.items()
                        if any(topic in gone for _, topic in entry[0].checks)]
        for session_id, (_, connection, loop) in sessions:
            self.ended(session_id)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(connection.close, SERVICE_RESTART,
                                          "topic moved to another broker; look it up again")

    def _refusal(self, admission: Admission) -> str | None:
        try:
            for action, topic in admission.checks:
                self._authorizer.require(admission.principal, action, topic)
        except Forbidden as exc:
            return f"permission revoked: {exc}"
        return None

