"""Schema compatibility, one table of (old, new, strategy) and the answer Pulsar's broker gives.

Each row's comment names the rule that decides it: Pulsar's ``AvroSchemaBasedCompatibilityCheck``
(BACKWARD = the new schema reads the old's data, FORWARD = the old reads the new's, FULL = both)
over Java Avro's resolution (``org.apache.avro.Resolver``, as ``ValidateMutualRead.canRead`` uses
it), Pulsar's ``JsonSchemaCompatibilityCheck`` and its default check for the other types. Rows
marked "Python differs" are answered otherwise by Python avro's ``ReaderWriterCompatibilityChecker``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.schema_compatibility import Definition, incompatibility


def record(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def f(name: str, kind: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, **extra}


def avro(schema: Any, kind: str = "AVRO") -> Definition:
    return Definition(kind, json.dumps(schema).encode())


EVENT = record("Event", f("name", "string"), f("count", "int"))
COLOR = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}
LIST = record("Node", f("value", "int"), f("next", ["null", "Node"], default=None))

ROWS: list[tuple[str, Any, Any, str, bool]] = [
    # (id, old, new, strategy, compatible)
    # A reader field the writer lacks needs a default; a writer field the reader lacks is skipped.
    ("add-field-with-default-full", EVENT, record("Event", *EVENT["fields"], f("note", "string", default="")),
     "FULL", True),
    ("add-required-field-backward", EVENT, record("Event", *EVENT["fields"], f("note", "string")), "BACKWARD", False),
    ("add-required-field-forward", EVENT, record("Event", *EVENT["fields"], f("note", "string")), "FORWARD", True),
    ("drop-required-field-backward", EVENT, record("Event", f("name", "string")), "BACKWARD", True),
    ("drop-required-field-forward", EVENT, record("Event", f("name", "string")), "FORWARD", False),
    ("drop-required-field-full", EVENT, record("Event", f("name", "string")), "FULL", False),
    # Resolver does not compare record names ("Current implementation doesn't do this check"). Python differs.
    ("rename-record-full", EVENT, record("Renamed", *EVENT["fields"]), "FULL", True),
    ("rename-record-and-namespace-full", EVENT, record("Renamed", *EVENT["fields"], namespace="org.x"),
     "FULL_TRANSITIVE", True),
    ("rename-record-backward", record("Renamed", *EVENT["fields"]), EVENT, "BACKWARD", True),
    ("rename-nested-record-full", record("O", f("inner", record("A", f("x", "int")))),
     record("O", f("inner", record("B", f("x", "int")))), "FULL", True),
    # A renamed record with other fields is judged by its fields alone.
    ("rename-record-and-add-required-field-backward", EVENT, record("Renamed", *EVENT["fields"], f("n", "int")),
     "BACKWARD", False),
    # A record alias is harmless either way.
    ("record-alias-full", EVENT, record("Renamed", *EVENT["fields"], aliases=["Event"]), "FULL", True),
    # A reader field's alias names the writer's field (Schema.applyAliases) ...
    ("field-alias-backward", EVENT, record("Event", f("title", "string", aliases=["name"]), f("count", "int")),
     "BACKWARD", True),
    # ... only one way: the old reader has no alias for the new writer's field.
    ("field-alias-forward", EVENT, record("Event", f("title", "string", aliases=["name"]), f("count", "int")),
     "FORWARD", False),
    # Field aliases are keyed by the reader record's name: a renamed writer record without a record alias misses them.
    ("field-alias-under-renamed-record", EVENT,
     record("Renamed", f("title", "string", aliases=["name"]), f("count", "int")), "BACKWARD", False),
    # With the record alias the writer is renamed first, then its fields.
    ("field-alias-under-aliased-record", EVENT,
     record("Renamed", f("title", "string", aliases=["name"]), f("count", "int"), aliases=["Event"]), "BACKWARD", True),
    # Promotions int -> long -> float -> double, string <-> bytes; never back.
    ("int-to-long-backward", EVENT, record("Event", f("name", "string"), f("count", "long")), "BACKWARD", True),
    ("int-to-long-forward", EVENT, record("Event", f("name", "string"), f("count", "long")), "FORWARD", False),
    ("int-to-double-backward", EVENT, record("Event", f("name", "string"), f("count", "double")), "BACKWARD", True),
    ("string-to-bytes-full", EVENT, record("Event", f("name", "bytes"), f("count", "int")), "FULL", True),
    ("string-to-int-backward", EVENT, record("Event", f("name", "int"), f("count", "int")), "BACKWARD", False),
    ("map-values-promoted-backward", record("M", f("m", {"type": "map", "values": "int"})),
     record("M", f("m", {"type": "map", "values": "long"})), "BACKWARD", True),
    # An enum symbol the reader lacks is a decode-time error only: Pulsar's check accepts it. Python differs.
    ("enum-symbol-added-full", record("P", f("c", COLOR)),
     record("P", f("c", {**COLOR, "symbols": ["RED", "GREEN", "BLUE"]})), "FULL", True),
    # Enum names are compared, by short name (AVRO-3133) ...
    ("enum-renamed-backward", record("P", f("c", COLOR)), record("P", f("c", {**COLOR, "name": "Colour"})),
     "BACKWARD", False),
    ("enum-namespace-changed-full", record("P", f("c", COLOR)), record("P", f("c", {**COLOR, "namespace": "org.x"})),
     "FULL", True),
    # ... unless the reader's alias names the writer's enum.
    ("enum-renamed-with-alias-backward", record("P", f("c", COLOR)),
     record("P", f("c", {**COLOR, "name": "Colour", "aliases": ["Color"]})), "BACKWARD", True),
    ("enum-renamed-with-alias-forward", record("P", f("c", COLOR)),
     record("P", f("c", {**COLOR, "name": "Colour", "aliases": ["Color"]})), "FORWARD", False),
    # Fixed: same short name and size.
    ("fixed-renamed", record("H", f("h", {"type": "fixed", "name": "Hash", "size": 16})),
     record("H", f("h", {"type": "fixed", "name": "Digest", "size": 16})), "FORWARD", False),
    ("fixed-renamed-with-alias-backward", record("H", f("h", {"type": "fixed", "name": "Hash", "size": 16})),
     record("H", f("h", {"type": "fixed", "name": "Digest", "size": 16, "aliases": ["Hash"]})), "BACKWARD", True),
    ("fixed-resized", record("H", f("h", {"type": "fixed", "name": "Hash", "size": 16})),
     record("H", f("h", {"type": "fixed", "name": "Hash", "size": 32})), "BACKWARD", False),
    # A reader union takes a writer's int; a writer union needs every branch readable (null is not an int).
    ("int-to-optional-backward", EVENT, record("Event", f("name", "string"), f("count", ["null", "int"])),
     "BACKWARD", True),
    ("int-to-optional-forward", EVENT, record("Event", f("name", "string"), f("count", ["null", "int"])),
     "FORWARD", False),
    # A reader union's record branch matches a renamed writer record of the same structure (firstMatchingBranch).
    ("record-into-union-by-structure", record("O", f("r", record("A", f("x", "int")))),
     record("O", f("r", ["null", record("B", f("x", "int"))], default=None)), "BACKWARD", True),
    # An enum in a reader union matches by full name only: a namespace change finds no branch.
    ("enum-into-union-other-namespace", record("P", f("c", COLOR)),
     record("P", f("c", ["null", {**COLOR, "namespace": "org.x"}], default=None)), "BACKWARD", False),
    ("record-into-union-no-match", record("O", f("r", record("A", f("x", "int")))),
     record("O", f("r", ["null", record("B", f("y", "int"))], default=None)), "BACKWARD", False),
    # Errors deep inside containers count.
    ("required-field-inside-array", record("O", f("items", {"type": "array", "items": record("I", f("a", "int"))})),
     record("O", f("items", {"type": "array", "items": record("I", f("a", "int"), f("b", "int"))})), "BACKWARD", False),
    # Recursive records resolve once per pair.
    ("recursive-add-field-with-default", LIST, record("Node", *LIST["fields"], f("tag", "string", default="")),
     "FULL", True),
    ("recursive-add-required-field", LIST, record("Node", *LIST["fields"], f("tag", "string")), "BACKWARD", False),
    # A default the reader must fill in has to be a value of its type (Avro's encode of the default).
    ("default-of-wrong-type", EVENT, record("Event", *EVENT["fields"], f("n", "int", default="zero")),
     "BACKWARD", False),
    # A union's default is its first branch's: ["null", "string"] with default "-" cannot be written
    # (what pulsar-client's String(required_default=True, default="-") declares).
    ("union-default-not-of-first-branch", EVENT,
     record("Event", *EVENT["fields"], f("note", ["null", "string"], default="-")), "BACKWARD", False),
    ("union-default-null", EVENT, record("Event", *EVENT["fields"], f("note", ["null", "string"], default=None)),
     "FULL", True),
    # ALWAYS_COMPATIBLE accepts anything of the same type; ALWAYS_INCOMPATIBLE refuses every new definition.
    ("always-compatible", EVENT, record("Event", f("name", "int")), "ALWAYS_COMPATIBLE", True),
    ("always-incompatible", EVENT, record("Event", *EVENT["fields"], f("n", "int", default=0)),
     "ALWAYS_INCOMPATIBLE", False),
]


@pytest.mark.parametrize(("old", "new", "strategy", "compatible"), [row[1:] for row in ROWS],
                         ids=[row[0] for row in ROWS])
def test_avro_pairs_answer_as_pulsar(old: Any, new: Any, strategy: str, compatible: bool) -> None:
    problem = incompatibility([avro(old)], avro(new), strategy)
    assert (problem is None) == compatible, problem


V1 = record("Event", f("a", "int"))
V2 = record("Event", f("a", "int"), f("b", "int", default=1))
V3 = record("Event", f("a", "int"), f("b", "int"))


def test_transitive_strategies_check_every_version_the_others_the_latest() -> None:
    # V3 reads V2's data (b is there) but not V1's (b missing, no default in V3).
    assert incompatibility([avro(V1), avro(V2)], avro(V3), "BACKWARD") is None
    problem = incompatibility([avro(V1), avro(V2)], avro(V3), "BACKWARD_TRANSITIVE")
    assert problem is not None and "missing required field b" in problem


def test_json_schemas_are_checked_as_avro() -> None:
    renamed = record("Renamed", *EVENT["fields"])
    assert incompatibility([avro(EVENT, "JSON")], avro(renamed, "JSON"), "FULL") is None
    narrowed = record("Event", f("name", "string"))
    assert incompatibility([avro(EVENT, "JSON")], avro(narrowed, "JSON"), "FULL") is not None


def test_old_format_json_schemas_compare_their_ids() -> None:
    legacy = Definition("JSON", b'{"type":"object","id":"urn:a","properties":{}}')
    other = Definition("JSON", b'{"type":"object","id":"urn:b","properties":{}}')
    assert incompatibility([legacy], other, "FULL") is not None
    assert incompatibility([avro(EVENT, "JSON")], legacy, "FULL") is None  # Pulsar keeps old-format producers


def test_other_types_refuse_only_under_always_incompatible_and_never_change_type() -> None:
    old, new = Definition("STRING", b""), Definition("STRING", b"utf8")
    assert incompatibility([old], new, "FULL") is None
    assert incompatibility([old], new, "ALWAYS_INCOMPATIBLE") is not None
    assert incompatibility([old], old, "ALWAYS_INCOMPATIBLE") is None  # the same definition is no new one
    problem = incompatibility([avro(EVENT)], Definition("STRING", b""), "BACKWARD_TRANSITIVE")
    assert problem is not None and "AVRO" in problem
    assert incompatibility([avro(EVENT)], Definition("STRING", b""), "ALWAYS_COMPATIBLE") is None


class _Registry:
    """A ``SchemaRegistry`` over an in-memory store, with policies a test sets."""

    def __init__(self, default: str = "FULL") -> None:
        from broker.metadata.memory import InMemoryMetadataStore
        from broker.schema_registry import SchemaDefaults, SchemaRegistry
        self.namespace: dict[str, Any] = {}
        self.topic: dict[str, Any] = {}
        self.registry = SchemaRegistry(InMemoryMetadataStore(), lambda _: self.namespace,
                                       topic_policies=lambda _: self.topic, defaults=SchemaDefaults(default))


def _info(schema: Any) -> Any:
    from broker.schema_registry import SchemaInfo
    return SchemaInfo("AVRO", json.dumps(schema).encode())


def test_the_strategy_is_the_topics_else_the_namespaces_else_the_brokers() -> None:
    from broker.topic_name import TopicName
    topic = TopicName.parse("persistent://public/default/t-partition-1")
    box = _Registry(default="BACKWARD")
    assert box.registry.strategy(topic) == "BACKWARD"
    box.namespace["schema_compatibility_strategy"] = "UNDEFINED"
    assert box.registry.strategy(topic) == "BACKWARD"
    box.namespace["schema_compatibility_strategy"] = "FORWARD"
    assert box.registry.strategy(topic) == "FORWARD"
    box.topic["schemaCompatibilityStrategy"] = "ALWAYS_COMPATIBLE"
    assert box.registry.strategy(topic) == "ALWAYS_COMPATIBLE"


def test_a_reformatted_definition_is_the_version_the_topic_has() -> None:
    from broker.topic_name import TopicName
    topic = TopicName.parse("persistent://public/default/t")
    box = _Registry()
    assert box.registry.admit(topic, _info(EVENT)) == 0
    from broker.schema_registry import SchemaInfo
    spaced = SchemaInfo("AVRO", json.dumps(EVENT, indent=2).encode())
    assert box.registry.admit(topic, spaced) == 0
    assert len(box.registry.versions(topic)) == 1


def test_a_consumer_must_read_the_latest_version_under_full() -> None:
    """Pulsar's checkConsumerCompatibility: under FULL a consumer's schema is checked BACKWARD
    against the latest version only, so a reader that drops a field is admitted."""
    from broker.errors import IncompatibleSchema
    from broker.topic_name import TopicName
    topic = TopicName.parse("persistent://public/default/t")
    box = _Registry()
    box.registry.admit(topic, _info(EVENT))
    narrowed = record("Event", f("name", "string"))
    assert box.registry.admit(topic, _info(narrowed), register=False) == 0
    widened = record("Event", *EVENT["fields"], f("note", "string"))
    with pytest.raises(IncompatibleSchema):
        box.registry.admit(topic, _info(widened), register=False)
    assert len(box.registry.versions(topic)) == 1


def _key_value(key: Definition, value: Definition) -> Definition:
    data = b"".join(len(part.data).to_bytes(4, "big") + part.data for part in (key, value))
    return Definition("KEY_VALUE", data, {"key.schema.type": key.type, "value.schema.type": value.type,
                                          "kv.encoding.type": "SEPARATED"})


def test_key_value_schemas_check_their_key_and_value_by_their_own_types() -> None:
    """Pulsar's KeyValueSchemaCompatibilityCheck: the part types stay, each part by its type's check."""
    key = Definition("STRING", b"")
    old = _key_value(key, avro(EVENT))
    widened = _key_value(key, avro(record("Event", *EVENT["fields"], f("note", "string", default=""))))
    narrowed = _key_value(key, avro(record("Event", f("name", "string"))))
    assert incompatibility([old], widened, "FULL") is None
    problem = incompatibility([old], narrowed, "FULL")
    assert problem is not None and problem.startswith("value schema")
    assert incompatibility([old], narrowed, "BACKWARD") is None
    with_count = avro(record("Event", *EVENT["fields"], f("n", "int", default=0)))
    rekeyed = _key_value(Definition("INT64", b""), with_count)  # other bytes: the same ones are the same schema
    assert incompatibility([old], rekeyed, "FULL") is not None
    assert incompatibility([old], _key_value(key, with_count), "FULL") is None
    assert incompatibility([old], Definition("KEY_VALUE", b"\x00\x00\x00\x09ab"), "FULL") is not None
