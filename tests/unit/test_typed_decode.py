"""spark_aggregate/typed.py without Spark or a registry: Avro types as Arrow/Spark columns,
wire-format decoding per source context, poison records, unknown and incompatible ids."""

from __future__ import annotations

import datetime
import decimal
import io
import json
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from spark_aggregate.columns import arrow_schema
from spark_aggregate.stage import PARTITION_COLUMNS, RowContext, table_batch
from spark_aggregate.typed import (
    TypedLoadError,
    TypedTable,
    arrow_type,
    context_of,
    decode_rows,
    parse_avro,
    record_columns,
    spark_type,
)

V1: dict[str, Any] = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
    {"name": "inner", "type": {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]}},
    {"name": "again", "type": ["null", "In"], "default": None},
    {"name": "m", "type": {"type": "map", "values": {"type": "array", "items": "string"}}},
]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
PARTS = [c for c, *_ in PARTITION_COLUMNS]


def test_avro_types_become_arrow_and_spark_columns() -> None:
    columns = dict(record_columns(json.dumps(V2)))
    assert columns["price"] == pa.decimal128(5, 2)
    assert columns["at"] == pa.timestamp("us", tz="UTC") and columns["day"] == pa.date32()
    assert columns["kind"] == pa.string() and columns["note"] == pa.string()
    assert columns["again"] == columns["inner"] == pa.struct([pa.field("x", pa.int32())])
    assert spark_type(columns["m"]) == "MAP<STRING, ARRAY<STRING>>"
    assert spark_type(columns["inner"]) == "STRUCT<`x`: INT>"
    with pytest.raises(Exception, match="only unions of null and one type"):
        arrow_type(["null", "int", "string"])


def test_contexts_follow_the_source_cluster() -> None:
    assert context_of("east", "aggregate") == ".east"
    assert context_of("aggregate", "aggregate") == "" and context_of(None, "aggregate") == ""


def wire(schema: dict[str, Any], schema_id: int, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def rows_of(values: list[bytes | None], clusters: list[str | None]) -> pa.RecordBatch:
    n = len(values)
    schema = arrow_schema(True, True)
    batch = pa.RecordBatch.from_arrays([
        pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()), pa.array(["t"] * n),
        pa.array([3] * n, pa.int32()), pa.array(range(100, 100 + n), pa.int64()),
        pa.array([1_790_000_000_000_000] * n, schema.field("timestamp").type), pa.array([0] * n, pa.int32()),
        pa.array([[]] * n, schema.field("headers").type), pa.array(clusters, pa.string()),
        pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()), pa.array([None] * n, pa.string()),
        pa.array([None] * n, pa.int32()), pa.array([False] * n)], schema=schema)
    return table_batch(batch, RowContext("aggregate", (("east", "dc-east"), ("west", "dc-west")), "L"))


def table(poison: str = "dead-letter") -> TypedTable:
    """Latest v2 in .east, v1 in .west; writer schemas by (context, id) as a registry would
    answer (the same id 1 is a different schema in each context)."""
    t = TypedTable("t", "http://registry.invalid", "aggregate",
                   ((".east", 2, json.dumps(V2)), (".west", 1, json.dumps(V1))),
                   tuple(record_columns(json.dumps(V2))), poison)
    other = {"type": "record", "name": "O", "fields": [{"name": "zzz", "type": "string"}]}
    t._cache.update({("writer", ".east", 1): parse_avro(json.dumps(V1)), ("writer", ".east", 2): parse_avro(json.dumps(V2)),
                     ("writer", ".west", 1): parse_avro(json.dumps(V1)), ("writer", ".east", 3): parse_avro(json.dumps(other)),
                     "registry": Unknown()})
    return t


class Unknown:
    def schema_by_id(self, schema_id: int, context: str) -> None:
        return None


def record(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "price": decimal.Decimal("1.50"), "at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
            "day": datetime.date(2026, 1, 2), "kind": "B", "inner": {"x": i}, "again": None, "m": {"a": ["b"]},
            **extra}


def test_records_of_each_version_and_context_decode_into_the_columns_and_poison_is_set_aside() -> None:
    good1 = wire(V1, 1, record(1))
    values = [good1, wire(V2, 2, record(2, note="hi")), wire(V1, 1, record(3)), b"\x01" + good1[1:], good1[:8],
              good1 + b"\x00", None, b"\x00\x00"]
    clusters = ["east", "east", "west", "east", "east", "east", "east", "east"]
    good, dead = decode_rows(table(), rows_of(values, clusters), "L", PARTS)
    assert good.column("id").to_pylist() == [1, 2, 3]
    assert good.column("note").to_pylist() == [None, "hi", None]
    assert good.column("inner").to_pylist() == [{"x": 1}, {"x": 2}, {"x": 3}]
    assert good.column("source_dc").to_pylist() == ["dc-east", "dc-east", "dc-west"]
    assert good.schema.names[-2:] == PARTS and good.column("m").to_pylist()[0] == [("a", ["b"])]
    assert dead.column("kafka_offset").to_pylist() == [103, 104, 105, 106, 107]
    assert dead.column("kafka_partition").to_pylist() == [3] * 5
    reasons = dead.column("reason").to_pylist()
    assert reasons[0] == "magic byte 1, not 0" and reasons[1].startswith("payload does not decode with schema id 1")
    assert reasons[2] == "1 bytes left after the record of schema id 1" and reasons[3] == "no value"
    assert reasons[4].endswith("shorter than the wire format's 5-byte header")
    assert dead.column("value").to_pylist()[1] == good1[:8] and dead.column("schema_id").to_pylist()[:3] == [None, 1, 1]


def test_poison_fail_unknown_ids_and_incompatible_writers_stop_naming_the_record() -> None:
    good1 = wire(V1, 1, record(1))
    with pytest.raises(TypedLoadError, match=r"topic 't' partition 3 offset 101: poison record \(magic byte 9"):
        decode_rows(table("fail"), rows_of([good1, b"\x09" + good1[1:]], ["east", "east"]), "L", PARTS)
    unknown = b"\x00\x00\x00\x00\x07" + good1[5:]
    with pytest.raises(TypedLoadError, match=r"topic 't' partition 3 offset 101: schema id 7 is unknown in "
                                             r"registry context \.east"):
        decode_rows(table("fail"), rows_of([good1, unknown], ["east", "east"]), "L", PARTS)
    # Issue 43 (7): under poison = "dead-letter" an unknown id is a dead letter, its id kept.
    good, dead = decode_rows(table(), rows_of([good1, unknown, unknown, good1], ["east"] * 4), "L", PARTS)
    assert good.column("kafka_offset").to_pylist() == [100, 103]
    assert dead.column("kafka_offset").to_pylist() == [101, 102] and dead.column("schema_id").to_pylist() == [7, 7]
    assert dead.column("reason").to_pylist() == [
        "schema id 7 is unknown in registry context .east at http://registry.invalid"] * 2
    assert dead.column("value").to_pylist() == [unknown, unknown]
    with pytest.raises(TypedLoadError, match=r"offset 100: schema id 3 cannot be read as the table's schema"):
        decode_rows(table(), rows_of([wire({"type": "record", "name": "O", "fields": [{"name": "zzz", "type": "string"}]},
                                           3, {"zzz": "q"})], ["east"]), "L", PARTS)


JSON_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
    "day": {"type": "string", "format": "date"}, "tags": {"type": "array", "items": {"type": "string"}},
    "inner": {"type": "object", "properties": {"x": {"type": "number"}}},
    "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
    "note": {"type": ["null", "string"]}}}


def test_json_schema_payloads_decode_into_the_declared_columns() -> None:
    from spark_aggregate.typed import JSON_WRITER, json_columns

    columns = json_columns(json.dumps(JSON_SCHEMA))
    assert dict(columns)["at"] == pa.timestamp("us", tz="UTC") and dict(columns)["counts"] == pa.map_(pa.string(), pa.int64())
    t = TypedTable("t", "http://registry.invalid", "aggregate", ((".east", 4, json.dumps(JSON_SCHEMA)),),
                   tuple(columns), "dead-letter", "JSON")
    t._cache.update({("writer", ".east", 4): JSON_WRITER, "registry": Unknown()})
    head = b"\x00\x00\x00\x00\x04"
    values = [head + json.dumps({"id": 1, "at": "2026-01-02T03:04:05Z", "day": "2026-01-02", "tags": ["a"],
                                 "inner": {"x": 1.5}, "counts": {"a": 2}, "extra": True}).encode(),
              head + b'{"id": 2}', head + b"not json", head + b"[1]", head + b'{"id": "two"}']
    good, dead = decode_rows(t, rows_of(values, ["east"] * 5), "L", PARTS)
    assert good.column("id").to_pylist() == [1, 2]
    assert good.column("at").to_pylist()[0] == datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert good.column("day").to_pylist() == [datetime.date(2026, 1, 2), None]
    assert good.column("inner").to_pylist() == [{"x": 1.5}, None] and good.column("note").to_pylist() == [None, None]
    assert dead.column("kafka_offset").to_pylist() == [102, 103, 104]
    reasons = dead.column("reason").to_pylist()
    assert reasons[0].startswith("payload is not JSON") and reasons[1].endswith("JSON but not an object")
    assert reasons[2].startswith("JSON values do not fit the table's columns")


def test_a_writer_whose_values_do_not_fit_the_columns_stops_naming_the_record() -> None:
    """Issue 43 (5): a NONE subject where `price` went from decimal to string. The table's
    columns are the latest version's (string); Avro resolution reads the older decimal bytes
    as a string's place (bytes and string promote), and the values must not reach Arrow: the
    load stops naming topic, partition, offset and schema id, and what it said is readable."""
    v4 = {**V2, "fields": [{"name": "price", "type": "string"} if f["name"] == "price" else f for f in V2["fields"]]}
    t = TypedTable("t", "http://registry.invalid", "aggregate", ((".east", 4, json.dumps(v4)),),
                   tuple(record_columns(json.dumps(v4))), "dead-letter")
    t._cache.update({("writer", ".east", 1): parse_avro(json.dumps(V1)), ("writer", ".east", 4): parse_avro(json.dumps(v4)),
                     "registry": Unknown()})
    newer = wire(v4, 4, record(1, price="1.50"))
    older = wire(V1, 1, record(2))
    good, _ = decode_rows(t, rows_of([newer, newer], ["east", "east"]), "L", PARTS)
    assert good.column("price").to_pylist() == ["1.50", "1.50"]
    for poison in ("dead-letter", "fail"):
        with pytest.raises(TypedLoadError, match=r"topic 't' partition 3 offset 101: schema id 1 cannot be read as "
                                                 r"the table's schema \(id 4, the latest version in context \.east\)"):
            decode_rows(TypedTable(t.topic, t.registry_url, t.loaded_cluster, t.readers, t.columns, poison,
                                   _cache=dict(t._cache)),
                        rows_of([newer, older, newer], ["east", "east", "east"]), "L", PARTS)


def test_an_error_whose_text_needs_the_gone_jvm_is_still_told() -> None:
    """Issue 43 (5): the load's error report called str() on a Py4J error after the session
    stopped, which asserts SparkContext._jvm; the report must say what it kept instead."""
    from spark_aggregate.session import exception_text

    class JvmGone(Exception):
        errmsg = "An error occurred while calling o123.save"

        def __str__(self) -> str:
            raise AssertionError("SparkContext._jvm is None")

    assert exception_text(JvmGone()) == "An error occurred while calling o123.save"
    assert exception_text(ValueError("plain")) == "plain"


def test_json_schema_refs_and_all_of_become_columns() -> None:
    """Issue 43 (8): `$ref` within the schema (definitions, $defs, JSON pointers) and `allOf`
    (what JSON Schema generators write for shared and composed types) become columns."""
    from spark_aggregate.typed import JSON_WRITER, SchemaError, json_columns

    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"Money": {"type": "object", "properties": {"units": {"type": "integer"},
                                                                  "currency": {"type": "string"}}},
                        "When": {"type": "string", "format": "date-time"}},
        "$defs": {"Base": {"properties": {"id": {"type": "integer"}}, "required": ["id"]}},
        "allOf": [{"$ref": "#/$defs/Base"},
                  {"type": "object", "properties": {
                      "price": {"$ref": "#/definitions/Money"},
                      "at": {"$ref": "#/definitions/When"},
                      "history": {"type": "array", "items": {"$ref": "#/definitions/Money"}},
                      "tag": {"allOf": [{"type": "string"}, {"maxLength": 8}]}}}]}
    columns = dict(json_columns(json.dumps(schema)))
    money = pa.struct([pa.field("units", pa.int64()), pa.field("currency", pa.string())])
    assert columns == {"id": pa.int64(), "price": money, "at": pa.timestamp("us", tz="UTC"),
                       "history": pa.list_(money), "tag": pa.string()}
    t = TypedTable("t", "http://registry.invalid", "aggregate", ((".east", 4, json.dumps(schema)),),
                   tuple(columns.items()), "dead-letter", "JSON")
    t._cache.update({("writer", ".east", 4): JSON_WRITER, "registry": Unknown()})
    value = {"id": 3, "price": {"units": 5, "currency": "EUR"}, "at": "2026-01-02T03:04:05Z",
             "history": [{"units": 1, "currency": "USD"}], "tag": "x"}
    good, dead = decode_rows(t, rows_of([b"\x00\x00\x00\x00\x04" + json.dumps(value).encode()], ["east"]), "L", PARTS)
    assert dead.num_rows == 0
    assert good.column("price").to_pylist() == [{"units": 5, "currency": "EUR"}]
    assert good.column("history").to_pylist() == [[{"units": 1, "currency": "USD"}]]
    for bad, problem in (
            ({"properties": {"a": {"$ref": "other.json#/X"}}}, "points into another document"),
            ({"definitions": {"N": {"type": "object", "properties": {"next": {"$ref": "#/definitions/N"}}}},
              "properties": {"a": {"$ref": "#/definitions/N"}}}, "refers to itself"),
            ({"properties": {"a": {"$ref": "#/definitions/Missing"}}}, "names nothing"),
            ({"allOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"a": {"type": "integer"}}}]},
             "declares property 'a' twice")):
        with pytest.raises(SchemaError, match=problem):
            json_columns(json.dumps(bad))


def test_json_schema_refs_into_referenced_documents_become_columns() -> None:
    """Issue 43: `$ref` into another document, one of the schema's registry references by its
    reference name (`address.json#/definitions/Address`), and from there pointers within that
    document and into a third; the registry answers the references (and theirs) once each."""
    from spark_aggregate.typed import SchemaError, json_columns, plan_typed_table

    address = {"definitions": {"Address": {"type": "object", "properties": {
        "city": {"type": "string"}, "geo": {"$ref": "#/definitions/Geo"}, "since": {"$ref": "time.json"}}},
        "Geo": {"type": "object", "properties": {"lat": {"type": "number"}}}}}
    time = {"type": "string", "format": "date-time"}
    order = {"type": "object", "properties": {"id": {"type": "integer"},
                                              "ship_to": {"$ref": "address.json#/definitions/Address"},
                                              "placed": {"$ref": "time.json"}}}
    columns = dict(json_columns(json.dumps(order), {"address.json": json.dumps(address), "time.json": json.dumps(time)}))
    assert columns == {"id": pa.int64(), "ship_to": pa.struct([
        pa.field("city", pa.string()), pa.field("geo", pa.struct([pa.field("lat", pa.float64())])),
        pa.field("since", pa.string())]), "placed": pa.timestamp("us", tz="UTC")}
    with pytest.raises(SchemaError, match=r"ship_to: \$ref 'address.json#/definitions/Address' points into another "
                                          r"document, and 'address.json' is not one of the schema's references"):
        json_columns(json.dumps(order), {"time.json": json.dumps(time)})
    loop = {"definitions": {"A": {"type": "object", "properties": {"b": {"$ref": "main.json#/definitions/B"}}}}}
    main = {"definitions": {"B": {"type": "object", "properties": {"a": {"$ref": "loop.json#/definitions/A"}}}},
            "properties": {"x": {"$ref": "#/definitions/B"}}}
    with pytest.raises(SchemaError, match="refers to itself"):
        json_columns(json.dumps(main), {"loop.json": json.dumps(loop), "main.json": json.dumps(main)})

    asked: list[str] = []

    class Registry:
        url = "http://registry.invalid"

        def contexts(self) -> list[str]:
            return [".east"]

        def latest(self, name: str, context: str) -> tuple[int, str, str] | None:
            return (9, "JSON", json.dumps(order)) if name == "t-value" else None

        def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
            asked.append(path)
            return {"/schemas/ids/9": {"schema": json.dumps(order), "schemaType": "JSON", "references": [
                        {"name": "address.json", "subject": "address", "version": 2},
                        {"name": "time.json", "subject": "time", "version": 1}]},
                    "/subjects/%3A.east%3Aaddress/versions/2": {"schema": json.dumps(address), "references": [
                        {"name": "time.json", "subject": "time", "version": 1}]},
                    "/subjects/%3A.east%3Atime/versions/1": {"schema": json.dumps(time)}}.get(path)

    t = plan_typed_table("t", "http://registry.invalid", "aggregate", "", "dead-letter", Registry())  # type: ignore[arg-type]
    assert dict(t.columns) == columns and t.format == "JSON"
    assert sorted(asked) == ["/schemas/ids/9", "/subjects/%3A.east%3Aaddress/versions/2",
                             "/subjects/%3A.east%3Atime/versions/1"]


@pytest.mark.parametrize(("schema", "keys", "arrow", "expected"), [
    ({"type": "string"}, ['"k-1"', '"k-2"'], pa.string(), ["k-1", "k-2"]),
    ({"type": "integer"}, ["7", str(-(2**62))], pa.int64(), [7, -(2**62)]),
    ({"type": ["null", "string"], "format": "date-time"}, ['"2026-01-02T03:04:05Z"', "null"],
     pa.timestamp("us", tz="UTC"), [datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), None]),
])
def test_primitive_json_keys_decode_into_record_key_itself(schema: dict[str, Any], keys: list[str],
                                                            arrow: pa.DataType, expected: list[Any]) -> None:
    """Issue 43: a key whose JSON Schema is not an object (what JSONSerializer writes for a
    string or integer key) reads into `record_key` as the value itself; a key payload that is
    not of that type is a dead letter starting "key: "."""
    from spark_aggregate.typed import JSON_WRITER, KEY_COLUMN, decode_keys, plan_typed_table

    class Registry:
        url = "http://registry.invalid"

        def contexts(self) -> list[str]:
            return [".east"]

        def latest(self, name: str, context: str) -> tuple[int, str, str] | None:
            return {"t-value": (1, "AVRO", json.dumps(V1)), "t-key": (6, "JSON", json.dumps(schema))}.get(name)

        def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
            return {"schema": json.dumps(schema), "schemaType": "JSON"}

    t = plan_typed_table("t", "http://registry.invalid", "aggregate", "", "dead-letter", Registry(),  # type: ignore[arg-type]
                         key_subject="")
    assert t.key is not None and t.key.primitive and t.output_schema.field(KEY_COLUMN).type == arrow
    t._cache.update({("writer", ".east", 1): parse_avro(json.dumps(V1)), "registry": Unknown()})
    t.key._cache.update({("writer", ".east", 6): JSON_WRITER, "registry": Unknown()})
    values = [wire(V1, 1, record(i)) for i in range(4)]
    raw = [b"\x00\x00\x00\x00\x06" + k.encode() for k in [*keys, '{"an": "object"}']]
    rows = rows_of(values, ["east"] * 4)
    rows = rows.set_column(rows.schema.names.index("key"), "key", pa.array([raw[0], None, raw[1], raw[2]], pa.binary()))
    typed, _ = decode_rows(t, rows, "L", PARTS)
    good, dead = decode_keys(t, typed, "L", PARTS)
    assert good.column(KEY_COLUMN).to_pylist() == [expected[0], None, expected[1]]
    assert good.schema.field(KEY_COLUMN).type == arrow
    assert dead.column("kafka_offset").to_pylist() == [103]
    assert dead.column("reason").to_pylist()[0].startswith("key: JSON values do not fit the table's columns")
