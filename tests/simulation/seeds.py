"""Seeds and lengths of the seeded simulations, from the environment, and their replay hint.

``MAGNETAR_SIM_SEED=<n>`` replays one seed (every failure prints it); ``MAGNETAR_SIM_SEEDS`` is
a count N (seeds 1..N) or a comma-separated list; ``MAGNETAR_SIM_OPS`` sets the operations per
seed. Without them each simulation runs its own defaults.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol


def seeds_to_run(default_seeds: Sequence[int]) -> list[int]:
    one = os.environ.get("MAGNETAR_SIM_SEED", "").strip()
    if one:
        return [int(one)]
    many = os.environ.get("MAGNETAR_SIM_SEEDS", "").strip()
    if not many:
        return list(default_seeds)
    if "," in many:
        return [int(part) for part in many.split(",") if part.strip()]
    return list(range(1, int(many) + 1))


def ops_per_seed(default_ops: int) -> int:
    return int(os.environ.get("MAGNETAR_SIM_OPS", "").strip() or default_ops)


class Replayable(Protocol):
    replay_hint: str

    def describe(self) -> str: ...
    def close_quietly(self) -> None: ...


def run_with_replay_hint(sim: Replayable, body: Callable[[], None]) -> None:
    """Run a simulation: print how to replay it, attach its trace to any failure, always close."""
    print(sim.replay_hint)
    try:
        body()
    except BaseException as exc:
        exc.add_note(sim.describe())
        raise
    finally:
        sim.close_quietly()
