"""KIP-848 consumer groups against real broker processes with real clients.

librdkafka consumers with `group.protocol=consumer` (tests/interop/group_member.py with
GROUP_PROTOCOL=consumer) split partitions through ConsumerGroupHeartbeat; the Admin APIs
of librdkafka (ConsumerGroupDescribe, ListGroups v5) and kafka-python (DescribeGroups) see
the group; error answers go over a raw socket with kio; the fault test SIGKILLs a member
and the group's coordinator broker while records flow, and checks every record was
processed and committed exactly once.
"""

from __future__ import annotations

import datetime
import io
import signal
import struct
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from kio.serial import entity_reader, entity_writer

from tests.cluster_helpers import log_tails
from tests.fault_workload import fault_rng
from tests.interop.test_groups import (
    LiveProducer,
    RawClient,
    ck_committed,
    create_topic,
    end_offsets,
    final_assignment_ok,
    parse_member,
    produce,
    raw_describe,
    raw_join,
    spawn_member,
    stop_members,
    wait_until,
)
from tests.interop.test_groups_cli import ok

SESSION_MS = 6000
KIP848 = {"group.consumer.session.timeout.ms": SESSION_MS, "group.consumer.heartbeat.interval.ms": 500,
          "group.initial.rebalance.delay.ms": 300}
CONSUMER_ENV = {"GROUP_PROTOCOL": "consumer"}


def call_flexible(raw: RawClient, request: Any, response_cls: type) -> Any:
    """Request header v2 / response header v1 (the flexible APIs' headers)."""
    raw.correlation_id += 1
    body = io.BytesIO()
    entity_writer(type(request))(body, request)
    header = struct.pack(">hhih", int(request.__api_key__), int(request.__version__), raw.correlation_id,
                         len(raw.client_id)) + raw.client_id + b"\x00"
    frame = header + body.getvalue()
    raw.sock.sendall(struct.pack(">i", len(frame)) + frame)
    (size,) = struct.unpack(">i", raw._recv(4))
    data = raw._recv(size)
    (correlation_id,) = struct.unpack_from(">i", data, 0)
    assert correlation_id == raw.correlation_id and data[4] == 0
    value, used = entity_reader(response_cls)(data[5:], 0)
    assert used == size - 5, f"{response_cls.__name__}: {size - 5 - used} trailing bytes"
    return value


def heartbeat(raw: RawClient, group: str, member_id: str, epoch: int, *, topics: tuple[str, ...] | None = None,
              owned: tuple[Any, ...] | None = None, assignor: str | None = None, join: bool = False) -> Any:
    from kio.schema.consumer_group_heartbeat.v1 import request as hreq
    from kio.schema.consumer_group_heartbeat.v1 import response as hresp

    req = hreq.ConsumerGroupHeartbeatRequest(
        group_id=group, member_id=member_id, member_epoch=epoch,
        rebalance_timeout=datetime.timedelta(milliseconds=30_000 if join else -1),  # type: ignore[arg-type]
        subscribed_topic_names=topics, server_assignor=assignor,
        topic_partitions=() if join else owned)
    return call_flexible(raw, req, hresp.ConsumerGroupHeartbeatResponse)


def describe848(raw: RawClient, groups: list[str]) -> Any:
    from kio.schema.consumer_group_describe.v1 import request as dreq
    from kio.schema.consumer_group_describe.v1 import response as dresp

    return call_flexible(raw, dreq.ConsumerGroupDescribeRequest(group_ids=tuple(groups),
                                                                include_authorized_operations=True),
                         dresp.ConsumerGroupDescribeResponse)


def owned_of(response: Any) -> tuple[Any, ...]:
    from kio.schema.consumer_group_heartbeat.v1 import request as hreq

    return tuple(hreq.TopicPartitions(topic_id=tp.topic_id, partitions=tp.partitions)
                 for tp in response.assignment.topic_partitions)


def all_committed(members: list[Any], ends: dict[int, int]) -> bool:
    """Every partition's last successful commit, whoever made it, is at its end."""
    last: dict[int, int] = {}
    for m in members:
        for p, o in parse_member(m.snapshot()).last_commit.items():
            last[p] = max(last.get(p, 0), o)
    return all(last.get(p, 0) == end for p, end in ends.items())


def log_contents(bootstrap: str, topic: str, partitions: int) -> set[tuple[int, int]]:
    """Every (partition, offset) the topic holds, read with assign() up to the high
    watermarks: the ground truth once brokers were killed under a producer (a retried
    produce may have been written twice; each copy must be consumed)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kip848-reader", "enable.auto.commit": False})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while any(sum(1 for q, _ in seen if q == p) < ends[p] for p in ends) and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                assert not m.error(), m.error()
                seen.add((m.partition(), m.offset()))
    finally:
        c.close()
    assert all(sum(1 for q, _ in seen if q == p) == ends[p] for p in ends), "the log could not be read back"
    return seen


def partitions_of(response: Any) -> list[int]:
    return sorted(p for tp in response.assignment.topic_partitions for p in tp.partitions)


def test_raw_protocol_range_assignor_and_error_answers(broker_factory: Any) -> None:
    b = broker_factory(**KIP848)
    create_topic(b.bootstrap, "ranged", 4)
    raw = RawClient(b.bootstrap)
    try:
        first = heartbeat(raw, "r", "m-1", 0, topics=("ranged",), assignor="range", join=True)
        assert first.error_code == 0 and partitions_of(first) == [0, 1, 2, 3]
        assert first.heartbeat_interval == datetime.timedelta(milliseconds=500)
        second = heartbeat(raw, "r", "m-2", 0, topics=("ranged",), assignor="range", join=True)
        assert second.error_code == 0 and partitions_of(second) == []  # m-1 has not released any yet
        # m-1 must revoke its upper half (range: m-1 gets 0-1, m-2 gets 2-3) and stays at its epoch.
        told = heartbeat(raw, "r", "m-1", first.member_epoch, owned=owned_of(first))
        assert partitions_of(told) == [0, 1] and told.member_epoch == first.member_epoch
        released = heartbeat(raw, "r", "m-1", told.member_epoch, owned=owned_of(told))
        assert released.member_epoch > first.member_epoch and released.assignment is None  # nothing changed
        got = heartbeat(raw, "r", "m-2", second.member_epoch, owned=())
        assert partitions_of(got) == [2, 3] and got.member_epoch == released.member_epoch

        group = describe848(raw, ["r"]).groups[0]
        assert (group.error_code, group.group_state, group.assignor_name) == (0, "Stable", "range")
        assert {m.member_id: sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions)
                for m in group.members} == {"m-1": [0, 1], "m-2": [2, 3]}
        assert all(tp.topic_name == "ranged" for m in group.members for tp in m.assignment.topic_partitions)
        assert group.authorized_operations > 0

        # Error answers, as Kafka gives them.
        assert heartbeat(raw, "r", "m-1", released.member_epoch + 5, owned=()).error_code == 110  # FENCED_MEMBER_EPOCH
        assert heartbeat(raw, "r", "ghost", 3, owned=()).error_code == 25  # UNKNOWN_MEMBER_ID
        assert heartbeat(raw, "r", "m-3", 0, topics=("ranged",), assignor="sticky",
                         join=True).error_code == 112  # UNSUPPORTED_ASSIGNOR
        assert heartbeat(raw, "", "m-3", 0, topics=("ranged",), join=True).error_code == 42  # INVALID_REQUEST
        join = raw_join(raw, "r", "")
        assert join.error_code == 69, join  # a consumer group is not joined with JoinGroup
        classic = raw_join(raw, "classic-g", "")
        assert classic.error_code in (0, 79)  # MEMBER_ID_REQUIRED on v4+
        joined = raw_join(raw, "classic-g", classic.member_id)
        assert joined.error_code == 0
        refused = heartbeat(raw, "classic-g", "m-9", 0, topics=("ranged",), join=True)
        assert refused.error_code == 69 and "not a consumer group" in refused.error_message
        missing = describe848(raw, ["classic-g", "nope"]).groups
        assert [g.error_code for g in missing] == [69, 69]

        # DescribeGroups (kafka-python, older tools) sees the group in the classic shape.
        classic_view = raw_describe(raw, ["r"]).groups[0]
        assert (classic_view.group_state, classic_view.protocol_type, len(classic_view.members)) == (
            "Stable", "consumer", 2)

        for member, epoch in (("m-1", released.member_epoch), ("m-2", got.member_epoch)):
            left = heartbeat(raw, "r", member, -1)
            assert (left.error_code, left.member_epoch) == (0, -1), (member, epoch)
        assert describe848(raw, ["r"]).groups[0].group_state == "Empty"
    finally:
        raw.close()


def test_librdkafka_members_split_partitions_and_admin_apis_see_them(broker_factory: Any, tmp_path: Path) -> None:
    from confluent_kafka import ConsumerGroupState, ConsumerGroupType
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    b = broker_factory(**KIP848)
    topic, group = "split848", "split848-group"
    create_topic(b.bootstrap, topic, 6)
    members = [spawn_member(b.bootstrap, topic, group, f"m{i}", tmp_path / f"m{i}.stderr", **CONSUMER_ENV)
               for i in range(3)]
    try:
        took = wait_until(lambda: final_assignment_ok([m.latest_assignment() for m in members], 6, 2), 60,
                          "3 KIP-848 members with 2 partitions each")
        print(f"3 members settled in {took:.1f}s")
        delivered = produce(b.bootstrap, topic, 1200, 6, "rec")
        ends = end_offsets(delivered, 6)
        wait_until(lambda: all_committed(members, ends), 60, "all committed")
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        desc = admin.describe_consumer_groups([group], request_timeout=15)[group].result()
        assert desc.type == ConsumerGroupType.CONSUMER and desc.state == ConsumerGroupState.STABLE
        assert sorted(sorted(tp.partition for tp in m.assignment.topic_partitions) for m in desc.members) == \
            sorted(m.latest_assignment() or [] for m in members)
        assert sorted(m.client_id for m in desc.members) == ["m0", "m1", "m2"]
        final = [m.latest_assignment() or [] for m in members]
        # The project's CLI shows the KIP-848 view: epochs, the assignor, each member's
        # epoch and its current and target partitions (the same once the group is stable).
        head, *lines = ok(b, "describe", group).splitlines()
        epoch = int(head.split("group epoch ")[1].split(",")[0])
        assert head == (f"group {group}: state Stable, 3 member(s), consumer protocol "
                        f"(group epoch {epoch}, assignment epoch {epoch}, assignor uniform)"), head
        assert lines[0].split() == ["CONSUMER-ID", "HOST", "CLIENT-ID", "INSTANCE-ID", "EPOCH", "ASSIGNMENT",
                                    "TARGET-ASSIGNMENT"]
        shown = [line.split() for line in lines[1:4]]
        assert [(row[2], row[3], row[4]) for row in shown] == [(f"m{i}", "-", str(epoch)) for i in range(3)]
        assert [(row[5], row[6]) for row in shown] == [
            (f"{topic}:{','.join(map(str, p))}",) * 2 for p in final], shown
        assert sorted(row[0] for row in shown) == sorted(m.member_id for m in desc.members)
        assert lines[4].split()[:2] == ["TOPIC", "PARTITION"] and len(lines) == 4 + 1 + 6
        listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}, request_timeout=15).result()
        assert [g.group_id for g in listed.valid] == [group]
        assert listed.valid[0].type == ConsumerGroupType.CONSUMER
        assert admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}, request_timeout=15).result().valid == []
        kp = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=15000)
        try:
            kp_desc = kp.describe_groups([group])[group]
        finally:
            kp.close()
        assert (kp_desc["group_state"], kp_desc["protocol_type"], kp_desc["error"]) == ("Stable", "consumer", None)
        assert sorted(sorted(p for t in m["member_assignment"]["assigned_partitions"] for p in t["partitions"])
                      for m in kp_desc["members"]) == sorted(m.latest_assignment() or [] for m in members)
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.proc.send_signal(signal.SIGTERM)
        for m in members:
            m.proc.wait(timeout=30)
            if m.reader is not None:
                m.reader.join(timeout=10)
    logs = [parse_member(m.snapshot()) for m in members]
    consumed = Counter(po for log in logs for po in log.consumed)
    assert consumed == Counter(set(delivered)), "not every record exactly once"
    # Each member read exactly the records of its two partitions: 400, in offset order.
    for m, log, mine in zip(members, logs, final, strict=True):
        assert sorted(log.consumed) == sorted(po for po in delivered if po[0] in mine) and len(log.consumed) == 400
        for p in mine:
            assert [o for q, o in log.consumed if q == p] == list(range(200)), (m.name, p)
    assert all(m.snapshot()[-1] == "CLOSED" for m in members)
    assert ck_committed(b.bootstrap, group, topic, 6) == ends
    raw = RawClient(b.bootstrap)
    try:
        assert describe848(raw, [group]).groups[0].group_state == "Empty"  # each left with epoch -1
    finally:
        raw.close()


@pytest.mark.slow
def test_kip848_group_survives_member_and_coordinator_kill9(cluster_factory: Any, tmp_path: Path) -> None:
    """3 brokers; 3 librdkafka members (group.protocol=consumer) consume 6 partitions while a
    producer writes. A seeded SIGKILL of a member, then of the group's coordinator broker
    (restarted after). Every record is processed and committed exactly once: the only
    records delivered twice are ones whose first delivery was never committed (the killed
    member's last batch, or a commit refused while the coordinator moved)."""
    from confluent_kafka.admin import AdminClient

    rng = fault_rng("kip848 member and coordinator kill9")  # fixed in make test; DCMIRROR_FAULT_SEED replays
    cluster = cluster_factory(3, **KIP848, **{"offsets.topic.replication.factor": 3,
                                             "offsets.topic.num.partitions": 6})
    topic, group = "kill848", "kill848-group"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "socket.timeout.ms": 10000})
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, 6, 3)])[topic].result(30)
    delivered = produce(cluster.bootstrap, topic, 600, 6, "pre")
    producing = LiveProducer(cluster.bootstrap, topic, 6, delivered)

    def describe() -> Any:
        """A new Admin client each time: librdkafka's keeps the coordinator it found first and
        does not look again on a NOT_COORDINATOR answer to ConsumerGroupDescribe."""
        from confluent_kafka import KafkaException

        for _ in range(60):
            try:
                fresh = AdminClient({"bootstrap.servers": cluster.bootstrap, "socket.timeout.ms": 10000})
                return fresh.describe_consumer_groups([group], request_timeout=15)[group].result()
            except KafkaException as exc:
                print(f"describe: {exc}")
                time.sleep(0.5)
        raise AssertionError("the group could not be described for 30 s")

    members = [spawn_member(cluster.bootstrap, topic, group, f"m{i}", tmp_path / f"m{i}.stderr", process_ms=200,
                            **CONSUMER_ENV) for i in range(3)]
    victim_index = rng.randrange(3)
    victim = members[victim_index]
    survivors = [m for m in members if m is not victim]
    try:
        wait_until(lambda: final_assignment_ok([m.latest_assignment() for m in members], 6, 2), 60,
                   "3 members with 2 partitions each")
        producing.start()
        wait_until(lambda: sum(line.startswith("COMMIT ") for line in victim.snapshot()) >= 3, 30, "victim commits")
        time.sleep(rng.uniform(0.0, 0.5))
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        took = wait_until(lambda: final_assignment_ok([m.latest_assignment() for m in survivors], 6, 3),
                          SESSION_MS / 1000 + 30, "survivors owning all 6 partitions")
        print(f"victim={victim.name}: survivors own everything {took:.1f}s after the kill")

        before = describe()
        coordinator = before.coordinator.id
        commits_before = [sum(line.startswith("COMMIT ") for line in m.snapshot()) for m in survivors]
        time.sleep(rng.uniform(0.0, 1.0))
        cluster[coordinator].kill9()
        print(f"coordinator broker {coordinator} killed")
        # The group goes on at the new coordinator: both survivors commit again.
        wait_until(lambda: all(sum(line.startswith("COMMIT ") for line in m.snapshot()) > n + 3
                               for m, n in zip(survivors, commits_before, strict=True)), 90,
                   "survivors committing at the new coordinator")
        cluster[coordinator].start()
        time.sleep(2.0)
        errors = producing.stop()
        assert not errors, errors[:5]
        in_log = log_contents(cluster.bootstrap, topic, 6)
        assert set(delivered) <= in_log, "an acknowledged record is not in the log"
        ends = end_offsets(dict.fromkeys(in_log, b""), 6)
        wait_until(lambda: all_committed(members, ends), 120, "every partition committed to its end")
        after = describe()
        # The new coordinator replayed the group: the same members went on, none was fenced.
        assert sorted(m.member_id for m in after.members) == sorted(m.member_id for m in before.members)
        assert not [line for m in survivors for line in m.snapshot() if line.startswith("LOST")]
    except BaseException:
        print(log_tails(cluster))
        raise
    finally:
        producing.stop()
        stop_members(members, tmp_path)

    logs = {m.name: parse_member(m.snapshot()) for m in members}
    counts = Counter(po for log in logs.values() for po in log.consumed)
    assert set(counts) == in_log, (f"missing {sorted(in_log - set(counts))[:10]}, "
                                   f"not in the log {sorted(set(counts) - in_log)[:10]}")
    committed_deliveries: Counter[tuple[int, int]] = Counter()
    uncommitted: dict[tuple[int, int], list[str]] = defaultdict(list)
    for name, log in logs.items():
        for po, covered in zip(log.consumed, log.covered, strict=True):
            if covered:
                committed_deliveries[po] += 1
            else:
                uncommitted[po].append(name)
    twice = sorted(po for po, c in committed_deliveries.items() if c > 1)
    assert not twice, f"records processed and committed twice: {twice[:10]}"
    dups = sorted(po for po, c in counts.items() if c > 1)
    unexplained = [po for po in dups if not uncommitted.get(po)]
    assert not unexplained, unexplained[:10]
    failed = {name: log.failed_commits[:3] for name, log in logs.items() if log.failed_commits}
    print(f"records={len(in_log)} (acknowledged {len(delivered)}) delivered twice={len(dups)} (first delivery never committed), "
          f"failed commits={failed}")
    assert ck_committed(cluster.bootstrap, group, topic, 6) == ends
    for m in survivors:
        assert m.proc.returncode == 0 and m.snapshot()[-1] == "CLOSED", (m.name, m.snapshot()[-5:])
