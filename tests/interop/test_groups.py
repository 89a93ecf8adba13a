"""Classic consumer groups against a real broker process with real clients.

confluent-kafka (librdkafka), kafka-python and aiokafka consumers join groups, share
partitions, commit and resume; member failures are real SIGKILLs of child processes
(tests/interop/group_member.py); malformed/edge requests go over a raw socket built with
kio. Every wait is bounded; every check is exact.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kio.serial import entity_reader, entity_writer

from tests.fault_workload import fault_rng
from tests.harness import REPO, BrokerProcess

DELAY_MS = 300  # group.initial.rebalance.delay.ms for every broker here
SESSION_MS = 6000
HEARTBEAT_MS = 500
GROUP_OVERRIDES = {"group.initial.rebalance.delay.ms": DELAY_MS}
MEMBER_SCRIPT = REPO / "tests" / "interop" / "group_member.py"


# ---------------------------------------------------------------------------- helpers


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Wait for pred(); return the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic() - start
        time.sleep(poll_s)
    if pred():
        return time.monotonic() - start
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture
def gbroker(broker_factory: Any) -> BrokerProcess:
    return broker_factory(**GROUP_OVERRIDES)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                  operation_timeout=10, request_timeout=15)
    futures[topic].result(timeout=20)

    def ready() -> bool:
        t = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        return t is not None and t.error is None and len(t.partitions) == partitions and all(
            p.leader >= 0 for p in t.partitions.values())

    wait_until(ready, 15, f"topic {topic} with {partitions} partitions")


def ck_producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": False, "socket.timeout.ms": 10000})


def produce(bootstrap: str, topic: str, n: int, partitions: int, tag: str) -> dict[tuple[int, int], bytes]:
    """n records, record i to partition i % partitions; returns (partition, offset) -> value."""
    producer = ck_producer(bootstrap)
    delivered: dict[tuple[int, int], bytes] = {}
    errors: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered[(msg.partition(), msg.offset())] = msg.value()

    for i in range(n):
        producer.produce(topic, value=f"{tag}-{i}".encode(), key=str(i).encode(), partition=i % partitions,
                         on_delivery=report)
        if i % 500 == 499:
            producer.poll(0)
    assert producer.flush(60) == 0, "produce did not complete"
    assert not errors, errors[:5]
    assert len(delivered) == n
    return delivered


def ck_consumer_conf(bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "fetch.wait.max.ms": 100,
        "socket.timeout.ms": 10000,
    }
    conf.update(extra)
    return conf


def ck_committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """Committed offsets as confluent-kafka's committed() sees them (-1001 = none)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(ck_consumer_conf(bootstrap, group))
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
    finally:
        c.close()
    assert all(tp.error is None for tp in tps), [tp.error for tp in tps]
    return {tp.partition: tp.offset for tp in tps}


def end_offsets(delivered: dict[tuple[int, int], bytes], partitions: int) -> dict[int, int]:
    ends = dict.fromkeys(range(partitions), 0)
    for p, o in delivered:
        ends[p] = max(ends[p], o + 1)
    return ends


def final_assignment_ok(latest: list[list[int] | None], partitions: int, per_member: int) -> bool:
    if any(a is None for a in latest):
        return False
    flat = [p for a in latest if a is not None for p in a]
    return sorted(flat) == list(range(partitions)) and all(a is not None and len(a) == per_member for a in latest)


# ---------------------------------------------------------------- confluent-kafka in threads


@dataclass
class CkMember:
    name: str
    assigns: list[list[int]] = field(default_factory=list)
    revokes: list[list[int]] = field(default_factory=list)
    got: list[tuple[int, int, bytes]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    commit_failures: list[str] = field(default_factory=list)
    closed: bool = False


class CkGroup:
    """n confluent-kafka consumers in one group, one thread each.

    Until `release()`, every assignment is paused at once, so nothing is consumed before
    the group has settled; afterwards each consumer processes batches and commits them
    synchronously (explicit offsets, last + 1 per partition).
    """

    def __init__(self, bootstrap: str, topic: str, group: str, n: int, **extra: Any) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.conf_extra = extra
        self.members = [CkMember(f"{group}-c{i}") for i in range(n)]
        self.lock = threading.Lock()
        self.go = threading.Event()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(m,), daemon=True) for m in self.members]

    def start(self) -> CkGroup:
        for t in self.threads:
            t.start()
        return self

    def _run(self, m: CkMember) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        c = Consumer(ck_consumer_conf(self.bootstrap, self.group, **{"client.id": m.name, **self.conf_extra}))

        def on_assign(consumer: Any, parts: list[Any]) -> None:
            consumer.assign(parts)
            if not self.go.is_set():
                consumer.pause(parts)
            with self.lock:
                m.assigns.append(sorted(p.partition for p in parts))

        def on_revoke(consumer: Any, parts: list[Any]) -> None:
            with self.lock:
                m.revokes.append(sorted(p.partition for p in parts))

        try:
            c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
            resumed = False
            while not self.stop.is_set():
                if self.go.is_set() and not resumed:
                    assignment = c.assignment()
                    if assignment:
                        c.resume(assignment)
                    resumed = True
                msgs = c.consume(500, 0.1)
                last: dict[int, int] = {}
                for msg in msgs:
                    if msg.error():
                        with self.lock:
                            m.errors.append(str(msg.error()))
                        continue
                    with self.lock:
                        m.got.append((msg.partition(), msg.offset(), msg.value()))
                    last[msg.partition()] = msg.offset()
                if last:
                    offsets = [TopicPartition(self.topic, p, o + 1) for p, o in sorted(last.items())]
                    try:
                        result = c.commit(offsets=offsets, asynchronous=False)
                        bad = [f"{tp.partition}:{tp.error}" for tp in result or [] if tp.error is not None]
                    except KafkaException as exc:
                        bad = [str(exc)]
                    if bad:
                        with self.lock:
                            m.commit_failures.extend(bad)
        except Exception as exc:  # surfaced by the assertions in the test thread
            with self.lock:
                m.errors.append(f"thread died: {exc!r}")
        finally:
            c.close()
            m.closed = True

    def latest_assignments(self) -> list[list[int] | None]:
        with self.lock:
            return [m.assigns[-1] if m.assigns else None for m in self.members]

    def wait_settled(self, partitions: int, per_member: int, timeout_s: float = 60) -> float:
        return wait_until(lambda: final_assignment_ok(self.latest_assignments(), partitions, per_member),
                          timeout_s, f"{self.group}: {len(self.members)} members with {per_member} partitions each "
                          f"(latest {self.latest_assignments()})")

    def release(self) -> None:
        self.go.set()

    def consumed(self) -> int:
        with self.lock:
            return sum(len(m.got) for m in self.members)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        assert all(not t.is_alive() for t in self.threads), "a consumer thread did not finish"

    def assert_clean(self) -> None:
        for m in self.members:
            assert m.errors == [], (m.name, m.errors[:5])
            assert m.commit_failures == [], (m.name, m.commit_failures[:5])


def assert_exactly_once(got: list[tuple[int, int, bytes]], delivered: dict[tuple[int, int], bytes]) -> None:
    counts = Counter((p, o) for p, o, _ in got)
    dups = sorted(k for k, v in counts.items() if v > 1)
    assert not dups, f"{len(dups)} record(s) consumed more than once, e.g. {dups[:10]}"
    missing = sorted(set(delivered) - set(counts))
    extra = sorted(set(counts) - set(delivered))
    assert not missing and not extra, f"missing {missing[:10]} ({len(missing)}), unexpected {extra[:10]}"
    assert len(got) == len(delivered)
    wrong = [(p, o) for p, o, v in got if delivered[(p, o)] != v]
    assert not wrong, f"values differ at {wrong[:10]}"


# ---------------------------------------------------------------------------- raw protocol


class RawClient:
    """Request header v1 / response header v0 over a plain socket, bodies via kio."""

    def __init__(self, bootstrap: str, client_id: str = "raw-groups") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.client_id = client_id.encode()
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    def call(self, request: Any, response_cls: type) -> Any:
        self.correlation_id += 1
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        header = struct.pack(">hhih", int(request.__api_key__), int(request.__version__), self.correlation_id,
                             len(self.client_id)) + self.client_id
        frame = header + body.getvalue()
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", self._recv(4))
        data = self._recv(size)
        (correlation_id,) = struct.unpack_from(">i", data, 0)
        assert correlation_id == self.correlation_id
        value, used = entity_reader(response_cls)(data[4:], 0)
        assert used == size - 4, f"{response_cls.__name__}: {size - 4 - used} trailing bytes"
        return value


def raw_join(raw: RawClient, group: str, member_id: str, session_ms: int = SESSION_MS,
             instance: str | None = None) -> Any:
    import datetime

    from kio.schema.join_group.v5 import request as jreq
    from kio.schema.join_group.v5 import response as jresp
    from kio.static.primitive import i32Timedelta

    req = jreq.JoinGroupRequest(
        group_id=group,
        session_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=session_ms)),
        rebalance_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=10_000)),
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocols=(jreq.JoinGroupRequestProtocol(name="range", metadata=b"raw-metadata"),),
    )
    return raw.call(req, jresp.JoinGroupResponse)


def raw_sync(raw: RawClient, group: str, member_id: str, generation: int,
             assignments: dict[str, bytes] | None = None) -> Any:
    from kio.schema.sync_group.v3 import request as sreq
    from kio.schema.sync_group.v3 import response as sresp
    from kio.static.primitive import i32

    req = sreq.SyncGroupRequest(
        group_id=group, generation_id=i32(generation), member_id=member_id, group_instance_id=None,
        assignments=tuple(sreq.SyncGroupRequestAssignment(member_id=m, assignment=a)
                          for m, a in (assignments or {}).items()),
    )
    return raw.call(req, sresp.SyncGroupResponse)


def raw_heartbeat(raw: RawClient, group: str, member_id: str, generation: int) -> int:
    from kio.schema.heartbeat.v3 import request as hreq
    from kio.schema.heartbeat.v3 import response as hresp
    from kio.static.primitive import i32

    req = hreq.HeartbeatRequest(group_id=group, generation_id=i32(generation), member_id=member_id,
                                group_instance_id=None)
    return int(raw.call(req, hresp.HeartbeatResponse).error_code)


def raw_commit(raw: RawClient, group: str, member_id: str, generation: int,
               offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    from kio.schema.offset_commit.v7 import request as creq
    from kio.schema.offset_commit.v7 import response as cresp
    from kio.static.primitive import i32, i64

    by_topic: dict[str, list[Any]] = defaultdict(list)
    for (t, p), o in offsets.items():
        by_topic[t].append(creq.OffsetCommitRequestPartition(
            partition_index=i32(p), committed_offset=i64(o), committed_leader_epoch=i32(-1),
            committed_metadata="raw"))
    req = creq.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=i32(generation), member_id=member_id,
        group_instance_id=None,
        topics=tuple(creq.OffsetCommitRequestTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
    )
    resp = raw.call(req, cresp.OffsetCommitResponse)
    return {(t.name, int(p.partition_index)): int(p.error_code) for t in resp.topics for p in t.partitions}


def raw_offset_fetch(raw: RawClient, group: str, wanted: dict[str, list[int]] | None) -> Any:
    """wanted None: every committed offset of the group."""
    from kio.schema.offset_fetch.v5 import request as freq
    from kio.schema.offset_fetch.v5 import response as fresp
    from kio.static.primitive import i32

    topics = None if wanted is None else tuple(
        freq.OffsetFetchRequestTopic(name=t, partition_indexes=tuple(i32(p) for p in ps)) for t, ps in wanted.items()
    )
    return raw.call(freq.OffsetFetchRequest(group_id=group, topics=topics), fresp.OffsetFetchResponse)


def raw_list_groups(raw: RawClient) -> dict[str, str]:
    from kio.schema.list_groups.v2 import request as lreq
    from kio.schema.list_groups.v2 import response as lresp

    resp = raw.call(lreq.ListGroupsRequest(), lresp.ListGroupsResponse)
    assert int(resp.error_code) == 0
    return {g.group_id: g.protocol_type for g in resp.groups}


def raw_find_coordinator(raw: RawClient, group: str) -> Any:
    from kio.schema.find_coordinator.v2 import request as creq
    from kio.schema.find_coordinator.v2 import response as cresp
    from kio.static.primitive import i8

    return raw.call(creq.FindCoordinatorRequest(key=group, key_type=i8(0)), cresp.FindCoordinatorResponse)


def raw_delete_groups(raw: RawClient, groups: list[str]) -> dict[str, int]:
    from kio.schema.delete_groups.v1 import request as dreq
    from kio.schema.delete_groups.v1 import response as dresp

    resp = raw.call(dreq.DeleteGroupsRequest(groups_names=tuple(groups)), dresp.DeleteGroupsResponse)
    return {r.group_id: int(r.error_code) for r in resp.results}


def raw_describe(raw: RawClient, groups: list[str]) -> Any:
    from kio.schema.describe_groups.v4 import request as dreq
    from kio.schema.describe_groups.v4 import response as dresp

    return raw.call(dreq.DescribeGroupsRequest(groups=tuple(groups), include_authorized_operations=False),
                    dresp.DescribeGroupsResponse)


def raw_leave(raw: RawClient, group: str, members: list[tuple[str, str | None]]) -> Any:
    from kio.schema.leave_group.v3 import request as lreq
    from kio.schema.leave_group.v3 import response as lresp

    req = lreq.LeaveGroupRequest(group_id=group, members=tuple(
        lreq.MemberIdentity(member_id=m, group_instance_id=i) for m, i in members))
    return raw.call(req, lresp.LeaveGroupResponse)


# ============================================================================ tests


def test_queue_semantics_confluent_kafka(gbroker: BrokerProcess) -> None:
    """6 partitions, 3 consumers in one group: 2 partitions each, every record exactly once."""
    topic, group, n = "queue", "queue-group", 3000
    create_topic(gbroker.bootstrap, topic, 6)
    delivered = produce(gbroker.bootstrap, topic, n, 6, "q")
    g = CkGroup(gbroker.bootstrap, topic, group, 3).start()
    try:
        g.wait_settled(6, 2)
        g.release()
        wait_until(lambda: g.consumed() >= n, 60, f"{n} records consumed (have {g.consumed()})")
        time.sleep(1.0)  # anything delivered twice would show up now
    finally:
        g.finish()
    g.assert_clean()
    all_got = [r for m in g.members for r in m.got]
    assert_exactly_once(all_got, delivered)
    # Each consumer got exactly the records of its own two partitions.
    for m in g.members:
        assert len(m.assigns[-1]) == 2
        assert {p for p, _, _ in m.got} == set(m.assigns[-1]), (m.name, m.assigns)
    assert ck_committed(gbroker.bootstrap, group, topic, 6) == end_offsets(delivered, 6)


def test_publish_subscribe_two_groups(gbroker: BrokerProcess) -> None:
    """Two groups on one topic, consuming at the same time: each receives every record once."""
    topic, n = "pubsub", 1200
    create_topic(gbroker.bootstrap, topic, 6)
    delivered = produce(gbroker.bootstrap, topic, n, 6, "ps")
    groups = [CkGroup(gbroker.bootstrap, topic, name, 2).start() for name in ("subscriber-a", "subscriber-b")]
    try:
        for g in groups:
            g.wait_settled(6, 3)
        for g in groups:
            g.release()
        for g in groups:
            wait_until(lambda g=g: g.consumed() >= n, 60, f"{g.group}: {n} records (have {g.consumed()})")
        time.sleep(1.0)
    finally:
        for g in groups:
            g.finish()
    for g in groups:
        g.assert_clean()
        assert_exactly_once([r for m in g.members for r in m.got], delivered)
        assert ck_committed(gbroker.bootstrap, g.group, topic, 6) == end_offsets(delivered, 6)


# ---------------------------------------------------------------- member failure (SIGKILL)


@dataclass
class MemberProc:
    name: str
    proc: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    reader: threading.Thread | None = None

    def start_reader(self) -> None:
        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append((time.time(), line.rstrip("\n")))

        self.reader = threading.Thread(target=pump, daemon=True)
        self.reader.start()

    def snapshot(self) -> list[str]:
        return [line for _, line in list(self.lines)]

    def latest_assignment(self) -> list[int] | None:
        for line in reversed(self.snapshot()):
            if line.startswith("ASSIGN "):
                parts = line.split(" ", 2)[2]
                return sorted(int(p) for p in parts.split(",") if p)
        return None


def spawn_member(bootstrap: str, topic: str, group: str, name: str, stderr_path: Path,
                 process_ms: int = 0, **env_extra: str) -> MemberProc:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **env_extra)
    args = [bootstrap, topic, group, name, str(SESSION_MS), str(process_ms)]
    with open(stderr_path, "ab") as err:
        proc = subprocess.Popen([sys.executable, str(MEMBER_SCRIPT), *args],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO, env=env)
    m = MemberProc(name, proc)
    m.start_reader()
    return m


class LiveProducer:
    """A librdkafka producer thread writing `live-<i>` round robin over the partitions
    every 10 ms from start() to stop(); what it delivered goes into `delivered`."""

    def __init__(self, bootstrap: str, topic: str, partitions: int,
                 delivered: dict[tuple[int, int], bytes]) -> None:
        self.bootstrap, self.topic, self.partitions, self.delivered = bootstrap, topic, partitions, delivered
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered[(msg.partition(), msg.offset())] = msg.value()

    def _run(self) -> None:
        producer = ck_producer(self.bootstrap)
        i = 0
        while not self._stop.is_set():
            producer.produce(self.topic, value=f"live-{i}".encode(), partition=i % self.partitions,
                             on_delivery=self._report)
            producer.poll(0)
            i += 1
            time.sleep(0.01)
        if producer.flush(60):
            self.errors.append("flush timed out")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[str]:
        """Stop and flush (60 s); the delivery errors, a thread still running among them.
        Idempotent, and raises nothing (it also runs in `finally`)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=90)
            if self._thread.is_alive() and "the producer thread did not finish" not in self.errors:
                self.errors.append("the producer thread did not finish")
        return self.errors


def stop_members(members: list[MemberProc], logs_dir: Path) -> None:
    """SIGTERM the live members (close: they leave the group), kill any that hang, and keep
    each one's output in `logs_dir`."""
    for m in members:
        if m.proc.poll() is None:
            m.proc.send_signal(signal.SIGTERM)
    for m in members:
        try:
            m.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            m.proc.kill()
            m.proc.wait()
        if m.reader is not None:
            m.reader.join(timeout=10)
        (logs_dir / f"{m.name}.out").write_text("".join(f"{t:.3f} {line}\n" for t, line in m.lines))
    print(f"member logs in {logs_dir}")


@dataclass
class MemberLog:
    consumed: list[tuple[int, int]]  # every consumption, in order
    covered: list[bool]  # per consumption: a successful commit past it followed, before any revoke
    last_commit: dict[int, int]  # partition -> next offset of its last successful commit
    failed_commits: list[str]


def parse_member(lines: list[str]) -> MemberLog:
    consumed: list[tuple[int, int]] = []
    covered: list[bool] = []
    pending: dict[int, list[int]] = defaultdict(list)  # partition -> indexes not yet committed
    last_commit: dict[int, int] = {}
    failed: list[str] = []
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "MSG":
            p, o = (int(x) for x in rest.split())
            pending[p].append(len(consumed))
            consumed.append((p, o))
            covered.append(False)
        elif kind == "COMMIT":
            for item in rest.split():
                p, o = (int(x) for x in item.split(":"))
                last_commit[p] = max(last_commit.get(p, 0), o)
                for i in pending.pop(p, []):
                    covered[i] = consumed[i][1] < o
        elif kind == "COMMITFAIL":
            failed.append(rest)
        elif kind == "REVOKE":
            pending.clear()  # whatever was not committed by now stays uncommitted
    return MemberLog(consumed, covered, last_commit, failed)


@pytest.mark.slow
def test_member_killed_partitions_move_to_survivors(gbroker: BrokerProcess, tmp_path: Path) -> None:
    """3 member processes; SIGKILL one (no LeaveGroup) while producing continuously.

    Within session timeout + one rebalance the two survivors own all 6 partitions; at the
    end every produced record was consumed at least once and the only duplicates are the
    killed member's records after its last successful commit.
    """
    rng = fault_rng("interop member killed, partitions move to survivors")
    topic, group = "failover", "failover-group"
    bootstrap = gbroker.bootstrap
    create_topic(bootstrap, topic, 6)
    delivered = produce(bootstrap, topic, 600, 6, "pre")

    producing = LiveProducer(bootstrap, topic, 6, delivered)

    # Each batch takes 300 ms to "process" before its commit, so the kill usually lands
    # inside an uncommitted window.
    members = [spawn_member(bootstrap, topic, group, f"member-{i}", tmp_path / f"member-{i}.stderr",
                            process_ms=300) for i in range(3)]
    try:
        wait_until(lambda: final_assignment_ok([m.latest_assignment() for m in members], 6, 2), 60,
                   "3 members with 2 partitions each")
        producing.start()
        victim_index = rng.randrange(3)
        victim = members[victim_index]
        survivors = [m for m in members if m is not victim]
        # The victim has consumed and committed something, and is still consuming.
        wait_until(lambda: sum(line.startswith("COMMIT ") for line in victim.snapshot()) >= 3, 30,
                   "victim commits")
        time.sleep(rng.uniform(0.0, 0.5))
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        killed_at = time.time()
        took = wait_until(lambda: final_assignment_ok([m.latest_assignment() for m in survivors], 6, 3),
                          SESSION_MS / 1000 + 20, "survivors owning all 6 partitions")
        print(f"victim={victim.name} survivors took over after {took:.1f}s")
        assert took <= SESSION_MS / 1000 + 15
        # Not before the session timed out: the coordinator had no other way to know.
        first_takeover = min(t for m in survivors for t, line in list(m.lines)
                             if line.startswith("ASSIGN ") and t > killed_at)
        assert first_takeover - killed_at >= SESSION_MS / 1000 - 1.5, first_takeover - killed_at
        time.sleep(2.0)
        produce_errors = producing.stop()
        assert not produce_errors, produce_errors[:5]
        ends = end_offsets(delivered, 6)

        def all_consumed() -> bool:
            seen = {(p, o) for m in members for p, o in parse_member(m.snapshot()).consumed}
            return seen >= set(delivered)

        wait_until(all_consumed, 60, "every produced record consumed")
        wait_until(lambda: all(parse_member(m.snapshot()).last_commit.get(p, 0) == ends[p]
                               for m in survivors for p in m.latest_assignment() or []),
                   30, "survivors committed up to the end")
        time.sleep(1.0)
    finally:
        producing.stop()
        stop_members(members, tmp_path)

    for m in survivors:
        assert m.proc.returncode == 0 and m.snapshot()[-1] == "CLOSED", (m.name, m.snapshot()[-5:])
        assert not any(line.startswith("ERROR") for line in m.snapshot()), m.name
    logs = {m.name: parse_member(m.snapshot()) for m in members}
    counts = Counter(po for log in logs.values() for po in log.consumed)
    assert set(counts) == set(delivered), (
        f"missing {sorted(set(delivered) - set(counts))[:10]}, unexpected {sorted(set(counts) - set(delivered))[:10]}")
    dups = {po for po, c in counts.items() if c > 1}
    # Re-delivery only ever follows an uncommitted delivery: of all deliveries of a record,
    # at most one was followed by a successful commit of its consumer.
    covered_count: Counter[tuple[int, int]] = Counter()
    uncovered_by: dict[tuple[int, int], set[str]] = defaultdict(set)
    for name, log in logs.items():
        for po, cov in zip(log.consumed, log.covered, strict=True):
            if cov:
                covered_count[po] += 1
            else:
                uncovered_by[po].add(name)
    redelivered_committed = sorted(po for po, c in covered_count.items() if c > 1)
    assert not redelivered_committed, f"committed records delivered again: {redelivered_committed[:10]}"

    vlog = logs[victim.name]
    window = {(p, o) for p, o in vlog.consumed if o >= vlog.last_commit.get(p, 0)}
    survivor_failures = [f for m in survivors for f in logs[m.name].failed_commits]
    print(f"records={len(delivered)} duplicates={len(dups)} victim uncommitted window={len(window)} "
          f"survivor commit failures={survivor_failures[:5]}")
    assert ck_committed(bootstrap, group, topic, 6) == ends
    # What the killed member consumed but never committed went to a survivor again. (Only
    # if it died between a commit's response and printing COMMIT can the first few offsets
    # of the window have been committed for real; those form a run from its last commit.)
    for p in range(6):
        not_again = sorted(o for q, o in window - dups if q == p)
        start = vlog.last_commit.get(p, 0)
        assert not_again == list(range(start, start + len(not_again))), (p, start, not_again[:10])
    outside = sorted(dups - window)
    assert not outside, (
        f"{len(outside)} duplicate(s) outside the killed member's uncommitted window, e.g. {outside[:10]}; "
        f"survivors' failed commits: {survivor_failures[:10]}")


# ---------------------------------------------------------------- offsets survive kill -9


def test_committed_offsets_survive_broker_kill9(broker_factory: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    b = broker_factory(**GROUP_OVERRIDES)
    topic, group, parts = "durable-offsets", "durable-group", 3
    create_topic(b.bootstrap, topic, parts)
    delivered = produce(b.bootstrap, topic, 300, parts, "d")
    committed = {0: 17, 1: 42, 2: 99}

    c1 = Consumer(ck_consumer_conf(b.bootstrap, group))
    assigned: list[list[int]] = []
    c1.subscribe([topic], on_assign=lambda c, ps: assigned.append(sorted(p.partition for p in ps)))
    try:
        got = 0
        deadline = time.monotonic() + 60
        while got < 300 and time.monotonic() < deadline:
            got += sum(1 for m in c1.consume(500, 0.2) if not m.error())
        assert got == 300 and assigned[-1] == [0, 1, 2]
        # A group member's commit (member id + generation), with metadata.
        result = c1.commit(offsets=[TopicPartition(topic, p, o, metadata=f"meta-{p}") for p, o in committed.items()],
                           asynchronous=False)
        assert all(tp.error is None for tp in result)
        check = c1.committed([TopicPartition(topic, p) for p in range(parts)], timeout=15)
        assert {tp.partition: tp.offset for tp in check} == committed
    finally:
        c1.close()

    b.kill9()
    b.start()
    assert ck_committed(b.bootstrap, group, topic, parts) == committed

    c2 = Consumer(ck_consumer_conf(b.bootstrap, group))
    first: dict[int, int] = {}
    seen: list[tuple[int, int]] = []
    c2.subscribe([topic])
    try:
        expected = sum(300 // parts - committed[p] for p in range(parts))
        deadline = time.monotonic() + 60
        while len(seen) < expected and time.monotonic() < deadline:
            for m in c2.consume(500, 0.2):
                assert not m.error(), m.error()
                first.setdefault(m.partition(), m.offset())
                seen.append((m.partition(), m.offset()))
        time.sleep(0.5)
        seen += [(m.partition(), m.offset()) for m in c2.consume(500, 0.5) if not m.error()]
        meta = c2.committed([TopicPartition(topic, p) for p in range(parts)], timeout=15)
    finally:
        c2.close()
    assert first == committed
    assert sorted(seen) == sorted((p, o) for p, o in delivered if o >= committed[p])
    assert {tp.partition: tp.metadata for tp in meta} == {p: f"meta-{p}" for p in range(parts)}
    assert "loaded 1 group(s) from __consumer_offsets" in b.log_text()


# ---------------------------------------------------------------- other clients


def test_kafka_python_group_commits_visible_to_confluent(gbroker: BrokerProcess) -> None:
    from kafka import KafkaConsumer

    topic, group, n = "kp-group-topic", "kp-group", 900
    create_topic(gbroker.bootstrap, topic, 6)
    delivered = produce(gbroker.bootstrap, topic, n, 6, "kp")
    consumer = KafkaConsumer(
        bootstrap_servers=gbroker.bootstrap, group_id=group, enable_auto_commit=False,
        auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
        request_timeout_ms=15000, fetch_max_wait_ms=100, client_id="kp-member",
    )
    got: list[tuple[int, int, bytes]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                got += [(tp.partition, m.offset, m.value) for m in msgs]
            if got:
                consumer.commit()
        assert {tp.partition for tp in consumer.assignment()} == set(range(6))
        consumer.commit()
    finally:
        consumer.close()
    assert_exactly_once(got, delivered)
    assert ck_committed(gbroker.bootstrap, group, topic, 6) == end_offsets(delivered, 6)


def test_aiokafka_group_commits_visible_to_confluent(gbroker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer

    topic, group, n = "aio-group-topic", "aio-group", 900
    create_topic(gbroker.bootstrap, topic, 6)
    delivered = produce(gbroker.bootstrap, topic, n, 6, "aio")

    async def consume() -> tuple[list[tuple[int, int, bytes]], set[int]]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=gbroker.bootstrap, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
            request_timeout_ms=15000, fetch_max_wait_ms=100, client_id="aio-member",
        )
        await asyncio.wait_for(consumer.start(), 30)
        got: list[tuple[int, int, bytes]] = []
        try:
            deadline = time.monotonic() + 60
            while len(got) < n and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for tp, msgs in batches.items():
                    got += [(tp.partition, m.offset, m.value) for m in msgs]
                if batches:
                    await consumer.commit()
            await consumer.commit()
            return got, {tp.partition for tp in consumer.assignment()}
        finally:
            await consumer.stop()

    got, assignment = asyncio.run(consume())
    assert assignment == set(range(6))
    assert_exactly_once(got, delivered)
    assert ck_committed(gbroker.bootstrap, group, topic, 6) == end_offsets(delivered, 6)


def test_mixed_group_confluent_and_kafka_python_range(gbroker: BrokerProcess) -> None:
    """One librdkafka and one kafka-python member, both `range`: 3 + 3 partitions, all records once."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.structs import OffsetAndMetadata

    topic, group, n = "mixed", "mixed-group", 1200
    create_topic(gbroker.bootstrap, topic, 6)
    lock = threading.Lock()
    stop = threading.Event()
    assigns: dict[str, list[list[int]]] = {"ck": [], "kp": []}
    got: dict[str, list[tuple[int, int, bytes]]] = {"ck": [], "kp": []}
    problems: list[str] = []

    def run_ck() -> None:
        c = Consumer(ck_consumer_conf(gbroker.bootstrap, group, **{"partition.assignment.strategy": "range",
                                                                    "client.id": "mixed-ck"}))

        def on_assign(consumer: Any, parts: list[Any]) -> None:
            with lock:
                assigns["ck"].append(sorted(p.partition for p in parts))

        try:
            c.subscribe([topic], on_assign=on_assign)
            while not stop.is_set():
                last: dict[int, int] = {}
                for m in c.consume(500, 0.1):
                    if m.error():
                        problems.append(f"ck: {m.error()}")
                        continue
                    with lock:
                        got["ck"].append((m.partition(), m.offset(), m.value()))
                    last[m.partition()] = m.offset()
                if last:
                    try:
                        c.commit(offsets=[TopicPartition(topic, p, o + 1) for p, o in last.items()],
                                 asynchronous=False)
                    except KafkaException as exc:
                        problems.append(f"ck commit: {exc}")
        except Exception as exc:
            problems.append(f"ck thread: {exc!r}")
        finally:
            c.close()

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            with lock:
                assigns["kp"].append(sorted(tp.partition for tp in assigned))

    def run_kp() -> None:
        c = KafkaConsumer(
            bootstrap_servers=gbroker.bootstrap, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
            request_timeout_ms=15000, fetch_max_wait_ms=100, client_id="mixed-kp",
            partition_assignment_strategy=[RangePartitionAssignor],
        )
        try:
            c.subscribe([topic], listener=Listener())
            while not stop.is_set():
                batches = c.poll(timeout_ms=100)
                offsets = {}
                for tp, msgs in batches.items():
                    with lock:
                        got["kp"] += [(tp.partition, m.offset, m.value) for m in msgs]
                    offsets[KpTopicPartition(topic, tp.partition)] = OffsetAndMetadata(msgs[-1].offset + 1, "", -1)
                if offsets:
                    c.commit(offsets)
        except Exception as exc:
            problems.append(f"kp thread: {exc!r}")
        finally:
            c.close()

    threads = [threading.Thread(target=run_ck, daemon=True), threading.Thread(target=run_kp, daemon=True)]
    for t in threads:
        t.start()
    # The members close one after the other: the one that leaves first sends LeaveGroup and the
    # other, while its loop still runs, can take every partition in one more rebalance (Kafka's
    # rule as well). So the assignment checked is the one held while both still ran, taken once
    # the group is settled at 3 + 3 with every record consumed and committed. Under load the
    # group may also rebalance midway (a member's session expiring); the wait outlasts that too.
    watcher = Consumer(ck_consumer_conf(gbroker.bootstrap, group))  # reads committed offsets, never joins
    try:
        def latest() -> list[list[int] | None]:
            with lock:
                return [assigns[k][-1] if assigns[k] else None for k in ("ck", "kp")]

        wait_until(lambda: final_assignment_ok(latest(), 6, 3), 60, "a 3 + 3 assignment")
        with lock:
            first = {k: len(assigns[k]) - 1 for k in ("ck", "kp")}  # in force when the records come
        delivered = produce(gbroker.bootstrap, topic, n, 6, "mixed")
        ends = end_offsets(delivered, 6)

        def committed_to_end() -> bool:
            tps = watcher.committed([TopicPartition(topic, p) for p in range(6)], timeout=10)
            return all(tp.error is None for tp in tps) and {tp.partition: tp.offset for tp in tps} == ends

        # (A member thread that failed ends the waits; its problem is reported below.)
        wait_until(lambda: bool(problems) or len(got["ck"]) + len(got["kp"]) >= n, 60, f"{n} records consumed")
        wait_until(lambda: bool(problems) or (final_assignment_ok(latest(), 6, 3) and committed_to_end()), 60,
                   "3 + 3 again with every record committed", poll_s=0.2)
        with lock:
            final = {k: list(assigns[k][-1]) for k in ("ck", "kp")}
            held = {k: {p for a in assigns[k][first[k]:] for p in a} for k in ("ck", "kp")}
    finally:
        watcher.close()
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not problems, problems[:5]
    # Range: each member holds a contiguous run of three partitions.
    assert sorted([sorted(final["ck"]), sorted(final["kp"])]) == [[0, 1, 2], [3, 4, 5]], final
    # Nobody read a partition it was not assigned (without a rebalance midway: its final ones).
    assert {p for p, _, _ in got["ck"]} <= held["ck"], (held, assigns)
    assert {p for p, _, _ in got["kp"]} <= held["kp"], (held, assigns)
    assert_exactly_once(got["ck"] + got["kp"], delivered)
    assert ck_committed(gbroker.bootstrap, group, topic, 6) == ends


# ---------------------------------------------------------------- static membership


def test_static_member_restart_keeps_assignment_without_rebalance(gbroker: BrokerProcess) -> None:
    """group.instance.id members: one closes (librdkafka sends no LeaveGroup for static members)
    and comes back within the session timeout: same partitions, no rebalance for the other."""
    from confluent_kafka import Consumer

    topic, group = "static", "static-group"
    session_ms = 10_000  # room for a slow restart on a busy machine
    create_topic(gbroker.bootstrap, topic, 6)
    events: dict[str, list[tuple[str, list[int]]]] = defaultdict(list)

    def make(name: str, instance: str) -> Any:
        c = Consumer(ck_consumer_conf(gbroker.bootstrap, group, **{
            "group.instance.id": instance, "client.id": name, "session.timeout.ms": session_ms}))
        c.subscribe([topic],
                    on_assign=lambda _c, ps: events[name].append(("assign", sorted(p.partition for p in ps))),
                    on_revoke=lambda _c, ps: events[name].append(("revoke", sorted(p.partition for p in ps))))
        return c

    def poll_until(consumers: list[Any], pred: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for c in consumers:
                msg = c.poll(0.05)
                assert msg is None or not msg.error(), msg.error()
            if pred():
                return
        raise AssertionError(f"timed out waiting for {what}: {dict(events)}")

    def poll_for(consumers: list[Any], seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for c in consumers:
                msg = c.poll(0.05)
                assert msg is None or not msg.error(), msg.error()

    def latest(name: str) -> list[int] | None:
        assigned = [ps for kind, ps in events[name] if kind == "assign"]
        return assigned[-1] if assigned else None

    raw = RawClient(gbroker.bootstrap)
    a = make("a", "inst-a")
    b = make("b", "inst-b")
    b_closed = False
    b2 = None
    try:
        poll_until([a, b], lambda: final_assignment_ok([latest("a"), latest("b")], 6, 3), 60, "3 + 3")
        poll_for([a, b], 1.0)
        before = raw_describe(raw, [group]).groups[0]
        assert before.group_state == "Stable"
        members_before = {m.group_instance_id: m.member_id for m in before.members}
        assert set(members_before) == {"inst-a", "inst-b"}
        a_events = list(events["a"])
        b_partitions = latest("b")

        b.close()
        b_closed = True
        # No LeaveGroup from a static member: inst-b is still in the group, nothing rebalances.
        poll_for([a], 1.0)
        mid = raw_describe(raw, [group]).groups[0]
        assert mid.group_state == "Stable"
        assert {m.group_instance_id: m.member_id for m in mid.members} == members_before

        b2 = make("b2", "inst-b")
        poll_until([a, b2], lambda: latest("b2") is not None, 30, "restarted inst-b assigned")
        assert latest("b2") == b_partitions
        # Keep polling for several heartbeat intervals: no rebalance reaches the other member.
        poll_for([a, b2], 3.0)
        assert events["a"] == a_events, events["a"]
        assert events["b2"] == [("assign", b_partitions)]
        after = raw_describe(raw, [group]).groups[0]
        assert after.group_state == "Stable"
        members_after = {m.group_instance_id: m.member_id for m in after.members}
        assert set(members_after) == {"inst-a", "inst-b"}
        assert members_after["inst-a"] == members_before["inst-a"]
        assert members_after["inst-b"] != members_before["inst-b"]
    finally:
        raw.close()
        a.close()
        if not b_closed:
            b.close()
        if b2 is not None:
            b2.close()


# ---------------------------------------------------------------- bad input, raw protocol


def test_raw_protocol_group_errors(gbroker: BrokerProcess) -> None:
    topic, group = "raw-topic", "raw-group"
    create_topic(gbroker.bootstrap, topic, 2)
    raw = RawClient(gbroker.bootstrap)
    try:
        fc = raw_find_coordinator(raw, group)
        assert (int(fc.error_code), fc.host, int(fc.port)) == (0, "127.0.0.1", gbroker.port)
        # Session timeout below group.min.session.timeout.ms (and above the max).
        r = raw_join(raw, group, "", session_ms=1_800_001)
        assert int(r.error_code) == 26
        r = raw_join(raw, group, "", session_ms=1000)
        assert int(r.error_code) == 26
        # v4+: a first join gets MEMBER_ID_REQUIRED and an id, the second join enters the group.
        r = raw_join(raw, group, "")
        assert int(r.error_code) == 79 and r.member_id
        member_id = r.member_id
        t0 = time.monotonic()
        r = raw_join(raw, group, member_id)
        waited = time.monotonic() - t0
        assert int(r.error_code) == 0, r
        assert waited >= DELAY_MS / 1000 * 0.9, waited  # the initial rebalance delay
        assert r.generation_id == 1 and r.leader == member_id and r.member_id == member_id
        assert r.protocol_name == "range"
        assert [(m.member_id, m.metadata) for m in r.members] == [(member_id, b"raw-metadata")]
        gen = int(r.generation_id)

        s = raw_sync(raw, group, "unknown-member", gen)
        assert int(s.error_code) == 25
        s = raw_sync(raw, group, member_id, gen, {member_id: b"my-assignment"})
        assert int(s.error_code) == 0 and s.assignment == b"my-assignment"

        assert raw_heartbeat(raw, group, member_id, gen) == 0
        assert raw_heartbeat(raw, group, "unknown-member", gen) == 25
        assert raw_heartbeat(raw, group, member_id, gen + 1) == 22
        assert raw_heartbeat(raw, "no-such-group", member_id, gen) == 25

        assert raw_commit(raw, group, member_id, gen, {("no-such-topic", 0): 5}) == {("no-such-topic", 0): 3}
        assert raw_commit(raw, group, member_id, gen, {(topic, 7): 5}) == {(topic, 7): 3}
        assert raw_commit(raw, group, member_id, gen, {(topic, 0): 5}) == {(topic, 0): 0}
        assert raw_commit(raw, group, member_id, gen + 1, {(topic, 0): 6}) == {(topic, 0): 22}
        assert raw_commit(raw, group, "unknown-member", gen, {(topic, 0): 6}) == {(topic, 0): 25}

        f = raw_offset_fetch(raw, group, {topic: [0, 1]})
        assert int(f.error_code) == 0
        got = {(t.name, int(p.partition_index)): (int(p.committed_offset), p.metadata, int(p.error_code))
               for t in f.topics for p in t.partitions}
        assert got == {(topic, 0): (5, "raw", 0), (topic, 1): (-1, "", 0)}
        f = raw_offset_fetch(raw, group, None)
        assert [(t.name, int(p.partition_index), int(p.committed_offset)) for t in f.topics for p in t.partitions] \
            == [(topic, 0, 5)]
        assert raw_list_groups(raw) == {group: "consumer"}
        f = raw_offset_fetch(raw, "no-such-group", {topic: [0]})
        assert [(int(p.committed_offset), p.metadata, int(p.error_code)) for t in f.topics for p in t.partitions] \
            == [(-1, "", 0)]

        assert raw_delete_groups(raw, [group, "no-such-group"]) == {group: 68, "no-such-group": 69}

        d = raw_describe(raw, ["no-such-group", group])
        unknown, known = d.groups
        assert (int(unknown.error_code), unknown.group_id, unknown.group_state, len(unknown.members)) \
            == (0, "no-such-group", "Dead", 0)
        assert known.group_state == "Stable" and known.protocol_type == "consumer" and known.protocol_data == "range"
        assert [(m.member_id, m.client_id, m.member_metadata, m.member_assignment) for m in known.members] \
            == [(member_id, "raw-groups", b"raw-metadata", b"my-assignment")]

        lv = raw_leave(raw, group, [(member_id, None)])
        assert int(lv.error_code) == 0
        assert [(m.member_id, int(m.error_code)) for m in lv.members] == [(member_id, 0)]
        assert raw_heartbeat(raw, group, member_id, gen) == 25
        assert raw_describe(raw, [group]).groups[0].group_state == "Empty"
        assert raw_delete_groups(raw, [group]) == {group: 0}
        assert raw_describe(raw, [group]).groups[0].group_state == "Dead"
        f = raw_offset_fetch(raw, group, {topic: [0]})
        assert [int(p.committed_offset) for t in f.topics for p in t.partitions] == [-1]
    finally:
        raw.close()
    assert "Traceback" not in gbroker.log_text()


def test_live_member_survives_broker_kill9_without_rebalance(broker_factory: Any) -> None:
    """The coordinator state is replayed from __consumer_offsets: a member that stays up while
    the broker is SIGKILLed and restarted keeps its member id and assignment (no rebalance)
    and goes on consuming from where it was."""
    from confluent_kafka import Consumer

    b = broker_factory(**GROUP_OVERRIDES)
    topic, group = "replayed-group", "replayed"
    create_topic(b.bootstrap, topic, 2)
    first = produce(b.bootstrap, topic, 100, 2, "before")
    events: list[tuple[str, list[int]]] = []
    c = Consumer(ck_consumer_conf(b.bootstrap, group))
    c.subscribe([topic], on_assign=lambda _c, ps: events.append(("assign", sorted(p.partition for p in ps))),
                on_revoke=lambda _c, ps: events.append(("revoke", sorted(p.partition for p in ps))))
    raw: RawClient | None = None
    got: list[tuple[int, int]] = []

    def consume_until(n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(100, 0.2):
                assert not m.error(), m.error()
                got.append((m.partition(), m.offset()))

    try:
        consume_until(100, 60)
        c.commit(asynchronous=False)
        raw = RawClient(b.bootstrap)
        before = raw_describe(raw, [group]).groups[0]
        raw.close()
        raw = None
        assert before.group_state == "Stable" and len(before.members) == 1

        b.kill9()
        b.start()
        second = produce(b.bootstrap, topic, 50, 2, "after")
        consume_until(150, 60)
        time.sleep(1.0)  # a few heartbeats against the restarted coordinator
        got += [(m.partition(), m.offset()) for m in c.consume(100, 0.5) if not m.error()]
        raw = RawClient(b.bootstrap)
        after = raw_describe(raw, [group]).groups[0]
        events_before_close = list(events)
    finally:
        if raw is not None:
            raw.close()
        c.close()
    assert events_before_close == [("assign", [0, 1])]
    assert after.group_state == "Stable"
    assert [m.member_id for m in after.members] == [m.member_id for m in before.members]
    assert sorted(got) == sorted([*first, *second])


def test_offsets_of_deleted_topic_are_removed(gbroker: BrokerProcess) -> None:
    """Kafka drops the committed offsets of deleted partitions (GroupCoordinator.onPartitionsDeleted).
    Otherwise a topic re-created under the same name inherits stale positions."""
    from confluent_kafka.admin import AdminClient

    topic, group = "short-lived", "short-lived-group"
    create_topic(gbroker.bootstrap, topic, 2)
    raw = RawClient(gbroker.bootstrap)
    try:
        assert raw_commit(raw, group, "", -1, {(topic, 0): 50, (topic, 1): 60}) == {(topic, 0): 0, (topic, 1): 0}
        admin = AdminClient({"bootstrap.servers": gbroker.bootstrap, "socket.timeout.ms": 10000})
        admin.delete_topics([topic], operation_timeout=10, request_timeout=15)[topic].result(timeout=20)
        create_topic(gbroker.bootstrap, topic, 2)
        f = raw_offset_fetch(raw, group, {topic: [0, 1]})
        assert [(int(p.partition_index), int(p.committed_offset)) for t in f.topics for p in t.partitions] \
            == [(0, -1), (1, -1)]
    finally:
        raw.close()
