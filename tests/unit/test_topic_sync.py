"""The planning core of mirror/topic_sync.py (group offsets and ACLs of mirror topics follow
the source) and the topology keys that configure it: plain function calls, no I/O."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from cluster.client.admin import AdminError
from cluster.common.admin_http import prometheus_text
from cluster.protocol.errors import ErrorCode
from cluster.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from mirror.topic_sync import (
    GROUPS_PER_ROUND_MAX,
    NO_GROUP,
    SyncSettings,
    TargetGroup,
    TopicSync,
    exact_filter,
    mirrored_acls,
    plan_acls,
    plan_group_offsets,
    select_groups,
    sync_owner,
)
from topology import TopologyError, loads

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
READ, WRITE, DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
TOPICS = {"orders": "east.orders", "order-events": "east.order-events", "payments": "east.payments"}


def topic_acl(name: str, principal: str, op: AclOperation = READ, perm: AclPermissionType = ALLOW, *,
              prefixed: bool = False, host: str = "*") -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, PatternType.PREFIXED if prefixed else PatternType.LITERAL,
                      principal, host, op, perm)


# ---- group offsets ------------------------------------------------------------------------


def test_select_groups_matches_whole_ids_and_never_the_mirrors_own_groups() -> None:
    listed = ["billing", "billing-v2", "analytics-eu", "analytics", "dcmirror.east.dr", "ops", "billing"]
    assert select_groups(listed, "billing|analytics-.*") == ["analytics-eu", "billing"]
    assert select_groups(listed, ".*") == ["analytics", "analytics-eu", "billing", "billing-v2", "ops"]
    assert select_groups(listed, None) == []
    many = [f"g{i:05d}" for i in range(GROUPS_PER_ROUND_MAX + 5)]
    assert select_groups(many, "g.*") == many[:GROUPS_PER_ROUND_MAX]


def test_offsets_are_copied_one_to_one_for_mirrored_partitions_only() -> None:
    source = {("orders", 0): 30, ("orders", 1): 17, ("payments", 0): 5, ("other", 0): 99}
    ends = {("east.orders", 0): 50, ("east.orders", 1): 17, ("east.payments", 0): 5}
    plan = plan_group_offsets("billing", source, TOPICS, NO_GROUP, {}, ends)
    # renamed through the flow's mapping; "other" is not mirrored; an offset equal to the log
    # end is the next record the mirror will hold: copied
    assert plan.commit == {("east.orders", 0): 30, ("east.orders", 1): 17, ("east.payments", 0): 5}
    assert plan.held_back == {} and plan.unchanged == 0 and not plan.live


def test_an_offset_beyond_the_mirrors_log_end_is_held_back_not_capped() -> None:
    source = {("orders", 0): 51, ("orders", 1): 10, ("orders", 2): 3}
    ends = {("east.orders", 0): 50, ("east.orders", 1): 40}  # partition 2 not created in the target yet
    plan = plan_group_offsets("billing", source, TOPICS, NO_GROUP, {}, ends)
    assert plan.commit == {("east.orders", 1): 10}
    assert set(plan.held_back) == {("east.orders", 0), ("east.orders", 2)}
    assert "51" in plan.held_back[("east.orders", 0)] and "50" in plan.held_back[("east.orders", 0)]
    assert "not in the target" in plan.held_back[("east.orders", 2)]
    # next round the mirror has caught up: it goes
    later = plan_group_offsets("billing", source, TOPICS, NO_GROUP, {("east.orders", 1): 10},
                               {**ends, ("east.orders", 0): 60, ("east.orders", 2): 3})
    assert later.commit == {("east.orders", 0): 51, ("east.orders", 2): 3}
    assert later.unchanged == 1 and later.held_back == {}


def test_offsets_already_in_the_target_are_not_committed_again_and_a_rewind_is_copied() -> None:
    source = {("orders", 0): 30, ("orders", 1): 12}
    target = {("east.orders", 0): 30, ("east.orders", 1): 20}  # the source group was reset to 12
    plan = plan_group_offsets("billing", source, TOPICS, NO_GROUP, target,
                              {("east.orders", 0): 50, ("east.orders", 1): 50})
    assert plan.commit == {("east.orders", 1): 12} and plan.unchanged == 1


@pytest.mark.parametrize("group, live", [
    (TargetGroup("Empty", 0), False), (TargetGroup("Dead", 0), False), (TargetGroup("", 0), False),
    (TargetGroup("Stable", 1), True), (TargetGroup("PreparingRebalance", 0), True),
    (TargetGroup("CompletingRebalance", 2), True), (TargetGroup("Empty", 1), True),
])
def test_a_group_with_members_in_the_target_is_never_written(group: TargetGroup, live: bool) -> None:
    plan = plan_group_offsets("billing", {("orders", 0): 30}, TOPICS, group, {("east.orders", 0): 7},
                              {("east.orders", 0): 50})
    assert plan.live is live
    assert plan.commit == ({} if live else {("east.orders", 0): 30})


def test_the_sync_runs_in_the_holder_of_partition_0_of_the_first_mirrored_topic() -> None:
    assert sync_owner(TOPICS) == ("order-events", 0)
    assert sync_owner({}) is None


# ---- ACLs ------------------------------------------------------------------------------------


def test_source_topic_acls_that_apply_to_a_mirrored_topic_become_literal_acls_on_its_mirror() -> None:
    source = [
        topic_acl("orders", "User:east-app"),                       # literal: that topic
        topic_acl("order", "User:reporter", DESCRIBE, prefixed=True),  # prefix of two mirrored topics
        topic_acl("*", "User:auditor", DESCRIBE),                    # literal wildcard: every topic
        topic_acl("payments", "User:east-app", WRITE, DENY, host="10.0.0.1"),
        topic_acl("other", "User:east-app"),                         # not mirrored
        topic_acl("pay", "User:x", prefixed=True),                   # prefix of payments
        topic_acl("paymentsX", "User:y"),                            # a literal name is not a prefix
        AclBinding(ResourceType.GROUP, "orders", PatternType.LITERAL, "User:east-app", "*", READ, ALLOW),
    ]
    got = mirrored_acls(source, TOPICS, {"User:east-app": "User:app"})
    assert got == frozenset({
        topic_acl("east.orders", "User:app"),
        topic_acl("east.orders", "User:reporter", DESCRIBE),
        topic_acl("east.order-events", "User:reporter", DESCRIBE),
        topic_acl("east.orders", "User:auditor", DESCRIBE),
        topic_acl("east.order-events", "User:auditor", DESCRIBE),
        topic_acl("east.payments", "User:auditor", DESCRIBE),
        topic_acl("east.payments", "User:app", WRITE, DENY, host="10.0.0.1"),
        topic_acl("east.payments", "User:x"),
    })


def test_plan_creates_what_is_missing_and_deletes_only_mirrored_principals_bindings() -> None:
    source = [topic_acl("orders", "User:east-app"), topic_acl("orders", "User:reporter", DESCRIBE)]
    target = [
        topic_acl("east.orders", "User:reporter", DESCRIBE),     # already there: kept, not created again
        topic_acl("east.orders", "User:app", WRITE),             # a mapped principal, no longer at the source
        topic_acl("east.orders", "User:reporter", WRITE),        # a source principal, not at the source
        topic_acl("east.orders", "User:ops", WRITE),             # an operator's principal: never touched
        topic_acl("east.other", "User:app"),                     # not a mirror topic: never touched
        topic_acl("east.ord", "User:app", prefixed=True),        # prefixed in the target: never touched
    ]
    plan = plan_acls(source, target, TOPICS, {"User:east-app": "User:app"})
    assert plan.create == (topic_acl("east.orders", "User:app"),)
    assert set(plan.delete) == {topic_acl("east.orders", "User:app", WRITE),
                                topic_acl("east.orders", "User:reporter", WRITE)}
    assert plan.wanted == frozenset({topic_acl("east.orders", "User:app"),
                                     topic_acl("east.orders", "User:reporter", DESCRIBE)})


def test_a_principals_last_binding_deleted_at_the_source_goes_when_the_mirror_made_it() -> None:
    first = plan_acls([topic_acl("orders", "User:carol")], [], TOPICS, {})
    assert first.create == (topic_acl("east.orders", "User:carol"),)
    after_create = [topic_acl("east.orders", "User:carol")]
    # The source deleted carol's only binding: this worker made it, so it goes ...
    gone = plan_acls([], after_create, TOPICS, {}, managed=first.wanted)
    assert gone.delete == (topic_acl("east.orders", "User:carol"),) and gone.create == ()
    # ... but a worker that never saw it (started after the deletion) cannot tell it from an
    # operator's binding: it stays (the documented limit; a mapped principal has no such gap).
    assert plan_acls([], after_create, TOPICS, {}).delete == ()
    mapped = plan_acls([], [topic_acl("east.orders", "User:app")], TOPICS, {"User:east-app": "User:app"})
    assert mapped.delete == (topic_acl("east.orders", "User:app"),)


def test_a_plan_applied_plans_nothing_more() -> None:
    source = [topic_acl("orders", "User:east-app"), topic_acl("ord", "User:r", DESCRIBE, prefixed=True)]
    target = [topic_acl("east.orders", "User:ops", WRITE), topic_acl("east.orders", "User:app", WRITE)]
    principal_map = {"User:east-app": "User:app"}
    plan = plan_acls(source, target, TOPICS, principal_map)
    applied = (set(target) | set(plan.create)) - set(plan.delete)
    again = plan_acls(source, applied, TOPICS, principal_map, managed=plan.wanted)
    assert again.create == () and again.delete == ()
    assert topic_acl("east.orders", "User:ops", WRITE) in applied


def test_exact_filter_matches_its_binding_only() -> None:
    b = topic_acl("east.orders", "User:app", WRITE, DENY, host="10.0.0.1")
    f = exact_filter(b)
    assert f.matches(b)
    assert not f.matches(topic_acl("east.orders", "User:app", WRITE, ALLOW, host="10.0.0.1"))
    assert not f.matches(topic_acl("east.orders", "User:app", WRITE, DENY))
    assert not f.matches(topic_acl("east.orders", "User:app", WRITE, DENY, host="10.0.0.1", prefixed=True))


# ---- topology keys ---------------------------------------------------------------------------

CLUSTERS = """\
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092"]

[clusters.dr]
datacenter = "dr"
brokers = ["127.0.0.1:29092"]

[[mirrors]]
source = "east"
target = "dr"
topics = "orders|payments"
"""


def _load(extra: str) -> object:
    return loads(CLUSTERS + extra, path=Path("t.toml"), base_dir=Path("/base"))


def test_topology_keys_of_the_sync() -> None:
    topo = _load('mirror_topics = true\nmirror_groups = "billing|analytics-.*"\n'
                 'acl_principal_map = { "User:east-app" = "User:app" }\n'
                 'config = { "group.offset.sync.ms" = 2000, "acl.sync.ms" = 0 }\n')
    (flow,) = topo.mirrors  # type: ignore[attr-defined]
    assert flow.mirror_groups == "billing|analytics-.*"
    assert flow.acl_principal_map == {"User:east-app": "User:app"}
    s = SyncSettings.from_flow(flow)
    assert (s.groups, dict(s.principal_map), s.group_offset_sync_ms, s.acl_sync_ms) == \
        ("billing|analytics-.*", {"User:east-app": "User:app"}, 2000, 0)
    assert dict(SyncSettings.from_flow(flow, reverse=True).principal_map) == {"User:app": "User:east-app"}
    (default,) = _load("mirror_topics = true\n").mirrors  # type: ignore[attr-defined]
    d = SyncSettings.from_flow(default)
    assert (d.groups, dict(d.principal_map), d.group_offset_sync_ms, d.acl_sync_ms) == (None, {}, 10_000, 10_000)


@pytest.mark.parametrize("extra, message", [
    ('mirror_groups = "billing"\n', "mirror_groups applies to a flow of mirror topics"),
    ('acl_principal_map = { "User:a" = "User:b" }\n', "acl_principal_map applies to a flow of mirror topics"),
    ('mirror_topics = true\ngroups = "billing"\n', "name the groups whose committed offsets follow with mirror_groups"),
    ('mirror_topics = true\nmirror_groups = "billing("\n', "invalid regex"),
    ('mirror_topics = true\nacl_principal_map = { "east-app" = "User:app" }\n', "is not a principal"),
    ('mirror_topics = true\nacl_principal_map = { "User:a" = 3 }\n', "is not a principal"),
    ('mirror_topics = true\nconfig = { "group.offset.sync.ms" = "soon" }\n', "takes a whole number"),
])
def test_topology_refuses_bad_sync_keys(extra: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message.replace("(", r"\(")):
        _load(extra)


# ---- the driver over fake Admins (the I/O glue: errors, the race, logging once) -------------


class FakeAdmin:
    """The Admin calls TopicSync makes, answered from plain dicts."""

    def __init__(self, *, groups: dict[str, dict[tuple[str, int], int]] | None = None,
                 described: dict[str, TargetGroup] | None = None, ends: dict[tuple[str, int], int] | None = None,
                 acls: list[AclBinding] | None = None, acl_error: int | None = None,
                 commit_error: int | None = None) -> None:
        self.groups = groups or {}
        self.described = described or {}
        self.ends = ends or {}
        self.acls = list(acls or [])
        self.acl_error = acl_error
        self.commit_error = commit_error
        self.commits: list[tuple[str, dict[tuple[str, int], int]]] = []

    async def group_ids(self) -> list[str]:
        return sorted(self.groups)

    async def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return dict(self.groups.get(group, {}))

    async def metadata(self, topics: list[str]) -> Any:
        return SimpleNamespace(topics=[SimpleNamespace(name=t, error_code=0, partitions=[
            SimpleNamespace(partition_index=p) for (n, p) in self.ends if n == t]) for t in topics])

    async def list_offsets(self, partitions: list[tuple[str, int]], timestamp: int) -> dict[tuple[str, int], int]:
        return {tp: self.ends[tp] for tp in partitions}

    async def describe_groups(self, groups: list[str]) -> list[Any]:
        g = self.described.get(groups[0], NO_GROUP)
        return [SimpleNamespace(error_code=0, group_state=g.state, members=[object()] * g.members)]

    async def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        if self.commit_error is not None:
            raise AdminError("committing", self.commit_error)
        self.commits.append((group, dict(offsets)))
        self.groups.setdefault(group, {}).update(offsets)

    async def describe_acls(self, f: Any) -> list[AclBinding]:
        if self.acl_error is not None:
            raise AdminError("describing ACLs", self.acl_error)
        return list(self.acls)

    async def create_acls(self, bindings: list[AclBinding]) -> None:
        self.acls += bindings

    async def delete_acls(self, filters: list[Any]) -> list[AclBinding]:
        gone = [b for b in self.acls if any(f.matches(b) for f in filters)]
        self.acls = [b for b in self.acls if b not in gone]
        return gone


def test_driver_copies_offsets_and_takes_a_commit_refused_for_members_as_a_live_group() -> None:
    source = FakeAdmin(groups={"billing": {("orders", 0): 30, ("other", 0): 4}, "dcmirror.east.dr": {("orders", 0): 9}})
    target = FakeAdmin(ends={("east.orders", 0): 40})
    sync = TopicSync(SyncSettings(groups=".*"))
    plans = trio.run(sync.sync_group_offsets, source, target, TOPICS)
    assert target.commits == [("billing", {("east.orders", 0): 30})]
    assert [p.group for p in plans] == ["billing"]
    assert sync.totals["offsets_copied"] == 1 and sync.offsets["groups_in_sync"] == 1
    # A member joined in the target between the describe and the commit.
    source.groups["billing"][("orders", 0)] = 35
    racing = FakeAdmin(ends={("east.orders", 0): 40}, commit_error=ErrorCode.unknown_member_id)
    (plan,) = trio.run(sync.sync_group_offsets, source, racing, TOPICS)
    assert plan.live and sync.offsets["live_groups"] == ["billing"] and sync.totals["offsets_copied"] == 1


def test_driver_skips_acls_without_an_authorizer_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    source = FakeAdmin(acl_error=ErrorCode.security_disabled)
    target = FakeAdmin()
    sync = TopicSync(SyncSettings())
    with caplog.at_level(logging.WARNING, logger="dcmirror.mirror.topic_sync"):
        for _ in range(3):
            assert trio.run(sync.sync_acls, source, target, TOPICS) is None
    (record,) = caplog.records
    assert record.getMessage().startswith("ACLs of mirror topics are not followed: the source cluster has no authorizer")
    assert sync.acls["skipped"] == "the source cluster has no authorizer"


def test_driver_applies_the_acl_plan_and_counts_it() -> None:
    source = FakeAdmin(acls=[topic_acl("orders", "User:east-app")])
    target = FakeAdmin(acls=[topic_acl("east.orders", "User:ops", WRITE)])
    sync = TopicSync(SyncSettings(principal_map={"User:east-app": "User:app"}))
    trio.run(sync.sync_acls, source, target, TOPICS)
    assert set(target.acls) == {topic_acl("east.orders", "User:ops", WRITE), topic_acl("east.orders", "User:app")}
    source.acls = []
    trio.run(sync.sync_acls, source, target, TOPICS)
    assert target.acls == [topic_acl("east.orders", "User:ops", WRITE)]
    assert (sync.totals["acls_created"], sync.totals["acls_deleted"], sync.totals["acl_rounds"]) == (1, 1, 2)
    text = prometheus_text(sync.prometheus_metrics({"flow": "f", "worker": "w"})).decode()
    assert 'dcmirror_mirror_topic_sync_acls_total{flow="f",worker="w",change="created"} 1' in text
    assert 'dcmirror_mirror_topic_sync_acls_total{flow="f",worker="w",change="deleted"} 1' in text


def test_the_loop_runs_a_round_only_in_the_holder_of_the_owner_partition() -> None:
    source = FakeAdmin(acls=[topic_acl("orders", "User:a")])
    target = FakeAdmin()
    held: set[tuple[str, int]] = set()

    async def main() -> None:
        sync = TopicSync(SyncSettings(acl_sync_ms=1000))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sync.run, source, target, lambda: TOPICS, held.__contains__)
            await trio.sleep(3.5)
            assert sync.totals["acl_rounds"] == 0 and not sync.runs_here and target.acls == []
            held.add(("order-events", 0))
            await trio.sleep(2)
            assert sync.totals["acl_rounds"] == 2 and sync.runs_here
            assert target.acls == [topic_acl("east.orders", "User:a")]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
