"""Clients of the broker that reach it only over the network: the Python client, the ``magnetar``
client commands, the Spark source and sink, and a launcher for a child ``magnetar standalone``."""
