"""Typed warehouse loads (issue 33) against a real broker and a real schema registry
(`dcmirror registry`): confluent-kafka's AvroSerializer writes records of three schema
versions, mirrored from `east` (provenance headers; their schemas in the aggregate
registry's context `.east`, where a different schema has the same id as in the default
context); the load decodes them into typed columns (nested records, arrays, maps, enums,
decimals, timestamps, dates), a new optional field adds a nullable column, poison records
land in the dead-letter table with their coordinates, JSON Schema values (JSONSerializer) load
into the columns their schema declares, an incompatible new version stops the load before
planning, an unknown schema id follows the topic's poison policy (a dead letter, or that
topic stopped with its name, partition, offset and id while the other topics load), and a
type change the table cannot hold stops the topic naming the record.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from spark_aggregate.load import LoadConfigError, Loader, TopicsFailed
from spark_aggregate.session import start_session, stop_session, warehouse_lock
from spark_aggregate.settings import WarehouseSettings
from tests.harness import BrokerProcess
from tests.registry.common import RegistryProcess
from tests.spark.common import Feed, create_topics, write_topology
from topology import load

pytestmark = [pytest.mark.timeout(600), pytest.mark.spark_session]

TOPIC = "east.orders"
SUBJECT = ":.east:orders-value"  # the source's subject, in the source's context (as the mirror copies it)

V1: dict[str, Any] = {
    "type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"},
            {"name": "since", "type": {"type": "int", "logicalType": "date"}}]}},
    ]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
V3 = {**V2, "fields": [*V2["fields"], {"name": "discount", "type": ["null", "double"], "default": None}]}
OTHER = {"type": "record", "name": "Unrelated", "fields": [{"name": "x", "type": "string"}]}


@dataclass
class Env:
    broker: BrokerProcess
    registry: RegistryProcess
    settings: WarehouseSettings
    spark: Any
    feed: Feed
    client: SchemaRegistryClient

    def load(self, topics: str) -> str:
        out = io.StringIO()
        Loader(self.spark, dataclasses.replace(self.settings, topics=topics), out).run()
        return out.getvalue()

    def serializer(self, schema: dict[str, Any], subject: str = SUBJECT) -> Any:
        avro = AvroSerializer(self.client, json.dumps(schema),
                              conf={"auto.register.schemas": True,
                                    "subject.name.strategy": lambda ctx, name: subject})
        return lambda record: avro(record, SerializationContext(TOPIC, MessageField.VALUE))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("spark-typed")
    broker = BrokerProcess(root / "broker", group_initial_rebalance_delay_ms=0).start()
    registry = None
    try:
        registry = RegistryProcess(root / "registry.log", bootstrap=broker.bootstrap).start()
        topology = write_topology(root / "topology.toml", broker.bootstrap, root / "warehouse")
        with topology.open("a") as f:
            f.write(f'\n[clusters.aggregate.registry]\nlisten = "127.0.0.1:{registry.port}"\n\n'
                    # west's flow puts its schemas in context .emea and renames its topics
                    '[clusters.west.registry]\nlisten = "127.0.0.1:1"\n\n'
                    '[[mirrors]]\nsource = "west"\ntarget = "aggregate"\ntopics = ".*"\nschemas = true\n'
                    'schema_context = ".emea"\nrename = "from_{source}_{topic}"\n\n'
                    '[warehouse.registry_schemas]\n"east[.]orders" = { value = true }\n'
                    '"east[.]unknown_ids" = { value = true, subject = "refunds-value" }\n'
                    '"east[.]events" = { value = true }\n'
                    '"east[.]shipments" = { value = true, key = true }\n'
                    '"east[.]clicks" = { value = true }\n'
                    '"east[.]carts" = { value = true, key = true }\n'
                    '"east[.]returns" = { value = true }\n'
                    '"east[.]amounts" = { value = true }\n'
                    '"east[.]stuck" = { value = true, subject = "refunds-value", poison = "fail" }\n'
                    '"east[.]flowing" = { value = true, subject = "refunds-value" }\n'
                    '"from_west_.*" = { value = true }\n')
        settings = WarehouseSettings.from_topology(load(topology))
        client = SchemaRegistryClient({"url": registry.url})
        with warehouse_lock(settings, "tests/spark/test_typed_load.py"):
            spark = start_session(settings, "tests/spark/test_typed_load.py")
            try:
                yield Env(broker, registry, settings, spark, Feed(broker.bootstrap), client)
            finally:
                stop_session(spark)
    finally:
        if registry is not None:
            registry.stop()
        broker.stop()


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {"id": i, "amount": decimal.Decimal(f"{i}.25"),
            "placed": datetime.datetime(2026, 1, 2, 3, 4, 5, 6000 * i, tzinfo=datetime.UTC),
            "status": "PAID" if i % 2 else "NEW", "tags": [f"t{i}"] * (i % 3), "attrs": {"n": i},
            "customer": {"name": f"c{i}", "since": datetime.date(2020, 1, 1) + datetime.timedelta(days=i)},
            **extra}


def typed_rows(env: Env, table: str, columns: str) -> list[tuple[Any, ...]]:
    env.spark.sql(f"REFRESH TABLE dcmirror.{table}")
    return sorted(tuple(r) for r in env.spark.sql(f"SELECT {columns} FROM dcmirror.{table}").collect())


def test_three_schema_versions_load_into_typed_columns_and_poison_goes_to_dead_letters(env: Env) -> None:
    create_topics(env.broker.bootstrap, {TOPIC: 2})
    # An unrelated schema in the default context first: its id is the one Order v1 gets in
    # context .east, so a lookup in the wrong context would decode garbage or fail.
    default_id = env.client.register_schema("unrelated-value", _schema(OTHER))
    v1 = env.serializer(V1)
    env.feed.produce(TOPIC, 2, 4, source="east", value=lambda n: v1(order(n)))
    east_v1_id = int.from_bytes(v1(order(0))[1:5], "big")
    assert east_v1_id == default_id, "ids are per context: east's first schema has the default context's first id"

    out = env.load("east[.]orders")
    assert "poison" not in out
    schema = {f.name: f.dataType.simpleString() for f in env.spark.table("dcmirror.east_orders").schema.fields}
    assert {k: schema[k] for k in ("id", "amount", "placed", "status", "tags", "attrs", "customer")} == {
        "id": "bigint", "amount": "decimal(9,2)", "placed": "timestamp", "status": "string",
        "tags": "array<string>", "attrs": "map<string,bigint>", "customer": "struct<name:string,since:date>"}
    assert "note" not in schema
    first = typed_rows(env, "east_orders", "id, amount, placed, status, tags, attrs, customer.name, customer.since, "
                                           "source_cluster, source_dc, kafka_partition, kafka_offset")
    assert first == [(i, decimal.Decimal(f"{i}.25"), datetime.datetime(2026, 1, 2, 3, 4, 5, 6000 * i), "PAID" if i % 2
                      else "NEW", [f"t{i}"] * (i % 3), {"n": i}, f"c{i}",
                      datetime.date(2020, 1, 1) + datetime.timedelta(days=i), "east", "dc-east", i % 2, i // 2)
                     for i in range(4)]

    # Version 2 and 3 add optional fields (BACKWARD compatible); a v1 writer keeps writing.
    v2, v3 = env.serializer(V2), env.serializer(V3)
    env.feed.produce(TOPIC, 2, 2, source="east", value=lambda n: v2(order(n, note=f"n{n}")))
    env.feed.produce(TOPIC, 2, 2, source="east", value=lambda n: v3(order(n, note=None, discount=n / 2)))
    env.feed.produce(TOPIC, 2, 2, source="east", value=lambda n: v1(order(n)))
    poison = [b"\x01\x00\x00\x00\x01garbage", v3(order(99))[:9], b"\x00\x00"]
    env.feed.produce(TOPIC, 1, len(poison), source="east", value=lambda n: poison[n - 10])

    out = env.load("east[.]orders")
    assert "3 poison records into dcmirror.east_orders_dead_letters" in out, out
    schema = {f.name: f.dataType.simpleString() for f in env.spark.table("dcmirror.east_orders").schema.fields}
    assert schema["note"] == "string" and schema["discount"] == "double"
    rows = typed_rows(env, "east_orders", "id, note, discount, amount, customer.name")
    expected = [(i, None, None) for i in range(4)] + [(4, "n4", None), (5, "n5", None)] \
        + [(6, None, 3.0), (7, None, 3.5)] + [(8, None, None), (9, None, None)]
    assert [r[:3] for r in rows] == expected
    assert all(r[3] == decimal.Decimal(f"{r[0]}.25") and r[4] == f"c{r[0]}" for r in rows)

    dead = typed_rows(env, "east_orders_dead_letters",
                      "topic, kafka_partition, kafka_offset, schema_id, value, source_cluster, source_dc")
    offsets = {(s.partition, s.offset): s for s in env.feed.sent if s.value in poison}
    assert [(r[1], r[2]) for r in dead] == sorted(offsets)
    assert [bytes(r[4]) for r in dead] == [offsets[(r[1], r[2])].value for r in dead]
    assert {r[0] for r in dead} == {TOPIC} and {r[5] for r in dead} == {"east"} and {r[6] for r in dead} == {"dc-east"}
    reasons = typed_rows(env, "east_orders_dead_letters", "reason")
    assert any("magic byte 1" in r[0] for r in reasons)
    assert any("shorter than the wire format" in r[0] for r in reasons)
    assert any("does not decode" in r[0] for r in reasons), reasons


def _schema(doc: dict[str, Any]) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(doc), "AVRO")


def test_an_incompatible_change_stops_the_load_before_planning(env: Env) -> None:
    """A new version that changes a column's type (registered with compatibility NONE) is no
    compatible evolution of the table: the load stops naming topic, column and schema ids,
    and plans nothing. (It leaves orders-value's latest version incompatible: later tests use other subjects.)"""
    assert httpx.put(f"{env.registry.url}/config/{SUBJECT}", json={"compatibility": "NONE"}).status_code == 200
    v4 = {**V3, "fields": [{"name": "amount", "type": "string"} if f["name"] == "amount" else f
                           for f in V3["fields"]]}
    env.feed.produce(TOPIC, 2, 2, source="east", value=lambda n: env.serializer(v4)(order(n, amount=str(n))))
    env.spark.sql("REFRESH TABLE dcmirror.loads")
    before = env.spark.sql("SELECT count(*) FROM dcmirror.loads").first()[0]
    with pytest.raises(LoadConfigError) as caught:
        env.load("east[.]orders")
    message = str(caught.value)
    assert "topic 'east.orders'" in message and "column 'amount' string" in message, message
    assert "holds it as decimal(9,2)" in message and ".east: " in message, message
    env.spark.sql("REFRESH TABLE dcmirror.loads")
    assert env.spark.sql("SELECT count(*) FROM dcmirror.loads").first()[0] == before


def test_json_schema_values_load_into_the_declared_columns(env: Env) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    topic = "east.events"
    create_topics(env.broker.bootstrap, {topic: 1})
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Event", "type": "object",
              "properties": {"id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
                             "tags": {"type": "array", "items": {"type": "string"}},
                             "where": {"type": "object", "properties": {"city": {"type": "string"}}},
                             "score": {"type": ["null", "number"]}}}
    json_ser = JSONSerializer(json.dumps(schema), env.client,
                              conf={"auto.register.schemas": True,
                                    "subject.name.strategy": lambda ctx, name: ":.east:events-value"})

    def event(n: int) -> bytes:
        doc = {"id": n, "at": f"2026-01-02T03:04:0{n % 10}Z", "tags": [f"t{n}"], "where": {"city": f"c{n}"},
               "score": None if n % 2 else n / 4}
        return json_ser(doc, SerializationContext(topic, MessageField.VALUE))

    sent = env.feed.produce(topic, 1, 3, source="east", value=event)
    env.feed.produce(topic, 1, 1, source="east", value=lambda n: b"\x00" + sent[0].value[1:5] + b"{broken")
    out = env.load("east[.]events")
    assert "1 poison records into dcmirror.east_events_dead_letters" in out, out
    schema_of = {f.name: f.dataType.simpleString() for f in env.spark.table("dcmirror.east_events").schema.fields}
    assert {k: schema_of[k] for k in ("id", "at", "tags", "where", "score")} == {
        "id": "bigint", "at": "timestamp", "tags": "array<string>", "where": "struct<city:string>", "score": "double"}
    assert sent[0].value is not None
    first = int(json.loads(sent[0].value[5:])["id"])
    rows = typed_rows(env, "east_events", "id, at, tags, `where`.city, score")
    assert rows == [(first + i, datetime.datetime(2026, 1, 2, 3, 4, (first + i) % 10), [f"t{first + i}"],
                     f"c{first + i}", None if (first + i) % 2 else (first + i) / 4) for i in range(3)]
    dead = typed_rows(env, "east_events_dead_letters", "kafka_offset, reason")
    assert [r[0] for r in dead] == [3] and dead[0][1].startswith("payload is not JSON"), dead


def test_json_schema_references_and_primitive_json_keys_load(env: Env) -> None:
    """Issue 43: a JSON schema whose `$ref` points into another registered schema (a
    reference by name, as JSONSerializer resolves it) loads into the columns of both; a key
    whose JSON Schema is a string loads into record_key as the string itself."""
    from confluent_kafka.schema_registry import Schema, SchemaReference
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    topic = "east.shipments"
    create_topics(env.broker.bootstrap, {topic: 1})
    address = {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"Address": {
        "type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}}}}
    env.client.register_schema(":.east:address", Schema(json.dumps(address), "JSON"))
    shipment = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {
        "id": {"type": "integer"}, "to": {"$ref": "address.json#/definitions/Address"}}}
    value_ser = JSONSerializer(Schema(json.dumps(shipment), "JSON",
                                      [SchemaReference("address.json", ":.east:address", 1)]), env.client,
                               conf={"auto.register.schemas": True,
                                     "subject.name.strategy": lambda ctx, name: ":.east:shipments-value"})
    key_ser = JSONSerializer(json.dumps({"type": "string"}), env.client,
                             conf={"auto.register.schemas": True,
                                   "subject.name.strategy": lambda ctx, name: ":.east:shipments-key"})
    sent = env.feed.produce(
        topic, 1, 3, source="east",
        value=lambda n: value_ser({"id": n, "to": {"city": f"c{n}", "zip": 1000 + n}},
                                  SerializationContext(topic, MessageField.VALUE)),
        key=lambda n: key_ser(f"k{n}", SerializationContext(topic, MessageField.KEY)))
    out = env.load("east[.]shipments")
    assert "3 offsets" in out and "poison" not in out, out
    schema_of = {f.name: f.dataType.simpleString() for f in env.spark.table("dcmirror.east_shipments").schema.fields}
    assert (schema_of["to"], schema_of["record_key"]) == ("struct<city:string,zip:bigint>", "string"), schema_of
    ids = [json.loads(s.value[5:])["id"] for s in sent]
    assert typed_rows(env, "east_shipments", "kafka_offset, id, `to`.city, `to`.zip, record_key") == [
        (i, ids[i], f"c{ids[i]}", 1000 + ids[i], f"k{ids[i]}") for i in range(3)]


CLICK_PROTO = """
syntax = "proto3";
package web;
import "google/protobuf/timestamp.proto";
message Click {
  int64 id = 1;
  string page = 2;
  google.protobuf.Timestamp at = 3;
  Kind kind = 4;
  repeated string tags = 5;
  map<string, int64> counts = 6;
  Where where = 7;
  optional double score = 8;
  uint64 big = 9;
  message Where { string city = 1; }
  enum Kind { VIEW = 0; BUY = 1; }
}
"""


def test_protobuf_values_load_into_typed_columns(env: Env) -> None:
    """confluent-kafka's ProtobufSerializer (message indexes, the schema registered as a
    serialized FileDescriptorProto, google/protobuf/timestamp.proto as a known type)."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import message_factory

    from cluster.registry import formats

    topic = "east.clicks"
    create_topics(env.broker.bootstrap, {topic: 1})
    pool = formats.parse("PROTOBUF", CLICK_PROTO).parsed.pool
    click = message_factory.GetMessageClass(pool.FindMessageTypeByName("web.Click"))
    ser = ProtobufSerializer(click, env.client, {"auto.register.schemas": True, "use.deprecated.format": False,
                                                 "subject.name.strategy": lambda ctx, name: ":.east:clicks-value"})

    def value(n: int) -> bytes:
        msg = click(id=n, page=f"/p{n}", kind=n % 2, tags=[f"t{n}"] * (n % 3), big=2**63 + n)
        msg.at.seconds = 1_790_000_000 + n
        msg.counts["n"] = n
        if n % 2:
            msg.where.city = f"c{n}"
            msg.score = n / 4
        out: bytes = ser(msg, SerializationContext(topic, MessageField.VALUE))
        return out

    sent = env.feed.produce(topic, 1, 4, source="east", value=value)
    env.feed.produce(topic, 1, 1, source="east", value=lambda n: sent[0].value[:6] + b"\x0a\x09cut")
    out = env.load("east[.]clicks")
    assert "1 poison records into dcmirror.east_clicks_dead_letters" in out, out
    schema_of = {f.name: f.dataType.simpleString() for f in env.spark.table("dcmirror.east_clicks").schema.fields}
    assert {k: schema_of[k] for k in ("id", "page", "at", "kind", "tags", "counts", "where", "score", "big")} == {
        "id": "bigint", "page": "string", "at": "timestamp", "kind": "string", "tags": "array<string>",
        "counts": "map<string,bigint>", "where": "struct<city:string>", "score": "double", "big": "decimal(20,0)"}
    ids = [click.FromString(s.value[6:]).id for s in sent]
    rows = typed_rows(env, "east_clicks", "id, page, at, kind, tags, counts['n'], `where`.city, score, big")
    assert rows == [(n, f"/p{n}", datetime.datetime.fromtimestamp(1_790_000_000 + n, datetime.UTC).replace(tzinfo=None), "BUY" if n % 2 else "VIEW",
                     [f"t{n}"] * (n % 3), n, f"c{n}" if n % 2 else None, n / 4 if n % 2 else None,
                     decimal.Decimal(2**63 + n)) for n in ids]
    dead = typed_rows(env, "east_clicks_dead_letters", "kafka_offset, reason")
    assert [r[0] for r in dead] == [4] and "does not decode as web.Click" in dead[0][1], dead


CART_KEY = {"type": "record", "name": "CartKey", "namespace": "shop",
            "fields": [{"name": "cart", "type": "long"}, {"name": "shard", "type": "string"}]}


def test_typed_keys_load_into_record_key(env: Env) -> None:
    """key = true: AvroSerializer on the key (subject carts-key in the source's context) ->
    the struct column record_key; a null key is NULL, a poison key a dead letter."""
    topic = "east.carts"
    create_topics(env.broker.bootstrap, {topic: 1})
    key_ser = AvroSerializer(env.client, json.dumps(CART_KEY),
                             conf={"auto.register.schemas": True,
                                   "subject.name.strategy": lambda ctx, name: ":.east:carts-key"})
    value_ser = env.serializer(V1, ":.east:carts-value")

    def key(n: int) -> bytes | None:
        if n % 4 == 1:
            return None
        out: bytes = key_ser({"cart": n, "shard": f"s{n % 3}"}, SerializationContext(topic, MessageField.KEY))
        return out

    sent = env.feed.produce(topic, 1, 4, source="east", value=lambda n: value_ser(order(n)), key=key)
    env.feed.produce(topic, 1, 1, source="east", value=lambda n: value_ser(order(n)), key=lambda n: b"\x00\x01")
    out = env.load("east[.]carts")
    assert "1 poison records into dcmirror.east_carts_dead_letters" in out, out
    schema_of = {f.name: f.dataType.simpleString() for f in env.spark.table("dcmirror.east_carts").schema.fields}
    assert schema_of["record_key"] == "struct<cart:bigint,shard:string>" and schema_of["key"] == "binary"
    import fastavro

    ids = [fastavro.schemaless_reader(io.BytesIO(s.value[5:]), fastavro.parse_schema(V1))["id"] for s in sent]
    rows = typed_rows(env, "east_carts", "kafka_offset, id, record_key.cart, record_key.shard")
    assert rows == [(i, ids[i], None if sent[i].key is None else ids[i],
                     None if sent[i].key is None else f"s{ids[i] % 3}") for i in range(4)]
    assert sum(1 for s in sent if s.key is None) == 1
    dead = typed_rows(env, "east_carts_dead_letters", "kafka_offset, reason")
    assert dead == [(4, "key: 2 bytes, shorter than the wire format's 5-byte header")], dead


def test_a_typed_topic_without_records_or_schema_yet_waits_for_its_first_record(env: Env) -> None:
    """Issue 41: a new deployment of the default topology has `orders` topics and no order
    yet, so no schema: the first load failed whole ("no subject for topic"). A typed topic
    that never held a record is left until it does; the others load; its table comes with
    its first records. (Before the unknown-id test: it leaves a load that never finishes.)"""
    create_topics(env.broker.bootstrap, {"east.returns": 1, "east.plain_returns": 1})
    env.feed.produce("east.plain_returns", 1, 4, source="east")
    assert httpx.get(f"{env.registry.url}/subjects/:.east:returns-value/versions").status_code == 404
    out = env.load("east[.](returns|plain_returns)")
    assert "4 offsets" in out, out
    tables = {t.name for t in env.spark.catalog.listTables("dcmirror")}
    assert "east_plain_returns" in tables and "east_returns" not in tables, tables
    first = env.serializer(V1, ":.east:returns-value")
    env.feed.produce("east.returns", 1, 2, source="east", value=lambda n: first(order(n)))
    out = env.load("east[.](returns|plain_returns)")
    assert "2 offsets" in out, out
    assert len(typed_rows(env, "east_returns", "id, amount")) == 2


def test_an_unknown_schema_id_is_a_dead_letter_under_the_dead_letter_policy(env: Env) -> None:
    """Issue 43 (7): an id the registry does not know follows the topic's poison policy; under
    "dead-letter" the record goes to the dead-letter table naming the id, the rest loads."""
    topic = "east.unknown_ids"
    create_topics(env.broker.bootstrap, {topic: 1})
    v1 = env.serializer(V1, ":.east:refunds-value")
    good = v1(order(1))
    env.feed.produce(topic, 1, 3, source="east",
                     value=lambda n: good if n != len(env.feed.sent) + 1 else b"\x00\x00\x00\x27\x0f" + good[5:])
    # The registry answers for subject refunds-value in context .east.
    assert httpx.get(f"{env.registry.url}/subjects/:.east:refunds-value/versions").status_code == 200
    bad = next(s for s in env.feed.sent if s.topic == topic and s.value[1:5] == b"\x00\x00\x27\x0f")
    out = env.load("east[.]unknown_ids")
    assert "1 poison records into dcmirror.east_unknown_ids_dead_letters" in out, out
    assert [r[0] for r in typed_rows(env, "east_unknown_ids", "kafka_offset")] == [
        o for o in range(3) if o != bad.offset]
    assert typed_rows(env, "east_unknown_ids_dead_letters", "kafka_partition, kafka_offset, schema_id, reason") == [
        (bad.partition, bad.offset, 9999, f"schema id 9999 is unknown in registry context .east at {env.registry.url}")]
    env.spark.sql("REFRESH TABLE dcmirror.loads")
    assert env.spark.sql(f"SELECT count(*) FROM dcmirror.loads WHERE topic = '{topic}' AND status = 'committed'"
                         ).first()[0] == 1
    # Nothing new, the id still unknown: nothing reloaded.
    assert "reload" not in env.load("east[.]unknown_ids")
    # The schema appears under id 9999 (imported, as a mirror's schema sync would): the next
    # load reloads the dead letter into the table, once; it stays in the dead-letter table.
    late = ":.east:late-value"
    assert httpx.put(f"{env.registry.url}/mode/{late}", json={"mode": "IMPORT"}).status_code == 200
    assert httpx.post(f"{env.registry.url}/subjects/{late}/versions",
                      json={"schema": json.dumps(V1), "id": 9999}).json() == {"id": 9999}
    out = env.load("east[.]unknown_ids")
    assert "reloading 1 dead letters of east.unknown_ids" in out and "poison" not in out, out
    assert typed_rows(env, "east_unknown_ids", "kafka_offset, id") == [(o, 1) for o in range(3)]
    assert "reload" not in env.load("east[.]unknown_ids")
    assert len(typed_rows(env, "east_unknown_ids", "kafka_offset")) == 3
    assert len(typed_rows(env, "east_unknown_ids_dead_letters", "kafka_offset")) == 1
    env.spark.sql("REFRESH TABLE dcmirror.loads")
    assert env.spark.sql(f"SELECT start_offset, end_offset, rows FROM dcmirror.loads WHERE topic = '{topic}' "
                         "AND note = 'reload of dead letters'").collect() == [(bad.offset, bad.offset + 1, None)]


def test_a_topic_that_cannot_load_holds_no_other_topic_back(env: Env) -> None:
    """Issue 43 (7): under poison = "fail" an unknown id stops that topic only: the other
    topics of the same load commit, the stuck topic stays planned, later loads still take the
    others' new records, and a warehouse that stops loading the stuck topic (its topics regex
    narrowed, as an east-only topology) goes on without finishing it."""
    stuck, flowing = "east.stuck", "east.flowing"
    create_topics(env.broker.bootstrap, {stuck: 1, flowing: 1})
    v1 = env.serializer(V1, ":.east:refunds-value")
    good = v1(order(1))
    env.feed.produce(stuck, 1, 2, source="east", value=lambda n: b"\x00\x00\x00\x27\x0e" + good[5:])
    env.feed.produce(flowing, 1, 3, source="east", value=lambda n: good)
    both = "east[.](stuck|flowing)"
    with pytest.raises(TopicsFailed) as caught:
        env.load(both)
    assert list(caught.value.failed) == [stuck], caught.value.failed
    # Both records have the unknown id; the range may be read by two tasks, either failing first.
    assert re.search(rf"topic {re.escape(repr(stuck))} partition 0 offset [01]: schema id 9998 is unknown in "
                     r"registry context \.east", caught.value.failed[stuck]), caught.value.failed
    assert not isinstance(caught.value, LoadConfigError)
    assert len(typed_rows(env, "east_flowing", "kafka_offset")) == 3

    def committed(topic: str) -> int:
        env.spark.sql("REFRESH TABLE dcmirror.loads")
        return int(env.spark.sql(f"SELECT count(*) FROM dcmirror.loads WHERE topic = '{topic}' "
                                 "AND status = 'committed'").first()[0])

    assert committed(stuck) == 0 and committed(flowing) == 1
    env.feed.produce(flowing, 1, 2, source="east", value=lambda n: good)
    with pytest.raises(TopicsFailed) as again:   # the stuck topic is tried again first, and fails again
        env.load(both)
    assert list(again.value.failed) == [stuck]
    assert [r[0] for r in typed_rows(env, "east_flowing", "kafka_offset")] == [0, 1, 2, 3, 4]
    assert committed(flowing) == 2 and committed(stuck) == 0
    # The warehouse stops loading the stuck topic: its interrupted load is not finished, the rest goes on.
    env.feed.produce(flowing, 1, 1, source="east", value=lambda n: good)
    out = env.load("east[.]flowing")
    assert f"{stuck} no longer loaded by this warehouse" in out, out
    assert [r[0] for r in typed_rows(env, "east_flowing", "kafka_offset")] == [0, 1, 2, 3, 4, 5]
    assert committed(stuck) == 0


def test_a_first_load_that_meets_a_changed_type_stops_naming_the_record(env: Env) -> None:
    """Issue 43 (5): a NONE subject where `amount` went from decimal to string; the first
    typed load makes the table of the latest version, and the older records' decimals do not
    fit it: the load stops naming topic, partition, offset and schema id, commits nothing for
    the topic, and its error report is whole (it crashed inside Spark before)."""
    topic = "east.amounts"
    create_topics(env.broker.bootstrap, {topic: 1})
    subject = ":.east:amounts-value"
    assert httpx.put(f"{env.registry.url}/config/{subject}", json={"compatibility": "NONE"}).status_code == 200
    as_text = {**V1, "fields": [{"name": "amount", "type": "string"} if f["name"] == "amount" else f
                                for f in V1["fields"]]}
    older, newer = env.serializer(V1, subject), env.serializer(as_text, subject)
    env.feed.produce(topic, 1, 2, source="east", value=lambda n: older(order(n)))
    env.feed.produce(topic, 1, 2, source="east", value=lambda n: newer(order(n, amount=str(n))))
    older_id = int.from_bytes(older(order(0))[1:5], "big")
    olders = [s for s in env.feed.sent if s.topic == topic][:2]
    with pytest.raises(TopicsFailed) as caught:
        env.load("east[.]amounts")
    message = caught.value.failed[topic]
    # Either older record may be named first: the range may be read by more than one task.
    assert any(f"topic {topic!r} partition {o.partition} offset {o.offset}: schema id {older_id} cannot be read "
               "as the table's schema" in message for o in olders), message
    assert "ArrowTypeError" in message and "nothing was committed" in message, message
    env.spark.sql("REFRESH TABLE dcmirror.loads")
    assert env.spark.sql(f"SELECT count(*) FROM dcmirror.loads WHERE topic = '{topic}' AND status = 'committed'"
                         ).first()[0] == 0


def test_a_flows_schema_context_and_rename_lead_to_the_subject_and_the_ids(env: Env) -> None:
    """Issue 43 (6): west's flow copies its schemas into context .emea (schema_context) and
    names its topics from_west_<topic> (rename): the typed load finds subject refunds-value
    in .emea for topic from_west_refunds and decodes west's records by their ids there."""
    topic = "from_west_refunds"
    create_topics(env.broker.bootstrap, {topic: 1})
    v1 = env.serializer(V1, ":.emea:refunds-value")
    env.feed.produce(topic, 1, 3, source="west", value=lambda n: v1(order(n)))
    assert env.settings.schema_sources(topic) == (("west", ".emea", "refunds"),)
    out = env.load("from_west_refunds")
    assert "poison" not in out, out
    rows = typed_rows(env, "from_west_refunds", "id, amount, source_cluster, source_dc")
    assert [r[2:] for r in rows] == [("west", "dc-west")] * 3
    assert sorted(r[1] - r[0] for r in rows) == [decimal.Decimal("0.25")] * 3
