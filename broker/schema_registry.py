"""The schema registry: versions of each topic's schema and Pulsar's compatibility strategies.

Role: a producer or consumer that declares a schema (the binary protocol's PRODUCER and
SUBSCRIBE, the admin API's ``/admin/v2/schemas/...``) goes through :meth:`SchemaRegistry.admit`
(``BrokerService.schemas``, over the metadata store and the namespaces' policies):
a schema the topic already has answers its version; a new one is checked against the
namespace's ``schema_compatibility_strategy`` and, when compatible, stored as the next version.
Schemas belong to the topic, not its partitions (``persistent://t/ns/x-partition-2`` uses
``x``'s), and live in the metadata store at ``/schemas/{tenant}/{namespace}/{topic}``.

Compatibility follows Pulsar: ``ALWAYS_COMPATIBLE``, ``ALWAYS_INCOMPATIBLE``, ``BACKWARD``
(the new schema reads data written with the previous one), ``FORWARD`` (the previous reads the
new's), ``FULL`` (both; the default, as Pulsar's broker default), and their ``_TRANSITIVE``
forms, which check every earlier version instead of the last. AVRO and JSON schemas (Pulsar's
JSON schema carries an Avro definition) are compared with Apache Avro's reader/writer checker;
other types are compatible only with the same type and definition. A schema of another type
than the topic's is incompatible.

Invariants: versions are dense from 0 and never renumbered; a refused schema writes nothing
(``IncompatibleSchema``); a definition Avro cannot parse is ``InvalidRequest``. Writes are
compare-and-set on the stored value, so two brokers cannot both add a version.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import avro.compatibility
import avro.errors
import avro.schema

from broker.errors import BadVersion, IncompatibleSchema, InvalidRequest, NotFound
from broker.limits import SCHEMA_BYTES_MAX, SCHEMA_CAS_RETRIES_MAX
from broker.metadata.store import MetadataStore
from broker.topic_name import TopicName

SCHEMAS_ROOT = "/schemas"
POLICY_KEY = "schema_compatibility_strategy"
STRATEGIES = ("UNDEFINED", "ALWAYS_INCOMPATIBLE", "ALWAYS_COMPATIBLE", "BACKWARD", "FORWARD", "FULL",
              "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")
DEFAULT_STRATEGY = "FULL"
AVRO_TYPES = ("AVRO", "JSON")
TYPES = ("NONE", "STRING", "JSON", "PROTOBUF", "AVRO", "BOOLEAN", "INT8", "INT16", "INT32", "INT64", "FLOAT",
         "DOUBLE", "DATE", "TIME", "TIMESTAMP", "KEY_VALUE", "INSTANT", "LOCAL_DATE", "LOCAL_TIME",
         "LOCAL_DATE_TIME", "PROTOBUF_NATIVE", "AUTO_CONSUME")
"""Pulsar's schema types, indexed by their protocol number."""
VERSION = struct.Struct(">q")


@dataclass(frozen=True)
class SchemaInfo:
    """One version of a topic's schema, as Pulsar's ``SchemaInfo``."""

    type: str
    data: bytes
    properties: dict[str, str] = field(default_factory=dict)
    name: str = ""
    timestamp_ms: int = 0

    def same_definition(self, other: SchemaInfo) -> bool:
        return self.type == other.type and self.data == other.data

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "data": base64.b64encode(self.data).decode(), "properties": self.properties,
                "name": self.name, "timestamp": self.timestamp_ms}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> SchemaInfo:
        return cls(str(value["type"]), base64.b64decode(value["data"]), dict(value.get("properties") or {}),
                   str(value.get("name", "")), int(value.get("timestamp", 0)))


def version_bytes(version: int) -> bytes:
    """Pulsar's schema version on the wire: a big-endian 64-bit integer."""
    return VERSION.pack(version)


def version_of(data: bytes) -> int:
    if len(data) != VERSION.size:
        raise InvalidRequest(f"a schema version is {VERSION.size} bytes, not {len(data)}")
    return int(VERSION.unpack(data)[0])


class SchemaRegistry:
    def __init__(self, store: MetadataStore, policies: Callable[[str], dict[str, Any]],
                 clock: Callable[[], float] = time.time) -> None:
        """``policies(namespace)``: the namespace's policies (its compatibility strategy)."""
        self._store = store
        self._policies = policies
        self._clock = clock
        self._lock = threading.Lock()

    @staticmethod
    def _path(topic: TopicName) -> str:
        base = topic.base
        return f"{SCHEMAS_ROOT}/{base.tenant}/{base.namespace}/{base.local_name}"

    def versions(self, topic: TopicName) -> list[SchemaInfo]:
        found = self._store.get_json(self._path(topic))
        return [] if found is None else [SchemaInfo.from_json(v) for v in found[0]["versions"]]

    def get(self, topic: TopicName, version: int | None = None) -> tuple[SchemaInfo, int]:
        """The schema at ``version`` (default: the latest) and its version; ``NotFound`` if none."""
        versions = self.versions(topic)
        if not versions:
            raise NotFound(f"topic {topic.base} has no schema")
        index = len(versions) - 1 if version is None else version
        if not 0 <= index < len(versions):
            raise NotFound(f"topic {topic.base} has no schema version {version}")
        return versions[index], index

    def strategy(self, topic: TopicName) -> str:
        value = self._policies(topic.namespace_name).get(POLICY_KEY) or "UNDEFINED"
        return DEFAULT_STRATEGY if value == "UNDEFINED" else str(value)

    def admit(self, topic: TopicName, schema: SchemaInfo, *, register: bool = True) -> int:
        """The version of ``schema`` on ``topic``: an existing one with the same definition, or a
        new version when the strategy allows it (``register=False`` only checks: a consumer on a
        topic that has a schema). ``IncompatibleSchema`` when refused."""
        self._check(schema)
        for _ in range(SCHEMA_CAS_RETRIES_MAX):
            found = self._store.get_json(self._path(topic))
            versions = [] if found is None else [SchemaInfo.from_json(v) for v in found[0]["versions"]]
            for index, existing in enumerate(versions):
                if existing.same_definition(schema):
                    return index
            self.check_compatible(topic, schema, versions)
            if not register:
                return len(versions) - 1
            stored = SchemaInfo(schema.type, schema.data, schema.properties, schema.name,
                                int(self._clock() * 1000))
            value = {"versions": [v.to_json() for v in [*versions, stored]]}
            try:
                self._store.put_json(self._path(topic), value, -1 if found is None else found[1])
            except BadVersion:
                continue  # another writer added a version meanwhile: check against it too
            return len(versions)
        raise IncompatibleSchema(f"the schema of {topic.base} kept changing while a version was added; retry")

    def check_compatible(self, topic: TopicName, schema: SchemaInfo, versions: list[SchemaInfo] | None = None) -> None:
        """``IncompatibleSchema`` unless ``schema`` may follow the topic's versions."""
        versions = self.versions(topic) if versions is None else versions
        if not versions:
            return
        strategy = self.strategy(topic)
        if strategy == "ALWAYS_COMPATIBLE":
            return
        if strategy == "ALWAYS_INCOMPATIBLE":
            raise IncompatibleSchema(f"{topic.base} accepts no new schema (ALWAYS_INCOMPATIBLE)")
        against = versions if strategy.endswith("_TRANSITIVE") else versions[-1:]
        direction = strategy.removesuffix("_TRANSITIVE")
        for existing in against:
            problem = _incompatibility(existing, schema, direction)
            if problem is not None:
                raise IncompatibleSchema(f"schema is incompatible with {topic.base}'s ({strategy}): {problem}")

    def delete(self, topic: TopicName) -> None:
        with self._lock:
            if self._store.get(self._path(topic)) is None:
                raise NotFound(f"topic {topic.base} has no schema")
            self._store.delete(self._path(topic))

    @staticmethod
    def _check(schema: SchemaInfo) -> None:
        if schema.type not in TYPES:
            raise InvalidRequest(f"unknown schema type {schema.type!r}")
        if len(schema.data) > SCHEMA_BYTES_MAX:
            raise InvalidRequest(f"schema definition of {len(schema.data)} bytes exceeds {SCHEMA_BYTES_MAX}")
        if schema.type in AVRO_TYPES:
            _parse(schema)


def _parse(schema: SchemaInfo) -> avro.schema.Schema:
    try:
        return avro.schema.parse(schema.data.decode())
    except (avro.errors.AvroException, ValueError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{schema.type} schema definition is not a valid Avro schema: {exc}") from None


def _incompatibility(existing: SchemaInfo, new: SchemaInfo, direction: str) -> str | None:
    """Why ``new`` may not follow ``existing`` in ``direction`` (BACKWARD, FORWARD, FULL)."""
    if existing.type != new.type:
        return f"type {new.type} after {existing.type}"
    if existing.type not in AVRO_TYPES:
        return None if existing.data == new.data else f"a different {new.type} definition"
    old, fresh = _parse(existing), _parse(new)
    checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    pairs = {"BACKWARD": [(fresh, old)], "FORWARD": [(old, fresh)], "FULL": [(fresh, old), (old, fresh)]}[direction]
    for reader, writer in pairs:
        result = checker.get_compatibility(reader, writer)
        if result.compatibility is not avro.compatibility.SchemaCompatibilityType.compatible:
            return "; ".join(str(m) for m in result.messages) or "readers cannot read writers' data"
    return None
