"""The ``eventsourcing`` library's example application (bank accounts, with snapshots and a
notification log) run against a real broker, selected the library's way through the environment."""

from __future__ import annotations

import os

from eventsourcing.tests.application import ExampleApplicationTestCase

from tests.integration.eventsourcing_support import MagnetarBroker

ENVIRONMENT = ("PERSISTENCE_MODULE", "MAGNETAR_SERVICE_URL")


class TestMagnetarExampleApplication(MagnetarBroker, ExampleApplicationTestCase):
    expected_factory_topic = "consumers.eventsourcing.factory:MagnetarFactory"

    def setUp(self) -> None:
        super().setUp()
        os.environ["PERSISTENCE_MODULE"] = "consumers.eventsourcing"
        os.environ["MAGNETAR_SERVICE_URL"] = self.url

    def tearDown(self) -> None:
        for name in ENVIRONMENT:
            os.environ.pop(name, None)
        super().tearDown()


del ExampleApplicationTestCase
