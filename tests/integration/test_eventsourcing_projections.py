"""The ``eventsourcing`` library's projection test cases against a real broker: an event-sourced
projection (a process recorder following an application), and materialised views kept in
Magnetar (of an application and of a DCB application) whose counters are written in one request
with the tracking record of the event that moved them."""

from __future__ import annotations

from typing import ClassVar

from eventsourcing.persistence import StoredEvent, Tracking
from eventsourcing.tests.projection import (
    AggregateEventCountersProjectionTestCase,
    EventCountersView,
    EventSourcedProjectionTestCase,
    TaggedDecisionCountersProjectionTestCase,
)

from consumers.eventsourcing import MagnetarTrackingRecorder
from tests.integration.eventsourcing_support import MagnetarBroker

COUNTER_KEY_PREFIX = "counters/"


class MagnetarEventCountersView(MagnetarTrackingRecorder, EventCountersView):
    """Each counter is a stream whose version is the count; an increment appends to it with the
    tracking record, so a replayed event cannot count twice."""

    def get_created_event_counter(self) -> int:
        return self._count("created")

    def get_subsequent_event_counter(self) -> int:
        return self._count("subsequent")

    def incr_created_event_counter(self, tracking: Tracking) -> None:
        self._increment("created", tracking)

    def incr_subsequent_event_counter(self, tracking: Tracking) -> None:
        self._increment("subsequent", tracking)

    def _count(self, name: str) -> int:
        return self._read_head(COUNTER_KEY_PREFIX + name).value or 0

    def _increment(self, name: str, tracking: Tracking) -> None:
        count = self._count(name) + 1
        self._insert([StoredEvent(COUNTER_KEY_PREFIX + name, count, "counter", b"")], tracking)


class TestMagnetarEventSourcedProjection(MagnetarBroker, EventSourcedProjectionTestCase):
    env: ClassVar[dict[str, str]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.env = {"PERSISTENCE_MODULE": "consumers.eventsourcing", "MAGNETAR_SERVICE_URL": cls.url}


class TestMagnetarAggregateEventCountersProjection(MagnetarBroker, AggregateEventCountersProjectionTestCase):
    view_class = MagnetarEventCountersView
    env: ClassVar[dict[str, str]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.env = {"PERSISTENCE_MODULE": "consumers.eventsourcing", "MAGNETAR_SERVICE_URL": cls.url}


class TestMagnetarTaggedDecisionCountersProjection(MagnetarBroker, TaggedDecisionCountersProjectionTestCase):
    view_class = MagnetarEventCountersView
    env: ClassVar[dict[str, str]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.env = {"PERSISTENCE_MODULE": "consumers.eventsourcing.dcb", "MAGNETAR_SERVICE_URL": cls.url,
                   "MAPPER_TOPIC": "eventsourcing.dcb.msgpack:MessagePackMapper",
                   "EVENTCOUNTERS_PERSISTENCE_MODULE": "consumers.eventsourcing"}


del AggregateEventCountersProjectionTestCase, EventSourcedProjectionTestCase, TaggedDecisionCountersProjectionTestCase
