"""The load's write step without Spark: table rows from records, partition directories,
task grouping, and a task writing its range's Parquet files from a real broker (whole files
only, the same names when run again)."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.client.sync import SyncAdmin, SyncProducer
from cluster.protocol.records import Record, encode_batch
from mirror.history import topic_id_text
from mirror.provenance import FENCE, mirrored_headers
from spark_aggregate.columns import COLUMNS_BACKEND, new_builder
from spark_aggregate.options import ReadOptions
from spark_aggregate.ranges import OffsetRange, cap_ranges
from spark_aggregate.stage import (
    DATA_SCHEMA,
    DEFAULT_PARTITION_NAME,
    RowContext,
    StageTask,
    TooManyTablePartitions,
    by_table_partition,
    escape_partition_value,
    filesystem_of,
    group_tasks,
    payload_bytes,
    table_batch,
    unescape_partition_value,
    write_task,
    write_tasks,
)
from tests.harness import BrokerProcess

DAY_MS = 86_400_000
CTX = RowContext("agg", (("east", "dc-east"), ("west", "dc-west")), "L1")
TOPIC_A = topic_id_text(uuid.UUID(int=0xA11CE))  # a source topic, and the same name created again
TOPIC_B = topic_id_text(uuid.UUID(int=0xB0B))


def source_rows(records: list[Record]) -> object:
    builder = new_builder(True, True)
    builder.add_chunk(encode_batch(records), 0, 1 << 40)
    return builder.finish("agg.t", 4)


def test_table_rows_take_provenance_from_headers_and_drop_fences() -> None:
    records = [
        Record(10, 5 * DAY_MS + 1, b"k", b"v1", mirrored_headers((("own", b"1"),), "west", 3, 77, TOPIC_A, 2)),
        Record(11, 5 * DAY_MS + 2, None, None, ((FENCE, b""),)),
        Record(12, 6 * DAY_MS, b"k2", b"v2", ()),  # produced into the aggregate itself
        Record(13, 6 * DAY_MS + 5, None, b"v3", mirrored_headers((), "north", 0, 5)),  # a cluster nobody named,
        # mirrored before workers wrote topic ids and leader epochs
    ]
    rows = table_batch(source_rows(records), CTX)  # type: ignore[arg-type]
    got = [(r["kafka_offset"], r["kafka_partition"], r["source_cluster"], r["source_partition"], r["source_offset"],
            r["source_topic_id"], r["source_leader_epoch"], r["source_dc"], r["event_date"], r["load_id"],
            r["headers"], r["value"]) for r in rows.to_pylist()]
    assert got == [
        (10, 4, "west", 3, 77, TOPIC_A, 2, "dc-west", dt.date(1970, 1, 6), "L1", [{"key": "own", "value": b"1"}],
         b"v1"),
        (12, 4, "agg", 4, 12, None, None, "unknown", dt.date(1970, 1, 7), "L1", [], b"v2"),
        (13, 4, "north", 0, 5, None, None, "unknown", dt.date(1970, 1, 7), "L1", [], b"v3"),
    ]
    assert payload_bytes(rows) == len(b"k" + b"v1" + b"k2" + b"v2" + b"v3")
    assert rows.schema.names == [*DATA_SCHEMA.names, "source_dc", "event_date"]


@pytest.mark.parametrize("backend", ["python", COLUMNS_BACKEND])
def test_incarnations_and_leader_epochs_of_one_source_offset_stay_distinct_rows(backend: str) -> None:
    # One source partition (east, 3) as an aggregate partition holds it: offsets 0-2 of the
    # first incarnation at leader epoch 5; an unclean election at the source made offset 2
    # diverge (the copy mirrored at epoch 5 stays, the source's new record at epoch 6
    # follows); then the topic was deleted and created again: offsets from 0 again, under
    # another topic id.
    mirrored = [(0, TOPIC_A, 5, b"a0"), (1, TOPIC_A, 5, b"a1"), (2, TOPIC_A, 5, b"a2-diverged"),
                (2, TOPIC_A, 6, b"a2"), (3, TOPIC_A, 6, b"a3"), (0, TOPIC_B, 0, b"b0"), (1, TOPIC_B, 0, b"b1")]
    records = [Record(100 + i, DAY_MS, b"k", value, mirrored_headers((), "east", 3, offset, topic_id, epoch))
               for i, (offset, topic_id, epoch, value) in enumerate(mirrored)]
    builder = new_builder(True, True, backend=backend)
    builder.add_chunk(encode_batch(records), 0, 1 << 40)
    rows = table_batch(builder.finish("agg.t", 4), CTX).to_pylist()
    got = [(r["source_cluster"], r["source_topic_id"], r["source_partition"], r["source_offset"],
            r["source_leader_epoch"], r["kafka_offset"], r["value"], r["headers"]) for r in rows]
    assert got == [("east", topic_id, 3, offset, epoch, 100 + i, value, [])
                   for i, (offset, topic_id, epoch, value) in enumerate(mirrored)]
    identities = [(r["source_cluster"], r["source_topic_id"], r["source_partition"], r["source_offset"],
                   r["source_leader_epoch"]) for r in rows]
    assert len(set(identities)) == len(rows) == 7
    # (cluster, partition, offset) alone would name the seven rows four times.
    assert len({(c, p, o) for c, _, p, o, _ in identities}) == 4
    # Per incarnation, a source offset's rows differ only in their leader epoch.
    assert sorted(e for _, t, _, o, e in identities if (t, o) == (TOPIC_A, 2)) == [5, 6]


def test_rows_split_by_partition_directory() -> None:
    records = [Record(i, (i % 2) * DAY_MS, b"k", b"v%d" % i, mirrored_headers((), ("east", "west")[i % 3 == 0], 0, i))
               for i in range(12)]
    parts = dict(by_table_partition(table_batch(source_rows(records), CTX)))  # type: ignore[arg-type]
    got = {folder: [r["kafka_offset"] for r in batch.to_pylist()] for folder, batch in parts.items()}
    assert got == {
        "source_dc=dc-west/event_date=1970-01-01": [0, 6],
        "source_dc=dc-west/event_date=1970-01-02": [3, 9],
        "source_dc=dc-east/event_date=1970-01-01": [2, 4, 8, 10],
        "source_dc=dc-east/event_date=1970-01-02": [1, 5, 7, 11],
    }
    assert all(batch.schema == DATA_SCHEMA for batch in parts.values())


def test_partition_values_are_escaped_as_spark_names_directories() -> None:
    assert escape_partition_value("dc-east") == "dc-east"
    assert escape_partition_value("a/b=c:d%") == "a%2Fb%3Dc%3Ad%25"
    assert escape_partition_value(None) == escape_partition_value("") == DEFAULT_PARTITION_NAME
    for value in ("a/b=c:d%", "x y", "ü#?"):
        assert unescape_partition_value(escape_partition_value(value)) == value
    assert unescape_partition_value(DEFAULT_PARTITION_NAME) is None


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=40), st.integers(1, 9))
def test_groups_hold_every_task_once_and_balance_offsets(sizes: list[int], groups: int) -> None:
    tasks = [StageTask(OffsetRange("t", i, 0, size), "/x") for i, size in enumerate(sizes)]
    out = group_tasks(tasks, groups)
    assert sorted(i for g in out for i in g) == list(range(len(tasks)))
    assert len(out) <= groups and all(out)
    loads = [sum(sizes[i] for i in g) for g in out]
    assert max(loads) - min(loads) <= max(sizes)  # largest-first keeps groups within one task


@given(st.integers(0, 50), st.integers(0, 10_000), st.integers(1, 3_000))
def test_capped_ranges_cover_the_range_in_order(start: int, size: int, cap: int) -> None:
    parts = cap_ranges([OffsetRange("t", 0, start, start + size)], cap)
    assert parts[0].start == start and parts[-1].end == start + size
    assert all(a.end == b.start for a, b in zip(parts, parts[1:], strict=False))
    assert all(p.size <= cap for p in parts)
    assert len(parts) == max(1, -(-size // cap))


def test_a_task_writes_whole_files_named_by_its_range(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        with SyncAdmin(broker.bootstrap) as admin:
            admin.create_topic("agg.t", 1, 1)
            admin.create_topic("agg.big", 1, 1)
        with SyncProducer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5}) as producer:
            for i in range(3000):
                cluster = ("east", "west")[i % 2]
                producer.produce("agg.t", b"v%d" % i, key=b"k", partition=0, timestamp_ms=(i // 1500) * DAY_MS,
                                 headers=mirrored_headers((), cluster, 1, i))
            producer.produce_many("agg.big", ((None, b"x%d" % i) for i in range(80_000)))
            producer.flush()
        options = ReadOptions(broker.bootstrap, include_headers=True, include_provenance=True, poll_timeout_ms=2000)
        filesystem, root = filesystem_of((tmp_path / "staging").as_uri())  # type: ignore[misc]
        task = StageTask(OffsetRange("agg.t", 0, 100, 2900), f"{root}/table")

        def files() -> dict[str, list[int]]:
            out = {}
            for path in sorted((tmp_path / "staging" / "table").rglob("*")):
                if path.is_file():
                    relative = str(path.relative_to(tmp_path / "staging" / "table"))
                    out[relative] = pq.read_table(path).column("kafka_offset").to_pylist()
            return out

        result = write_task(task, options, CTX, filesystem)
        assert (result.rows, result.files, result.gaps) == (2800, 4, [])
        first = files()
        assert sorted(first) == [f"source_dc={dc}/event_date={day}/p0-o100.parquet"
                                 for dc in ("dc-east", "dc-west") for day in ("1970-01-01", "1970-01-02")]
        assert sorted(o for offsets in first.values() for o in offsets) == list(range(100, 2900))
        assert first["source_dc=dc-west/event_date=1970-01-02/p0-o100.parquet"] == list(range(1501, 2900, 2))
        # Run again (a retried task): the same files, the same rows, nothing added.
        write_task(task, options, CTX, filesystem)
        assert files() == first
        # A range beyond the high watermark fails after writing a batch (65,536 rows): no file
        # is left for it, visible or hidden.
        beyond = StageTask(OffsetRange("agg.big", 0, 0, 90_000), f"{root}/big")
        with pytest.raises(TimeoutError, match="no records arrived"):
            write_task(beyond, options, CTX, filesystem)
        assert files() == first
        assert [p.name for p in (tmp_path / "staging").rglob("*") if p.is_file()] == [
            "p0-o100.parquet"] * 4  # the first task's, nothing of the failed one
        # A range touching more table partitions than a task may keep open is refused, and
        # leaves nothing behind.
        with pytest.raises(TooManyTablePartitions, match=r"agg\.t-0 \[100, 2900\) holds records of more than 3 "):
            write_task(StageTask(task.range, f"{root}/narrow"), options, CTX, filesystem, max_open_files=3)
        assert not [p for p in (tmp_path / "staging" / "narrow").rglob("*") if p.is_file()]
        # The same range up to the high watermark: one file, every record.
        whole = StageTask(OffsetRange("agg.big", 0, 0, 80_000), f"{root}/big")
        assert write_task(whole, options, CTX, filesystem).rows == 80_000
        [written] = (tmp_path / "staging" / "big").rglob("*.parquet")
        assert pq.read_table(written).column("kafka_offset").to_pylist() == list(range(80_000))
        # Ranges of one table written by one Spark task share files (named after the first),
        # up to the bound; another table's range starts its own. A result per range.
        runs = [StageTask(OffsetRange("agg.big", 0, start, start + 1000), f"{root}/shared") for start in
                range(0, 5000, 1000)] + [StageTask(OffsetRange("agg.t", 0, 0, 1000), f"{root}/other")]
        results = write_tasks(runs, options, CTX, filesystem, shared_file_offsets_max=3000)
        assert [r.rows for r in results] == [1000] * 6 and sum(r.files for r in results) == 1 + 1 + 2
        shared = {p.name: pq.read_table(p).column("kafka_offset").to_pylist()
                  for p in (tmp_path / "staging" / "shared").rglob("*.parquet")}
        assert shared == {"p0-o0.parquet": list(range(3000)), "p0-o3000.parquet": list(range(3000, 5000))}
        assert sorted(p.name for p in (tmp_path / "staging" / "other").rglob("*.parquet")) == ["p0-o0.parquet"] * 2
        assert write_tasks(runs, options, CTX, filesystem, shared_file_offsets_max=3000) == results  # again: the same
        assert {p.name: pq.read_table(p).column("kafka_offset").to_pylist()
                for p in (tmp_path / "staging" / "shared").rglob("*.parquet")} == shared
    finally:
        broker.stop()
