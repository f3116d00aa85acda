"""Schema compatibility as Pulsar's broker decides it: the strategies, and Java Avro's resolution rules.

Role: :func:`incompatibility` answers whether a new schema may follow a topic's versions under a
strategy; ``SchemaRegistry`` (``broker/schema_registry.py``) asks it before storing a version.
Pulsar's rules, per schema type:

- AVRO, and JSON whose definitions are Avro-shaped (the clients' JSON schemas are): Pulsar's
  ``AvroSchemaBasedCompatibilityCheck``, i.e. Avro's ``SchemaValidatorBuilder`` strategies:
  BACKWARD = the new schema can read data written with the old (``canReadStrategy``), FORWARD =
  the old can read the new's (``canBeReadStrategy``), FULL = both (``mutualReadStrategy``);
  ``_TRANSITIVE`` checks every version, the others the latest only. ALWAYS_INCOMPATIBLE (and an
  unknown strategy) refuses every new definition.
- JSON whose definitions are not Avro (Pulsar's old Jackson JSON-schema format): the old format
  after Avro is accepted, Avro after the old format too, two old ones must carry the same ``id``.
- KEY_VALUE: Pulsar's ``KeyValueSchemaCompatibilityCheck``: the key and value schema types
  must stay, and each part is checked by its type's check (an Avro-shaped JSON part as Avro).
- Every other type (STRING, INT64, PROTOBUF, PROTOBUF_NATIVE, ...): Pulsar's default check,
  which refuses only under ALWAYS_INCOMPATIBLE. A version of another type than the new schema's is incompatible
  under every strategy but ALWAYS_COMPATIBLE.

"Can read" is Java Avro's ``ValidateMutualRead.canRead``: the resolving grammar of (writer, reader)
(``org.apache.avro.Resolver``) holds no error, which is not what Python's
``ReaderWriterCompatibilityChecker`` (Java's ``SchemaCompatibility``) answers:

- record names are not compared (Java's resolver skips the check), so a renamed record reads
  the old one; enum and fixed names are, by their short names;
- the reader's aliases rename the writer first (``Schema.applyAliases``): a named type's alias
  names the writer's type, a field's alias the writer's field, but only inside a writer record
  whose name (after aliasing) is the reader record's;
- a reader field the writer lacks needs a default, and that default must be a value of its type;
- an enum symbol the reader lacks is not an error (Avro reports it when such data is decoded,
  or substitutes the reader's enum default);
- promotions int → long → float → double, int → float/double, long → double, string ↔ bytes;
- a writer union must resolve in every branch (unless both unions are the same); a reader union
  takes the writer's type by Avro's ``firstMatchingBranch`` (same full name, else a record of the
  same structure, else a promotion), and one without a match is an error.

Invariants: pure functions of the definitions (no state, no I/O); an answer is a reason string
(incompatible) or None; recursion through recursive schemas ends (each (writer, reader) pair of
records is visited once).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import avro.errors
import avro.schema

from broker.errors import InvalidRequest

ALWAYS_COMPATIBLE = "ALWAYS_COMPATIBLE"
ALWAYS_INCOMPATIBLE = "ALWAYS_INCOMPATIBLE"
UNDEFINED = "UNDEFINED"
STRATEGIES = (UNDEFINED, ALWAYS_INCOMPATIBLE, ALWAYS_COMPATIBLE, "BACKWARD", "FORWARD", "FULL",
              "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")
"""Pulsar's ``SchemaCompatibilityStrategy`` values; UNDEFINED: not set at this level."""
DIRECTIONS = ("BACKWARD", "FORWARD", "FULL")
PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
NAMED = ("record", "enum", "fixed")
PROMOTIONS = {"int": ("long", "float", "double"), "long": ("float", "double"), "float": ("double",),
              "string": ("bytes",), "bytes": ("string",)}
"""Writer type → the reader types Avro promotes it to (also how a reader union's branch may take it)."""


Node = Any
"""An ``avro.schema.Schema``: its kind's subclass (fields, items, symbols, ...) is read by kind."""


@dataclass(frozen=True)
class Definition:
    """One schema version: its type, definition bytes and properties (as stored)."""

    type: str
    data: bytes
    properties: Mapping[str, str] = field(default_factory=dict)


def checked_strategy(value: Any) -> str | None:
    """A strategy policy's stored form (None: not set, the next level's applies); ``InvalidRequest`` otherwise."""
    if value is None:
        return None
    if not isinstance(value, str) or value.upper() not in STRATEGIES:
        raise InvalidRequest(f"unknown schema compatibility strategy {value!r}: use one of {', '.join(STRATEGIES)}")
    return value.upper()


def parse_avro(data: bytes) -> Node:
    """The Avro schema of ``data``; ``ValueError`` when it is not one."""
    try:
        return avro.schema.parse(data.decode())
    except (avro.errors.AvroException, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None


def incompatibility(versions: Sequence[Definition], new: Definition, strategy: str) -> str | None:
    """Why ``new`` may not follow ``versions`` (oldest first, not empty) under ``strategy``; None if it may."""
    if strategy == ALWAYS_COMPATIBLE:
        return None
    transitive = strategy.endswith("_TRANSITIVE")
    against = list(versions) if transitive else list(versions[-1:])
    for old in against:
        if old.type != new.type:
            return f"the topic's schema type is {old.type}, the new one's {new.type}"
    if not transitive and against[0].data == new.data:
        return None
    if new.type == "JSON" and not transitive:
        return _json_check(against[0], new, strategy)
    if new.type == "KEY_VALUE":
        return _key_value_check(against, new, strategy)
    return _by_type(against, new, strategy)


def _by_type(against: Sequence[Definition], new: Definition, strategy: str) -> str | None:
    """Pulsar's checker of ``new``'s type over every version given (Avro's for AVRO and JSON, else the default)."""
    if new.type in ("AVRO", "JSON"):
        return _avro_check(against, new, strategy)
    return f"no new {new.type} definition is accepted ({strategy})" if strategy == ALWAYS_INCOMPATIBLE else None


def _key_value_check(against: Sequence[Definition], new: Definition, strategy: str) -> str | None:
    """Pulsar's ``KeyValueSchemaCompatibilityCheck``: the key and value schemas, each by its own type's check."""
    try:
        key, value = key_value_parts(new)
        olds = [key_value_parts(old) for old in against]
    except ValueError as exc:
        return f"not a KEY_VALUE schema: {exc}"
    for old_key, old_value in olds:
        if (old_key.type, old_value.type) != (key.type, value.type):
            return (f"key and value schema types {old_key.type}/{old_value.type} and {key.type}/{value.type} "
                    "differ")
    for part, olds_part, fresh in (("key", [k for k, _ in olds], key), ("value", [v for _, v in olds], value)):
        problem = _by_type(olds_part, fresh, strategy)
        if problem is not None:
            return f"{part} schema: {problem}"
    return None


def key_value_parts(schema: Definition) -> tuple[Definition, Definition]:
    """The key and value schemas of a KEY_VALUE schema (Pulsar's ``KeyValueSchemaInfo`` encoding:
    a big-endian 32-bit length and the bytes, for the key then the value; their types in the
    ``key.schema.type`` / ``value.schema.type`` properties, BYTES when absent)."""
    data, parts = schema.data, []
    for side in ("key", "value"):
        if len(data) < 4:
            raise ValueError(f"the {side} schema's length is missing")
        size, data = int.from_bytes(data[:4], "big", signed=True), data[4:]
        size = 0 if size == -1 else size  # Pulsar's encoding of an absent part
        if not 0 <= size <= len(data):
            raise ValueError(f"the {side} schema's length {size} is not within the definition")
        kind = schema.properties.get(f"{side}.schema.type", "BYTES").upper()
        parts.append(Definition(kind, data[:size], _sub_properties(schema.properties.get(f"{side}.schema.properties"))))
        data = data[size:]
    return parts[0], parts[1]


def _sub_properties(raw: str | None) -> dict[str, str]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _json_check(old: Definition, new: Definition, strategy: str) -> str | None:
    """Pulsar's ``JsonSchemaCompatibilityCheck``: Avro rules between Avro-shaped definitions."""
    old_avro, new_avro = _is_avro(old.data), _is_avro(new.data)
    if old_avro and new_avro:
        return _avro_check([old], new, strategy)
    old_legacy, new_legacy = legacy_json(old.data), legacy_json(new.data)
    if (old_avro and new_legacy is not None) or (old_legacy is not None and new_avro):
        return None
    if old_legacy is not None and new_legacy is not None:
        return None if old_legacy.get("id") == new_legacy.get("id") else "the JSON schemas' ids differ"
    if not old_avro and old_legacy is None:
        return None  # a stored definition of no known format: Pulsar lets the new one replace it
    return "unknown JSON schema format"


def _is_avro(data: bytes) -> bool:
    try:
        parse_avro(data)
    except ValueError:
        return False
    return True


def is_legacy_json(data: bytes) -> bool:
    """Whether ``data`` is Pulsar's old JSON-schema format (a JSON object with a ``type``)."""
    return legacy_json(data) is not None


def legacy_json(data: bytes) -> dict[str, Any] | None:
    """An old-format (JSON Schema) definition: a JSON object with a ``type``; None otherwise."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("type"), str) else None


def _avro_check(against: Sequence[Definition], new: Definition, strategy: str) -> str | None:
    direction = strategy.removesuffix("_TRANSITIVE")
    if direction not in DIRECTIONS:
        return f"no new {new.type} definition is accepted ({strategy})"
    try:
        fresh = parse_avro(new.data)
        olds = [parse_avro(old.data) for old in against]
    except ValueError as exc:
        return f"not an Avro schema: {exc}"
    for old in reversed(olds):  # the latest first, as Pulsar's validators walk them
        pairs = {"BACKWARD": [(old, fresh)], "FORWARD": [(fresh, old)],
                 "FULL": [(old, fresh), (fresh, old)]}[direction]
        for writer, reader in pairs:
            problem = read_error(writer, reader)
            if problem is not None:
                return problem
    return None


def read_error(writer: Node, reader: Node) -> str | None:
    """Why data written with ``writer`` cannot be read with ``reader`` (Java Avro's resolution); None if it can."""
    return _Resolution(_Aliases.of(reader)).error(writer, reader)


@dataclass
class _Aliases:
    """The reader's aliases: writer type full name → reader's, and per reader record, writer field → reader field."""

    names: dict[str, str] = field(default_factory=dict)
    fields: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, reader: Node) -> _Aliases:
        found = cls()
        found._collect(reader, set())
        return found

    def _collect(self, schema: Node, seen: set[int]) -> None:
        kind = _kind(schema)
        if kind in NAMED:
            for alias in schema.props.get("aliases") or []:
                self.names[_full(str(alias), schema.namespace)] = schema.fullname
        if kind == "record":
            if id(schema) in seen:
                return
            seen.add(id(schema))
            for f in schema.fields:
                for alias in f.props.get("aliases") or []:
                    self.fields.setdefault(schema.fullname, {})[str(alias)] = f.name
                self._collect(f.type, seen)
        for child in _children(schema):
            self._collect(child, seen)

    def name(self, writer: Node) -> str:
        """The writer's named type's full name once the reader's aliases applied."""
        return self.names.get(str(writer.fullname), str(writer.fullname))

    def field_names(self, writer: Node) -> list[str]:
        renames = self.fields.get(self.name(writer), {})
        return [renames.get(f.name, f.name) for f in writer.fields]


class _Resolution:
    """One walk of (writer, reader) as ``org.apache.avro.Resolver`` builds its actions."""

    def __init__(self, aliases: _Aliases) -> None:
        self._aliases = aliases
        self._records: set[tuple[int, int]] = set()
        self._matching: set[tuple[int, int]] = set()

    def error(self, w: Node, r: Node) -> str | None:
        wk, rk = _kind(w), _kind(r)
        if wk == "union":
            return self._writer_union(w, r)
        if wk == rk:
            return self._same_kind(w, r, wk)
        if rk == "union":
            return self._reader_union(w, r)
        return None if rk in PROMOTIONS.get(wk, ()) else _found(w, r, self._aliases)

    def _same_kind(self, w: Node, r: Node, kind: str) -> str | None:
        if kind in PRIMITIVES:
            return None
        if kind == "array":
            return self.error(w.items, r.items)
        if kind == "map":
            return self.error(w.values, r.values)
        if kind == "record":
            return self._record(w, r)
        return _found(w, r, self._aliases) if self._immediate(w, r) else None  # enum, fixed: names, sizes

    def _record(self, w: Node, r: Node) -> str | None:
        pair = (id(w), id(r))
        if pair in self._records:
            return None  # being (or already) resolved: its errors are reported where it was first met
        self._records.add(pair)
        missing = _missing_field(w, r, self._aliases)
        if missing is not None:
            return f"{_found(w, r, self._aliases)}, missing required field {missing}"
        readers = {f.name: f for f in r.fields}
        for name, wf in zip(self._aliases.field_names(w), w.fields, strict=True):
            rf = readers.get(name)
            problem = None if rf is None else self.error(wf.type, rf.type)
            if problem is not None:
                return f"field {r.fullname}.{name}: {problem}"
        return _bad_default(w, r, self._aliases)

    def _writer_union(self, w: Node, r: Node) -> str | None:
        if _union_equivalent(w, r, self._aliases, set()):
            return None
        for branch in w.schemas:
            problem = self.error(branch, r)
            if problem is not None:
                return problem
        return None

    def _reader_union(self, w: Node, r: Node) -> str | None:
        index = self._first_matching_branch(w, r)
        if index < 0:
            return _found(w, r, self._aliases)
        return self.error(w, r.schemas[index])

    def _first_matching_branch(self, w: Node, r: Node) -> int:
        kind, structure = _kind(w), -1
        for index, branch in enumerate(r.schemas):
            if _kind(branch) != kind:
                continue
            if kind not in NAMED:
                return index
            if self._aliases.name(w) == branch.fullname:
                return index
            if kind == "record" and not self._match_error(w, branch) \
                    and (structure < 0 or _short(self._aliases.name(w)) == branch.name):
                structure = index
        if structure >= 0:
            return structure
        for index, branch in enumerate(r.schemas):
            if _kind(branch) in PROMOTIONS.get(kind, ()):
                return index
        return -1

    def _match_error(self, w: Node, r: Node) -> bool:
        """Avro's ``hasMatchError``: the records' own resolution, or one of their fields', is an error."""
        pair = (id(w), id(r))
        if pair in self._matching:
            return False
        self._matching.add(pair)
        if _missing_field(w, r, self._aliases) is not None:
            return True
        readers = {f.name: f for f in r.fields}
        return any(name in readers and self._immediate(wf.type, readers[name].type)
                   for name, wf in zip(self._aliases.field_names(w), w.fields, strict=True))

    def _immediate(self, w: Node, r: Node) -> bool:
        """Whether resolving (w, r) is at once an error action (not one found deeper inside it)."""
        wk, rk = _kind(w), _kind(r)
        if wk == "union":
            return False
        if wk == rk:
            if wk == "fixed":
                return _short(self._aliases.name(w)) != str(r.name) or int(w.size) != int(r.size)
            if wk == "enum":
                return _short(self._aliases.name(w)) != str(r.name)
            return wk == "record" and _missing_field(w, r, self._aliases) is not None
        if rk == "union":
            return self._first_matching_branch(w, r) < 0
        return rk not in PROMOTIONS.get(wk, ())


def _missing_field(w: Node, r: Node, aliases: _Aliases) -> str | None:
    """A reader field without a default that the (aliased) writer record lacks."""
    written = set(aliases.field_names(w))
    for rf in r.fields:
        if rf.name not in written and not rf.has_default:
            return str(rf.name)
    return None


def _bad_default(w: Node, r: Node, aliases: _Aliases) -> str | None:
    """A default the reader must fill in that is no value of its field's type (Avro cannot encode it)."""
    written = set(aliases.field_names(w))
    for rf in r.fields:
        if rf.name not in written and not _valid_default(rf.type, rf.default):
            return f"field {r.fullname}.{rf.name}'s default {json.dumps(rf.default)} is not a {_kind(rf.type)}"
    return None


def _valid_default(schema: Node, value: Any) -> bool:
    """Whether Avro's ``ResolvingGrammarGenerator.encode`` can write ``value`` as ``schema``
    (a union's default is its first branch's)."""
    kind = _kind(schema)
    checks: dict[str, Any] = {
        "null": lambda: value is None,
        "boolean": lambda: isinstance(value, bool),
        "int": lambda: _number(value), "long": lambda: _number(value),
        "float": lambda: _number(value), "double": lambda: _number(value),
        "string": lambda: isinstance(value, str), "bytes": lambda: isinstance(value, str),
        "fixed": lambda: isinstance(value, str),
        "enum": lambda: value in schema.symbols,
        "array": lambda: isinstance(value, list) and all(_valid_default(schema.items, v) for v in value),
        "map": lambda: isinstance(value, dict) and all(_valid_default(schema.values, v) for v in value.values()),
        "union": lambda: _valid_default(schema.schemas[0], value),
        "record": lambda: isinstance(value, dict) and all(
            _valid_default(f.type, value[f.name]) if f.name in value else f.has_default for f in schema.fields),
    }
    return bool(checks[kind]())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _union_equivalent(w: Node, r: Node, aliases: _Aliases,
                      seen: set[tuple[int, int]]) -> bool:
    """Avro's ``unionEquiv``: the same shape branch by branch (named types by short name)."""
    kind = _kind(w)
    if kind != _kind(r):
        return False
    if kind in NAMED and _short(aliases.name(w)) != r.name:
        return False
    if kind == "record":
        if (id(w), id(r)) in seen:
            return True
        seen.add((id(w), id(r)))
        return len(w.fields) == len(r.fields) and all(
            name == rf.name and _union_equivalent(wf.type, rf.type, aliases, seen)
            for name, wf, rf in zip(aliases.field_names(w), w.fields, r.fields, strict=True))
    if kind == "union":
        return len(w.schemas) == len(r.schemas) and all(
            _union_equivalent(a, b, aliases, seen) for a, b in zip(w.schemas, r.schemas, strict=True))
    if kind in ("array", "map"):
        child = "items" if kind == "array" else "values"
        return _union_equivalent(getattr(w, child), getattr(r, child), aliases, seen)
    if kind == "fixed":
        return bool(w.size == r.size)
    if kind == "enum":
        return list(w.symbols) == list(r.symbols)
    return True


def _kind(schema: Node) -> str:
    kind = str(schema.type)
    return "record" if kind in ("error", "request") else kind


def _children(schema: Node) -> list[Node]:
    kind = _kind(schema)
    if kind == "array":
        return [schema.items]
    if kind == "map":
        return [schema.values]
    return list(schema.schemas) if kind == "union" else []


def _full(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _short(full_name: str) -> str:
    return full_name.rsplit(".", 1)[-1]


def _found(w: Node, r: Node, aliases: _Aliases) -> str:
    """Avro's message for a writer type the reader cannot take (the writer named as aliased)."""
    written = aliases.name(w) if _kind(w) in NAMED else _kind(w)
    return f"found {written}, expecting {r.fullname if _kind(r) in NAMED else _kind(r)}"
