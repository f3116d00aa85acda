"""The ``eventsourcing`` library's example application (bank accounts, with snapshots and a
notification log) run against a real broker, selected the library's way through the environment."""

from __future__ import annotations

import os
import uuid

import pytest
from eventsourcing.tests.application import ApplicationTestCase, ExampleApplicationTestCase

from tests.integration.eventsourcing_support import MagnetarBroker

ENVIRONMENT = ("PERSISTENCE_MODULE", "MAGNETAR_SERVICE_URL", "MAGNETAR_NAMESPACE")


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


@pytest.mark.filterwarnings("default::DeprecationWarning")  # test_application_log records one
class TestMagnetarApplication(MagnetarBroker, ApplicationTestCase):
    """The library's application tests (cached aggregates fast-forwarded under contention,
    snapshots, the notification log) with Magnetar as the default persistence module, each test
    in a namespace of its own (the library's tests expect an empty store every time)."""

    def setUp(self) -> None:
        super().setUp()
        namespace = f"public/es-{uuid.uuid4().hex[:12]}"
        self.client.request("PUT", f"/admin/v2/namespaces/{namespace}", json_body={})
        os.environ["PERSISTENCE_MODULE"] = "consumers.eventsourcing"
        os.environ["MAGNETAR_SERVICE_URL"] = self.url
        os.environ["MAGNETAR_NAMESPACE"] = namespace

    def tearDown(self) -> None:
        for name in ENVIRONMENT:
            os.environ.pop(name, None)
        super().tearDown()


del ApplicationTestCase
