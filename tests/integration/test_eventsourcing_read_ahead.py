"""The notification read-ahead of ``MagnetarApplicationRecorder`` against a real broker: a
sequential reader reads windows of its pages, the next asked for while it decodes this one; a
window read ahead never hides what was stored after it was read (the end it saw is read again);
one never read closes its connection; and ``Client.send_get`` beneath it answers as a request."""

from __future__ import annotations

import gc
import socket
import uuid
from collections.abc import Iterator

import pytest
from eventsourcing.persistence import DataError, StoredEvent

from consumers.client import Client, HttpError, Topic
from consumers.eventsourcing import MagnetarApplicationRecorder
from consumers.eventsourcing.recorders import WINDOW_AGE_S_MAX, WINDOW_PAGES, PendingRows
from tests.standalone import standalone_process

PAGE = 5
WINDOW = PAGE * WINDOW_PAGES


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    with standalone_process(tmp_path_factory.mktemp("es-read-ahead")) as (url, _), Client(url) as client:
        yield client


def recorder_of(client: Client) -> MagnetarApplicationRecorder:
    """A recorder on a topic of its own whose windows never age (their age bound is tested on its
    own: the counts asserted here must not depend on how fast the machine is)."""
    recorder = MagnetarApplicationRecorder(client, f"es-read-ahead-{uuid.uuid4().hex[:12]}")
    recorder.read_ahead._clock = lambda: 0.0
    return recorder


def insert(recorder: MagnetarApplicationRecorder, count: int) -> None:
    for _ in range(count):
        recorder.insert_events([StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic="t", state=b"s")])


def ids(recorder: MagnetarApplicationRecorder, start: int, limit: int = PAGE) -> list[int]:
    return [n.id for n in recorder.select_notifications(start, limit)]


def test_a_sequential_reader_reads_windows_of_pages_the_next_asked_for_ahead(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 2 * WINDOW + PAGE)
    read: list[int] = []
    start = 1
    while page := ids(recorder, start):
        read += page
        start = page[-1] + 1
    assert read == list(range(1, 2 * WINDOW + PAGE + 1))
    stats = recorder.read_ahead.statistics()
    # one window read (the first), two asked for ahead and taken (the second, and the short
    # third), the other pages out of windows; the empty end is read when it is wanted
    assert (stats.windows_read, stats.windows_read_ahead, stats.windows_taken) == (2, 2, 2)
    assert stats.pages_from_windows == 2 * (WINDOW_PAGES - 1)
    assert stats.windows_dropped == 0


def test_a_select_from_elsewhere_reads_in_windows_from_its_second_select_on(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 2 * WINDOW)
    assert ids(recorder, PAGE + 1) == list(range(PAGE + 1, 2 * PAGE + 1))
    assert recorder.read_ahead.statistics().windows_read == 0  # one page read, as asked
    assert ids(recorder, 2 * PAGE + 1) == list(range(2 * PAGE + 1, 3 * PAGE + 1))
    assert ids(recorder, 3 * PAGE + 1) == list(range(3 * PAGE + 1, 4 * PAGE + 1))
    stats = recorder.read_ahead.statistics()
    assert (stats.windows_read, stats.pages_from_windows) == (1, 1)


def test_an_empty_window_read_ahead_does_not_hide_events_stored_after_it(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, WINDOW)
    for first in range(1, WINDOW, PAGE):
        assert ids(recorder, first) == list(range(first, first + PAGE))
    recorder.read_ahead.settle()  # the window after the end was read, and was empty
    insert(recorder, 2)
    assert ids(recorder, WINDOW + 1) == [WINDOW + 1, WINDOW + 2]
    assert recorder.read_ahead.statistics().windows_dropped == 1


def test_a_short_window_read_ahead_is_read_on_from_its_end(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, WINDOW + 2)
    ids(recorder, 1)
    recorder.read_ahead.settle()  # the window read ahead holds the two events stored after the first
    insert(recorder, 2)
    for first in range(PAGE + 1, WINDOW, PAGE):
        assert ids(recorder, first) == list(range(first, first + PAGE))
    assert ids(recorder, WINDOW + 1) == list(range(WINDOW + 1, WINDOW + 5))
    assert recorder.read_ahead.statistics().windows_taken == 1


def test_the_windows_are_dropped_when_a_select_reads_elsewhere(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 4 * WINDOW)
    ids(recorder, 1)  # a window kept, the next one asked for
    recorder.read_ahead.settle()
    assert ids(recorder, 3, limit=3) == [3, 4, 5]
    stats = recorder.read_ahead.statistics()
    assert (stats.windows_taken, stats.windows_dropped, stats.pages_from_windows) == (0, 1, 0)
    assert ids(recorder, 6) == list(range(6, 6 + PAGE))  # on from there: a window again
    assert recorder.read_ahead.statistics().windows_read == 2


def test_a_window_read_ahead_whose_answer_failed_is_read_again(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 3 * WINDOW)
    sent: list[int] = []
    real_send = recorder.read_ahead._send

    def send_and_lose(offset: int, count: int) -> PendingRows:
        pending = real_send(offset, count)
        sent.append(offset)
        pending.drop()  # the connection its answer would come on is gone
        return pending

    recorder.read_ahead._send = send_and_lose
    read: list[int] = []
    start = 1
    while len(read) < 2 * WINDOW:
        read += ids(recorder, start)
        start = read[-1] + 1
    assert read == list(range(1, 2 * WINDOW + 1))
    assert sent == [WINDOW, 2 * WINDOW]
    stats = recorder.read_ahead.statistics()
    assert (stats.windows_read, stats.windows_taken, stats.windows_dropped) == (2, 0, 1)


def test_a_page_asked_for_ahead_and_never_read_is_closed_with_its_reader_or_client(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 2 * WINDOW)
    ids(recorder, 1)  # the second window is asked for, and never read
    pending = recorder.read_ahead._ahead
    assert pending is not None
    sock = pending[2]._pending._connection._sock  # type: ignore[attr-defined]
    assert sock.fileno() >= 0
    del recorder, pending
    gc.collect()
    assert sock.fileno() == -1  # closed when its recorder went away, not left to a ResourceWarning

    with Client(client.service_url) as other:
        call = other.send_get(f"/topics/persistent/public/default/{uuid.uuid4().hex}/offsets")
        sock = call._connection._sock  # type: ignore[union-attr]
        assert sock is not None and sock.fileno() >= 0
    assert sock.fileno() == -1  # the client's close() closed it


def test_a_get_sent_ahead_answers_as_the_same_request_would(client: Client) -> None:
    recorder = recorder_of(client)
    insert(recorder, 3)
    path = f"/topics/{Topic.parse(recorder.topic).path}/offsets"
    call = client.send_get(path)
    assert call.answer().json() == client.request("GET", path).json()
    with pytest.raises(HttpError, match="answered already"):
        call.answer()
    missing = f"/topics/persistent/public/default/missing-{uuid.uuid4().hex[:8]}/messages"
    with pytest.raises(HttpError) as expected:
        client.request("GET", missing, params={"offset": 0})
    with pytest.raises(HttpError) as raised:
        client.send_get(missing, params={"offset": 0}).answer()
    assert expected.value.status == 404
    assert (raised.value.status, raised.value.code) == (expected.value.status, expected.value.code)
    dropped = client.send_get(path)
    dropped.drop()
    with pytest.raises(HttpError, match="dropped"):
        dropped.answer()


def test_a_window_older_than_its_age_bound_is_read_again(client: Client) -> None:
    """A window answers for WINDOW_AGE_S_MAX after it was asked for: after that, a select reads
    what holds now (here: the topic deleted and created again with three events)."""
    recorder = recorder_of(client)
    now_s = [0.0]
    recorder.read_ahead._clock = lambda: now_s[0]
    insert(recorder, 2 * WINDOW)
    assert ids(recorder, 1) == list(range(1, PAGE + 1))  # a window kept, the next asked for
    recorder.read_ahead.settle()
    name = Topic.parse(recorder.topic)
    client.request("DELETE", f"/admin/v2/{name.path}", params={"force": "true"})
    writer = MagnetarApplicationRecorder(client, recorder.topic)
    insert(writer, 3)
    now_s[0] += WINDOW_AGE_S_MAX + 0.001
    assert ids(recorder, PAGE + 1) == []  # offsets 5.. of the new topic: none yet
    assert recorder.select_notifications(1, 10)[-1].id == 3
    stats = recorder.read_ahead.statistics()
    assert (stats.pages_from_windows, stats.windows_dropped) == (0, 1)


def test_windows_are_read_ahead_from_the_broker_that_answered(client: Client) -> None:
    """With a broker listed first that cannot be reached, the recorder's reads fail over to the
    one that answers, and its windows are asked for there too (all taken, none dropped)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = unused.getsockname()[1]  # bound, not listening: connections are refused
        with Client(f"http://127.0.0.1:{dead},{client.service_url}") as listed:
            recorder = recorder_of(listed)
            insert(recorder, 3 * WINDOW)
            read: list[int] = []
            while len(read) < 3 * WINDOW:
                read += ids(recorder, len(read) + 1)
            stats = recorder.read_ahead.statistics()
    assert read == list(range(1, 3 * WINDOW + 1))
    assert (stats.windows_taken, stats.windows_dropped) == (2, 0)


@pytest.mark.parametrize(("properties", "error"), [
    (None, "not stored events"),
    ({"es-topic": "t", "es-version": "seven"}, "not a number"),
    ({"es-topic": "t", "es-version": "1", "es-id-type": "uuid"}, None),  # a key marked a UUID that is none
])
def test_a_message_that_is_no_stored_event_fails_only_the_page_that_holds_it(
        client: Client, properties: dict[str, str] | None, error: str | None) -> None:
    """A window's notifications are made at once, at its first page; a window that holds a
    message that is no stored event is made a page at a time instead, so a select before that
    message reads as usual and the one that holds it fails (a ``DataError``; a key marked a UUID
    that is none, the ``ValueError`` of ``UUID()``)."""
    recorder = recorder_of(client)
    insert(recorder, PAGE + 2)
    client.produce_batch(recorder.topic, [b"not an event"], keys=["someone-else"],  # offset PAGE + 2
                         properties=properties)
    insert(recorder, WINDOW)
    assert ids(recorder, 1) == list(range(1, PAGE + 1))
    with pytest.raises(DataError if error else ValueError, match=error or "hexadecimal"):
        ids(recorder, PAGE + 1)
    assert ids(recorder, PAGE + 4) == list(range(PAGE + 4, 2 * PAGE + 4))  # past it, as before
