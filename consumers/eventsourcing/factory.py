"""The ``eventsourcing`` library's infrastructure factory for Magnetar.

Role: selected the library's way (``PERSISTENCE_MODULE=consumers.eventsourcing``), it reads the
application's environment (the library's ``Environment``: ``<APP>_NAME`` before ``NAME``) and
makes the recorders over one ``Client``:

- ``MAGNETAR_SERVICE_URL`` (default ``http://127.0.0.1:8080``; a comma-separated list for a
  cluster), ``MAGNETAR_AUTH_TOKEN`` (a JWT when authentication is on),
  ``MAGNETAR_HTTP_TIMEOUT_S`` (each call's bound);
- ``MAGNETAR_NAMESPACE`` (default ``public/default``): application ``Bank`` keeps its events in
  topic ``bank-events``, its snapshots in ``bank-snapshots``, a projection's tracking records in
  ``bank-tracking``; a process application keeps its tracking records in its events topic, so
  they are written with the events they track.

Invariant: recorders share the factory's client; ``close()`` closes it.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from eventsourcing.persistence import AggregateRecorder, ApplicationRecorder, InfrastructureFactory, ProcessRecorder
from eventsourcing.utils import Environment, EnvType, resolve_topic

from consumers.client import DEFAULT_SERVICE_URL, Client
from consumers.eventsourcing.recorders import (
    MagnetarAggregateRecorder,
    MagnetarApplicationRecorder,
    MagnetarProcessRecorder,
    MagnetarTrackingRecorder,
)

_TTracking = TypeVar("_TTracking", bound=MagnetarTrackingRecorder)
HTTP_TIMEOUT_S_DEFAULT = 30.0
SERVICE_URL = "MAGNETAR_SERVICE_URL"
AUTH_TOKEN = "MAGNETAR_AUTH_TOKEN"
HTTP_TIMEOUT_S = "MAGNETAR_HTTP_TIMEOUT_S"
NAMESPACE = "MAGNETAR_NAMESPACE"


def client_of(env: Environment) -> Client:
    """The client the environment asks for."""
    return Client(env.get(SERVICE_URL) or DEFAULT_SERVICE_URL, env.get(AUTH_TOKEN) or None,
                  http_timeout_s=float(env.get(HTTP_TIMEOUT_S) or HTTP_TIMEOUT_S_DEFAULT))


def topic_of(env: Environment, purpose: str) -> str:
    """The topic of the application's ``purpose`` (events, snapshots, tracking)."""
    namespace = env.get(NAMESPACE) or "public/default"
    return f"persistent://{namespace}/{env.name.lower() or 'eventsourcing'}-{purpose}"


class MagnetarFactory(InfrastructureFactory[MagnetarTrackingRecorder]):
    SERVICE_URL = SERVICE_URL
    AUTH_TOKEN = AUTH_TOKEN
    HTTP_TIMEOUT_S = HTTP_TIMEOUT_S
    NAMESPACE = NAMESPACE

    aggregate_recorder_class = MagnetarAggregateRecorder
    application_recorder_class = MagnetarApplicationRecorder
    tracking_recorder_class = MagnetarTrackingRecorder
    process_recorder_class = MagnetarProcessRecorder

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        self.client = client_of(self.env)

    def topic(self, purpose: str) -> str:
        return topic_of(self.env, purpose)

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        return type(self).aggregate_recorder_class(self.client, self.topic(purpose))

    def application_recorder(self) -> ApplicationRecorder:
        topic = self.env.get(self.APPLICATION_RECORDER_TOPIC)
        recorder_class = resolve_topic(topic) if topic else type(self).application_recorder_class
        assert issubclass(recorder_class, MagnetarApplicationRecorder)
        return recorder_class(self.client, self.topic("events"))

    def tracking_recorder(self, tracking_recorder_class: type[_TTracking] | None = None) -> _TTracking:
        if tracking_recorder_class is None:
            topic = self.env.get(self.TRACKING_RECORDER_TOPIC)
            chosen: type[Any] = resolve_topic(topic) if topic else type(self).tracking_recorder_class
        else:
            chosen = tracking_recorder_class
        assert issubclass(chosen, MagnetarTrackingRecorder)
        return cast("_TTracking", chosen(self.client, self.topic("tracking")))

    def process_recorder(self) -> ProcessRecorder:
        topic = self.env.get(self.PROCESS_RECORDER_TOPIC)
        recorder_class = resolve_topic(topic) if topic else type(self).process_recorder_class
        assert issubclass(recorder_class, MagnetarProcessRecorder)
        return recorder_class(self.client, self.topic("events"))

    def close(self) -> None:
        self.client.close()


Factory = MagnetarFactory
