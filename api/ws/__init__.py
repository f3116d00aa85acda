"""Pulsar's WebSocket API v2: producer, consumer and reader sessions over JSON frames.

The package, one concept a module, from the socket inwards: ``server.py`` (the asyncio adapter:
connections handed over by the HTTP listener, handshakes admitted, sessions driven, keep-alive),
``protocol.py`` (the wire, sans I/O: websockets' own ``ServerProtocol`` behind a fast reader of
whole text frames), ``writer.py`` (the one route out: frames written once per turn of the loop,
bounded for a slow peer), ``routes.py`` (the route table: each path's parameters, authorization
and session, and their documentation), ``params.py`` (handshake query parameters),
``session.py`` (what a session is and sees), ``producer.py``, ``consumer.py``, ``reader.py`` and
``dcb.py`` (the sessions; the last, Magnetar's DCB store), ``frames.py`` (client frames in,
result and message frames out, Pulsar's codes). Every session speaks to the broker through its
face (``broker``) only, and knows no socket and no web framework.
"""

from api.ws.routes import router
from api.ws.server import WebSocketServer

__all__ = ["WebSocketServer", "router"]
