"""Share groups under kill -9 (KIP-932, issue 44): 3 broker processes, a topic of 3 partitions
(RF 3), 3 member processes (librdkafka's share consumer, tests/fault/share_member.py) accepting
every record they get and writing down what they got, when, and what the broker answered to
their commitSync. A seeded schedule kills -9, in a seeded order, a member (a new one takes its
place), the broker coordinating the group (FindCoordinator), the broker leading the
`__share_group_state` partition of one of the group's share partitions (its share coordinator)
and a topic partition's leader, and once more one of the three brokers' roles; every broker
killed is restarted. Records are written while it runs.

Then the delivery guarantees (docs/share_groups.md) are checked on what the members wrote:
- every record written (acknowledged to the producer) is accepted at least once, unless its
  last delivery was its delivery-count limit's, or the broker's answer to its last acceptance
  is unknown (a timeout, a coordinator error: the state may have been written) and it never
  came again;
- a record whose acceptance the broker acknowledged is never delivered again afterwards, and
  never acknowledged a second time;
- no record is held by two members with overlapping locks, unless a lock could have run out
  (30 s), its holder died (its connection ended), or the partition's leader changed (locks
  live in the leader's memory);
- no delivery count is above the limit (5).

Replay a schedule with DCMIRROR_FAULT_SEED=N (the seed is printed)."""

from __future__ import annotations

import json
import random
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from cluster.groups.share_state_records import SHARE_STATE_TOPIC, ShareKey, state_partition_for
from cluster.protocol.messages import decode_response, encode_request
from tests.cluster_helpers import (
    NotYet,
    admin,
    create_topic,
    fast_teardown,
    led_by,
    log_tails,
    topic_ready,
    wait_until,
)
from tests.fault_workload import fault_rng
from tests.harness import REPO, ClusterProcesses

pytestmark = [pytest.mark.timeout(420), pytest.mark.heavy]

TOPIC, GROUP, PARTITIONS = "share-faults", "sg-faults", 3
ALL = [1, 2, 3]
PROGRESS_S = 60.0  # the longest a step may go without progress
LOCK_S = 30.0  # group.share.record.lock.duration.ms
DELIVERY_LIMIT = 5  # group.share.delivery.count.limit
LEADER_SEEN_SLACK_S = 5.0  # a leader change is seen in metadata at most this late
AMBIGUOUS_OK = "UNKNOWN"  # the broker's answer to an acceptance is not known
INVALID_RECORD_STATE = "INVALID_RECORD_STATE"
# COORDINATOR_NOT_AVAILABLE: the state write timed out or failed (it may have been written);
# REQUEST_TIMED_OUT and the like: no answer.
AMBIGUOUS_ERRORS = frozenset({"COORDINATOR_NOT_AVAILABLE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION",
                              "UNKNOWN_SERVER_ERROR"})
KINDS = ("member", "group-coordinator", "share-coordinator", "partition-leader")


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


# ---- raw requests: FindCoordinator and Metadata with leader epochs and topic ids -----------------

def ask(bootstrap: str, api: int, version: int, body: dict[str, Any]) -> Any:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(encode_request(api, version, 1, b"share-faults", body))
        (length,) = struct.unpack(">i", _read(s, 4))
        return decode_response(api, version, _read(s, length))


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise OSError("the broker closed the connection")
        out += chunk
    return out


def group_coordinator(bootstrap: str) -> int:
    got = ask(bootstrap, 10, 2, {"key": GROUP, "key_type": 0})
    if got.error_code != 0 or got.node_id < 0:
        raise NotYet(f"FindCoordinator {GROUP}: error {got.error_code}")
    return int(got.node_id)


def topic_view(bootstrap: str, topic: str) -> tuple[uuid.UUID, dict[int, tuple[int, int]]]:
    """The topic's id and each partition's (leader, leader epoch), from Metadata v12."""
    got = ask(bootstrap, 3, 12, {"topics": [{"topic_id": None, "name": topic}], "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
    t = got.topics[0]
    if t.error_code != 0 or not t.partitions:
        raise NotYet(f"{topic}: error {t.error_code}")
    return t.topic_id, {int(p.partition_index): (int(p.leader_id), int(p.leader_epoch)) for p in t.partitions}


def any_live(cluster: ClusterProcesses) -> str:
    return cluster.bootstrap_of(*cluster.alive())


# ---- what the members wrote ---------------------------------------------------------------------

@dataclass
class Delivery:
    member: str
    partition: int
    offset: int
    count: int
    value: str
    earliest_acquire: float  # the member's poll before: no fetch that brought this went out earlier
    ret: float  # the poll that returned it
    end: float | None = None  # its commit's call, or its member's death: the hold ends
    outcome: str | None = None  # None: acknowledged by the broker; else its error, or AMBIGUOUS_OK
    settled: bool = False  # its commit answered (or its member died)

    @property
    def ok(self) -> bool:
        return self.settled and self.outcome is None


@dataclass
class MemberLog:
    name: str
    path: Path
    proc: subprocess.Popen[bytes]
    started: float = 0.0
    died: float | None = None
    lines: int = 0  # lines read so far
    last_poll_call: float | None = None
    pending: list[Delivery] = field(default_factory=list)  # the last poll's, awaiting their commit
    committing: bool = False  # its acceptances of `pending` may be on their way to the broker
    idle_polls_after: list[float] = field(default_factory=list)


class Ledger:
    """Every delivery the members wrote down, read as the files grow."""

    def __init__(self) -> None:
        self.members: dict[str, MemberLog] = {}
        self.deliveries: dict[tuple[int, int], list[Delivery]] = defaultdict(list)
        self.ok_count = 0
        self.events = 0

    def read(self) -> None:
        for m in self.members.values():
            try:
                text = m.path.read_text()
            except FileNotFoundError:
                continue
            lines = text.split("\n")[:-1]  # the last one may be half written
            for raw in lines[m.lines:]:
                self._line(m, json.loads(raw))
            m.lines = len(lines)
            if m.died is not None and m.pending:
                # died holding them: its connection ended; if it died committing, the broker may
                # have accepted them (one CI run: the commit was written, the line was not)
                outcome = f"{AMBIGUOUS_OK}:DIED_COMMITTING" if m.committing else "DIED"
                for d in m.pending:
                    d.end, d.settled, d.outcome = m.died, True, outcome
                m.pending, m.committing = [], False

    def _line(self, m: MemberLog, line: dict[str, Any]) -> None:
        if line.get("recs") or "commit" in line:
            self.events += 1  # progress: records delivered or settled (not idle polls)
        if "start" in line:
            m.started = m.last_poll_call = line["start"]
        elif "poll" in line:
            assert not m.pending, f"{m.name} polled again before its commit"
            earliest = m.last_poll_call if m.last_poll_call is not None else line["poll"]
            m.last_poll_call = line["poll"]
            for p, offset, count, value in line["recs"]:
                d = Delivery(m.name, p, offset, count, value, earliest, line["ret"])
                m.pending.append(d)
                self.deliveries[(p, offset)].append(d)
            if not line["recs"]:
                m.idle_polls_after.append(line["poll"])
        elif "committing" in line:
            m.committing = True
        elif "commit" in line:
            m.committing = False
            refused = {tuple(int(x) for x in r.split(":")[:2]) for r in line["refused"]}
            for d in m.pending:
                d.end, d.settled = line["commit"], True
                if line["raised"] is not None or str(d.partition) not in line["parts"]:
                    d.outcome = AMBIGUOUS_OK if line["raised"] is None else f"{AMBIGUOUS_OK}:{line['raised']}"
                elif (d.partition, d.offset) in refused:
                    d.outcome = "REFUSED_BY_CLIENT"
                else:
                    d.outcome = line["parts"][str(d.partition)]
                if d.outcome is None:
                    self.ok_count += 1
            m.pending = []

    def resolved(self, key: tuple[int, int]) -> bool:
        """Nothing more is to come for this record: accepted, archived at its limit, or its last
        acceptance's answer unknown (the broker may hold it accepted)."""
        ds = self.deliveries.get(key, [])
        if any(d.ok for d in ds):
            return True
        if not ds or not all(d.settled for d in ds):
            return False
        last = max(ds, key=lambda d: d.ret)
        return last.count >= DELIVERY_LIMIT or ambiguous(last.outcome)


def ambiguous(outcome: str | None) -> bool:
    """An acceptance's answer that does not say whether the broker kept it: unknown, a client-side
    error (librdkafka's names start with _), or a state write that may have happened."""
    return outcome is not None and (outcome.startswith((AMBIGUOUS_OK, "_")) or outcome in AMBIGUOUS_ERRORS)


# ---- the test --------------------------------------------------------------------------------

class Run:
    def __init__(self, cluster: ClusterProcesses, tmp: Path, rng: random.Random) -> None:
        self.cluster, self.tmp, self.rng = cluster, tmp, rng
        self.ledger = Ledger()
        self.producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                                  "linger.ms": 5, "message.timeout.ms": 120_000, "log_level": 2})
        self.produced: dict[tuple[int, int], str] = {}
        self.produce_errors: list[KafkaError] = []
        self.next_value = 0
        self.leader_changes: dict[int, list[float]] = defaultdict(list)
        self.leaders: dict[int, tuple[int, int]] = {}
        self.watched_at = 0.0
        self.topic_id: uuid.UUID | None = None
        self.events: list[str] = []
        self.member_serial = 0

    # members
    def start_member(self) -> str:
        self.member_serial += 1
        name = f"m{self.member_serial}"
        path = self.tmp / f"{name}.jsonl"
        max_poll_records, work_ms = self.rng.randrange(10, 100), self.rng.randrange(20, 300)
        proc = subprocess.Popen([sys.executable, "-m", "tests.fault.share_member", self.cluster.bootstrap, GROUP,
                                 TOPIC, str(path), str(max_poll_records), str(work_ms)], cwd=REPO,
                                stderr=open(self.tmp / f"{name}.err", "ab"))
        print(f"member {name}: max.poll.records {max_poll_records}, {work_ms} ms of work per poll", flush=True)
        self.ledger.members[name] = MemberLog(name, path, proc)
        return name

    def kill_member(self, name: str) -> None:
        m = self.ledger.members[name]
        m.proc.kill()
        m.proc.wait(10)
        m.died = time.monotonic()

    def live_members(self) -> list[str]:
        return [n for n, m in self.ledger.members.items() if m.died is None]

    # records
    def produce(self, count: int) -> None:
        for _ in range(count):
            i = self.next_value
            self.next_value += 1
            self.producer.produce(TOPIC, f"r-{i}".encode(), partition=i % PARTITIONS, on_delivery=self._delivered)
            self.producer.poll(0)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.produce_errors.append(err)
        else:
            self.produced[(msg.partition(), msg.offset())] = msg.value().decode()

    # watching
    def tick(self) -> None:
        """Read the members' files, serve the producer, note leader changes (every 0.2 s)."""
        self.producer.poll(0)
        self.ledger.read()
        for name, m in self.ledger.members.items():
            assert m.died is not None or m.proc.poll() is None, \
                f"member {name} exited: {(self.tmp / f'{name}.err').read_text()[-2000:]}"
        now = time.monotonic()
        if now - self.watched_at >= 0.2:
            self.watched_at = now
            try:
                topic_id, leaders = topic_view(any_live(self.cluster), TOPIC)
            except (NotYet, OSError):
                return
            self.topic_id = topic_id
            for p, (leader, epoch) in leaders.items():
                if p in self.leaders and self.leaders[p][1] != epoch:
                    self.leader_changes[p].append(now)
                self.leaders[p] = (leader, epoch)

    def wait(self, done: Callable[[], object], what: str | Callable[[], str]) -> None:
        """tick() until done(), failing once nothing moved (no line written by a member) for PROGRESS_S;
        `what` (called then, when a callable) says what was awaited."""
        last_events, last = -1, time.monotonic()
        while not done():
            self.tick()
            if self.ledger.events != last_events:
                last_events, last = self.ledger.events, time.monotonic()
            if time.monotonic() - last > PROGRESS_S:
                said = what() if callable(what) else what
                raise AssertionError(f"no progress for {PROGRESS_S:.0f} s: {said}\n{self.summary()}\n"
                                     f"{log_tails(self.cluster)}")
            time.sleep(0.05)

    def wait_accepted(self, more: int) -> None:
        target = self.ledger.ok_count + more
        self.wait(lambda: self.ledger.ok_count >= target, f"{more} more acceptances (at {target - more})")

    def summary(self) -> str:
        return (f"produced {len(self.produced)} (next {self.next_value}), acceptances {self.ledger.ok_count}, "
                f"events: {self.events}")

    # faults
    def target(self, kind: str) -> int:
        live = any_live(self.cluster)
        if kind == "group-coordinator":
            return wait_until(lambda: group_coordinator(live), PROGRESS_S, "the group's coordinator", self.cluster)
        _, leaders = topic_view(live, TOPIC)
        partition = self.rng.randrange(PARTITIONS)
        if kind == "partition-leader":
            return leaders[partition][0]
        assert self.topic_id is not None
        _, state = topic_view(live, SHARE_STATE_TOPIC)
        index = state_partition_for(ShareKey(GROUP, str(self.topic_id), partition), len(state))
        return state[index][0]

    def roles(self, node: int) -> str:
        try:
            return self._roles(node)
        except (NotYet, OSError) as exc:
            return f"roles not known: {exc}"

    def _roles(self, node: int) -> str:
        live = any_live(self.cluster)
        held = [f"leader of {TOPIC}-{p}" for p, (leader, _) in topic_view(live, TOPIC)[1].items() if leader == node]
        if group_coordinator(live) == node:
            held.append("group coordinator")
        _, state = topic_view(live, SHARE_STATE_TOPIC)
        assert self.topic_id is not None
        held += [f"share coordinator of {TOPIC}-{p}" for p in range(PARTITIONS)
                 if state[state_partition_for(ShareKey(GROUP, str(self.topic_id), p), len(state))][0] == node]
        return ", ".join(held) or "no role"

    def whole(self) -> None:
        """Every broker up and in every ISR of the topic and of the share state."""
        wait_until(lambda: topic_ready(self.cluster, TOPIC, PARTITIONS, 3), PROGRESS_S, f"{TOPIC}'s ISRs whole",
                   self.cluster)
        wait_until(lambda: all(len(p.isrs) == 3 for p in admin(self.cluster.bootstrap).list_topics(
            SHARE_STATE_TOPIC, timeout=5).topics[SHARE_STATE_TOPIC].partitions.values()), PROGRESS_S,
                   f"{SHARE_STATE_TOPIC}'s ISRs whole", self.cluster)

    def step(self, kind: str) -> None:
        self.produce(self.rng.randrange(200, 400))
        self.wait_accepted(self.rng.randrange(30, 120))
        self.whole()
        self.tick()
        if kind == "member":
            victim = self.rng.choice(self.live_members())
            self.kill_member(victim)
            replacement = self.start_member()
            self.events.append(f"killed member {victim}, started {replacement}")
            print(self.events[-1], flush=True)
            self.produce(self.rng.randrange(100, 200))
            self.wait_accepted(self.rng.randrange(20, 80))
            return
        node = self.target(kind)
        roles = self.roles(node)
        self.cluster[node].kill9()
        self.events.append(f"killed broker {node} ({kind}; it was {roles})")
        print(self.events[-1], flush=True)
        survivors = [n for n in ALL if n != node]
        wait_until(lambda: led_by(self.cluster.bootstrap_of(*survivors), TOPIC, PARTITIONS, survivors), PROGRESS_S,
                   f"{TOPIC} led by {survivors}", self.cluster)
        self.produce(self.rng.randrange(100, 200))
        self.wait_accepted(self.rng.randrange(20, 80))
        self.cluster[node].start()
        self.events.append(f"restarted broker {node}")

    def finish(self) -> None:
        """Sentinel records, then wait until every record written is resolved (nothing more to come)."""
        self.produce(PARTITIONS)
        assert self.producer.flush(120) == 0
        assert not self.produce_errors, self.produce_errors
        keys = sorted(self.produced)

        def all_resolved() -> bool:
            return all(self.ledger.resolved(k) for k in keys) and \
                all(not m.pending for m in self.ledger.members.values())
        self.wait(all_resolved, lambda: "every record written accepted, archived or its acceptance's answer "
                  f"unknown; not yet: {[k for k in keys if not self.ledger.resolved(k)][:20]}")


def check(run: Run) -> list[str]:
    """The guarantees' violations, each with its record's history."""
    problems: list[str] = []
    ledger = run.ledger

    def history(key: tuple[int, int]) -> str:
        return "; ".join(f"{d.member} count {d.count} at {d.ret:.2f}-{d.end or 0:.2f} {d.outcome or 'ok'}"
                         for d in sorted(ledger.deliveries[key], key=lambda d: d.ret))

    for key, value in run.produced.items():
        ds = ledger.deliveries.get(key, [])
        if not ds:
            problems.append(f"{TOPIC}-{key[0]}@{key[1]} ({value}) never delivered")
        elif not any(d.ok for d in ds) and not ledger.resolved(key):
            problems.append(f"{TOPIC}-{key[0]}@{key[1]} ({value}) never accepted: {history(key)}")
    for key, ds in ledger.deliveries.items():
        for d in ds:
            if key in run.produced and d.value != run.produced[key]:
                problems.append(f"{TOPIC}-{key[0]}@{key[1]} delivered as {d.value}, written as {run.produced[key]}")
            if not 1 <= d.count <= DELIVERY_LIMIT:
                problems.append(f"{TOPIC}-{key[0]}@{key[1]} delivered with count {d.count}: {history(key)}")
        oks = [d for d in ds if d.ok]
        if len(oks) > 1:
            problems.append(f"{TOPIC}-{key[0]}@{key[1]} acceptance acknowledged {len(oks)} times: {history(key)}")
        for a in oks:
            again = [d for d in ds if d is not a and d.earliest_acquire >= (a.end or 0)]
            if again:
                problems.append(f"{TOPIC}-{key[0]}@{key[1]} delivered again after its acknowledged acceptance: "
                                f"{history(key)}")
        for i, a in enumerate(ds):
            for b in ds[i + 1:]:
                if a.member == b.member or a.end is None or b.end is None:
                    continue
                if not (a.ret < b.end and b.ret < a.end):
                    continue  # the holds do not overlap
                first, second = sorted((a, b), key=lambda d: d.ret)
                if any(first.earliest_acquire - LEADER_SEEN_SLACK_S <= t <= second.ret + LEADER_SEEN_SLACK_S
                       for t in run.leader_changes.get(key[0], [])):
                    continue  # the lock lived in a leader that is gone
                if max(d.end - d.earliest_acquire for d in (a, b)) >= LOCK_S - 1:  # type: ignore[operator]
                    continue  # a lock could have run out
                problems.append(f"{TOPIC}-{key[0]}@{key[1]} held by {a.member} and {b.member} at once: "
                                f"{history(key)}")
    return problems


def test_share_group_delivery_guarantees_under_seeded_kill_9(clusters: Callable[..., ClusterProcesses],
                                                              tmp_path: Path) -> None:
    rng = fault_rng("share-group-kills")
    cluster = clusters(3)
    create_topic(cluster.bootstrap, TOPIC, PARTITIONS, 3)
    wait_until(lambda: topic_ready(cluster, TOPIC, PARTITIONS, 3), 30, f"{TOPIC}: RF 3, full ISRs", cluster)
    group = admin(cluster.bootstrap)
    resource = ConfigResource(ResourceType.GROUP, GROUP, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    group.incremental_alter_configs([resource])[resource].result(30)  # every record written counts

    run = Run(cluster, tmp_path, rng)
    schedule = [*rng.sample(KINDS, len(KINDS)), rng.choice(KINDS[1:])]
    print(f"schedule: {schedule}", flush=True)
    for _ in range(3):
        run.start_member()
    started = time.monotonic()
    try:
        run.wait(lambda: run.topic_id is not None, "the topic's id")
        for kind in schedule:
            run.step(kind)
        run.whole()
        run.finish()
    finally:
        for name in run.live_members():
            run.kill_member(name)
    run.ledger.read()
    took = time.monotonic() - started
    deliveries = sum(len(ds) for ds in run.ledger.deliveries.values())
    unknown = [k for k in run.produced if not any(d.ok for d in run.ledger.deliveries.get(k, []))]
    outcomes = Counter(d.outcome or "ok" for ds in run.ledger.deliveries.values() for d in ds)
    print(f"{len(run.produced)} records written, {deliveries} deliveries, {run.ledger.ok_count} acceptances "
          f"acknowledged, {len(unknown)} without one; outcomes {dict(outcomes)}; leader changes "
          f"{ {p: len(ts) for p, ts in run.leader_changes.items()} }; {took:.1f} s", flush=True)
    problems = check(run)
    assert not problems, "\n".join([*run.events, *problems[:30]])
