"""KIP-848 consumer groups, sans-IO: the reconciliation rules, the assignors, persistence.

Simulated members follow the protocol as librdkafka does: they take the assignment an
answer carries and report what they own on later heartbeats. The invariant checked after
every step is the protocol's promise: no partition is ever owned by two members.
"""

from __future__ import annotations

import os
import random

import orjson
import pytest

from cluster.groups.assignors import range_assignor, uniform_assignor
from cluster.groups.consumer_group import (
    ConsumerGroupConfig,
    ConsumerGroupCoordinator,
    ConsumerGroupState,
    HeartbeatRequest,
    MemberState,
    from_doc,
    to_doc,
    validate,
)
from cluster.groups.coordinator import GroupCoordinator
from cluster.groups.records import replay
from cluster.protocol.errors import ErrorCode

TOPICS = {"a": ("id-a", 6), "b": ("id-b", 4)}
SESSION_MS = 10_000


class Member:
    """A consumer as the protocol sees it: its id, epoch and owned partitions."""

    def __init__(self, member_id: str, topics: tuple[str, ...] = ("a",), assignor: str | None = None) -> None:
        self.member_id = member_id
        self.topics = topics
        self.assignor = assignor
        self.epoch = 0
        self.owned: dict[str, set[int]] = {}
        # Partitions taken away by the last answer: a real consumer still works on them
        # (revoke callback, commit) until it sends its next heartbeat, the acknowledgement.
        self.releasing: set[tuple[str, int]] = set()

    def request(self, group_id: str = "g", **extra: object) -> HeartbeatRequest:
        self.releasing = set()
        if self.epoch == 0:
            return HeartbeatRequest(group_id, self.member_id, 0, rebalance_timeout_ms=30_000,
                                    subscribed_topic_names=self.topics, server_assignor=self.assignor, owned={},
                                    **extra)  # type: ignore[arg-type]
        return HeartbeatRequest(group_id, self.member_id, self.epoch, owned={t: set(ps) for t, ps in self.owned.items()},
                                **extra)  # type: ignore[arg-type]

    def take(self, answer: dict[str, object]) -> None:
        assert answer["error_code"] == ErrorCode.none, answer
        self.epoch = int(answer["member_epoch"])  # type: ignore[call-overload]
        if answer["assignment"] is not None:
            new = {t: set(ps) for t, ps in answer["assignment"].items()}  # type: ignore[attr-defined]
            self.releasing |= {(t, p) for t, ps in self.owned.items() for p in ps if p not in new.get(t, set())}
            self.owned = new


def beat(coord: ConsumerGroupCoordinator, group: ConsumerGroupState, m: Member, now_ms: int = 0,
         topics: dict[str, tuple[str, int]] | None = None) -> dict[str, object]:
    answer, _ = coord.heartbeat(group, m.request(), topics or TOPICS, now_ms)
    m.take(answer)
    return answer


def owners_disjoint(members: list[Member]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for m in members:
        for t, p in {(t, p) for t, ps in m.owned.items() for p in ps} | m.releasing:
            assert (t, p) not in seen, f"{t}-{p} owned by {seen[(t, p)]} and {m.member_id}"
            seen[(t, p)] = m.member_id


def total(m: Member) -> int:
    return sum(len(ps) for ps in m.owned.values())


def settle(coord: ConsumerGroupCoordinator, group: ConsumerGroupState, members: list[Member], rounds: int = 6,
           now_ms: int = 0) -> None:
    for _ in range(rounds):
        for m in members:
            beat(coord, group, m, now_ms)
            owners_disjoint(members)


def test_two_members_split_with_revocation_before_handover() -> None:
    coord = ConsumerGroupCoordinator(ConsumerGroupConfig(session_timeout_ms=SESSION_MS))
    group = ConsumerGroupState()
    a, b = Member("A"), Member("B")
    beat(coord, group, a)
    assert a.owned == {"a": set(range(6))} and group.state_name() == "Stable"
    beat(coord, group, b)
    # B's target is half of A's partitions, which A still owns: B gets nothing yet.
    assert total(b) == 0 and group.members["B"].state is MemberState.UNRELEASED_PARTITIONS
    assert group.state_name() == "Reconciling"
    beat(coord, group, a)  # A is told to give up three: its epoch stays until it has
    assert total(a) == 3 and group.members["A"].state is MemberState.UNREVOKED_PARTITIONS
    assert a.epoch < group.assignment_epoch
    beat(coord, group, b)
    assert total(b) == 0, "handed over before A released it"
    beat(coord, group, a)  # A reports it owns three now: revocation done
    assert a.epoch == group.assignment_epoch and group.members["A"].state is MemberState.STABLE
    beat(coord, group, b)
    assert total(b) == 3 and b.epoch == group.assignment_epoch
    owners_disjoint([a, b])
    assert group.state_name() == "Stable"


def test_member_epoch_rules() -> None:
    coord = ConsumerGroupCoordinator()
    group = ConsumerGroupState()
    a = Member("A")
    beat(coord, group, a)
    epoch = a.epoch
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "A", epoch + 1, owned={}), TOPICS, 0)
    assert answer["error_code"] == ErrorCode.fenced_member_epoch
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "nobody", 3, owned={}), TOPICS, 0)
    assert answer["error_code"] == ErrorCode.unknown_member_id
    b = Member("B")
    beat(coord, group, b)
    beat(coord, group, a)
    beat(coord, group, a)  # A revoked and moved to the new epoch
    assert a.epoch > epoch
    # A's previous epoch is accepted once (its answer may have been lost) if it owns no more
    # than it was given; with a partition it no longer has, it is fenced.
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "A", epoch, owned=a.owned), TOPICS, 0)
    assert answer["error_code"] == ErrorCode.none and answer["member_epoch"] == a.epoch
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "A", epoch, owned={"a": set(range(6))}), TOPICS, 0)
    assert answer["error_code"] == ErrorCode.fenced_member_epoch
    assert coord.offset_commit_error(group, "A", a.epoch) == ErrorCode.none
    assert coord.offset_commit_error(group, "A", a.epoch - 1) == ErrorCode.stale_member_epoch
    assert coord.offset_commit_error(group, "X", 1) == ErrorCode.unknown_member_id


def test_request_validation_answers_as_kafka() -> None:
    config = ConsumerGroupConfig()
    cases = [
        (HeartbeatRequest("", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("a",), owned={}),
         ErrorCode.invalid_request),
        (HeartbeatRequest("g", "", 0, rebalance_timeout_ms=1, subscribed_topic_names=("a",), owned={}),
         ErrorCode.invalid_request),
        (HeartbeatRequest("g", "m", 0, subscribed_topic_names=("a",), owned={}), ErrorCode.invalid_request),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, owned={}), ErrorCode.invalid_request),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("a",)),
         ErrorCode.invalid_request),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("a",), owned={},
                          server_assignor="sticky"), ErrorCode.unsupported_assignor),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_regex="a[", owned={}),
         ErrorCode.invalid_regular_expression),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_regex="a" * 2000, owned={}),
         ErrorCode.invalid_regular_expression),
        (HeartbeatRequest("g", "m", -3), ErrorCode.invalid_request),
    ]
    for req, code in cases:
        refused = validate(req, config)
        assert refused is not None and refused["error_code"] == code, (req, refused)
        assert refused["error_message"]
    # v0: the coordinator makes the member id of a joining member.
    ok = HeartbeatRequest("g", "", 0, rebalance_timeout_ms=1, subscribed_topic_names=("a",), owned={},
                          member_id_from_client=False)
    assert validate(ok, config) is None


def test_session_expiry_and_revocation_timeout_free_partitions() -> None:
    coord = ConsumerGroupCoordinator(ConsumerGroupConfig(session_timeout_ms=SESSION_MS))
    group = ConsumerGroupState()
    a, b = Member("A"), Member("B")
    beat(coord, group, a, 0)
    beat(coord, group, b, 0)
    assert coord.next_deadline_ms(group) == SESSION_MS
    beat(coord, group, a, 1_000)  # A must revoke: 30 s rebalance timeout from now
    assert group.members["A"].revocation_deadline_ms == 31_000
    assert not coord.expire(group, 10_500) or "B" not in group.members
    # B's session ended at 10 s (last heartbeat 0); A's at 11 s.
    coord2 = ConsumerGroupCoordinator(ConsumerGroupConfig(session_timeout_ms=60_000))
    g2 = ConsumerGroupState()
    x, y = Member("X"), Member("Y")
    beat(coord2, g2, x, 0)
    beat(coord2, g2, y, 0)
    beat(coord2, g2, x, 0)
    assert g2.members["X"].state is MemberState.UNREVOKED_PARTITIONS
    assert coord2.expire(g2, 30_000)  # X never revoked within its rebalance timeout: it leaves
    assert "X" not in g2.members
    beat(coord2, g2, y, 30_001)
    assert total(y) == 6


def test_static_member_leaves_and_comes_back_with_its_assignment() -> None:
    coord = ConsumerGroupCoordinator(ConsumerGroupConfig(session_timeout_ms=SESSION_MS))
    group = ConsumerGroupState()
    a = Member("A")
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "A", 0, instance_id="i1", rebalance_timeout_ms=1000,
                                                        subscribed_topic_names=("a",), owned={}), TOPICS, 0)
    a.take(answer)
    b = Member("B")
    beat(coord, group, b)
    settle(coord, group, [a, b])
    owned_before = {t: set(ps) for t, ps in a.owned.items()}
    epoch_before = group.group_epoch
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "A", -2, instance_id="i1"), TOPICS, 100)
    assert answer["error_code"] == ErrorCode.none and answer["member_epoch"] == -2
    # Another process with the same instance id while the first has not left: refused.
    busy = ConsumerGroupState()
    coord.heartbeat(busy, HeartbeatRequest("g", "P", 0, instance_id="i9", rebalance_timeout_ms=1,
                                           subscribed_topic_names=("a",), owned={}), TOPICS, 0)
    refused, _ = coord.heartbeat(busy, HeartbeatRequest("g", "Q", 0, instance_id="i9", rebalance_timeout_ms=1,
                                                        subscribed_topic_names=("a",), owned={}), TOPICS, 0)
    assert refused["error_code"] == ErrorCode.unreleased_instance_id
    # The instance comes back under a new member id: same partitions, no group epoch bump.
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "A2", 0, instance_id="i1", rebalance_timeout_ms=1000,
                                                        subscribed_topic_names=("a",), owned={}), TOPICS, 200)
    assert answer["error_code"] == ErrorCode.none
    assert answer["assignment"] == owned_before and group.group_epoch == epoch_before


def test_new_partitions_bump_the_group_epoch_and_are_assigned() -> None:
    coord = ConsumerGroupCoordinator()
    group = ConsumerGroupState()
    a, b = Member("A"), Member("B")
    settle(coord, group, [a, b])
    epoch = group.group_epoch
    grown = {"a": ("id-a", 10)}
    for _ in range(4):
        for m in (a, b):
            beat(coord, group, m, topics=grown)
            owners_disjoint([a, b])
    assert group.group_epoch == epoch + 1
    assert sorted(p for m in (a, b) for p in m.owned.get("a", ())) == list(range(10))
    assert total(a) == total(b) == 5


def test_regex_subscription() -> None:
    coord = ConsumerGroupCoordinator()
    group = ConsumerGroupState()
    topics = {"orders-eu": ("1", 2), "orders-us": ("2", 2), "payments": ("3", 2)}
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "A", 0, rebalance_timeout_ms=1,
                                                        subscribed_topic_regex="orders-.*", owned={}), topics, 0)
    assert answer["assignment"] == {"orders-eu": {0, 1}, "orders-us": {0, 1}}


def test_a_backtracking_regex_cannot_stall_the_coordinator() -> None:
    """RE2, as Kafka: `(a+)+b` against a 240-character name is linear, where Python's `re`
    would take longer than the universe's age; an empty regex is no regex (librdkafka sends
    it with every subscription)."""
    import time

    coord = ConsumerGroupCoordinator()
    group = ConsumerGroupState()
    topics = {"a" * 240: ("1", 1), "ab": ("2", 1)}
    started = time.monotonic()
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "A", 0, rebalance_timeout_ms=1,
                                                        subscribed_topic_regex="(a+)+b", owned={}), topics, 0)
    assert time.monotonic() - started < 1.0
    assert answer["assignment"] == {"ab": {0}}
    answer, _ = coord.heartbeat(group, HeartbeatRequest("g", "B", 0, rebalance_timeout_ms=1,
                                                        subscribed_topic_names=("ab",), subscribed_topic_regex="",
                                                        owned={}), topics, 0)
    assert answer["error_code"] == ErrorCode.none and group.members["B"].subscribed_topic_regex is None
    refused = validate(HeartbeatRequest("g", "C", 0, rebalance_timeout_ms=1, subscribed_topic_regex="(a)\\1",
                                        owned={}), ConsumerGroupConfig())
    assert refused is not None and refused["error_code"] == ErrorCode.invalid_regular_expression
    assert "invalid escape" in refused["error_message"]


class _Unlistable(dict):  # type: ignore[type-arg]
    """Topics that may be looked up but not walked: a heartbeat by names must not list the
    cluster's topics (10,000 topics x every member's heartbeat)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("a heartbeat walked every topic")

    def keys(self):  # type: ignore[no-untyped-def]
        raise AssertionError("a heartbeat walked every topic")

    def items(self):  # type: ignore[no-untyped-def]
        raise AssertionError("a heartbeat walked every topic")


def test_heartbeats_by_name_look_topics_up_without_walking_them() -> None:
    coord = ConsumerGroupCoordinator()
    group = ConsumerGroupState()
    topics = _Unlistable({f"t{i}": (str(i), 2) for i in range(1000)})
    a, b = Member("A", ("t7", "t9")), Member("B", ("t9",))
    for m in (a, b, a, b, a, b):
        beat(coord, group, m, topics=topics)
    assert sorted((t, p) for m in (a, b) for t, ps in m.owned.items() for p in ps) == [
        ("t7", 0), ("t7", 1), ("t9", 0), ("t9", 1)]


def test_group_state_survives_a_coordinator_move() -> None:
    """Persisted in __consumer_offsets and replayed: members keep ids, epochs, partitions."""
    coordinator = GroupCoordinator(consumer_config=ConsumerGroupConfig(session_timeout_ms=SESSION_MS))
    a, b = Member("A"), Member("B")
    for m in (a, b, a, b, a, b):
        m.take(coordinator.consumer_group_heartbeat(m.request(), TOPICS, 0))
    records = coordinator.take_records()
    assert records, "nothing persisted"
    moved = GroupCoordinator(consumer_config=ConsumerGroupConfig(session_timeout_ms=SESSION_MS))
    moved.load(replay([(r.key, r.value) for r in records], 5_000))
    group = moved.consumer_group("g")
    assert group is not None and set(group.members) == {"A", "B"}
    assert group.members["A"].last_heartbeat_ms == 5_000  # a full session from the move
    for m in (a, b):
        answer = moved.consumer_group_heartbeat(m.request(), TOPICS, 5_000)
        assert answer["error_code"] == ErrorCode.none and answer["member_epoch"] == m.epoch
    assert to_doc(from_doc(orjson.loads(orjson.dumps(to_doc(group))), 0)) == to_doc(group)


def test_a_group_is_classic_or_consumer() -> None:
    coordinator = GroupCoordinator()
    a = Member("A")
    a.take(coordinator.consumer_group_heartbeat(a.request(), TOPICS, 0))
    joined = coordinator.join_group(group_id="g", member_id="", group_instance_id=None, protocol_type="consumer",
                                    protocols=[("range", b"")], session_timeout_ms=10_000,
                                    rebalance_timeout_ms=10_000, client_id="c", client_host="h",
                                    require_known_member_id=False, now_ms=0)
    assert joined.result["error_code"] == ErrorCode.group_id_not_found
    coordinator.join_group(group_id="classic", member_id="", group_instance_id=None, protocol_type="consumer",
                           protocols=[("range", b"")], session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                           client_id="c", client_host="h", require_known_member_id=False, now_ms=0)
    refused = coordinator.consumer_group_heartbeat(Member("B").request("classic"), TOPICS, 0)
    assert refused["error_code"] == ErrorCode.group_id_not_found
    assert sorted((g, t) for g, _, _, t in coordinator.list_groups()) == [("classic", "classic"), ("g", "consumer")]
    assert coordinator.delete_group("g", 0) == ErrorCode.non_empty_group


# ---- assignors ------------------------------------------------------------------------


def test_range_assignor_gives_contiguous_ranges_per_topic() -> None:
    subs = {"m1": frozenset({"a", "b"}), "m2": frozenset({"a", "b"}), "m3": frozenset({"b"})}
    target = range_assignor(subs, {"a": 5, "b": 4}, {})
    assert target == {"m1": {"a": {0, 1, 2}, "b": {0, 1}}, "m2": {"a": {3, 4}, "b": {2}}, "m3": {"b": {3}}}


def test_uniform_assignor_balances_and_sticks() -> None:
    subs = {f"m{i}": frozenset({"a", "b"}) for i in range(3)}
    first = uniform_assignor(subs, {"a": 6, "b": 4}, {})
    assert sorted(sum(len(ps) for ps in t.values()) for t in first.values()) == [3, 3, 4]
    grown = dict(subs, m3=frozenset({"a", "b"}))
    second = uniform_assignor(grown, {"a": 6, "b": 4}, first)
    assert sorted(sum(len(ps) for ps in t.values()) for t in second.values()) == [2, 2, 3, 3]
    moved = sum(len(ps - second[m].get(t, set())) for m, tgt in first.items() for t, ps in tgt.items())
    assert moved == sum(len(ps) for ps in second["m3"].values()) == 2, "more moved than the new member needs"
    # Different subscriptions: balanced where subscriptions allow.
    hetero = {"x": frozenset({"a"}), "y": frozenset({"a", "b"}), "z": frozenset({"b"})}
    t = uniform_assignor(hetero, {"a": 6, "b": 6}, {})
    counts = {m: sum(len(ps) for ps in tp.values()) for m, tp in t.items()}
    assert counts == {"x": 4, "y": 4, "z": 4}, t
    assert t["x"].keys() <= {"a"} and t["z"].keys() <= {"b"}


# ---- a seeded simulation --------------------------------------------------------------


@pytest.mark.parametrize("seed", [int(os.environ.get("KIP848_SEED", 0)) or s for s in (11, 23, 47)])
def test_random_membership_changes_never_share_a_partition(seed: int) -> None:
    print(f"seed={seed} (replay: KIP848_SEED={seed})")
    rng = random.Random(seed)
    coord = ConsumerGroupCoordinator(ConsumerGroupConfig(session_timeout_ms=SESSION_MS))
    group = ConsumerGroupState()
    live: list[Member] = []
    now = 0
    for step in range(400):
        now += rng.randrange(1, 200)
        roll = rng.random()
        if roll < 0.08 and len(live) < 8:
            live.append(Member(f"m{step}", rng.choice([("a",), ("a", "b"), ("b",)]),
                               rng.choice([None, "uniform", "range"])))
        elif roll < 0.12 and live:
            gone = live.pop(rng.randrange(len(live)))
            coord.heartbeat(group, HeartbeatRequest("g", gone.member_id, -1), TOPICS, now)
        elif live:
            beat(coord, group, rng.choice(live), now)
        owners_disjoint(live)
    settle(coord, group, live, now_ms=now)
    assert group.state_name() in ("Stable", "Empty"), group.state_name()
    assert all(m.epoch == group.assignment_epoch for m in live)
    want = {(t, p) for t in {t for m in live for t in m.topics} for p in range(TOPICS[t][1])}
    assert {(t, p) for m in live for t, ps in m.owned.items() for p in ps} == want
