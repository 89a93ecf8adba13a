"""confluent-kafka's SchemaRegistryClient and its Avro, JSON Schema and Protobuf serdes
against a `dcmirror registry` process and a real broker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.harness import BrokerProcess
from tests.registry.common import RegistryProcess

USER_V1 = json.dumps({"type": "record", "name": "User", "namespace": "t",
                      "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]})
USER_V2 = json.dumps({"type": "record", "name": "User", "namespace": "t",
                      "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"},
                                 {"name": "email", "type": ["null", "string"], "default": None}]})



@pytest.fixture(scope="module")
def registry(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryProcess]:
    reg = RegistryProcess(tmp_path_factory.mktemp("registry-clients-log") / "registry.log",
                          bootstrap=broker.bootstrap).start()
    try:
        yield reg
    finally:
        reg.stop()


def client(reg: RegistryProcess) -> SchemaRegistryClient:
    """A new client (its caches empty), so answers come from the registry."""
    return SchemaRegistryClient({"url": reg.url})


def test_schema_registry_client(registry: RegistryProcess) -> None:
    sr = client(registry)
    id1 = sr.register_schema("cl-users-value", Schema(USER_V1, "AVRO"))
    id2 = sr.register_schema("cl-users-value", Schema(USER_V2, "AVRO"))
    assert id2 != id1
    assert sr.register_schema("cl-users-value", Schema(USER_V1, "AVRO")) == id1
    assert "cl-users-value" in sr.get_subjects()
    assert sr.get_versions("cl-users-value") == [1, 2]
    latest = sr.get_latest_version("cl-users-value")
    assert (latest.schema_id, latest.version, latest.subject) == (id2, 2, "cl-users-value")
    assert json.loads(str(latest.schema.schema_str)) == json.loads(USER_V2)
    fresh = client(registry)
    assert json.loads(str(fresh.get_schema(id1).schema_str)) == json.loads(USER_V1)
    found = fresh.lookup_schema("cl-users-value", Schema(USER_V1, "AVRO"))
    assert (found.schema_id, found.version) == (id1, 1)
    assert fresh.get_version("cl-users-value", 1).schema_id == id1
    assert fresh.test_compatibility("cl-users-value", Schema(USER_V2, "AVRO")) is True
    breaking = json.dumps({"type": "record", "name": "User", "namespace": "t",
                           "fields": [{"name": "name", "type": "int"}]})
    assert fresh.test_compatibility("cl-users-value", Schema(breaking, "AVRO")) is False
    with pytest.raises(SchemaRegistryError) as info:
        fresh.register_schema("cl-users-value", Schema(breaking, "AVRO"))
    assert info.value.http_status_code == 409
    assert fresh.delete_version("cl-users-value", 1) == 1
    assert fresh.get_versions("cl-users-value") == [2]
    assert fresh.delete_subject("cl-users-value") == [2]
    assert fresh.delete_subject("cl-users-value", permanent=True) == [1, 2]
    with pytest.raises(SchemaRegistryError) as info:
        fresh.get_versions("cl-users-value")
    assert info.value.error_code == 40401


def test_avro_serdes_through_the_broker(registry: RegistryProcess, broker: BrokerProcess) -> None:
    topic = "cl-avro-events"
    sr = client(registry)
    v1 = AvroSerializer(sr, USER_V1, conf={"auto.register.schemas": True})
    v2 = AvroSerializer(sr, USER_V2, conf={"auto.register.schemas": True})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer.produce(topic, v1({"name": "ann", "age": 30}, ctx))
    producer.produce(topic, v2({"name": "bob", "age": 40, "email": "b@x"}, ctx))
    # use.latest.version: no registration, the subject's latest schema (v2) is used
    latest = AvroSerializer(client(registry), USER_V1,
                            conf={"auto.register.schemas": False, "use.latest.version": True})
    producer.produce(topic, latest({"name": "cy", "age": 50}, ctx))
    assert producer.flush(30) == 0
    assert client(registry).get_versions(f"{topic}-value") == [1, 2]

    deserializer = AvroDeserializer(client(registry))
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "cl-avro", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            value = deserializer(msg.value(), ctx)
            assert isinstance(value, dict)
            got.append(value)
    finally:
        consumer.close()
    assert [g["name"] for g in got] == ["ann", "bob", "cy"]
    assert got[1]["email"] == "b@x" and got[2].get("email") is None


def _consume_values(broker: BrokerProcess, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic}-reader",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error() and (value := msg.value()) is not None:
                got.append(value)
    finally:
        consumer.close()
    return got


def test_json_schema_and_protobuf_serdes(registry: RegistryProcess, broker: BrokerProcess) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from google.protobuf.timestamp_pb2 import Timestamp

    order = json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
                        "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},
                        "required": ["id"]})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    jctx = SerializationContext("cl-json-orders", MessageField.VALUE)
    producer.produce("cl-json-orders", JSONSerializer(order, client(registry))({"id": 7, "note": "x"}, jctx))
    pctx = SerializationContext("cl-proto-times", MessageField.VALUE)
    stamp = Timestamp(seconds=1_700_000_000, nanos=5)
    producer.produce("cl-proto-times", ProtobufSerializer(Timestamp, client(registry),
                                                          {"use.deprecated.format": False})(stamp, pctx))
    assert producer.flush(30) == 0
    latest = client(registry).get_latest_version("cl-json-orders-value")
    assert latest.schema.schema_type == "JSON"
    assert client(registry).get_latest_version("cl-proto-times-value").schema.schema_type == "PROTOBUF"
    [raw_json] = _consume_values(broker, "cl-json-orders", 1)
    assert JSONDeserializer(None, schema_registry_client=client(registry))(raw_json, jctx) == {"id": 7, "note": "x"}
    [raw_proto] = _consume_values(broker, "cl-proto-times", 1)
    decoded = ProtobufDeserializer(Timestamp, {"use.deprecated.format": False})(raw_proto, pctx)
    assert decoded == stamp
