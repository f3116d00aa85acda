"""The ``eventsourcing`` library's own recorder test cases, run against a real broker through
``consumers.eventsourcing`` (one ``magnetar standalone`` per test class)."""

from __future__ import annotations

import os
from typing import ClassVar

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    ProcessRecorder,
    TrackingRecorder,
)
from eventsourcing.tests.persistence import (
    AggregateRecorderTestCase,
    ApplicationRecorderTestCase,
    InfrastructureFactoryTestCase,
    NonInterleavingNotificationIDsBaseCase,
    ProcessRecorderTestCase,
    TrackingRecorderTestCase,
)
from eventsourcing.utils import Environment

from consumers.eventsourcing import (
    Factory,
    MagnetarAggregateRecorder,
    MagnetarApplicationRecorder,
    MagnetarProcessRecorder,
    MagnetarTrackingRecorder,
)
from tests.integration.eventsourcing_support import MagnetarBroker


class TestMagnetarAggregateRecorder(MagnetarBroker, AggregateRecorderTestCase):
    def create_recorder(self) -> AggregateRecorder:
        recorder: MagnetarAggregateRecorder = self.recorder(MagnetarAggregateRecorder)
        return recorder


class TestMagnetarApplicationRecorder(MagnetarBroker, ApplicationRecorderTestCase[MagnetarApplicationRecorder]):
    def create_recorder(self) -> MagnetarApplicationRecorder:
        recorder: MagnetarApplicationRecorder = self.recorder(MagnetarApplicationRecorder)
        return recorder

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


class TestMagnetarTrackingRecorder(MagnetarBroker, TrackingRecorderTestCase):
    def create_recorder(self) -> TrackingRecorder:
        recorder: MagnetarTrackingRecorder = self.recorder(MagnetarTrackingRecorder)
        return recorder


class TestMagnetarProcessRecorder(MagnetarBroker, ProcessRecorderTestCase):
    def create_recorder(self) -> ProcessRecorder:
        recorder: MagnetarProcessRecorder = self.recorder(MagnetarProcessRecorder)
        return recorder


class TestMagnetarNonInterleavingNotificationIds(MagnetarBroker, NonInterleavingNotificationIDsBaseCase):
    def create_recorder(self) -> ApplicationRecorder:
        recorder: MagnetarApplicationRecorder = self.recorder(MagnetarApplicationRecorder)
        return recorder


class TrackingRecorderSubclass(MagnetarTrackingRecorder):
    pass


class TestMagnetarInfrastructureFactory(MagnetarBroker, InfrastructureFactoryTestCase[Factory]):
    env: ClassVar[Environment]  # type: ignore[misc]

    def setUp(self) -> None:
        self.env = Environment("TestCase")  # type: ignore[misc]
        self.env[InfrastructureFactory.PERSISTENCE_MODULE] = "consumers.eventsourcing"
        self.env[Factory.SERVICE_URL] = self.url
        super().setUp()

    def tearDown(self) -> None:
        super().tearDown()
        for name in ("CIPHER_KEY", "CIPHER_TOPIC", "COMPRESSOR_TOPIC"):
            os.environ.pop(name, None)

    def expected_factory_class(self) -> type[Factory]:
        return Factory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return MagnetarAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return MagnetarApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return MagnetarTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return TrackingRecorderSubclass

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return MagnetarProcessRecorder


del AggregateRecorderTestCase, ApplicationRecorderTestCase, TrackingRecorderTestCase, ProcessRecorderTestCase
del NonInterleavingNotificationIDsBaseCase, InfrastructureFactoryTestCase
