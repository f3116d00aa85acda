"""A live subscription to an application sequence stored in a Magnetar topic.

Role: ``MagnetarSubscription`` is the library's ``ListenNotifySubscription`` (a thread that
selects notifications after the last one it handed out, a bounded queue of pages) with Magnetar
as the listener: a WebSocket reader on the topic, opened at its end before the first select,
wakes the selecting thread for every new message, so a new notification is handed out as soon
as it is stored, without polling.

Invariants: nothing stored after the reader opened can be missed (the reader sees it and wakes
the selector, which reads from the last id handed out); nothing is handed out twice (selects
start after the last id). The reader reconnects when its broker goes away; a select that fails
(the broker down for longer than the client's failover time) ends the iteration with the
library's ``OperationalError``. ``stop()`` closes the reader, which ends the listening thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from threading import Thread
from typing import TYPE_CHECKING, Any

from eventsourcing.persistence import ListenNotifySubscription

from consumers.client import ClientError, ConnectionClosed, ReceiveTimeout

if TYPE_CHECKING:
    from consumers.eventsourcing.recorders import MagnetarApplicationRecorder

LISTEN_WAIT_MS = 1000
"""How long the listening thread waits for a message before it looks whether it was stopped."""
LISTENER_RECEIVER_QUEUE_SIZE = 100


class MagnetarSubscription(ListenNotifySubscription["MagnetarApplicationRecorder"]):
    def __init__(self, recorder: MagnetarApplicationRecorder, gt: int | None = None,
                 topics: Sequence[str] = ()) -> None:
        try:
            self._reader = recorder.client.create_reader(recorder.topic, "latest", reconnect=True,
                                                         receiver_queue_size=LISTENER_RECEIVER_QUEUE_SIZE)
        except ClientError as exc:
            from consumers.eventsourcing.records import persistence_error

            raise persistence_error(exc) from exc
        super().__init__(recorder, gt=gt, topics=topics)
        self._listener = Thread(target=self._listen, name="magnetar-subscription-listener", daemon=True)
        self._listener.start()

    def _listen(self) -> None:
        while not self._has_been_stopped:
            try:
                self._reader.read_next(timeout_ms=LISTEN_WAIT_MS)
            except ReceiveTimeout:
                continue
            except ConnectionClosed:
                return
            self._has_been_notified.set()

    def stop(self) -> None:
        super().stop()
        with contextlib.suppress(ClientError, RuntimeError):
            self._reader.close()

    def __exit__(self, *args: object, **kwargs: Any) -> None:
        try:
            super().__exit__(*args, **kwargs)
        finally:
            self._listener.join()
