"""A persistence module of the ``eventsourcing`` library over Magnetar (installed with it).

Select it the library's way, with the broker's address in the application's environment::

    PERSISTENCE_MODULE=consumers.eventsourcing MAGNETAR_SERVICE_URL=http://127.0.0.1:8080

An application's events are the event streams of a topic (one stream per aggregate, its
originator id as the key, its originator version checked with the append), its notifications the
topic's messages in offset order (id = offset + 1). ``records.py`` says how a record becomes a
message, ``recorders.py`` what each recorder does, ``subscription.py`` how a subscription follows
the topic live, ``factory.py`` which environment variables configure it. Only the project's
client is used: the module talks to a broker over the network, never to its internals.
"""

from consumers.eventsourcing.factory import Factory
from consumers.eventsourcing.recorders import (
    MagnetarAggregateRecorder,
    MagnetarApplicationRecorder,
    MagnetarProcessRecorder,
    MagnetarTrackingRecorder,
)

__all__ = [
    "Factory",
    "MagnetarAggregateRecorder",
    "MagnetarApplicationRecorder",
    "MagnetarProcessRecorder",
    "MagnetarTrackingRecorder",
]
