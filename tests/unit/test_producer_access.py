"""The broker's producer access modes (``broker/producer_access.py``) over an in-memory stand-in
for the topics' stored epochs: the epoch is read from the topic, stored before a producer is
told it, and a failed store refuses the producer and changes nothing."""

from __future__ import annotations

import pytest

from broker import AccessHolder, AccessMode, ProducerAccess, ProducerBusy, ProducerFenced
from broker.errors import ServiceUnitNotReady

TOPIC = "persistent://public/default/t"


class Epochs:
    """The stored epochs, by topic; ``failing`` makes the next store fail."""

    def __init__(self) -> None:
        self.stored: dict[str, int] = {}
        self.failing = False

    def load(self, topic: str) -> int:
        return self.stored.get(topic, 0)

    def store(self, topic: str, epoch: int) -> None:
        if self.failing:
            raise ServiceUnitNotReady("the metadata store is cut off")
        self.stored[topic] = epoch


def _holder(name: str, mode: AccessMode, fenced: list[str] | None = None,
            ready: list[int] | None = None) -> AccessHolder:
    fenced_names = fenced if fenced is not None else []
    return AccessHolder(name, mode, lambda: fenced_names.append(name), (ready if ready is not None else []).append)


def test_the_epoch_is_stored_and_read_back_by_a_new_table() -> None:
    epochs = Epochs()
    access = ProducerAccess(epochs.load, epochs.store)
    first = _holder("a", AccessMode.EXCLUSIVE)
    assert access.acquire(TOPIC, first) == (True, 1)
    access.release(TOPIC, first)
    assert access.acquire(TOPIC, _holder("b", AccessMode.EXCLUSIVE)) == (True, 2)
    assert epochs.stored[TOPIC] == 2
    restarted = ProducerAccess(epochs.load, epochs.store)  # a broker restart: nothing in memory
    with pytest.raises(ProducerFenced, match="moved to 2"):
        restarted.acquire(TOPIC, _holder("a", AccessMode.EXCLUSIVE), epoch=1)
    assert restarted.acquire(TOPIC, _holder("c", AccessMode.EXCLUSIVE), epoch=2) == (True, 3)


def test_a_failed_store_refuses_the_producer_and_changes_nothing() -> None:
    epochs = Epochs()
    access = ProducerAccess(epochs.load, epochs.store)
    epochs.failing = True
    with pytest.raises(ServiceUnitNotReady):
        access.acquire(TOPIC, _holder("a", AccessMode.EXCLUSIVE))
    assert access.producers() == 0 and TOPIC not in epochs.stored
    epochs.failing = False
    assert access.acquire(TOPIC, _holder("a", AccessMode.SHARED)) == (True, 0)


def test_modes_refuse_and_fence_as_pulsar() -> None:
    epochs = Epochs()
    access = ProducerAccess(epochs.load, epochs.store)
    fenced: list[str] = []
    ready: list[int] = []
    shared = _holder("s", AccessMode.SHARED, fenced)
    access.acquire(TOPIC, shared)
    with pytest.raises(ProducerBusy):
        access.acquire(TOPIC, _holder("s", AccessMode.SHARED))
    with pytest.raises(ProducerFenced):
        access.acquire(TOPIC, _holder("x", AccessMode.EXCLUSIVE))
    assert access.acquire(TOPIC, _holder("w", AccessMode.WAIT_FOR_EXCLUSIVE, ready=ready)) == (False, 0)
    taker = _holder("f", AccessMode.EXCLUSIVE_WITH_FENCING)
    assert access.acquire(TOPIC, taker) == (True, 1) and fenced == ["s"]
    access.release(TOPIC, taker)
    assert ready == [2] and epochs.stored[TOPIC] == 2  # the waiting producer took the topic
