"""The C batch decoder of typed Avro tables (spark_aggregate/avro_batch.py, _avro.c) against the
per-record fastavro path it replaces: the same Arrow arrays, buffer by buffer, for many schemas,
writer/reader pairs and records, and for corrupted payloads the same poison records (seeded,
derandomized; a failure prints its seed and case)."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import random
import re
import struct
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from spark_aggregate import avro_batch
from spark_aggregate.stage import PARTITION_COLUMNS
from spark_aggregate.typed import (
    TypedLoadError,
    TypedTable,
    arrow_type,
    decode_rows,
    parse_avro,
    record_columns,
)
from tests.unit.test_typed_decode import rows_of

pytestmark = pytest.mark.skipif(not avro_batch.available(), reason="spark_aggregate._avro is not built")

SEED = 20261127
PARTS = [c for c, *_ in PARTITION_COLUMNS]


def dec(precision: int, scale: int, base: str = "bytes", **extra: Any) -> dict[str, Any]:
    return {"type": base, "logicalType": "decimal", "precision": precision, "scale": scale, **extra}


ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "string"], "default": None},
    {"name": "geo", "type": {"type": "array", "items": "double"}}]}
STATUS = {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}
EVERYTHING: dict[str, Any] = {"type": "record", "name": "Everything", "namespace": "t", "fields": [
    {"name": "flag", "type": "boolean"},
    {"name": "i", "type": "int"},
    {"name": "l", "type": "long"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "raw", "type": "bytes"},
    {"name": "text", "type": "string"},
    {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
    {"name": "status", "type": STATUS},
    {"name": "amount", "type": dec(9, 2)},
    {"name": "big", "type": dec(38, 10)},
    {"name": "fixed_amount", "type": dec(18, 4, "fixed", name="Money", size=8)},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "local_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "maybe_longs", "type": {"type": "array", "items": ["null", "long"]}},
    {"name": "attrs", "type": {"type": "map", "values": "double"}},
    {"name": "homes", "type": {"type": "map", "values": ADDRESS}},
    {"name": "address", "type": "Address"},
    {"name": "maybe_address", "type": ["null", "Address"], "default": None},
    {"name": "note", "type": ["string", "null"]},
    {"name": "maybe_status", "type": ["null", "Status"], "default": None},
    {"name": "nested", "type": {"type": "array", "items": {"type": "map", "values": {
        "type": "array", "items": ["null", "Address"]}}}},
]}

# Evolution: the same record as an older writer (fields the reader adds with defaults) and a
# newer writer (fields the reader does not know, skipped), promotions and renames.
READER: dict[str, Any] = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "qty", "type": "double"},
    {"name": "weight", "type": "float"},
    {"name": "price", "type": "double"},
    {"name": "label", "type": "bytes"},
    {"name": "title", "type": "string"},
    {"name": "customer", "type": "string", "aliases": ["client"]},
    {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["A", "B"], "default": "A"}},
    {"name": "strict", "type": {"type": "enum", "name": "Strict", "symbols": ["X", "Y"]}},
    {"name": "maybe", "type": ["null", "long"], "default": None},
    {"name": "plain", "type": ["null", "string"], "default": None},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "count", "type": "int", "default": 7},
    {"name": "ratio", "type": "double", "default": 1.5},
    {"name": "on", "type": "boolean", "default": True},
    {"name": "word", "type": "string", "default": "fé"},
    {"name": "blob", "type": "bytes", "default": "\u00ff"},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["P", "Q"]}, "default": "Q"},
    {"name": "list", "type": {"type": "array", "items": "int"}, "default": [1, 2]},
    {"name": "dict", "type": {"type": "map", "values": "long"}, "default": {"a": 1}},
    {"name": "point", "type": {"type": "record", "name": "P", "fields": [
        {"name": "x", "type": "int"}, {"name": "y", "type": ["null", "string"], "default": None}]},
     "default": {"x": 3}},
    {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 1000},
]}
OLD_WRITER: dict[str, Any] = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "int"},                                   # int -> long
    {"name": "qty", "type": "int"},                                  # int -> double
    {"name": "weight", "type": "long"},                              # long -> float
    {"name": "price", "type": "float"},                              # float -> double
    {"name": "label", "type": "string"},                             # string -> bytes
    {"name": "title", "type": "bytes"},                              # bytes -> string
    {"name": "client", "type": "string"},                            # renamed: alias
    {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["A", "B", "C"]}},  # C -> default
    {"name": "strict", "type": {"type": "enum", "name": "Strict", "symbols": ["X", "Y", "Z"]}},  # Z: no default
    {"name": "maybe", "type": "int"},                                # int -> [null, long]
    {"name": "plain", "type": "string"},                             # string -> [null, string]
]}
# (Skipped arrays hold no float, double, boolean or fixed items: fastavro skips those without
# looking for the end of the payload, so a corrupted count of 2^31 of them spins for minutes, on
# the fastavro path before this decoder as now.)
GONE = {"type": "record", "name": "Gone", "fields": [
    {"name": "city", "type": "string"}, {"name": "codes", "type": {"type": "array", "items": "long"}},
    {"name": "extra", "type": {"type": "map", "values": ["null", "bytes"]}}, {"name": "when", "type": "double"}]}
NEW_WRITER: dict[str, Any] = {"type": "record", "name": "Order", "fields": [
    {"name": "gone_bool", "type": "boolean"},
    {"name": "id", "type": "long"},
    {"name": "gone_map", "type": {"type": "map", "values": {"type": "array", "items": GONE}}},
    {"name": "qty", "type": "double"},
    {"name": "weight", "type": "float"},
    {"name": "price", "type": "double"},
    {"name": "label", "type": "bytes"},
    {"name": "gone_fixed", "type": {"type": "fixed", "name": "Three", "size": 3}},
    {"name": "title", "type": "string"},
    {"name": "customer", "type": "string"},
    {"name": "gone_union", "type": ["null", "double", "string", STATUS]},
    {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["A", "B"]}},
    {"name": "strict", "type": {"type": "enum", "name": "Strict", "symbols": ["X", "Y"]}},
    {"name": "maybe", "type": ["null", "long"]},
    {"name": "plain", "type": ["null", "string"]},
    {"name": "note", "type": ["null", "string"]},
    {"name": "gone_float", "type": "float"},
    {"name": "count", "type": "int"},
    {"name": "ratio", "type": "double"},
    {"name": "on", "type": "boolean"},
    {"name": "word", "type": "string"},
    {"name": "blob", "type": "bytes"},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["P", "Q"]}},
    {"name": "list", "type": {"type": "array", "items": "int"}},
    {"name": "dict", "type": {"type": "map", "values": "long"}},
    {"name": "point", "type": {"type": "record", "name": "P", "fields": [
        {"name": "x", "type": "int"}, {"name": "y", "type": ["null", "string"]},
        {"name": "gone_z", "type": "long"}]}},
    {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "gone_array", "type": {"type": "array", "items": ["null", "bytes"]}},
]}
# Unions the reader narrows: a null the reader cannot take is a schema resolution error.
NARROWING_WRITER = {"type": "record", "name": "N", "fields": [{"name": "v", "type": ["null", "string"]}]}
NARROWING_READER = {"type": "record", "name": "N", "fields": [{"name": "v", "type": "string"}]}

PAIRS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "everything": (EVERYTHING, None),
    "everything-as-reader": (EVERYTHING, {**EVERYTHING, "fields": [  # another field order
        EVERYTHING["fields"][-3], EVERYTHING["fields"][1], EVERYTHING["fields"][0],
        *(f for f in EVERYTHING["fields"][2:] if f["name"] != "note")]}),
    "older-writer": (OLD_WRITER, READER),
    "newer-writer": (NEW_WRITER, READER),
    "same-as-latest": (READER, None),
    "narrowing-union": (NARROWING_WRITER, NARROWING_READER),
}


# ---- random records of a schema -------------------------------------------------------------------

def random_value(schema: Any, rnd: random.Random, named: dict[str, Any], depth: int = 0) -> Any:
    if isinstance(schema, str):
        if schema in named:
            return random_value(named[schema], rnd, named, depth)
        short = schema.split(".")[-1]
        if short in named:
            return random_value(named[short], rnd, named, depth)
        schema = {"type": schema}
    if isinstance(schema, list):
        branch = rnd.choice(schema)
        return random_value(branch, rnd, named, depth + 1)
    kind = schema["type"]
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind in named):
        return random_value(kind, rnd, named, depth)
    if "name" in schema and kind in ("record", "enum", "fixed"):
        named[schema["name"]] = schema
        if "namespace" in schema:
            named[f"{schema['namespace']}.{schema['name']}"] = schema
    logical = schema.get("logicalType")
    if logical == "decimal":
        digits = rnd.randrange(0, schema["precision"] + 1)
        unscaled = rnd.choice([0, 1, -1, rnd.randrange(-10**digits + 1, 10**digits) if digits else 0,
                               10**schema["precision"] - 1, -(10**schema["precision"]) + 1])
        return decimal.Decimal(unscaled).scaleb(-schema.get("scale", 0), decimal.Context(prec=100))
    if logical == "date":
        return rnd.choice([datetime.date.min, datetime.date.max, datetime.date(1970, 1, 1),
                           datetime.date(1969, 12, 31), datetime.date(2026, 11, 27)])
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros"):
        base = rnd.choice([datetime.datetime(1, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999000),
                           datetime.datetime(1970, 1, 1), datetime.datetime(1969, 12, 31, 23, 59, 59, 999000),
                           datetime.datetime(2026, 11, 27, 6, 0, 0, rnd.randrange(1000) * 1000)])
        return base if logical.startswith("local") else base.replace(tzinfo=datetime.UTC)
    if logical == "uuid":
        return "1b4e28ba-2fa1-11d2-883f-0016cb" + f"{rnd.randrange(16**6):06x}"
    if kind == "null":
        return None
    if kind == "boolean":
        return rnd.random() < 0.5
    if kind == "int":
        return rnd.choice([0, -1, 1, 2**31 - 1, -(2**31), rnd.randrange(-1000, 1000)])
    if kind == "long":
        return rnd.choice([0, -1, 2**63 - 1, -(2**63), 2**31, rnd.randrange(-10**12, 10**12)])
    if kind in ("float", "double"):
        return rnd.choice([0.0, -0.0, 1.5, -2.25, float("inf"), float("-inf"), 3.4e38, 1e-45, rnd.uniform(-1e6, 1e6)])
    if kind == "string":
        return "".join(rnd.choice("aZ0 éß中😀\u0000\u07ff\uffff") for _ in range(rnd.randrange(0, 6)))
    if kind == "bytes":
        return bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 6)))
    if kind == "fixed":
        return bytes(rnd.randrange(256) for _ in range(schema["size"]))
    if kind == "enum":
        return rnd.choice(schema["symbols"])
    if kind == "array":
        n = rnd.choice([0, 0, 1, 3]) if depth < 4 else 0
        return [random_value(schema["items"], rnd, named, depth + 1) for _ in range(n)]
    if kind == "map":
        n = rnd.choice([0, 1, 3]) if depth < 4 else 0
        return {f"k{i}é": random_value(schema["values"], rnd, named, depth + 1) for i in range(n)}
    if kind == "record":
        return {f["name"]: random_value(f["type"], rnd, named, depth + 1) for f in schema["fields"]}
    raise AssertionError(kind)


def names_of(schema: Any, named: dict[str, Any]) -> dict[str, Any]:
    """The named types a schema defines, by name and full name."""
    if isinstance(schema, list):
        for s in schema:
            names_of(s, named)
    elif isinstance(schema, dict):
        if "name" in schema and schema.get("type") in ("record", "enum", "fixed"):
            named[schema["name"]] = schema
            if "namespace" in schema:
                named[f"{schema['namespace']}.{schema['name']}"] = schema
        for key in ("type", "items", "values"):
            if isinstance(schema.get(key), (dict, list)):
                names_of(schema[key], named)
        for f in schema.get("fields", []):
            names_of(f["type"], named)
    return named


def payloads(schema: dict[str, Any], schema_id: int, count: int, rnd: random.Random) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    named = names_of(schema, {})
    out = []
    for _ in range(count):
        buf = io.BytesIO()
        buf.write(b"\x00" + schema_id.to_bytes(4, "big"))
        fastavro.schemaless_writer(buf, parsed, random_value(schema, rnd, named))
        out.append(buf.getvalue())
    return out


# ---- the two decoders ------------------------------------------------------------------------------

def struct_of(schema: dict[str, Any]) -> pa.DataType:
    return pa.struct([pa.field(n, t) for n, t in record_columns(json.dumps(schema))])


def fastavro_rows(writer: Any, reader: Any, values: list[bytes]) -> list[dict[str, Any] | None]:
    """typed.py's per-record read: the record, or None when the payload is poison."""
    out: list[dict[str, Any] | None] = []
    for value in values:
        stream = io.BytesIO(value)
        stream.seek(5)
        try:
            record = fastavro.schemaless_reader(stream, writer, reader)
        except Exception:  # noqa: BLE001 - poison (a resolution error included: C flags it too)
            out.append(None)
            continue
        out.append(record if stream.tell() == len(value) else None)
    return out


def c_rows(writer: Any, reader: Any, struct: pa.DataType, values: list[bytes]) -> tuple[pa.Array, list[tuple[int, str]]]:
    """The C loop: (the accepted rows' struct array, the rejected rows), as avro_batch runs it."""
    root, outs = avro_batch.layout(struct)
    program = avro_batch.compile_program(writer, reader, root)
    arr = pa.array(values, pa.binary())
    _, offsets, data = arr.buffers()
    which = np.zeros(len(values), np.int32)
    buffers, rejected = avro_batch._avro.decode(outs, (program,), offsets, data, 0, which.tobytes())
    if rejected:
        which[[r for r, _ in rejected]] = -1
        buffers, again = avro_batch._avro.decode(outs, (program,), offsets, data, 0, which.tobytes())
        assert not again
    got = avro_batch.arrays(root, buffers)
    got.validate(full=True)
    return got, rejected


def assert_same(got: pa.Array, want: pa.Array, where: str = "") -> None:
    """Equal type, validity and values at every level (children of null slots included)."""
    assert got.type == want.type and len(got) == len(want), where
    assert got.is_valid().to_pylist() == want.is_valid().to_pylist(), where
    t = got.type
    if pa.types.is_struct(t):
        for i, f in enumerate(t):
            assert_same(got.field(i), want.field(i), f"{where}.{f.name}")
    elif pa.types.is_map(t) or pa.types.is_list(t):
        assert got.offsets.to_pylist() == want.offsets.to_pylist(), where
        if pa.types.is_map(t):
            assert_same(got.keys, want.keys, f"{where}.key")
            assert_same(got.items, want.items, f"{where}.value")
        else:
            assert_same(got.values, want.values, f"{where}[]")
    elif pa.types.is_floating(t):
        width = np.float32 if t == pa.float32() else np.float64
        mask = np.asarray(want.is_valid())
        g = np.asarray(got.fill_null(0)).astype(width).view(np.uint32 if width is np.float32 else np.uint64)
        w = np.asarray(want.fill_null(0)).astype(width).view(np.uint32 if width is np.float32 else np.uint64)
        assert (g[mask] == w[mask]).all(), where
    else:
        assert got.to_pylist() == want.to_pylist(), where


# Where the C loop is stricter than fastavro (the batch then goes to fastavro, so nothing
# changes; these are the only kinds of records on which the two may disagree).
STRICTER = {
    "varint longer than 10 bytes",         # fastavro keeps reading (and drops high bits)
    "enum index out of range",             # fastavro indexes a negative index from the end
    "union index out of range",            # likewise
    "int out of the int32 range",          # fastavro reads it, Arrow then fails the batch
    "decimal has more digits than its precision",  # fastavro rounds, Arrow then fails the batch
    "decimal wider than 128 bits",
    "map key repeated",                    # a dict keeps one key, an Arrow map both
    "skipped value runs past the end",     # fastavro's skips do not check lengths
    "length runs past the end",            # (skipped strings/bytes, skipped array blocks)
    "negative length",                     # read(-n) on a skipped field reads to the end
    "block count runs past the end",
}


def differential(name: str, writer_schema: dict[str, Any], reader_schema: dict[str, Any] | None,
                 values: list[bytes]) -> dict[str, int]:
    writer = parse_avro(json.dumps(writer_schema))
    reader = parse_avro(json.dumps(reader_schema)) if reader_schema else None
    struct = struct_of(reader_schema or writer_schema)
    want_rows = fastavro_rows(writer, reader, values)
    got, rejected = c_rows(writer, reader, struct, values)
    rejected_rows = {r for r, _ in rejected}
    stricter: dict[str, int] = {}
    for i, row in enumerate(want_rows):
        if row is None:
            assert i in rejected_rows, f"{name}: row {i} is poison for fastavro, C decoded it: {values[i].hex()}"
    for row_index, why in rejected:
        if want_rows[row_index] is not None:
            assert why in STRICTER, f"{name}: row {row_index}: C rejected ({why}), fastavro read it: {values[row_index].hex()}"
            stricter[why] = stricter.get(why, 0) + 1
    kept = [r for i, r in enumerate(want_rows) if i not in rejected_rows]
    try:
        want = pa.array(kept, struct)
    except (pa.ArrowException, OverflowError, TypeError) as exc:  # fastavro's values that Arrow refuses
        raise AssertionError(f"{name}: C accepted rows Arrow refuses from fastavro: {exc}") from None
    assert_same(got, want, name)
    return stricter


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_c_decoder_builds_the_arrays_fastavro_and_arrow_build(name: str) -> None:
    writer_schema, reader_schema = PAIRS[name]
    rnd = random.Random(f"{SEED}-{name}")
    values = payloads(writer_schema, 1, 300, rnd)
    stricter = differential(name, writer_schema, reader_schema, values)
    if name != "narrowing-union":
        assert not stricter, stricter


def test_programs_say_what_fastavro_does_with_each_evolution() -> None:
    rnd = random.Random(SEED)
    got, rejected = c_rows(parse_avro(json.dumps(OLD_WRITER)), parse_avro(json.dumps(READER)), struct_of(READER),
                           payloads(OLD_WRITER, 1, 200, rnd))
    # Z is not a reader symbol and Strict has no default: a resolution error for fastavro; bytes
    # read as a string must be UTF-8.
    assert {why for _, why in rejected} == {"enum symbol not in the reader's symbols", "string is not UTF-8"}
    rows = got.to_pylist()
    assert {r["state"] for r in rows} <= {"A", "B"} and all(r["count"] == 7 for r in rows)
    assert rows[0]["list"] == [1, 2] and rows[0]["dict"] == [("a", 1)] and rows[0]["point"] == {"x": 3, "y": None}
    assert rows[0]["when"] == datetime.datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=datetime.UTC)  # 1000 as micros
    assert rows[0]["blob"] == "\u00ff".encode() and rows[0]["word"] == "fé" and rows[0]["kind"] == "Q"


def test_nan_payloads_and_float_promotions_keep_fastavros_bits() -> None:
    schema = {"type": "record", "name": "F", "fields": [{"name": "f", "type": "float"}, {"name": "d", "type": "double"}]}
    reader = {"type": "record", "name": "F", "fields": [{"name": "f", "type": "double"}, {"name": "d", "type": "double"}]}
    head = b"\x00\x00\x00\x00\x01"
    values = [head + struct.pack("<I", bits) + struct.pack("<Q", 0x7FF0000000000001)
              for bits in (0x7F800001, 0xFFC00001, 0x7F800000, 0x00000001, 0x80000000)]
    for r in (None, reader):
        differential("nan", schema, r, values)


# ---- corrupted payloads -----------------------------------------------------------------------------

def corrupt(value: bytes, rnd: random.Random) -> bytes:
    body = bytearray(value)
    how = rnd.randrange(6)
    if how == 0 and len(body) > 5:                     # truncated
        return bytes(body[:rnd.randrange(5, len(body))])
    if how == 1:                                       # trailing bytes
        return bytes(body) + bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 4)))
    if how == 2 and len(body) > 5:                     # a byte changed
        body[rnd.randrange(5, len(body))] = rnd.randrange(256)
        return bytes(body)
    if how == 3 and len(body) > 5:                     # a varint made long or negative
        i = rnd.randrange(5, len(body))
        return bytes(body[:i]) + rnd.choice([b"\xff" * 11, b"\x01", b"\x7f", b"\xff\xff\xff\xff\x0f"]) + bytes(body[i + 1:])
    if how == 4 and len(body) > 6:                     # bytes swapped
        i = rnd.randrange(5, len(body) - 1)
        body[i], body[i + 1] = body[i + 1], body[i]
        return bytes(body)
    return bytes(body[:5]) + bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 40)))  # garbage


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_corrupted_payloads_are_poison_exactly_when_fastavro_says_so(name: str) -> None:
    """The C loop never crashes, rejects every record fastavro rejects, and where it rejects a
    record fastavro reads, the reason is one of STRICTER (the batch then goes to fastavro)."""
    writer_schema, reader_schema = PAIRS[name]
    seed = f"{SEED}-corrupt-{name}"
    rnd = random.Random(seed)
    values = [corrupt(v, rnd) for v in payloads(writer_schema, 1, 400, rnd)]
    stricter = differential(f"{name} (seed {seed})", writer_schema, reader_schema, values)
    print(f"{name}: C stricter than fastavro on {stricter}")


# ---- decode_rows: the fast path against the fastavro path, poison and errors included ------------------

class NoRegistry:
    def schema_by_id(self, schema_id: int, context: str) -> None:
        return None


def evolution_table(poison: str = "dead-letter") -> TypedTable:
    """Latest READER in .east and in the loaded cluster's own context, EVERYTHING in .west; the
    table's columns are the union (so .east's rows have EVERYTHING's columns NULL)."""
    columns = dict(record_columns(json.dumps(READER)))
    for n, t in record_columns(json.dumps(EVERYTHING)):
        columns.setdefault(f"{n}" if n not in columns else n, t)
    t = TypedTable("t", "http://registry.invalid", "aggregate",
                   ((".east", 2, json.dumps(READER)), (".west", 5, json.dumps(EVERYTHING)), ("", 2, json.dumps(READER))),
                   tuple(columns.items()), poison)
    t._cache.update({("writer", ".east", 1): parse_avro(json.dumps(OLD_WRITER)),
                     ("writer", ".east", 2): parse_avro(json.dumps(READER)),
                     ("writer", ".east", 3): parse_avro(json.dumps(NEW_WRITER)),
                     ("writer", ".west", 5): parse_avro(json.dumps(EVERYTHING)),
                     ("writer", "", 2): parse_avro(json.dumps(READER)),
                     "registry": NoRegistry()})
    return t


def both_paths(make_table: Any, rows: pa.RecordBatch, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, int]:
    """decode_rows with the C loop and with fastavro alone: (outcome, outcome, batches the C loop
    handed to fastavro); an outcome is (rows, dead letters) or the error's text."""
    def run() -> Any:
        try:
            return decode_rows(make_table(), rows, "L", PARTS)
        except TypedLoadError as exc:
            return f"TypedLoadError: {exc}"

    handed = []
    real = avro_batch.decode_values

    def counting(*args: Any, **kwargs: Any) -> Any:
        got = real(*args, **kwargs)
        handed.append(got is None)
        return got

    monkeypatch.setattr(avro_batch, "decode_values", counting)
    fast = run()
    monkeypatch.setattr(avro_batch, "_avro", None)
    slow = run()
    return fast, slow, sum(handed[:1])


def no_address(text: Any) -> Any:
    """fastavro's EOFError names its stream object by address."""
    return re.sub(r" at 0x[0-9a-f]+", "", text) if isinstance(text, str) else text


def assert_same_outcome(fast: Any, slow: Any) -> None:
    if isinstance(slow, str) or isinstance(fast, str):
        assert no_address(fast) == no_address(slow)
        return
    (good_fast, dead_fast), (good_slow, dead_slow) = fast, slow
    assert good_fast.schema == good_slow.schema and dead_fast.schema == dead_slow.schema
    for name in good_slow.schema.names:
        assert_same(good_fast.column(name), good_slow.column(name), name)
    assert ([{k: no_address(v) for k, v in r.items()} for r in dead_fast.to_pylist()]
            == [{k: no_address(v) for k, v in r.items()} for r in dead_slow.to_pylist()])


def test_decode_rows_is_the_same_with_the_c_loop_for_mixed_contexts_writers_and_poison(monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(f"{SEED}-rows")
    east = payloads(OLD_WRITER, 1, 40, rnd) + payloads(READER, 2, 40, rnd) + payloads(NEW_WRITER, 3, 40, rnd)
    old = fastavro.parse_schema(OLD_WRITER)
    # (Strict's Z is a schema resolution error: it stops the load, tested below.)
    east = [v for v in east if v[4] != 1 or fastavro.schemaless_reader(io.BytesIO(v[5:]), old)["strict"] != "Z"]
    west = payloads(EVERYTHING, 5, 60, rnd)
    own = payloads(READER, 2, 20, rnd)
    values: list[bytes | None] = [*east, *west, *own, None, b"\x00\x00", b"\x07" + west[0][1:], west[1][:-3],
                                  west[2] + b"\x00"]
    clusters: list[str | None] = ["east"] * len(east) + ["west"] * len(west) + [None] * len(own) + ["west"] * 5
    order = list(range(len(values)))
    rnd.shuffle(order)
    rows = rows_of([values[i] for i in order], [clusters[i] for i in order])
    fast, slow, handed = both_paths(evolution_table, rows, monkeypatch)
    assert handed == 0, "the C loop handed a batch of decodable records to fastavro"
    assert_same_outcome(fast, slow)
    # the 5 planted ones, and OLD_WRITER's bytes read as a string that are not UTF-8
    assert fast[1].num_rows > 5 and fast[0].num_rows + fast[1].num_rows == len(values)
    monkeypatch.undo()
    fast, slow, handed = both_paths(evolution_table, rows.slice(7, 150), monkeypatch)  # buffers with an offset
    assert handed == 0 and fast[0].num_rows + fast[1].num_rows == 150
    assert_same_outcome(fast, slow)


@pytest.mark.parametrize("poison", ["dead-letter", "fail"])
def test_decode_rows_is_the_same_with_the_c_loop_for_corrupted_batches(poison: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seed = f"{SEED}-rows-corrupt-{poison}"
    rnd = random.Random(seed)
    for batch in range(6):
        values = payloads(EVERYTHING, 5, 30, rnd) + payloads(NEW_WRITER, 3, 30, rnd)
        values = [corrupt(v, rnd) if rnd.random() < 0.15 else v for v in values]
        clusters = ["west"] * 30 + ["east"] * 30
        fast, slow, _ = both_paths(lambda: evolution_table(poison), rows_of(values, clusters), monkeypatch)  # noqa: B023
        monkeypatch.undo()
        assert_same_outcome(fast, slow), f"seed {seed} batch {batch}"


def test_unknown_ids_incompatible_writers_and_refused_pairs_go_to_fastavro(monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(SEED)
    good = payloads(READER, 2, 3, rnd)
    unknown = b"\x00\x00\x00\x00\x09" + good[0][5:]
    other = {"type": "record", "name": "Other", "fields": [{"name": "zzz", "type": "string"}]}

    def table() -> TypedTable:
        t = evolution_table()
        t._cache[("writer", ".east", 4)] = parse_avro(json.dumps(other))
        return t

    for values in ([*good, unknown], [*good, payloads(other, 4, 1, rnd)[0]]):
        fast, slow, handed = both_paths(table, rows_of(values, ["east"] * len(values)), monkeypatch)
        monkeypatch.undo()
        assert fast == slow and handed == 1
        if values[-1] is unknown:  # poison = "dead-letter": a dead letter naming the id
            assert slow[1].column("schema_id").to_pylist() == [9] and slow[0].num_rows == len(good)
        else:
            assert isinstance(slow, str)


def test_programs_refuse_what_they_cannot_say_exactly() -> None:
    root, _ = avro_batch.layout(struct_of({"type": "record", "name": "R", "fields": [
        {"name": "amount", "type": dec(5, 2)}]}))
    narrower = {"type": "record", "name": "R", "fields": [{"name": "amount", "type": dec(5, 1)}]}
    with pytest.raises(avro_batch.Refused, match="decimal"):
        avro_batch.compile_program(parse_avro(json.dumps(narrower)), None, root)
    wide = {"type": "record", "name": "W", "fields": [{"name": "amount", "type": dec(40, 2)}]}
    with pytest.raises(avro_batch.Refused, match="decimal256"):
        avro_batch.layout(pa.struct([pa.field("amount", arrow_type(wide["fields"][0]["type"]))]))


def test_malformed_programs_are_refused_by_the_c_loop() -> None:
    root, outs = avro_batch.layout(pa.struct([pa.field("a", pa.int64()), pa.field("b", pa.string())]))
    arr = pa.array([b"\x00\x00\x00\x00\x01\x02\x00"], pa.binary())
    _, offsets, data = arr.buffers()
    which = np.zeros(1, np.int32).tobytes()
    bad_programs = [
        (avro_batch.OP_RECORD, 0, 0, 0, ((avro_batch.OP_LONG_I64, 1, 0, 0, (), None),), None),  # b not written
        (avro_batch.OP_RECORD, 0, 0, 0, ((avro_batch.OP_STRING, 1, 0, 0, (), None),
                                         (avro_batch.OP_STRING, 2, 0, 0, (), None)), None),  # a is int64
        (avro_batch.OP_RECORD, 0, 0, 0, ((avro_batch.OP_LONG_I64, 1, 0, 0, (), None),
                                         (avro_batch.OP_LONG_I64, 1, 0, 0, (), None)), None),  # a twice
        (avro_batch.OP_ARRAY, 0, 0, 0, (), None),
        (avro_batch.OP_RECORD, 0, 0, 0, ((99, 1, 0, 0, (), None),), None),
    ]
    for program in bad_programs:
        with pytest.raises(ValueError, match="avro program|decode"):
            avro_batch._avro.decode(outs, (program,), offsets, data, 0, which)
    with pytest.raises(ValueError, match="buffers shorter"):
        avro_batch._avro.decode(outs, (), offsets, data, 1, which)
