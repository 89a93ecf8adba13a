"""Typed keys (spark_aggregate/typed.py decode_keys): a record key decoded by its schema id
into the struct column `record_key`, beside the typed value columns; a null key is a NULL
struct, a poison key sends the record to the dead letters with the value kept."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from spark_aggregate.typed import (
    KEY_COLUMN,
    TypedLoadError,
    TypedTable,
    decode_keys,
    decode_rows,
    parse_avro,
    record_columns,
)
from tests.unit.test_typed_decode import PARTS, V1, Unknown, record, rows_of, wire

KEY = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"},
                                                   {"name": "region", "type": ["null", "string"], "default": None}]}


def keyed_table(poison: str = "dead-letter") -> TypedTable:
    key = TypedTable("t", "http://registry.invalid", "aggregate", ((".east", 5, json.dumps(KEY)),),
                     tuple(record_columns(json.dumps(KEY))), poison)
    key._cache.update({("writer", ".east", 5): parse_avro(json.dumps(KEY)), "registry": Unknown()})
    t = TypedTable("t", "http://registry.invalid", "aggregate", ((".east", 1, json.dumps(V1)),),
                   tuple(record_columns(json.dumps(V1))), poison, key=key)
    t._cache.update({("writer", ".east", 1): parse_avro(json.dumps(V1)), "registry": Unknown()})
    return t


def with_keys(batch: pa.RecordBatch, keys: list[bytes | None]) -> pa.RecordBatch:
    return batch.set_column(batch.schema.names.index("key"), "key", pa.array(keys, pa.binary()))


def test_keys_decode_into_record_key_null_keys_are_null_and_poison_keys_keep_their_value() -> None:
    t = keyed_table()
    values = [wire(V1, 1, record(i)) for i in range(4)]
    keys = [wire(KEY, 5, {"id": 7, "region": "eu"}), None, b"\x01" + wire(KEY, 5, {"id": 8})[1:],
            wire(KEY, 5, {"id": 9})]
    rows = with_keys(rows_of(values, ["east"] * 4), keys)
    typed, dead = decode_rows(t, rows, "L", PARTS)
    assert dead.num_rows == 0
    good, key_dead = decode_keys(t, typed, "L", PARTS)
    assert good.schema.names[-3:] == [KEY_COLUMN, *PARTS]
    assert t.key is not None
    assert good.schema == pa.schema([*(typed.schema.field(i) for i in range(typed.num_columns - 2)),
                                     pa.field(KEY_COLUMN, t.key.struct),
                                     *(typed.schema.field(i) for i in range(typed.num_columns - 2, typed.num_columns))])
    assert good.column("kafka_offset").to_pylist() == [100, 101, 103]
    assert good.column(KEY_COLUMN).to_pylist() == [{"id": 7, "region": "eu"}, None, {"id": 9, "region": None}]
    assert good.column("id").to_pylist() == [0, 1, 3]
    assert good.column("key").to_pylist() == [keys[0], None, keys[3]]
    assert good.column("value").to_pylist() == [values[0], values[1], values[3]]
    assert key_dead.column("kafka_offset").to_pylist() == [102]
    assert key_dead.column("reason").to_pylist() == ["key: magic byte 1, not 0"]
    assert key_dead.column("key").to_pylist() == [keys[2]] and key_dead.column("value").to_pylist() == [values[2]]
    assert t.output_schema.names == [*t.schema.names, KEY_COLUMN]


def test_a_poison_key_with_poison_fail_stops_naming_the_key() -> None:
    t = keyed_table("fail")
    rows = with_keys(rows_of([wire(V1, 1, record(1))], ["east"]), [b"\x00\x00"])
    typed, _ = decode_rows(t, rows, "L", PARTS)
    with pytest.raises(TypedLoadError, match=r"^key: topic 't' partition 3 offset 100: poison record"):
        decode_keys(t, typed, "L", PARTS)


@pytest.mark.parametrize(("schema", "keys", "arrow"), [
    ("string", ["k-1", "k-2"], pa.string()),
    ("long", [7, -(2**62)], pa.int64()),
    ({"type": "string", "logicalType": "uuid"}, ["5f0c8b1e-0000-4000-8000-000000000001", "x"], pa.string()),
    ({"type": "int", "logicalType": "date"}, [0, 20_000], pa.date32()),
])
def test_primitive_keys_decode_into_record_key_itself(schema: object, keys: list[object], arrow: pa.DataType) -> None:
    """Issue 43 (8): a key whose Avro schema is a primitive (what confluent-kafka's
    AvroSerializer writes for a string or long key) is no longer refused: `record_key` holds
    the value itself, of its type."""
    import datetime

    from spark_aggregate.typed import plan_typed_table

    text = json.dumps(schema)

    class Registry:
        def contexts(self) -> list[str]:
            return [".east"]

        def latest(self, name: str, context: str) -> tuple[int, str, str] | None:
            return {"t-value": (1, "AVRO", json.dumps(V1)), "t-key": (6, "AVRO", text)}.get(name)

    t = plan_typed_table("t", "http://registry.invalid", "aggregate", "", "dead-letter", Registry(),  # type: ignore[arg-type]
                         key_subject="")
    assert t.key is not None and t.key.primitive and t.output_schema.field(KEY_COLUMN).type == arrow
    t._cache.update({("writer", ".east", 1): parse_avro(json.dumps(V1)), "registry": Unknown()})
    t.key._cache.update({("writer", ".east", 6): parse_avro(text), "registry": Unknown()})
    values = [wire(V1, 1, record(i)) for i in range(3)]
    raw = [_wire_primitive(schema, 6, k) for k in keys]
    rows = with_keys(rows_of(values, ["east"] * 3), [raw[0], None, raw[1]])
    typed, _ = decode_rows(t, rows, "L", PARTS)
    good, dead = decode_keys(t, typed, "L", PARTS)
    expected = [datetime.date(1970, 1, 1) + datetime.timedelta(days=k) if arrow == pa.date32() else k
                for k in keys]  # type: ignore[operator]
    assert good.column(KEY_COLUMN).to_pylist() == [expected[0], None, expected[1]]
    assert good.schema.field(KEY_COLUMN).type == arrow and dead.num_rows == 0
    # A key written with a record schema where the table's key is primitive cannot be read as
    # it (as an incompatible value writer): the load stops naming the key's record.
    bad = with_keys(rows_of(values[:1], ["east"]), [wire(KEY, 5, {"id": 1})])
    t.key._cache[("writer", ".east", 5)] = parse_avro(json.dumps(KEY))
    typed, _ = decode_rows(t, bad, "L", PARTS)
    with pytest.raises(TypedLoadError, match=r"key: topic 't' partition 3 offset 100: schema id 5 cannot be read"):
        decode_keys(t, typed, "L", PARTS)


def _wire_primitive(schema: object, schema_id: int, value: object) -> bytes:
    import io

    import fastavro

    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()
