"""The notification read-ahead of ``MagnetarApplicationRecorder`` against a real broker: a
sequential reader's next page is read while it decodes this one and taken when asked for, and a
page read ahead never hides what was stored after it was read (the end it saw is read again)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from eventsourcing.persistence import StoredEvent

from consumers.client import Client
from consumers.eventsourcing import MagnetarApplicationRecorder
from consumers.eventsourcing.recorders import PendingRows
from tests.standalone import standalone_process

PAGE = 5


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    with standalone_process(tmp_path_factory.mktemp("es-read-ahead")) as (url, _), Client(url) as client:
        yield client


def recorder_of(client: Client) -> MagnetarApplicationRecorder:
    return MagnetarApplicationRecorder(client, f"es-read-ahead-{uuid.uuid4().hex[:12]}")


def insert(recorder: MagnetarApplicationRecorder, count: int) -> None:
    for _ in range(count):
        recorder.insert_events([StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic="t", state=b"s")])


def ids(recorder: MagnetarApplicationRecorder, start: int, limit: int = PAGE) -> list[int]:
    return [n.id for n in recorder.select_notifications(start, limit)]


def test_a_sequential_reader_takes_each_next_page_as_it_was_read_ahead(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 6 * PAGE)
    read: list[int] = []
    start = 1
    while page := ids(recorder, start):
        read += page
        start = page[-1] + 1
    assert read == list(range(1, 6 * PAGE + 1))
    stats = recorder.read_ahead.statistics()
    # the first select starts nowhere known and the second fetches its own page: four of the six
    # pages, then the empty end, came read ahead
    assert (stats.pages_taken, stats.pages_read_ahead) == (4, 5)


def test_an_empty_page_read_ahead_does_not_hide_events_stored_after_it(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 2 * PAGE)
    assert ids(recorder, 1) == list(range(1, PAGE + 1))
    assert ids(recorder, PAGE + 1) == list(range(PAGE + 1, 2 * PAGE + 1))
    recorder.read_ahead.settle()  # the page after the end was read, and was empty
    insert(recorder, 2)
    assert ids(recorder, 2 * PAGE + 1) == [2 * PAGE + 1, 2 * PAGE + 2]
    assert recorder.read_ahead.statistics().pages_dropped == 1


def test_a_short_page_read_ahead_is_read_on_from_its_end(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 2 * PAGE + 2)
    ids(recorder, 1)
    ids(recorder, PAGE + 1)
    recorder.read_ahead.settle()  # the page read ahead holds the two events stored so far
    insert(recorder, 2)
    assert ids(recorder, 2 * PAGE + 1) == list(range(2 * PAGE + 1, 2 * PAGE + 5))
    assert recorder.read_ahead.statistics().pages_taken == 1


def test_a_page_read_ahead_is_dropped_when_the_next_select_asks_for_another(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 4 * PAGE)
    ids(recorder, 1)
    ids(recorder, PAGE + 1)
    recorder.read_ahead.settle()
    assert ids(recorder, 3, limit=3) == [3, 4, 5]
    assert ids(recorder, 2 * PAGE + 1, limit=PAGE - 1) == list(range(2 * PAGE + 1, 3 * PAGE))
    stats = recorder.read_ahead.statistics()
    assert (stats.pages_taken, stats.pages_dropped) == (0, 1)


def test_a_page_read_ahead_whose_answer_failed_is_read_again(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 3 * PAGE)
    ids(recorder, 1)
    sent: list[int] = []
    real_send = recorder.read_ahead._send

    def send_and_lose(offset: int, count: int) -> PendingRows:
        pending = real_send(offset, count)
        sent.append(offset)
        pending.drop()  # the connection its answer would come on is gone
        return pending

    recorder.read_ahead._send = send_and_lose
    assert ids(recorder, PAGE + 1) == list(range(PAGE + 1, 2 * PAGE + 1))
    assert ids(recorder, 2 * PAGE + 1) == list(range(2 * PAGE + 1, 3 * PAGE + 1))
    assert sent == [2 * PAGE, 3 * PAGE]
    stats = recorder.read_ahead.statistics()
    assert (stats.pages_taken, stats.pages_dropped) == (0, 1)
