"""The ``eventsourcing`` library's DCB recorder test case against a real broker through
``consumers.eventsourcing.dcb``, and the DCB factory selected the library's way."""

from __future__ import annotations

import pytest
from eventsourcing.dcb.api import DCBAppendCondition, DCBEvent, DCBQuery, DCBQueryItem
from eventsourcing.dcb.persistence import DCBInfrastructureFactory
from eventsourcing.dcb.tests import DCBRecorderTestCase
from eventsourcing.persistence import DataError, IntegrityError
from eventsourcing.utils import Environment

from consumers.eventsourcing.dcb import QUERY_ITEMS_MAX, TAG_BYTES_MAX, MagnetarDCBFactory, MagnetarDCBRecorder
from tests.integration.eventsourcing_support import MagnetarBroker


class TestMagnetarDCBRecorder(MagnetarBroker, DCBRecorderTestCase):
    def test_append_read(self) -> None:
        self._test_append_read(self.recorder(MagnetarDCBRecorder))

    def test_append_subscribe(self) -> None:
        self._test_append_subscribe(self.recorder(MagnetarDCBRecorder))

    def test_too_many_query_items_or_an_oversized_tag_is_a_data_error_and_writes_nothing(self) -> None:
        recorder: MagnetarDCBRecorder = self.recorder(MagnetarDCBRecorder)
        too_many = DCBQuery(items=[DCBQueryItem(tags=[f"t{i}"]) for i in range(QUERY_ITEMS_MAX + 1)])
        with pytest.raises(DataError, match="at most"):
            recorder.append([DCBEvent("a", b"x")], DCBAppendCondition(fail_if_events_match=too_many))
        with pytest.raises(DataError, match="at most"):
            recorder.read(too_many)
        with pytest.raises(DataError, match="longer than"):
            recorder.append([DCBEvent("a", b"x"), DCBEvent("b", b"y", tags=["t" * (TAG_BYTES_MAX + 1)])])
        assert list(recorder.read()) == []

    def test_a_condition_someone_else_broke_meanwhile_is_an_integrity_error(self) -> None:
        recorder: MagnetarDCBRecorder = self.recorder(MagnetarDCBRecorder)
        other = MagnetarDCBRecorder(self.client, recorder.topic)
        seat = DCBQuery(items=[DCBQueryItem(types=["SeatBooked"], tags=["seat-7"])])
        head = recorder.read(seat).head  # nothing booked yet
        other.append([DCBEvent("SeatBooked", b"bob", tags=["seat-7"])],
                     DCBAppendCondition(fail_if_events_match=seat, after=head))
        with pytest.raises(IntegrityError):
            recorder.append([DCBEvent("SeatBooked", b"alice", tags=["seat-7"])],
                            DCBAppendCondition(fail_if_events_match=seat, after=head))
        assert [e.event.data for e in recorder.read(seat)] == [b"bob"]

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
