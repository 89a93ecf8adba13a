"""Typed Avro columns a batch at a time: the C loop (spark_aggregate/_avro.c) beside the
per-record fastavro path of spark_aggregate/typed.py, with the same results.

For each (context, writer schema id) a *program* is compiled once: the writer -> reader
schema resolution as fastavro performs it (`_read_data`: match_schemas at every node, fields by
name and alias, skips of writer-only fields, reader-only fields' defaults, promotions, unions
resolved per writer branch, logical types by the writer's schema), each node naming the Arrow
array it appends to. The C loop runs the programs over a batch's values and fills Arrow buffers
of the table's columns directly, with no Python object per record.

Behaviour never changes; whenever the fast path is not sure it hands the batch to fastavro:
- a pair the programs cannot express (a rare construct, a default of an odd type, a schema
  fastavro would refuse while reading) decodes its batches with fastavro;
- records the C loop rejects (truncated, bytes left over, a bad union or enum index, bad
  lengths, invalid UTF-8, a value its column cannot hold, a repeated map key, a schema
  resolution error) are decoded with fastavro: when fastavro rejects them too they are poison
  exactly as before (the same dead letters, reasons and errors), else the whole batch is
  decoded with fastavro;
- poison = "fail" with any poison record, or an unknown schema id: the batch goes to fastavro,
  which raises the same error as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:
    from spark_aggregate import _avro  # type: ignore[attr-defined]
except ImportError:  # no compiler when installed: fastavro decodes every batch
    _avro = None

# Output kinds and ops: the same numbers as spark_aggregate/_avro.c.
(OUT_BOOL, OUT_I32, OUT_I64, OUT_F32, OUT_F64, OUT_DEC128, OUT_BIN, OUT_LIST, OUT_MAP, OUT_STRUCT) = range(1, 11)
(OP_NUL, OP_BOOL, OP_LONG_I32, OP_LONG_I64, OP_LONG_F32, OP_LONG_F64, OP_LONG_DATE, OP_LONG_TS_MILLIS,
 OP_LONG_TS_MICROS, OP_FLOAT_F32, OP_FLOAT_F64, OP_DOUBLE, OP_STRING, OP_BYTES, OP_FIXED, OP_DEC_BYTES,
 OP_DEC_FIXED, OP_ENUM, OP_ARRAY, OP_MAP, OP_RECORD, OP_UNION, OP_ERR, OP_CONST, OP_CONST_STRUCT,
 OP_CONST_LIST, OP_CONST_MAP, OP_SK_LONG, OP_SK_FIXED, OP_SK_BYTES, OP_SK_ARRAY, OP_SK_MAP, OP_SK_UNION,
 OP_SK_RECORD) = range(1, 35)

PROGRAM_DEPTH_MAX = 48
PROGRAM_NODES_MAX = 20_000
_PRIMITIVE_KINDS = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_KNOWN_KINDS = _PRIMITIVE_KINDS | {"fixed", "enum", "array", "map", "record", "error", "union", "error_union"}
_TIMESTAMP_UTC = pa.timestamp("us", tz="UTC")
_TIMESTAMP_LOCAL = pa.timestamp("us")

Program = tuple[Any, ...]


class Refused(Exception):
    """The program cannot say exactly what fastavro does here: fastavro decodes these batches."""


# ---- the outputs: the table's struct type as a tree of Arrow arrays ---------------------------


@dataclass
class Out:
    index: int
    type: pa.DataType
    kids: list[Out] = field(default_factory=list)

    def field(self, name: str) -> Out | None:
        for i, f in enumerate(self.type):
            if f.name == name:
                return self.kids[i]
        return None


def _kind(t: pa.DataType) -> int:
    if t == pa.bool_():
        return OUT_BOOL
    if t in (pa.int32(), pa.date32()):
        return OUT_I32
    if t in (pa.int64(), _TIMESTAMP_UTC, _TIMESTAMP_LOCAL):
        return OUT_I64
    if t == pa.float32():
        return OUT_F32
    if t == pa.float64():
        return OUT_F64
    if pa.types.is_decimal128(t):
        return OUT_DEC128
    if t in (pa.binary(), pa.string()):
        return OUT_BIN
    if pa.types.is_map(t):
        return OUT_MAP
    if pa.types.is_list(t):
        return OUT_LIST
    if pa.types.is_struct(t):
        return OUT_STRUCT
    raise Refused(f"no output for Arrow type {t}")


def layout(struct: pa.DataType) -> tuple[Out, tuple[tuple[int, tuple[int, ...]], ...]]:
    """The output tree of a struct type and its description for the C loop (pre-order)."""
    flat: list[list[Any]] = []

    def add(t: pa.DataType) -> Out:
        out = Out(len(flat), t)
        entry: list[Any] = [_kind(t), ()]
        flat.append(entry)
        if pa.types.is_map(t):
            entries = pa.struct([pa.field("key", t.key_type, nullable=False), t.item_field])
            out.kids = [add(entries)]
        elif pa.types.is_list(t):
            out.kids = [add(t.value_type)]
        elif pa.types.is_struct(t):
            out.kids = [add(f.type) for f in t]
        entry[1] = tuple(k.index for k in out.kids)
        return out

    root = add(struct)
    return root, tuple((k, kids) for k, kids in flat)


def arrays(out: Out, buffers: list[Any]) -> pa.Array:
    """The Arrow array of an output from the C loop's buffers (no copies)."""
    length, nulls, valid, values, offsets, data = buffers[out.index]
    validity = None if valid is None else pa.py_buffer(valid)
    t = out.type
    if pa.types.is_struct(t):
        return pa.Array.from_buffers(t, length, [validity], nulls, children=[arrays(k, buffers) for k in out.kids])
    if pa.types.is_list(t) or pa.types.is_map(t):
        return pa.Array.from_buffers(t, length, [validity, pa.py_buffer(offsets)], nulls,
                                     children=[arrays(out.kids[0], buffers)])
    if t in (pa.binary(), pa.string()):
        return pa.Array.from_buffers(t, length, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], nulls)
    return pa.Array.from_buffers(t, length, [validity, pa.py_buffer(values)], nulls)


# ---- programs: fastavro's _read_data, node by node ---------------------------------------------


def _node(op: int, out: Out | int, a: int = 0, b: int = 0, kids: tuple[Program, ...] = (), const: Any = None) -> Program:
    return (op, out if isinstance(out, int) else out.index, a, b, kids, const)


class _Compiler:
    def __init__(self, named: dict[str, dict[str, Any]]) -> None:
        from fastavro._read import match_schemas, match_types  # type: ignore[attr-defined]
        from fastavro.logical_readers import LOGICAL_READERS

        self.named = named
        self.match_schemas = match_schemas
        self.match_types = match_types
        self.logical = LOGICAL_READERS
        self.nodes = 0

    def _count(self) -> None:
        self.nodes += 1
        if self.nodes > PROGRAM_NODES_MAX:
            raise Refused("program too large")

    def read(self, w: Any, r: Any, out: Out, depth: int = 0) -> Program:
        """What fastavro's _read_data(w, named, r) appends to `out`."""
        from fastavro._read_common import SchemaResolutionError
        from fastavro._schema import extract_logical_type, extract_record_type  # type: ignore[attr-defined]

        self._count()
        if depth > PROGRAM_DEPTH_MAX:
            raise Refused("schema nests too deep")
        kind = extract_record_type(w)
        if r:
            try:
                r = self.match_schemas(w, r, self.named)
            except SchemaResolutionError as exc:
                raise Refused(f"schema resolution: {exc}") from None
        if kind not in _KNOWN_KINDS:  # a named type's reference
            if isinstance(r, (dict, list)):
                raise Refused("reader of a named reference is not a name")
            if kind not in self.named["writer"]:
                raise Refused(f"unknown named type {kind!r}")
            return self.read(self.named["writer"][kind], self.named["reader"].get(r), out, depth + 1)
        t = out.type
        if kind == "null":
            return _node(OP_NUL, out)
        if isinstance(w, dict) and "logicalType" in w:
            logical = extract_logical_type(w)
            if logical in self.logical:
                return self._logical(logical, w, out)
        r_kind = extract_record_type(r) if r is not None else None
        if kind in ("int", "long"):
            if r_kind in ("float", "double"):
                ops = {pa.float32(): OP_LONG_F32, pa.float64(): OP_LONG_F64}
            else:
                ops = {pa.int32(): OP_LONG_I32, pa.int64(): OP_LONG_I64}
            if t not in ops:
                raise Refused(f"{kind} into {t}")
            return _node(ops[t], out)
        if kind == "float":
            if t not in (pa.float32(), pa.float64()):
                raise Refused(f"float into {t}")
            return _node(OP_FLOAT_F32 if t == pa.float32() else OP_FLOAT_F64, out)
        if kind == "double":
            if t != pa.float64():
                raise Refused(f"double into {t}")
            return _node(OP_DOUBLE, out)
        if kind == "boolean":
            if t != pa.bool_():
                raise Refused(f"boolean into {t}")
            return _node(OP_BOOL, out)
        if kind == "string":  # text, also when promoted to bytes (encoded again: the same bytes)
            if t not in (pa.string(), pa.binary()):
                raise Refused(f"string into {t}")
            return _node(OP_STRING, out)
        if kind == "bytes":
            if t == pa.binary():
                return _node(OP_BYTES, out)
            if t == pa.string() and r_kind == "string":  # decoded strictly
                return _node(OP_STRING, out)
            raise Refused(f"bytes into {t}")
        if kind == "fixed":
            if t != pa.binary():
                raise Refused(f"fixed into {t}")
            return _node(OP_FIXED, out, _size(w))
        if kind == "enum":
            return self._enum(w, r, out)
        if kind == "array":
            if not pa.types.is_list(t) or (r and not isinstance(r, dict)):
                raise Refused(f"array into {t}")
            items = self.read(w["items"], r["items"] if r else None, out.kids[0], depth + 1)
            return _node(OP_ARRAY, out, kids=(items,))
        if kind == "map":
            if not pa.types.is_map(t) or (r and not isinstance(r, dict)):
                raise Refused(f"map into {t}")
            values = self.read(w["values"], r["values"] if r else None, out.kids[0].kids[1], depth + 1)
            return _node(OP_MAP, out, kids=(values,))
        if kind in ("union", "error_union"):
            return _node(OP_UNION, out, kids=tuple(self._branch(b, r, out, depth) for b in w))
        if kind in ("record", "error"):
            return self._record(w, r, out, depth)
        raise Refused(f"Avro type {kind}")

    def _branch(self, w: Any, r: Any, out: Out, depth: int) -> Program:
        """fastavro's read_union for writer branch `w`: the first reader branch it matches; a
        branch that cannot be read (or expressed) flags its records for fastavro."""
        try:
            if r:
                candidates = r if isinstance(r, list) else [r]
                for candidate in candidates:
                    if self.match_types(w, candidate, self.named):
                        return self.read(w, candidate, out, depth + 1)
                return _node(OP_ERR, out)
            return self.read(w, None, out, depth + 1)
        except Refused:
            return _node(OP_ERR, out)

    def _logical(self, logical: str, w: dict[str, Any], out: Out) -> Program:
        t = out.type
        if logical in ("long-timestamp-millis", "long-timestamp-micros", "long-local-timestamp-millis",
                       "long-local-timestamp-micros"):
            want = _TIMESTAMP_LOCAL if "local" in logical else _TIMESTAMP_UTC
            if t != want:
                raise Refused(f"{logical} into {t}")
            return _node(OP_LONG_TS_MILLIS if logical.endswith("millis") else OP_LONG_TS_MICROS, out)
        if logical == "int-date":
            if t != pa.date32():
                raise Refused(f"date into {t}")
            return _node(OP_LONG_DATE, out)
        if logical in ("bytes-decimal", "fixed-decimal"):
            precision, scale = w.get("precision"), w.get("scale", 0)
            if (not isinstance(precision, int) or not isinstance(scale, int) or not 1 <= precision <= 38
                    or not 0 <= scale <= precision or t != pa.decimal128(precision, scale)):
                raise Refused(f"decimal into {t}")
            if logical == "bytes-decimal":
                return _node(OP_DEC_BYTES, out, precision)
            return _node(OP_DEC_FIXED, out, precision, _size(w))
        raise Refused(f"logical type {logical}")

    def _enum(self, w: dict[str, Any], r: Any, out: Out) -> Program:
        if out.type != pa.string():
            raise Refused(f"enum into {out.type}")
        symbols = w["symbols"]
        if r and not isinstance(r, dict):
            raise Refused("enum reader is not a schema")
        table: list[bytes | None] = []
        for symbol in symbols:
            got = symbol
            if r and symbol not in r["symbols"]:
                got = r.get("default") or None  # fastavro: a falsy default is none
            table.append(None if got is None else str(got).encode())
            if got is not None and not isinstance(got, str):
                raise Refused("enum default is not a string")
        return _node(OP_ENUM, out, len(symbols), const=tuple(table))

    def _record(self, w: dict[str, Any], r: Any, out: Out, depth: int) -> Program:
        if not pa.types.is_struct(out.type):
            raise Refused(f"record into {out.type}")
        if r and not isinstance(r, dict):
            raise Refused("record reader is not a schema")
        kids: list[Program] = []
        written: set[str] = set()
        if not r:
            for f in w["fields"]:
                target = out.field(f["name"])
                if target is None or f["name"] in written:
                    raise Refused(f"field {f['name']!r} has no column")
                kids.append(self.read(f["type"], None, target, depth + 1))
                written.add(f["name"])
        else:
            by_name = {f["name"]: f for f in r["fields"]}
            by_alias = {a: f for f in r["fields"] for a in f.get("aliases", [])}
            for f in w["fields"]:
                reader_field = by_name.get(f["name"], by_alias.get(f["name"]))
                if reader_field:
                    name = reader_field["name"]
                    target = out.field(name)
                    if target is None or name in written or name not in by_name:
                        raise Refused(f"field {name!r} has no column or is read twice")
                    kids.append(self.read(f["type"], reader_field["type"], target, depth + 1))
                    written.add(name)
                    del by_name[name]
                else:
                    kids.append(self.skip(f["type"], depth + 1))
            for name, reader_field in by_name.items():
                if "default" not in reader_field:
                    raise Refused(f"no default for field {name!r}")
                target = out.field(name)
                if target is None:
                    raise Refused(f"field {name!r} has no column")
                kids.append(self.const(reader_field["default"], target, depth + 1))
                written.add(name)
        for f, kid in zip(out.type, out.kids, strict=True):  # columns this schema lacks: NULL
            if f.name not in written:
                kids.append(_node(OP_NUL, kid))
        return _node(OP_RECORD, out, kids=tuple(kids))

    def skip(self, w: Any, depth: int) -> Program:
        """What fastavro's _skip_data(w) reads."""
        from fastavro._schema import extract_record_type  # type: ignore[attr-defined]

        self._count()
        if depth > PROGRAM_DEPTH_MAX:
            raise Refused("schema nests too deep")
        kind = extract_record_type(w)
        if kind not in _KNOWN_KINDS:
            if kind not in self.named["writer"]:
                raise Refused(f"unknown named type {kind!r}")
            return self.skip(self.named["writer"][kind], depth + 1)
        if kind == "null":
            return _node(OP_SK_RECORD, -1)  # no bytes
        if kind in ("int", "long", "enum"):
            return _node(OP_SK_LONG, -1)
        if kind in ("boolean", "float", "double", "fixed"):
            size = {"boolean": 1, "float": 4, "double": 8}.get(kind) or _size(w)
            return _node(OP_SK_FIXED, -1, size)
        if kind in ("string", "bytes"):
            return _node(OP_SK_BYTES, -1)
        if kind == "array":
            return _node(OP_SK_ARRAY, -1, kids=(self.skip(w["items"], depth + 1),))
        if kind == "map":
            return _node(OP_SK_MAP, -1, kids=(self.skip(w["values"], depth + 1),))
        if kind in ("union", "error_union"):
            return _node(OP_SK_UNION, -1, kids=tuple(self.skip(b, depth + 1) for b in w))
        return _node(OP_SK_RECORD, -1, kids=tuple(self.skip(f["type"], depth + 1) for f in w["fields"]))

    def const(self, value: Any, out: Out, depth: int) -> Program:
        """A reader-only field's default as fastavro leaves it (the JSON value) and Arrow then
        converts it."""
        self._count()
        if depth > PROGRAM_DEPTH_MAX:
            raise Refused("default nests too deep")
        if value is None:
            return _node(OP_NUL, out)
        t = out.type
        try:
            arr = pa.array([value], t)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise Refused(f"default {value!r} for {t}: {exc}") from None
        if pa.types.is_struct(t):
            if not isinstance(value, dict):
                raise Refused("struct default is not an object")
            kids = tuple(self.const(value.get(f.name), k, depth + 1) for f, k in zip(t, out.kids, strict=True))
            return _node(OP_CONST_STRUCT, out, kids=kids)
        if pa.types.is_map(t):
            if not isinstance(value, dict):
                raise Refused("map default is not an object")
            key_out, value_out = out.kids[0].kids
            pairs: list[Program] = []
            for k, v in value.items():
                pairs += [self.const(k, key_out, depth + 1), self.const(v, value_out, depth + 1)]
            return _node(OP_CONST_MAP, out, kids=tuple(pairs))
        if pa.types.is_list(t):
            if not isinstance(value, list):
                raise Refused("array default is not a list")
            return _node(OP_CONST_LIST, out, kids=tuple(self.const(v, out.kids[0], depth + 1) for v in value))
        if arr.null_count:
            return _node(OP_NUL, out)
        if t == pa.bool_():
            return _node(OP_CONST, out, const=bytes([1 if arr[0].as_py() else 0]))
        if t in (pa.string(), pa.binary()):
            got = arr[0].as_py()
            return _node(OP_CONST, out, const=got.encode() if isinstance(got, str) else bytes(got))
        width = t.bit_width // 8
        return _node(OP_CONST, out, const=arr.buffers()[1].to_pybytes()[:width])


def _size(w: dict[str, Any]) -> int:
    size = w.get("size")
    if not isinstance(size, int) or not 0 <= size <= 1 << 30:
        raise Refused("fixed size out of range")
    return size


def compile_program(writer: Any, reader: Any, root: Out) -> Program:
    """The program reading values of `writer` (fastavro's parsed schema) as `reader` (None: as
    written) into the output tree `root`; Refused when it cannot match fastavro exactly."""
    import fastavro
    from fastavro._read import _default_named_schemas  # type: ignore[attr-defined]

    if writer == reader:  # schemaless_reader drops a reader equal to the writer
        reader = None
    named = _default_named_schemas()
    writer = fastavro.parse_schema(writer, named["writer"])
    if reader:
        reader = fastavro.parse_schema(reader, named["reader"])
    if not isinstance(writer, dict) or writer.get("type") not in ("record", "error"):
        raise Refused("writer schema is not a record")
    compiler = _Compiler(named)
    program = compiler.read(writer, reader, root)
    if program[0] != OP_RECORD:
        raise Refused("writer schema is not read as a record")
    return program


# ---- a batch ---------------------------------------------------------------------------------------


@dataclass
class Decoded:
    """A batch's outcome: which rows decoded, their typed columns, and the rows to set aside."""

    good: np.ndarray
    columns: list[pa.Array]
    bad_rows: np.ndarray


def available() -> bool:
    return _avro is not None


def decode_values(table: Any, rows: pa.RecordBatch, writer_of: Any, reader_of: Any,
                  context_of: Any) -> Decoded | None:
    """The typed columns of the rows whose values decode, in C; None when fastavro must decode
    this batch (see the module docstring). `writer_of(context, schema id, row)` and
    `reader_of(context, schema id)` answer fastavro's parsed schemas (typed.py's caches);
    `context_of(source cluster or None)` is the registry context of a row's schema id."""
    if _avro is None:
        return None
    values = rows.column("value")
    if values.type != pa.binary():
        return None
    n = len(values)
    valid, offsets, data = values.buffers()
    if data is None:
        data = pa.py_buffer(b"")
    ids = np.frombuffer(_avro.wire_ids(offsets, data, valid, values.offset, n), dtype=np.int64)
    header_bad = ids < 0
    if header_bad.any() and table.poison == "fail":
        return None
    # The context of each row, then (context, id) pairs: one program each.
    clusters = pc.dictionary_encode(rows.column("source_cluster"))
    contexts = [context_of(c) for c in clusters.dictionary.to_pylist()] + [context_of(None)]
    cluster_index = np.asarray(clusters.indices.fill_null(len(contexts) - 1), dtype=np.int64)
    keys = np.where(header_bad, -1, (cluster_index << 33) | np.where(header_bad, 0, ids))
    unique, inverse = np.unique(keys, return_inverse=True)
    shape = _layout(table)
    if shape is None:
        return None
    root, outs = shape
    programs: list[Program] = []
    program_of_key = np.full(len(unique), -1, dtype=np.int32)
    for i, key in enumerate(unique.tolist()):
        if key < 0:
            continue
        context, schema_id = contexts[key >> 33], key & ((1 << 33) - 1)
        row = int(np.argmax(keys == key))
        program = _program(table, context, schema_id, row, root, writer_of, reader_of)
        if program is None:
            return None
        program_of_key[i] = len(programs)
        programs.append(program)
    program_of_row = program_of_key[inverse]
    buffers, rejected = _avro.decode(outs, tuple(programs), offsets, data, values.offset, program_of_row.tobytes())
    if rejected:
        if table.poison == "fail":
            return None
        program_of_row = program_of_row.copy()
        program_of_row[[row for row, _ in rejected]] = -1
        buffers, again = _avro.decode(outs, tuple(programs), offsets, data, values.offset, program_of_row.tobytes())
        assert not again, again
    good = program_of_row >= 0
    struct = arrays(root, buffers)
    struct.validate()
    return Decoded(good, [struct.field(i) for i in range(struct.type.num_fields)], np.flatnonzero(~good))


def _layout(table: Any) -> tuple[Out, Any] | None:
    key = ("avro_batch", "layout")
    if key not in table._cache:
        try:
            table._cache[key] = layout(table.struct)
        except Refused:  # a column type the C loop does not build (decimal256)
            table._cache[key] = None
    return table._cache[key]  # type: ignore[no-any-return]


def _program(table: Any, context: str, schema_id: int, row: int, root: Out, writer_of: Any,
             reader_of: Any) -> Program | None:
    key = ("avro_batch", context, schema_id)
    if key not in table._cache:
        try:
            writer = writer_of(context, schema_id, row)
            reader = reader_of(context, schema_id)
        except Exception:  # noqa: BLE001 - fastavro's path raises it again, in row order
            return None
        try:
            table._cache[key] = compile_program(writer, reader, root)
        except Refused:
            table._cache[key] = None
    return table._cache[key]  # type: ignore[no-any-return]
