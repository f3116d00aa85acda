"""Live subscriptions to what a recorder stores in a Magnetar topic.

Role: ``MagnetarSubscription`` (an application sequence) and ``MagnetarDCBSubscription`` (a DCB
store) are the library's listen-and-notify subscriptions (a thread that selects what follows the
last item it handed out, a bounded queue of pages) with a ``TopicListener`` as the notifier: a
WebSocket reader on the topic, opened at its end before the first select, wakes the selecting
thread for every new message, so what is stored is handed out at once, without polling.

Invariants: nothing stored after the reader opened can be missed (the reader sees it and wakes
the selector, which reads from the last position handed out; a reader reopened after its broker
went away, which opens at the topic's end again, wakes the selector once it is back, for what
was stored while it was away); nothing is handed out twice
(selects start after the last position). The reader reconnects when its broker goes away; a
select that fails because the broker cannot be reached is made again, with backoff, for
``RESUME_TIMEOUT_S`` (a restart, a failover), and then ends the iteration with the library's
``OperationalError``. ``stop()`` closes the reader, which ends the
listening thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from threading import Event, Thread
from typing import Any

from eventsourcing.dcb.api import DCBQuery, DCBRecorder
from eventsourcing.dcb.persistence import DCBListenNotifySubscription
from eventsourcing.persistence import ApplicationRecorder, ListenNotifySubscription, OperationalError

from consumers.client import Client, ClientError, ConnectionClosed, ReceiveTimeout
from consumers.eventsourcing.records import persistence_error

RESUME_TIMEOUT_S = 60.0
"""How long a subscription keeps selecting again while its broker cannot be reached (a restart,
a failover) before it ends with the ``OperationalError``."""
RESUME_DELAY_S_MIN = 0.05
RESUME_DELAY_S_MAX = 2.0
LISTEN_WAIT_MS = 1000
"""How long the listening thread waits for a message before it looks whether it was stopped."""
LISTENER_RECEIVER_QUEUE_SIZE = 100


class TopicListener:
    """Sets ``notified`` whenever a message is stored in ``topic`` after it was opened."""

    def __init__(self, client: Client, topic: str) -> None:
        try:
            self._reader = client.create_reader(topic, "latest", reconnect=True,
                                                receiver_queue_size=LISTENER_RECEIVER_QUEUE_SIZE)
        except ClientError as exc:
            raise persistence_error(exc) from exc
        self._stopped = False
        self._thread: Thread | None = None

    def start(self, notified: Event) -> None:
        self._thread = Thread(target=self._listen, args=(notified,), name="magnetar-listener", daemon=True)
        self._thread.start()

    def _listen(self, notified: Event) -> None:
        """Wake the selector for every message, and once the reader reopened after its broker
        went away (it reopens at the topic's end: what was stored meanwhile never reaches it)."""
        seen = self._reader.reconnects
        while not self._stopped:
            try:
                self._reader.read_next(timeout_ms=LISTEN_WAIT_MS)
                woken = True
            except ReceiveTimeout:
                woken = False
            except ConnectionClosed:
                return
            reconnects = self._reader.reconnects
            if woken or reconnects != seen:
                seen = reconnects
                notified.set()

    def stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(ClientError, RuntimeError):
            self._reader.close()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


def pull_resuming(pull: Callable[[], None], stopped: Callable[[], bool], wake: Event) -> None:
    """Run ``pull`` (which resumes after what it handed out), again after an ``OperationalError``
    with backoff until ``RESUME_TIMEOUT_S`` passes or the subscription stops (``wake`` cuts a
    wait short)."""
    deadline_s = time.monotonic() + RESUME_TIMEOUT_S
    delay_s = RESUME_DELAY_S_MIN
    while True:
        try:
            pull()
            return
        except OperationalError:
            if stopped() or time.monotonic() >= deadline_s:
                raise
        wake.wait(delay_s)
        delay_s = min(delay_s * 2, RESUME_DELAY_S_MAX)


class _ListenedTo:
    """The shared half of both subscriptions: a ``TopicListener`` opened before the first select
    wakes the library's listen-and-notify loop; pulls resume after a broker restart."""

    _listener: TopicListener
    _has_been_notified: Any
    _has_been_stopped: Any

    def _listen(self, client: Client, topic: str) -> None:
        self._listener = TopicListener(client, topic)  # before the first select

    def _pull(self) -> None:
        pull_resuming(super()._pull, lambda: self._has_been_stopped, self._has_been_notified)  # type: ignore[misc]

    def stop(self) -> None:
        super().stop()  # type: ignore[misc]
        self._listener.stop()

    def __exit__(self, *args: object, **kwargs: Any) -> None:
        try:
            super().__exit__(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._listener.join()


class MagnetarSubscription(_ListenedTo, ListenNotifySubscription[ApplicationRecorder]):
    """The notifications of ``recorder``, which stores them in ``topic``."""

    def __init__(self, recorder: ApplicationRecorder, client: Client, topic: str, gt: int | None = None,
                 topics: Sequence[str] = ()) -> None:
        self._listen(client, topic)
        super().__init__(recorder, gt=gt, topics=topics)
        self._listener.start(self._has_been_notified)


class MagnetarDCBSubscription(_ListenedTo, DCBListenNotifySubscription[DCBRecorder]):
    """The events of ``recorder`` (matching ``query``), which stores them in ``topic``."""

    def __init__(self, recorder: DCBRecorder, client: Client, topic: str, query: DCBQuery | None = None,
                 after: int | None = None) -> None:
        self._listen(client, topic)
        super().__init__(recorder, query=query, after=after)
        self._listener.start(self._has_been_notified)
