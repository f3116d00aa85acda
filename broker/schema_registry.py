"""The schema registry: versions of each topic's schema, admitted by Pulsar's compatibility strategies.

Role: a producer or consumer that declares a schema (the binary protocol's PRODUCER and
SUBSCRIBE, the admin API's ``/admin/v2/schemas/...``) goes through :meth:`SchemaRegistry.admit`
(``BrokerService.schemas``, over the metadata store and the topic's and namespaces' policies):
a schema the topic already has answers its version; a new one is checked
(``broker/schema_compatibility.py``, Pulsar's rules) and, when compatible, stored as the next
version. Schemas belong to the topic, not its partitions (``persistent://t/ns/x-partition-2``
uses ``x``'s), and live in the metadata store at ``/schemas/{tenant}/{namespace}/{topic}``.

The strategy a topic lives by is Pulsar's: its own ``schemaCompatibilityStrategy`` topic policy,
else its namespace's ``schema_compatibility_strategy`` unless UNDEFINED, else the broker's
``schemaCompatibilityStrategy`` setting (FULL by default). "Already has" is Pulsar's too: for
AVRO, JSON and PROTOBUF the same parsed Avro schema (whitespace and key order aside), for the
other types the same bytes. A consumer's schema is checked as Pulsar's
``checkConsumerCompatibility`` does: under BACKWARD, FORWARD, FORWARD_TRANSITIVE and FULL it must
read the latest version (BACKWARD), under the other strategies it is checked by the strategy
against every version.

Two more of Pulsar's namespace policies shape admission: with ``is_allow_auto_update_schema`` off
(else the broker's ``isAllowAutoUpdateSchemaEnabled``) a producer is admitted only with a schema
the topic already has (an upload still adds versions), and with ``schema_validation_enforced`` on
(or the broker's ``isSchemaValidationEnforced``) a producer without a schema is refused on a topic
that has one.

Invariants: versions are dense from 0 and never renumbered; a refused schema writes nothing
(``IncompatibleSchema``); an AVRO definition Avro cannot parse, or a JSON one that is neither Avro
nor Pulsar's old JSON-schema format, is ``InvalidRequest``. Writes are
compare-and-set on the stored value, so two brokers cannot both add a version.
"""

from __future__ import annotations

import base64
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.errors import BadVersion, IncompatibleSchema, InvalidRequest, NotFound
from broker.limits import SCHEMA_BYTES_MAX, SCHEMA_CAS_RETRIES_MAX
from broker.metadata.store import MetadataStore
from broker.schema_compatibility import (
    ALWAYS_COMPATIBLE,
    UNDEFINED,
    Definition,
    incompatibility,
    is_legacy_json,
    parse_avro,
)
from broker.topic_name import TopicName

SCHEMAS_ROOT = "/schemas"
POLICY_KEY = "schema_compatibility_strategy"
"""The namespace policy (Pulsar's ``Policies.schema_compatibility_strategy``)."""
TOPIC_POLICY_KEY = "schemaCompatibilityStrategy"
"""The topic policy (Pulsar's ``TopicPolicies.schemaCompatibilityStrategy``)."""
DEFAULT_STRATEGY = "FULL"
"""Pulsar's broker default (``schemaCompatibilityStrategy``)."""
AUTO_UPDATE_KEY = "is_allow_auto_update_schema"
ENFORCED_KEY = "schema_validation_enforced"
CONSUMER_CHECKS_LATEST = ("BACKWARD", "FORWARD", "FORWARD_TRANSITIVE", "FULL")
"""Strategies under which a consumer's schema need only read the latest version."""
PARSED_TYPES = ("AVRO", "JSON", "PROTOBUF")
"""Types whose definitions Pulsar compares as parsed Avro schemas."""
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
        """Pulsar's "this version already exists": same type, and the same parsed Avro schema or bytes."""
        if self.type != other.type:
            return False
        if self.data == other.data or self.type not in PARSED_TYPES:
            return self.data == other.data
        try:
            return bool(parse_avro(self.data) == parse_avro(other.data))
        except ValueError:
            return False

    def definition(self) -> Definition:
        return Definition(self.type, self.data, self.properties)

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


@dataclass(frozen=True)
class SchemaDefaults:
    """The broker's schema settings, where neither topic nor namespace says otherwise."""

    strategy: str = DEFAULT_STRATEGY
    """``schemaCompatibilityStrategy``."""
    auto_update: bool = True
    """``isAllowAutoUpdateSchemaEnabled``: a producer's new schema may become the next version."""
    validation_enforced: bool = False
    """``isSchemaValidationEnforced``: producers without a schema are refused on topics that have one."""


class SchemaRegistry:
    def __init__(self, store: MetadataStore, policies: Callable[[str], dict[str, Any]],
                 clock: Callable[[], float] = time.time, *,
                 topic_policies: Callable[[TopicName], dict[str, Any]] = lambda _: {},
                 defaults: SchemaDefaults = SchemaDefaults()) -> None:
        """``policies(namespace)`` and ``topic_policies(topic)``: where the schema policies may be
        set; ``defaults``: the broker's, where neither sets one."""
        self._store = store
        self._policies = policies
        self._topic_policies = topic_policies
        self._defaults = defaults
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
        """The strategy the topic's new schemas are checked by: topic policy, namespace policy, broker setting."""
        for value in (self._topic_policies(topic).get(TOPIC_POLICY_KEY),
                      self._policies(topic.namespace_name).get(POLICY_KEY)):
            if value and value != UNDEFINED:
                return str(value)
        return self._defaults.strategy

    def auto_update(self, namespace: str) -> bool:
        """Whether producers may add versions in ``namespace`` (Pulsar's ``isAllowAutoUpdateSchema``)."""
        value = self._policies(namespace).get(AUTO_UPDATE_KEY)
        return self._defaults.auto_update if value is None else bool(value)

    def validation_enforced(self, namespace: str) -> bool:
        """Whether producers without a schema are refused on topics with one (``schemaValidationEnforced``)."""
        return self._defaults.validation_enforced or bool(self._policies(namespace).get(ENFORCED_KEY))

    def admit_schemaless_producer(self, topic: TopicName) -> None:
        """``IncompatibleSchema`` for a producer without a schema on a topic that has one, if enforced."""
        if self.validation_enforced(topic.namespace_name) and self.versions(topic):
            raise IncompatibleSchema("Producers cannot connect or send message without a schema to topics "
                                     f"with a schema: schemaValidationEnforced is on for {topic.base}")

    def admit(self, topic: TopicName, schema: SchemaInfo, *, register: bool = True, producer: bool = False) -> int:
        """The version of ``schema`` on ``topic``: an existing one with the same definition, or a
        new version when the strategy allows it (``register=False`` only checks: a consumer on a
        topic that has a schema; a ``producer`` adds none where auto update is off).
        ``IncompatibleSchema`` when refused."""
        self._check(schema)
        for _ in range(SCHEMA_CAS_RETRIES_MAX):
            found = self._store.get_json(self._path(topic))
            versions = [] if found is None else [SchemaInfo.from_json(v) for v in found[0]["versions"]]
            for index, existing in enumerate(versions):
                if existing.same_definition(schema):
                    return index
            if not register:
                self._check_consumer(topic, schema, versions)
                return len(versions) - 1
            if producer and not self.auto_update(topic.namespace_name):
                raise IncompatibleSchema(f"Schema not found and schema auto updating is disabled on {topic.base}")
            self.check_compatible(topic, schema, versions)
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
        self._refuse_unless(topic, schema, versions, self.strategy(topic))

    def _check_consumer(self, topic: TopicName, schema: SchemaInfo, versions: list[SchemaInfo]) -> None:
        """Pulsar's ``checkConsumerCompatibility``: the latest version read by BACKWARD, else the strategy on all."""
        strategy = self.strategy(topic)
        if strategy in CONSUMER_CHECKS_LATEST:
            self._refuse_unless(topic, schema, versions[-1:], "BACKWARD")
        elif strategy != ALWAYS_COMPATIBLE:
            self._refuse_unless(topic, schema, versions, strategy)

    @staticmethod
    def _refuse_unless(topic: TopicName, schema: SchemaInfo, versions: list[SchemaInfo], strategy: str) -> None:
        if not versions:
            return
        problem = incompatibility([v.definition() for v in versions], schema.definition(), strategy)
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
        if schema.type in ("AVRO", "JSON"):
            try:
                parse_avro(schema.data)
            except ValueError as exc:
                if schema.type == "AVRO" or not is_legacy_json(schema.data):
                    raise InvalidRequest(f"{schema.type} schema definition is not a valid Avro schema: {exc}") from None

