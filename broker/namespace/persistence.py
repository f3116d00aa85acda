"""Per-namespace persistence policy: how many bookies store each ledger of a namespace's topics.

Role: Pulsar's ``persistence`` namespace policy (``bookkeeperEnsemble``,
``bookkeeperWriteQuorum``, ``bookkeeperAckQuorum``, ``managedLedgerMaxMarkDeleteRate``), kept in
the namespace's policies document under ``persistence``. The managed ledgers of the namespace's
topics create their next ledgers with it; without one they use the broker's default (1/1/1 for
``magnetar standalone``, 2/2/2 for a cluster broker).

Invariant: a stored policy satisfies ``E >= Qw >= Qa >= 1`` and, when it was set, ``E`` did not
exceed the bookies available (a later loss of bookies makes ledger creation fail with the
retriable ``NotEnoughBookies`` until they are back).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.bookkeeper.bookie import QuorumConfig
from broker.errors import InvalidRequest
from broker.limits import ENSEMBLE_SIZE_MAX, MARK_DELETE_RATE_MAX

POLICY_KEY = "persistence"


@dataclass(frozen=True)
class PersistencePolicy:
    ensemble: int
    write_quorum: int
    ack_quorum: int
    max_mark_delete_rate: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"bookkeeperEnsemble": self.ensemble, "bookkeeperWriteQuorum": self.write_quorum,
                "bookkeeperAckQuorum": self.ack_quorum, "managedLedgerMaxMarkDeleteRate": self.max_mark_delete_rate}

    @property
    def quorum(self) -> QuorumConfig:
        return QuorumConfig(self.ensemble, self.write_quorum, self.ack_quorum)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PersistencePolicy:
        return cls(int(obj["bookkeeperEnsemble"]), int(obj["bookkeeperWriteQuorum"]),
                   int(obj["bookkeeperAckQuorum"]), float(obj.get("managedLedgerMaxMarkDeleteRate") or 0.0))


def check_bounds(policy: PersistencePolicy) -> PersistencePolicy:
    """``policy`` if its quorums and rate are within their bounds, else ``InvalidRequest`` (400),
    with Pulsar's wording for the quorum rule."""
    e, qw, qa = policy.ensemble, policy.write_quorum, policy.ack_quorum
    if not (e >= qw >= qa >= 1):
        raise InvalidRequest(f"Bookkeeper Ensemble ({e}) >= WriteQuorum ({qw}) >= AckQuorum ({qa}) >= 1 must hold")
    if e > ENSEMBLE_SIZE_MAX:
        raise InvalidRequest(f"bookkeeperEnsemble {e} exceeds {ENSEMBLE_SIZE_MAX}")
    if not 0 <= policy.max_mark_delete_rate <= MARK_DELETE_RATE_MAX:  # also refuses NaN
        raise InvalidRequest(f"managedLedgerMaxMarkDeleteRate must be 0..{MARK_DELETE_RATE_MAX:g} per second, "
                             f"not {policy.max_mark_delete_rate}")
    return policy


def validated(policy: PersistencePolicy, bookies_available: int) -> PersistencePolicy:
    """``policy`` if it is within its bounds and ``bookies_available`` bookies can serve it, else
    ``InvalidRequest`` (400)."""
    if check_bounds(policy).ensemble > bookies_available:
        raise InvalidRequest(f"bookkeeperEnsemble {policy.ensemble} exceeds the {bookies_available} bookies available")
    return policy


def quorum_for(policies: Mapping[str, Any], default: QuorumConfig) -> QuorumConfig:
    """The quorum a namespace's new ledgers use: its persistence policy, else ``default``."""
    stored = policies.get(POLICY_KEY)
    if not stored:
        return default
    return PersistencePolicy.from_json(stored).quorum
