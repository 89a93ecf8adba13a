"""A warehouse load over thousands of partitions: T topics of 100 partitions (default 50:
5,000 partitions) on one broker, N records spread over all of them (record i to topic
i mod T, partition (i // T) mod 100), loaded by `dcmirror load` (one Spark session, local[2])
into T tables, three rounds as a warehouse runs them:
  1. the first load: every record (planning 5,000 ranges, staging, publishing T tables);
  2. M more records, the next load takes only them (the offset ledger);
  3. nothing new: planning and the ledger alone.
Printed per round: seconds, of which staging, and records/s. Knobs:
DCMIRROR_BENCH_LOAD_SCALE_TOPICS (50), DCMIRROR_BENCH_LOAD_SCALE_RECORDS (200,000),
DCMIRROR_BENCH_LOAD_SCALE_MORE (50,000)."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path

import pytest

from spark_aggregate.load import Loader
from spark_aggregate.session import start_session, stop_session, warehouse_lock
from spark_aggregate.settings import WarehouseSettings
from tests.harness import BrokerProcess
from tests.perf.benchlib import emit, env_int, progress
from tests.perf.test_scale import TOPIC_PARTITIONS, create_all, produce_spread
from tests.spark.common import write_topology
from topology import load

pytestmark = [pytest.mark.perf, pytest.mark.timeout(3600)]


def test_a_warehouse_load_of_thousands_of_partitions(tmp_path: Path) -> None:
    topics_count = env_int("DCMIRROR_BENCH_LOAD_SCALE_TOPICS", 50)
    n = env_int("DCMIRROR_BENCH_LOAD_SCALE_RECORDS", 200_000)
    more = env_int("DCMIRROR_BENCH_LOAD_SCALE_MORE", 50_000)
    broker = BrokerProcess(tmp_path / "broker").start()
    rows_out = []
    try:
        topics = [f"bench.east.t{i:03d}" for i in range(topics_count)]
        create_all(broker.bootstrap, topics)
        produce_spread(broker.bootstrap, topics, n)
        progress(f"{n:,} records in {topics_count * TOPIC_PARTITIONS:,} partitions")
        topology = write_topology(tmp_path / "topology.toml", broker.bootstrap, tmp_path / "warehouse")
        settings = dataclasses.replace(WarehouseSettings.from_topology(load(topology)), topics=r"bench\..*")
        with warehouse_lock(settings, "tests/perf/test_load_scale.py"):
            spark = start_session(settings, "tests/perf/test_load_scale.py")
            try:
                for round_no, (label, want) in enumerate([("first load, every record", n),
                                                          (f"{more:,} more records", more),
                                                          ("nothing new", 0)]):
                    if round_no == 1:
                        produce_spread(broker.bootstrap, topics, more, first=n)
                    out = io.StringIO()
                    started = time.perf_counter()
                    outcomes = Loader(spark, settings, out).run()
                    seconds = time.perf_counter() - started
                    rows = sum(t.rows for o in outcomes for t in o.topics)
                    assert rows == want, out.getvalue()
                    staged = max((t.seconds for o in outcomes for t in o.topics), default=0.0)
                    rows_out.append(f"  {label:<32} {seconds:7.1f} s (staging {staged:5.1f} s)"
                                    f"{f'  {rows / seconds:10,.0f} rec/s' if rows else ''}")
                    progress(rows_out[-1].strip())
                counted = spark.sql("SELECT count(*) AS n FROM dcmirror.bench_east_t000").collect()[0].n
                assert counted == (n + more) // topics_count
            finally:
                stop_session(spark)
    finally:
        broker.stop()
    files = sum(1 for _ in (tmp_path / "warehouse").rglob("*.parquet"))
    emit(f"=== a warehouse load over {topics_count * TOPIC_PARTITIONS:,} partitions ({topics_count} topics, "
         f"{topics_count} tables; Spark local[2]) ===\n" + "\n".join(rows_out) +
         f"\n  Parquet files in the warehouse: {files:,}")
