"""Producer access modes: who may produce to a topic, and the topic's durable epoch.

Role: Pulsar's producer access modes, arbitrated by the broker for every transport that opens
producers with one (the binary protocol's PRODUCER translates its ``ProducerAccessMode`` into
:class:`AccessMode`, the same numbers):

- ``SHARED``: any number of producers, unless an exclusive one holds the topic (ProducerBusy);
- ``EXCLUSIVE``: alone on the topic; refused with ``ProducerFenced`` (final for the client)
  while another producer is there, or when it presents a topic epoch older than the topic's
  (another exclusive producer took the topic meanwhile);
- ``WAIT_FOR_EXCLUSIVE``: alone too, but waits (its ``ready`` callback) for the holders to go;
- ``EXCLUSIVE_WITH_FENCING``: takes the topic, fencing every producer there.

The topic epoch grows by one with each exclusive producer that takes the topic, and is stored
with the topic, in its managed ledger's ``__topicEpoch`` property (Pulsar's key), before the
producer is told it: a broker restart or an ownership move keeps it, so a producer holding an
older epoch is fenced on any broker that serves the topic later.

Invariants: producer names are unique per topic; an exclusive holder is always alone; an epoch
given to a producer is stored first (a failed store refuses the producer and changes nothing);
each operation costs the same however many producers a topic has (fencing aside, which closes
every one of them). Called on one thread (the binary front end's event loop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from broker.errors import MagnetarError, ProducerBusy, ProducerFenced

log = logging.getLogger(__name__)

TOPIC_EPOCH_PROPERTY = "__topicEpoch"
"""The managed-ledger property holding a topic's epoch (Pulsar's name for it)."""


class AccessMode(IntEnum):
    """Pulsar's ``ProducerAccessMode`` (the same numbers as its protocol's)."""

    SHARED = 0
    EXCLUSIVE = 1
    WAIT_FOR_EXCLUSIVE = 2
    EXCLUSIVE_WITH_FENCING = 3


@dataclass(eq=False)
class AccessHolder:
    """One producer as the arbitration sees it."""

    name: str
    mode: AccessMode
    fence: Callable[[], None]
    """Called when an ``EXCLUSIVE_WITH_FENCING`` producer takes the topic: this one is closed."""
    ready: Callable[[int], None]
    """Called with the topic epoch when a waiting producer gets the topic."""


@dataclass
class _TopicProducers:
    epoch: int
    holders: dict[str, AccessHolder] = field(default_factory=dict)
    """By producer name, in arrival order. An exclusive holder is always alone."""
    waiting: dict[AccessHolder, None] = field(default_factory=dict)
    """WaitForExclusive producers, in arrival order."""


class ProducerAccess:
    """Who produces to each topic, and each topic's epoch (read from and stored with the topic
    through ``load_epoch(topic)`` and ``store_epoch(topic, epoch)``)."""

    def __init__(self, load_epoch: Callable[[str], int], store_epoch: Callable[[str, int], None]) -> None:
        self._load_epoch = load_epoch
        self._store_epoch = store_epoch
        self._topics: dict[str, _TopicProducers] = {}
        self._count = 0

    def acquire(self, topic: str, holder: AccessHolder, epoch: int | None = None) -> tuple[bool, int]:
        """(ready now, topic epoch); ``ProducerBusy`` or ``ProducerFenced`` when refused, as
        Pulsar refuses. A ``WAIT_FOR_EXCLUSIVE`` producer that must wait is ready later, through
        its ``ready`` callback. ``epoch`` is the topic epoch the client last had (a reconnecting
        exclusive producer's)."""
        state = self._topics.get(topic) or _TopicProducers(self._load_epoch(topic))
        holders = state.holders
        if holder.name in holders:
            raise ProducerBusy(f"a producer named {holder.name} is already connected to {topic}")
        first = next(iter(holders.values()), None)
        if holder.mode == AccessMode.SHARED:
            if first is not None and first.mode != AccessMode.SHARED:
                raise ProducerBusy(f"{topic} has an exclusive producer ({first.name})")
        elif holder.mode == AccessMode.EXCLUSIVE:
            _check_exclusive(topic, state, first, epoch)
            self._next_epoch(topic, state)
        elif holder.mode == AccessMode.EXCLUSIVE_WITH_FENCING:
            self._next_epoch(topic, state)
            self._fence_all(state)
        elif first is not None:  # WAIT_FOR_EXCLUSIVE behind a holder
            self._topics[topic] = state
            state.waiting[holder] = None
            return False, state.epoch
        else:
            self._next_epoch(topic, state)
        self._topics[topic] = state
        holders[holder.name] = holder
        self._count += 1
        return True, state.epoch

    def release(self, topic: str, holder: AccessHolder) -> None:
        state = self._topics.get(topic)
        if state is None:
            return
        state.waiting.pop(holder, None)
        if state.holders.get(holder.name) is holder:
            del state.holders[holder.name]
            self._count -= 1
        if not state.holders and state.waiting:
            try:
                self._hand_over(topic, state)
            except MagnetarError as exc:
                log.warning("%s: a waiting exclusive producer keeps waiting, its epoch not stored: %s", topic, exc)
        if not state.holders and not state.waiting:
            del self._topics[topic]

    def producers(self) -> int:
        return self._count

    def _hand_over(self, topic: str, state: _TopicProducers) -> None:
        """The first waiting producer takes the topic (with a new epoch); while its epoch cannot
        be stored, it keeps waiting (the next release tries again)."""
        nxt = next(iter(state.waiting))
        self._next_epoch(topic, state)
        del state.waiting[nxt]
        state.holders[nxt.name] = nxt
        self._count += 1
        nxt.ready(state.epoch)

    def _next_epoch(self, topic: str, state: _TopicProducers) -> None:
        """One more than the topic's epoch, stored with the topic before anyone is told it."""
        self._store_epoch(topic, state.epoch + 1)
        state.epoch += 1

    def _fence_all(self, state: _TopicProducers) -> None:
        fenced = list(state.holders.values())
        state.holders.clear()
        self._count -= len(fenced)
        for other in fenced:
            other.fence()


def _check_exclusive(topic: str, state: _TopicProducers, first: AccessHolder | None, epoch: int | None) -> None:
    """An ``EXCLUSIVE`` producer is fenced (``ProducerFenced``, final for the client) while the
    topic has another producer, or when the topic's epoch moved past the one it had: another
    exclusive producer took the topic meanwhile."""
    if first is not None:
        raise ProducerFenced(f"{topic} already has a producer ({first.name}); "
                             "an Exclusive producer needs it to itself")
    if epoch is not None and epoch < state.epoch:
        raise ProducerFenced(f"the epoch of {topic} has moved to {state.epoch}; this producer's is {epoch}")
