"""Share groups across datacenters (issue 44; docs/design.md, "Share groups across
datacenters"): the start offsets (SPSO) of the share groups a mirror-topics flow's
`mirror_groups` names follow into the target (mirror/topic_sync.py `plan_share_offsets`, and
its driver over fake Admins). Plain function calls, no I/O; then a seeded walk of the
decision against a model of both clusters (source start offsets moving on and rewound by an
operator, the mirror catching up, the target's group going live and consuming, the worker
restarting, alters failing), each failure naming its seed: replay with
DCMIRROR_SHARE_SYNC_SEED_BASE=<seed> DCMIRROR_SHARE_SYNC_SEEDS=1."""

from __future__ import annotations

import logging
import os
import random
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from cluster.client.admin import AdminError, SharePartitionOffset
from cluster.common.admin_http import prometheus_text
from cluster.protocol.errors import ErrorCode
from mirror.topic_sync import (
    NO_SHARE_GROUP,
    SourceStart,
    SyncSettings,
    TargetShareGroup,
    TopicSync,
    plan_share_offsets,
    remembered,
)
from tests.unit.test_topic_sync import TOPICS, FakeAdmin

SEEDS = int(os.environ.get("DCMIRROR_SHARE_SYNC_SEEDS", "500"))
SEED_BASE = int(os.environ.get("DCMIRROR_SHARE_SYNC_SEED_BASE", "0"))
IDLE = TargetShareGroup("Empty", 0)
LIVE = TargetShareGroup("Stable", 1)
ORDERS0, ORDERS1 = ("east.orders", 0), ("east.orders", 1)


# ---- the decision ------------------------------------------------------------------------


def test_start_offsets_are_copied_one_to_one_for_started_mirrored_partitions_only() -> None:
    source = {("orders", 0): 30, ("orders", 1): 0, ("payments", 0): -1, ("other", 0): 99}
    ends = {ORDERS0: 50, ORDERS1: 17, ("east.payments", 0): 5}
    plan = plan_share_offsets("jobs", source, TOPICS, NO_SHARE_GROUP, {}, ends, {})
    # renamed through the flow's mapping; -1 (never started at the source) and an unmirrored
    # topic are left alone; a start at 0 is a start
    assert plan.alter == {ORDERS0: 30, ORDERS1: 0}
    assert plan.held_back == {} and plan.unchanged == 0 and not plan.live
    assert plan.seen == {ORDERS0: SourceStart(30), ORDERS1: SourceStart(0)}


def test_a_start_beyond_the_mirrors_log_end_waits_for_the_mirror() -> None:
    source = {("orders", 0): 51, ("orders", 1): 40, ("orders", 2): 3}
    ends = {ORDERS0: 50, ORDERS1: 40}  # partition 2 is not in the target yet
    plan = plan_share_offsets("jobs", source, TOPICS, IDLE, {}, ends, {})
    assert plan.alter == {ORDERS1: 40}  # the log end itself: the next record the mirror takes
    assert plan.held_back == {ORDERS0: "starts at 51 at the source, the mirror holds offsets below 50 only",
                              ("east.orders", 2): "the partition is not in the target yet"}
    later = plan_share_offsets("jobs", source, TOPICS, IDLE, {ORDERS1: 40},
                               {**ends, ORDERS0: 60, ("east.orders", 2): 3}, remembered(plan))
    assert later.alter == {ORDERS0: 51, ("east.orders", 2): 3}
    assert later.unchanged == 1 and later.held_back == {}


def test_the_target_start_is_never_moved_back_unless_the_source_moved_back() -> None:
    ends = {ORDERS0: 100}
    # The target's group ran there and settled up to 60 (or an operator moved it): the
    # source's 40 does not take it back.
    plan = plan_share_offsets("jobs", {("orders", 0): 40}, TOPICS, IDLE, {ORDERS0: 60}, ends, {})
    assert plan.alter == {} and "never moved back" in plan.held_back[ORDERS0]
    memory = remembered(plan)
    # The source moves on below the target's start: still held.
    plan = plan_share_offsets("jobs", {("orders", 0): 55}, TOPICS, IDLE, {ORDERS0: 60}, ends, memory)
    assert plan.alter == {} and plan.seen == {ORDERS0: SourceStart(55)}
    memory = remembered(plan)
    # An operator moves the source back (AlterShareGroupOffsets there): it follows.
    plan = plan_share_offsets("jobs", {("orders", 0): 20}, TOPICS, IDLE, {ORDERS0: 60}, ends, memory)
    assert plan.alter == {ORDERS0: 20} and plan.seen == {ORDERS0: SourceStart(20, True)}
    assert remembered(plan) == {ORDERS0: SourceStart(20)}  # copied: the move back is done
    # ... and forward always.
    plan = plan_share_offsets("jobs", {("orders", 0): 70}, TOPICS, IDLE, {ORDERS0: 20}, ends, remembered(plan))
    assert plan.alter == {ORDERS0: 70}


def test_a_move_back_seen_while_the_target_group_is_live_is_copied_once_it_is_idle() -> None:
    ends = {ORDERS0: 100}
    memory = remembered(plan_share_offsets("jobs", {("orders", 0): 50}, TOPICS, IDLE, {ORDERS0: 50}, ends, {}))
    live = plan_share_offsets("jobs", {("orders", 0): 10}, TOPICS, LIVE, {}, ends, memory)
    assert live.live and live.alter == {} and live.held_back == {}
    memory = remembered(live)
    assert memory == {ORDERS0: SourceStart(10, True)}
    # Meanwhile the target's members settled up to 80; once they left, the source's move back
    # wins (the operator asked for those records again).
    plan = plan_share_offsets("jobs", {("orders", 0): 12}, TOPICS, IDLE, {ORDERS0: 80}, ends, memory)
    assert plan.alter == {ORDERS0: 12}


def test_a_failed_alter_keeps_the_move_back_to_copy() -> None:
    ends = {ORDERS0: 100}
    memory = {ORDERS0: SourceStart(50)}
    plan = plan_share_offsets("jobs", {("orders", 0): 30}, TOPICS, IDLE, {ORDERS0: 50}, ends, memory)
    assert plan.alter == {ORDERS0: 30}
    kept = remembered(plan, failed=[ORDERS0])
    assert kept == {ORDERS0: SourceStart(30, True)}
    again = plan_share_offsets("jobs", {("orders", 0): 30}, TOPICS, IDLE, {ORDERS0: 50}, ends, kept)
    assert again.alter == {ORDERS0: 30}


@pytest.mark.parametrize("group, live", [
    (NO_SHARE_GROUP, False), (TargetShareGroup("Empty", 0), False), (TargetShareGroup("Stable", 2), True),
])
def test_a_share_group_with_members_in_the_target_is_never_written(group: TargetShareGroup, live: bool) -> None:
    plan = plan_share_offsets("jobs", {("orders", 0): 30}, TOPICS, group, {}, {ORDERS0: 50}, {})
    assert plan.live is live
    assert plan.alter == ({} if live else {ORDERS0: 30})
    assert plan.seen == {ORDERS0: SourceStart(30)}  # seen either way: a later move back is known


# ---- a seeded walk against a model of both clusters ---------------------------------------


def run_schedule(seed: int, steps: int = 250) -> dict[str, int]:
    """One partition mirrored; the truth kept beside what the sync decides. Checked after
    every round: an alter sets the source's start offset of that moment, never beyond the
    mirror's log end, never into a live group, and below the target's own start only after
    the source moved back; the target never starts past the source (no record skipped after
    a failover) unless its own members or a source move back not yet followed put it there;
    and an idle round that can copy does."""
    rng = random.Random(seed)
    source_end = mirror_end = 0
    source_start = target_start = -1
    live = False
    memory: dict[tuple[str, int], SourceStart] = {}
    copied_ever = False
    consumed_since_copy = rewound_since_copy = wiped_since_copy = False
    counts = {"rounds": 0, "alters": 0, "moved_back": 0, "held": 0, "live": 0}
    for step in range(steps):
        where = f"seed {seed} step {step}"
        r = rng.random()
        if r < 0.2:
            source_end += rng.randint(1, 20)
        elif r < 0.35:
            mirror_end = min(source_end, mirror_end + rng.randint(0, 30))
        elif r < 0.5:  # the source's members settle records (or it starts)
            source_start = min(source_end, max(source_start, 0) + rng.randint(0, 15))
        elif r < 0.55 and source_start > 0:  # an operator moves the source back
            source_start = rng.randint(0, source_start - 1)
            rewound_since_copy = True
        elif r < 0.62:
            live = not live
        elif r < 0.7 and live:  # the target's own members settle records
            moved = min(mirror_end, max(target_start, 0) + rng.randint(1, 10))
            if moved > target_start:
                target_start, consumed_since_copy = moved, True
        elif r < 0.73:  # the worker starts again: its memory is gone
            memory, wiped_since_copy = {}, True
        if rng.random() < 0.5:
            continue
        counts["rounds"] += 1
        source = {("orders", 0): source_start}
        target = {ORDERS0: target_start} if target_start >= 0 else {}
        plan = plan_share_offsets("jobs", source, TOPICS, LIVE if live else IDLE, target, {ORDERS0: mirror_end},
                                  memory)
        failed = bool(plan.alter) and rng.random() < 0.1
        before = target_start
        counts["live"] += plan.live
        counts["held"] += bool(plan.held_back)
        if plan.alter:
            (value,) = plan.alter.values()
            assert not live, f"{where}: a live group written"
            assert value == source_start, f"{where}: altered to {value}, the source starts at {source_start}"
            assert value <= mirror_end, f"{where}: {value} beyond the mirror's end {mirror_end}"
            assert value >= before or rewound_since_copy, f"{where}: moved back {before} -> {value} on its own"
            if not failed:
                counts["alters"] += 1
                counts["moved_back"] += value < before
                target_start, copied_ever = value, True
        memory = remembered(plan, [ORDERS0] if failed else [])
        if source_start >= 0 and not (consumed_since_copy or rewound_since_copy):
            assert target_start <= source_start, f"{where}: the target starts at {target_start}, past {source_start}"
        if not live and not failed and 0 <= source_start <= mirror_end:
            follows = before <= source_start or (copied_ever and not consumed_since_copy and not wiped_since_copy)
            if follows:
                assert target_start == source_start, f"{where}: {target_start} stays, the source starts at {source_start}"
        if plan.alter and not failed:
            consumed_since_copy = rewound_since_copy = wiped_since_copy = False
    return counts


def test_the_decision_holds_over_seeded_schedules() -> None:
    """SEEDS schedules (DCMIRROR_SHARE_SYNC_SEEDS); a failure names its seed."""
    totals = {"rounds": 0, "alters": 0, "moved_back": 0, "held": 0, "live": 0}
    for seed in range(SEED_BASE, SEED_BASE + SEEDS):
        for k, v in run_schedule(seed).items():
            totals[k] += v
    # The walk reaches every branch (a model that never moves back proves little).
    assert all(v > 0 for v in totals.values()), totals


def test_the_walk_finds_a_sync_that_moves_the_target_back_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker is not blind: a plan that copies whatever differs (the consumer-group
    rule) moves a target its own members advanced back, and a schedule says so."""
    import mirror.topic_sync as ts

    def copy_any(group: str, source: Any, topics: Any, target_group: Any, target: Any, ends: Any, memory: Any) -> Any:
        plan = real(group, source, topics, target_group, target, ends, memory)
        if plan.live:
            return plan
        alter = {**plan.alter, **{tp: s for (t, p), s in source.items() if (tp := (topics[t], p)) in plan.held_back
                                  and "never moved back" in plan.held_back[tp]}}
        return ts.ShareOffsetPlan(group, alter, {}, plan.unchanged, False, plan.seen)

    real = ts.plan_share_offsets
    monkeypatch.setitem(globals(), "plan_share_offsets", copy_any)
    with pytest.raises(AssertionError, match="on its own"):
        for seed in range(SEED_BASE, SEED_BASE + SEEDS):
            run_schedule(seed)


# ---- the driver over fake Admins -----------------------------------------------------------


class ShareAdmin(FakeAdmin):
    """FakeAdmin with share groups: start offsets by group, members in the target."""

    def __init__(self, *, share: dict[str, dict[tuple[str, int], int]] | None = None,
                 members: dict[str, int] | None = None, alter_error: int | None = None,
                 partition_errors: dict[tuple[str, int], int] | None = None, unsupported: bool = False,
                 partitions: dict[str, int] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.share = share or {}
        self.members = members or {}
        self.alter_error = alter_error
        self.partition_errors = partition_errors or {}
        self.unsupported = unsupported
        self.partitions = partitions or {}
        self.alters: list[tuple[str, dict[tuple[str, int], int]]] = []

    async def list_share_groups(self) -> list[tuple[str, str]]:
        return [(g, "Empty") for g in sorted(self.share)]

    async def metadata(self, topics: list[str]) -> Any:
        if not self.partitions:
            return await super().metadata(topics)
        return SimpleNamespace(topics=[SimpleNamespace(name=t, error_code=0, partitions=[
            SimpleNamespace(partition_index=p) for p in range(self.partitions[t])]) for t in topics
            if t in self.partitions])

    async def share_group_offsets(self, group: str, topics: dict[str, list[int]]) -> list[SharePartitionOffset]:
        if self.unsupported:
            raise AdminError("describing", ErrorCode.unsupported_version)
        starts = self.share.get(group, {})
        return [SharePartitionOffset(t, p, starts.get((t, p), -1), 0, -1, self.partition_errors.get((t, p), 0))
                for t, ps in topics.items() for p in ps]

    async def describe_share_group(self, group: str) -> Any:
        if group not in self.share and group not in self.members:
            raise AdminError("describing", ErrorCode.group_id_not_found)
        n = self.members.get(group, 0)
        return SimpleNamespace(group_state="Stable" if n else "Empty", members=[object()] * n)

    async def alter_share_group_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        if self.alter_error is not None:
            raise AdminError("altering", self.alter_error)
        self.alters.append((group, dict(offsets)))
        self.share.setdefault(group, {}).update(offsets)
        return {tp: 0 for tp in offsets}


def test_driver_copies_start_offsets_and_leaves_a_live_group_alone(caplog: pytest.LogCaptureFixture) -> None:
    source = ShareAdmin(share={"jobs": {("orders", 0): 30, ("orders", 1): 7}, "other-sg": {("orders", 0): 3},
                               "dcmirror.east.dr": {("orders", 0): 9}}, partitions={"orders": 2, "payments": 1})
    target = ShareAdmin(ends={ORDERS0: 40, ORDERS1: 40})
    sync = TopicSync(SyncSettings(groups="jobs|dcmirror.*"))
    plans = trio.run(sync.sync_share_offsets, source, target, TOPICS)
    assert target.alters == [("jobs", {ORDERS0: 30, ORDERS1: 7})]  # never the mirror's own, never "other-sg"
    assert [p.group for p in plans] == ["jobs"]
    assert sync.totals["share_offsets_copied"] == 2 and sync.share_offsets["groups_in_sync"] == 1
    # The same again changes nothing.
    trio.run(sync.sync_share_offsets, source, target, TOPICS)
    assert len(target.alters) == 1 and sync.totals["share_offset_rounds"] == 2
    # A member of jobs in the target: nothing written, counted, said once.
    source.share["jobs"][("orders", 0)] = 35
    target.members["jobs"] = 1
    with caplog.at_level(logging.INFO, logger="dcmirror.mirror.topic_sync"):
        for _ in range(3):
            (plan,) = trio.run(sync.sync_share_offsets, source, target, TOPICS)
            assert plan.live
    assert len(target.alters) == 1 and target.share["jobs"][ORDERS0] == 30
    assert sync.share_offsets["live_groups"] == ["jobs"] and sync.totals["share_groups_live"] == 3
    assert [r.getMessage() for r in caplog.records].count(
        "share group jobs has member(s) in the target: its start offsets are not copied while it has "
        "(a share group live in the target is the target's own)") == 1
    text = prometheus_text(sync.prometheus_metrics({"flow": "f", "worker": "w"})).decode()
    assert 'dcmirror_mirror_topic_sync_share_groups_live_total{flow="f",worker="w"} 3' in text
    assert 'dcmirror_mirror_topic_sync_share_offsets_copied_total{flow="f",worker="w"} 2' in text
    # It left: the source's newer start follows.
    target.members["jobs"] = 0
    trio.run(sync.sync_share_offsets, source, target, TOPICS)
    assert target.alters[-1] == ("jobs", {ORDERS0: 35})
    assert sync.status()["share_group_offsets"]["live_groups"] == []


def test_driver_takes_a_member_joining_before_the_alter_as_live_and_a_consumer_group_as_not_ours() -> None:
    source = ShareAdmin(share={"jobs": {("orders", 0): 30}}, partitions={"orders": 1})
    racing = ShareAdmin(ends={ORDERS0: 40}, alter_error=ErrorCode.non_empty_group)
    sync = TopicSync(SyncSettings(groups="jobs"))
    (plan,) = trio.run(sync.sync_share_offsets, source, racing, TOPICS)
    assert plan.live and plan.alter == {} and sync.totals["share_offsets_copied"] == 0
    other = ShareAdmin(ends={ORDERS0: 40}, alter_error=ErrorCode.group_id_not_found)
    (plan,) = trio.run(sync.sync_share_offsets, source, other, TOPICS)
    assert not plan.live and plan.alter == {}
    assert plan.held_back == {ORDERS0: "'jobs' in the target is a consumer group, not a share group"}


def test_driver_shows_source_partition_errors_and_skips_a_cluster_without_share_offsets(
        caplog: pytest.LogCaptureFixture) -> None:
    source = ShareAdmin(share={"jobs": {("orders", 0): 30, ("orders", 1): 4}}, partitions={"orders": 2},
                        partition_errors={("orders", 1): ErrorCode.leader_not_available})
    target = ShareAdmin(ends={ORDERS0: 40, ORDERS1: 40})
    sync = TopicSync(SyncSettings(groups="jobs"))
    trio.run(sync.sync_share_offsets, source, target, TOPICS)
    assert target.alters == [("jobs", {ORDERS0: 30})]
    assert sync.share_offsets["held_back"] == {"jobs east.orders-1": "the source answered LEADER_NOT_AVAILABLE"}
    old = ShareAdmin(share={"jobs": {("orders", 0): 30}}, partitions={"orders": 1}, unsupported=True)
    with caplog.at_level(logging.WARNING, logger="dcmirror.mirror.topic_sync"):
        for _ in range(2):
            assert trio.run(sync.sync_share_offsets, old, target, TOPICS) is None
    assert len(caplog.records) == 1
    assert sync.share_offsets["skipped"] == "the source cluster serves no share-group offsets"
