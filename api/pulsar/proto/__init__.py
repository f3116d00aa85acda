"""Protobuf messages of Pulsar's binary protocol that the front end speaks (``pulsar_api.proto``).

``pulsar_api_pb2`` is generated from ``pulsar_api.proto`` and committed; never edit it by hand.
The regeneration command is in the header comment of the ``.proto`` file. Only ``api/pulsar/``
uses these classes.
"""
