"""The eventsourcing persistence module when things go wrong: conflicts across aggregates write
nothing, a head another writer moved is read again, an unreachable broker is the library's
``OperationalError``, a subscription survives a ``kill -9`` of its broker, and an insert the
client sent again after its answer timed out is stored once and reported stored."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from eventsourcing.dcb.api import DCBAppendCondition, DCBEvent, DCBQuery, DCBQueryItem
from eventsourcing.persistence import IntegrityError, Notification, OperationalError, ProgrammingError, StoredEvent

from consumers.client import Client
from consumers.eventsourcing import MagnetarApplicationRecorder
from consumers.eventsourcing.dcb import MagnetarDCBRecorder
from tests.standalone import REPO_ROOT, free_port, standalone_command, standalone_process, stop, wait_healthy

UNREACHABLE_BOUND_S = 15.0
RESUME_BOUND_S = 60.0


def event(originator_id: uuid.UUID, version: int, topic: str = "t") -> StoredEvent:
    return StoredEvent(originator_id=originator_id, originator_version=version, topic=topic, state=b"s")


def test_a_conflict_on_one_aggregate_writes_none_of_the_insert(tmp_path: Path) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    with standalone_process(tmp_path) as (url, _), Client(url) as client:
        recorder = MagnetarApplicationRecorder(client, "es-atomic")
        assert recorder.insert_events([event(a, 1)]) == [1]
        with pytest.raises(IntegrityError):
            recorder.insert_events([event(b, 1), event(a, 1)])
        assert recorder.select_events(b) == []
        assert recorder.max_notification_id() == 1
        assert recorder.insert_events([event(b, 1), event(a, 2)]) == [2, 3]


def test_a_head_another_writer_moved_is_read_again_and_checked(tmp_path: Path) -> None:
    a = uuid.uuid4()
    with standalone_process(tmp_path) as (url, _), Client(url) as one, Client(url) as other:
        first, second = MagnetarApplicationRecorder(one, "es-race"), MagnetarApplicationRecorder(other, "es-race")
        first.insert_events([event(a, 1)])  # ``first`` remembers the stream at version 1
        second.insert_events([event(a, 2)])
        with pytest.raises(IntegrityError):
            first.insert_events([event(a, 2)])
        first.insert_events([event(a, 3)])
        assert [e.originator_version for e in second.select_events(a)] == [1, 2, 3]


def test_an_unreachable_broker_is_an_operational_error_within_bounds() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", failover_timeout_s=1.0, http_timeout_s=2.0) as client:
        recorder = MagnetarApplicationRecorder(client, "es-nowhere")
        started = time.monotonic()
        with pytest.raises(OperationalError):
            recorder.insert_events([event(uuid.uuid4(), 1)])
        with pytest.raises(OperationalError):
            recorder.select_notifications(None, 10)
        with pytest.raises(OperationalError):
            recorder.max_notification_id()
        with pytest.raises(OperationalError):
            recorder.subscribe()
        assert time.monotonic() - started < UNREACHABLE_BOUND_S


@contextmanager
def broker_on(port: int, data_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(standalone_command(data_dir, port), cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", proc)
        yield proc
    finally:
        stop(proc, kill=True)


def test_a_subscription_resumes_after_its_broker_is_killed_and_restarted(tmp_path: Path) -> None:
    port, received, stopped = free_port(), [], threading.Event()
    with broker_on(port, tmp_path) as first, Client(f"http://127.0.0.1:{port}") as client:
        recorder = MagnetarApplicationRecorder(client, "es-resume")
        recorder.insert_events([event(uuid.uuid4(), 1)])
        with recorder.subscribe(gt=0) as subscription:
            def follow() -> None:
                for notification in subscription:
                    received.append(notification)
                    if len(received) == 3:
                        stopped.set()
                        return

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            recorder.insert_events([event(uuid.uuid4(), 1)])
            stop(first, kill=True)
            with broker_on(port, tmp_path):
                recorder.insert_events([event(uuid.uuid4(), 1)])
                assert stopped.wait(RESUME_BOUND_S), f"received {[n.id for n in received]} only"
                subscription.stop()
        follower.join(RESUME_BOUND_S)
    assert [n.id for n in received] == [1, 2, 3]
    assert all(isinstance(n, Notification) for n in received)


LARGE_STATE_BYTES = 200_000
LARGE_EVENTS = 60
LARGE_EVENTS_PER_INSERT = 10


def test_an_aggregate_larger_than_one_read_answer_is_read_whole(tmp_path: Path) -> None:
    """A read answer is bounded in bytes (a few MiB): an aggregate and a notification log that
    take several answers are still read to their end."""
    a = uuid.uuid4()
    with standalone_process(tmp_path) as (url, _), Client(url) as client:
        recorder = MagnetarApplicationRecorder(client, "es-large")
        for first in range(1, LARGE_EVENTS + 1, LARGE_EVENTS_PER_INSERT):
            recorder.insert_events([StoredEvent(a, v, "t", bytes(LARGE_STATE_BYTES))
                                    for v in range(first, first + LARGE_EVENTS_PER_INSERT)])
        assert [e.originator_version for e in recorder.select_events(a)] == list(range(1, LARGE_EVENTS + 1))
        assert len(recorder.select_events(a, gt=0)) == LARGE_EVENTS
        assert recorder.max_notification_id() == LARGE_EVENTS


def test_a_partitioned_topic_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Notification ids are one partition's offsets: a partitioned topic has no total order."""
    with standalone_process(tmp_path) as (url, _), Client(url) as client:
        client.request("PUT", "/admin/v2/persistent/public/default/es-split/partitions", json_body=2)
        recorder = MagnetarApplicationRecorder(client, "es-split")
        with pytest.raises(ProgrammingError, match="partitioned"):
            recorder.insert_events([event(uuid.uuid4(), 1)])
        with pytest.raises(ProgrammingError, match="partitioned"):
            recorder.select_notifications(None, 10)
        offsets = client.request("GET", "/topics/persistent/public/default/es-split/offsets").json()["offsets"]
        assert all(o["next"] == 0 for o in offsets.values())


class SlowFirstAnswerProxy:
    """An HTTP proxy in front of a broker that forwards every request at once but holds back the
    answer to the first POST for ``hold_s`` (longer than the client waits): that insert is stored,
    and the client, its answer timed out, sends it again."""

    def __init__(self, broker_url: str, hold_s: float) -> None:
        self.posts = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                answer = httpx.request(self.command, f"{broker_url}{self.path}", content=body,
                                       headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
                                       timeout=30)
                if self.command == "POST":
                    proxy.posts += 1
                    if proxy.posts == 1:
                        time.sleep(hold_s)
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("content-length", str(len(answer.content)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client gave up on the held answer
                    self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815 - http.server's names

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SlowFirstAnswerProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_an_insert_whose_answer_timed_out_is_stored_once_and_reported_stored(tmp_path: Path) -> None:
    """The client sends a POST again when its answer times out; the first was stored. Before
    inserts carried a producer name and sequence id, the resend met the stream at the version the
    first attempt had written and the insert failed as an IntegrityError."""
    a = uuid.uuid4()
    with standalone_process(tmp_path) as (url, _), SlowFirstAnswerProxy(url, hold_s=3.0) as proxy, \
            Client(proxy.url, http_timeout_s=1.0) as client:
        recorder = MagnetarApplicationRecorder(client, "es-resent")
        assert recorder.insert_events([event(a, 1), event(a, 2)]) == [1, 2]
        assert proxy.posts == 2, "the answer should have timed out and the insert been sent again"
        assert [e.originator_version for e in recorder.select_events(a)] == [1, 2]
        assert recorder.max_notification_id() == 2
        assert recorder.insert_events([event(a, 3)]) == [3]


def test_a_dcb_append_whose_answer_timed_out_is_stored_once(tmp_path: Path) -> None:
    """The same for the DCB recorder: a conditional append sent again is answered with its first
    positions; an unconditional one is stored once and reported as stored with its position
    unknown. Before, the conditional one failed as an IntegrityError against its own first
    attempt's event, and nothing kept an unconditional resend from being stored twice."""
    seat = DCBQuery(items=[DCBQueryItem(types=["SeatBooked"], tags=["seat-7"])])
    with standalone_process(tmp_path) as (url, _):
        with SlowFirstAnswerProxy(url, hold_s=3.0) as proxy, Client(proxy.url, http_timeout_s=1.0) as client:
            recorder = MagnetarDCBRecorder(client, "dcb-resent")
            position = recorder.append([DCBEvent("SeatBooked", b"ann", tags=["seat-7"])],
                                       DCBAppendCondition(fail_if_events_match=seat))
            assert proxy.posts == 2 and position == 1
        with SlowFirstAnswerProxy(url, hold_s=3.0) as proxy, Client(proxy.url, http_timeout_s=1.0) as client:
            recorder = MagnetarDCBRecorder(client, "dcb-resent")
            with pytest.raises(OperationalError, match="stored by an earlier attempt"):
                recorder.append([DCBEvent("Note", b"once")])
            assert proxy.posts == 2
        with Client(url) as client:
            events = list(MagnetarDCBRecorder(client, "dcb-resent").read())
    assert [(e.event.type, e.event.data) for e in events] == [("SeatBooked", b"ann"), ("Note", b"once")]
