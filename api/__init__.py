"""The edge: HTTP, WebSocket, admin, metrics and the web console, each a translation of its
frames into calls on the broker's face (``broker/__init__.py``); ``magnetar standalone`` starts
here (``api/cli.py``)."""
