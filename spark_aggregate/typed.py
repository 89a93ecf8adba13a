"""Typed tables: record values in Confluent's wire format (magic byte 0, a 4-byte big-endian
schema id, the Avro binary payload or JSON Schema's JSON text) decoded by their schema id
into typed columns (docs/typed_tables.md).

The id is resolved in the record's source context: a record mirrored from cluster `east`
(its source_cluster provenance column) names a schema of east's registry, which the mirror
copies into the aggregate registry under context `.east` with its id kept; a record produced
into the loaded cluster itself names one of the default context. Each record is read with
its writer schema (by id) into the table's reader schema for that context, the latest
version of the topic's subject there (Avro schema resolution), so every version that is
compatible with the latest lands in the same columns and older records read newer fields
as their defaults (NULL for optional fields). The table's columns are the union of the top-level
fields of those latest versions, after the warehouse's own columns.

A record that is not in the wire format (no value, another magic byte, a payload shorter
than its schema needs or longer) is a poison record: it goes to the table's dead-letter
table with its coordinates and raw bytes, or stops the load (poison = "fail"). A record
whose id is unknown in its context, or whose writer schema cannot be read as the reader
schema, stops the load: `TypedLoadError` names topic, partition, offset and schema id.

Avro types map as: record -> struct, array -> array, map -> map<string, _>, enum -> string,
fixed/bytes -> binary, decimal -> decimal(p, s), date -> date, timestamp-millis/micros ->
timestamp, local-timestamp-* -> timestamp_ntz, union of null and one type -> that type
(nullable); other unions are refused. time-* and uuid read as their underlying int/string.
JSON Schema payloads are parsed with orjson into the columns the schema's properties declare
(json_columns); values that do not fit them make the record poison.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cluster.client.registry import RegistryAccess
from cluster.common import json_refs
from spark_aggregate.columns import TIMESTAMP_TYPE
from spark_aggregate.typed_protobuf import (
    PoisonPayload,
    ProtobufFile,
    ProtobufSchemaError,
    fetch_protobuf,
    referenced_bodies,
)

MAGIC_BYTE = 0
WIRE_HEADER_BYTES = 5
DEFAULT_CONTEXT = ""
REGISTRY_TIMEOUT_S = 10.0
KEY_COLUMN = "record_key"
UNKNOWN_ID_REASON = "is unknown in registry context"
"""In the reason of a dead letter whose schema id the registry did not know (a load reloads it
once the registry does: ledger.plan_reload)."""
PRIMITIVE_KEY_FIELD = "key"  # a primitive key's one field, while it is decoded as a record
"""The struct column a typed key decodes into (the table's `key` column keeps the bytes)."""
NO_ACCESS = RegistryAccess()  # a registry without authentication, over HTTP or a CA the system trusts
_DROPPED_LOGICAL_TYPES = frozenset({"time-millis", "time-micros", "uuid"})

# The dead-letter tables' data columns (partitioned like the topic tables).
DEAD_LETTER_COLUMNS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("topic", "STRING", pa.string()),
    ("kafka_partition", "INT", pa.int32()),
    ("kafka_offset", "BIGINT", pa.int64()),
    ("reason", "STRING", pa.string()),
    ("schema_id", "INT", pa.int32()),
    ("key", "BINARY", pa.binary()),
    ("value", "BINARY", pa.binary()),
    ("timestamp", "TIMESTAMP", TIMESTAMP_TYPE),
    ("source_cluster", "STRING", pa.string()),
    ("source_partition", "INT", pa.int32()),
    ("source_offset", "BIGINT", pa.int64()),
    ("load_id", "STRING", pa.string()),
)
DEAD_LETTER_SCHEMA = pa.schema([pa.field(n, t) for n, _, t in DEAD_LETTER_COLUMNS])


class TypedLoadError(Exception):
    """A record the typed table cannot take: unknown schema id, incompatible schema, or a
    poison record when poison = "fail"."""


class UnknownSchemaId(TypedLoadError):
    """A record's schema id the registry does not know in its context: poison under
    poison = "dead-letter" (reason `schema id N is unknown ...`), the topic's stop under "fail"."""


class SchemaError(Exception):
    """An Avro schema the warehouse cannot turn into columns, or a registry lookup failed."""


def dead_letter_table(table: str) -> str:
    return f"{table}_dead_letters"


def context_of(source_cluster: str | None, loaded_cluster: str,
               contexts: tuple[tuple[str, str], ...] = ()) -> str:
    """The registry context a record's schema id belongs to: its flow's `schema_context`
    (`contexts`: source cluster -> context), else `.<source cluster>`."""
    if source_cluster is None or source_cluster == loaded_cluster:
        return DEFAULT_CONTEXT
    return next((c for s, c in contexts if s == source_cluster), f".{source_cluster}")


def qualified(subject: str, context: str) -> str:
    return subject if context == DEFAULT_CONTEXT else f":{context}:{subject}"


# ---- the registry --------------------------------------------------------------------------


class RegistryReader:
    """Schemas by id and latest versions over Confluent's REST API (cached per process)."""

    def __init__(self, url: str, access: RegistryAccess = NO_ACCESS) -> None:
        self.url = url.rstrip("/")
        self.access = access
        self._client: Any = None

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        import httpx

        if self._client is None:
            self._client = httpx.Client(base_url=self.url, timeout=REGISTRY_TIMEOUT_S, verify=self.access.verify(),
                                        headers=self.access.auth().headers())
        try:
            response = self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise SchemaError(f"schema registry {self.url}: {exc}") from None
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise SchemaError(f"schema registry {self.url}{path}: HTTP {response.status_code} {response.text[:200]}")
        return response.json()

    def schema_by_id(self, schema_id: int, context: str) -> tuple[str, str] | None:
        """(schemaType, schema text) of an id in a context, None if unknown there."""
        params = None if context == DEFAULT_CONTEXT else {"subject": f":{context}:"}
        got = self._get(f"/schemas/ids/{schema_id}", params)
        if got is None:
            return None
        return got.get("schemaType", "AVRO"), got["schema"]

    def latest(self, subject: str, context: str) -> tuple[int, str, str] | None:
        """(id, schemaType, schema text) of the subject's latest version, None if no such subject."""
        import urllib.parse

        name = urllib.parse.quote(qualified(subject, context), safe="")
        got = self._get(f"/subjects/{name}/versions/latest")
        if got is None:
            return None
        return got["id"], got.get("schemaType", "AVRO"), got["schema"]

    def contexts(self) -> list[str]:
        got = self._get("/contexts") or []
        return sorted(DEFAULT_CONTEXT if c == "." else c for c in got)


# ---- Avro schemas as Arrow and Spark types ------------------------------------------------------


def _plain(schema: Any) -> Any:
    """The schema with logical types the tables do not keep dropped (read as their base type)."""
    if isinstance(schema, list):
        return [_plain(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _plain(v) if k in ("type", "items", "values", "fields") else v for k, v in schema.items()}
    if "fields" in out:
        out["fields"] = [{**f, "type": _plain(f["type"])} for f in schema["fields"]]
    if out.get("logicalType") in _DROPPED_LOGICAL_TYPES:
        del out["logicalType"]
    return out


def parse_avro(text: str) -> Any:
    """A schema text as fastavro's parsed schema (named types expanded for the reader)."""
    import fastavro

    # The parsed form carries fastavro's "parsed" mark, so readers do not parse it again per record.
    return fastavro.parse_schema(_plain(json.loads(text)), _force=True)


_PRIMITIVES = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
               "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}


def arrow_type(schema: Any, names: dict[str, Any] | None = None) -> pa.DataType:
    """The Arrow type of an Avro schema (JSON form)."""
    names = {} if names is None else names
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in names:
            return arrow_type(names[schema], names)
        raise SchemaError(f"unknown Avro type {schema!r}")
    if isinstance(schema, list):
        others = [s for s in schema if s != "null"]
        if len(others) != 1:
            raise SchemaError(f"union {json.dumps(schema)}: only unions of null and one type become columns")
        return arrow_type(others[0], names)
    kind = schema["type"]
    logical = schema.get("logicalType")
    if "name" in schema and kind in ("record", "enum", "fixed"):
        names[schema["name"]] = schema
        if "namespace" in schema:
            names[f"{schema['namespace']}.{schema['name']}"] = schema
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision = int(schema["precision"])
        scale = int(schema.get("scale", 0))
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    if logical == "date" and kind == "int":
        return pa.date32()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return TIMESTAMP_TYPE
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return pa.timestamp("us")
    if kind == "record":
        return pa.struct([pa.field(f["name"], arrow_type(f["type"], names)) for f in schema["fields"]])
    if kind == "array":
        return pa.list_(arrow_type(schema["items"], names))
    if kind == "map":
        return pa.map_(pa.string(), arrow_type(schema["values"], names))
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    return arrow_type(kind, names)


def spark_type(kind: pa.DataType) -> str:
    """Spark DDL of an Arrow type the typed tables use."""
    if pa.types.is_struct(kind):
        return "STRUCT<" + ", ".join(f"`{f.name}`: {spark_type(f.type)}" for f in kind) + ">"
    if pa.types.is_map(kind):
        return f"MAP<STRING, {spark_type(kind.item_type)}>"
    if pa.types.is_list(kind):
        return f"ARRAY<{spark_type(kind.value_type)}>"
    if pa.types.is_decimal(kind):
        return f"DECIMAL({kind.precision}, {kind.scale})"
    if pa.types.is_timestamp(kind):
        return "TIMESTAMP" if kind.tz else "TIMESTAMP_NTZ"
    simple = {pa.bool_(): "BOOLEAN", pa.int32(): "INT", pa.int64(): "BIGINT", pa.float32(): "FLOAT",
              pa.float64(): "DOUBLE", pa.binary(): "BINARY", pa.string(): "STRING", pa.date32(): "DATE"}
    return simple[kind]


def record_columns(text: str) -> list[tuple[str, pa.DataType]]:
    """A record schema's top-level fields as (column, Arrow type)."""
    schema = _plain(json.loads(text))
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise SchemaError("a typed table's schema must be an Avro record")
    names: dict[str, Any] = {}
    top = arrow_type(schema, names)
    return [(f.name, f.type) for f in top]


# ---- JSON Schema as Arrow types ---------------------------------------------------------------

_JSON_SCALARS = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}


JSON_REF_DEPTH_MAX = 32
JSON_REFERENCED_DOCUMENTS_MAX = 256


@dataclass(frozen=True)
class JsonDocuments:
    """A JSON Schema document and the documents its registry references name (reference name
    -> parsed document): `$ref: "customer.json#/definitions/Address"` is a pointer into the
    reference named customer.json, as the registry resolves it (cluster/common/json_refs.py)."""

    root: Any
    docs: dict[str, Any] = field(default_factory=dict)


def json_resolved(schema: Any, refs: JsonDocuments, where: str = "", doc: str | None = None) -> Any:
    """`schema` (in document `doc`, None for the root) with its `$ref` followed (JSON pointers
    in its document or in a referenced one) and its `allOf` merged (properties, required and
    type of every part), as far as its own level; nested levels are resolved when their column
    is made."""
    return _json_resolve(schema, refs, where, (), doc)[0]


def _json_resolve(schema: Any, refs: JsonDocuments, where: str, seen: tuple[str, ...],
                  doc: str | None) -> tuple[Any, tuple[str, ...], str | None]:
    """json_resolved, the references followed to get there (with those of the levels above)
    and the document the result is in."""
    if not isinstance(schema, dict):
        return schema, seen, doc
    at = where or "(root)"
    while "$ref" in schema:
        ref = schema["$ref"]
        if not isinstance(ref, str):
            raise SchemaError(f"JSON Schema {at}: $ref {ref!r} is not a string")
        try:
            target, doc = json_refs.resolve(ref, doc, refs.root, refs.docs)
        except LookupError as exc:
            if ref.partition("#")[0]:
                raise SchemaError(f"JSON Schema {at}: $ref {ref!r} points into another document, and {exc} "
                                  "(another document is one of the schema's references in the registry, "
                                  "by its reference name)") from None
            raise SchemaError(f"JSON Schema {at}: $ref {ref!r} names nothing in the schema ({exc})") from None
        followed = f"{doc or ''}#{ref.partition('#')[2]}"
        if followed in seen or len(seen) >= JSON_REF_DEPTH_MAX:
            raise SchemaError(f"JSON Schema {at}: $ref {ref!r} refers to itself; a recursive type "
                              "does not become a column")
        if not isinstance(target, dict):
            raise SchemaError(f"JSON Schema {at}: $ref {ref!r} is not a schema object")
        seen = (*seen, followed)
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    parts = schema.get("allOf")
    if isinstance(parts, list) and parts:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in parts:
            part = _json_resolve(part, refs, where, seen, doc)[0]
            if not isinstance(part, dict):
                raise SchemaError(f"JSON Schema {at}: an allOf part is not a schema object")
            for name, prop in part.get("properties", {}).items():
                have = merged.setdefault("properties", {})
                if name in have and have[name] != prop:
                    raise SchemaError(f"JSON Schema {at}: allOf declares property {name!r} twice, differently")
                have[name] = prop
            for key, value in part.items():
                if key not in ("properties", "required"):
                    merged.setdefault(key, value)
            if part.get("required"):
                merged["required"] = sorted({*merged.get("required", []), *part["required"]})
        schema = merged
    return schema, seen, doc


def json_arrow_type(schema: Any, refs: JsonDocuments, where: str = "", seen: tuple[str, ...] = (),
                    doc: str | None = None) -> pa.DataType:
    """The Arrow type of a JSON Schema (draft 7 subset: type, properties, items,
    additionalProperties, format date-time/date at the top level of a record; `$ref` within
    its document or into a referenced one, and `allOf`; `seen`: the references followed above)."""
    schema, seen, doc = _json_resolve(schema, refs, where, seen, doc)
    if not isinstance(schema, dict):
        raise SchemaError(f"JSON Schema {where or '(root)'}: {json.dumps(schema)} is not a schema object")
    kind = schema.get("type")
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if len(others) != 1:
            raise SchemaError(f"JSON Schema {where or '(root)'}: only a type or a type with null becomes a column")
        kind = others[0]
    if kind is None and "oneOf" in schema:
        others = [s for s in schema["oneOf"] if json_resolved(s, refs, where, doc).get("type") != "null"]
        if len(others) == 1:
            return json_arrow_type(others[0], refs, where, seen, doc)
    if kind is None and "properties" in schema:
        kind = "object"  # allOf parts often leave the type to the whole
    if kind in _JSON_SCALARS:
        return _JSON_SCALARS[kind]
    if kind == "array":
        return pa.list_(json_arrow_type(schema.get("items", {}), refs, f"{where}[]", seen, doc))
    if kind == "object":
        if schema.get("properties"):
            return pa.struct([pa.field(n, json_arrow_type(p, refs, f"{where}.{n}", seen, doc))
                              for n, p in schema["properties"].items()])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return pa.map_(pa.string(), json_arrow_type(extra, refs, f"{where}.*", seen, doc))
    raise SchemaError(f"JSON Schema {where or '(root)'}: type {kind!r} does not become a column")


def _json_column_type(schema: Any, refs: JsonDocuments, where: str, doc: str | None = None) -> pa.DataType:
    """A column's type: json_arrow_type, a string of format date-time a timestamp, of format
    date a date."""
    kind = json_arrow_type(schema, refs, where, (), doc)
    resolved = json_resolved(schema, refs, where, doc)
    fmt = resolved.get("format") if isinstance(resolved, dict) else None
    if kind == pa.string() and fmt == "date-time":
        return TIMESTAMP_TYPE
    if kind == pa.string() and fmt == "date":
        return pa.date32()
    return kind


def json_documents(text: str, referenced: dict[str, str] | None = None) -> JsonDocuments:
    """A schema's text and its referenced schemas' (reference name -> text), parsed."""
    docs = {}
    for name, body in (referenced or {}).items():
        try:
            docs[name] = json.loads(body)
        except ValueError as exc:
            raise SchemaError(f"JSON Schema reference {name!r} is not JSON: {exc}") from None
    return JsonDocuments(json.loads(text), docs)


def json_columns(text: str, referenced: dict[str, str] | None = None) -> list[tuple[str, pa.DataType]]:
    """A JSON Schema object's properties as (column, Arrow type); top-level strings of format
    date-time are timestamps, of format date dates. `referenced`: the schemas its registry
    references name (reference name -> text), which its `$ref` may point into."""
    refs = json_documents(text, referenced)
    schema, _, doc = _json_resolve(refs.root, refs, "", (), None)
    if not isinstance(schema, dict) or not schema.get("properties"):
        raise SchemaError("a typed table's JSON Schema must be an object with properties")
    return [(name, _json_column_type(prop, refs, name, doc)) for name, prop in schema["properties"].items()]


def json_is_object(text: str, referenced: dict[str, str] | None = None) -> bool:
    """Whether a JSON Schema describes objects (a record), not a string, number, array...
    (a primitive key: `record_key` holds the value itself)."""
    refs = json_documents(text, referenced)
    schema = json_resolved(refs.root, refs)
    if not isinstance(schema, dict):
        return True  # `true`/`false` schemas: json_columns refuses them with its message
    kind = schema.get("type")
    kinds = [k for k in kind if k != "null"] if isinstance(kind, list) else [kind]
    return kinds == ["object"] or (kind is None and ("properties" in schema or "additionalProperties" in schema))


def json_value_column(text: str, referenced: dict[str, str] | None = None) -> pa.DataType:
    """The type of a primitive JSON key (a string of format date-time: a timestamp)."""
    refs = json_documents(text, referenced)
    return _json_column_type(refs.root, refs, "")


# ---- the table's plan (driver) and decoding (executors) ------------------------------------------


@dataclass(frozen=True)
class TypedTable:
    """What a task needs to decode a typed topic (pickled to the executors)."""

    topic: str
    registry_url: str
    loaded_cluster: str
    readers: tuple[tuple[str, int, str], ...]
    """(context, schema id, Avro text): the latest version of the subject per context."""
    columns: tuple[tuple[str, pa.DataType], ...]
    poison: str = "dead-letter"
    format: str = "AVRO"
    """AVRO, JSON or PROTOBUF (every context's latest version has this type)."""
    access: RegistryAccess = NO_ACCESS
    key: TypedTable | None = None
    """The key side (keys decoded into the struct column `record_key`), or None: keys stay bytes."""
    contexts: tuple[tuple[str, str], ...] = ()
    """Source cluster -> the registry context of its schema ids (its flow's schema_context)."""
    primitive: bool = False
    """A key whose Avro or JSON schema is a primitive type (a string, a long): `record_key` holds the
    value itself; decoded as a record of one field, PRIMITIVE_KEY_FIELD."""
    _cache: dict[Any, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def output_schema(self) -> pa.Schema:
        """The typed columns the table has: the value's, then `record_key` for a typed key."""
        extra = [] if self.key is None else [pa.field(KEY_COLUMN, self.key.key_type)]
        return pa.schema([*self.schema, *extra])

    @property
    def key_type(self) -> pa.DataType:
        """The type of `record_key` when this is a key side: its struct, or its primitive type."""
        return self.columns[0][1] if self.primitive else self.struct

    @property
    def output_columns(self) -> list[tuple[str, pa.DataType]]:
        return [(f.name, f.type) for f in self.output_schema]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, t) for n, t in self.columns])

    @property
    def struct(self) -> pa.DataType:
        return pa.struct(list(self.schema))


def subject_candidates(topic: str, context: str, subject: str, role: str = "value",
                       sources: tuple[tuple[str, str, str | None], ...] = ()) -> list[str]:
    """Subjects to look up (TopicNameStrategy): the topic's, and in a source's context also
    the source topic's: the name the flow into this cluster gave it, read back through its
    `rename` (`sources`: source cluster, context, source topic or None), or, in a context no
    flow names, the topic without a `<context>.` prefix (`east.orders` was `orders` in east).
    `role`: value or key."""
    if subject:
        return [subject]
    names = [f"{topic}-{role}"]
    flows = [source_topic for _, c, source_topic in sources if c == context]
    if flows:
        names.extend(f"{t}-{role}" for t in flows if t is not None and f"{t}-{role}" not in names)
        return names
    prefix = context[1:] + "."
    if context and topic.startswith(prefix):
        names.append(f"{topic[len(prefix):]}-{role}")
    return names


def plan_typed_table(topic: str, registry_url: str, loaded_cluster: str, subject: str, poison: str,
                     reader: RegistryReader | None = None, *,
                     access: RegistryAccess = NO_ACCESS, role: str = "value",
                     key_subject: str | None = None,
                     sources: tuple[tuple[str, str, str | None], ...] = ()) -> TypedTable:
    """The table's reader schemas and columns, from the registry now (driver side). `role`
    "key" plans the key side; `key_subject` (not None) plans the key too, as `TypedTable.key`.
    `sources`: the flows into the loaded cluster that copy schemas (WarehouseSettings.schema_sources)."""
    reader = reader or RegistryReader(registry_url, access)
    readers: list[tuple[str, int, str]] = []
    kinds: list[str] = []
    for context in reader.contexts():
        for name in subject_candidates(topic, context, subject, role, sources):
            got = reader.latest(name, context)
            if got is not None:
                schema_id, kind, text = got
                if kind not in ("AVRO", "JSON", "PROTOBUF"):
                    raise SchemaError(f"subject {qualified(name, context)!r} holds {kind} schemas; typed tables "
                                      "decode Avro, JSON Schema and Protobuf")
                if readers and kinds[0] != kind:
                    raise SchemaError(f"topic {topic!r}: subject {qualified(name, context)!r} holds {kind} schemas, "
                                      f"another context {kinds[0]}; one table takes one format")
                kinds.append(kind)
                readers.append((context, schema_id, text))
                break
    if not readers:
        raise SchemaError(f"no subject for topic {topic!r} in the registry at {registry_url} "
                          f"(looked for {subject or topic + '-' + role} in every context)")
    columns: dict[str, pa.DataType] = {}
    fmt = kinds[0]
    referenced = {(c, i): _json_referenced(reader, i, c) if fmt == "JSON" else {} for c, i, _ in readers}
    primitive = role == "key" and (
        (fmt == "AVRO" and all(not _is_avro_record(text) for _, _, text in readers))
        or (fmt == "JSON" and all(not json_is_object(text, referenced[c, i]) for c, i, text in readers)))
    for context, schema_id, text in readers:
        if primitive:
            found = [(PRIMITIVE_KEY_FIELD, arrow_type(_plain(json.loads(text))) if fmt == "AVRO"
                      else json_value_column(text, referenced[context, schema_id]))]
        else:
            found = _columns_of(reader, fmt, schema_id, context, text, referenced[context, schema_id])
        for name, kind in found:
            if name in columns and columns[name] != kind:
                raise SchemaError(f"topic {topic!r}: field {name!r} is {columns[name]} in one context and {kind} "
                                  f"in context {context or '(default)'} (schema id {schema_id}); one column "
                                  "cannot hold both")
            columns.setdefault(name, kind)
    key = None
    if key_subject is not None:
        if KEY_COLUMN in columns:
            raise SchemaError(f"topic {topic!r}: the value has a field {KEY_COLUMN!r}, the column a typed key "
                              "decodes into; a table cannot take both")
        try:
            key = plan_typed_table(topic, registry_url, loaded_cluster, key_subject, poison, reader, access=access,
                                   role="key", sources=sources)
        except SchemaError as exc:
            raise SchemaError(f"the key of topic {topic!r}: {exc} (typed keys take Avro and JSON Schema records "
                              "and primitives, and Protobuf messages)") from None
    return TypedTable(topic, registry_url, loaded_cluster, tuple(readers), tuple(columns.items()), poison, fmt,
                      access, key, tuple((cluster, context) for cluster, context, _ in sources), primitive)


def _is_avro_record(text: str) -> bool:
    schema = json.loads(text)
    return isinstance(schema, dict) and schema.get("type") == "record"


def _json_referenced(reader: RegistryReader, schema_id: int, context: str) -> dict[str, str]:
    """The schemas a JSON schema id's registry references name, and theirs (reference name ->
    text): the documents its `$ref` may point into."""
    params = None if context == DEFAULT_CONTEXT else {"subject": f":{context}:"}
    body = reader._get(f"/schemas/ids/{schema_id}", params)
    if not body or not body.get("references"):
        return {}
    try:
        bodies = referenced_bodies(reader._get, schema_id, context, body["references"], None,
                                   JSON_REFERENCED_DOCUMENTS_MAX)
    except LookupError as exc:
        raise SchemaError(f"JSON schema id {schema_id} in context {context or '(default)'}: {exc}") from None
    return {name: got["schema"] for name, got in bodies.items()}


def _columns_of(reader: RegistryReader, fmt: str, schema_id: int, context: str,
                text: str, referenced: dict[str, str]) -> list[tuple[str, pa.DataType]]:
    if fmt == "AVRO":
        return record_columns(text)
    if fmt == "JSON":
        return json_columns(text, referenced)
    try:
        schema = fetch_protobuf(reader._get, schema_id, context)
        if schema is None:
            raise SchemaError(f"schema id {schema_id} vanished from context {context or '(default)'} at {reader.url}")
        return schema.columns()
    except ProtobufSchemaError as exc:
        raise SchemaError(f"Protobuf schema id {schema_id} in context {context or '(default)'}: {exc}") from None


def _reader_of(table: TypedTable, context: str) -> Any:
    key = ("reader", context)
    if key not in table._cache:
        text = next((t for c, _, t in table.readers if c == context), None)
        table._cache[key] = None if text is None else parse_avro(text)
    return table._cache[key]


def _writer_of(table: TypedTable, registry: RegistryReader, schema_id: int, context: str,
               where: str) -> Any:
    key = ("writer", context, schema_id)
    if key not in table._cache:
        got = registry.schema_by_id(schema_id, context)
        if got is None:
            raise UnknownSchemaId(f"{where}: schema id {schema_id} is unknown in registry context "
                                 f"{context or '(default)'} at {table.registry_url}; nothing was committed")
        kind, text = got
        if kind != table.format:
            raise TypedLoadError(f"{where}: schema id {schema_id} is a {kind} schema and the table's are "
                                 f"{table.format}; nothing was committed")
        if kind == "PROTOBUF":
            try:
                schema = fetch_protobuf(registry._get, schema_id, context)
                if schema is None:
                    raise UnknownSchemaId(f"{where}: schema id {schema_id} is unknown in registry context "
                                         f"{context or '(default)'} at {table.registry_url}; nothing was committed")
                table._cache[key] = schema
            except ProtobufSchemaError as exc:
                raise TypedLoadError(f"{where}: Protobuf schema id {schema_id}: {exc}; nothing was committed") from None
        else:
            table._cache[key] = parse_avro(text) if kind == "AVRO" else JSON_WRITER
    return table._cache[key]


JSON_WRITER = "JSON"  # JSON payloads are read as they are: the table's columns pick their fields
UNKNOWN_WRITER = "UNKNOWN"  # an id the registry does not know (poison = "dead-letter": a dead letter)


def registry_of(table: TypedTable) -> RegistryReader:
    """The table's registry reader (one per process and table, its answers cached)."""
    if "registry" not in table._cache:
        table._cache["registry"] = RegistryReader(table.registry_url, table.access)
    reg: RegistryReader = table._cache["registry"]
    return reg


def decode_rows(table: TypedTable, rows: pa.RecordBatch, load_id: str,
                partition_columns: list[str]) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """Table rows (stage.ROW_SCHEMA: data columns, then `partition_columns`) -> (rows with the
    typed columns before the partition columns, dead letters with the partition columns).

    Avro batches decode in C (spark_aggregate/avro_batch.py) when it can say exactly what
    fastavro would; the rows it sets aside, and the batches it cannot take, go through the
    per-record fastavro path below, so dead letters and errors are the same."""
    if table.format == "AVRO" and not table.primitive:
        from spark_aggregate import avro_batch

        registry = registry_of(table)
        latest = {c: schema_id for c, schema_id, _ in table.readers}
        offsets, partitions = rows.column("kafka_offset"), rows.column("kafka_partition")

        def writer_of(context: str, schema_id: int, row: int) -> Any:
            where = f"topic {table.topic!r} partition {partitions[row]} offset {offsets[row]}"
            return _writer_of(table, registry, schema_id, context, where)

        def reader_of(context: str, schema_id: int) -> Any:
            return None if latest.get(context) == schema_id else _reader_of(table, context)

        fast = avro_batch.decode_values(table, rows, writer_of, reader_of,
                                        lambda cluster: context_of(cluster, table.loaded_cluster, table.contexts))
        if fast is not None:
            dead = _decode_rows_per_record(table, rows.take(pa.array(fast.bad_rows, pa.int64())), load_id,
                                           partition_columns)
            if dead[0].num_rows == 0:  # else fastavro reads a row C would not: fastavro decodes all
                kept = rows.filter(pa.array(fast.good, pa.bool_()))
                return _with_typed_columns(table, kept, fast.columns, partition_columns), dead[1]
    return _decode_rows_per_record(table, rows, load_id, partition_columns)


def _with_typed_columns(table: TypedTable, kept: pa.RecordBatch, typed: list[pa.Array],
                        partition_columns: list[str]) -> pa.RecordBatch:
    data_names = [n for n in kept.schema.names if n not in partition_columns]
    return pa.RecordBatch.from_arrays(
        [kept.column(n) for n in data_names] + typed + [kept.column(n) for n in partition_columns],
        schema=pa.schema([*(kept.schema.field(n) for n in data_names), *table.schema,
                          *(kept.schema.field(n) for n in partition_columns)]))


def _decode_rows_per_record(table: TypedTable, rows: pa.RecordBatch, load_id: str,
                            partition_columns: list[str]) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """decode_rows with fastavro, one call per record."""
    from fastavro import schemaless_reader
    from fastavro._read_common import SchemaResolutionError

    registry = registry_of(table)
    values = rows.column("value").to_pylist()
    clusters = rows.column("source_cluster").to_pylist()
    offsets = rows.column("kafka_offset").to_pylist()
    partitions = rows.column("kafka_partition").to_pylist()
    records: list[dict[str, Any]] = []
    record_rows: list[int] = []  # the row of each record (its values are checked by Arrow below)
    latest = {c: schema_id for c, schema_id, _ in table.readers}
    contexts: dict[str | None, str] = {}
    resolved: dict[tuple[str, int], tuple[Any, Any]] = {}
    good: list[bool] = []
    reasons: list[str | None] = []
    ids: list[int | None] = []
    for i, value in enumerate(values):
        reason = None
        schema_id = None
        if value is None:
            reason = "no value"
        elif len(value) < WIRE_HEADER_BYTES:
            reason = f"{len(value)} bytes, shorter than the wire format's 5-byte header"
        elif value[0] != MAGIC_BYTE:
            reason = f"magic byte {value[0]}, not 0"
        else:
            schema_id = int.from_bytes(value[1:5], "big")
            cluster = clusters[i]
            context = contexts.get(cluster)
            if context is None:
                context = contexts[cluster] = context_of(cluster, table.loaded_cluster, table.contexts)
            schemas = resolved.get((context, schema_id))
            if schemas is None:
                where = f"topic {table.topic!r} partition {partitions[i]} offset {offsets[i]}"
                try:
                    writer = _writer_of(table, registry, schema_id, context, where)
                except UnknownSchemaId:
                    if table.poison == "fail":
                        raise
                    writer = UNKNOWN_WRITER
                # Written with the latest version: no schema resolution needed.
                reader = (None if latest.get(context) == schema_id or table.format != "AVRO"
                          or writer is UNKNOWN_WRITER else _reader_of(table, context))
                schemas = resolved[(context, schema_id)] = (writer, reader)
            writer, reader = schemas
            if writer is UNKNOWN_WRITER:
                reason = (f"schema id {schema_id} {UNKNOWN_ID_REASON} {context or '(default)'} "
                          f"at {table.registry_url}")
            elif isinstance(writer, ProtobufFile):
                try:
                    records.append(writer.decode(memoryview(value)[WIRE_HEADER_BYTES:]))
                    record_rows.append(i)
                except PoisonPayload as exc:
                    reason = f"payload does not decode with schema id {schema_id}: {exc}"
                except ProtobufSchemaError as exc:
                    raise TypedLoadError(f"topic {table.topic!r} partition {partitions[i]} offset {offsets[i]}: "
                                         f"schema id {schema_id} cannot be read into the table: {exc}; nothing "
                                         "was committed") from None
            elif writer is JSON_WRITER:
                try:
                    record = orjson.loads(memoryview(value)[WIRE_HEADER_BYTES:])
                except orjson.JSONDecodeError as exc:
                    reason = f"payload is not JSON (schema id {schema_id}): {exc}"
                else:
                    if table.primitive:
                        records.append({PRIMITIVE_KEY_FIELD: record})
                        record_rows.append(i)
                    elif isinstance(record, dict):
                        records.append(record)
                        record_rows.append(i)
                    else:
                        reason = f"payload of schema id {schema_id} is JSON but not an object"
            else:
                stream = io.BytesIO(value)
                stream.seek(WIRE_HEADER_BYTES)
                try:
                    record = schemaless_reader(stream, writer, reader)
                except SchemaResolutionError as exc:
                    where = f"topic {table.topic!r} partition {partitions[i]} offset {offsets[i]}"
                    raise TypedLoadError(f"{where}: schema id {schema_id} cannot be read as the table's schema "
                                         f"(id {next(s for c, s, _ in table.readers if c == context)}, the latest "
                                         f"version in context {context or '(default)'}): {exc}; nothing was "
                                         "committed") from None
                except Exception as exc:  # noqa: BLE001 - any payload its own schema cannot read is poison
                    reason = f"payload does not decode with schema id {schema_id}: {type(exc).__name__}: {exc}"
                else:
                    if stream.tell() != len(value):
                        reason = (f"{len(value) - stream.tell()} bytes left after the record of schema id "
                                  f"{schema_id}")
                    elif table.primitive:
                        records.append({PRIMITIVE_KEY_FIELD: record})
                        record_rows.append(i)
                    elif not isinstance(record, dict):
                        reason = f"schema id {schema_id} is not a record schema"
                    else:
                        records.append(record)
                        record_rows.append(i)
        if reason is not None and table.poison == "fail":
            raise TypedLoadError(f"topic {table.topic!r} partition {partitions[i]} offset "
                                 f"{offsets[i]}: poison record ({reason}) and poison = \"fail\"")
        good.append(reason is None)
        reasons.append(reason)
        ids.append(schema_id)
    if table.format == "JSON":
        records = _json_conformant(table, records, record_rows, good, reasons)
    mask = pa.array(good, pa.bool_())
    kept = rows.filter(mask) if not all(good) else rows
    # One struct array from the dicts, then its fields: far cheaper than a list per column.
    try:
        typed = _typed_columns(table, records)
    except _UNFIT as exc:
        # Values a writer schema resolved into the table's schema that its columns cannot hold
        # (Avro lets bytes, a decimal's, be read where the latest version has a string).
        raise _unfit(table, records, record_rows, exc, [
            (partitions[i], offsets[i], ids[i], contexts.get(clusters[i], "")) for i in range(len(values))]) from None
    part_names = partition_columns
    result = _with_typed_columns(table, kept, typed, part_names)
    bad = pc.invert(mask)
    dead = rows.filter(bad)
    dead_reasons = [r for r in reasons if r is not None]
    dead_ids = [s for s, r in zip(ids, reasons, strict=True) if r is not None]
    n = dead.num_rows
    dead_batch = pa.RecordBatch.from_arrays(
        [pa.array([table.topic] * n, pa.string()), dead.column("kafka_partition"), dead.column("kafka_offset"),
         pa.array(dead_reasons, pa.string()), pa.array(dead_ids, pa.int32()), dead.column("key"),
         dead.column("value"), dead.column("timestamp"), dead.column("source_cluster"),
         dead.column("source_partition"), dead.column("source_offset"), pa.array([load_id] * n, pa.string()),
         *(dead.column(c) for c in part_names)],
        schema=pa.schema([*DEAD_LETTER_SCHEMA, *(dead.schema.field(c) for c in part_names)]))
    return result, dead_batch


def _json_struct(table: TypedTable) -> pa.DataType:
    """The JSON columns as Arrow builds them from parsed JSON: timestamps and dates as text."""
    return pa.struct([pa.field(n, pa.string() if t in (TIMESTAMP_TYPE, pa.date32()) else t)
                      for n, t in table.columns])


_UNFIT = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)


def _unfit(table: TypedTable, records: list[dict[str, Any]], record_rows: list[int], exc: BaseException,
           coordinates: list[tuple[int, int, int | None, str]]) -> TypedLoadError:
    """The error naming the first record whose values the table's columns cannot hold."""
    row = record_rows[0] if record_rows else 0
    for record, at in zip(records, record_rows, strict=False):
        try:
            _typed_columns(table, [record])
        except _UNFIT as one:
            exc, row = one, at
            break
    partition, offset, schema_id, context = coordinates[row]
    latest = next((s for c, s, _ in table.readers if c == context), None)
    return TypedLoadError(f"topic {table.topic!r} partition {partition} offset {offset}: schema id {schema_id} "
                          f"cannot be read as the table's schema (id {latest}, the latest version in context "
                          f"{context or '(default)'}): its values do not fit the table's columns "
                          f"({type(exc).__name__}: {exc}); nothing was committed")


def _typed_columns(table: TypedTable, records: list[dict[str, Any]]) -> list[pa.Array]:
    if not table.columns:
        return []
    if table.format in ("AVRO", "PROTOBUF"):
        return pa.array(records, table.struct).flatten()  # type: ignore[no-any-return]
    columns = pa.array(records, _json_struct(table)).flatten()
    return [pc.cast(c, t) if c.type != t else c for c, (_, t) in zip(columns, table.columns, strict=True)]


def _json_conformant(table: TypedTable, records: list[dict[str, Any]], rows: list[int], good: list[bool],
                     reasons: list[str | None]) -> list[dict[str, Any]]:
    """The JSON records whose values fit the columns; the others become poison (their rows
    marked in `good` and `reasons`). One Arrow conversion when all fit."""
    try:
        _typed_columns(table, records)
        return records
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    kept = []
    for record, row in zip(records, rows, strict=True):
        try:
            _typed_columns(table, [record])
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            good[row] = False
            reasons[row] = f"JSON values do not fit the table's columns: {exc}"
            if table.poison == "fail":
                raise TypedLoadError(f"topic {table.topic!r}: poison record ({reasons[row]}) and "
                                     "poison = \"fail\"") from None
        else:
            kept.append(record)
    return kept


def decode_keys(table: TypedTable, rows: pa.RecordBatch, load_id: str,
                partition_columns: list[str]) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """A typed key's half of decoding: decode_rows' output (value columns typed) -> (rows with
    the struct column `record_key` before the partition columns, key dead letters). The key
    side is decoded by decode_rows itself with key and value swapped, so keys follow every rule
    values do (contexts, evolution, poison); a null key reads as a NULL `record_key`, and a
    poison key sends its record to the dead letters with a reason that starts "key: "."""
    key = table.key
    assert key is not None
    names = rows.schema.names
    k_at, v_at = names.index("key"), names.index("value")
    data = len(names) - len(partition_columns)
    struct = key.key_type
    present = rows.column(k_at).is_valid()
    keyed = rows.filter(present)
    swapped = keyed.set_column(k_at, "key", keyed.column(v_at)).set_column(v_at, "value", keyed.column(k_at))
    try:
        good, dead = decode_rows(key, swapped, load_id, partition_columns)
    except TypedLoadError as exc:
        raise TypedLoadError(f"key: {exc}") from None
    width = len(key.columns)
    record_key = (good.columns[data] if key.primitive
                  else pa.StructArray.from_arrays(good.columns[data:data + width], fields=list(key.schema)))
    good = good.set_column(k_at, "key", good.column(v_at)).set_column(v_at, "value", good.column(k_at))
    arrays = [*good.columns[:data], record_key, *good.columns[data + width:]]
    out_schema = pa.schema([*(rows.schema.field(i) for i in range(data)), pa.field(KEY_COLUMN, struct),
                            *(rows.schema.field(i) for i in range(data, len(names)))])
    result = pa.RecordBatch.from_arrays(arrays, schema=out_schema)
    if not pc.all(present).as_py():
        unkeyed = rows.filter(pc.invert(present))
        nulls = pa.nulls(unkeyed.num_rows, struct)
        unkeyed = pa.RecordBatch.from_arrays([*unkeyed.columns[:data], nulls, *unkeyed.columns[data:]],
                                             schema=out_schema)
        both = pa.Table.from_batches([result, unkeyed])
        order = pc.sort_indices(both, [("kafka_partition", "ascending"), ("kafka_offset", "ascending")])
        result = both.take(order).combine_chunks().to_batches()[0] if both.num_rows else result
    if dead.num_rows:
        d_names = dead.schema.names
        dk, dv = d_names.index("key"), d_names.index("value")
        dead = dead.set_column(dk, "key", dead.column(dv)).set_column(dv, "value", dead.column(dk))
        r_at = d_names.index("reason")
        dead = dead.set_column(r_at, "reason", pc.binary_join_element_wise("key: ", dead.column(r_at), ""))
    return result, dead
