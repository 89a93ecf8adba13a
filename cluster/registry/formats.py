"""Schema formats of the registry (sans-IO): parsing, the forms schemas are compared in,
and compatibility checks, for Avro, JSON Schema and Protobuf, as Confluent Schema Registry
defines them.

The registry (cluster/registry/state.py) uses only what this module exports:
`parse(...)` -> ParsedSchema, `check(level, new, previous)` -> messages, and the names
below. Each format has its section: Avro (Apache `avro` parser, Avro Java's
schema-resolution rules), JSON Schema (`jsonschema` metaschema checks, Confluent's
SchemaDiff rules) and Protobuf (.proto text or base64 FileDescriptorProto, built in a
protobuf DescriptorPool, Confluent's protobuf SchemaDiff rules). No I/O: references come in
already resolved.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import avro.errors
import avro.name
import avro.schema
import jsonschema
import jsonschema.validators
from antlr4.error.ErrorListener import ErrorListener
from google.protobuf import descriptor_pb2, descriptor_pool, message, text_format
from proto_schema_parser import ast as proto_ast
from proto_schema_parser.parser import Parser as ProtoParser

from cluster.common import json_refs

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
    `parsed` is an AvroSchema, JsonSchema or ProtobufSchema (below). Raises InvalidSchema
    with a message for anything that does not parse."""
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
        with warnings.catch_warnings():
            # an invalid or unknown logicalType is ignored (the type stays its base type),
            # as Avro Java does, and without a warning per parse
            warnings.simplefilter("ignore", avro.errors.IgnoredLogicalType)
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


# --- JSON Schema ------------------------------------------------------------------------
#
# Parsing: the text must be JSON, a valid schema under its draft's metaschema (`$schema`,
# draft 7 when absent, as Confluent), with every $ref resolvable: local ("#/definitions/x"),
# or a reference name the registry resolved ("address.json", "address.json#/definitions/x").
# `canonical` is Confluent's JsonSchema.canonicalString(): the JSON re-serialized compactly,
# key order kept; normalized sorts the keys (Confluent's normalize()).
#
# Compatibility is Confluent's SchemaDiff: the old schema is the "original", the new one the
# "update"; every difference is typed (TYPE_CHANGED, MAX_LENGTH_DECREASED...) and the ones
# outside _JSON_COMPATIBLE_CHANGES make it incompatible. BACKWARD = diff(old -> new): the new
# schema must accept all the old one accepted. Schemas are classified as everit's classes
# (string, number, object, array, boolean, null, enum, const, not, combined, empty, false).
# Not covered: $id-based resolution, unevaluatedProperties/Items, prefixItems, `if/then/else`
# (Confluent compares these; here they count as annotations).

_JSON_COMPATIBLE_CHANGES = frozenset("""
    ID_CHANGED DESCRIPTION_CHANGED TITLE_CHANGED DEFAULT_CHANGED SCHEMA_REMOVED TYPE_EXTENDED
    MAX_LENGTH_INCREASED MAX_LENGTH_REMOVED MIN_LENGTH_DECREASED MIN_LENGTH_REMOVED
    PATTERN_REMOVED MAXIMUM_INCREASED MAXIMUM_REMOVED MINIMUM_DECREASED MINIMUM_REMOVED
    EXCLUSIVE_MAXIMUM_INCREASED EXCLUSIVE_MAXIMUM_REMOVED EXCLUSIVE_MINIMUM_DECREASED
    EXCLUSIVE_MINIMUM_REMOVED MULTIPLE_OF_REDUCED MULTIPLE_OF_REMOVED
    REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED REQUIRED_ATTRIBUTE_REMOVED DEPENDENCY_ARRAY_NARROWED
    DEPENDENCY_ARRAY_REMOVED DEPENDENCY_SCHEMA_REMOVED MAX_PROPERTIES_INCREASED
    MAX_PROPERTIES_REMOVED MIN_PROPERTIES_DECREASED MIN_PROPERTIES_REMOVED
    ADDITIONAL_PROPERTIES_ADDED ADDITIONAL_PROPERTIES_EXTENDED
    PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL
    REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL
    OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL
    PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL
    PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL
    PROPERTY_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL
    MAX_ITEMS_INCREASED MAX_ITEMS_REMOVED MIN_ITEMS_DECREASED MIN_ITEMS_REMOVED
    UNIQUE_ITEMS_REMOVED ADDITIONAL_ITEMS_ADDED ADDITIONAL_ITEMS_EXTENDED
    ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL ITEM_ADDED_TO_CLOSED_CONTENT_MODEL
    ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL
    ITEM_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL
    ITEM_REMOVED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL
    ENUM_ARRAY_EXTENDED COMBINED_TYPE_EXTENDED PRODUCT_TYPE_NARROWED SUM_TYPE_EXTENDED
    NOT_TYPE_NARROWED
""".split())
# Confluent's descriptions by group (json/diff/Difference.java); first {reader}, then {writer}.
_JSON_DESCRIPTION_GROUPS = [
    ("""MAXIMUM_ADDED MINIMUM_ADDED EXCLUSIVE_MAXIMUM_ADDED EXCLUSIVE_MINIMUM_ADDED
        MULTIPLE_OF_ADDED MAX_LENGTH_ADDED MIN_LENGTH_ADDED PATTERN_ADDED REQUIRED_ATTRIBUTE_ADDED
        MAX_PROPERTIES_ADDED MIN_PROPERTIES_ADDED DEPENDENCY_ARRAY_ADDED DEPENDENCY_SCHEMA_ADDED
        MAX_ITEMS_ADDED MIN_ITEMS_ADDED UNIQUE_ITEMS_ADDED ADDITIONAL_ITEMS_REMOVED
        ADDITIONAL_PROPERTIES_REMOVED""",
     "The keyword at path '{path}' in the {{reader}} schema is not present in the {{writer}} "
     "schema"),
    ("MIN_LENGTH_INCREASED MINIMUM_INCREASED EXCLUSIVE_MINIMUM_INCREASED MIN_PROPERTIES_INCREASED "
     "MULTIPLE_OF_EXPANDED MIN_ITEMS_INCREASED",
     "The value at path '{path}' in the {{reader}} schema is more than its value in the "
     "{{writer}} schema"),
    ("MAX_LENGTH_DECREASED MAXIMUM_DECREASED MAX_ITEMS_DECREASED EXCLUSIVE_MAXIMUM_DECREASED "
     "MAX_PROPERTIES_DECREASED",
     "The value at path '{path}' in the {{reader}} schema is less than its value in the "
     "{{writer}} schema"),
    ("PATTERN_CHANGED MULTIPLE_OF_CHANGED DEPENDENCY_ARRAY_CHANGED",
     "The value at path '{path}' is different between the {{reader}} and {{writer}} schema"),
    ("ADDITIONAL_ITEMS_NARROWED ENUM_ARRAY_NARROWED SUM_TYPE_NARROWED "
     "ADDITIONAL_PROPERTIES_NARROWED",
     "An array or combined type at path '{path}' has fewer elements in the {{reader}} schema "
     "than the {{writer}} schema"),
    ("DEPENDENCY_ARRAY_EXTENDED PRODUCT_TYPE_EXTENDED SUM_TYPE_EXTENDED NOT_TYPE_EXTENDED",
     "An array or combined type at path '{path}' has more elements in the {{reader}} schema "
     "than the {{writer}} schema"),
    ("TYPE_CHANGED TYPE_NARROWED COMBINED_TYPE_CHANGED COMBINED_TYPE_SUBSCHEMAS_CHANGED "
     "ENUM_ARRAY_CHANGED",
     "A type at path '{path}' is different between the {{reader}} schema and the {{writer}} "
     "schema"),
    ("REQUIRED_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL "
     "REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_OPEN_CONTENT_MODEL "
     "OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL ITEM_ADDED_TO_OPEN_CONTENT_MODEL",
     "The {{reader}} schema has an open content model and has a property or item at path "
     "'{path}' which is missing in the {{writer}} schema"),
    ("REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
     "The {{reader}} schema has an unopen content model and has a required property at path "
     "'{path}' which is missing in the {{writer}} schema"),
    ("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL",
     "The {{reader}} schema has a closed content model and is missing a property or item "
     "present at path '{path}' in the {{writer}} schema"),
    ("PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL "
     "ITEM_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
     "A property or item is missing in the {{reader}} schema but present at path '{path}' in "
     "the {{writer}} schema and is not covered by its partially open content model"),
    ("PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL "
     "ITEM_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
     "The {{reader}} schema has a property or item at path '{path}' which is missing in the "
     "{{writer}} schema and is not covered by its partially open content model"),
]
_JSON_DESCRIPTIONS = {t: d for types, d in _JSON_DESCRIPTION_GROUPS for t in types.split()}
_JSON_STRING_KEYWORDS = ("maxLength", "minLength", "pattern", "format")
_JSON_NUMBER_KEYWORDS = ("maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum",
                         "multipleOf")
_JSON_OBJECT_KEYWORDS = ("properties", "required", "additionalProperties", "patternProperties",
                         "dependencies", "maxProperties", "minProperties", "propertyNames")
_JSON_ARRAY_KEYWORDS = ("items", "additionalItems", "maxItems", "minItems", "uniqueItems",
                        "contains")
_JSON_TYPE_FAMILIES = (("string", _JSON_STRING_KEYWORDS), ("number", _JSON_NUMBER_KEYWORDS),
                       ("object", _JSON_OBJECT_KEYWORDS), ("array", _JSON_ARRAY_KEYWORDS))
_JSON_REF_DEPTH_MAX = 64


@dataclass(frozen=True)
class JsonSchema:
    """A parsed JSON Schema (ParsedSchema.parsed for JSON): the schema document, the
    referenced documents by reference name, and the jsonschema validator class of its draft
    (whose `.check_schema` passed) for readers that validate data."""

    schema: Any
    referenced: Mapping[str, Any] = field(default_factory=dict)
    validator: Any = None


def _parse_json(text: str, referenced: dict[str, str], normalize: bool) -> tuple[str, JsonSchema]:
    docs: dict[str, Any] = {}
    for name, ref_text in referenced.items():
        try:
            docs[name] = _json_document(ref_text)[0]
        except InvalidSchema as e:
            raise InvalidSchema(f"Invalid JSON schema: reference {name!r} does not parse: "
                                f"{e}") from None
    schema, validator = _json_document(text)
    for where, doc in [(None, schema), *docs.items()]:
        for ref in json_refs.refs_in(doc):
            try:
                json_refs.resolve(ref, where, schema, docs)
            except LookupError as e:
                in_ref = f" (in reference {where!r})" if where else ""
                raise InvalidSchema(f"Invalid JSON schema: $ref {ref!r}{in_ref} does not "
                                    f"resolve: {e}") from None
    parsed = JsonSchema(schema, docs, validator)
    return _compact(schema, sort_keys=normalize), parsed


def _json_document(text: str) -> tuple[Any, Any]:
    schema = _json_load(text, JSON)
    if not isinstance(schema, dict | bool):
        raise InvalidSchema(f"Invalid JSON schema: a schema is an object or a boolean, not "
                            f"{type(schema).__name__}")
    if isinstance(schema, dict) and "$schema" in schema:
        validator = jsonschema.validators.validator_for(schema, default=None)
        if validator is None:
            raise InvalidSchema(f"Invalid JSON schema: unknown $schema {schema['$schema']!r} "
                                "(drafts 3, 4, 6, 7, 2019-09 and 2020-12 are known)")
    else:
        validator = jsonschema.Draft7Validator
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise InvalidSchema(f"Invalid JSON schema: at {e.json_path}: {e.message}") from None
    return schema, validator


@dataclass
class _JsonView:
    """A schema as one of everit's classes: `kind` is string, number, object, array,
    boolean, null, enum, const, not, combined, empty, false, or raw (not classified yet)."""

    kind: str
    node: Any
    doc: str | None
    part: str = ""
    criterion: str = ""
    subs: list[_JsonView] = field(default_factory=list)


_JsonDiffs = list[tuple[str, tuple[str, ...]]]  # (difference type, path relative to the pair)


def _check_json(reader: JsonSchema, writer: JsonSchema) -> list[str]:
    diffs = _JsonDiff(writer, reader).compare(
        _JsonView("raw", writer.schema, None), _JsonView("raw", reader.schema, None))
    messages = []
    for kind, path in diffs:
        if kind in _JSON_COMPATIBLE_CHANGES:
            continue
        where = ("#/" + "/".join(path)).replace("{", "{{").replace("}", "}}")
        description = _JSON_DESCRIPTIONS.get(kind, "").format(path=where)
        messages.append(f'{{{{errorType:"{kind}", description:"{description}"}}}}')
    return messages


def _json_compatible(diffs: _JsonDiffs) -> bool:
    return all(kind in _JSON_COMPATIBLE_CHANGES for kind, _ in diffs)


def _json_sub(diffs: _JsonDiffs, *prefix: str) -> _JsonDiffs:
    return [(kind, (*prefix, *path)) for kind, path in diffs]


class _JsonDiff:
    """Confluent's SchemaDiff between an original (old) and an update (new) schema."""

    def __init__(self, original: JsonSchema, update: JsonSchema) -> None:
        self.original, self.update = original, update
        self.memo: dict[tuple[int, str, int, str], _JsonDiffs] = {}
        self.in_progress: set[tuple[int, str, int, str]] = set()

    def view(self, v: _JsonView, side: JsonSchema) -> _JsonView:
        if v.kind != "raw":
            return v
        node, doc = v.node, v.doc
        for _ in range(_JSON_REF_DEPTH_MAX):
            if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
                break
            node, doc = json_refs.resolve(node["$ref"], doc, side.schema, side.referenced)
        if isinstance(node, bool):
            return _JsonView("empty" if node else "false", node, doc)
        parts = [_JsonView("combined", node, doc, part=c, criterion=c,
                           subs=[_JsonView("raw", s, doc) for s in node[c]])
                 for c in ("allOf", "anyOf", "oneOf") if c in node]
        types = node.get("type")
        types = [types] if isinstance(types, str) else list(types or [])
        if not types:
            types = [t for t, keywords in _JSON_TYPE_FAMILIES if any(k in node for k in keywords)]
        typed = [_JsonView("number" if t == "integer" else t, node, doc, part=f"type:{t}")
                 for t in types]
        if len(typed) > 1:
            parts.append(_JsonView("combined", node, doc, part="types", criterion="anyOf",
                                   subs=typed))
        else:
            parts += typed
        parts += [_JsonView(k, node, doc, part=k) for k in ("enum", "const", "not") if k in node]
        if not parts:
            return _JsonView("empty", node, doc)
        if len(parts) == 1:
            return parts[0]
        return _JsonView("combined", node, doc, part="parts", criterion="allOf", subs=parts)

    def compare(self, o: _JsonView | None, u: _JsonView | None) -> _JsonDiffs:
        if o is None and u is None:
            return []
        if o is None:
            return [("SCHEMA_ADDED", ())]
        if u is None:
            return [("SCHEMA_REMOVED", ())]
        o, u = self.view(o, self.original), self.view(u, self.update)
        key = (id(o.node), o.part, id(u.node), u.part)
        if key in self.memo:
            return self.memo[key]
        if key in self.in_progress:
            return []  # a recursive schema meeting itself: compatible, as Confluent
        self.in_progress.add(key)
        try:
            found = self._compare(o, u)
        finally:
            self.in_progress.discard(key)
        self.memo[key] = found
        return found

    def _compare(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        if o.kind != "combined" and u.kind == "combined":
            if len(u.subs) == 1:
                sub = self.compare(o, u.subs[0])
                if _json_compatible(sub):
                    return sub
            elif u.criterion in ("anyOf", "oneOf"):
                for s in u.subs:
                    sub = self.compare(o, s)
                    if _json_compatible(sub):
                        return [*sub, ("SUM_TYPE_EXTENDED", ())]
        elif o.kind == "combined" and u.kind != "combined" and len(o.subs) == 1:
            sub = self.compare(o.subs[0], u)
            if _json_compatible(sub):
                return sub
        if o.kind != u.kind:
            if o.kind == "false" or u.kind == "empty":
                return []
            return [("TYPE_CHANGED", ())]
        compare_kind = getattr(self, f"_compare_{o.kind}", None)
        return compare_kind(o, u) if compare_kind else []

    @staticmethod
    def _bounds(o: Any, u: Any, keyword: str, name: str) -> _JsonDiffs:
        a, b = o.get(keyword), u.get(keyword)
        if a == b or (not isinstance(a, int | float | None) or not isinstance(b, int | float | None)):
            return []
        if a is None:
            change = "ADDED"
        elif b is None:
            change = "REMOVED"
        else:
            change = "INCREASED" if a < b else "DECREASED"
        return [(f"{name}_{change}", (keyword,))]

    def _compare_string(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        found = (self._bounds(o.node, u.node, "maxLength", "MAX_LENGTH")
                 + self._bounds(o.node, u.node, "minLength", "MIN_LENGTH"))
        a, b = o.node.get("pattern"), u.node.get("pattern")
        if a != b:
            change = "ADDED" if a is None else "REMOVED" if b is None else "CHANGED"
            found.append((f"PATTERN_{change}", ("pattern",)))
        return found

    def _compare_number(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        found: _JsonDiffs = []
        for keyword, name in (("maximum", "MAXIMUM"), ("minimum", "MINIMUM"),
                              ("exclusiveMaximum", "EXCLUSIVE_MAXIMUM"),
                              ("exclusiveMinimum", "EXCLUSIVE_MINIMUM")):
            found += self._bounds(o.node, u.node, keyword, name)
        a, b = o.node.get("multipleOf"), u.node.get("multipleOf")
        if a != b:
            if a is None or b is None:
                change = "ADDED" if a is None else "REMOVED"
            else:
                change = ("EXPANDED" if b % a == 0 else "REDUCED" if a % b == 0 else "CHANGED")
            found.append((f"MULTIPLE_OF_{change}", ("multipleOf",)))
        o_integer, u_integer = o.part == "type:integer", u.part == "type:integer"
        if o_integer != u_integer:
            found.append(("TYPE_EXTENDED" if o_integer else "TYPE_NARROWED", ()))
        return found

    def _compare_enum(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        a = {_compact(v, sort_keys=True) for v in o.node["enum"]}
        b = {_compact(v, sort_keys=True) for v in u.node["enum"]}
        if a == b:
            return []
        change = "EXTENDED" if b >= a else "NARROWED" if a >= b else "CHANGED"
        return [(f"ENUM_ARRAY_{change}", ("enum",))]

    def _compare_const(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        return [] if o.node["const"] == u.node["const"] else [("TYPE_CHANGED", ("const",))]

    def _compare_not(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        # `not` flips the direction: the new schema accepts more when its `not` accepts less
        forward = self.compare(_JsonView("raw", o.node["not"], o.doc),
                               _JsonView("raw", u.node["not"], u.doc))
        if not forward:
            return []
        if _json_compatible(forward):
            return [("NOT_TYPE_EXTENDED", ("not",))]
        return [("NOT_TYPE_NARROWED", ("not",))]

    def _compare_combined(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        found: _JsonDiffs = []
        if o.criterion != u.criterion:
            if u.criterion == "anyOf" or (u.criterion == "oneOf" and len(o.subs) == 1) or (
                    u.criterion == "allOf" and len(o.subs) == 1 and len(u.subs) == 1):
                found.append(("COMBINED_TYPE_EXTENDED", ()))
            else:
                return [("COMBINED_TYPE_CHANGED", ())]
        o_subs, u_subs = _json_distinct(o.subs), _json_distinct(u.subs)
        if len(o_subs) != len(u_subs):
            product = u.criterion == "allOf"
            grew = len(o_subs) < len(u_subs)
            found.append((f"{'PRODUCT' if product else 'SUM'}_TYPE_"
                          f"{'EXTENDED' if grew else 'NARROWED'}", ()))
        edges: dict[int, dict[int, _JsonDiffs]] = {}
        for i, os_ in enumerate(o_subs):
            for j, us in enumerate(u_subs):
                sub = self.compare(os_, us)
                if _json_compatible(sub):
                    edges.setdefault(i, {})[j] = _json_sub(sub, o.criterion, str(i))
        matching = _bipartite_matching({i: list(js) for i, js in edges.items()})
        for i, j in sorted(matching.items()):
            found += edges[i][j]
        if len(matching) < min(len(o_subs), len(u_subs)):
            found.append(("COMBINED_TYPE_SUBSCHEMAS_CHANGED", ()))
        return found

    def _compare_object(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        found: _JsonDiffs = []
        op, up = o.node.get("properties") or {}, u.node.get("properties") or {}
        o_required, u_required = set(o.node.get("required") or ()), set(u.node.get("required") or ())
        for key in op:
            if key in up:
                if key in o_required and key not in u_required:
                    found.append(("REQUIRED_ATTRIBUTE_REMOVED", ("required", key)))
                elif key not in o_required and key in u_required:
                    found.append(("REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED"
                                  if self._has_default(up[key], u.doc) else
                                  "REQUIRED_ATTRIBUTE_ADDED", ("required", key)))
        for key in sorted(set(op) | set(up)):
            where = ("properties", key)
            if key not in up:
                found += self._property_removed(o, u, key, where)
            elif key not in op:
                found += self._property_added(o, u, key, where, key in u_required)
            else:
                found += _json_sub(self.compare(_JsonView("raw", op[key], o.doc),
                                                _JsonView("raw", up[key], u.doc)), *where)
        found += self._dependencies(o, u)
        found += self._additional(o, u, "additionalProperties", "ADDITIONAL_PROPERTIES")
        found += self._bounds(o.node, u.node, "maxProperties", "MAX_PROPERTIES")
        found += self._bounds(o.node, u.node, "minProperties", "MIN_PROPERTIES")
        return found

    def _has_default(self, node: Any, doc: str | None) -> bool:
        """Whether a property of the update has a default (after following its $ref)."""
        v = self.view(_JsonView("raw", node, doc), self.update)
        return isinstance(v.node, dict) and "default" in v.node

    @staticmethod
    def _open(v: _JsonView, keyword: str = "additionalProperties") -> bool:
        extra = v.node.get(keyword, True)
        return extra is True and not (keyword == "additionalProperties"
                                      and v.node.get("patternProperties"))

    @staticmethod
    def _partial(v: _JsonView, key: str | None) -> _JsonView | None:
        if key is not None:
            for pattern, schema in (v.node.get("patternProperties") or {}).items():
                if re.search(pattern, key):
                    return _JsonView("raw", schema, v.doc)
        keyword = "additionalProperties" if key is not None else "additionalItems"
        extra = v.node.get(keyword)
        return _JsonView("raw", extra, v.doc) if isinstance(extra, dict) else None

    def _property_removed(self, o: _JsonView, u: _JsonView, key: str,
                          where: tuple[str, ...]) -> _JsonDiffs:
        removed = _JsonView("raw", o.node["properties"][key], o.doc)
        if self._open(u):
            return [("PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL", where)]
        partial = self._partial(u, key)
        if partial is not None:
            sub = _json_sub(self.compare(removed, partial), *where)
            covered = "IS" if _json_compatible(sub) else "NOT"
            return [*sub, (f"PROPERTY_REMOVED_{covered}_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                           where)]
        if removed.node is False:
            return [("PROPERTY_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL", where)]
        return [("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL", where)]

    def _property_added(self, o: _JsonView, u: _JsonView, key: str, where: tuple[str, ...],
                        required: bool) -> _JsonDiffs:
        added = _JsonView("raw", u.node["properties"][key], u.doc)
        with_default = self._has_default(added.node, u.doc)
        if self._open(o):
            if self.view(added, self.update).kind == "empty":
                return [("PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL", where)]
            if required:
                return [("REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_OPEN_CONTENT_MODEL"
                         if with_default else "REQUIRED_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL",
                         where)]
            return [("OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL", where)]
        found: _JsonDiffs = []
        partial = self._partial(o, key)
        if partial is not None:
            sub = _json_sub(self.compare(partial, added), *where)
            covered = "IS" if _json_compatible(sub) else "NOT"
            found += [*sub, (f"PROPERTY_ADDED_{covered}_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                             where)]
        if required:
            found.append(("REQUIRED_PROPERTY_WITH_DEFAULT_ADDED_TO_UNOPEN_CONTENT_MODEL"
                          if with_default else "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
                          where))
        else:
            found.append(("OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL", where))
        return found

    def _dependencies(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        found: _JsonDiffs = []
        od, ud = o.node.get("dependencies") or {}, u.node.get("dependencies") or {}
        for key in sorted(set(od) | set(ud)):
            a, b = od.get(key), ud.get(key)
            where = ("dependencies", key)
            if isinstance(a, list) or isinstance(b, list):
                if not isinstance(b, list):
                    found.append(("DEPENDENCY_ARRAY_REMOVED", where))
                elif not isinstance(a, list):
                    found.append(("DEPENDENCY_ARRAY_ADDED", where))
                elif set(a) != set(b):
                    change = ("EXTENDED" if set(b) >= set(a) else
                              "NARROWED" if set(a) >= set(b) else "CHANGED")
                    found.append((f"DEPENDENCY_ARRAY_{change}", where))
            elif b is None:
                found.append(("DEPENDENCY_SCHEMA_REMOVED", where))
            elif a is None:
                found.append(("DEPENDENCY_SCHEMA_ADDED", where))
            else:
                found += _json_sub(self.compare(_JsonView("raw", a, o.doc),
                                                _JsonView("raw", b, u.doc)), *where)
        return found

    def _additional(self, o: _JsonView, u: _JsonView, keyword: str, name: str) -> _JsonDiffs:
        a, b = o.node.get(keyword, True), u.node.get(keyword, True)
        if (a is not False) != (b is not False):
            return [(f"{name}_{'ADDED' if b is not False else 'REMOVED'}", (keyword,))]
        if not isinstance(a, dict) and isinstance(b, dict):
            return [(f"{name}_NARROWED", (keyword,))]
        if isinstance(a, dict) and not isinstance(b, dict):
            return [(f"{name}_EXTENDED", (keyword,))]
        if isinstance(a, dict) and isinstance(b, dict):
            return _json_sub(self.compare(_JsonView("raw", a, o.doc), _JsonView("raw", b, u.doc)),
                             keyword)
        return []

    def _compare_array(self, o: _JsonView, u: _JsonView) -> _JsonDiffs:
        found: _JsonDiffs = []
        a, b = o.node.get("items"), u.node.get("items")
        a_all = _JsonView("raw", a, o.doc) if isinstance(a, dict | bool) else None
        b_all = _JsonView("raw", b, u.doc) if isinstance(b, dict | bool) else None
        found += _json_sub(self.compare(a_all, b_all), "items")
        a_tuple = a if isinstance(a, list) else []
        b_tuple = b if isinstance(b, list) else []
        for i in range(max(len(a_tuple), len(b_tuple))):
            where = (f"items/{i}",)
            if i < len(a_tuple) and i < len(b_tuple):
                found += _json_sub(self.compare(_JsonView("raw", a_tuple[i], o.doc),
                                                _JsonView("raw", b_tuple[i], u.doc)), *where)
            elif i < len(a_tuple):
                found += self._item_removed(_JsonView("raw", a_tuple[i], o.doc), u, where)
            else:
                found += self._item_added(o, _JsonView("raw", b_tuple[i], u.doc), where)
        found += self._additional(o, u, "additionalItems", "ADDITIONAL_ITEMS")
        found += self._bounds(o.node, u.node, "maxItems", "MAX_ITEMS")
        found += self._bounds(o.node, u.node, "minItems", "MIN_ITEMS")
        if bool(o.node.get("uniqueItems")) != bool(u.node.get("uniqueItems")):
            found.append(("UNIQUE_ITEMS_REMOVED" if o.node.get("uniqueItems") else
                          "UNIQUE_ITEMS_ADDED", ("uniqueItems",)))
        return found

    def _item_removed(self, removed: _JsonView, u: _JsonView,
                      where: tuple[str, ...]) -> _JsonDiffs:
        if self._open(u, "additionalItems"):
            return [("ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL", where)]
        partial = self._partial(u, None)
        if partial is not None:
            sub = _json_sub(self.compare(removed, partial), *where)
            covered = "IS" if _json_compatible(sub) else "NOT"
            return [*sub, (f"ITEM_REMOVED_{covered}_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                           where)]
        if removed.node is False:
            return [("ITEM_WITH_FALSE_REMOVED_FROM_CLOSED_CONTENT_MODEL", where)]
        return [("ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL", where)]

    def _item_added(self, o: _JsonView, added: _JsonView, where: tuple[str, ...]) -> _JsonDiffs:
        if self._open(o, "additionalItems"):
            if self.view(added, self.update).kind == "empty":
                return [("ITEM_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL", where)]
            return [("ITEM_ADDED_TO_OPEN_CONTENT_MODEL", where)]
        partial = self._partial(o, None)
        if partial is not None:
            sub = _json_sub(self.compare(partial, added), *where)
            covered = "IS" if _json_compatible(sub) else "NOT"
            return [*sub, (f"ITEM_ADDED_{covered}_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                           where)]
        return [("ITEM_ADDED_TO_CLOSED_CONTENT_MODEL", where)]


def _json_distinct(subs: list[_JsonView]) -> list[_JsonView]:
    """Sub-schemas with duplicates dropped (Confluent compares them as a set)."""
    seen: set[str] = set()
    out = []
    for s in subs:
        key = f"{s.part}|{_compact(s.node, sort_keys=True)}" if s.kind == "raw" else \
            f"{s.kind}|{s.part}|{id(s.node)}"
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def _bipartite_matching(edges: dict[int, list[int]]) -> dict[int, int]:
    """A maximum matching of left to right vertices (Kuhn's augmenting paths)."""
    match_right: dict[int, int] = {}

    def augment(left: int, visited: set[int]) -> bool:
        for right in edges.get(left, []):
            if right in visited:
                continue
            visited.add(right)
            if right not in match_right or augment(match_right[right], visited):
                match_right[right] = left
                return True
        return False

    for left in edges:
        augment(left, set())
    return {left: right for right, left in match_right.items()}


# --- Protobuf ----------------------------------------------------------------------------
#
# Two forms are accepted, as Confluent's registry does: .proto text (parsed with
# proto-schema-parser, then built into a FileDescriptorProto here) and a base64-encoded
# serialized FileDescriptorProto (what confluent-kafka's ProtobufSerializer registers).
# Both are checked by building them in a protobuf DescriptorPool with their references
# (import path -> referenced schema) and the files clients treat as built in
# (google/protobuf/, google/type/, confluent/), which resolves every type name. `canonical` is the resolved FileDescriptorProto in protobuf
# text format without file name, json_name, options and source info, so one schema has one
# canonical form whichever form it was registered in (options do not distinguish
# schemas; `normalize` changes nothing more).
#
# Compatibility is Confluent's protobuf SchemaDiff (old = original, new = update): messages
# by name, fields by number; a removed message, a field whose kind (scalar, message, map)
# or scalar group (int32/int64/uint32/uint64/bool/enum, sint32/sint64, string/bytes,
# fixed32/sfixed32, fixed64/sfixed64, float, double) changes, a message-typed field whose
# type is renamed or changed incompatibly, a required field added or removed, several fields
# moved into one oneof, a oneof field removed, the package changed are incompatible.

_PROTO_SCALARS = {
    "double": descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
    "float": descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "fixed64": descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64,
    "fixed32": descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
    "sfixed32": descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32,
    "sfixed64": descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64,
    "sint32": descriptor_pb2.FieldDescriptorProto.TYPE_SINT32,
    "sint64": descriptor_pb2.FieldDescriptorProto.TYPE_SINT64,
}
_F = descriptor_pb2.FieldDescriptorProto
_PROTO_SCALAR_GROUPS = {
    **dict.fromkeys((_F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_UINT32, _F.TYPE_UINT64, _F.TYPE_BOOL,
                     _F.TYPE_ENUM), "GENERAL_NUMBER"),
    **dict.fromkeys((_F.TYPE_SINT32, _F.TYPE_SINT64), "SIGNED_NUMBER"),
    **dict.fromkeys((_F.TYPE_STRING, _F.TYPE_BYTES), "STRING_OR_BYTES"),
    **dict.fromkeys((_F.TYPE_FIXED32, _F.TYPE_SFIXED32), "FIXED32"),
    **dict.fromkeys((_F.TYPE_FIXED64, _F.TYPE_SFIXED64), "FIXED64"),
    _F.TYPE_FLOAT: "FLOAT", _F.TYPE_DOUBLE: "DOUBLE",
}
_PROTO_COMPATIBLE_CHANGES = frozenset("""
    MESSAGE_ADDED MESSAGE_MOVED ENUM_ADDED ENUM_REMOVED ENUM_CONST_ADDED ENUM_CONST_CHANGED
    ENUM_CONST_REMOVED FIELD_ADDED FIELD_REMOVED FIELD_NAME_CHANGED
    FIELD_STRING_OR_BYTES_LABEL_CHANGED ONEOF_ADDED ONEOF_REMOVED ONEOF_FIELD_ADDED
""".split())
_PROTO_MAIN_FILE = "schema.proto"  # the registered schema's file name in its pool


@dataclass(frozen=True)
class ProtobufSchema:
    """A parsed Protobuf schema (ParsedSchema.parsed for PROTOBUF): its FileDescriptorProto
    (type names resolved), the pool holding it and its dependencies (for readers:
    pool.FindMessageTypeByName), and `serialized`, the base64 FileDescriptorProto that
    confluent-kafka's deserializers ask for (GET ...?format=serialized)."""

    file: descriptor_pb2.FileDescriptorProto
    pool: Any
    serialized: str


class _RaisingErrorListener(ErrorListener):  # type: ignore[misc]
    def syntaxError(self, recognizer: Any, offendingSymbol: Any, line: int, column: int,
                    msg: str, e: Any) -> None:
        raise InvalidSchema(f"Invalid PROTOBUF schema: line {line}:{column + 1}: {msg}")


def _strict(recognizer: Any) -> None:
    recognizer.removeErrorListeners()
    recognizer.addErrorListener(_RaisingErrorListener())


def _parse_protobuf(text: str, referenced: dict[str, str],
                    normalize: bool) -> tuple[str, ProtobufSchema]:
    if not text.strip():
        raise InvalidSchema("Invalid PROTOBUF schema: empty")
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    files = {name: _proto_file(ref_text, name) for name, ref_text in referenced.items()}
    main = _proto_file(text, _PROTO_MAIN_FILE)
    for name in [*files, _PROTO_MAIN_FILE]:
        _proto_add(pool, files | {_PROTO_MAIN_FILE: main}, name, added, [])
    resolved = descriptor_pb2.FileDescriptorProto()
    pool.FindFileByName(_PROTO_MAIN_FILE).CopyToProto(resolved)
    serialized = base64.b64encode(main.SerializeToString(deterministic=True)).decode()
    return _proto_canonical(resolved), ProtobufSchema(resolved, pool, serialized)


def _proto_file(text: str, name: str) -> descriptor_pb2.FileDescriptorProto:
    """`text` as a FileDescriptorProto named `name`: base64 of a serialized one, or .proto."""
    stripped = text.strip()
    if stripped and re.fullmatch(r"[A-Za-z0-9+/=\s]+", stripped):
        try:
            fdp = descriptor_pb2.FileDescriptorProto.FromString(
                base64.b64decode(stripped, validate=False))
        except (binascii.Error, message.DecodeError, ValueError) as e:
            raise InvalidSchema(f"Invalid PROTOBUF schema: neither .proto text nor a base64 "
                                f"FileDescriptorProto ({e})") from None
        fdp.name = name
        return fdp
    try:
        tree = ProtoParser(setup_lexer=_strict, setup_parser=_strict).parse(text)
    except InvalidSchema:
        raise
    except Exception as e:  # the parser's own failures on odd input
        raise InvalidSchema(f"Invalid PROTOBUF schema: {e}") from None
    return _ProtoBuilder(name).file(tree)


def _proto_add(pool: Any, files: Mapping[str, descriptor_pb2.FileDescriptorProto], name: str,
               added: set[str], path: list[str]) -> None:
    """Add file `name` to the pool after its dependencies."""
    if name in added:
        return
    if name in path:
        raise InvalidSchema(f"Invalid PROTOBUF schema: import cycle {' -> '.join(path + [name])}")
    fdp = files.get(name)
    if fdp is None:
        fdp = _proto_well_known(name)
        if fdp is None:
            importer = path[-1] if path else _PROTO_MAIN_FILE
            raise InvalidSchema(f"Invalid PROTOBUF schema: {importer} imports {name!r}, which is "
                                "not one of the schema's references")
    for dependency in fdp.dependency:
        _proto_add(pool, files, dependency, added, [*path, name])
    try:
        pool.Add(fdp)
    except (TypeError, ValueError, KeyError) as e:
        where = "" if name == _PROTO_MAIN_FILE else f" (reference {name!r})"
        raise InvalidSchema(f"Invalid PROTOBUF schema{where}: {e}") from None
    added.add(name)


def _proto_well_known(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    """A file confluent-kafka's serializers never send as a reference (its `_is_builtin`:
    google/protobuf/, google/type/, confluent/), from the Python package that ships it:
    protobuf, googleapis-common-protos, confluent-kafka (None if not installed)."""
    module = name.removesuffix(".proto").replace("/", ".") + "_pb2"
    if name.startswith("confluent/"):
        module = f"confluent_kafka.schema_registry.{module}"
    elif not name.startswith(("google/protobuf/", "google/type/")):
        return None
    try:
        importlib.import_module(module)
        found = descriptor_pool.Default().FindFileByName(name)
    except (ImportError, KeyError):
        return None
    fdp = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(fdp)
    return fdp


def _proto_canonical(resolved: descriptor_pb2.FileDescriptorProto) -> str:
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.CopyFrom(resolved)
    fdp.ClearField("name")
    fdp.ClearField("source_code_info")
    _proto_strip(fdp)
    return text_format.MessageToString(fdp, as_one_line=True)


def _proto_strip(msg: Any) -> None:
    """Drop options and json_name everywhere (protoc fills them, .proto text may not)."""
    for fd, value in list(msg.ListFields()):
        if fd.name in ("options", "json_name"):
            msg.ClearField(fd.name)
        elif fd.message_type is not None:
            repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == 3
            for item in (value if repeated else [value]):
                _proto_strip(item)


class _ProtoBuilder:
    """A proto-schema-parser AST as a FileDescriptorProto (type names left relative: the
    DescriptorPool resolves them by protobuf's scoping rules)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def file(self, tree: proto_ast.File) -> descriptor_pb2.FileDescriptorProto:
        fdp = descriptor_pb2.FileDescriptorProto(name=self.name)
        syntax = tree.syntax or "proto2"
        if tree.edition:
            raise InvalidSchema("Invalid PROTOBUF schema: editions are not supported")
        if syntax not in ("proto2", "proto3"):
            raise InvalidSchema(f"Invalid PROTOBUF schema: unknown syntax {syntax!r}")
        self.proto3 = syntax == "proto3"
        if syntax == "proto3":
            fdp.syntax = "proto3"
        for element in tree.file_elements:
            if isinstance(element, proto_ast.Package):
                fdp.package = element.name
            elif isinstance(element, proto_ast.Import):
                if element.public:
                    fdp.public_dependency.append(len(fdp.dependency))
                if element.weak:
                    fdp.weak_dependency.append(len(fdp.dependency))
                fdp.dependency.append(element.name)
            elif isinstance(element, proto_ast.Message):
                self.message(element, fdp.message_type.add())
            elif isinstance(element, proto_ast.Enum):
                self.enum(element, fdp.enum_type.add())
            elif isinstance(element, proto_ast.Service):
                self.service(element, fdp.service.add())
            elif isinstance(element, proto_ast.Extension):
                raise InvalidSchema("Invalid PROTOBUF schema: extensions are not supported")
        return fdp

    def message(self, m: proto_ast.Message, out: descriptor_pb2.DescriptorProto) -> None:
        out.name = m.name
        for element in m.elements:
            if isinstance(element, proto_ast.Field):
                self.field(element, out.field.add())
            elif isinstance(element, proto_ast.MapField):
                self.map_field(element, out)
            elif isinstance(element, proto_ast.OneOf):
                index = len(out.oneof_decl)
                out.oneof_decl.add(name=element.name)
                for member in element.elements:
                    if isinstance(member, proto_ast.Field):
                        f = out.field.add()
                        self.field(member, f)
                        f.oneof_index = index
                        f.label = _F.LABEL_OPTIONAL
            elif isinstance(element, proto_ast.Message):
                self.message(element, out.nested_type.add())
            elif isinstance(element, proto_ast.Enum):
                self.enum(element, out.enum_type.add())
            elif isinstance(element, proto_ast.Reserved):
                out.reserved_name.extend(element.names)
                for r in element.ranges:
                    start, end = self.range(r)
                    out.reserved_range.add(start=start, end=end)
            elif isinstance(element, proto_ast.ExtensionRange):
                for r in element.ranges:
                    start, end = self.range(r)
                    out.extension_range.add(start=start, end=end)
            elif isinstance(element, proto_ast.Group | proto_ast.Extension):
                raise InvalidSchema(f"Invalid PROTOBUF schema: {type(element).__name__.lower()}s "
                                    "are not supported")
        # proto3 `optional` fields live in a synthetic oneof each, as protoc makes them
        for f in out.field:
            if f.proto3_optional:
                f.oneof_index = len(out.oneof_decl)
                out.oneof_decl.add(name=f"_{f.name}")

    @staticmethod
    def range(text: str) -> tuple[int, int]:
        low, _, high = (part.strip() for part in text.partition(" to "))
        end = 536870912 if high == "max" else int(high or low) + 1
        return int(low), end

    def field(self, f: proto_ast.Field, out: descriptor_pb2.FieldDescriptorProto) -> None:
        out.name, out.number = f.name, f.number
        cardinality = (f.cardinality.value if f.cardinality else "").upper()
        out.label = {"REPEATED": _F.LABEL_REPEATED, "REQUIRED": _F.LABEL_REQUIRED}.get(
            cardinality, _F.LABEL_OPTIONAL)
        if cardinality == "OPTIONAL" and self.proto3:
            out.proto3_optional = True
        self.set_type(f.type, out)
        for option in f.options:
            if option.name == "default" and not isinstance(option.value, proto_ast.MessageLiteral):
                out.default_value = str(option.value).lower() if isinstance(option.value, bool) \
                    else str(getattr(option.value, "name", option.value))

    @staticmethod
    def set_type(type_name: str, out: descriptor_pb2.FieldDescriptorProto) -> None:
        if type_name in _PROTO_SCALARS:
            out.type = _PROTO_SCALARS[type_name]
        else:
            out.type_name = type_name

    def map_field(self, f: proto_ast.MapField, out: descriptor_pb2.DescriptorProto) -> None:
        entry = out.nested_type.add(name="".join(p[:1].upper() + p[1:]
                                                 for p in f.name.split("_")) + "Entry")
        entry.options.map_entry = True
        key = entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL)
        self.set_type(f.key_type, key)
        value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
        self.set_type(f.value_type, value)
        out.field.add(name=f.name, number=f.number, label=_F.LABEL_REPEATED,
                      type_name=entry.name)

    @staticmethod
    def enum(e: proto_ast.Enum, out: descriptor_pb2.EnumDescriptorProto) -> None:
        out.name = e.name
        for value in e.elements:
            if isinstance(value, proto_ast.EnumValue):
                out.value.add(name=value.name, number=value.number)
            elif isinstance(value, proto_ast.Option) and value.name == "allow_alias":
                out.options.allow_alias = bool(value.value)
            elif isinstance(value, proto_ast.EnumReserved):
                out.reserved_name.extend(value.names)
                for r in value.ranges:
                    start, end = _ProtoBuilder.range(r)
                    out.reserved_range.add(start=start, end=end - 1)  # inclusive for enums

    @staticmethod
    def service(s: proto_ast.Service, out: descriptor_pb2.ServiceDescriptorProto) -> None:
        out.name = s.name
        for m in s.elements:
            if isinstance(m, proto_ast.Method):
                out.method.add(name=m.name, input_type=m.input_type.type,
                               output_type=m.output_type.type,
                               client_streaming=m.input_type.stream or None,
                               server_streaming=m.output_type.stream or None)


_ProtoDiffs = list[tuple[str, str]]  # (difference type, path)


def _check_protobuf(reader: ProtobufSchema, writer: ProtobufSchema) -> list[str]:
    diffs = _ProtoDiff(writer, reader).compare_files()
    return [f"Difference{{{{fullPath='{path}', type={kind}}}}}" for kind, path in diffs
            if kind not in _PROTO_COMPATIBLE_CHANGES]


class _ProtoDiff:
    """Confluent's protobuf SchemaDiff between an original (old) and an update (new)."""

    def __init__(self, original: ProtobufSchema, update: ProtobufSchema) -> None:
        self.original, self.update = original, update
        self.visited: set[tuple[str, str]] = set()

    def compare_files(self) -> _ProtoDiffs:
        found: _ProtoDiffs = []
        if self.original.file.package != self.update.file.package:
            found.append(("PACKAGE_CHANGED", "#/"))
        return found + self.compare_types(
            list(self.original.file.message_type), list(self.update.file.message_type),
            self.original.file.package, self.update.file.package, "")

    def compare_types(self, original: list[Any], update: list[Any], o_scope: str, u_scope: str,
                      path: str) -> _ProtoDiffs:
        found: _ProtoDiffs = []
        o_by_name = {m.name: (i, m) for i, m in enumerate(original) if not m.options.map_entry}
        u_by_name = {m.name: (i, m) for i, m in enumerate(update) if not m.options.map_entry}
        for name in sorted(set(o_by_name) | set(u_by_name)):
            where = f"{path}{name}"
            if name not in u_by_name:
                found.append(("MESSAGE_REMOVED", f"#/{where}"))
            elif name not in o_by_name:
                found.append(("MESSAGE_ADDED", f"#/{where}"))
            else:
                (oi, om), (ui, um) = o_by_name[name], u_by_name[name]
                found += self.compare_message(om, um, _proto_join(o_scope, name),
                                              _proto_join(u_scope, name), where)
                if oi != ui:
                    found.append(("MESSAGE_MOVED", f"#/{where}"))
        return found

    def compare_message(self, o: Any, u: Any, o_name: str, u_name: str,
                        path: str) -> _ProtoDiffs:
        if (o_name, u_name) in self.visited:
            return []  # recursion, or compared already
        self.visited.add((o_name, u_name))
        found: _ProtoDiffs = []
        o_oneofs, u_oneofs = _proto_oneofs(o), _proto_oneofs(u)
        o_top = {f.number: f for f in o.field if _proto_oneof(o, f) is None}
        u_top = {f.number: f for f in u.field if _proto_oneof(u, f) is None}
        o_all, u_all = {f.number: f for f in o.field}, {f.number: f for f in u.field}
        o_in_oneof = {f.number: _proto_oneof(o, f) for f in o.field if _proto_oneof(o, f)}
        u_in_oneof = {f.number: _proto_oneof(u, f) for f in u.field if _proto_oneof(u, f)}
        for oneof, members in u_oneofs.items():
            moved = sum(1 for f in members if o_top.pop(f.number, None) is not None)
            existing = sum(1 for f in members if f.number in o_in_oneof)
            if moved > 1:
                found.append(("MULTIPLE_FIELDS_MOVED_TO_ONEOF", f"#/{path}/{oneof}"))
            elif moved == 1 and existing > 0:
                found.append(("FIELD_MOVED_TO_EXISTING_ONEOF", f"#/{path}/{oneof}"))
        for oneof in sorted(set(o_oneofs) | set(u_oneofs)):
            where = f"#/{path}/{oneof}"
            if oneof not in u_oneofs:
                found.append(("ONEOF_REMOVED", where))
            elif oneof not in o_oneofs:
                found.append(("ONEOF_ADDED", where))
            else:
                o_members = {f.number: f for f in o_oneofs[oneof]}
                u_members = {f.number: f for f in u_oneofs[oneof]}
                for number in sorted(set(o_members) | set(u_members)):
                    at = f"{path}/{oneof}/{number}"
                    if number not in u_members:
                        found.append(("ONEOF_FIELD_REMOVED", f"#/{at}"))
                    elif number not in o_members:
                        found.append(("ONEOF_FIELD_ADDED", f"#/{at}"))
                    else:
                        found += self.compare_field(o_members[number], u_members[number], at)
        for number in sorted(set(o_top) | set(u_top)):
            at = f"{path}/{number}"
            if number not in u_top:
                required = o_top[number].label == _F.LABEL_REQUIRED
                found.append(("REQUIRED_FIELD_REMOVED" if required else "FIELD_REMOVED", f"#/{at}"))
            elif number not in o_top:
                required = u_top[number].label == _F.LABEL_REQUIRED
                found.append(("REQUIRED_FIELD_ADDED" if required else "FIELD_ADDED", f"#/{at}"))
            else:
                found += self.compare_field(o_top[number], u_top[number], at)
        for number in sorted(set(o_all) & set(u_all)):
            o_oneof, u_oneof = o_in_oneof.get(number), u_in_oneof.get(number)
            if (o_oneof is None and u_oneof is None) or (o_oneof is not None and o_oneof == u_oneof):
                continue
            found += self.compare_field(o_all[number], u_all[number], f"{path}/{number}")
        return found + self.compare_types(list(o.nested_type), list(u.nested_type), o_name,
                                          u_name, f"{path}.")

    def compare_field(self, o: Any, u: Any, path: str) -> _ProtoDiffs:
        found: _ProtoDiffs = []
        if o.name != u.name:
            found.append(("FIELD_NAME_CHANGED", f"#/{path}"))
        return found + self.compare_types_of(o, u, path)

    def compare_types_of(self, o: Any, u: Any, path: str) -> _ProtoDiffs:
        o_kind, u_kind = self.kind(o, self.original), self.kind(u, self.update)
        if o_kind != u_kind:
            return [("FIELD_KIND_CHANGED", f"#/{path}")]
        found: _ProtoDiffs = []
        if o_kind == "MAP":
            o_entry = self.message_type(o.type_name, self.original)
            u_entry = self.message_type(u.type_name, self.update)
            return (self.compare_types_of(o_entry.field[0], u_entry.field[0], path)
                    + self.compare_types_of(o_entry.field[1], u_entry.field[1], path))
        repeated = (o.label == _F.LABEL_REPEATED, u.label == _F.LABEL_REPEATED)
        if o_kind == "SCALAR":
            if _PROTO_SCALAR_GROUPS[o.type] != _PROTO_SCALAR_GROUPS[u.type]:
                found.append(("FIELD_SCALAR_KIND_CHANGED", f"#/{path}"))
            elif repeated[0] != repeated[1]:
                found.append(("FIELD_STRING_OR_BYTES_LABEL_CHANGED"
                              if _PROTO_SCALAR_GROUPS[o.type] == "STRING_OR_BYTES" else
                              "FIELD_NUMERIC_LABEL_CHANGED", f"#/{path}"))
            return found
        o_full, u_full = o.type_name.lstrip("."), u.type_name.lstrip(".")
        o_local = _proto_local(o_full, self.package_of(o_full, self.original))
        u_local = _proto_local(u_full, self.package_of(u_full, self.update))
        if o_local != u_local:
            return [("FIELD_NAMED_TYPE_CHANGED", f"#/{path}")]
        sub = self.compare_message(self.message_type(o.type_name, self.original),
                                   self.message_type(u.type_name, self.update), o_full, u_full,
                                   o_local)
        found += sub
        if any(kind not in _PROTO_COMPATIBLE_CHANGES for kind, _ in sub):
            found.append(("FIELD_NAMED_TYPE_CHANGED", f"#/{path}"))
        return found

    def kind(self, f: Any, side: ProtobufSchema) -> str:
        if f.type != _F.TYPE_MESSAGE and f.type != _F.TYPE_GROUP:
            return "SCALAR"  # enums are scalars to Confluent
        entry = self.message_type(f.type_name, side)
        return "MAP" if entry.options.map_entry else "MESSAGE"

    @staticmethod
    def message_type(type_name: str, side: ProtobufSchema) -> Any:
        proto = descriptor_pb2.DescriptorProto()
        side.pool.FindMessageTypeByName(type_name.lstrip(".")).CopyToProto(proto)
        return proto

    @staticmethod
    def package_of(full_name: str, side: ProtobufSchema) -> str:
        return str(side.pool.FindMessageTypeByName(full_name).file.package)


def _proto_join(scope: str, name: str) -> str:
    return f"{scope}.{name}" if scope else name


def _proto_local(full_name: str, package: str) -> str:
    return full_name[len(package) + 1:] if package and full_name.startswith(package + ".") \
        else full_name


def _proto_oneof(m: Any, f: Any) -> str | None:
    """The real (not proto3-optional synthetic) oneof of field `f`, or None."""
    if not f.HasField("oneof_index") or f.proto3_optional:
        return None
    return str(m.oneof_decl[f.oneof_index].name)


def _proto_oneofs(m: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in m.field:
        oneof = _proto_oneof(m, f)
        if oneof is not None:
            out.setdefault(oneof, []).append(f)
    return out


_PARSERS: dict[str, Callable[[str, dict[str, str], bool], tuple[str, Any]]] = {
    AVRO: _parse_avro,
    JSON: _parse_json,
    PROTOBUF: _parse_protobuf,
}
_CHECKERS: dict[str, Callable[[Any, Any], list[str]]] = {
    AVRO: _check_avro,
    JSON: _check_json,
    PROTOBUF: _check_protobuf,
}
