"""The sans-IO metadata controller (cluster/controller/): decisions, the records they emit, replay.

Every operation goes through `Cluster.do`, which takes the emitted records, sends them
through orjson like the metadata log does, and checks that replaying every entry so far on
a fresh MetadataImage gives the controller's own image (snapshot bytes, offset aside) and
that snapshots round-trip. No I/O, no sleeps: time is an argument, randomness is seeded.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.controller.assignment import AssignmentError, assign_replicas
from cluster.controller.controller import (
    ELECTION_PREFERRED,
    ELECTION_UNCLEAN,
    PRODUCER_ID_BLOCK_SIZE,
    ControllerConfig,
    QuorumController,
)
from cluster.controller.image import NO_LEADER, MetadataImage, PartitionState, record

SEED = 20240611

# Kafka error codes (kio ErrorCode values), spelled out so a renumbering would show.
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
POLICY_VIOLATION = 44
TOPIC_DELETION_DISABLED = 73
FENCED_LEADER_EPOCH = 74
STALE_BROKER_EPOCH = 77
PREFERRED_LEADER_NOT_AVAILABLE = 80
ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
ELECTION_NOT_NEEDED = 84
NO_REASSIGNMENT_IN_PROGRESS = 85
INVALID_UPDATE_VERSION = 95
INELIGIBLE_REPLICA = 107

SESSION_MS = 2000


def validate_configs(configs: dict[str, str]) -> None:
    """A stand-in for the broker's topic config validation."""
    for key, value in configs.items():
        if key.startswith("bogus."):
            raise ValueError(f"unknown topic config {key}")
        if key == "retention.ms" and not value.lstrip("-").isdigit():
            raise ValueError(f"retention.ms must be an integer, not {value!r}")


class FixedStart(random.Random):
    """Seeded randomness, except the assignment start index is chosen by the test."""

    start = 0

    def randrange(self, *args: Any, **kwargs: Any) -> int:  # type: ignore[override]
        return self.start


def _bytes_without_offset(image: MetadataImage) -> bytes:
    saved = image.offset
    image.offset = 0
    try:
        return image.to_bytes()
    finally:
        image.offset = saved


_LIVE: list[Cluster] = []


class Cluster:
    """A controller, its metadata log so far, and a follower image applying that log."""

    def __init__(self, config: ControllerConfig | None = None, *, now: int = 0,
                 rng: random.Random | None = None) -> None:
        self.config = config or ControllerConfig(session_timeout_ms=SESSION_MS)
        self.ctrl = QuorumController(MetadataImage(), self.config, validate_configs,
                                     rng or random.Random(SEED), now)
        self.entries: list[bytes] = []
        self.follower = MetadataImage()
        self.epochs: dict[int, int] = {}
        self.now = now
        _LIVE.append(self)

    @property
    def image(self) -> MetadataImage:
        return self.ctrl.image

    # ---- the checker -------------------------------------------------------------------

    def commit(self) -> list[dict[str, Any]]:
        records = self.ctrl.take_records()
        data = orjson.dumps(records)
        self.entries.append(data)
        self.follower.apply_entry(len(self.entries) - 1, data)
        self.check()
        return records

    def check(self) -> None:
        expected = _bytes_without_offset(self.image)
        fresh = MetadataImage()
        for offset, data in enumerate(self.entries):
            fresh.apply_entry(offset, data)
        assert fresh.offset == len(self.entries)
        assert _bytes_without_offset(fresh) == expected, "replaying the log differs from the controller's image"
        assert _bytes_without_offset(self.follower) == expected, "the incremental follower differs"
        for image in (self.image, fresh):
            snapshot = image.to_bytes()
            assert MetadataImage.from_bytes(snapshot).to_bytes() == snapshot
            assert image.copy().to_bytes() == snapshot

    def do(self, op: str, *args: Any) -> tuple[Any, list[dict[str, Any]]]:
        result = getattr(self.ctrl, op)(*args)
        return result, self.commit()

    # ---- brokers -----------------------------------------------------------------------

    def register(self, broker_id: int, incarnation: str | None = None, now: int | None = None) -> tuple[dict, list]:
        args = {"broker_id": broker_id, "incarnation_id": incarnation or f"inc-{broker_id}-a",
                "host": "127.0.0.1", "port": 9090 + broker_id, "rack": f"rack-{broker_id % 2}"}
        result, records = self.do("register_broker", args, self.now if now is None else now)
        assert result["error_code"] == NONE
        self.epochs[broker_id] = result["broker_epoch"]
        return result, records

    def heartbeat(self, broker_id: int, *, caught_up: bool = True, want_shutdown: bool = False,
                  epoch: int | None = None, now: int | None = None) -> tuple[dict, list]:
        args = {"broker_id": broker_id, "broker_epoch": self.epochs[broker_id] if epoch is None else epoch,
                "caught_up": caught_up, "want_shutdown": want_shutdown}
        return self.do("broker_heartbeat", args, self.now if now is None else now)

    def start(self, *brokers: int) -> None:
        for b in brokers:
            self.register(b)
            result, _ = self.heartbeat(b)
            assert result == {"error_code": NONE, "error_message": None, "is_fenced": False,
                              "should_shut_down": False}

    def expire(self, *brokers: int) -> list[dict[str, Any]]:
        """Let the sessions of `brokers` run out while every other live broker heartbeats."""
        self.now += SESSION_MS + 1
        for b, reg in sorted(self.image.brokers.items()):
            if b not in brokers and not reg.fenced:
                _, records = self.heartbeat(b)
                assert records == []
        _, records = self.do("tick", self.now)
        assert {b for b, reg in self.image.brokers.items() if reg.fenced} >= set(brokers)
        return records

    def revive(self, broker_id: int) -> list[dict[str, Any]]:
        """A fenced broker heartbeats again with its epoch, caught up."""
        result, records = self.heartbeat(broker_id)
        assert result["error_code"] == NONE and result["is_fenced"] is False
        return records

    # ---- topics and partitions -----------------------------------------------------------

    def create(self, name: str, partitions: int = -1, rf: int = -1, *,
               assignments: list[list[int]] | None = None, configs: dict[str, str] | None = None) -> str:
        spec: dict[str, Any] = {"name": name, "num_partitions": partitions, "replication_factor": rf}
        if assignments is not None:
            spec["assignments"] = assignments
        if configs is not None:
            spec["configs"] = configs
        result, records = self.do("create_topics", {"topics": [spec]})
        (topic,) = result["topics"]
        assert topic["error_code"] == NONE, topic
        assert records[0]["type"] == "Topic" and records[0]["topic_id"] == topic["topic_id"]
        return topic["topic_id"]

    def tid(self, name: str) -> str:
        t = self.image.topic(name)
        assert t is not None
        return t.topic_id

    def p(self, name: str, index: int = 0) -> PartitionState:
        p = self.image.partition(name, index)
        assert p is not None
        return p

    def alter_isr(self, name: str, index: int, new_isr: list[int], **override: Any) -> tuple[dict, list]:
        p = self.p(name, index)
        args = {"broker_id": p.leader, "broker_epoch": self.epochs.get(p.leader, -1), "topic_id": self.tid(name),
                "partition": index, "leader_epoch": p.leader_epoch, "partition_epoch": p.partition_epoch,
                "isr": new_isr}
        args.update(override)
        return self.do("alter_partition", args)

    def change(self, name: str, index: int, **fields: Any) -> dict[str, Any]:
        return record("PartitionChange", topic_id=self.tid(name), partition=index, **fields)

    def reassign(self, name: str, index: int, replicas: list[int] | None) -> tuple[int, list]:
        result, records = self.do("alter_reassignments",
                                  {"partitions": [{"topic": name, "partition": index, "replicas": replicas}]})
        assert result["error_code"] == NONE
        (part,) = result["partitions"]
        assert (part["topic"], part["partition"]) == (name, index)
        return part["error_code"], records


def state(p: PartitionState) -> tuple[list[int], list[int], int, int, int]:
    return p.replicas, p.isr, p.leader, p.leader_epoch, p.partition_epoch


def fence(c: Cluster, b: int) -> dict[str, Any]:
    return record("FenceBroker", broker_id=b, broker_epoch=c.epochs[b])


def unfence(c: Cluster, b: int) -> dict[str, Any]:
    return record("UnfenceBroker", broker_id=b, broker_epoch=c.epochs[b])


@pytest.fixture(autouse=True)
def _every_record_is_checked() -> Iterator[None]:
    _LIVE.clear()
    yield
    for c in _LIVE:
        assert c.ctrl.take_records() == [], "an operation's records escaped the replay check"
    _LIVE.clear()


# ---- the checker itself ---------------------------------------------------------------------


def test_checker_catches_an_image_change_without_a_record() -> None:
    c = Cluster()
    c.start(1, 2)
    c.create("t", 1, 2)
    c.p("t").isr = [1]  # behind the log's back
    with pytest.raises(AssertionError, match="replaying the log differs"):
        c.check()


def test_checker_catches_a_record_that_was_not_applied() -> None:
    c = Cluster()
    c.start(1)
    c.ctrl._records.append(record("ProducerIds", broker_id=1, next_producer_id=5))
    with pytest.raises(AssertionError):
        c.commit()


def test_a_new_controller_from_the_snapshot_continues_the_same_log() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", 3, 2)
    c.expire(2)
    snapshot = c.image.to_bytes()
    successor = QuorumController(MetadataImage.from_bytes(snapshot), c.config, validate_configs,
                                 random.Random(SEED), 10_000)
    assert successor.last_heartbeat_ms == {1: 10_000, 2: 10_000, 3: 10_000}
    assert successor.next_deadline_ms() == 10_000 + SESSION_MS + 1
    assert successor.image.to_bytes() == snapshot


# ---- assignment -----------------------------------------------------------------------------


def test_assignment_rule_three_brokers() -> None:
    brokers = [3, 1, 2]  # the rule sorts them
    assert assign_replicas(brokers, 3, 2, 0) == [[1, 2], [2, 3], [3, 1]]
    assert assign_replicas(brokers, 3, 2, 1) == [[2, 3], [3, 1], [1, 2]]
    assert assign_replicas(brokers, 3, 2, 4) == [[2, 3], [3, 1], [1, 2]]  # 4 mod 3
    assert assign_replicas(brokers, 4, 3, 2) == [[3, 1, 2], [1, 2, 3], [2, 3, 1], [3, 1, 2]]
    assert assign_replicas(brokers, 2, 2, 0, first_partition=2) == [[3, 1], [1, 2]]
    assert assign_replicas(brokers, 2, 1, 2, first_partition=5) == [[2], [3]]  # (5 + 2) mod 3 = 1
    assert assign_replicas(brokers, 0, 3, 0) == []
    assert brokers == [3, 1, 2]  # the caller's list is left alone


def test_assignment_rule_five_brokers() -> None:
    brokers = [50, 10, 40, 20, 30]
    assert assign_replicas(brokers, 5, 3, 0) == [
        [10, 20, 30], [20, 30, 40], [30, 40, 50], [40, 50, 10], [50, 10, 20]]
    assert assign_replicas(brokers, 4, 3, 2, first_partition=3) == [
        [10, 20, 30], [20, 30, 40], [30, 40, 50], [40, 50, 10]]
    assert assign_replicas(brokers, 3, 5, 7, first_partition=1) == [
        [40, 50, 10, 20, 30], [50, 10, 20, 30, 40], [10, 20, 30, 40, 50]]
    assert assign_replicas(brokers, 2, 1, 65535) == [[10], [20]]  # 65535 mod 5 = 0


@pytest.mark.parametrize("brokers, rf", [([1, 2, 3], 4), ([7], 2), ([], 1), ([1, 2], 0), ([1, 2], -1)])
def test_assignment_rejects_impossible_replication_factors(brokers: list[int], rf: int) -> None:
    with pytest.raises(AssignmentError):
        assign_replicas(brokers, 3, rf, 0)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(brokers=st.sets(st.integers(0, 1000), min_size=1, max_size=9), partitions=st.integers(0, 30),
       data=st.data(), start=st.integers(0, 1 << 16), first=st.integers(0, 100))
def test_assignment_property(brokers: set[int], partitions: int, data: st.DataObject, start: int, first: int) -> None:
    ordered = sorted(brokers)
    n = len(ordered)
    rf = data.draw(st.integers(1, n), label="rf")
    rows = assign_replicas(list(brokers), partitions, rf, start, first)
    assert len(rows) == partitions
    for k, row in enumerate(rows):
        assert len(row) == rf and len(set(row)) == rf and set(row) <= brokers
        for j in range(rf):
            assert row[j] == ordered[(first + k + j + start) % n]
    leaders = [row[0] for row in rows]
    counts = [leaders.count(b) for b in ordered]
    assert max(counts) - min(counts) <= 1  # preferred leaders spread evenly
    with pytest.raises(AssignmentError):
        assign_replicas(list(brokers), partitions, n + data.draw(st.integers(1, 3), label="excess"), start, first)


# ---- brokers --------------------------------------------------------------------------------


def test_registration_is_fenced_until_a_caught_up_heartbeat() -> None:
    c = Cluster()
    result, records = c.register(1)
    assert result == {"error_code": NONE, "error_message": None, "broker_epoch": 1}
    assert records == [record("RegisterBroker", broker_id=1, broker_epoch=1, incarnation_id="inc-1-a",
                              host="127.0.0.1", port=9091, rack="rack-1")]
    assert c.image.brokers[1].fenced and c.image.active_brokers() == []
    result, records = c.heartbeat(1, caught_up=False)
    assert (result["error_code"], result["is_fenced"], records) == (NONE, True, [])
    result, records = c.heartbeat(1, caught_up=True)
    assert (result["error_code"], result["is_fenced"], result["should_shut_down"]) == (NONE, False, False)
    assert records == [unfence(c, 1)]
    assert c.image.active_brokers() == [1]
    result, records = c.heartbeat(1, caught_up=True)
    assert (result["is_fenced"], records) == (False, [])
    assert c.register(2)[0]["broker_epoch"] == 2


def test_retried_registration_returns_the_same_epoch_and_emits_nothing() -> None:
    c = Cluster()
    c.start(1, 2)
    for _ in range(2):
        result, records = c.register(1)
        assert (result["broker_epoch"], records) == (1, [])
    assert c.image.active_brokers() == [1, 2]
    assert c.register(3)[0]["broker_epoch"] == 3


def test_a_new_incarnation_fences_the_old_one_first() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3], [2, 1, 3], [3, 2, 1]])
    c.create("u", assignments=[[3, 2]])
    old_epoch = c.epochs[1]
    result, records = c.register(1, incarnation="inc-1-b")
    assert result["broker_epoch"] == 4
    assert records == [
        record("FenceBroker", broker_id=1, broker_epoch=old_epoch),
        c.change("t", 0, leader=2, isr=[2, 3]),
        c.change("t", 1, isr=[2, 3]),
        c.change("t", 2, isr=[3, 2]),
        record("RegisterBroker", broker_id=1, broker_epoch=4, incarnation_id="inc-1-b",
               host="127.0.0.1", port=9091, rack="rack-1"),
    ]
    assert state(c.p("t", 0)) == ([1, 2, 3], [2, 3], 2, 1, 1)
    assert state(c.p("t", 1)) == ([2, 1, 3], [2, 3], 2, 0, 1)
    assert state(c.p("t", 2)) == ([3, 2, 1], [3, 2], 3, 0, 1)
    assert state(c.p("u", 0)) == ([3, 2], [3, 2], 3, 0, 0)
    assert c.image.brokers[1].fenced
    result, records = c.heartbeat(1, epoch=old_epoch)
    assert (result["error_code"], records) == (STALE_BROKER_EPOCH, [])
    assert c.revive(1) == [unfence(c, 1)]  # it leads nothing until it is back in an ISR
    assert c.p("t", 0).leader == 2


def test_a_new_incarnation_of_a_fenced_broker_just_registers() -> None:
    c = Cluster()
    c.start(1, 2)
    c.expire(1)
    _, records = c.register(1, incarnation="inc-1-b")
    assert [r["type"] for r in records] == ["RegisterBroker"]
    assert records[0]["broker_epoch"] == 3


def test_heartbeats_with_a_stale_or_unknown_epoch_are_refused() -> None:
    c = Cluster()
    c.start(1, 2)
    for broker_id, epoch in ((1, 2), (1, 0), (2, 1), (9, 1)):
        result, records = c.do("broker_heartbeat", {"broker_id": broker_id, "broker_epoch": epoch,
                                                    "caught_up": True}, 0)
        assert (result["error_code"], records) == (STALE_BROKER_EPOCH, [])
    assert c.image.active_brokers() == [1, 2]


def test_session_expiry_fences_exactly_the_silent_brokers() -> None:
    c = Cluster()
    c.start(1, 2, 3, 4)  # every last heartbeat at 0
    c.create("t", assignments=[[1, 2, 3, 4]])
    assert c.ctrl.next_deadline_ms() == SESSION_MS + 1
    c.heartbeat(2, now=1500)
    c.heartbeat(4, now=1999)
    _, records = c.do("tick", SESSION_MS)  # exactly the timeout: not yet
    assert records == []
    _, records = c.do("tick", SESSION_MS + 1)
    assert records == [fence(c, 1), c.change("t", 0, leader=2, isr=[2, 3, 4]),
                       fence(c, 3), c.change("t", 0, isr=[2, 4])]
    assert c.image.active_brokers() == [2, 4]
    assert c.ctrl.next_deadline_ms() == 1500 + SESSION_MS + 1
    _, records = c.do("tick", 1500 + SESSION_MS)
    assert records == []
    _, records = c.do("tick", 1500 + SESSION_MS + 1)
    assert records == [fence(c, 2), c.change("t", 0, leader=4, isr=[4])]
    assert c.ctrl.next_deadline_ms() == 1999 + SESSION_MS + 1
    _, records = c.do("tick", 100_000)
    assert records == [fence(c, 4), c.change("t", 0, leader=NO_LEADER)]
    assert state(c.p("t")) == ([1, 2, 3, 4], [4], NO_LEADER, 3, 4)
    _, records = c.do("tick", 200_000)  # fenced brokers are not fenced again
    assert records == []


def test_a_pause_of_the_controller_is_not_held_against_any_broker() -> None:
    """The controller's event loop held up (its own broker taking leadership of 10,000
    partitions) heard no heartbeat meanwhile: the pause is credited, not fenced for. Without
    the credit every broker, its own included, was fenced the moment it resumed, leaders
    were elected again, and the next reconcile held the loop up again (a leader epoch bump
    every ~10 s for minutes in the scale benchmark)."""
    c = Cluster()
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]])
    c.heartbeat(2, now=3000)
    c.ctrl.excuse_pause(SESSION_MS + 5000, now_ms=SESSION_MS + 6000)  # heard nobody from 1000 on
    assert c.ctrl.last_heartbeat_ms == {1: SESSION_MS + 5000, 2: SESSION_MS + 6000}  # never past now
    _, records = c.do("tick", SESSION_MS + 6000)
    assert records == []
    assert c.image.active_brokers() == [1, 2]
    # The credit is the pause, no more: a broker silent after it is fenced on time.
    _, records = c.do("tick", 2 * SESSION_MS + 5001)
    assert records == [fence(c, 1), c.change("t", 0, leader=2, isr=[2])]


def test_next_deadline_includes_the_leader_balance_check() -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, leader_imbalance_check_interval_ms=500), now=100)
    assert c.ctrl.next_deadline_ms() == 600  # no brokers: the balance check
    c.start(1)
    assert c.ctrl.next_deadline_ms() == 600
    c.do("tick", 600)
    assert c.ctrl.next_deadline_ms() == 1100
    c.heartbeat(1, now=1100)
    c.do("tick", 1100)
    assert c.ctrl.next_deadline_ms() == 1600
    slow = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, leader_imbalance_check_interval_ms=10_000))
    slow.start(1)
    assert slow.ctrl.next_deadline_ms() == SESSION_MS + 1
    quiet = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, auto_leader_rebalance_enable=False), now=100)
    quiet.start(1)
    quiet.heartbeat(1, now=700)
    assert quiet.ctrl.next_deadline_ms() == 700 + SESSION_MS + 1


# ---- topic creation -------------------------------------------------------------------------


def test_created_partitions_follow_the_rule_over_active_brokers() -> None:
    rng = FixedStart(SEED)
    rng.start = 6  # s = 6 mod 4 active brokers = 2
    c = Cluster(rng=rng)
    c.start(1, 2, 4, 5)
    c.register(3)  # fenced: not assigned
    result, records = c.do("create_topics", {"topics": [
        {"name": "orders", "num_partitions": 6, "replication_factor": 3, "configs": {"retention.ms": 1000}}]})
    (topic,) = result["topics"]
    tid = topic["topic_id"]
    assert topic == {"error_code": NONE, "error_message": None, "name": "orders", "num_partitions": 6,
                     "replication_factor": 3, "topic_id": tid, "configs": {"retention.ms": "1000"}}
    expected = [[4, 5, 1], [5, 1, 2], [1, 2, 4], [2, 4, 5], [4, 5, 1], [5, 1, 2]]
    assert records == [record("Topic", topic_id=tid, name="orders", configs={"retention.ms": "1000"},
                              internal=False)] + [
        record("Partition", topic_id=tid, partition=i, replicas=r, isr=r, leader=r[0], leader_epoch=0,
               partition_epoch=0, adding=[], removing=[]) for i, r in enumerate(expected)]
    assert c.image.topic("orders").configs == {"retention.ms": "1000"}


def test_topic_ids_are_deterministic_per_seed() -> None:
    def run() -> list[str]:
        c = Cluster()
        c.start(1, 2, 3)
        return [c.create(name, 2, 2) for name in ("a", "b")]

    first = run()
    assert first == run() and first[0] != first[1]
    other = Cluster(rng=random.Random(SEED + 1))
    other.start(1, 2, 3)
    assert other.create("a", 2, 2) not in first


def test_defaults_come_from_the_controller_config() -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, num_partitions=3, default_replication_factor=2))
    c.start(1, 2, 3)
    c.create("t")
    assert [len(c.p("t", i).replicas) for i in range(3)] == [2, 2, 2]
    assert len(c.image.topic("t").partitions) == 3
    small = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, default_replication_factor=3))
    small.start(1)  # the default replication factor is capped by the live brokers
    small.create("t")
    assert state(small.p("t")) == ([1], [1], 1, 0, 0)


def test_explicit_assignment_with_a_fenced_replica() -> None:
    c = Cluster()
    c.start(1, 2)
    c.register(3)
    c.create("t", assignments=[[3, 1, 2], [1, 3, 2]])
    assert state(c.p("t", 0)) == ([3, 1, 2], [1, 2], 1, 0, 0)
    assert state(c.p("t", 1)) == ([1, 3, 2], [1, 2], 1, 0, 0)


def test_create_topic_errors_emit_nothing() -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, max_partitions_per_topic=8))
    c.start(1, 2, 3)
    c.create("exists", 1, 1)
    cases: list[tuple[dict[str, Any], int]] = [
        ({"name": "exists", "num_partitions": 1, "replication_factor": 1}, TOPIC_ALREADY_EXISTS),
        ({"name": "", "num_partitions": 1, "replication_factor": 1}, INVALID_TOPIC_EXCEPTION),
        ({"name": ".", "num_partitions": 1, "replication_factor": 1}, INVALID_TOPIC_EXCEPTION),
        ({"name": "..", "num_partitions": 1, "replication_factor": 1}, INVALID_TOPIC_EXCEPTION),
        ({"name": "a b", "num_partitions": 1, "replication_factor": 1}, INVALID_TOPIC_EXCEPTION),
        ({"name": "x" * 250, "num_partitions": 1, "replication_factor": 1}, INVALID_TOPIC_EXCEPTION),
        ({"name": "big", "num_partitions": 1, "replication_factor": 4}, INVALID_REPLICATION_FACTOR),
        ({"name": "zero-rf", "num_partitions": 1, "replication_factor": 0}, INVALID_REPLICATION_FACTOR),
        ({"name": "none", "num_partitions": 0, "replication_factor": 1}, INVALID_PARTITIONS),
        ({"name": "many", "num_partitions": 9, "replication_factor": 1}, INVALID_PARTITIONS),
        ({"name": "neg", "num_partitions": -2, "replication_factor": 1}, INVALID_PARTITIONS),
        ({"name": "cfg", "num_partitions": 1, "replication_factor": 1, "configs": {"bogus.key": "1"}},
         INVALID_CONFIG),
        ({"name": "cfg2", "num_partitions": 1, "replication_factor": 1, "configs": {"retention.ms": "soon"}},
         INVALID_CONFIG),
        ({"name": "dup", "assignments": [[1, 2], [2, 2]]}, INVALID_REPLICA_ASSIGNMENT),
        ({"name": "unknown", "assignments": [[1, 9]]}, INVALID_REPLICA_ASSIGNMENT),
        ({"name": "empty", "assignments": [[1], []]}, INVALID_REPLICA_ASSIGNMENT),
        ({"name": "ragged", "assignments": [[1, 2], [3]]}, INVALID_REPLICA_ASSIGNMENT),
        ({"name": "both", "assignments": [[1, 2]], "replication_factor": 2}, INVALID_REQUEST),
        ({"name": "count", "assignments": [[1, 2]], "num_partitions": 2}, INVALID_REQUEST),
    ]
    before = c.image.to_bytes()
    for spec, code in cases:
        result, records = c.do("create_topics", {"topics": [spec]})
        (topic,) = result["topics"]
        assert (topic["name"], topic["error_code"]) == (spec["name"], code), spec
        assert topic["error_message"], spec
        assert records == []
    assert c.image.to_bytes() == before
    result, _ = c.do("create_topics", {"topics": [{"name": "cfg", "configs": {"bogus.key": "1"}}]})
    assert result["topics"][0]["error_message"] == "unknown topic config bogus.key"


def test_one_request_creates_the_good_topics_and_reports_the_bad() -> None:
    c = Cluster()
    c.start(1, 2)
    result, records = c.do("create_topics", {"topics": [
        {"name": "good", "num_partitions": 2, "replication_factor": 2},
        {"name": "bad", "num_partitions": 1, "replication_factor": 3},
        {"name": "good", "num_partitions": 1, "replication_factor": 1},
    ]})
    assert [(t["name"], t["error_code"]) for t in result["topics"]] == [
        ("good", NONE), ("bad", INVALID_REPLICATION_FACTOR), ("good", TOPIC_ALREADY_EXISTS)]
    assert [r["type"] for r in records] == ["Topic", "Partition", "Partition"]
    assert sorted(c.image.topics_by_name) == ["good"]


def test_max_topics_is_a_policy_violation() -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, max_topics=1))
    c.start(1)
    c.create("one", 1, 1)
    result, records = c.do("create_topics", {"topics": [{"name": "two"}]})
    assert (result["topics"][0]["error_code"], records) == (POLICY_VIOLATION, [])


def test_validate_only_emits_nothing() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    result, records = c.do("create_topics", {"validate_only": True, "topics": [
        {"name": "t", "num_partitions": 4, "replication_factor": 3, "configs": {"retention.ms": "5"}},
        {"name": "u", "assignments": [[1, 2], [2, 3]]},
        {"name": "v", "num_partitions": 1, "replication_factor": 4}]})
    assert result["topics"] == [
        {"error_code": NONE, "error_message": None, "name": "t", "num_partitions": 4, "replication_factor": 3,
         "topic_id": None, "configs": {"retention.ms": "5"}},
        {"error_code": NONE, "error_message": None, "name": "u", "num_partitions": 2, "replication_factor": 2,
         "topic_id": None, "configs": {}},
        {"error_code": INVALID_REPLICATION_FACTOR, "error_message": result["topics"][2]["error_message"],
         "name": "v"},
    ]
    assert records == [] and c.image.topics == {}


# ---- elections on fencing -------------------------------------------------------------------


def test_a_fenced_leader_hands_over_to_the_next_isr_member_in_replica_order() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]])
    result, records = c.alter_isr("t", 0, [1, 3, 2])  # ISR order differs from replica order
    assert result["error_code"] == NONE and records == [c.change("t", 0, isr=[1, 3, 2])]
    assert c.expire(1) == [fence(c, 1), c.change("t", 0, leader=2, isr=[3, 2])]
    assert state(c.p("t")) == ([1, 2, 3], [3, 2], 2, 1, 2)


def test_the_last_isr_member_stays_and_the_partition_goes_leaderless() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]])
    assert c.expire(1) == [fence(c, 1), c.change("t", 0, leader=2, isr=[2, 3])]
    assert c.expire(2) == [fence(c, 2), c.change("t", 0, leader=3, isr=[3])]
    assert c.expire(3) == [fence(c, 3), c.change("t", 0, leader=NO_LEADER)]
    assert state(c.p("t")) == ([1, 2, 3], [3], NO_LEADER, 3, 3)
    # A replica outside the ISR coming back does not lead (clean elections only).
    assert c.revive(1) == [unfence(c, 1)]
    assert c.p("t").leader == NO_LEADER
    # The last ISR member coming back does.
    assert c.revive(3) == [unfence(c, 3), c.change("t", 0, leader=3)]
    assert state(c.p("t")) == ([1, 2, 3], [3], 3, 4, 4)


def _only_an_out_of_sync_replica_alive(c: Cluster, topic_configs: dict[str, str] | None) -> list[dict[str, Any]]:
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]], configs=topic_configs)
    c.expire(2, 3)
    assert state(c.p("t")) == ([1, 2, 3], [1], 1, 0, 2)
    c.revive(2)  # back, but not in the ISR
    return c.expire(1)


@pytest.mark.parametrize("controller_flag, topic_configs, unclean", [
    (False, None, False),
    (False, {"unclean.leader.election.enable": "true"}, True),
    (False, {"unclean.leader.election.enable": "TRUE"}, True),
    (True, None, True),
    (True, {"unclean.leader.election.enable": "false"}, False),
])
def test_unclean_leader_election_when_no_isr_member_is_alive(
        controller_flag: bool, topic_configs: dict[str, str] | None, unclean: bool) -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, unclean_leader_election_enable=controller_flag))
    records = _only_an_out_of_sync_replica_alive(c, topic_configs)
    if unclean:
        assert records == [fence(c, 1), c.change("t", 0, leader=2, isr=[2])]
        assert state(c.p("t")) == ([1, 2, 3], [2], 2, 1, 3)
    else:
        assert records == [fence(c, 1), c.change("t", 0, leader=NO_LEADER)]
        assert state(c.p("t")) == ([1, 2, 3], [1], NO_LEADER, 1, 3)


def test_unclean_election_also_applies_when_a_non_isr_replica_unfences() -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, unclean_leader_election_enable=True))
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]])
    c.expire(2)
    c.expire(1)  # nobody left to elect, even uncleanly
    assert state(c.p("t")) == ([1, 2], [1], NO_LEADER, 1, 2)
    assert c.revive(2) == [unfence(c, 2), c.change("t", 0, leader=2, isr=[2])]


def test_an_unfenced_isr_member_leads_leaderless_partitions() -> None:
    c = Cluster()
    c.start(1, 2)
    c.create("a", assignments=[[1], [2]])
    c.create("b", assignments=[[1, 2]])
    c.expire(2)
    c.expire(1)
    assert [c.p("a", 0).leader, c.p("a", 1).leader, c.p("b", 0).leader] == [NO_LEADER] * 3
    _, records = c.register(1, incarnation="inc-1-b")  # a restart
    assert [r["type"] for r in records] == ["RegisterBroker"]
    assert c.revive(1) == [unfence(c, 1), c.change("a", 0, leader=1), c.change("b", 0, leader=1)]
    assert state(c.p("b", 0)) == ([1, 2], [1], 1, 2, 3)
    assert c.p("a", 1).leader == NO_LEADER


# ---- controlled shutdown ----------------------------------------------------------------------


def test_controlled_shutdown_moves_leadership_away() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3], [2, 3, 1]])
    c.create("u", assignments=[[1, 3]])
    c.create("v", assignments=[[1]])
    result, records = c.heartbeat(1, want_shutdown=True)
    assert result == {"error_code": NONE, "error_message": None, "is_fenced": False, "should_shut_down": True}
    assert records == [
        record("BrokerShutdown", broker_id=1, broker_epoch=c.epochs[1]),
        c.change("t", 0, leader=2, isr=[2, 3]),
        c.change("t", 1, isr=[2, 3]),
        c.change("u", 0, leader=3, isr=[3]),
        c.change("v", 0, leader=NO_LEADER),
    ]
    assert state(c.p("v", 0)) == ([1], [1], NO_LEADER, 1, 1)
    assert c.image.brokers[1].in_controlled_shutdown and c.image.active_brokers() == [2, 3]
    result, records = c.heartbeat(1, want_shutdown=True)  # repeated: nothing more to do
    assert (result["should_shut_down"], records) == (True, [])
    # A shutting-down broker is neither elected nor given new partitions.
    assert c.expire(2)[:2] == [fence(c, 2), c.change("t", 0, leader=3, isr=[3])]
    result, _ = c.do("create_topics", {"topics": [{"name": "w", "num_partitions": 1, "replication_factor": 2}]})
    assert result["topics"][0]["error_code"] == INVALID_REPLICATION_FACTOR
    # A heartbeat without want_shutdown neither clears the state nor asks it to stop.
    result, records = c.heartbeat(1)
    assert (result["is_fenced"], result["should_shut_down"], records) == (False, False, [])
    assert c.image.brokers[1].in_controlled_shutdown


def test_a_restarted_broker_after_controlled_shutdown_leads_again() -> None:
    c = Cluster()
    c.start(1, 2)
    c.create("t", assignments=[[1]])
    c.heartbeat(1, want_shutdown=True)
    result, records = c.register(1, incarnation="inc-1-b")
    assert [r["type"] for r in records] == ["FenceBroker", "RegisterBroker"]
    assert c.revive(1) == [unfence(c, 1), c.change("t", 0, leader=1)]


# ---- elect_leaders ------------------------------------------------------------------------------


def _leader_moved_off_preferred(c: Cluster) -> None:
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3], [2, 3, 1]])
    c.expire(1)
    c.revive(1)
    assert state(c.p("t", 0)) == ([1, 2, 3], [2, 3], 2, 1, 1)


def test_preferred_election() -> None:
    c = Cluster()
    _leader_moved_off_preferred(c)
    args = {"election_type": ELECTION_PREFERRED, "partitions": [["t", 0], ["t", 1], ["t", 7], ["nope", 0]]}
    result, records = c.do("elect_leaders", args)
    assert [(r["topic"], r["partition"], r["error_code"]) for r in result["partitions"]] == [
        ("t", 0, PREFERRED_LEADER_NOT_AVAILABLE), ("t", 1, ELECTION_NOT_NEEDED),
        ("t", 7, UNKNOWN_TOPIC_OR_PARTITION), ("nope", 0, UNKNOWN_TOPIC_OR_PARTITION)]
    assert records == []
    c.alter_isr("t", 0, [2, 3, 1])
    result, records = c.do("elect_leaders", args)
    assert [r["error_code"] for r in result["partitions"]] == [
        NONE, ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_OR_PARTITION]
    assert result["partitions"][0]["error_message"] is None
    assert records == [c.change("t", 0, leader=1)]
    assert state(c.p("t", 0)) == ([1, 2, 3], [2, 3, 1], 1, 2, 3)
    result, records = c.do("elect_leaders", {"election_type": ELECTION_PREFERRED,
                                             "partitions": [["t", 0]]})
    assert [r["error_code"] for r in result["partitions"]] == [ELECTION_NOT_NEEDED] and records == []


def test_preferred_election_over_all_partitions_leaves_out_the_unneeded() -> None:
    """As Kafka's ReplicationControlManager: every topic is named, with the partitions whose
    answer is not ELECTION_NOT_NEEDED."""
    c = Cluster()
    _leader_moved_off_preferred(c)
    c.create("u", assignments=[[3, 1]])
    result, records = c.do("elect_leaders", {"election_type": ELECTION_PREFERRED, "partitions": None})
    assert [(r["topic"], r["partition"], r["error_code"]) for r in result["partitions"]] == [
        ("t", 0, PREFERRED_LEADER_NOT_AVAILABLE)]  # replica 1 is not in the ISR yet
    assert (result["topics"], records) == (["t", "u"], [])
    c.alter_isr("t", 0, [2, 3, 1])
    result, records = c.do("elect_leaders", {"partitions": None})  # preferred is the default
    assert result["partitions"] == [{"topic": "t", "partition": 0, "error_code": NONE, "error_message": None}]
    assert records == [c.change("t", 0, leader=1)]


def test_preferred_replica_in_the_isr_but_not_alive() -> None:
    c = Cluster()
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]])
    c.expire(2)
    c.expire(1)
    c.revive(2)
    assert state(c.p("t")) == ([1, 2], [1], NO_LEADER, 1, 2)
    result, records = c.do("elect_leaders", {"election_type": ELECTION_PREFERRED, "partitions": [["t", 0]]})
    assert [r["error_code"] for r in result["partitions"]] == [PREFERRED_LEADER_NOT_AVAILABLE] and records == []


def test_unclean_election_on_request() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2], [3, 2], [1, 3]])
    c.expire(2, 3)
    c.expire(1)
    c.revive(2)
    assert [c.p("t", i).leader for i in range(3)] == [NO_LEADER] * 3
    args = {"election_type": ELECTION_UNCLEAN, "partitions": [["t", 0], ["t", 1], ["t", 2]]}
    result, records = c.do("elect_leaders", args)
    assert [r["error_code"] for r in result["partitions"]] == [NONE, NONE, ELIGIBLE_LEADERS_NOT_AVAILABLE]
    assert records == [c.change("t", 0, leader=2, isr=[2]), c.change("t", 1, leader=2, isr=[2])]
    assert state(c.p("t", 2)) == ([1, 3], [1], NO_LEADER, 1, 2)
    result, records = c.do("elect_leaders", args)
    assert [r["error_code"] for r in result["partitions"]] == [
        ELECTION_NOT_NEEDED, ELECTION_NOT_NEEDED, ELIGIBLE_LEADERS_NOT_AVAILABLE]
    assert records == []
    result, records = c.do("elect_leaders", {"election_type": 5, "partitions": [["t", 0]]})
    assert [r["error_code"] for r in result["partitions"]] == [INVALID_REQUEST] and records == []


# ---- leader balance -----------------------------------------------------------------------------


def _unbalanced(c: Cluster) -> None:
    """Broker 1 is preferred for 10 partitions and leads 8; it is in the ISR of one of the other 2."""
    c.register(1)
    c.start(2)
    c.create("b", assignments=[[1, 2], [1, 2]])  # 1 fenced: 2 leads
    c.revive(1)
    c.create("a", assignments=[[1, 2]] * 8)
    c.alter_isr("b", 0, [2, 1])
    assert [c.p("b", i).leader for i in range(2)] == [2, 2]
    assert [c.p("b", i).isr for i in range(2)] == [[2, 1], [2]]


@pytest.mark.parametrize("percentage, moved", [(10, True), (19, True), (20, False), (50, False)])
def test_rebalance_moves_leaders_only_above_the_imbalance_threshold(percentage: int, moved: bool) -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, leader_imbalance_per_broker_percentage=percentage))
    _unbalanced(c)  # 2 of 10 = 20% not led by their preferred replica
    result, records = c.do("rebalance_leaders")
    if moved:
        assert (result, records) == (1, [c.change("b", 0, leader=1)])
        assert state(c.p("b", 0)) == ([1, 2], [2, 1], 1, 1, 2)
    else:
        assert (result, records) == (0, [])
    assert c.p("b", 1).leader == 2  # its preferred replica is not in the ISR
    assert c.do("rebalance_leaders") == (0, [])


def test_tick_rebalances_when_the_check_is_due() -> None:
    config = ControllerConfig(session_timeout_ms=SESSION_MS, leader_imbalance_check_interval_ms=1000)
    c = Cluster(config)
    _unbalanced(c)
    assert c.ctrl.next_deadline_ms() == 1000
    assert c.do("tick", 999)[1] == []
    assert c.do("tick", 1000)[1] == [c.change("b", 0, leader=1)]
    assert c.ctrl.next_rebalance_check_ms == 2000
    off = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, leader_imbalance_check_interval_ms=1000,
                                   auto_leader_rebalance_enable=False))
    _unbalanced(off)
    assert off.do("tick", 1000)[1] == []
    assert off.p("b", 0).leader == 2


def test_rebalance_skips_preferred_brokers_that_are_not_active() -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, leader_imbalance_per_broker_percentage=0))
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]])
    c.heartbeat(1, want_shutdown=True)
    assert c.p("t").leader == 2
    assert c.do("rebalance_leaders") == (0, [])


# ---- alter_partition ----------------------------------------------------------------------------


def test_alter_partition_validation() -> None:
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.register(5)  # fenced
    c.create("t", assignments=[[1, 2, 3]])
    c.alter_isr("t", 0, [1, 2])
    assert state(c.p("t")) == ([1, 2, 3], [1, 2], 1, 0, 1)
    cases: list[tuple[dict[str, Any], int]] = [
        ({"broker_epoch": 99}, STALE_BROKER_EPOCH),
        ({"topic_id": "no-such-topic"}, UNKNOWN_TOPIC_OR_PARTITION),
        ({"partition": 1}, UNKNOWN_TOPIC_OR_PARTITION),
        ({"broker_id": 2, "broker_epoch": c.epochs[2]}, NOT_LEADER_OR_FOLLOWER),
        ({"leader_epoch": 1}, FENCED_LEADER_EPOCH),
        ({"partition_epoch": 0}, INVALID_UPDATE_VERSION),
        ({"partition_epoch": 2}, INVALID_UPDATE_VERSION),
        ({"isr": [1, 2, 4]}, INELIGIBLE_REPLICA),  # not a replica
        ({"isr": [2, 3]}, INELIGIBLE_REPLICA),  # the leader left itself out
    ]
    for override, code in cases:
        result, records = c.alter_isr("t", 0, [1, 2, 3], **override)
        assert (result["error_code"], records) == (code, []), override
        assert result["error_message"]
    result, records = c.alter_isr("t", 0, [1, 2, 3])
    assert result == {"error_code": NONE, "error_message": None, "leader": 1, "leader_epoch": 0,
                      "partition_epoch": 2, "isr": [1, 2, 3], "replicas": [1, 2, 3]}
    assert records == [c.change("t", 0, isr=[1, 2, 3])]
    result, records = c.alter_isr("t", 0, [1])  # shrinking
    assert (result["isr"], result["partition_epoch"], records) == ([1], 3, [c.change("t", 0, isr=[1])])


def test_alter_partition_refuses_fenced_and_shutting_down_replicas() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]])
    c.expire(2)
    c.heartbeat(3, want_shutdown=True)
    assert c.p("t").isr == [1]
    for isr in ([1, 2], [1, 3]):
        result, records = c.alter_isr("t", 0, isr)
        assert (result["error_code"], records) == (INELIGIBLE_REPLICA, [])
    c.revive(2)
    result, records = c.alter_isr("t", 0, [1, 2])
    assert (result["error_code"], records) == (NONE, [c.change("t", 0, isr=[1, 2])])


def test_a_deposed_leader_is_refused() -> None:
    c = Cluster()
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]])
    stale = dict(leader_epoch=0, partition_epoch=0)
    c.expire(1)
    c.revive(1)
    result, records = c.do("alter_partition", {"broker_id": 1, "broker_epoch": c.epochs[1], "topic_id": c.tid("t"),
                                               "partition": 0, "isr": [1, 2], **stale})
    assert (result["error_code"], records) == (NOT_LEADER_OR_FOLLOWER, [])


# ---- reassignment -------------------------------------------------------------------------------


def test_reassignment_growing_the_replication_factor() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1]])
    code, records = c.reassign("t", 0, [1, 2, 3])
    assert (code, records) == (NONE, [c.change("t", 0, replicas=[1, 2, 3], adding=[2, 3])])
    p = c.p("t")
    assert (p.replicas, p.isr, p.leader, p.adding, p.removing) == ([1, 2, 3], [1], 1, [2, 3], [])
    result, _ = c.do("list_reassignments", {"partitions": None})
    assert result["partitions"] == [{"topic": "t", "partition": 0, "replicas": [1, 2, 3], "adding": [2, 3],
                                     "removing": []}]
    _, records = c.alter_isr("t", 0, [1, 2])
    assert records == [c.change("t", 0, isr=[1, 2])]  # still under way
    assert c.p("t").adding == [2, 3]
    result, records = c.alter_isr("t", 0, [1, 2, 3])
    assert records == [c.change("t", 0, isr=[1, 2, 3]), c.change("t", 0, adding=[])]
    assert result["partition_epoch"] == 4
    p = c.p("t")
    assert (p.replicas, p.isr, p.leader, p.leader_epoch, p.adding, p.removing) == ([1, 2, 3], [1, 2, 3], 1, 0, [], [])
    assert c.do("list_reassignments", {})[0]["partitions"] == []


def test_reassignment_shrinking_completes_at_once_and_moves_a_removed_leader() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3], [1, 2, 3]])
    code, records = c.reassign("t", 0, [1, 2])
    assert (code, records) == (NONE, [c.change("t", 0, removing=[3]),
                                      c.change("t", 0, replicas=[1, 2], isr=[1, 2], removing=[])])
    assert state(c.p("t", 0)) == ([1, 2], [1, 2], 1, 0, 2)
    code, records = c.reassign("t", 1, [3, 2])
    assert (code, records) == (NONE, [
        c.change("t", 1, replicas=[3, 2, 1], removing=[1]),
        c.change("t", 1, replicas=[3, 2], isr=[2, 3], leader=3, removing=[])])
    assert state(c.p("t", 1)) == ([3, 2], [2, 3], 3, 1, 2)


def test_reassignment_to_new_brokers_moves_the_leader_on_completion() -> None:
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("t", assignments=[[1, 2]])
    code, records = c.reassign("t", 0, [3, 4])
    assert records == [c.change("t", 0, replicas=[3, 4, 1, 2], adding=[3, 4], removing=[1, 2])]
    assert c.p("t").preferred_leader == 3
    c.expire(1)  # the leader fails mid-move: the not-removed replicas are preferred, then the rest
    assert state(c.p("t")) == ([3, 4, 1, 2], [2], 2, 1, 2)
    c.revive(1)
    c.alter_isr("t", 0, [2, 3])
    result, records = c.alter_isr("t", 0, [2, 3, 4])
    assert records == [c.change("t", 0, isr=[2, 3, 4]),
                       c.change("t", 0, replicas=[3, 4], isr=[3, 4], leader=3, adding=[], removing=[])]
    assert (result["leader"], result["leader_epoch"]) == (3, 2)


def test_cancelling_restores_the_original_replicas_and_isr() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1]])
    c.reassign("t", 0, [1, 2, 3])
    c.alter_isr("t", 0, [1, 2])
    code, records = c.reassign("t", 0, None)
    assert (code, records) == (NONE, [c.change("t", 0, replicas=[1], isr=[1], adding=[])])
    p = c.p("t", 0)
    assert (p.replicas, p.isr, p.leader, p.leader_epoch, p.adding, p.removing) == ([1], [1], 1, 0, [], [])
    assert c.do("list_reassignments", {"partitions": None})[0]["partitions"] == []
    code, records = c.reassign("t", 0, None)
    assert (code, records) == (NO_REASSIGNMENT_IN_PROGRESS, [])


def test_cancelling_a_move_to_new_brokers_gives_leadership_back() -> None:
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("t", assignments=[[1, 2]])
    c.reassign("t", 0, [3, 4])
    c.alter_isr("t", 0, [1, 2, 3])
    c.expire(1, 2)  # 1 and 2 fail: 3, an adding replica, leads
    assert state(c.p("t")) == ([3, 4, 1, 2], [3], 3, 1, 4)
    c.revive(1)
    c.revive(2)
    code, records = c.reassign("t", 0, None)
    # Nothing original is in the ISR: the first live original replica is its only member.
    assert (code, records) == (NONE, [c.change("t", 0, replicas=[1, 2], isr=[1], leader=1, adding=[],
                                                removing=[])])


def test_cancel_keeps_replica_order_as_kafka_does() -> None:
    """Like Kafka's PartitionReassignmentRevert, the reverted list is the merged list minus the
    adding replicas, so a reordering target leaves the target's order for the kept replicas."""
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("t", assignments=[[1, 2, 3]])
    c.reassign("t", 0, [3, 4, 1])
    assert (c.p("t").replicas, c.p("t").adding, c.p("t").removing) == ([3, 4, 1, 2], [4], [2])
    c.reassign("t", 0, None)
    assert state(c.p("t")) == ([3, 1, 2], [1, 2, 3], 1, 0, 2)


def test_a_new_target_replaces_an_ongoing_reassignment() -> None:
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("t", assignments=[[1]])
    c.reassign("t", 0, [1, 2])
    code, records = c.reassign("t", 0, [1, 3, 4])
    assert (code, records) == (NONE, [c.change("t", 0, replicas=[1], adding=[]),
                                      c.change("t", 0, replicas=[1, 3, 4], adding=[3, 4])])
    code, records = c.reassign("t", 0, [1])  # back to the start: a cancel
    assert (code, records) == (NONE, [c.change("t", 0, replicas=[1], adding=[])])
    code, records = c.reassign("t", 0, [1])
    assert (code, records) == (NONE, [])


def test_reassignment_errors() -> None:
    c = Cluster()
    c.start(1, 2)
    c.create("t", assignments=[[1]])
    result, records = c.do("alter_reassignments", {"partitions": [
        {"topic": "t", "partition": 0, "replicas": [1, 1]},
        {"topic": "t", "partition": 0, "replicas": [1, 9]},
        {"topic": "t", "partition": 0, "replicas": []},
        {"topic": "t", "partition": 3, "replicas": [1]},
        {"topic": "nope", "partition": 0, "replicas": None},
        {"topic": "t", "partition": 0, "replicas": None},
    ]})
    assert [r["error_code"] for r in result["partitions"]] == [
        INVALID_REPLICA_ASSIGNMENT, INVALID_REPLICA_ASSIGNMENT, INVALID_REPLICA_ASSIGNMENT,
        UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_OR_PARTITION, NO_REASSIGNMENT_IN_PROGRESS]
    assert records == []


def test_list_reassignments_filters_by_partition() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1], [2], [3]])
    c.reassign("t", 0, [1, 2])
    c.reassign("t", 2, [3, 1])
    result, _ = c.do("list_reassignments", {"partitions": None})
    assert [(r["topic"], r["partition"], r["replicas"], r["adding"]) for r in result["partitions"]] == [
        ("t", 0, [1, 2], [2]), ("t", 2, [3, 1], [1])]
    result, _ = c.do("list_reassignments", {"partitions": [["t", 1], ["t", 2], ["x", 0]]})
    assert [(r["topic"], r["partition"]) for r in result["partitions"]] == [("t", 2)]


# ---- create_partitions, configs, deletion, producer ids -------------------------------------------


def test_create_partitions_continues_the_assignment() -> None:
    rng = FixedStart(SEED)
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, max_partitions_per_topic=6), rng=rng)
    c.start(1, 2, 3)
    tid = c.create("t", 2, 2)
    assert [c.p("t", i).replicas for i in range(2)] == [[1, 2], [2, 3]]
    result, records = c.do("create_partitions", {"topics": [{"name": "t", "count": 5}]})
    assert result["topics"] == [{"error_code": NONE, "error_message": None, "name": "t"}]
    assert records == [record("Partition", topic_id=tid, partition=i, replicas=r, isr=r, leader=r[0],
                              leader_epoch=0, partition_epoch=0, adding=[], removing=[])
                       for i, r in ((2, [3, 1]), (3, [1, 2]), (4, [2, 3]))]
    result, records = c.do("create_partitions", {"topics": [
        {"name": "t", "count": 5}, {"name": "t", "count": 3}, {"name": "t", "count": 7},
        {"name": "nope", "count": 2}, {"name": "t", "count": 6, "assignments": [[1, 2], [2, 3]]},
        {"name": "t", "count": 6, "assignments": [[1, 1]]}, {"name": "t", "count": 6, "assignments": [[1, 7]]},
    ]})
    assert [t["error_code"] for t in result["topics"]] == [
        INVALID_PARTITIONS, INVALID_PARTITIONS, INVALID_PARTITIONS, UNKNOWN_TOPIC_OR_PARTITION,
        INVALID_REPLICA_ASSIGNMENT, INVALID_REPLICA_ASSIGNMENT, INVALID_REPLICA_ASSIGNMENT]
    assert records == []
    result, records = c.do("create_partitions", {"validate_only": True, "topics": [{"name": "t", "count": 6}]})
    assert (result["topics"][0]["error_code"], records) == (NONE, [])
    result, records = c.do("create_partitions", {"topics": [{"name": "t", "count": 6, "assignments": [[3, 2]]}]})
    assert records == [record("Partition", topic_id=tid, partition=5, replicas=[3, 2], isr=[3, 2], leader=3,
                              leader_epoch=0, partition_epoch=0, adding=[], removing=[])]
    assert sorted(c.image.topic("t").partitions) == [0, 1, 2, 3, 4, 5]


def test_create_partitions_uses_the_target_replication_factor_and_live_brokers() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]])
    c.reassign("t", 0, [1, 2])
    c.expire(3)
    result, records = c.do("create_partitions", {"topics": [{"name": "t", "count": 3}]})
    assert result["topics"][0]["error_code"] == NONE
    assert [sorted(r["replicas"]) for r in records] == [[1, 2], [1, 2]]
    c.expire(2)
    result, records = c.do("create_partitions", {"topics": [{"name": "t", "count": 4}]})
    assert (result["topics"][0]["error_code"], records) == (INVALID_REPLICATION_FACTOR, [])


def test_alter_configs() -> None:
    c = Cluster()
    c.start(1)
    tid = c.create("t", 1, 1, configs={"retention.ms": "1000", "cleanup.policy": "delete"})
    result, records = c.do("alter_configs", {"topics": [{"name": "t", "ops": [
        ["retention.ms", "set", "2000"], ["cleanup.policy", "delete", None], ["segment.bytes", "set", 1048576],
        ["never.set", "delete", None]]}]})
    assert result["topics"] == [{"error_code": NONE, "error_message": None, "name": "t"}]
    assert records == [record("TopicConfig", topic_id=tid, key="cleanup.policy", value=None),
                       record("TopicConfig", topic_id=tid, key="retention.ms", value="2000"),
                       record("TopicConfig", topic_id=tid, key="segment.bytes", value="1048576")]
    assert c.image.topic("t").configs == {"retention.ms": "2000", "segment.bytes": "1048576"}
    result, records = c.do("alter_configs", {"topics": [{"name": "t", "ops": [["retention.ms", "set", "2000"]]}]})
    assert (result["topics"][0]["error_code"], records) == (NONE, [])
    result, records = c.do("alter_configs", {"topics": [
        {"name": "t", "ops": [["retention.ms", "set", "later"]]},
        {"name": "t", "ops": [["bogus.x", "set", "1"]]},
        {"name": "nope", "ops": [["retention.ms", "set", "1"]]}]})
    assert [(t["error_code"], t["error_message"]) for t in result["topics"]] == [
        (INVALID_CONFIG, "retention.ms must be an integer, not 'later'"),
        (INVALID_CONFIG, "unknown topic config bogus.x"),
        (UNKNOWN_TOPIC_OR_PARTITION, "topic 'nope' does not exist")]
    assert records == []
    result, records = c.do("alter_configs", {"validate_only": True, "topics": [
        {"name": "t", "ops": [["retention.ms", "set", "5"]]}]})
    assert (result["topics"][0]["error_code"], records) == (NONE, [])
    result, records = c.do("alter_configs", {"topics": [
        {"name": "t", "replace": True, "ops": [["flush.ms", "set", "10"]]}]})
    assert records == [record("TopicConfig", topic_id=tid, key="flush.ms", value="10"),
                       record("TopicConfig", topic_id=tid, key="retention.ms", value=None),
                       record("TopicConfig", topic_id=tid, key="segment.bytes", value=None)]
    assert c.image.topic("t").configs == {"flush.ms": "10"}


def test_alter_configs_append_and_subtract_list_configs() -> None:
    """APPEND adds the values a list config lacks (to its Kafka default when unset),
    SUBTRACT removes those given; on a non-list config both are INVALID_CONFIG and the
    topic's other changes in that request are not applied."""
    c = Cluster()
    c.start(1)
    tid = c.create("t", 1, 1)
    result, records = c.do("alter_configs", {"topics": [{"name": "t", "ops": [
        ["cleanup.policy", "append", "compact"], ["follower.replication.throttled.replicas", "append", "0:1,1:1"]]}]})
    assert result["topics"] == [{"error_code": NONE, "error_message": None, "name": "t"}]
    assert records == [record("TopicConfig", topic_id=tid, key="cleanup.policy", value="delete,compact"),
                       record("TopicConfig", topic_id=tid, key="follower.replication.throttled.replicas",
                              value="0:1,1:1")]
    result, records = c.do("alter_configs", {"topics": [{"name": "t", "ops": [
        ["cleanup.policy", "append", "compact"], ["follower.replication.throttled.replicas", "subtract", "0:1"]]}]})
    assert records == [record("TopicConfig", topic_id=tid, key="follower.replication.throttled.replicas",
                              value="1:1")]
    result, records = c.do("alter_configs", {"topics": [{"name": "t", "ops": [
        ["retention.ms", "set", "1000"], ["retention.ms", "append", "5"]]}]})
    assert [(t["error_code"], t["error_message"]) for t in result["topics"]] == [
        (INVALID_CONFIG, "Can't APPEND to key retention.ms because its type is not LIST.")]
    assert records == []
    assert c.image.topic("t").configs == {"cleanup.policy": "delete,compact",
                                          "follower.replication.throttled.replicas": "1:1"}


def test_a_topic_config_enables_unclean_election_for_later_failures() -> None:
    c = Cluster()
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]])
    c.expire(2)
    c.revive(2)
    c.do("alter_configs", {"topics": [{"name": "t", "ops": [["unclean.leader.election.enable", "set", "true"]]}]})
    assert c.expire(1) == [fence(c, 1), c.change("t", 0, leader=2, isr=[2])]


def test_delete_topics() -> None:
    c = Cluster()
    c.start(1, 2)
    tid = c.create("t", 2, 2)
    c.do("create_topics", {"topics": [{"name": "__internal", "num_partitions": 1, "replication_factor": 1,
                                       "internal": True}]})
    result, records = c.do("delete_topics", {"names": ["t", "t", "nope", "__internal"]})
    assert [(t["name"], t["error_code"]) for t in result["topics"]] == [
        ("t", NONE), ("t", UNKNOWN_TOPIC_OR_PARTITION), ("nope", UNKNOWN_TOPIC_OR_PARTITION),
        ("__internal", INVALID_TOPIC_EXCEPTION)]
    assert records == [record("RemoveTopic", topic_id=tid)]
    assert c.image.topic("t") is None and tid not in c.image.topics
    assert c.image.partition("t", 0) is None
    result, records = c.do("delete_topics", {"names": ["__internal"], "allow_internal": True})
    assert result["topics"][0]["error_code"] == NONE and [r["type"] for r in records] == ["RemoveTopic"]
    assert c.create("t", 1, 1) != tid  # the name is free again, under a new id
    disabled = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, delete_topic_enable=False))
    disabled.start(1)
    disabled.create("t", 1, 1)
    result, records = disabled.do("delete_topics", {"names": ["t", "nope"]})
    assert [t["error_code"] for t in result["topics"]] == [TOPIC_DELETION_DISABLED, TOPIC_DELETION_DISABLED]
    assert records == [] and disabled.image.topic("t") is not None


def test_producer_id_blocks_are_disjoint_and_consecutive() -> None:
    c = Cluster()
    c.start(1, 2)
    blocks = []
    for broker_id in (1, 2, 1):
        result, records = c.do("allocate_producer_ids", {"broker_id": broker_id})
        assert result["error_code"] == NONE and result["length"] == PRODUCER_ID_BLOCK_SIZE
        assert records == [record("ProducerIds", broker_id=broker_id,
                                  next_producer_id=result["start"] + PRODUCER_ID_BLOCK_SIZE)]
        blocks.append(result["start"])
    assert blocks == [0, 1000, 2000]
    successor = QuorumController(MetadataImage.from_bytes(c.image.to_bytes()), c.config, validate_configs,
                                 random.Random(SEED), 0)
    assert successor.allocate_producer_ids({"broker_id": 2})["start"] == 3000


# ---- found bugs, fixed -----------------------------------------------------------------------------------------


def test_cancel_with_no_live_original_replica_keeps_an_isr() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1]])
    c.reassign("t", 0, [1, 2, 3])
    c.alter_isr("t", 0, [1, 2])
    c.expire(1)  # 2, an adding replica, now leads
    assert state(c.p("t")) == ([1, 2, 3], [2], 2, 1, 3)
    c.reassign("t", 0, None)
    # Kafka (PartitionReassignmentRevert) keeps the first original replica as the ISR.
    assert (c.p("t").replicas, c.p("t").isr, c.p("t").leader) == ([1], [1], NO_LEADER)
    c.revive(1)
    assert c.p("t").leader == 1


def test_alter_partition_rejects_a_duplicated_isr_member() -> None:
    c = Cluster()
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]])
    result, records = c.alter_isr("t", 0, [1, 2, 2])
    assert result["error_code"] in (INVALID_REQUEST, INELIGIBLE_REPLICA)
    assert records == [] and c.p("t").isr == [1, 2]


def test_alter_partitions_decides_each_change_as_alter_partition_and_commits_them_together() -> None:
    """A leader's pending ISR changes in one call (Kafka's AlterPartition carries them all):
    each gets the answer `alter_partition` would give it, and the accepted ones are one
    commit's records."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]] * 3)
    c.expire(2)
    c.revive(2)
    assert [c.p("t", i).isr for i in range(3)] == [[1, 3]] * 3

    def change(index: int, **override: Any) -> dict[str, Any]:
        p = c.p("t", index)
        return {"topic_id": c.tid("t"), "partition": index, "leader_epoch": p.leader_epoch,
                "partition_epoch": p.partition_epoch, "isr": [1, 3, 2], **override}

    changes = [change(0), change(1, partition_epoch=0), change(2)]
    result, records = c.do("alter_partitions", {"broker_id": 1, "broker_epoch": 99, "partitions": changes})
    assert result["error_code"] == NONE and records == []
    assert [r["error_code"] for r in result["partitions"]] == [STALE_BROKER_EPOCH] * 3
    result, records = c.do("alter_partitions", {"broker_id": 1, "broker_epoch": c.epochs[1], "partitions": changes})
    assert result["error_code"] == NONE
    assert [r["error_code"] for r in result["partitions"]] == [NONE, INVALID_UPDATE_VERSION, NONE]
    assert [r["isr"] for r in result["partitions"] if r["error_code"] == NONE] == [[1, 3, 2], [1, 3, 2]]
    assert records == [c.change("t", 0, isr=[1, 3, 2]), c.change("t", 2, isr=[1, 3, 2])]
    assert [c.p("t", i).isr for i in range(3)] == [[1, 3, 2], [1, 3], [1, 3, 2]]


def test_create_partitions_rejects_a_different_replication_factor() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2]])
    result, records = c.do("create_partitions", {"topics": [{"name": "t", "count": 2, "assignments": [[3]]}]})
    assert (result["topics"][0]["error_code"], records) == (INVALID_REPLICA_ASSIGNMENT, [])


def test_an_all_fenced_explicit_assignment_does_not_put_fenced_brokers_in_the_isr() -> None:
    c = Cluster()
    c.start(1)
    c.register(2)
    c.register(3)
    result, records = c.do("create_topics", {"topics": [{"name": "t", "assignments": [[2, 3]]}]})
    if result["topics"][0]["error_code"] == NONE:  # if allowed at all, only live brokers may end up in sync
        c.revive(2)
        assert state(c.p("t")) == ([2, 3], [2], 2, 1, 1)
    else:
        assert (result["topics"][0]["error_code"], records) == (INVALID_REPLICA_ASSIGNMENT, [])


# ---- dynamic broker configs (KIP-226) ------------------------------------------------------


def _with_broker_rules(c: Cluster) -> Cluster:
    """The broker's real dynamic-config rules, as build_metadata_service wires them."""
    from cluster.broker.config import DYNAMIC_BROKER_CONFIG_DEFS, validate_dynamic_configs

    c.ctrl.validate_broker_configs = validate_dynamic_configs
    c.ctrl.broker_config_defs = DYNAMIC_BROKER_CONFIG_DEFS
    return c


def _alter_broker(c: Cluster, name: str, ops: list[list[Any]], *, replace: bool = False,
                  validate_only: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    result, records = c.do("alter_broker_configs", {"resources": [{"name": name, "ops": ops, "replace": replace}],
                                                    "validate_only": validate_only})
    assert result["error_code"] == NONE
    (one,) = result["resources"]
    return one, records


def test_dynamic_broker_configs_are_stored_per_resource_and_replayed() -> None:
    c = _with_broker_rules(Cluster())
    one, records = _alter_broker(c, "", [["log.retention.ms", "set", "3600000"], ["message.max.bytes", "set", "2048"]])
    assert one == {"error_code": NONE, "error_message": None, "name": ""}
    assert records == [record("BrokerConfig", resource_name="", key="log.retention.ms", value="3600000"),
                       record("BrokerConfig", resource_name="", key="message.max.bytes", value="2048")]
    _alter_broker(c, "2", [["log.retention.ms", "set", "1000"]])
    assert c.image.broker_configs == {"": {"log.retention.ms": "3600000", "message.max.bytes": "2048"},
                                      "2": {"log.retention.ms": "1000"}}
    # DELETE removes the key; a resource left empty is gone from the image.
    _, records = _alter_broker(c, "2", [["log.retention.ms", "delete", None]])
    assert records == [record("BrokerConfig", resource_name="2", key="log.retention.ms", value=None)]
    assert "2" not in c.image.broker_configs
    # AlterConfigs (replace) keeps only what it names.
    _, records = _alter_broker(c, "", [["log.retention.ms", "set", "5000"]], replace=True)
    assert records == [record("BrokerConfig", resource_name="", key="log.retention.ms", value="5000"),
                       record("BrokerConfig", resource_name="", key="message.max.bytes", value=None)]
    assert c.image.broker_configs == {"": {"log.retention.ms": "5000"}}
    assert not c.image.is_empty


def test_dynamic_broker_config_validate_only_and_unchanged_values_emit_nothing() -> None:
    c = _with_broker_rules(Cluster())
    one, records = _alter_broker(c, "", [["log.retention.ms", "set", "3600000"]], validate_only=True)
    assert (one["error_code"], records, c.image.broker_configs) == (NONE, [], {})
    _alter_broker(c, "", [["log.retention.ms", "set", "3600000"]])
    _, records = _alter_broker(c, "", [["log.retention.ms", "set", "3600000"]])
    assert records == []


def test_dynamic_broker_config_append_and_subtract_on_a_list_config() -> None:
    c = _with_broker_rules(Cluster())
    # The current value, else Kafka's default ("delete"), gains or loses values.
    _, records = _alter_broker(c, "", [["log.cleanup.policy", "append", "compact"]])
    assert records == [record("BrokerConfig", resource_name="", key="log.cleanup.policy", value="delete,compact")]
    _, records = _alter_broker(c, "", [["log.cleanup.policy", "subtract", "delete"]])
    assert records == [record("BrokerConfig", resource_name="", key="log.cleanup.policy", value="compact")]
    one, records = _alter_broker(c, "", [["log.retention.ms", "append", "5"]])
    assert (one["error_code"], records) == (INVALID_CONFIG, [])
    assert one["error_message"] == "Can't APPEND to key log.retention.ms because its type is not LIST."


@pytest.mark.parametrize("name, ops, code, message", [
    ("1", [["node.id", "set", "3"]], INVALID_REQUEST, "Cannot update these configs dynamically: [node.id]"),
    ("", [["log.dirs", "set", "/x"], ["broker.id", "set", "2"], ["log.retention.ms", "set", "1"]], INVALID_REQUEST,
     "Cannot update these configs dynamically: [broker.id, log.dirs]"),
    ("", [["log.retention.hours", "set", "1"]], INVALID_REQUEST,
     "Cannot update these configs dynamically: [log.retention.hours]"),
    ("", [["sasl.jaas.config", "set", "secret-value"]], INVALID_REQUEST,
     "Cannot update these configs dynamically: [sasl.jaas.config]"),
    ("1", [["log.retention.ms", "set", "abc"]], INVALID_REQUEST,
     "Invalid value abc for configuration log.retention.ms: Not a number of type LONG"),
    ("1", [["min.insync.replicas", "set", "0"]], INVALID_REQUEST,
     "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1"),
    ("", [["log.cleaner.min.compaction.lag.ms", "set", "10"], ["log.cleaner.max.compaction.lag.ms", "set", "5"]],
     INVALID_REQUEST, "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (5)"),
    ("", [["no.such.config", "set", "1"]], INVALID_CONFIG,
     "Unknown broker config name(s): no.such.config (use Kafka's broker config names, e.g. log.retention.ms)"),
    ("x", [["log.retention.ms", "set", "1"]], INVALID_REQUEST, "Unable to parse broker name as a base 10 number."),
])
def test_dynamic_broker_config_refusals(name: str, ops: list[list[Any]], code: int, message: str) -> None:
    c = _with_broker_rules(Cluster())
    one, records = _alter_broker(c, name, ops)
    assert (one["error_code"], one["error_message"], records) == (code, message, [])
    assert "secret-value" not in str(one)
    assert c.image.broker_configs == {}


def test_without_broker_rules_every_broker_config_is_read_only() -> None:
    c = Cluster()
    one, records = _alter_broker(c, "", [["log.retention.ms", "set", "1"]])
    assert (one["error_code"], one["error_message"], records) == (
        INVALID_REQUEST, "Cannot update these configs dynamically: [log.retention.ms]", [])


@pytest.mark.parametrize("layers, topic_configs, unclean", [
    ({"": "true"}, None, True),  # the cluster-wide default turns it on without a restart
    ({"": "true"}, {"unclean.leader.election.enable": "false"}, False),  # the topic's own wins
    ({"": "true", "7": "false"}, None, False),  # the controller node's own (node 7) over the default
    ({"": "false", "7": "true"}, None, True),
    ({"": "false", "3": "true"}, None, False),  # another node's value is not the controller's
])
def test_unclean_election_follows_dynamic_broker_configs(layers: dict[str, str], topic_configs: dict[str, str] | None,
                                                         unclean: bool) -> None:
    c = _with_broker_rules(Cluster(ControllerConfig(node_id=7, session_timeout_ms=SESSION_MS)))
    for name, value in layers.items():
        _alter_broker(c, name, [["unclean.leader.election.enable", "set", value]])
    records = _only_an_out_of_sync_replica_alive(c, topic_configs)
    if unclean:
        assert records == [fence(c, 1), c.change("t", 0, leader=2, isr=[2])]
    else:
        assert records == [fence(c, 1), c.change("t", 0, leader=NO_LEADER)]


def test_dynamic_connection_and_cleaner_limits_are_checked_like_their_static_configs() -> None:
    c = _with_broker_rules(Cluster())
    one, _ = _alter_broker(c, "", [["log.cleaner.io.max.bytes.per.second", "set", "0"]])
    assert (one["error_code"], one["error_message"]) == (
        INVALID_REQUEST, "Invalid value 0.0 for configuration log.cleaner.io.max.bytes.per.second: "
                         "Value must be at least 1")
    one, records = _alter_broker(c, "", [["max.connections", "set", "50"], ["log.cleaner.backoff.ms", "set", "100"]])
    assert one["error_code"] == NONE and len(records) == 2
