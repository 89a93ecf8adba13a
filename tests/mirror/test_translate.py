"""A consumer group moves from east to the aggregate: `dcmirror mirror translate --group G
--apply` commits the translated offsets there, and the group, now consuming the aggregate's
east.pageviews, gets exactly the records it had not read at the source — nothing lost,
nothing read twice. Checked both from the workers' checkpoints (the source may be down)
and --live."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.harness import REPO
from tests.mirror.lab import Flow, MirrorLab, new_topic

PARTITIONS = 3
RECORDS = 3000


def produce(bootstrap: str, topic: str, n: int, tag: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, f"{tag}-{i}".encode(), key=str(i).encode(), partition=i % PARTITIONS)
    assert p.flush(30) == 0


def read_as_group(bootstrap: str, topic: str, group: str, want: int, *, commit: bool = False) -> list[tuple[int, int, bytes]]:
    """Up to `want` records of `topic` as a member of `group` from its committed offsets
    (earliest if none); (partition, offset, value) of records with a value (fences skipped)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[tuple[int, int, bytes]] = []
    idle = 0
    try:
        while len(got) < want and idle < 20:
            msgs = c.consume(500, 0.5)
            idle = 0 if msgs else idle + 1
            for m in msgs:
                assert m.error() is None, m.error()
                if m.value() is not None:
                    got.append((m.partition(), m.offset(), m.value()))
        if commit:
            c.commit(asynchronous=False)
    finally:
        c.close()
    return got


def translate(lab: MirrorLab, *args: str) -> list[dict[str, object]]:
    out = subprocess.run([sys.executable, "-m", "deploy.cli", "mirror", "translate", "--config",
                          str(lab.topology_path), "--group", "app", "--json", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("source_of_truth", ["checkpoints", "live"])
def test_a_group_moved_to_the_aggregate_resumes_exactly_where_it_stopped(
        mirror_lab: Callable[..., MirrorLab], source_of_truth: str) -> None:
    lab = mirror_lab({"east": 1, "aggregate": 1})
    new_topic(lab.bootstrap("east"), "pageviews", PARTITIONS)
    produce(lab.bootstrap("east"), "pageviews", RECORDS, "before")
    # The application reads about a third at the source and commits there.
    read_at_source = read_as_group(lab.bootstrap("east"), "pageviews", "app", RECORDS // 3, commit=True)
    assert read_at_source
    lab.write_topology([Flow("east", "aggregate", "pageviews", workers=1,
                             config={"checkpoint.interval.ms": "500", "topic.refresh.ms": "1000"})])
    lab.start_mirror()
    produce(lab.bootstrap("east"), "pageviews", RECORDS, "during")  # more traffic while the mirror runs
    lab.check_exactly_once("east-to-aggregate", ["pageviews"], timeout_s=120)

    committed = {(t, p): o for (t, p), o in _committed(lab.bootstrap("east"), "app").items()}
    expect_rows = len(committed)

    def rows_ready() -> list[dict[str, object]]:
        rows = translate(lab, *(["--live"] if source_of_truth == "live" else []))
        return rows if len(rows) == expect_rows else []

    from tests.mirror.lab import wait_for

    rows = wait_for(rows_ready, 60, "a checkpoint for every partition the group committed")
    for row in rows:
        assert row["source_offset"] == committed[(row["topic"], row["partition"])]
    applied = translate(lab, "--apply", *(["--live"] if source_of_truth == "live" else []))
    assert {(r["partition"], r["target_offset"]) for r in applied} == {(r["partition"], r["target_offset"]) for r in rows}

    # Now the group reads the aggregate: exactly what it had not read at the source.
    total = 2 * RECORDS
    rest = read_as_group(lab.bootstrap("aggregate"), "east.pageviews", "app", total - len(read_at_source))
    seen_before = {v for _, _, v in read_at_source}
    seen_after = [v for _, _, v in rest]
    assert not seen_before & set(seen_after), "records read at the source came again from the aggregate"
    assert len(seen_after) == len(set(seen_after)), "records read twice from the aggregate"
    all_values = _all_values(lab.bootstrap("east"))
    assert seen_before | set(seen_after) == all_values, (
        f"{len(all_values - seen_before - set(seen_after))} records never read")


def _committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = c.committed([TopicPartition("pageviews", p) for p in range(PARTITIONS)], timeout=10)
        return {(tp.topic, tp.partition): tp.offset for tp in parts if tp.offset >= 0}
    finally:
        c.close()


def _all_values(bootstrap: str) -> set[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "all", "enable.auto.commit": False})
    c.assign([TopicPartition("pageviews", p, 0) for p in range(PARTITIONS)])
    out: set[bytes] = set()
    idle = 0
    try:
        while idle < 6:
            msgs = c.consume(1000, 0.5)
            idle = 0 if msgs else idle + 1
            out.update(m.value() for m in msgs if m.error() is None)
    finally:
        c.close()
    return out
