"""Protobuf payloads for typed tables (spark_aggregate/typed_protobuf.py): a schema registered
as .proto text is fetched back as the registry serves it (`?format=serialized`), built, and
payloads in Confluent's wire format decode into the rows the table's Arrow columns take."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import message_factory

from cluster.registry import formats
from spark_aggregate.columns import TIMESTAMP_TYPE
from spark_aggregate.typed_protobuf import (
    PoisonPayload,
    ProtobufSchemaError,
    fetch_protobuf,
    message_indexes,
)

ORDER_PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/type/date.proto";
import "common.proto";

message Order {
  int64 id = 1;
  string customer = 2;
  uint64 big = 3;
  float ratio = 4;
  Status status = 5;
  repeated string tags = 6;
  map<string, int32> counts = 7;
  Address address = 8;
  google.protobuf.Timestamp placed_at = 9;
  google.type.Date due = 10;
  google.protobuf.StringValue note = 11;
  optional int32 maybe = 12;
  oneof payment { string card = 13; int64 voucher = 14; }
  bytes blob = 15;
  repeated Address stops = 16;
  common.Money price = 17;
  message Address { string city = 1; sint32 zip = 2; }
  enum Status { NEW = 0; PAID = 1; }
}
message Other { string x = 1; }
"""
COMMON_PROTO = """
syntax = "proto3";
package common;
message Money { string currency = 1; int64 units = 2; }
"""


def _registry(text: str, references: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """A registry's answers for schema id 7 (main) and the referenced subjects, as its GETs give them."""
    answers: dict[str, Any] = {}
    refs = []
    for name, ref_text in references.items():
        parsed = formats.parse("PROTOBUF", ref_text)
        answers[f"/subjects/{name}/versions/1"] = {
            "subject": name, "version": 1, "id": 3, "schemaType": "PROTOBUF",
            "schema": parsed.parsed.serialized}
        refs.append({"name": name, "subject": name, "version": 1})
    parsed = formats.parse("PROTOBUF", text, references)
    answers["/schemas/ids/7"] = {"schemaType": "PROTOBUF", "schema": parsed.parsed.serialized, "references": refs}
    asked: dict[str, Any] = {}

    def get(path: str, params: dict[str, str] | None) -> Any:
        asked[path] = params
        if params and "subject" in params or path.startswith("/subjects/:"):
            return None  # this registry has nothing in other contexts
        return answers.get(path)

    return get, asked


def _wire(indexes: bytes, msg: Any) -> memoryview:
    return memoryview(indexes + msg.SerializeToString())


def test_a_full_message_decodes_into_the_columns() -> None:
    get, asked = _registry(ORDER_PROTO, {"common.proto": COMMON_PROTO})
    schema = fetch_protobuf(get, 7, "")
    assert schema is not None
    assert asked["/schemas/ids/7"] == {"format": "serialized"}
    columns = dict(schema.columns())
    assert columns["id"] == pa.int64() and columns["big"] == pa.decimal128(20, 0)
    assert columns["status"] == pa.string() and columns["tags"] == pa.list_(pa.string())
    assert columns["counts"] == pa.map_(pa.string(), pa.int32())
    assert columns["address"] == pa.struct([("city", pa.string()), ("zip", pa.int32())])
    assert columns["placed_at"] == TIMESTAMP_TYPE and columns["due"] == pa.date32()
    assert columns["note"] == pa.string() and columns["maybe"] == pa.int32()
    assert columns["price"] == pa.struct([("currency", pa.string()), ("units", pa.int64())])

    cls = message_factory.GetMessageClass(schema.pool.FindMessageTypeByName("shop.Order"))
    msg = cls(id=-5, customer="zoë", big=2**64 - 1, ratio=0.5, status=1, tags=["a", "b"], blob=b"\x00\xff",
              card="visa")
    msg.counts["x"] = 3
    msg.address.city = "Lyon"
    msg.address.zip = -69000
    msg.placed_at.seconds = 1_700_000_000
    msg.placed_at.nanos = 123_456_789
    msg.due.year, msg.due.month, msg.due.day = 2026, 11, 27
    msg.note.value = "fragile"
    msg.stops.add(city="A", zip=1)
    msg.price.currency = "EUR"
    msg.price.units = 12
    row = schema.decode(_wire(b"\x00", msg))
    assert row == {
        "id": -5, "customer": "zoë", "big": decimal.Decimal(2**64 - 1), "ratio": 0.5, "status": "PAID",
        "tags": ["a", "b"], "counts": [("x", 3)], "address": {"city": "Lyon", "zip": -69000},
        "placed_at": 1_700_000_000_123_456, "due": (datetime.date(2026, 11, 27) - datetime.date(1970, 1, 1)).days,
        "note": "fragile", "maybe": None, "card": "visa", "voucher": None, "blob": b"\x00\xff",
        "stops": [{"city": "A", "zip": 1}], "price": {"currency": "EUR", "units": 12}}
    table = pa.array([row], pa.struct([pa.field(n, t) for n, t in schema.columns()]))
    assert table.field("placed_at")[0].as_py() == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456,
                                                                     tzinfo=datetime.UTC)
    assert table.field("due")[0].as_py() == datetime.date(2026, 11, 27)


def test_unset_fields_are_defaults_without_presence_and_null_with_it() -> None:
    get, _ = _registry(ORDER_PROTO, {"common.proto": COMMON_PROTO})
    schema = fetch_protobuf(get, 7, "")
    assert schema is not None
    cls = message_factory.GetMessageClass(schema.pool.FindMessageTypeByName("shop.Order"))
    row = schema.decode(_wire(b"\x00", cls()))
    assert row["id"] == 0 and row["customer"] == "" and row["status"] == "NEW" and row["tags"] == []
    assert row["address"] is None and row["placed_at"] is None and row["note"] is None
    assert row["maybe"] is None and row["card"] is None and row["price"] is None


def test_message_indexes_pick_nested_and_later_messages() -> None:
    get, _ = _registry(ORDER_PROTO, {"common.proto": COMMON_PROTO})
    schema = fetch_protobuf(get, 7, "")
    assert schema is not None
    address = message_factory.GetMessageClass(schema.pool.FindMessageTypeByName("shop.Order.Address"))
    other = message_factory.GetMessageClass(schema.pool.FindMessageTypeByName("shop.Other"))
    # Nested types count in declaration order, map entries included (as protoc and Confluent's
    # serializers number them): Order's are CountsEntry, Address.
    assert [t.name for t in schema.message_type((0,)).nested_types] == ["CountsEntry", "Address"]
    # zigzag varints: count 2 -> 4, then indexes 0, 1 -> 0, 2; count 1 -> 2, index 1 -> 2
    assert schema.decode(_wire(b"\x04\x00\x02", address(city="B", zip=-2))) == {"city": "B", "zip": -2}
    assert schema.decode(_wire(b"\x02\x02", other(x="y"))) == {"x": "y"}
    assert message_indexes(memoryview(b"\x04\x00\x00rest"), 0) == ((0, 0), 3)


@pytest.mark.parametrize("payload, reason", [
    (b"", "past the end"),
    (b"\x02\x0a", "names no message type"),
    (b"\x02\x01", "negative"),
    (b"\x01", "message indexes"),
    (b"\x7e", "message indexes"),
    (b"\x00\x0a\x05ab", "does not decode"),
    (b"\x00\xff", "does not decode"),
])
def test_poison_payloads_name_their_fault(payload: bytes, reason: str) -> None:
    get, _ = _registry(ORDER_PROTO, {"common.proto": COMMON_PROTO})
    schema = fetch_protobuf(get, 7, "")
    assert schema is not None
    with pytest.raises(PoisonPayload, match=reason):
        schema.decode(memoryview(payload))


def test_a_context_qualifies_the_id_and_the_references() -> None:
    get, asked = _registry(ORDER_PROTO, {"common.proto": COMMON_PROTO})
    assert fetch_protobuf(get, 7, ".east") is None
    assert asked["/schemas/ids/7"] == {"format": "serialized", "subject": ":.east:"}


def test_recursive_messages_and_missing_references_are_refused() -> None:
    get, _ = _registry('syntax = "proto3"; message Node { string v = 1; repeated Node kids = 2; }', {})
    schema = fetch_protobuf(get, 7, "")
    assert schema is not None
    with pytest.raises(ProtobufSchemaError, match="recursive"):
        schema.columns()
    get, _ = _registry(ORDER_PROTO, {"common.proto": COMMON_PROTO})

    def without_reference(path: str, params: dict[str, str] | None) -> Any:
        return None if path.startswith("/subjects/") else get(path, params)

    with pytest.raises(ProtobufSchemaError, match="does not have"):
        fetch_protobuf(without_reference, 7, "")


V1_PROTO = 'syntax = "proto3"; package p; message Click { int64 id = 1; string page = 2; }'
V2_PROTO = ('syntax = "proto3"; package p; import "google/protobuf/timestamp.proto"; message Click { int64 id = 1; '
            'string page = 2; google.protobuf.Timestamp at = 3; }')


def test_decode_rows_reads_protobuf_by_context_with_evolution_and_poison() -> None:
    from spark_aggregate.typed import TypedLoadError, TypedTable, decode_rows
    from tests.unit.test_typed_decode import PARTS, rows_of

    v1, _ = _registry(V1_PROTO, {})
    v2, _ = _registry(V2_PROTO, {})
    s1, s2 = fetch_protobuf(v1, 7, ""), fetch_protobuf(v2, 7, "")
    assert s1 is not None and s2 is not None
    t = TypedTable("t", "http://registry.invalid", "aggregate", ((".east", 2, V2_PROTO),), tuple(s2.columns()),
                   "dead-letter", "PROTOBUF")
    t._cache.update({("writer", ".east", 1): s1, ("writer", ".east", 2): s2, "registry": None})
    old = message_factory.GetMessageClass(s1.pool.FindMessageTypeByName("p.Click"))
    new = message_factory.GetMessageClass(s2.pool.FindMessageTypeByName("p.Click"))
    stamped = new(id=2, page="/b")
    stamped.at.seconds = 86_400
    values = [b"\x00\x00\x00\x00\x01\x00" + old(id=1, page="/a").SerializeToString(),
              b"\x00\x00\x00\x00\x02\x00" + stamped.SerializeToString(),
              b"\x00\x00\x00\x00\x02\x00\x0a\x09short",
              b"\x00\x00\x00\x00\x02\x02\x06"]
    good, dead = decode_rows(t, rows_of(values, ["east"] * 4), "L", PARTS)
    assert good.column("id").to_pylist() == [1, 2] and good.column("page").to_pylist() == ["/a", "/b"]
    assert good.column("at").to_pylist() == [None, datetime.datetime(1970, 1, 2, tzinfo=datetime.UTC)]
    assert dead.column("kafka_offset").to_pylist() == [102, 103]
    reasons = dead.column("reason").to_pylist()
    assert reasons[0].startswith("payload does not decode with schema id 2: the message does not decode as p.Click")
    assert "names no message type" in reasons[1]
    t_fail = TypedTable("t", "http://registry.invalid", "aggregate", t.readers, t.columns, "fail", "PROTOBUF")
    t_fail._cache.update(t._cache)
    with pytest.raises(TypedLoadError, match=r"offset 102: poison record"):
        decode_rows(t_fail, rows_of(values, ["east"] * 4), "L", PARTS)


def test_wrappers_proto_itself_is_refused_as_a_table_schema() -> None:
    """What ProtobufSerializer registers for a StringValue key is google/protobuf/wrappers.proto:
    its records name one of its nine message types, each `value` of another type, so its first
    message's columns would make every other a dead letter; it is refused, saying to leave it
    untyped. A file that declares a single wrapper-like message is a message like any other."""
    wrappers = ('syntax = "proto3"; package google.protobuf; message DoubleValue { double value = 1; } '
                'message StringValue { string value = 1; } message Int64Value { int64 value = 1; }')
    get, _ = _registry(wrappers, {})
    schema = fetch_protobuf(get, 7, "")
    assert schema is not None
    with pytest.raises(ProtobufSchemaError, match=r"wrappers.proto .*key = false"):
        schema.columns()
    get, _ = _registry('syntax = "proto3"; package p; message DoubleValue { double value = 1; }', {})
    one = fetch_protobuf(get, 7, "")
    assert one is not None and one.columns() == [("value", pa.float64())]
