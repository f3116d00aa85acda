"""The ``eventsourcing`` library's DCB recorder test case against a real broker through
``consumers.eventsourcing.dcb``, and the DCB factory selected the library's way."""

from __future__ import annotations

from eventsourcing.dcb.persistence import DCBInfrastructureFactory
from eventsourcing.dcb.tests import DCBRecorderTestCase
from eventsourcing.utils import Environment

from consumers.eventsourcing.dcb import MagnetarDCBFactory, MagnetarDCBRecorder
from tests.integration.eventsourcing_support import MagnetarBroker


class TestMagnetarDCBRecorder(MagnetarBroker, DCBRecorderTestCase):
    def test_append_read(self) -> None:
        self._test_append_read(self.recorder(MagnetarDCBRecorder))

    def test_append_subscribe(self) -> None:
        self._test_append_subscribe(self.recorder(MagnetarDCBRecorder))

    def test_the_factory_is_found_by_the_persistence_module(self) -> None:
        env = Environment("Courses", {"PERSISTENCE_MODULE": "consumers.eventsourcing.dcb",
                                      "MAGNETAR_SERVICE_URL": self.url})
        with DCBInfrastructureFactory.construct(env) as factory:
            assert isinstance(factory, MagnetarDCBFactory)
            recorder = factory.dcb_recorder()
            assert isinstance(recorder, MagnetarDCBRecorder)
            assert recorder.topic == "persistent://public/default/courses-events"
            factory.close()


del DCBRecorderTestCase
