"""The record browser decodes Confluent wire-format values through the cluster's schema
registry: a real broker and `dcmirror registry`, records written by confluent-kafka's Avro and
JSON Schema and Protobuf serializers, read back on the console's records page as their fields;
a payload whose schema id the registry does not know stays bytes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import trio

from tests.harness import BrokerProcess
from tests.registry.common import RegistryProcess

AVRO = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "string"}, {"name": "quantity", "type": "int"},
    {"name": "product", "type": {"type": "enum", "name": "Product", "symbols": ["book", "lamp"]}}]})
JSON_SCHEMA = json.dumps({"type": "object", "properties": {"id": {"type": "string"}, "n": {"type": "integer"}},
                          "required": ["id"]})
PROTO = """syntax = "proto3";
package shop;
message Other { string x = 1; }
message Parcel { string id = 1; int64 grams = 2; repeated string labels = 3; }
"""


def test_values_are_decoded_through_the_registry(broker: BrokerProcess, tmp_path: Path) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    registry = RegistryProcess(tmp_path / "registry.log", bootstrap=broker.bootstrap).start()
    try:
        client = SchemaRegistryClient({"url": registry.url})
        avro = AvroSerializer(client, AVRO)
        as_json = JSONSerializer(JSON_SCHEMA, client)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(3):
            value = avro({"id": f"o-{i}", "quantity": i + 1, "product": "lamp"},
                         SerializationContext("orders", MessageField.VALUE))
            producer.produce("orders", value=value, partition=0)
        producer.produce("events", value=as_json({"id": "e-0", "n": 7}, SerializationContext("events", MessageField.VALUE)),
                         partition=0)
        producer.produce("events", value=b"\x00\x00\x00\x03\xe7not a known schema", partition=0)
        # Protobuf (issue 43, 8): the second message of the file, so the message indexes matter.
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from google.protobuf import message_factory

        from cluster.registry import formats

        parcel = message_factory.GetMessageClass(
            formats.parse("PROTOBUF", PROTO).parsed.pool.FindMessageTypeByName("shop.Parcel"))
        as_proto = ProtobufSerializer(parcel, client, {"use.deprecated.format": False})
        ctx = SerializationContext("parcels", MessageField.VALUE)
        good = as_proto(parcel(id="p-1", grams=1250, labels=["fragile", "up"]), ctx)
        producer.produce("parcels", value=good, partition=0)
        producer.produce("parcels", value=good[:7] + b"\x0a\x09cut", partition=0)
        assert producer.flush(15) == 0

        path = tmp_path / "topology.toml"
        path.write_text(f'[clusters.one]\ndatacenter = "here"\nbrokers = ["{broker.bootstrap}"]\n\n'
                        f'[clusters.one.registry]\nlisten = "127.0.0.1:{registry.port}"\n')
        pages: dict[str, str] = {}

        async def main() -> None:
            from deploy.console.app import build_app
            from deploy.console.server import make_console
            from topology import load

            console = make_console(load(path), refresh_s=1.0)
            await console.poller.poll_once()
            transport = httpx.ASGITransport(app=build_app(console))
            async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as web:
                for topic in ("orders", "events", "parcels"):
                    r = await web.get(f"/clusters/one/topics/{topic}/records", params={"partition": 0, "offset": 0})
                    assert r.status_code == 200
                    pages[topic] = r.text
                r = await web.get("/clusters/one/topics/orders/records", params={"partition": 0, "mode": "hex"})
                pages["hex"] = r.text
            for c in console.poller.clusters.values():
                await c.close()

        trio.run(main)
    finally:
        registry.stop()

    orders = pages["orders"]
    assert len(re.findall(r"Value \(Avro, schema id \d+\)", orders)) == 3, orders[-3000:]
    for i in range(3):
        assert f"&#34;id&#34;: &#34;o-{i}&#34;" in orders and f"&#34;quantity&#34;: {i + 1}" in orders
    assert "&#34;product&#34;: &#34;lamp&#34;" in orders
    events = pages["events"]
    assert re.search(r"Value \(JSON Schema, schema id \d+\)", events) and "&#34;n&#34;: 7" in events
    assert "Value (text)" in events or "Value (hex)" in events  # schema id 999 is unknown: shown as bytes
    assert "Avro, schema id" not in pages["hex"]  # asked for hex: the bytes as they are
    parcels = pages["parcels"]
    assert re.search(r"Value \(Protobuf, schema id \d+\)", parcels), parcels[-3000:]
    assert "&#34;id&#34;: &#34;p-1&#34;" in parcels and "&#34;grams&#34;: 1250" in parcels, parcels[-3000:]
    assert "&#34;fragile&#34;" in parcels
    assert re.search(r"Value \(Protobuf, schema id \d+, not decodable: ", parcels), parcels[-3000:]
