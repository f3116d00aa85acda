"""Protobuf messages of Pulsar's wire format that Magnetar stores (see ``pulsar_entry.proto``).

``pulsar_entry_pb2`` is generated from ``pulsar_entry.proto`` and committed; never edit it by
hand. The regeneration command is in the header comment of the ``.proto`` file. Code outside
``broker/`` should not use these classes: ``broker.entry_format`` and ``broker.message_id``
are the typed front doors.
"""
