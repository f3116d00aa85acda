"""Per-role shares of what the binary front end's connections hold together.

Role: one ``RoleShares`` per server and pool: binary connections
(``connections_per_role_max``, ``brokerMaxConnectionsPerRole``) and topic-list watches
(``topic_list_watchers_per_role_max``, ``maxTopicListWatchersPerRole``). A role holds at most
its share of a pool, so one role cannot take what the others need, as ``maxConnectionsPerRole``
bounds the HTTP requests and WebSocket sessions of a role (``api/request_guard.py``). A share
beyond the bound is refused with ``TooManyRequests`` (Pulsar's ``ServerError.TooManyRequests``:
the client may retry once the role holds less).

Invariants: used on the server's event loop only; a role's count is what it holds (every
``take`` is matched by one ``give_back``) and a role holding nothing has no entry. Per-role
shares apply with authentication on, to authenticated roles (as the HTTP ones do).
"""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import TooManyRequests


class RoleShares:
    def __init__(self, what: str, per_role_max: int, setting: str) -> None:
        self._what = what
        self._per_role_max = per_role_max
        self._setting = setting
        self._held: dict[str, int] = {}

    def take(self, role: str) -> None:
        """One more for ``role``; ``TooManyRequests`` when it holds its whole share."""
        held = self._held.get(role, 0)
        if held >= self._per_role_max:
            raise TooManyRequests(f"role {role!r} already holds {self._per_role_max} {self._what} "
                                  f"on this broker ({self._setting})")
        self._held[role] = held + 1

    def give_back(self, role: str) -> None:
        held = self._held.get(role, 0) - 1
        if held > 0:
            self._held[role] = held
        else:
            self._held.pop(role, None)

    def held(self, role: str) -> int:
        return self._held.get(role, 0)

    def statistics(self) -> dict[str, int]:
        """What each role holds."""
        return dict(self._held)


@dataclass(frozen=True)
class RolePools:
    """The server's per-role shares, which every connection's context holds."""

    connections: RoleShares
    topic_list_watches: RoleShares

    @classmethod
    def of(cls, connections_per_role_max: int, topic_list_watchers_per_role_max: int) -> RolePools:
        return cls(RoleShares("binary connections", connections_per_role_max, "brokerMaxConnectionsPerRole"),
                   RoleShares("topic-list watches", topic_list_watchers_per_role_max, "maxTopicListWatchersPerRole"))
