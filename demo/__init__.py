"""The clickstream demo: a producer of click events, a Spark Structured Streaming job counting
clicks per page per event-time window, and a runner that ties them to a local broker.

``make demo`` runs ``demo/run_demo.py``; ``docker-compose.yml`` runs the same two commands as
long-lived services. The demo talks to the broker over the network only (the Python client and
the Spark source and sink in ``consumers/``), as any application would.
"""
