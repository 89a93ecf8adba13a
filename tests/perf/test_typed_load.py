"""Typed Avro warehouse loads beside today's raw loads of the same records (issue 33: typed
at least 0.5x raw).

Setup: one standalone broker and a schema registry (`dcmirror registry`); an Avro record
schema of 9 fields (long, string, decimal, timestamp-millis, enum, array, map, nested
record, optional string) registered once; N records (a pool of 1,024 distinct ones,
~62 bytes each in the wire format) with mirror provenance headers written into two topics
of 6 partitions. One Spark session (local[2]): a small warm-up load, then
  1. the raw load: `dcmirror load` of one topic as bytes (today's tables);
  2. the typed load: the same records into a [warehouse.registry_schemas] table.
Also the decoder alone (spark_aggregate.typed.decode_rows, one process, no Spark) on 65,536
rows, for what the hot path costs per record: with the C loop (spark_aggregate/avro_batch.py)
and with fastavro per record (the path before it, and the fallback). Prints rates and the typed/raw ratio.
Knob: DCMIRROR_BENCH_TYPED_RECORDS (default 500,000).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import io
import json
import random
import time
from pathlib import Path
from typing import Any

import fastavro
import httpx
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from cluster.client.sync import SyncAdmin
from mirror.provenance import mirrored_headers
from spark_aggregate.load import Loader
from spark_aggregate.session import start_session, stop_session, warehouse_lock
from spark_aggregate.settings import WarehouseSettings
from spark_aggregate.stage import PARTITION_COLUMNS, RowContext, table_batch
from spark_aggregate.typed import plan_typed_table
from tests.perf.benchlib import emit, env_int, loadavg, producer_conf, progress
from tests.registry.common import RegistryProcess
from tests.spark.common import write_topology
from topology import load

pytestmark = [pytest.mark.perf, pytest.mark.timeout(3600)]
PARTITIONS = 6
SCHEMA: dict[str, Any] = {
    "type": "record", "name": "Order", "namespace": "bench", "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": "string"}]}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ]}


def pool(schema_id: int, count: int = 1024) -> list[bytes]:
    parsed = fastavro.parse_schema(SCHEMA)
    rnd = random.Random(7)
    out = []
    for i in range(count):
        record = {"id": i, "user": f"user-{rnd.randrange(10**6)}", "amount": decimal.Decimal(rnd.randrange(10**7)) / 100,
                  "placed": datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC) + datetime.timedelta(seconds=i),
                  "status": rnd.choice(["NEW", "PAID", "SHIPPED"]), "tags": [f"t{j}" for j in range(i % 3)],
                  "attrs": {"qty": rnd.randrange(10), "sku": rnd.randrange(10**6)},
                  "address": {"city": rnd.choice(["Oslo", "Lyon", "Kyoto"]), "zip": f"{rnd.randrange(10**5):05d}"},
                  "note": None if i % 4 else "gift"}
        buf = io.BytesIO()
        buf.write(b"\x00" + schema_id.to_bytes(4, "big"))
        fastavro.schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def produce(bootstrap: str, topics: list[str], n: int, values: list[bytes]) -> None:
    p = Producer(producer_conf(bootstrap, **{"linger.ms": 20}))
    ts = int(time.time() * 1000)
    for topic in topics:
        for i in range(n):
            partition = i % PARTITIONS
            headers = mirrored_headers((), "east", partition, i // PARTITIONS, "3Qd-h9ZzQ1uR0gGxXw7k2A", 1)
            while True:
                try:
                    p.produce(topic, values[i % len(values)], None, partition=partition, timestamp=ts,
                              headers=list(headers))
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 10_000 == 0:
                p.poll(0)
    assert p.flush(120) == 0


def test_typed_avro_load_beside_the_raw_load(tmp_path: Path) -> None:
    n = env_int("DCMIRROR_BENCH_TYPED_RECORDS", 500_000)
    from tests.harness import BrokerProcess

    broker = BrokerProcess(tmp_path / "broker", group_initial_rebalance_delay_ms=0).start()
    registry = None
    try:
        registry = RegistryProcess(tmp_path / "registry.log", bootstrap=broker.bootstrap).start()
        # Records mirrored from east: their ids live in context .east.
        got = httpx.post(f"{registry.url}/subjects/:.east:orders-value/versions",
                         json={"schema": json.dumps(SCHEMA)}, timeout=10).json()
        values = pool(got["id"])
        with SyncAdmin(broker.bootstrap) as admin:
            for topic in ("warmup.raw", "warmup.typed", "east.orders", "raw.orders"):
                admin.create_topic(topic, PARTITIONS, 1)
        time.sleep(1.0)
        produce(broker.bootstrap, ["warmup.raw", "warmup.typed"], 12_000, values)
        started = time.perf_counter()
        produce(broker.bootstrap, ["raw.orders", "east.orders"], n, values)
        progress(f"produced 2 x {n:,} records in {time.perf_counter() - started:.1f} s")

        topology = write_topology(tmp_path / "topology.toml", broker.bootstrap, tmp_path / "warehouse")
        with topology.open("a") as f:
            f.write(f'\n[clusters.aggregate.registry]\nlisten = "127.0.0.1:{registry.port}"\n\n'
                    '[warehouse.registry_schemas]\n"east[.]orders" = { value = true }\n'
                    '"warmup[.]typed" = { subject = "orders-value" }\n')
        settings = WarehouseSettings.from_topology(load(topology))

        # The decoder alone, in this process.
        typed = plan_typed_table("east.orders", registry.url, "aggregate", "", "dead-letter")
        rows = decoder_input(values, 65_536)
        decode_rows_rate = decoder_rate(typed, rows)
        fastavro_rate = decoder_rate(dataclasses.replace(typed, _cache={}), rows, c_loop=False)

        with warehouse_lock(settings, "tests/perf/test_typed_load.py"):
            spark = start_session(settings, "tests/perf/test_typed_load.py")
            try:
                Loader(spark, dataclasses.replace(settings, topics=r"warmup[.].*"), io.StringIO()).run()
                rates = {}
                for label, topic in (("raw", r"raw[.]orders"), ("typed", r"east[.]orders")):
                    out = io.StringIO()
                    started = time.perf_counter()
                    outcomes = Loader(spark, dataclasses.replace(settings, topics=topic), out).run()
                    seconds = time.perf_counter() - started
                    rows_loaded = sum(o.rows for o in outcomes)
                    assert rows_loaded == n, out.getvalue()
                    rates[label] = n / seconds
                    progress(f"{label} load: {n:,} records in {seconds:.1f} s")
                assert spark.sql("SELECT count(*) FROM dcmirror.east_orders WHERE address.city IS NOT NULL"
                                 ).first()[0] == n
            finally:
                stop_session(spark)
    finally:
        if registry is not None:
            registry.stop()
        broker.stop()
    ratio = rates["typed"] / rates["raw"]
    emit(f"typed Avro load vs raw load, {n:,} records of ~{sum(map(len, values)) // len(values)} bytes, "
         f"local[2] ({loadavg()})\n"
         f"  raw load    {rates['raw']:>10,.0f} records/s\n"
         f"  typed load  {rates['typed']:>10,.0f} records/s\n"
         f"  ratio typed/raw {ratio:.2f} (issue 33 asks >= 0.5)\n"
         f"  decoder alone (decode_rows, one core) {decode_rows_rate:,.0f} records/s\n"
         f"  decoder alone with fastavro per record (the path before the C loop) {fastavro_rate:,.0f} records/s")


def decoder_input(values: list[bytes], n: int) -> pa.RecordBatch:
    """Table rows as stage.table_batch makes them, for `n` records of the pool."""
    from spark_aggregate.columns import arrow_schema

    schema = arrow_schema(True, True)
    ts = pa.array([1_790_000_000_000_000] * n, schema.field("timestamp").type)
    batch = pa.RecordBatch.from_arrays([
        pa.array([None] * n, pa.binary()), pa.array([values[i % len(values)] for i in range(n)], pa.binary()),
        pa.array(["east.orders"] * n), pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()), ts,
        pa.array([0] * n, pa.int32()), pa.array([[]] * n, schema.field("headers").type),
        pa.array(["east"] * n), pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
        pa.array([None] * n, pa.string()), pa.array([None] * n, pa.int32()), pa.array([False] * n),
    ], schema=schema)
    return table_batch(batch, RowContext("aggregate", (("east", "dc-east"),), "bench"))


def decoder_rate(typed: Any, rows: pa.RecordBatch, c_loop: bool = True) -> float:
    from spark_aggregate import avro_batch
    from spark_aggregate.typed import decode_rows

    saved = avro_batch._avro
    if not c_loop:
        avro_batch._avro = None
    try:
        decode_rows(typed, rows.slice(0, 100), "bench", [c for c, *_ in PARTITION_COLUMNS])  # schemas fetched
        started = time.perf_counter()
        good, dead = decode_rows(typed, rows, "bench", [c for c, *_ in PARTITION_COLUMNS])
        seconds = time.perf_counter() - started
    finally:
        avro_batch._avro = saved
    assert good.num_rows == rows.num_rows and dead.num_rows == 0
    return rows.num_rows / seconds
