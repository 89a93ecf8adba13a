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
