"""Keys and values in Confluent's wire format (magic byte 0, a 4-byte schema id, the payload)
decoded through the schema registry of the cluster they are read from, for the record
browser. Avro with fastavro, JSON Schema as its JSON, Protobuf through its descriptors built
from the registry's serialized schema (spark_aggregate/typed_protobuf.py, referenced files
included) and shown as JSON; a recursive message or a payload that does not decode is shown
as bytes with the reason.

A record mirrored into another cluster keeps its source's schema id: its schema is looked up
in the context the flow copied it into (`.<source cluster>`, mirror/schema_sync.py), the
others in the default context. Schemas are cached per (context, id), at most
SCHEMAS_CACHED of them; a registry that does not answer leaves the bytes as they are.
Blocking (httpx): call from a thread.
"""

from __future__ import annotations

import io
import json
from collections import OrderedDict
from typing import Any

from cluster.client.registry import RegistryAccess
from topology.model import RegistrySpec

SCHEMAS_CACHED = 1000
WIRE_HEADER_BYTES = 5


def wire_schema_id(data: bytes | None) -> int | None:
    """The schema id of a Confluent wire-format payload, None for anything else."""
    if data is None or len(data) < WIRE_HEADER_BYTES or data[0] != 0:
        return None
    return int.from_bytes(data[1:WIRE_HEADER_BYTES], "big")


class SchemaDecoder:
    def __init__(self, registry: RegistrySpec) -> None:
        from spark_aggregate.typed import RegistryReader

        self.url = registry.url
        self.reader = RegistryReader(registry.url, RegistryAccess(registry.auth_token, "", registry.keystore))
        self._schemas: OrderedDict[tuple[str, int], tuple[str, Any] | None] = OrderedDict()

    def _schema(self, context: str, schema_id: int) -> tuple[str, Any] | None:
        from spark_aggregate.typed import SchemaError, parse_avro

        key = (context, schema_id)
        if key in self._schemas:
            self._schemas.move_to_end(key)
            return self._schemas[key]
        try:
            found = self.reader.schema_by_id(schema_id, context)
        except SchemaError:
            return None  # not cached: asked again next time
        parsed: tuple[str, Any] | None = None
        if found is not None:
            kind, text = found
            try:
                if kind == "PROTOBUF":
                    from spark_aggregate.typed_protobuf import ProtobufSchemaError, fetch_protobuf

                    try:
                        parsed = (kind, fetch_protobuf(self.reader._get, schema_id, context))
                    except (ProtobufSchemaError, SchemaError):
                        parsed = (kind, None)
                else:
                    parsed = (kind, parse_avro(text) if kind == "AVRO" else None)
            except (ValueError, KeyError, TypeError):
                parsed = (kind, None)
        self._schemas[key] = parsed
        if len(self._schemas) > SCHEMAS_CACHED:
            self._schemas.popitem(last=False)
        return parsed

    def decode(self, data: bytes | None, context: str) -> tuple[str, str] | None:
        """(how, text) for a wire-format payload, None when it is not one or cannot be decoded."""
        schema_id = wire_schema_id(data)
        if schema_id is None:
            return None
        assert data is not None
        schema = self._schema(context, schema_id)
        if schema is None:
            return None
        kind, parsed = schema
        payload = data[WIRE_HEADER_BYTES:]
        try:
            if kind == "AVRO" and parsed is not None:
                import fastavro

                value = fastavro.schemaless_reader(io.BytesIO(payload), parsed, None)
                return f"Avro, schema id {schema_id}", json.dumps(value, indent=2, default=str, ensure_ascii=False)
            if kind == "JSON":
                return f"JSON Schema, schema id {schema_id}", json.dumps(json.loads(payload), indent=2,
                                                                         ensure_ascii=False)
            if kind == "PROTOBUF" and parsed is not None:
                from spark_aggregate.typed_protobuf import PoisonPayload, ProtobufSchemaError

                try:
                    row = parsed.decode(memoryview(payload))
                except (PoisonPayload, ProtobufSchemaError) as exc:
                    return f"Protobuf, schema id {schema_id}, not decodable: {exc}", payload.hex(" ")
                return f"Protobuf, schema id {schema_id}", json.dumps(row, indent=2, default=str, ensure_ascii=False)
        except (ValueError, EOFError, IndexError, TypeError, StopIteration):
            return f"{kind}, schema id {schema_id}, not decodable", payload.hex(" ")
        return f"{kind}, schema id {schema_id} (shown as bytes)", payload.hex(" ")


def context_of(source_cluster: str | None, cluster: str, contexts: tuple[tuple[str, str], ...] = ()) -> str:
    """The registry context a record's schema id belongs to (spark_aggregate/typed.py's rule;
    `contexts`: Topology.schema_contexts of `cluster`)."""
    from spark_aggregate.typed import context_of as typed_context

    return typed_context(source_cluster, cluster, contexts)
