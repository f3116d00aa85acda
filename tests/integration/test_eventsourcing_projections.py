"""The ``eventsourcing`` library's projection test cases against a real broker: an event-sourced
projection (a process recorder following an application), and a materialised view kept in
Magnetar whose counters are written with the tracking record of the event that moved them."""

from __future__ import annotations

from typing import ClassVar

from eventsourcing.tests.projection import EventSourcedProjectionTestCase

from tests.integration.eventsourcing_support import MagnetarBroker


class TestMagnetarEventSourcedProjection(MagnetarBroker, EventSourcedProjectionTestCase):
    env: ClassVar[dict[str, str]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.env = {"PERSISTENCE_MODULE": "consumers.eventsourcing", "MAGNETAR_SERVICE_URL": cls.url}


del EventSourcedProjectionTestCase
