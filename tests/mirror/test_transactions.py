"""A source topic written in transactions, some aborted, mirrored through repeated worker
kill -9's (issue 19): the aggregate holds exactly the source's committed records — each
once, in source order, with provenance — and nothing else, whichever isolation level its
consumer uses (the mirror reads its sources read_committed, and its takeover fences are
invisible markers); the warehouse loader's read of the aggregate gives the same rows.
The kill schedule is seeded (replay: DCMIRROR_FAULT_SEED=N)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from spark_aggregate.options import parse_options
from spark_aggregate.source import plan_ranges, read_range
from tests.fault_workload import fault_rng
from tests.mirror.lab import (
    Flow,
    MirrorLab,
    SourceWriter,
    compare,
    end_offsets,
    new_topic,
    read_topic,
    wait_for,
)

TOPIC, PARTITIONS, FLOW = "orders", 3, "east-to-aggregate"
RECORDS, PER_TXN, ABORT_EVERY = 6000, 30, 3
KILLS = 3


def mirrored_so_far(lab: MirrorLab) -> int:
    return sum(doc.get("records", 0) for doc in lab.worker_status(FLOW).values())


@pytest.mark.timeout(300)
def test_aborted_source_transactions_never_reach_the_aggregate(mirror_lab: Callable[..., MirrorLab]) -> None:
    rng = fault_rng("mirror of a transactional source")
    lab = mirror_lab({"east": 1, "aggregate": 1})
    new_topic(lab.bootstrap("east"), TOPIC, PARTITIONS)
    lab.write_topology([Flow("east", "aggregate", TOPIC, workers=2, config={
        "topic.refresh.ms": "1000", "consumer.session.timeout.ms": "6000",
        "consumer.heartbeat.interval.ms": "500"})])
    lab.start_mirror()
    writer = SourceWriter(lab.bootstrap("east"), TOPIC, PARTITIONS, RECORDS, "east", rate_per_s=300,
                          transactional_id="east-orders", per_txn=PER_TXN, abort_every=ABORT_EVERY).start()
    wait_for(lambda: mirrored_so_far(lab) > 0, 90, "the mirror copies records", on_timeout=lab.mirror_log_tail)
    for n in range(KILLS):
        time.sleep(rng.uniform(1.0, 4.0))
        index = rng.randrange(2)
        pid = lab.kill_worker(FLOW, index)
        print(f"kill {n + 1}: kill -9 {FLOW}-w{index} (pid {pid}) after {writer.sent} records sent", flush=True)
        wait_for(lambda index=index, pid=pid: lab.worker_pids(FLOW).get(index) not in (None, pid), 60,
                 f"the supervisor restarts {FLOW}-w{index}", on_timeout=lab.mirror_log_tail)
    writer.finish()
    ends = end_offsets(lab.bootstrap("east"), TOPIC)
    lab.wait_caught_up({FLOW: {(TOPIC, p): end for p, end in ends.items()}}, timeout_s=120)

    source_all = read_topic(lab.bootstrap("east"), TOPIC)
    source = read_topic(lab.bootstrap("east"), TOPIC, isolation="read_committed")
    aborted_in_source = sum(1 for rows in source_all.values() for r in rows if b"-aborted-" in (r.value or b""))
    assert sum(map(len, source.values())) == RECORDS
    assert aborted_in_source == writer.aborted > 0, "the source holds aborted transactions"
    for isolation in ("read_uncommitted", "read_committed"):
        target = read_topic(lab.bootstrap("aggregate"), f"east.{TOPIC}", isolation=isolation)
        read = sum(map(len, target.values()))
        print(f"aggregate, {isolation}: {read} records read; source: {RECORDS} committed, "
              f"{aborted_in_source} aborted", flush=True)
        compare(source, target, "east").assert_clean()
        assert read == RECORDS, f"{isolation}: {read} records read, {RECORDS} committed at the source"

    # What a warehouse load reads (the dcmirror source's executor side): the same records.
    options = parse_options({"bootstrap.servers": lab.bootstrap("aggregate"), "subscribe": f"east.{TOPIC}",
                             "includeProvenance": "true"})
    loaded: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for r in plan_ranges(options):
        for batch in read_range(options, r):
            for row in batch.to_pylist():
                loaded[row["sourcePartition"]].append((row["sourceOffset"], row["value"]))
    assert loaded == {p: [(r.offset, r.value) for r in rows] for p, rows in source.items()}
