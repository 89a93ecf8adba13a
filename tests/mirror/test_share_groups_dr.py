"""A share group moves with its mirror topic through a failover (issue 44; docs/design.md,
"Share groups across datacenters"): the share-partition start offsets (SPSO) of the share
groups `mirror_groups` names are copied into the target (mirror/topic_sync.py), and after
`dcmirror mirror failover` a share consumer of the group on the promoted copy receives exactly
the records from the last copied SPSO on: none below it, none missing; what the source group
had accepted above the SPSO, or released, comes again (at least once, as after a crash).

Real processes: a 1-broker east mirrored into a 1-broker dr (mirror topics), one worker; on
east a librdkafka share consumer (explicit acknowledgements) accepts each partition's first
records and a few above the first it leaves unaccepted; east dies whole (kill -9) after the
sync copied the start offsets; failover; a librdkafka share consumer on dr reads.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import trio
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from cluster.client.admin import Admin
from tests.mirror.lab import MirrorLab, end_offsets, new_topic, wait_for
from tests.mirror.test_failover import dr_command
from tests.mirror.test_mirror_topic_sync import SyncFlow

pytestmark = [pytest.mark.timeout(300), pytest.mark.heavy]

FLOW = "east-to-dr"
TOPIC, GROUP = "jobs", "jobs-sg"
RECORDS = 60  # per partition
ACCEPTED = {0: 20, 1: 7}  # per partition: offsets below it accepted at the source, so its SPSO
ABOVE = 3  # records accepted above the SPSO (the SPSO's own record is released)
PROGRESS_S = 60.0  # the longest a step may go without progress
SYNC_BOUND_S = 30.0
DELIVERY_LIMIT = 10  # east's share.delivery.count.limit (Kafka's highest)


def share_starts(bootstrap: str) -> dict[int, int]:
    """GROUP's share-partition start offsets of TOPIC (DescribeShareGroupOffsets; -1: none)."""
    async def describe() -> dict[int, int]:
        async with Admin(bootstrap, config={"default.api.timeout.ms": 10_000}) as admin:
            return {o.partition: o.start_offset
                    for o in await admin.share_group_offsets(GROUP, {TOPIC: list(ACCEPTED)}) if o.error_code == 0}
    return trio.run(describe)


def produce(bootstrap: str, prefix: str, per_partition: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 2})
    for i in range(per_partition):
        for q in ACCEPTED:
            p.produce(TOPIC, value=f"{prefix}-{q}-{i}".encode(), partition=q)
    assert p.flush(60) == 0


def share_rounds(lab: MirrorLab) -> int | None:
    """The share-offset rounds the worker's status file counts (None: no status yet)."""
    found = list(lab.worker_status(FLOW).values())
    return int(found[0]["topic_sync"]["totals"]["share_offset_rounds"]) if found else None


def settle_at_source(east: str) -> dict[int, set[int]]:
    """A share member on east accepts offsets below ACCEPTED[p] and the ABOVE records after the
    one at ACCEPTED[p]; releases that one and the rest. Returns what it accepted."""
    c = ShareConsumer({"bootstrap.servers": east, "group.id": GROUP, "share.acknowledgement.mode": "explicit",
                       "log_level": 3})
    c.subscribe([TOPIC])
    accepted: dict[int, set[int]] = {p: set() for p in ACCEPTED}
    seen: dict[int, set[int]] = {p: set() for p in ACCEPTED}
    try:
        last = time.monotonic()
        while any(not set(range(n + 1 + ABOVE)) <= seen[p] for p, n in ACCEPTED.items()):
            for m in c.poll(0.3):
                if m.error() is not None:
                    continue
                p, o = m.partition(), m.offset()
                assert m.value() == f"job-{p}-{o}".encode()
                seen[p].add(o)
                last = time.monotonic()
                if o < ACCEPTED[p] or ACCEPTED[p] < o <= ACCEPTED[p] + ABOVE:
                    assert o not in accepted[p], f"{p}-{o} delivered again after it was accepted"
                    accepted[p].add(o)
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                else:
                    assert m.delivery_count() < DELIVERY_LIMIT, f"{p}-{o} released {m.delivery_count()} times"
                    c.acknowledge(m, AcknowledgeType.RELEASE)
            assert time.monotonic() - last < PROGRESS_S, f"the east member saw {seen}"
        answers = c.commit_sync(30.0)
        assert all(err is None for err in answers.values()), answers
        wait_for(lambda: share_starts(east) == ACCEPTED, PROGRESS_S, f"{GROUP}'s start offsets in east at {ACCEPTED}")
    finally:
        c.close()
    return accepted


def read_after_failover(dr: str) -> dict[int, list[int]]:
    """A share member on dr reads (implicit acknowledgement) until every partition delivered a
    marker written after it joined: the job records' offsets it got, per partition, in order."""
    c = ShareConsumer({"bootstrap.servers": dr, "group.id": GROUP, "log_level": 3})
    c.subscribe([TOPIC])
    marker = Producer({"bootstrap.servers": dr, "linger.ms": 0, "log_level": 2})
    got: dict[int, list[int]] = {p: [] for p in ACCEPTED}
    marked: set[int] = set()
    try:
        last = time.monotonic()
        while marked != set(ACCEPTED):
            for q in set(ACCEPTED) - marked:  # one more marker each round until it comes
                marker.produce(TOPIC, value=b"marker", partition=q)
            marker.flush(30)
            for m in c.poll(0.5):
                if m.error() is not None:
                    continue
                last = time.monotonic()
                if m.value() == b"marker":
                    marked.add(m.partition())
                else:
                    p, o = m.partition(), m.offset()
                    assert m.value() == f"job-{p}-{o}".encode(), (p, o, m.value())
                    got[p].append(o)
            assert time.monotonic() - last < PROGRESS_S, f"nothing delivered on dr for {PROGRESS_S:.0f} s: {got}"
        for m in c.poll(1.0):  # a moment more: nothing delivered a second time
            if m.error() is None and m.value() != b"marker":
                got[m.partition()].append(m.offset())
    finally:
        c.close()
    return got


def test_a_share_group_resumes_at_the_copied_start_offset_after_a_failover(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    started = time.monotonic()
    lab = mirror_lab({"east": 1, "dr": 1}, **{"group.initial.rebalance.delay.ms": 0})
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    new_topic(east, TOPIC, len(ACCEPTED))
    admin = AdminClient({"bootstrap.servers": east})  # held: a collected client cancels its futures
    # east's group reads from offset 0, and a record released while the member waits for the
    # other partition's records is not archived at its fifth delivery (the start would pass it).
    resource = ConfigResource(ResourceType.GROUP, GROUP, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("share.delivery.count.limit", str(DELIVERY_LIMIT), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)
    del admin  # (its connections to east would complain once east is gone)
    produce(east, "job", RECORDS)
    lab.write_topology([SyncFlow("east", "dr", TOPIC, rename="{topic}", mirror_topics=True, mirror_groups=GROUP,
                                 config={"topic.refresh.ms": "1000", "group.offset.sync.ms": "1000"})],
                       replication_factor=1)
    lab.start_worker(FLOW, 0)

    accepted = settle_at_source(east)
    settled_at = time.monotonic()
    ends = {p: RECORDS for p in ACCEPTED}
    wait_for(lambda: end_offsets(dr, TOPIC) == ends, PROGRESS_S, f"dr's {TOPIC} at east's ends {ends}",
             interval_s=0.2, on_timeout=lab.mirror_log_tail)
    # Two share-offset rounds that began after east's start offsets settled and dr held the
    # records: the last copied SPSO is east's.
    (before,) = wait_for(lambda: [r] if (r := share_rounds(lab)) is not None else None, SYNC_BOUND_S,
                         "the worker's status file", interval_s=0.2)
    wait_for(lambda: (share_rounds(lab) or 0) >= before + 2, SYNC_BOUND_S, "two share-offset rounds of the sync",
             interval_s=0.2, on_timeout=lab.mirror_log_tail)
    print(f"dr's start offsets {share_starts(dr)} {time.monotonic() - settled_at:.1f} s after east's settled "
          f"at {ACCEPTED}", flush=True)

    # east dies whole: the link first, then its brokers.
    lab.kill_worker(FLOW, 0)
    lab.workers[FLOW, 0].wait(30)
    for broker in lab["east"].brokers.values():
        broker.kill9()
    report = dr_command(lab, "failover")
    assert report["primary"] == "dr"

    got = read_after_failover(dr)
    for p, n in ACCEPTED.items():
        times = Counter(got[p])
        assert not [o for o in times if o < n], f"partition {p}: records below the SPSO {n} delivered again: {got[p]}"
        missing = sorted(set(range(n, RECORDS)) - set(times))
        assert not missing, f"partition {p}: records {missing} never delivered on dr (SPSO {n}); got {got[p]}"
        assert set(times) == set(range(n, RECORDS)) and max(times.values()) == 1, got[p]
        # What east had accepted above its SPSO came again: at least once.
        assert accepted[p] - set(range(n)) <= set(times)
    (worker,) = lab.worker_status(FLOW).values()
    status: dict[str, Any] = worker["topic_sync"]
    # (at least one per partition: a round may have copied a start before all was settled)
    assert status["totals"]["share_offsets_copied"] >= len(ACCEPTED), status
    assert status["share_group_offsets"]["live_groups"] == [], status
    print(f"share group resumed on dr at {ACCEPTED}; the test took {time.monotonic() - started:.1f} s", flush=True)
