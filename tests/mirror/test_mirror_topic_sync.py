"""What the source says about a mirrored topic follows the mirror topic within 30 s
(issue 31): its partition count and topic configs (Kafka's names minus
mirror/mirror_topics.py CONFIG_EXCLUDES, every topic.refresh.ms), the committed offsets of
the flow's `mirror_groups` (mirror/topic_sync.py), copied 1:1 only while the group has no
members in the target and never beyond what the mirror holds, and the topic's ACLs with the
flow's principal mapping.

Real processes: a 1-broker source and a 1-broker target, one worker process of a flow with
mirror_topics = true; librdkafka consumers commit on the source and resume on the target,
librdkafka's admin client writes and reads the ACLs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourcePatternType,
    ResourceType,
)

from mirror.mirror_topics import CONFIG_EXCLUDES, MIRROR_SOURCE_CONFIG
from tests.cluster_helpers import admin
from tests.mirror.lab import (
    Flow,
    MirrorLab,
    add_partitions,
    end_offsets,
    new_topic,
    partition_count,
    read_topic,
    topic_config,
    wait_for,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.heavy]

FLOW = "east-to-dr"
SYNC_BOUND_S = 30.0  # what the issue promises


@dataclass
class SyncFlow(Flow):
    """A flow of mirror topics with the sync's keys."""

    mirror_groups: str | None = None
    acl_principal_map: dict[str, str] = field(default_factory=dict)

    def toml(self) -> list[str]:
        lines = super().toml()[:-1]
        if self.mirror_groups is not None:
            lines.append(f"mirror_groups = {json.dumps(self.mirror_groups)}")
        if self.acl_principal_map:
            lines.append("acl_principal_map = { " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}"
                                                             for k, v in self.acl_principal_map.items()) + " }")
        return lines + [""]


def sync_status(lab: MirrorLab) -> dict[str, Any]:
    (status,) = lab.worker_status(FLOW).values()
    return dict(status["topic_sync"])


def produce(bootstrap: str, topic: str, partition: int, first: int, n: int) -> None:
    """Records valued p<partition>-<offset> (the partition is new or holds `first` records)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 2})
    for i in range(first, first + n):
        p.produce(topic, value=f"p{partition}-{i}".encode(), partition=partition)
    assert p.flush(60) == 0


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch only: the asking consumer never joins)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 2})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
    finally:
        c.close()


def commit(consumer: Consumer, topic: str, offsets: dict[int, int]) -> None:
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)


def joined(bootstrap: str, group: str, topic: str) -> tuple[Consumer, list[Message]]:
    """A member of `group` subscribed to `topic`, assigned, committing only when told; and the
    records it read while it waited for its assignment."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 10000, "log_level": 2})
    c.subscribe([topic])
    read: list[Message] = []
    deadline = time.monotonic() + 60
    while not c.assignment():
        assert time.monotonic() < deadline, f"no assignment in group {group}"
        m = c.poll(0.2)
        if m is not None and not m.error():
            read.append(m)
    return c, read


def rounds_after(lab: MirrorLab, after: int) -> Callable[[], dict[str, Any] | None]:
    """A predicate: the sync status once two offset rounds ended after round `after` (the
    second one began after everything before the call)."""
    def check() -> dict[str, Any] | None:
        s = sync_status(lab)
        return s if s["totals"]["offset_rounds"] >= after + 2 else None
    return check


def test_group_offsets_follow_into_the_mirror_topic_only_while_the_group_is_idle_there(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_lab({"east": 1, "dr": 1}, **{"group.initial.rebalance.delay.ms": 0})
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    new_topic(east, "orders", 2)
    for p in range(2):
        produce(east, "orders", p, 0, 200)
    lab.write_topology([SyncFlow("east", "dr", "orders", rename="{topic}", mirror_topics=True,
                                 mirror_groups="billing|analytics-.*",
                                 config={"topic.refresh.ms": "1000", "group.offset.sync.ms": "2000"})])
    lab.start_worker(FLOW, 0)
    wait_for(lambda: end_offsets(dr, "orders") == {0: 200, 1: 200}, 60, "the mirror caught up",
             interval_s=0.2, on_timeout=lab.mirror_log_tail)

    # A member of billing on the source commits; the mirror topic gets the same offsets.
    source_member, _ = joined(east, "billing", "orders")
    commit(source_member, "orders", {0: 120, 1: 45})
    # A group the flow does not name is not copied.
    other = Consumer({"bootstrap.servers": east, "group.id": "ledger", "log_level": 2})
    commit(other, "orders", {0: 7})
    other.close()
    started = time.monotonic()
    wait_for(lambda: committed(dr, "billing", "orders", 2) == {0: 120, 1: 45}, SYNC_BOUND_S,
             "billing's offsets in dr", on_timeout=lab.mirror_log_tail)
    print(f"billing's offsets followed in {time.monotonic() - started:.1f} s")
    assert committed(dr, "ledger", "orders", 2) == {}

    # A consumer of billing on the target resumes exactly there and reads what follows.
    target_member, read = joined(dr, "billing", "orders")
    first: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    deadline = time.monotonic() + 60
    while min(len(v) for v in first.values()) < 5:
        assert time.monotonic() < deadline, f"read on dr: {first}"
        m = read.pop(0) if read else target_member.poll(0.5)
        if m is None or m.error():
            continue
        first[m.partition()].append((m.offset(), m.value()))
    for p, start in ((0, 120), (1, 45)):
        assert first[p][:5] == [(o, f"p{p}-{o}".encode()) for o in range(start, start + 5)], first[p]

    # While billing has a member in dr, the source's newer commits are not copied.
    before = sync_status(lab)["totals"]["offset_rounds"]
    commit(source_member, "orders", {0: 150, 1: 60})
    status = wait_for(rounds_after(lab, before), SYNC_BOUND_S, "two offset rounds after the commit",
                      on_timeout=lab.mirror_log_tail)
    assert status["group_offsets"]["live_groups"] == ["billing"], status
    assert status["runs_here"] and status["owner_partition"] == "orders-0"
    assert committed(dr, "billing", "orders", 2) == {0: 120, 1: 45}

    # Once it left (Empty in dr), they follow.
    target_member.close()
    wait_for(lambda: committed(dr, "billing", "orders", 2) == {0: 150, 1: 60}, SYNC_BOUND_S,
             "billing's newer offsets in dr after its dr member left", on_timeout=lab.mirror_log_tail)

    # An offset beyond what the mirror holds waits for the mirror.
    before = sync_status(lab)["totals"]["offset_rounds"]
    commit(source_member, "orders", {0: 300, 1: 60})
    status = wait_for(rounds_after(lab, before), SYNC_BOUND_S, "two offset rounds after the commit beyond the end")
    assert status["group_offsets"]["held_back"] == {
        "billing orders-0": "committed 300 at the source, the mirror holds offsets below 200 only"}, status
    assert committed(dr, "billing", "orders", 2) == {0: 150, 1: 60}
    produce(east, "orders", 0, 200, 150)
    wait_for(lambda: committed(dr, "billing", "orders", 2) == {0: 300, 1: 60}, SYNC_BOUND_S,
             "billing's offset 300 once the mirror holds it", on_timeout=lab.mirror_log_tail)
    assert end_offsets(dr, "orders")[0] >= 300
    source_member.close()

    # (the status file is written every second: it may not show the last round yet)
    status = wait_for(lambda: (s := sync_status(lab))["totals"]["offsets_copied"] >= 5 and s, 10, "the status")
    assert status["totals"]["offsets_copied"] == 2 + 2 + 1, status
    assert status["totals"]["groups_committed"] == 3, status
    # Neither cluster has an authorizer: the ACL sync said so once and does nothing.
    assert status["acls"]["skipped"] == "the source cluster has no authorizer", status
    assert lab.mirror_log().count("ACLs of mirror topics are not followed") == 1


def _acls(bootstrap: str) -> set[tuple[str, str, str, str, str, str]]:
    """Every TOPIC binding: (name, pattern type, principal, host, operation, permission)."""
    client = AdminClient({"bootstrap.servers": bootstrap})
    found = client.describe_acls(AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, None, None,
                                                  AclOperation.ANY, AclPermissionType.ANY)).result(30)
    return {(b.name, b.resource_pattern_type.name, b.principal, b.host, b.operation.name, b.permission_type.name)
            for b in found}


def _binding(name: str, principal: str, op: str, perm: str = "ALLOW", *, pattern: str = "LITERAL",
             host: str = "*") -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, ResourcePatternType[pattern], principal, host, AclOperation[op],
                      AclPermissionType[perm])


def test_topic_acls_follow_with_the_principal_mapping_and_an_operators_stay(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    # An authorizer on both sides; the lab's plaintext clients (ANONYMOUS) are super users.
    lab = mirror_lab({"east": 1, "dr": 1}, **{"authorizer.class.name": "StandardAuthorizer",
                                              "super.users": "User:ANONYMOUS"})
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    for topic in ("orders", "order-audit", "other"):
        new_topic(east, topic, 1)
    source, target = AdminClient({"bootstrap.servers": east}), AdminClient({"bootstrap.servers": dr})
    for f in source.create_acls([
            _binding("orders", "User:east-app", "READ"),
            _binding("order", "User:reporter", "DESCRIBE", pattern="PREFIXED"),  # both mirrored topics
            _binding("other", "User:east-app", "WRITE")]).values():            # not mirrored
        f.result(30)
    # An operator's binding in the target for a principal the source does not name.
    for f in target.create_acls([_binding("east.orders", "User:ops", "WRITE")]).values():
        f.result(30)
    lab.write_topology([SyncFlow("east", "dr", "orders|order-audit", mirror_topics=True,
                                 acl_principal_map={"User:east-app": "User:app"},
                                 config={"topic.refresh.ms": "1000"})])  # acl.sync.ms: the default 10 s
    lab.start_worker(FLOW, 0)

    operator = ("east.orders", "LITERAL", "User:ops", "*", "WRITE", "ALLOW")
    expected = {
        ("east.orders", "LITERAL", "User:app", "*", "READ", "ALLOW"),
        ("east.orders", "LITERAL", "User:reporter", "*", "DESCRIBE", "ALLOW"),
        ("east.order-audit", "LITERAL", "User:reporter", "*", "DESCRIBE", "ALLOW"),
        operator,
    }
    # The worker's start (group join, topic creation) comes on top of the 30 s.
    wait_for(lambda: _acls(dr) == expected, SYNC_BOUND_S + 30, "the source's ACLs on the mirror topics",
             interval_s=0.5, on_timeout=lab.mirror_log_tail)

    # A binding deleted at the source goes; a new one (a DENY from one host) comes, mapped.
    for f in source.delete_acls([AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL,
                                                  "User:east-app", "*", AclOperation.READ,
                                                  AclPermissionType.ALLOW)]).values():
        assert len(f.result(30)) == 1
    for f in source.create_acls([_binding("orders", "User:east-app", "WRITE", "DENY", host="10.0.0.7")]).values():
        f.result(30)
    started = time.monotonic()
    expected = {
        ("east.orders", "LITERAL", "User:app", "10.0.0.7", "WRITE", "DENY"),
        ("east.orders", "LITERAL", "User:reporter", "*", "DESCRIBE", "ALLOW"),
        ("east.order-audit", "LITERAL", "User:reporter", "*", "DESCRIBE", "ALLOW"),
        operator,
    }
    wait_for(lambda: _acls(dr) == expected, SYNC_BOUND_S, "the source's deletion and creation in dr",
             interval_s=0.5, on_timeout=lab.mirror_log_tail)
    print(f"ACL changes followed in {time.monotonic() - started:.1f} s")
    # The source's own bindings are as they were (nothing is written back).
    assert ("other", "LITERAL", "User:east-app", "*", "WRITE", "ALLOW") in _acls(east)

    status = wait_for(lambda: (s := sync_status(lab))["totals"]["acls_deleted"] == 1 and s, 10, "the status")
    assert status["totals"]["acls_created"] == 4, status
    assert status["acls"]["skipped"] == "" and status["runs_here"], status


def _overrides(bootstrap: str, topic: str) -> dict[str, str | None]:
    """The topic's own configs: DescribeConfigs entries whose source is DYNAMIC_TOPIC_CONFIG."""
    return {name: e.value for name, e in topic_config(bootstrap, topic).items()
            if ConfigSource(getattr(e.source, "value", e.source)) is ConfigSource.DYNAMIC_TOPIC_CONFIG}


def _alter(bootstrap: str, topic: str, set_: dict[str, str], delete: tuple[str, ...] = ()) -> None:
    """IncrementalAlterConfigs of a topic: `set_` set, `delete` back to the default."""
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in set_.items()] + \
        [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    client = admin(bootstrap)  # kept alive until the answer (a dropped client fails its futures)
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_partitions_and_topic_configs_follow_the_mirror_topic_within_30_s(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_lab({"east": 1, "dr": 1})
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    new_topic(east, "orders", 2, config={"retention.ms": "604800000", "cleanup.policy": "delete",
                                         "segment.bytes": "8388608"})
    for p in range(2):
        produce(east, "orders", p, 0, 100)
    # topic.refresh.ms is the flow's default (5 s): the 30 s must hold with it.
    lab.write_topology([Flow("east", "dr", "orders", rename="{topic}", mirror_topics=True)])
    lab.start_worker(FLOW, 0)
    wait_for(lambda: end_offsets(dr, "orders") == {0: 100, 1: 100}, 60, "the mirror caught up",
             interval_s=0.2, on_timeout=lab.mirror_log_tail)
    marker = {MIRROR_SOURCE_CONFIG: "east:orders"}
    assert _overrides(dr, "orders") == {**_overrides(east, "orders"), **marker}
    # An excluded config is the target's own: an operator's value on the mirror topic stays.
    _alter(dr, "orders", {"min.insync.replicas": "1"})

    # The source changes: two partitions more; a config changed, one set, one set that is
    # excluded, one override deleted.
    excluded = "message.timestamp.before.max.ms"
    assert excluded in CONFIG_EXCLUDES and "min.insync.replicas" in CONFIG_EXCLUDES
    partitions_at = time.monotonic()
    add_partitions(east, "orders", 4)
    configs_at = time.monotonic()
    _alter(east, "orders", {"retention.ms": "86400000", "max.message.bytes": "2097152", excluded: "3600000"},
           delete=("segment.bytes",))
    source = _overrides(east, "orders")
    assert source == {"retention.ms": "86400000", "cleanup.policy": "delete", "max.message.bytes": "2097152",
                      excluded: "3600000"}, source
    want = {**{k: v for k, v in source.items() if k not in CONFIG_EXCLUDES}, **marker, "min.insync.replicas": "1"}

    # Polled until the target says the same; the ceiling is the 30 s from the first change.
    delays: dict[str, float] = {}
    last: dict[str, Any] = {}

    def followed() -> bool:
        now = time.monotonic()
        count, target = partition_count(dr, "orders"), _overrides(dr, "orders")
        last.update(partitions=count, overrides=target)
        checks = {"partitions": (count == 4, partitions_at),
                  "retention.ms": (target.get("retention.ms") == "86400000", configs_at),
                  "max.message.bytes": (target.get("max.message.bytes") == "2097152", configs_at),
                  "segment.bytes deleted": ("segment.bytes" not in target, configs_at),
                  "every override": (target == want, configs_at)}
        for what, (ok, since) in checks.items():
            if ok and what not in delays:
                delays[what] = now - since
        return len(delays) == len(checks)

    wait_for(followed, partitions_at + SYNC_BOUND_S - time.monotonic(),
             "dr's orders with the source's partition count and configs", interval_s=0.25,
             on_timeout=lambda: f"followed: {delays}; dr: {last}; want {want}\n{lab.mirror_log_tail()}")
    print("followed the source in " + ", ".join(f"{what} {s:.1f} s" for what, s in delays.items()))
    target = topic_config(dr, "orders")
    assert target[excluded].value != "3600000", f"{excluded} is excluded, yet followed: {target[excluded]}"
    assert target["min.insync.replicas"].value == "1"
    assert target["segment.bytes"].value == topic_config(east, "orders")["segment.bytes"].value  # the default

    # Records in the new partitions (and the old) land at the source's offsets.
    for p, first in ((0, 100), (1, 100), (2, 0), (3, 0)):
        produce(east, "orders", p, first, 50)
    produced_at = time.monotonic()
    ends = end_offsets(east, "orders")
    assert ends == {0: 150, 1: 150, 2: 50, 3: 50}, ends
    wait_for(lambda: end_offsets(dr, "orders") == ends, 60, f"dr's orders at the source's ends {ends}",
             interval_s=0.25, on_timeout=lab.mirror_log_tail)
    print(f"records in the new partitions mirrored {time.monotonic() - produced_at:.1f} s after they were written")
    copy = read_topic(dr, "orders")
    assert copy == read_topic(east, "orders")
    for p in (2, 3):
        assert [(r.offset, r.value) for r in copy[p]] == [(o, f"p{p}-{o}".encode()) for o in range(50)], copy[p][:3]
