"""Schemas on the binary protocol: Pulsar's ``Schema`` messages over the broker's registry.

Role: a PRODUCER or SUBSCRIBE that declares a schema, GET_SCHEMA and GET_OR_CREATE_SCHEMA go
through the broker's ``SchemaRegistry`` (the same one the admin API's ``/admin/v2/schemas``
uses). As in Pulsar: a producer's new schema becomes the topic's next version when the
topic's compatibility strategy and auto-update policy allow it; a consumer's schema is registered
only on a topic that has none and otherwise must be compatible; a consumer without a schema
(bytes) is always admitted, a producer unless the namespace enforces schema validation and the
topic has a schema. Refusals are ``IncompatibleSchema``, which the session answers as Pulsar's
``IncompatibleSchema`` error.
"""

from __future__ import annotations

from api.pulsar.proto import pulsar_api_pb2 as pb
from broker import SCHEMA_TYPES, SchemaInfo, SchemaRegistry, TopicName, version_bytes, version_of


def schema_info(schema: pb.Schema) -> SchemaInfo | None:
    """The registry's value of a protocol schema; None for bytes (no schema)."""
    if schema.type == pb.Schema.Bytes or not 0 <= schema.type < len(SCHEMA_TYPES):
        return None
    return SchemaInfo(SCHEMA_TYPES[schema.type], bytes(schema.schema_data),
                      {kv.key: kv.value for kv in schema.properties}, schema.name)


def schema_message(info: SchemaInfo) -> pb.Schema:
    schema = pb.Schema(name=info.name, schema_data=info.data, type=SCHEMA_TYPES.index(info.type))  # type: ignore[arg-type]
    for key, value in sorted(info.properties.items()):
        schema.properties.add(key=key, value=value)
    return schema


class ProtocolSchemas:
    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry

    def for_producer(self, topic: TopicName, schema: pb.Schema | None) -> bytes | None:
        """The schema version a producer writes with (None without a schema)."""
        info = None if schema is None else schema_info(schema)
        if info is None:
            self._registry.admit_schemaless_producer(topic)
            return None
        return version_bytes(self._registry.admit(topic, info, producer=True))

    def for_consumer(self, topic: TopicName, schema: pb.Schema | None) -> None:
        info = None if schema is None else schema_info(schema)
        if info is not None:
            self._registry.admit(topic, info, register=not self._registry.versions(topic))

    def get(self, topic: TopicName, version: bytes | None) -> tuple[pb.Schema, bytes]:
        info, index = self._registry.get(topic, None if version is None else version_of(version))
        return schema_message(info), version_bytes(index)
