"""A system of two applications (a follower tracking a leader) on Magnetar survives a ``kill -9``
of its broker mid-run: after a restart it resumes from its tracking record, and every event
of the leader is processed by the follower exactly once (none lost, none twice)."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID

from eventsourcing.application import Application, ProcessingEvent
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import OperationalError
from eventsourcing.system import ProcessApplication, SingleThreadedRunner, System

from tests.standalone import REPO_ROOT, free_port, standalone_command, stop, wait_healthy

EVENTS_TOTAL = 20
KILL_AT_POLICY_CALL = 7


class Item(Aggregate):
    @event("Registered")
    def __init__(self, name: str) -> None:
        self.name = name


class Seen(Aggregate):
    @event("Seen")
    def __init__(self, leader_id: str, leader_version: int) -> None:
        self.leader_id = leader_id
        self.leader_version = leader_version


class Registry(Application[UUID]):
    def register(self, item: Item) -> None:
        self.save(item)


class Tally(ProcessApplication[UUID]):
    before_policy: ClassVar[Callable[[], None] | None] = None
    """A test's hook, called as each event is processed (before its results are stored)."""

    def policy(self, domain_event: Any, processing_event: ProcessingEvent[UUID]) -> None:
        if Tally.before_policy is not None:
            Tally.before_policy()
        processing_event.collect_events(Seen(str(domain_event.originator_id), domain_event.originator_version))


@contextmanager
def broker_on(port: int, data_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(standalone_command(data_dir, port), cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", proc)
        yield proc
    finally:
        stop(proc, kill=True)


def run_system(env: dict[str, str], names: list[str]) -> int:
    """Register ``names`` with the follower processing each at once; how many were registered
    before the broker went away (an ``OperationalError`` ends the run, as it ends a request)."""
    runner: SingleThreadedRunner[UUID] = SingleThreadedRunner(System(pipes=[[Registry, Tally]]), env=env)
    runner.start()
    try:
        registry = runner.get(Registry)
        for index, name in enumerate(names):
            try:
                registry.register(Item(name))
            except OperationalError:
                return index
        runner.get(Tally).pull_and_process("Registry")
        return len(names)
    finally:
        runner.stop()


def processed(env: dict[str, str]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The leader's events and the follower's record of processing them, read afresh."""
    registry, tally = Registry(env=env), Tally(env=env)
    try:
        led = [(str(n.originator_id), n.originator_version) for n in registry.recorder.select_notifications(None, 1000)]
        seen: list[Any] = [tally.mapper.to_domain_event(n) for n in tally.recorder.select_notifications(None, 1000)]
        return led, [(s.leader_id, s.leader_version) for s in seen]
    finally:
        registry.close()
        tally.close()


def test_a_leader_and_follower_survive_a_kill_minus_9_and_process_each_event_once(tmp_path: Path) -> None:
    port = free_port()
    env = {"PERSISTENCE_MODULE": "consumers.eventsourcing", "MAGNETAR_SERVICE_URL": f"http://127.0.0.1:{port}",
           "MAGNETAR_HTTP_TIMEOUT_S": "5"}
    names = [f"item-{i}" for i in range(EVENTS_TOTAL)]
    with broker_on(port, tmp_path) as first:
        policy_calls: list[int] = []

        def kill_while_processing() -> None:  # the leader stored the event; the follower has not
            policy_calls.append(1)
            if len(policy_calls) == KILL_AT_POLICY_CALL:
                stop(first, kill=True)

        Tally.before_policy = kill_while_processing
        try:
            registered = run_system(env, names)
        finally:
            Tally.before_policy = None
    assert registered == KILL_AT_POLICY_CALL - 1  # its save raised, though the leader had stored it
    with broker_on(port, tmp_path):
        assert run_system(env, names[KILL_AT_POLICY_CALL:]) == EVENTS_TOTAL - KILL_AT_POLICY_CALL
        led, seen = processed(env)
    assert len(led) == EVENTS_TOTAL
    duplicates = [pair for pair, count in Counter(seen).items() if count > 1]
    assert duplicates == [], f"processed twice: {duplicates}"
    assert sorted(seen) == sorted(led), f"lost: {sorted(set(led) - set(seen))}"
