"""Pulsar's binary protocol on :6650: the official Pulsar clients work unchanged.

The package, from the bytes up (sans-I/O below the adapter, as h11 and wsproto are built):

- ``proto/``: the ``.proto`` subset of Pulsar's commands with Pulsar's field numbers, generated
  module committed;
- ``framing.py``: size-prefixed ``BaseCommand`` frames and payloads, decoded from and encoded to
  plain bytes;
- ``commands.py``: every command the broker sends, and the one mapping of the broker's error
  hierarchy onto Pulsar's ``ServerError``;
- ``session.py``: one connection's state machine (handshake, authentication, version), and
  the dispatch of commands to ``producers.py`` (PRODUCER, SEND, access modes) and
  ``consumers.py`` (SUBSCRIBE, FLOW, MESSAGE, ACK, redelivery, seek);
- ``permissions.py``: what each command a client may send needs, checked before its handler
  runs, every time; ``shares.py``: a role's share of the connections and topic-list watches;
- ``lookups.py``: LOOKUP (Connect here, or Redirect to the owning broker of a cluster) and
  PARTITIONED_METADATA, over the broker's one lookup;
- ``schemas.py``: the schema commands over the broker's schema registry;
- ``topic_lists.py``: a namespace's topic list, filtered by pattern, and topic-list watches;
- ``server.py``: the asyncio adapter (listeners, TLS, bounds, keep-alive, statistics), with
  ``handshakes.py``: the budget and the timeout of connections not yet CONNECTED.

Everything reaches the broker through its face (``from broker import ...``), like the REST and
WebSocket edges: a binary session is one more translation of frames into the same producers,
consumers, dispatch, permits, redelivery, deduplication and authorization.
"""

from api.pulsar.server import PulsarServer, PulsarServerStats
from api.pulsar.settings import PulsarSettings

__all__ = ["PulsarServer", "PulsarServerStats", "PulsarSettings"]
