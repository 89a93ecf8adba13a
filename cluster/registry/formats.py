"""Schema formats of the registry (sans-IO): parsing, the forms schemas are compared in,
and compatibility checks, for Avro, JSON Schema and Protobuf, as Confluent Schema Registry
defines them.

The registry (cluster/registry/state.py) uses only what this module exports:
`parse(...)` -> ParsedSchema, `check(level, new, previous)` -> messages, and the names
below. Interface first; the formats fill it in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import avro.errors
import avro.name
import avro.schema

AVRO, JSON, PROTOBUF = "AVRO", "JSON", "PROTOBUF"
SCHEMA_TYPES = (AVRO, JSON, PROTOBUF)
COMPATIBILITY_LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE",
                        "FULL", "FULL_TRANSITIVE", "NONE")


class InvalidSchema(ValueError):
    """A schema that does not parse (Confluent: HTTP 422, error code 42201); the message
    says why, as Confluent's does ("Invalid schema ...")."""


@dataclass(frozen=True)
class Reference:
    """A reference of a schema to another registered one (Confluent's `references` entry):
    `name` as the referring schema names it (an Avro full name, a .proto import path, a JSON
    Schema $ref URL), found under `subject` at `version`."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class ParsedSchema:
    """A parsed schema. `text` is what was registered (what GET answers); `canonical` is the
    form two schemas are compared in when a schema is looked up or registered again (same
    canonical + same type + same references = the same schema id); `parsed` is the format's
    own object, for checks and for readers."""

    schema_type: str
    text: str
    canonical: str
    references: tuple[Reference, ...] = ()
    parsed: Any = field(default=None, compare=False, repr=False)


def parse(schema_type: str, text: str, referenced: Mapping[str, str] | None = None, *,
          normalize: bool = False, references: Sequence[Reference] = ()) -> ParsedSchema:
    """Parse `text` as `schema_type` (AVRO, JSON or PROTOBUF; Confluent's default is AVRO).

    `referenced` maps each reference name (transitively: references of references too) to
    the referenced schema's text, already resolved by the registry. With `normalize`,
    `canonical` is Confluent's normalized form (`normalize=true` on register and lookup).
    Raises InvalidSchema with a message for anything that does not parse."""
    parser = _PARSERS.get(schema_type)
    if parser is None:
        raise InvalidSchema(f"Invalid schema type {schema_type!r}: expected one of "
                            f"{', '.join(SCHEMA_TYPES)}")
    canonical, parsed = parser(text, dict(referenced or {}), normalize)
    return ParsedSchema(schema_type, text, canonical, tuple(references), parsed)


def check(level: str, new: ParsedSchema, previous: Sequence[ParsedSchema]) -> list[str]:
    """Compatibility of `new` with a subject's `previous` live versions (oldest first) under
    `level` (one of COMPATIBILITY_LEVELS): BACKWARD = the new schema reads data written with
    the previous one, FORWARD = the previous reads the new one's data, FULL = both; the
    plain levels compare with the latest version only, the _TRANSITIVE ones with all; NONE
    checks nothing. Returns the reasons it is incompatible, Confluent's wording where it has
    one (its `verbose=true` messages); [] means compatible.

    Only the differences are returned: Confluent's answer also lists
    "{oldSchemaVersion: n}", "{oldSchema: '...'}" and "{compatibility: 'LEVEL'}", which the
    registry adds (it knows the versions)."""
    if level not in COMPATIBILITY_LEVELS:
        raise ValueError(f"unknown compatibility level {level!r}")
    if level == "NONE" or not previous:
        return []
    # Confluent checks the newest first and, transitively, stops at the first failing one.
    against = list(reversed(previous)) if level.endswith("_TRANSITIVE") else [previous[-1]]
    for old in against:
        messages: list[str] = []
        if level.startswith(("FORWARD", "FULL")):
            messages += _can_read(old, new, "old", "new")
        if level.startswith(("BACKWARD", "FULL")):
            messages += _can_read(new, old, "new", "old")
        if messages:
            return messages
    return []


def _can_read(reader: ParsedSchema, writer: ParsedSchema, reader_role: str,
              writer_role: str) -> list[str]:
    """Whether `reader` reads what `writer` wrote (Confluent: reader.isBackwardCompatible(
    writer)); the messages name the schemas by role ("new", "old")."""
    if reader.schema_type != writer.schema_type:
        return ["Incompatible because of different schema type"]
    checker = _CHECKERS[reader.schema_type]
    return [m.format(reader=reader_role, writer=writer_role)
            for m in checker(reader.parsed, writer.parsed)]


# --- Avro -------------------------------------------------------------------------------
#
# Parsing is Apache Avro's (the `avro` package: the same rules as the Java parser Confluent
# uses: names, duplicate fields, nested unions...) plus default values checked as Avro Java
# does on registration (its Python parser does not). Two string forms, as Confluent's
# AvroSchema: `canonical` is the schema re-serialized compactly in Avro Java's
# Schema.toString() order (whitespace, key order and namespace spelling do not matter,
# docs/aliases/custom properties do); normalized is Confluent's AvroSchemaUtils
# .toNormalizedString(): Parsing-Canonical-Form-like (full names, no "namespace", fixed key
# order) but keeping doc, aliases (sorted), defaults, order, logical types and custom
# properties (sorted). Referenced named types are written by name, not inlined, in both.

_AVRO_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
_AVRO_NAMED_RESERVED = {"type", "name", "namespace", "doc", "aliases", "fields", "symbols",
                        "size", "default"}
_AVRO_FIELD_RESERVED = {"type", "name", "doc", "default", "order", "aliases"}
_INT32, _INT64 = 2**31, 2**63
# The avro package's classes are typed loosely (props are `object`): its nodes are Any here.
_AvroNode = Any


@dataclass(frozen=True)
class AvroSchema:
    """A parsed Avro schema (ParsedSchema.parsed for AVRO): the Apache `avro` object, with
    the full names of the named types that came from references."""

    schema: avro.schema.Schema
    referenced_names: frozenset[str] = frozenset()


def _json_load(text: str, schema_type: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise InvalidSchema(f"Invalid {schema_type} schema: not valid JSON "
                            f"(line {getattr(e, 'lineno', '?')}, column {getattr(e, 'colno', '?')}: "
                            f"{getattr(e, 'msg', e)})") from None


def _parse_avro(text: str, referenced: dict[str, str], normalize: bool) -> tuple[str, AvroSchema]:
    names = avro.name.Names()
    # A reference may itself use another one: parse in the given order, retrying those that
    # name a type not defined yet until no progress is made.
    pending = list(referenced.items())
    while pending:
        failed: list[tuple[str, str, str]] = []
        for ref_name, ref_text in pending:
            snapshot = dict(names.names)
            try:
                _avro_parse_one(_json_load(ref_text, AVRO), names)
            except InvalidSchema as e:
                names.names = snapshot
                failed.append((ref_name, ref_text, str(e)))
        if len(failed) == len(pending):
            ref_name, _, why = failed[0]
            raise InvalidSchema(f"Invalid AVRO schema: reference {ref_name!r} does not parse: "
                                f"{why}")
        pending = [(n, t) for n, t, _ in failed]
    referenced_names = frozenset(names.names)
    schema = _avro_parse_one(_json_load(text, AVRO), names)
    parsed = AvroSchema(schema, referenced_names)
    if normalize:
        return _avro_normalized(parsed), parsed
    return _avro_canonical(parsed), parsed


def _avro_parse_one(data: Any, names: avro.name.Names) -> avro.schema.Schema:
    names.default_namespace = None
    try:
        schema = avro.schema.make_avsc_object(data, names)
    except (avro.errors.AvroException, TypeError, AttributeError, KeyError, ValueError) as e:
        raise InvalidSchema(f"Invalid AVRO schema: {e}") from None
    problem = _avro_invalid_default(schema, set())
    if problem:
        raise InvalidSchema(f"Invalid AVRO schema: {problem}")
    return schema


def _avro_invalid_default(schema: _AvroNode, seen: set[int]) -> str | None:
    """The first field or enum default that does not match its type (Avro Java checks
    them when Confluent registers a schema), or None."""
    if id(schema) in seen:
        return None
    seen.add(id(schema))
    if isinstance(schema, avro.schema.RecordSchema):
        for f in schema.fields:
            if f.has_default and not _avro_valid_value(f.type, f.default):
                return (f"Invalid default for field {f.name}: {json.dumps(f.default)} not a "
                        f"{_avro_type_name(f.type)}")
            problem = _avro_invalid_default(f.type, seen)
            if problem:
                return problem
    elif isinstance(schema, avro.schema.EnumSchema):
        default = schema.props.get("default")
        if default is not None and default not in schema.symbols:
            return f"The Enum Default: {default} is not in the enum symbol set: {schema.symbols}"
    elif isinstance(schema, avro.schema.ArraySchema):
        return _avro_invalid_default(schema.items, seen)
    elif isinstance(schema, avro.schema.MapSchema):
        return _avro_invalid_default(schema.values, seen)
    elif isinstance(schema, avro.schema.UnionSchema):
        for branch in schema.schemas:
            problem = _avro_invalid_default(branch, seen)
            if problem:
                return problem
    return None


def _avro_valid_value(schema: _AvroNode, value: Any) -> bool:
    """Avro's rule for default values (as Avro 1.12: a union's default may match any
    branch)."""
    t = schema.type
    if t == "null":
        return value is None
    if t == "boolean":
        return isinstance(value, bool)
    if t in ("int", "long"):
        bound = _INT32 if t == "int" else _INT64
        return isinstance(value, int) and not isinstance(value, bool) and -bound <= value < bound
    if t in ("float", "double"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if t in ("string", "bytes", "fixed"):
        return isinstance(value, str)
    if t == "enum":
        return isinstance(value, str) and value in schema.symbols
    if t == "array":
        return isinstance(value, list) and all(_avro_valid_value(schema.items, v) for v in value)
    if t == "map":
        return isinstance(value, dict) and all(_avro_valid_value(schema.values, v)
                                               for v in value.values())
    if t == "union":
        return any(_avro_valid_value(b, value) for b in schema.schemas)
    if t in ("record", "error"):
        return isinstance(value, dict) and all(
            _avro_valid_value(f.type, value[f.name]) if f.name in value else f.has_default
            for f in schema.fields)
    return False


def _avro_type_name(schema: _AvroNode) -> str:
    return schema.fullname if isinstance(schema, avro.schema.NamedSchema) else schema.type


def _avro_props(props: Mapping[str, Any], reserved: set[str]) -> dict[str, Any]:
    return {k: v for k, v in props.items() if k not in reserved}


def _compact(value: Any, sort_keys: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)


def _avro_canonical(parsed: AvroSchema) -> str:
    """The schema as Avro Java's Schema.toString(referencedSchemas, pretty=false) writes it,
    which is Confluent's AvroSchema.canonicalString()."""
    return _compact(_avro_to_json(parsed.schema, set(parsed.referenced_names), None))


def _avro_relative(fullname: str, namespace: str | None) -> str:
    space, _, short = fullname.rpartition(".")
    return short if (space or None) == namespace else fullname


def _avro_to_json(s: _AvroNode, known: set[str], namespace: str | None) -> Any:
    if isinstance(s, avro.schema.UnionSchema):
        return [_avro_to_json(b, known, namespace) for b in s.schemas]
    if isinstance(s, avro.schema.NamedSchema):
        if s.fullname in known:
            return _avro_relative(s.fullname, namespace)
        known.add(s.fullname)
        own_space = s.namespace or None
        out: dict[str, Any] = {"type": s.type, "name": s.name}
        if own_space != namespace:
            out["namespace"] = own_space or ""
        if s.props.get("doc") is not None:
            out["doc"] = s.props["doc"]
        if isinstance(s, avro.schema.RecordSchema):
            out["fields"] = [_avro_field_to_json(f, known, own_space) for f in s.fields]
        elif isinstance(s, avro.schema.EnumSchema):
            out["symbols"] = list(s.symbols)
        elif isinstance(s, avro.schema.FixedSchema):
            out["size"] = s.size
        out.update(_avro_props(s.props, _AVRO_NAMED_RESERVED))
        aliases: Any = s.props.get("aliases")
        if aliases:
            out["aliases"] = list(aliases)
        if isinstance(s, avro.schema.EnumSchema) and s.props.get("default") is not None:
            out["default"] = s.props["default"]
        return out
    if isinstance(s, avro.schema.ArraySchema):
        return {"type": "array", "items": _avro_to_json(s.items, known, namespace),
                **_avro_props(s.props, {"type", "items"})}
    if isinstance(s, avro.schema.MapSchema):
        return {"type": "map", "values": _avro_to_json(s.values, known, namespace),
                **_avro_props(s.props, {"type", "values"})}
    props = _avro_props(s.props, {"type"})
    return {"type": s.type, **props} if props else s.type


def _avro_field_to_json(f: _AvroNode, known: set[str], namespace: str | None) -> Any:
    out: dict[str, Any] = {"name": f.name, "type": _avro_to_json(f.type, known, namespace)}
    if f.doc is not None:
        out["doc"] = f.doc
    if f.has_default:
        out["default"] = f.default
    if f.order not in (None, "ascending"):
        out["order"] = f.order
    if f.props.get("aliases"):
        out["aliases"] = list(f.props["aliases"])
    out.update(_avro_props(f.props, _AVRO_FIELD_RESERVED))
    return out


def _avro_normalized(parsed: AvroSchema) -> str:
    """Confluent's normalized Avro form (AvroSchemaUtils.toNormalizedString)."""
    return _compact(_avro_to_normal(parsed.schema, set(parsed.referenced_names)))


def _avro_to_normal(s: _AvroNode, known: set[str]) -> Any:
    if isinstance(s, avro.schema.UnionSchema):
        return [_avro_to_normal(b, known) for b in s.schemas]
    if isinstance(s, avro.schema.NamedSchema):
        if s.fullname in known:
            return s.fullname
        known.add(s.fullname)
        out: dict[str, Any] = {"name": s.fullname, "type": s.type}
        if isinstance(s, avro.schema.EnumSchema):
            out["symbols"] = list(s.symbols)
        elif isinstance(s, avro.schema.FixedSchema):
            out["size"] = s.size
            out.update(_avro_logical(s.props))
        elif isinstance(s, avro.schema.RecordSchema):
            out["fields"] = [_avro_field_to_normal(f, known) for f in s.fields]
        if s.props.get("doc"):
            out["doc"] = s.props["doc"]
        aliases: Any = s.props.get("aliases")
        if aliases:
            out["aliases"] = sorted(_avro_aliases(aliases, s.namespace))
        if isinstance(s, avro.schema.EnumSchema) and s.props.get("default") is not None:
            out["default"] = s.props["default"]
        out.update(sorted(_avro_props(s.props, _AVRO_NAMED_RESERVED | _LOGICAL).items()))
        return out
    if isinstance(s, avro.schema.ArraySchema | avro.schema.MapSchema):
        key = "items" if isinstance(s, avro.schema.ArraySchema) else "values"
        inner = s.items if isinstance(s, avro.schema.ArraySchema) else s.values
        return {"type": s.type, key: _avro_to_normal(inner, known),
                **dict(sorted(_avro_props(s.props, {"type", key}).items()))}
    props = dict(sorted(_avro_props(s.props, {"type"} | _LOGICAL).items()))
    logical = _avro_logical(s.props)
    return {"type": s.type, **logical, **props} if (props or logical) else s.type


_LOGICAL = {"logicalType", "precision", "scale"}


def _avro_logical(props: Mapping[str, Any]) -> dict[str, Any]:
    if "logicalType" not in props:
        return {}
    out: dict[str, Any] = {"logicalType": props["logicalType"]}
    if props["logicalType"] == "decimal":
        out["precision"] = props.get("precision")
        if props.get("scale"):
            out["scale"] = props["scale"]
    return out


def _avro_aliases(aliases: Sequence[str], namespace: str | None) -> list[str]:
    return [a if "." in a or not namespace else f"{namespace}.{a}" for a in aliases]


def _avro_field_to_normal(f: _AvroNode, known: set[str]) -> Any:
    out: dict[str, Any] = {"name": f.name, "type": _avro_to_normal(f.type, known)}
    if f.order not in (None, "ascending"):
        out["order"] = f.order
    if f.doc is not None:
        out["doc"] = f.doc
    if f.props.get("aliases"):
        out["aliases"] = sorted(f.props["aliases"])
    if f.has_default:
        out["default"] = _sorted_json(f.default)
    out.update(sorted(_avro_props(f.props, _AVRO_FIELD_RESERVED).items()))
    return out


def _sorted_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_json(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_json(v) for v in value]
    return value


# Avro schema resolution (the spec's "Schema Resolution"), as Avro Java's
# SchemaCompatibility.checkReaderWriterCompatibility, which Confluent runs: every
# incompatibility found, with its location ("/fields/1/type") and Confluent's wording
# (io.confluent.kafka.schemaregistry.avro.Difference). "{reader}"/"{writer}" are filled in
# with "new"/"old" by check().

_AVRO_DESCRIPTIONS = {
    "FIXED_SIZE_MISMATCH": "The size of FIXED type field at path '{path}' in the {{reader}} "
                           "schema does not match with the {{writer}} schema",
    "TYPE_MISMATCH": "The type (path '{path}') of a field in the {{reader}} schema does not "
                     "match with the {{writer}} schema",
    "NAME_MISMATCH": "The name of the schema has changed (path '{path}')",
    "MISSING_ENUM_SYMBOLS": "The {{reader}} schema is missing enum symbols '{info}' at path "
                            "'{path}' in the {{writer}} schema",
    "MISSING_UNION_BRANCH": "The {{reader}} schema is missing a type inside a union field at "
                            "path '{path}' in the {{writer}} schema",
    "READER_FIELD_MISSING_DEFAULT_VALUE": "The field '{info}' at path '{path}' in the "
                                          "{{reader}} schema has no default value and is "
                                          "missing in the {{writer}} schema",
}
# What each reader type reads besides itself (the spec's promotions).
_AVRO_PROMOTIONS = {"long": {"int"}, "float": {"int", "long"}, "double": {"int", "long", "float"},
                    "string": {"bytes"}, "bytes": {"string"}}


@dataclass(frozen=True)
class AvroIncompatibility:
    """One incompatibility of an Avro reader/writer pair, as Avro Java's Incompatibility."""

    error_type: str
    location: str
    info: str

    def message(self) -> str:
        """Confluent's verbose form; "{reader}"/"{writer}" still to be filled in."""
        description = _AVRO_DESCRIPTIONS[self.error_type].format(path=self.location,
                                                                 info=self.info)
        info = self.info.replace("{", "{{").replace("}", "}}")
        return (f"{{{{errorType:'{self.error_type}', description:'{description}', "
                f"additionalInfo:'{info}'}}}}")


def _check_avro(reader: AvroSchema, writer: AvroSchema) -> list[str]:
    return [i.message() for i in avro_incompatibilities(reader.schema, writer.schema)]


def avro_incompatibilities(reader: avro.schema.Schema,
                           writer: avro.schema.Schema) -> list[AvroIncompatibility]:
    """Why data written with `writer` cannot be read with `reader` ([] if it can)."""
    return _AvroResolution().check(reader, writer, [])


class _AvroResolution:
    def __init__(self) -> None:
        # (reader, writer) pairs being or already compared: a recursive type meeting itself
        # again is taken as compatible, as Avro Java does.
        self.seen: dict[tuple[int, int], list[AvroIncompatibility]] = {}

    def check(self, reader: _AvroNode, writer: _AvroNode,
              location: list[str]) -> list[AvroIncompatibility]:
        key = (id(reader), id(writer))
        if key in self.seen:
            return self.seen[key]
        self.seen[key] = []
        found = self._check(reader, writer, location)
        self.seen[key] = found
        return found

    def _check(self, reader: _AvroNode, writer: _AvroNode,
               location: list[str]) -> list[AvroIncompatibility]:
        def incompatible(error_type: str, info: str,
                         where: list[str] = location) -> list[AvroIncompatibility]:
            return [AvroIncompatibility(error_type, "/" + "/".join(where), info)]

        def mismatch() -> list[AvroIncompatibility]:
            return incompatible("TYPE_MISMATCH", f"reader type: {_avro_kind(reader)} not "
                                f"compatible with writer type: {_avro_kind(writer)}")

        r, w = _avro_kind(reader), _avro_kind(writer)
        if r == w:
            if r == "ARRAY":
                return self.check(reader.items, writer.items, location + ["items"])
            if r == "MAP":
                return self.check(reader.values, writer.values, location + ["values"])
            if r == "FIXED":
                found = self._names(reader, writer, location)
                if reader.size != writer.size:
                    found += incompatible("FIXED_SIZE_MISMATCH", f"expected: {writer.size}, "
                                          f"found: {reader.size}", location + ["size"])
                return found
            if r == "ENUM":
                found = self._names(reader, writer, location)
                missing = sorted(set(writer.symbols) - set(reader.symbols))
                default = reader.props.get("default")
                if missing and not (default is not None and default in reader.symbols):
                    found += incompatible("MISSING_ENUM_SYMBOLS", f"[{', '.join(missing)}]",
                                          location + ["symbols"])
                return found
            if r == "RECORD":
                return self._names(reader, writer, location) + self._fields(reader, writer,
                                                                            location)
            if r == "UNION":
                found = []
                # every branch the writer may have written must be readable
                for i, branch in enumerate(writer.schemas):
                    if self.check(reader, branch, location + [str(i)]):
                        found += incompatible("MISSING_UNION_BRANCH", "reader union lacking "
                                              f"writer type: {_avro_kind(branch)}",
                                              location + [str(i)])
                return found
            return []  # the same primitive type
        if w == "UNION":
            found = []
            for i, branch in enumerate(writer.schemas):
                found += self.check(reader, branch, location + [str(i)])
            return found
        if r == "UNION":
            if any(not self.check(branch, writer, location) for branch in reader.schemas):
                return []
            return incompatible("MISSING_UNION_BRANCH", f"reader union lacking writer type: {w}")
        if w.lower() in _AVRO_PROMOTIONS.get(r.lower(), ()):
            return []
        return mismatch()

    def _names(self, reader: _AvroNode, writer: _AvroNode,
               location: list[str]) -> list[AvroIncompatibility]:
        # Avro Java compares the unqualified names, or the reader's aliases with the
        # writer's full name.
        aliases: Any = reader.props.get("aliases") or []
        if reader.name == writer.name or writer.fullname in _avro_aliases(aliases,
                                                                           reader.namespace):
            return []
        return [AvroIncompatibility("NAME_MISMATCH", "/" + "/".join(location + ["name"]),
                                    f"expected: {writer.fullname}")]

    def _fields(self, reader: _AvroNode, writer: _AvroNode,
                location: list[str]) -> list[AvroIncompatibility]:
        found: list[AvroIncompatibility] = []
        by_name = {f.name: f for f in writer.fields}
        for i, field_ in enumerate(reader.fields):
            where = location + ["fields", str(i)]
            aliases: Any = field_.props.get("aliases") or []
            written = next((by_name[n] for n in [field_.name, *aliases] if n in by_name), None)
            if written is not None:
                found += self.check(field_.type, written.type, where + ["type"])
            elif field_.has_default:
                continue
            elif _avro_kind(field_.type) == "ENUM" and field_.type.props.get("default"):
                # Avro Java's own rule: an enum with a default stands in for the default
                found += self.check(field_.type, writer, where + ["type"])
            else:
                found.append(AvroIncompatibility("READER_FIELD_MISSING_DEFAULT_VALUE",
                                                 "/" + "/".join(where), field_.name))
        return found


def _avro_kind(schema: _AvroNode) -> str:
    """The Avro type as Avro Java names it in messages (INT, RECORD, UNION...)."""
    kind: str = schema.type
    return "RECORD" if kind == "error" else kind.upper()


def _parse_unsupported(schema_type: str) -> Callable[[str, dict[str, str], bool], tuple[str, Any]]:
    def parse_(text: str, referenced: dict[str, str], normalize: bool) -> tuple[str, Any]:
        raise InvalidSchema(f"{schema_type} schemas are not supported yet")
    return parse_


_PARSERS: dict[str, Callable[[str, dict[str, str], bool], tuple[str, Any]]] = {
    AVRO: _parse_avro,
    JSON: _parse_unsupported(JSON),
    PROTOBUF: _parse_unsupported(PROTOBUF),
}
_CHECKERS: dict[str, Callable[[Any, Any], list[str]]] = {
    AVRO: _check_avro,
}
