"""The warehouse load in one Spark session (local mode) against a real broker: known records
with provenance headers -> load -> the tables hold exactly those records; incremental loads
add only what is new; a load with nothing new changes nothing; JSON schemas give typed
columns; tables created by an earlier version gain the columns added since; records deleted
by retention before they were loaded fail the load, naming the gap.

Every test loads its own topics (the warehouse topics regex is narrowed per test) into the
one warehouse of this module.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cluster.client.sync import SyncAdmin
from spark_aggregate.ledger import COMMITTED, GAP, PLANNED
from spark_aggregate.load import LoadConfigError, Loader, LoadOutcome
from spark_aggregate.ranges import DataLossError
from spark_aggregate.session import start_session, stop_session, warehouse_lock
from spark_aggregate.settings import WarehouseSettings
from spark_aggregate.stage import PARTITION_COLUMNS, TABLE_COLUMNS
from tests.harness import BrokerProcess
from tests.spark.common import (
    EXPECTED_COLUMNS,
    Feed,
    create_topics,
    expected_rows,
    offsets,
    run_cli,
    sorted_rows,
    source_topic_id,
    write_topology,
)
from topology import load

# A SparkSession inside a pytest-xdist worker fails its accumulator handshake ("EOF reached
# before Python server acknowledged"): make test runs these files in a plain pytest.
pytestmark = [pytest.mark.timeout(600), pytest.mark.spark_session]


@dataclass
class Env:
    broker: BrokerProcess
    topology: Path
    settings: WarehouseSettings
    spark: Any
    feed: Feed

    def load(self, topics: str, **changes: Any) -> tuple[list[LoadOutcome], str]:
        settings = dataclasses.replace(self.settings, topics=topics, **changes)
        out = io.StringIO()
        outcomes = Loader(self.spark, settings, out).run()
        return outcomes, out.getvalue()

    def rows(self, table: str, where: str = "true") -> list[tuple[Any, ...]]:
        self.spark.sql(f"REFRESH TABLE dcmirror.{table}")
        got = self.spark.sql(f"SELECT {', '.join(EXPECTED_COLUMNS)} FROM dcmirror.{table} WHERE {where}").collect()
        return sorted_rows(tuple(bytes(v) if isinstance(v, bytearray) else v for v in row) for row in got)

    def ledger(self, topic_like: str) -> list[Any]:
        self.spark.sql("REFRESH TABLE dcmirror.loads")
        return self.spark.sql(f"SELECT * FROM dcmirror.loads WHERE topic LIKE '{topic_like}' "
                              "ORDER BY load_id, status, topic, partition").collect()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("spark-load")
    broker = BrokerProcess(root / "broker", **{"log.retention.check.interval.ms": 300}).start()
    try:
        topology = write_topology(root / "topology.toml", broker.bootstrap, root / "warehouse")
        settings = WarehouseSettings.from_topology(load(topology))
        with warehouse_lock(settings, "tests/spark/test_load.py"):
            spark = start_session(settings, "tests/spark/test_load.py")
            try:
                yield Env(broker, topology, settings, spark, Feed(broker.bootstrap))
            finally:
                stop_session(spark)
    finally:
        broker.stop()


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_load_exactly_the_records_then_only_new_ones_then_nothing(env: Env, writer: str) -> None:
    # Each writer (spark_aggregate/stage.py) loads its own topics: t1.* with Arrow, t5.* with Spark.
    pre = "t1" if writer == "arrow" else "t5"
    create_topics(env.broker.bootstrap, {f"{pre}.east.pageviews": 3, f"{pre}.west.pageviews": 2, f"{pre}.local": 1})
    if writer == "arrow":  # the first to run
        create_topics(env.broker.bootstrap, {"dcmirror.heartbeats": 1, "dcmirror.checkpoints": 1, "__internal": 1})
    first = env.feed.produce(f"{pre}.east.pageviews", 3, 300, source="east", fence_every=40)
    first += env.feed.produce(f"{pre}.west.pageviews", 2, 200, source="west")
    first += env.feed.produce(f"{pre}.west.pageviews", 2, 6, source="south")  # a cluster the topology does not know
    first += env.feed.produce(f"{pre}.local", 1, 20, source=None)  # produced into the aggregate itself
    for internal in ("dcmirror.heartbeats", "dcmirror.checkpoints", "__internal"):
        env.feed.produce(internal, 1, 3, source=None)
    # The regex names the internal topics too: they are never loaded all the same.
    topics = rf"{pre}\..*|dcmirror\..*|__.*"

    outcomes, printed = env.load(topics, writer=writer)
    assert len(outcomes) == 1 and not outcomes[0].plan.resumed
    assert {t.table: t.rows for t in outcomes[0].topics} == {
        f"dcmirror.{pre}_east_pageviews": 300, f"dcmirror.{pre}_west_pageviews": 206, f"dcmirror.{pre}_local": 20}
    # Offsets include the 7 fence records of east (one per 40 records, in the partition written).
    assert outcomes[0].plan.offsets == 300 + 7 + 206 + 20
    assert "load " in printed
    for table, topic in ((f"{pre}_east_pageviews", f"{pre}.east.pageviews"), (f"{pre}_west_pageviews", f"{pre}.west.pageviews"),
                         (f"{pre}_local", f"{pre}.local")):
        assert env.rows(table) == expected_rows(s for s in first if s.topic == topic), table
    tables = {r.tableName for r in env.spark.sql("SHOW TABLES IN dcmirror").collect()}
    assert not tables & {"dcmirror_heartbeats", "dcmirror_checkpoints", "__internal", "_internal"}
    # Per kafka partition: count and offset sums, as a query over the warehouse sees them.
    sums = {(r.kafka_partition, r.n, r.s) for r in env.spark.sql(
        f"SELECT kafka_partition, count(*) AS n, sum(source_offset) AS s FROM dcmirror.{pre}_east_pageviews "
        "GROUP BY kafka_partition").collect()}
    assert sums == {(p, 100, sum(range(100))) for p in range(3)}
    # Partitioned by source datacenter and event date; unknown clusters in dc "unknown".
    parts = {r.partition for r in env.spark.sql(f"SHOW PARTITIONS dcmirror.{pre}_west_pageviews").collect()}
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert parts == {f"source_dc=dc-west/event_date={today}", f"source_dc=unknown/event_date={today}"}

    ledger = env.ledger(f"{pre}.%")
    load_id = outcomes[0].plan.load_id
    assert {(r.load_id, r.status) for r in ledger} == {(load_id, PLANNED), (load_id, COMMITTED)}
    committed = {(r.topic, r.partition): (r.start_offset, r.end_offset, r.rows) for r in ledger if r.status == COMMITTED}
    ends = {(f"{pre}.east.pageviews", p): hw for p, (_, hw) in offsets(env.broker.bootstrap, f"{pre}.east.pageviews", 3).items()}
    assert {tp: v for tp, v in committed.items() if tp[0] == f"{pre}.east.pageviews"} == {
        tp: (0, end, 100) for tp, end in ends.items()}
    assert committed[(f"{pre}.local", 0)] == (0, 20, 20)

    # Incremental: only the new records are added.
    second = env.feed.produce(f"{pre}.east.pageviews", 3, 90, source="east", fence_every=25)
    second += env.feed.produce(f"{pre}.local", 1, 5, source=None)
    outcomes, _ = env.load(topics, writer=writer)
    assert len(outcomes) == 1
    assert {t.table: t.rows for t in outcomes[0].topics} == {f"dcmirror.{pre}_east_pageviews": 90,
                                                                 f"dcmirror.{pre}_local": 5}
    for table, topic in ((f"{pre}_east_pageviews", f"{pre}.east.pageviews"), (f"{pre}_local", f"{pre}.local")):
        assert env.rows(table) == expected_rows(s for s in first + second if s.topic == topic), table
    second_id = outcomes[0].plan.load_id
    assert env.rows(f"{pre}_local", f"load_id = '{second_id}'") == expected_rows(s for s in second if s.topic == f"{pre}.local")
    ranges = {(r.topic, r.partition): (r.start, r.end) for r in outcomes[0].plan.ranges}
    for (topic, partition), (start, _) in ranges.items():
        assert start == committed[(topic, partition)][1]  # each starts where the first load ended

    # Nothing new: no load, no ledger rows, the same tables.
    ledger_before = env.ledger(f"{pre}.%")
    outcomes, _ = env.load(topics, writer=writer)
    assert outcomes == []
    assert env.ledger(f"{pre}.%") == ledger_before
    assert env.rows(f"{pre}_east_pageviews") == expected_rows(s for s in first + second if s.topic == f"{pre}.east.pageviews")


def test_json_schema_gives_typed_columns(env: Env) -> None:
    values = [b'{"user": "u%d", "url": "/p/%d", "n": %d}' % (i, i, i) for i in range(10)]
    values[3] = b"not json"
    values[4] = b'{"user": "u4", "n": "four"}'
    create_topics(env.broker.bootstrap, {"t2.views": 1})
    made = []
    for v in values:
        made += env.feed.produce("t2.views", 1, 1, source="west", value=lambda n, v=v: v)
    settings_schemas = (("t2[.]views", "user STRING, url STRING, n INT"),)
    outcomes, _ = env.load(r"t2\.views", schemas=settings_schemas)
    assert outcomes[0].rows == 10
    got = env.spark.sql("SELECT source_offset, user, url, n FROM dcmirror.t2_views ORDER BY source_offset").collect()
    expected = [(i, f"u{i}", f"/p/{i}", i) for i in range(10)]
    expected[3] = (3, None, None, None)
    expected[4] = (4, "u4", None, None)
    assert [tuple(r) for r in got] == expected
    assert env.rows("t2_views") == expected_rows(made)


# The tables' data columns before source_topic_id and source_leader_epoch were added.
OLD_TABLE_COLUMNS = tuple(c for c in TABLE_COLUMNS if c[0] not in ("source_topic_id", "source_leader_epoch"))
OLD_LOAD_ID = "20250101T000000.000Z-0a0b0c"


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_a_table_created_by_an_earlier_version_gains_the_new_columns(env: Env, writer: str) -> None:
    # As an earlier version left it: the table without the columns, and one published file
    # written with the columns it had then (by Arrow; JSON schema topics' by Spark: the
    # parsed columns too).
    topic, table = f"t6.{writer}", f"t6_{writer}"
    schema = "user STRING, n INT" if writer == "spark" else None
    declared = [("user", "STRING", pa.string()), ("n", "INT", pa.int32())] if schema else []
    old_columns = [*OLD_TABLE_COLUMNS, *declared]
    columns = ", ".join(f"`{c}` {t}" for c, t, _ in [*old_columns, *PARTITION_COLUMNS])
    env.spark.sql(f"CREATE TABLE dcmirror.{table} ({columns}) USING parquet PARTITIONED BY (source_dc, event_date)")
    location = next(str(r[1]) for r in env.spark.sql(f"DESCRIBE TABLE EXTENDED dcmirror.{table}").collect()
                    if r[0] == "Location")
    folder = Path(location.removeprefix("file:")) / "source_dc=dc-east" / "event_date=2025-01-01"
    folder.mkdir(parents=True)
    old_row = {"key": b"k", "value": b'{"user": "u-old", "n": 1}', "headers": [],
               "timestamp": datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC), "timestamp_type": 0,
               "kafka_partition": 0, "kafka_offset": 1_000_000, "source_cluster": "east", "source_partition": 0,
               "source_offset": 999, "load_id": OLD_LOAD_ID, "user": "u-old", "n": 1}
    old_schema = pa.schema([pa.field(c, kind) for c, _, kind in old_columns])
    pq.write_table(pa.Table.from_pylist([{c: old_row[c] for c in old_schema.names}], old_schema),
                   folder / f"{OLD_LOAD_ID}-p0-o0.parquet")
    env.spark.sql(f"ALTER TABLE dcmirror.{table} ADD PARTITION (source_dc = 'dc-east', event_date = DATE '2025-01-01')")

    create_topics(env.broker.bootstrap, {topic: 2})
    made = env.feed.produce(topic, 2, 30, source="east", leader_epoch=7,
                            value=lambda n: b'{"user": "u%d", "n": %d}' % (n, n))
    made += env.feed.produce(topic, 2, 4, source=None)
    schemas = ((re.escape(topic), schema),) if schema else ()
    outcomes, _ = env.load(re.escape(topic), writer=writer, schemas=schemas)
    assert outcomes[0].rows == 34
    # The new columns come after the ones the table had (ALTER TABLE ... ADD COLUMNS), before
    # the partition columns.
    assert env.spark.table(f"dcmirror.{table}").columns == [
        *(c for c, *_ in old_columns), "source_topic_id", "source_leader_epoch", "source_dc", "event_date"]
    assert env.rows(table, f"load_id != '{OLD_LOAD_ID}'") == expected_rows(made)
    assert {r.source_topic_id for r in env.spark.table(f"dcmirror.{table}").collect()
            if r.source_cluster == "east" and r.load_id != OLD_LOAD_ID} == {source_topic_id("east", topic)}
    # The earlier version's file has no such columns: NULL there, the rest as it was.
    [old] = env.spark.sql(f"SELECT * FROM dcmirror.{table} WHERE load_id = '{OLD_LOAD_ID}'").collect()
    assert (old.source_topic_id, old.source_leader_epoch, old.source_offset, old.source_dc) == (None, None, 999,
                                                                                                "dc-east")
    if schema:
        assert (old.user, old.n) == ("u-old", 1)
    # The evolved table goes on loading like any other.
    more = env.feed.produce(topic, 2, 6, source="east", leader_epoch=8, value=lambda n: b'{"user": "u", "n": 0}')
    outcomes, _ = env.load(re.escape(topic), writer=writer, schemas=schemas)
    assert outcomes[0].rows == 6
    assert env.rows(table, f"load_id != '{OLD_LOAD_ID}'") == expected_rows(made + more)


def test_a_schema_naming_a_warehouse_column_is_refused(env: Env) -> None:
    # The topology refuses the warehouse's own column names; one written before a column was
    # added to the tables is refused by the load, with the fix.
    settings = dataclasses.replace(env.settings, schemas=(("t7", "source_topic_id STRING"),))
    with pytest.raises(LoadConfigError, match="declares column 'source_topic_id', one of the warehouse's own"):
        Loader(env.spark, settings, io.StringIO()).ensure_table("t7")


def test_retention_gap_fails_the_load_naming_it(env: Env) -> None:
    topic = "t3.gap"
    create_topics(env.broker.bootstrap, {topic: 1}, {"segment.bytes": "3000", "retention.ms": str(86_400_000)})
    old = int(time.time() * 1000) - 2 * 3_600_000
    loaded = env.feed.produce(topic, 1, 30, source="east", timestamp_ms=old)
    outcomes, _ = env.load(r"t3\..*")
    assert outcomes[0].rows == 30
    env.feed.produce(topic, 1, 90, source="east", timestamp_ms=old)  # offsets 30..119: will expire
    kept = env.feed.produce(topic, 1, 40, source="east", timestamp_ms=int(time.time() * 1000) + 600_000)
    with SyncAdmin(env.broker.bootstrap) as admin:
        admin.alter_topic_configs(topic, {"retention.ms": "3600000"}, [])
    deadline = time.monotonic() + 30
    while offsets(env.broker.bootstrap, topic, 1)[0][0] <= 30:
        assert time.monotonic() < deadline, "retention did not delete the old segments"
        time.sleep(0.2)
    time.sleep(1.0)  # the retention checks that follow delete nothing more (the next segment holds new records)
    log_start = offsets(env.broker.bootstrap, topic, 1)[0][0]
    assert 30 < log_start <= 120

    ledger_before = env.ledger("t3.%")
    with pytest.raises(DataLossError) as failure:
        env.load(r"t3\..*")
    message = str(failure.value)
    assert f"t3.gap-0: offsets 30 to {log_start - 1} ({log_start - 30} offsets) were deleted" in message
    assert "failOnDataLoss=false" in message
    assert env.ledger("t3.%") == ledger_before  # the failed load planned nothing

    # failOnDataLoss=false: the gap goes into the ledger, the rest is loaded.
    outcomes, printed = env.load(r"t3\..*", fail_on_data_loss=False)
    assert "data loss recorded" in printed
    gaps = [r for r in env.ledger("t3.%") if r.status == GAP]
    assert [(r.start_offset, r.end_offset) for r in gaps] == [(30, log_start)]
    survivors = [s for s in env.feed.sent if s.topic == topic and s.offset >= log_start]
    assert outcomes[0].rows == len(survivors) and all(s in survivors for s in kept)
    assert env.rows("t3_gap") == expected_rows(loaded + survivors)


def test_warehouse_sql_refuses_clearly_while_the_warehouse_is_in_use(env: Env) -> None:
    # This module's session holds the warehouse (embedded Derby): another process must not
    # get Derby's cryptic boot failure but a message naming the holder.
    started = time.monotonic()
    done = run_cli(["warehouse", "sql", "--config", str(env.topology), "SELECT 1"])
    assert done.returncode == 1
    assert "is in use by tests/spark/test_load.py (pid" in done.stderr
    assert "metastore.uri" in done.stderr
    assert time.monotonic() - started < 30  # refused before any JVM starts
    done = run_cli(["load", "--config", str(env.topology)])
    assert done.returncode == 1 and "is in use by" in done.stderr
