"""Pulsar's WebSocket API v2: producer, consumer and reader sessions over JSON frames.

The package, one concept a module: ``routes.py`` (the handshakes and their documentation),
``params.py`` (handshake query parameters), ``frames.py`` (client frames in, result and message
frames out, Pulsar's codes), ``producer.py``, ``consumer.py`` and ``reader.py`` (the sessions),
``session.py`` (accepting, supervising and closing a session; the command loop), and
``protocol.py`` (uvicorn's WebSocket protocol tuned for a frame per message, and the sessions'
frame writer). Every session speaks to the broker through its face (``broker``) only.
"""

from api.ws.routes import router

__all__ = ["router"]
