"""The sans-IO parts of the warehouse load, without Spark or brokers: data source options,
offset ranges and their splitting, load planning from the ledger, the Arrow column builders
(C against the Python reference), table names, warehouse config validation."""

from __future__ import annotations

import os
import re
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.protocol.records import COMPRESSION_GZIP, COMPRESSION_LZ4, Record, encode_batch
from mirror.history import topic_id_text
from mirror.provenance import FENCE, SOURCE_LEADER_EPOCH, SOURCE_TOPIC_ID, mirrored_headers
from spark_aggregate.columns import COLUMNS_BACKEND, arrow_schema, new_builder, spark_schema
from spark_aggregate.ledger import (
    COMMITTED,
    GAP,
    PLANNED,
    RELOAD_NOTE,
    DeadLetter,
    LedgerError,
    LedgerRow,
    finished_load_ids,
    limit_offsets,
    next_offsets,
    pending_plans,
    plan_load,
    plan_reload,
)
from spark_aggregate.options import EARLIEST, LATEST, OffsetSpec, OptionError, parse_options
from spark_aggregate.ranges import (
    DataLossError,
    Gap,
    OffsetRange,
    PartitionOffsets,
    resolve_ranges,
    split_ranges,
)
from spark_aggregate.settings import WarehouseSettings, is_loadable, table_name
from topology import TopologyError, loads

BS = {"bootstrap.servers": "127.0.0.1:9092"}
# Two incarnations of one source topic (deleted and created again).
TOPIC_A = topic_id_text(uuid.UUID(int=0xA11CE))
TOPIC_B = topic_id_text(uuid.UUID(int=0xB0B))


# ---- options -------------------------------------------------------------------------------

def test_options_follow_the_kafka_source() -> None:
    o = parse_options({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b", "includeheaders": "TRUE",
                       "minpartitions": "4", "kafka.max.partition.fetch.bytes": "1024"})
    assert (o.bootstrap_servers, o.subscribe, o.include_headers, o.min_partitions) == ("h:1", ("a", "b"), True, 4)
    assert o.starting == OffsetSpec("earliest") and o.ending == OffsetSpec("latest") and o.fail_on_data_loss
    assert o.client_config()["max.partition.fetch.bytes"] == "1024"
    o = parse_options({**BS, "assign": '{"t": [1, 0], "u": [2]}',
                       "startingOffsets": '{"t": {"0": 5, "1": -2}, "u": {"2": 7}}',
                       "endingOffsets": '{"t": {"0": -1, "1": 9}, "u": {"2": 8}}', "failOnDataLoss": "false"})
    assert o.assign == (("t", 0), ("t", 1), ("u", 2))
    assert o.starting.offsets == {("t", 0): 5, ("t", 1): EARLIEST, ("u", 2): 7}
    assert o.ending.offsets == {("t", 0): LATEST, ("t", 1): 9, ("u", 2): 8}
    assert not o.fail_on_data_loss
    assert parse_options({**BS, "subscribePattern": "east[.].*"}).subscribe_pattern == "east[.].*"


@pytest.mark.parametrize(("options", "message"), [
    ({"subscribe": "t"}, "bootstrap.servers (or kafka.bootstrap.servers) is required"),
    ({**BS}, "give exactly one of the options subscribe"),
    ({**BS, "subscribe": "t", "assign": '{"t": [0]}'}, "got subscribe, assign"),
    ({**BS, "subscribe": "t", "startingOffsets": "latest"}, "startingOffsets cannot be latest"),
    ({**BS, "subscribe": "t", "endingOffsets": "earliest"}, "endingOffsets cannot be earliest"),
    ({**BS, "subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, "cannot start at latest"),
    ({**BS, "subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "cannot end at earliest"),
    ({**BS, "subscribe": "t", "startingOffsets": '{"t": {"0": "x"}}'}, "must be a whole number"),
    ({**BS, "subscribe": "t", "startingOffsets": "{nope"}, "is not valid JSON"),
    ({**BS, "subscribe": "t", "minPartitions": "0"}, "minPartitions must be between 1"),
    ({**BS, "subscribe": "t", "includeHeaders": "yes"}, "must be true or false"),
    ({**BS, "subscribePattern": "("}, "is not a regex"),
    ({**BS, "subscribe": "t", "failOnDataLos": "false"}, "did you mean 'failOnDataLoss'"),
    ({**BS, "subscribe": "t", "kafka.group.id": "g"}, "kafka.group.id is not used"),
    ({**BS, "subscribe": "t", "path": "x"}, "takes no path"),
])
def test_bad_options_are_refused_with_the_fix(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_options(options)


# ---- ranges ------------------------------------------------------------------------------

LOGS = {("t", 0): PartitionOffsets(10, 100), ("t", 1): PartitionOffsets(0, 0), ("u", 0): PartitionOffsets(0, 50)}


def test_ranges_resolve_earliest_latest_and_explicit_offsets() -> None:
    ranges, gaps = resolve_ranges(LOGS, LOGS, OffsetSpec("earliest"), OffsetSpec("latest"), fail_on_data_loss=True)
    assert ranges == [OffsetRange("t", 0, 10, 100), OffsetRange("t", 1, 0, 0), OffsetRange("u", 0, 0, 50)]
    assert gaps == []
    starting = OffsetSpec("json", {("t", 0): 20, ("t", 1): EARLIEST, ("u", 0): 49})
    ending = OffsetSpec("json", {("t", 0): 30, ("t", 1): LATEST, ("u", 0): 50})
    ranges, _ = resolve_ranges(LOGS, LOGS, starting, ending, fail_on_data_loss=True)
    assert ranges == [OffsetRange("t", 0, 20, 30), OffsetRange("t", 1, 0, 0), OffsetRange("u", 0, 49, 50)]


def test_ranges_refuse_what_cannot_be_read() -> None:
    partial = OffsetSpec("json", {("t", 0): 20})
    with pytest.raises(OptionError, match="leaves out t-1, u-0"):
        resolve_ranges(LOGS, LOGS, partial, OffsetSpec("latest"), fail_on_data_loss=True)
    beyond = OffsetSpec("json", {("t", 0): 101, ("t", 1): -1, ("u", 0): -1})
    with pytest.raises(OptionError, match="offset 101 of t-0 is beyond its high watermark 100"):
        resolve_ranges(LOGS, LOGS, OffsetSpec("earliest"), beyond, fail_on_data_loss=True)
    backwards = OffsetSpec("json", {("t", 0): 60, ("t", 1): -2, ("u", 0): -2})
    with pytest.raises(OptionError, match="offset 60 of t-0 is beyond its ending offset 50"):
        resolve_ranges(LOGS, LOGS, backwards, OffsetSpec("json", {("t", 0): 50, ("t", 1): -1, ("u", 0): -1}),
                       fail_on_data_loss=True)


def test_a_start_below_the_log_start_is_data_loss() -> None:
    deleted = OffsetSpec("json", {("t", 0): 3, ("t", 1): -2, ("u", 0): -2})
    with pytest.raises(DataLossError, match=r"t-0: offsets 3 to 9 \(7 offsets\) were deleted before they were "
                                            r"read \(the log start offset is 10\)"):
        resolve_ranges(LOGS, LOGS, deleted, OffsetSpec("latest"), fail_on_data_loss=True)
    ranges, gaps = resolve_ranges(LOGS, LOGS, deleted, OffsetSpec("latest"), fail_on_data_loss=False)
    assert ranges[0] == OffsetRange("t", 0, 10, 100)
    assert [(g.topic, g.partition, g.start, g.end) for g in gaps] == [("t", 0, 3, 10)]


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=8), st.integers(1, 40))
def test_min_partitions_splits_into_contiguous_pieces(sizes: list[int], min_partitions: int) -> None:
    ranges = [OffsetRange("t", p, 7 * p, 7 * p + n) for p, n in enumerate(sizes)]
    split = split_ranges(ranges, min_partitions)
    for r in ranges:
        pieces = [s for s in split if s.partition == r.partition]
        if r.size == 0:
            assert pieces == []
            continue
        assert pieces[0].start == r.start and pieces[-1].end == r.end
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False))
        assert all(p.size > 0 for p in pieces)
    total = sum(sizes)
    nonempty = sum(1 for n in sizes if n)
    assert len(split) >= min(min_partitions, total) or len(split) >= nonempty


# ---- ledger and planning -----------------------------------------------------------------

def _row(load_id: str, tp: tuple[str, int], start: int, end: int, status: str) -> LedgerRow:
    return LedgerRow(load_id, tp[0], tp[1], start, end, end - start, status, 1000)


def test_plans_start_where_committed_loads_ended() -> None:
    rows = [_row("a", ("t", 0), 10, 40, PLANNED), _row("a", ("t", 0), 10, 40, COMMITTED),
            _row("b", ("t", 0), 40, 70, PLANNED)]  # b never committed
    assert next_offsets(rows) == {("t", 0): 40}
    [pending] = pending_plans(rows)
    assert (pending.load_id, pending.ranges, pending.resumed) == ("b", (OffsetRange("t", 0, 40, 70),), True)
    plan = plan_load(rows + [_row("b", ("t", 0), 40, 70, COMMITTED)], LOGS, load_id="c", now_ms=5,
                     fail_on_data_loss=True)
    assert plan is not None
    assert plan.ranges == (OffsetRange("t", 0, 70, 100), OffsetRange("u", 0, 0, 50))
    assert [r.status for r in plan.planned_rows()] == [PLANNED, PLANNED]
    committed = plan.committed_rows({("t", 0): 29, ("u", 0): 50}, now_ms=9)
    assert [(r.start_offset, r.end_offset, r.rows, r.status) for r in committed] == [
        (70, 100, 29, COMMITTED), (0, 50, 50, COMMITTED)]
    # Offsets retention deleted while the load read them (failOnDataLoss=false) are recorded
    # with the commit, and the next load still starts after the whole range.
    with_gap = plan.committed_rows({("t", 0): 19, ("u", 0): 50}, now_ms=9, read_gaps=[Gap("t", 0, 70, 80, 80)])
    assert [(r.start_offset, r.end_offset, r.rows, r.status, r.note) for r in with_gap][2:] == [
        (70, 80, 0, COMMITTED, "gap while reading: " + Gap("t", 0, 70, 80, 80).describe())]
    assert next_offsets(rows + with_gap) == {("t", 0): 100, ("u", 0): 50}
    done = {("t", 0): PartitionOffsets(0, 100), ("u", 0): PartitionOffsets(0, 50)}
    assert plan_load(rows + committed + [_row("b", ("t", 0), 40, 70, COMMITTED)], done, load_id="d", now_ms=6,
                     fail_on_data_loss=True) is None


def test_a_load_commits_topic_by_topic_and_a_pending_topic_is_not_planned_again() -> None:
    """Issue 43 (7): a topic that failed stays planned while the load's other topics commit;
    the next plan leaves it out (its planned range comes first), and the load is finished
    once its last topic commits."""
    plan = plan_load([], LOGS, load_id="a", now_ms=1, fail_on_data_loss=False)
    assert plan is not None and plan.all_topics() == ["t", "u"]
    rows = plan.planned_rows() + plan.of_topics(["t"]).committed_rows({("t", 0): 90}, now_ms=2)
    assert next_offsets(rows) == {("t", 0): 100}
    [pending] = pending_plans(rows)
    assert (pending.load_id, pending.ranges) == ("a", (OffsetRange("u", 0, 0, 50),))
    assert finished_load_ids(rows) == set()
    more = {**LOGS, ("t", 0): PartitionOffsets(10, 120), ("u", 0): PartitionOffsets(0, 70)}
    later = plan_load(rows, more, load_id="b", now_ms=3, fail_on_data_loss=False)
    assert later is not None and later.ranges == (OffsetRange("t", 0, 100, 120),)   # u waits for load a
    rows += later.planned_rows() + later.committed_rows({("t", 0): 20}, now_ms=4)
    rows += pending.committed_rows({("u", 0): 50}, now_ms=5)
    assert finished_load_ids(rows) == {"a", "b"} and pending_plans(rows) == []
    last = plan_load(rows, more, load_id="c", now_ms=6, fail_on_data_loss=False)
    assert last is not None and last.ranges == (OffsetRange("u", 0, 50, 70),)


def test_dead_letters_of_ids_the_registry_knows_now_are_reloaded_once() -> None:
    """Issue 43: dead letters whose schema id was unknown are planned as a reload once the
    registry knows the id (runs of offsets joined), never twice (a reload interrupted is
    finished as planned, its offsets not planned again), not while the topic has a load
    pending, and those retention deleted are named, not planned."""
    plan = plan_load([], LOGS, load_id="a", now_ms=1, fail_on_data_loss=False)
    assert plan is not None
    rows = plan.planned_rows() + plan.committed_rows({("t", 0): 97, ("u", 0): 50}, now_ms=2)
    dead = [DeadLetter("t", 0, o, 9, ".east") for o in (10, 11, 12, 40)] + [
        DeadLetter("t", 0, 5, 9, ".east"), DeadLetter("t", 0, 60, 8, ".east"), DeadLetter("u", 0, 3, 9, ".east", key=True)]
    asked: list[tuple[int, bool]] = []

    def known(d: DeadLetter) -> bool:
        asked.append((d.schema_id, d.key))
        return d.schema_id == 9

    starts = {("t", 0): 10, ("u", 0): 0}
    reload, gone = plan_reload(rows, dead, known, starts, load_id="r", now_ms=3)
    assert reload is not None and reload.reload and reload.load_id == "r"
    assert reload.ranges == (OffsetRange("t", 0, 10, 13), OffsetRange("t", 0, 40, 41), OffsetRange("u", 0, 3, 4))
    assert gone == [DeadLetter("t", 0, 5, 9, ".east")]  # below the log start: its value stays a dead letter
    assert sorted(asked) == [(8, False), (9, False), (9, True)]  # once per id and side
    planned = reload.planned_rows()
    assert {r.note for r in planned} == {RELOAD_NOTE}
    # Interrupted after planning: the same reload is finished, nothing planned again.
    rows += planned
    [pending] = pending_plans(rows)
    assert pending.reload and pending.ranges == reload.ranges and pending.load_id == "r"
    assert plan_reload(rows, dead, known, starts, load_id="s", now_ms=4)[0] is None
    rows += pending.committed_rows({("t", 0): 4, ("u", 0): 1}, now_ms=5)
    assert pending_plans(rows) == [] and finished_load_ids(rows) >= {"a", "r"}
    assert next_offsets(rows) == {("t", 0): 100, ("u", 0): 50}  # a reload moves no partition's next offset
    # A topic with a load pending waits; one more dead letter is planned alone.
    later = plan_load(rows, {**LOGS, ("t", 0): PartitionOffsets(10, 110)}, load_id="b", now_ms=6,
                      fail_on_data_loss=False)
    assert later is not None
    waiting = rows + later.planned_rows()
    more = [*dead, DeadLetter("t", 0, 99, 9, ".east")]
    assert plan_reload(waiting, more, known, starts, load_id="s", now_ms=7)[0] is None
    again, _ = plan_reload(rows, more, known, starts, load_id="s", now_ms=7)
    assert again is not None and again.ranges == (OffsetRange("t", 0, 99, 100),)


def test_planning_detects_data_loss_and_truncated_partitions() -> None:
    rows = [_row("a", ("t", 0), 0, 4, COMMITTED)]
    with pytest.raises(DataLossError, match=r"t-0: offsets 4 to 9 \(6 offsets\) were deleted"):
        plan_load(rows, {("t", 0): PartitionOffsets(10, 100)}, load_id="b", now_ms=1, fail_on_data_loss=True)
    plan = plan_load(rows, {("t", 0): PartitionOffsets(10, 100)}, load_id="b", now_ms=1, fail_on_data_loss=False)
    assert plan is not None and plan.ranges == (OffsetRange("t", 0, 10, 100),)
    assert [(r.status, r.start_offset, r.end_offset) for r in plan.planned_rows()] == [(PLANNED, 10, 100), (GAP, 4, 10)]
    # A gap alone still commits (so the next load starts after it).
    only_gap = plan_load(rows, {("t", 0): PartitionOffsets(10, 10)}, load_id="c", now_ms=1, fail_on_data_loss=False)
    assert only_gap is not None and only_gap.ranges == ()
    assert next_offsets(rows + only_gap.planned_rows() + only_gap.committed_rows({}, 2)) == {("t", 0): 10}
    with pytest.raises(LedgerError, match="loaded offsets up to 3, but the partition's high watermark is 2"):
        plan_load(rows, {("t", 0): PartitionOffsets(0, 2)}, load_id="d", now_ms=1, fail_on_data_loss=False)


@given(st.dictionaries(st.tuples(st.sampled_from("abc"), st.integers(0, 5)), st.integers(0, 10_000), max_size=12),
       st.one_of(st.none(), st.integers(1, 20_000)))
def test_offset_limit_is_exact_and_proportional(available: dict[tuple[str, int], int], limit: int | None) -> None:
    take = limit_offsets(available, limit)
    total = sum(available.values())
    assert sum(take.values()) == (total if limit is None else min(limit, total))
    assert all(0 <= take[tp] <= available[tp] for tp in available)
    if limit is not None and total > limit:
        assert all(take[tp] >= available[tp] * limit // total for tp in available)


# ---- Arrow columns: the C loop equals the Python reference -------------------------------

header_names = st.sampled_from(["a", "dcmirror.path", "dcmirror.source.cluster", "dcmirror.source.partition",
                                "dcmirror.source.offset", SOURCE_TOPIC_ID, SOURCE_LEADER_EPOCH, FENCE,
                                "\u00e9t\u00e9", ""])
# Numbers the Python int() reads but a plain decimal is not (" 1", "+1", "1_0"), and numbers
# just outside int32 / int64: both builders read them as null.
header_values = st.one_of(st.none(), st.binary(max_size=6), st.sampled_from([
    b"east", b"12", b"-3", b"x9", b"\xff", b"-", b"-0", b" 1", b"+1", b"1_0", TOPIC_A.encode(),
    b"2147483647", b"2147483648", b"-2147483648", b"-2147483649", b"9223372036854775807", b"9223372036854775808",
    b"9999999999999999999", b"-999999999999999999", b"12345678901234567890"]))
# A record's provenance: 0 none, 1 as mirrored before workers wrote topic ids and leader
# epochs, 2 and 3 two incarnations of the source topic.
records = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=12)), st.one_of(st.none(), st.binary(max_size=40)),
                             st.lists(st.tuples(header_names, header_values), max_size=5), st.integers(0, 3),
                             st.integers(0, 3)),
                   min_size=1, max_size=30)


def _chunk(spec: list, compression: int, log_append: bool) -> tuple[bytes, int]:
    data = b""
    offset = 100
    batch: list[Record] = []
    for key, value, headers, provenance, gap in spec:
        if provenance:
            topic_id = (None, None, TOPIC_A, TOPIC_B)[provenance]
            hs = mirrored_headers(tuple(headers), "east", 2, offset * 3, topic_id, -1 if topic_id is None else gap)
        else:
            hs = tuple(headers)
        batch.append(Record(offset, 1_700_000_000_000 + offset, key, value, hs))
        offset += 1 + gap  # gaps: offsets compacted away
        if len(batch) == 7:
            data += encode_batch(batch, compression=compression, attributes_extra=0x08 if log_append else 0)
            batch = []
    if batch:
        data += encode_batch(batch, compression=compression, attributes_extra=0x08 if log_append else 0)
    return data, offset


@pytest.mark.skipif(COLUMNS_BACKEND != "c", reason="the C column builder is not built")
@settings(max_examples=150, deadline=None)
@given(records, st.sampled_from([0, COMPRESSION_GZIP, COMPRESSION_LZ4]), st.booleans(), st.booleans(), st.booleans(),
       st.integers(0, 20), st.integers(0, 20))
def test_c_columns_equal_the_python_reference(spec: list, compression: int, log_append: bool, headers: bool,
                                              provenance: bool, cut_start: int, cut_end: int) -> None:
    data, end = _chunk(spec, compression, log_append)
    start, stop = 100 + cut_start, max(100 + cut_start, end - cut_end)
    reference = new_builder(headers, provenance, backend="python")
    reference.add_chunk(data + data[:30], start, stop)  # a partial batch at the end is left alone
    fast = new_builder(headers, provenance, backend="c")
    fast.add_chunk(data + data[:30], start, stop)
    assert fast.rows == reference.rows and fast.size_bytes == reference.size_bytes
    want = reference.finish("east.pageviews", 4)
    got = fast.finish("east.pageviews", 4)
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()


def test_columns_of_mirrored_records() -> None:
    recs = [Record(5, 1_000, b"k", b"v", mirrored_headers((("own", b"1"),), "west", 3, 77, TOPIC_A, 4)),
            Record(6, 2_000, None, None, ((FENCE, b""),)),
            Record(7, 3_000, b"k2", None, ()),
            Record(8, 4_000, b"k3", None, mirrored_headers((), "west", 3, 78)),  # mirrored before topic ids
            Record(9, 5_000, b"k4", None, ((SOURCE_TOPIC_ID, b"not-an-id"), (SOURCE_LEADER_EPOCH, b"2147483648")))]
    for backend in ("python", COLUMNS_BACKEND):
        builder = new_builder(True, True, backend=backend)
        builder.add_chunk(encode_batch(recs), 0, 100)
        rows = builder.finish("agg.t", 1).to_pylist()
        assert [(r["offset"], r["sourceCluster"], r["sourcePartition"], r["sourceOffset"], r["sourceTopicId"],
                 r["sourceLeaderEpoch"], r["fence"], r["headers"]) for r in rows] == [
            (5, "west", 3, 77, TOPIC_A, 4, False, [{"key": "own", "value": b"1"}]),
            (6, None, None, None, None, None, True, [{"key": FENCE, "value": b""}]),
            (7, None, None, None, None, None, False, []),
            (8, "west", 3, 78, None, None, False, []),
            (9, None, None, None, "not-an-id", None, False, [])]  # the text as it is; no int32 epoch
        assert [r["timestamp"].timestamp() for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert {(r["topic"], r["partition"], r["timestampType"]) for r in rows} == {("agg.t", 1, 0)}


def test_provenance_columns_follow_source_offset_in_both_schemas() -> None:
    for headers in (False, True):
        ddl_names = re.findall(r"(?:^|, )(\w+) [A-Z]", spark_schema(headers, True))
        assert ddl_names == arrow_schema(headers, True).names
    assert arrow_schema(False, True).names[-6:] == ["sourceCluster", "sourcePartition", "sourceOffset",
                                                    "sourceTopicId", "sourceLeaderEpoch", "fence"]


def test_large_random_chunk_columns_match() -> None:
    recs = [Record(i, 1_700_000_000_000 + i, os.urandom(8), os.urandom(200), mirrored_headers((), "east", 0, i))
            for i in range(3000)]
    data = b"".join(encode_batch(recs[i:i + 500]) for i in range(0, 3000, 500))
    a = new_builder(False, True, backend="python")
    a.add_chunk(data, 10, 2990)
    b = new_builder(False, True, backend=COLUMNS_BACKEND)
    b.add_chunk(data, 10, 2990)
    assert a.finish("t", 0).equals(b.finish("t", 0))


# ---- names and configuration ----------------------------------------------------------

def test_table_names_and_internal_topics() -> None:
    assert table_name("east.pageviews") == "east_pageviews"
    assert table_name("West-Clicks.v2") == "west_clicks_v2"
    assert not any(map(is_loadable, ["__consumer_offsets", "__x", "dcmirror.heartbeats", "dcmirror.checkpoints",
                                     "_schemas"]))
    assert is_loadable("east.pageviews") and is_loadable("dcmirror.other") and is_loadable("east._schemas")
    from cluster.registry.store import SCHEMAS_TOPIC
    from spark_aggregate.settings import REGISTRY_TOPIC
    assert REGISTRY_TOPIC == SCHEMAS_TOPIC


BASE = """
[clusters.agg]
datacenter = "central"
brokers = ["127.0.0.1:9092"]
[clusters.east]
datacenter = "dc1"
brokers = ["127.0.0.1:9093"]
"""


def test_warehouse_settings_from_the_topology() -> None:
    topology = loads(BASE + """
[warehouse]
source = "agg"
path = "/tmp/wh"
[warehouse.config]
"spark.master" = "local[4]"
"spark.sql.shuffle.partitions" = 8
failOnDataLoss = false
minPartitions = 6
maxOffsetsPerLoad = 100000
"load.interval.ms" = 60000
"load.writer" = "spark"
"kafka.max.partition.fetch.bytes" = 1048576
"metastore.uri" = "thrift://ms:9083"
"warehouse.uri" = "hdfs://nn:8020/wh"
[warehouse.schemas]
"east[.]pageviews" = "user STRING, ts TIMESTAMP"
""")
    s = WarehouseSettings.from_topology(topology)
    assert (s.source, s.bootstrap, s.warehouse_uri, s.metastore_uri) == ("agg", "127.0.0.1:9092", "hdfs://nn:8020/wh",
                                                                       "thrift://ms:9083")
    assert s.spark_conf == {"spark.master": "local[4]", "spark.sql.shuffle.partitions": "8"}
    assert (s.fail_on_data_loss, s.min_partitions, s.max_offsets_per_load, s.load_interval_ms) == (False, 6, 100000,
                                                                                                   60000)
    assert s.kafka == {"max.partition.fetch.bytes": "1048576", "client.rack": "central"}  # the source's datacenter
    assert s.writer == "spark"
    assert s.datacenters == {"agg": "central", "east": "dc1"}
    assert s.schema_of("east.pageviews") == "user STRING, ts TIMESTAMP" and s.schema_of("west.pageviews") is None
    plain = WarehouseSettings.from_topology(loads(BASE + '[warehouse]\nsource = "agg"\npath = "/tmp/wh"\n'))
    assert (plain.spark_conf, plain.warehouse_uri, plain.embedded_metastore, plain.writer) == (
        {"spark.master": "local[2]"}, "file:///tmp/wh", True, "auto")


@pytest.mark.parametrize(("section", "message"), [
    ('config = { failOnDataLos = false }', "unknown warehouse config 'failOnDataLos' (did you mean 'failOnDataLoss'?)"),
    ('config = { minPartitions = 0 }', "'minPartitions' takes a whole number of at least 1"),
    ('config = { "load.interval.ms" = "soon" }', "'load.interval.ms' takes a whole number"),
    ('config = { failOnDataLoss = "maybe" }', "'failOnDataLoss' takes true or false"),
    ('config = { "load.writer" = "pandas" }', "'load.writer' takes one of auto, arrow, spark, not 'pandas'"),
    ('config = { "metastore.uri" = "ms:9083" }', "takes a URI such as 'thrift://metastore:9083'"),
    ('schemas = { "t" = "a INTEGR" }', "unknown type 'INTEGR'"),
    ('schemas = { "t" = "a INT, a STRING" }', "column 'a' appears twice"),
    ('schemas = { "t" = "a INT NOT NULL" }', "NOT NULL, COMMENT and defaults are not supported"),
    ('schemas = { "t" = "source_dc STRING" }', "column 'source_dc' is one of the warehouse's own columns"),
    ('schemas = { "(" = "a INT" }', "invalid topic regex"),
    ('schemas = { "t" = 5 }', "must be a Spark DDL column list"),
    ('schema = {}', "unknown key 'schema' (did you mean 'schemas'?)"),
])
def test_warehouse_config_mistakes_are_refused(section: str, message: str) -> None:
    with pytest.raises(TopologyError) as failure:
        loads(BASE + '[warehouse]\nsource = "agg"\n' + section + "\n")
    assert message in str(failure.value)
    assert ":10: warehouse." in str(failure.value) or ":11: warehouse." in str(failure.value)
