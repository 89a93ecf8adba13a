"""Deterministic tests of the sans-IO group coordinator (cluster/groups/coordinator.py).

Every call gets an explicit `now_ms`; time only moves through `tick(now_ms)`. Nothing
sleeps. Error codes are asserted as the plain Kafka numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from cluster.groups.coordinator import GroupConfig, GroupCoordinator, GroupState, Pending
from cluster.groups.records import replay

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82

DELAY = 300  # group.initial.rebalance.delay.ms used throughout
SESSION = 10_000
REBALANCE = 30_000
PROTOS = [("range", b"meta-range"), ("roundrobin", b"meta-rr")]
G = "g1"


def config(**kw: Any) -> GroupConfig:
    kw.setdefault("initial_rebalance_delay_ms", DELAY)
    return GroupConfig(**kw)


def join(
    c: GroupCoordinator,
    now: int,
    member_id: str = "",
    *,
    group: str = G,
    instance: str | None = None,
    session: int = SESSION,
    rebalance: int = REBALANCE,
    protocols: list[tuple[str, bytes]] | None = None,
    protocol_type: str = "consumer",
    v4: bool = True,
    client_id: str = "client",
) -> Pending:
    return c.join_group(
        group_id=group, member_id=member_id, group_instance_id=instance, protocol_type=protocol_type,
        protocols=PROTOS if protocols is None else protocols, session_timeout_ms=session,
        rebalance_timeout_ms=rebalance, client_id=client_id, client_host="/127.0.0.1",
        require_known_member_id=v4, now_ms=now,
    )


def join_new(c: GroupCoordinator, now: int, **kw: Any) -> tuple[str, Pending]:
    """The v4+ two-step join of a dynamic member: MEMBER_ID_REQUIRED, then the real join."""
    first = join(c, now, **kw)
    assert first.done and first.result["error_code"] == MEMBER_ID_REQUIRED, first.result
    member_id = first.result["member_id"]
    second = join(c, now, member_id, **kw)
    return member_id, second


def sync(c: GroupCoordinator, now: int, member_id: str, generation: int, assignments: dict[str, bytes] | None = None,
         *, group: str = G, instance: str | None = None) -> Pending:
    return c.sync_group(group_id=group, member_id=member_id, generation_id=generation,
                        group_instance_id=instance, assignments=assignments or {}, now_ms=now)


def hb(c: GroupCoordinator, now: int, member_id: str, generation: int, *, group: str = G,
       instance: str | None = None) -> int:
    return int(c.heartbeat(group_id=group, member_id=member_id, generation_id=generation,
                           group_instance_id=instance, now_ms=now)["error_code"])


def commit(c: GroupCoordinator, now: int, member_id: str, generation: int,
           offsets: dict[tuple[str, int], int], *, group: str = G, instance: str | None = None,
           metadata: str | None = "m") -> dict[tuple[str, int], int]:
    return {tp: int(e) for tp, e in c.commit_offsets(
        group_id=group, member_id=member_id, generation_id=generation, group_instance_id=instance,
        offsets=[(t, p, o, 5, metadata) for (t, p), o in offsets.items()], now_ms=now).items()}


def state(c: GroupCoordinator, group: str = G) -> GroupState:
    return c.groups[group].state


@dataclass
class Stable:
    """A group brought to Stable: members in join order, the leader first."""

    coord: GroupCoordinator
    members: list[str]
    generation: int
    now: int
    instances: dict[str, str | None] = field(default_factory=dict)

    @property
    def leader(self) -> str:
        return self.members[0]


def assignment_for(member_id: str) -> bytes:
    return b"assign:" + member_id.encode()


def stable_group(n: int, *, c: GroupCoordinator | None = None, now: int = 0,
                 instances: list[str | None] | None = None, group: str = G) -> Stable:
    """n members join within the initial delay, the delay (and its extensions) elapses, everyone syncs."""
    c = c or GroupCoordinator(config())
    instances = instances or [None] * n
    ids: list[str] = []
    pendings: list[Pending] = []
    for i in range(n):
        if instances[i] is None:
            mid, p = join_new(c, now, group=group, client_id=f"c{i}")
        else:
            p = join(c, now, group=group, instance=instances[i], client_id=f"c{i}")
            mid = ""
        pendings.append(p)
        ids.append(mid)
    assert not any(p.done for p in pendings), [p.result for p in pendings]
    # Kafka's InitialDelayedJoin: joins during the delay extend it once it runs out.
    for _ in range(3):
        now += DELAY
        c.tick(now)
        if all(p.done for p in pendings):
            break
    assert all(p.done for p in pendings)
    results = [p.result for p in pendings]
    assert all(r["error_code"] == NONE for r in results), results
    ids = [r["member_id"] for r in results]
    generation = results[0]["generation_id"]
    leader = results[0]["leader"]
    assert leader == ids[0]
    syncs = [sync(c, now, mid, generation, group=group, instance=instances[i]) for i, mid in enumerate(ids[1:], 1)]
    lp = sync(c, now, leader, generation, {m: assignment_for(m) for m in ids}, group=group, instance=instances[0])
    for mid, p in zip(ids, [lp, *syncs], strict=True):
        assert p.done and p.result["error_code"] == NONE and p.result["assignment"] == assignment_for(mid)
    assert c.groups[group].state is GroupState.STABLE
    return Stable(c, ids, generation, now, dict(zip(ids, instances, strict=True)))


# ---- JoinGroup -------------------------------------------------------------------------------


def test_member_id_required_for_v4_joins() -> None:
    c = GroupCoordinator(config())
    first = join(c, 0)
    assert first.done
    r = first.result
    assert r["error_code"] == MEMBER_ID_REQUIRED
    assert r["member_id"].startswith("client-") and len(r["member_id"]) > len("client-")
    assert r["generation_id"] == -1 and r["members"] == []
    # Only a pending member so far: no rebalance has started.
    assert state(c) is GroupState.EMPTY and c.groups[G].members == {}
    assert c.groups[G].pending_member_ids == {r["member_id"]: SESSION}
    # The second join with that id enters the group and waits for the initial delay.
    second = join(c, 10, r["member_id"])
    assert not second.done
    assert state(c) is GroupState.PREPARING_REBALANCE
    assert list(c.groups[G].members) == [r["member_id"]]
    # A member id the coordinator never handed out is refused.
    bogus = join(c, 20, "client-made-up")
    assert bogus.done and bogus.result["error_code"] == UNKNOWN_MEMBER_ID
    # A member id for a group that does not exist is refused too.
    nogroup = join(c, 20, "client-made-up", group="other")
    assert nogroup.done and nogroup.result["error_code"] == UNKNOWN_MEMBER_ID
    assert "other" not in c.groups


def test_pre_v4_join_gets_member_id_at_once() -> None:
    c = GroupCoordinator(config())
    p = join(c, 0, v4=False)
    assert not p.done
    assert c.groups[G].pending_member_ids == {}
    c.tick(DELAY)
    assert p.done and p.result["error_code"] == NONE
    assert p.result["generation_id"] == 1 and p.result["leader"] == p.result["member_id"]


def test_a_pending_member_id_outlives_the_round_it_was_handed_out_in() -> None:
    """As Kafka's pendingMembers: a round that completes (at its rebalance timeout) without a
    member that got MEMBER_ID_REQUIRED keeps that id pending until its own session timeout,
    so the client's join with it is taken, not sent back for a new id."""
    c = GroupCoordinator(config())
    a, a_join = join_new(c, 0)
    b = join(c, 100, session=60_000)
    assert b.result["error_code"] == MEMBER_ID_REQUIRED
    b_id = b.result["member_id"]
    c.tick(REBALANCE)                       # the round waits for b until the rebalance timeout
    assert a_join.done and a_join.result["error_code"] == NONE and a_join.result["members"]
    assert b_id in c.groups[G].pending_member_ids
    late = join(c, REBALANCE + 1, b_id, session=60_000)
    assert not late.done                    # a new member: a rebalance starts for it
    assert b_id in c.groups[G].members and state(c) is GroupState.PREPARING_REBALANCE


def test_pending_member_expires_after_session_timeout() -> None:
    c = GroupCoordinator(config())
    mid = join(c, 0).result["member_id"]
    assert c.next_deadline_ms() == SESSION
    c.tick(SESSION - 1)
    assert mid in c.groups[G].pending_member_ids
    c.tick(SESSION)
    assert c.groups[G].pending_member_ids == {}
    late = join(c, SESSION + 1, mid)
    assert late.done and late.result["error_code"] == UNKNOWN_MEMBER_ID


def test_initial_delay_then_generation_one_leader_gets_members() -> None:
    c = GroupCoordinator(config())
    m1, p1 = join_new(c, 0, client_id="a")
    m2, p2 = join_new(c, 0, client_id="b", protocols=[("range", b"meta-b"), ("roundrobin", b"rr-b")])
    c.tick(DELAY - 1)
    assert not p1.done and not p2.done
    assert state(c) is GroupState.PREPARING_REBALANCE
    assert c.next_deadline_ms() == DELAY
    c.tick(DELAY)
    assert p1.done and p2.done
    r1, r2 = p1.result, p2.result
    assert r1["error_code"] == r2["error_code"] == NONE
    assert r1["generation_id"] == r2["generation_id"] == 1
    assert r1["leader"] == r2["leader"] == m1
    assert r1["member_id"] == m1 and r2["member_id"] == m2
    assert r1["protocol_name"] == r2["protocol_name"] == "range"
    assert r1["protocol_type"] == "consumer"
    # Only the leader learns the members, with their metadata for the chosen protocol.
    assert r1["members"] == [
        {"member_id": m1, "group_instance_id": None, "metadata": b"meta-range"},
        {"member_id": m2, "group_instance_id": None, "metadata": b"meta-b"},
    ]
    assert r2["members"] == []
    assert state(c) is GroupState.COMPLETING_REBALANCE


def test_late_join_extends_initial_delay() -> None:
    c = GroupCoordinator(config())
    _, p1 = join_new(c, 0)
    _, p2 = join_new(c, 200)  # within the delay: the join phase is extended
    c.tick(DELAY)
    assert not p1.done and not p2.done
    c.tick(200 + DELAY - 1)
    assert not p1.done
    c.tick(200 + DELAY)
    assert p1.done and p2.done and p1.result["generation_id"] == 1
    assert len(p1.result["members"]) == 2


def test_initial_delay_never_exceeds_rebalance_timeout() -> None:
    c = GroupCoordinator(config())
    # rebalance timeout 500: the delay is 300 and the extensions may add at most 200 more.
    _, p1 = join_new(c, 0, rebalance=500)
    _, p2 = join_new(c, 250, rebalance=500)
    _, p3 = join_new(c, 400, rebalance=500)
    deadline = c.groups[G].join_deadline_ms
    assert deadline is not None and DELAY <= deadline <= 500
    c.tick(DELAY - 1)
    assert not p1.done
    c.tick(500)
    assert p1.done and p2.done and p3.done
    assert p1.result["generation_id"] == 1 and len(p1.result["members"]) == 3


def test_join_during_initial_delay_never_shortens_it() -> None:
    """A join pushes the initial delay out (bounded by the rebalance timeout), never earlier.

    First join at 0: delay until 300, capped at 700 (the rebalance timeout). Join at 100:
    the phase now ends at 400. Join at 200: 500, not earlier than the 400 already promised.
    """
    c = GroupCoordinator(config())
    _, p1 = join_new(c, 0, rebalance=700)
    _, p2 = join_new(c, 100, rebalance=700)
    assert c.groups[G].join_deadline_ms == 400
    _, p3 = join_new(c, 200, rebalance=700)
    assert c.groups[G].join_deadline_ms == 500
    c.tick(499)
    assert not p1.done and not p2.done and not p3.done
    c.tick(500)
    assert p1.done and p2.done and p3.done


def test_rebalance_of_stable_group_completes_when_all_rejoined() -> None:
    s = stable_group(2)
    c = s.coord
    now = s.now + 1000
    m3, p3 = join_new(c, now, client_id="late")
    assert state(c) is GroupState.PREPARING_REBALANCE and not p3.done
    # Old members learn about the rebalance through their heartbeats.
    assert hb(c, now, s.members[0], s.generation) == REBALANCE_IN_PROGRESS
    assert hb(c, now, s.members[1], s.generation) == REBALANCE_IN_PROGRESS
    p1 = join(c, now + 1, s.members[0])
    assert not p1.done
    p2 = join(c, now + 2, s.members[1])
    # Everyone is back: no waiting for the rebalance timeout, no initial delay (group not empty).
    assert p1.done and p2.done and p3.done
    assert p1.result["generation_id"] == 2 and p1.result["leader"] == s.leader
    assert [m["member_id"] for m in p1.result["members"]] == [s.members[0], s.members[1], m3]
    assert p2.result["members"] == [] and p3.result["members"] == []


def test_rebalance_timeout_drops_members_that_did_not_rejoin() -> None:
    s = stable_group(2)
    c = s.coord
    now = s.now + 100
    # Member 0 rejoins (the leader's rejoin forces a rebalance); member 1 never does.
    p0 = join(c, now, s.members[0])
    assert not p0.done and state(c) is GroupState.PREPARING_REBALANCE
    hb(c, now + REBALANCE - 1000, s.members[1], s.generation)  # alive, but not rejoining
    c.tick(now + REBALANCE - 1)
    assert not p0.done
    c.tick(now + REBALANCE)
    assert p0.done and p0.result["generation_id"] == 2
    assert list(c.groups[G].members) == [s.members[0]]
    assert hb(c, now + REBALANCE, s.members[1], 2) == UNKNOWN_MEMBER_ID


def test_follower_rejoin_in_stable_with_same_protocols_is_no_rebalance() -> None:
    s = stable_group(2)
    c = s.coord
    p = join(c, s.now + 5, s.members[1])
    assert p.done and p.result["error_code"] == NONE and p.result["generation_id"] == s.generation
    assert state(c) is GroupState.STABLE
    # Changed metadata does force one.
    p = join(c, s.now + 6, s.members[1], protocols=[("range", b"new-subscription")])
    assert not p.done and state(c) is GroupState.PREPARING_REBALANCE


def test_invalid_session_timeout() -> None:
    c = GroupCoordinator(config())
    for session in (0, 5_999, 1_800_001):
        r = join(c, 0, session=session).result
        assert r["error_code"] == INVALID_SESSION_TIMEOUT, (session, r)
    assert join(c, 0, session=6_000).result["error_code"] == MEMBER_ID_REQUIRED
    assert join(c, 0, session=1_800_000).result["error_code"] == MEMBER_ID_REQUIRED
    # The bounds come from group.min/max.session.timeout.ms.
    c2 = GroupCoordinator(config(min_session_timeout_ms=1_000, max_session_timeout_ms=2_000))
    assert join(c2, 0, session=999).result["error_code"] == INVALID_SESSION_TIMEOUT
    assert join(c2, 0, session=2_001).result["error_code"] == INVALID_SESSION_TIMEOUT
    assert join(c2, 0, session=1_000).result["error_code"] == MEMBER_ID_REQUIRED


def test_inconsistent_group_protocol() -> None:
    c = GroupCoordinator(config())
    # No protocols at all, or no protocol type, on an empty group.
    assert join(c, 0, protocols=[]).result["error_code"] == INCONSISTENT_GROUP_PROTOCOL
    assert join(c, 0, protocol_type="").result["error_code"] == INCONSISTENT_GROUP_PROTOCOL
    s = stable_group(1, c=c)
    # Another protocol type, or no protocol in common with the members.
    assert join(c, s.now, protocol_type="connect").result["error_code"] == INCONSISTENT_GROUP_PROTOCOL
    assert join(c, s.now, protocols=[("sticky", b"")]).result["error_code"] == INCONSISTENT_GROUP_PROTOCOL
    # One protocol in common is enough.
    assert join(c, s.now, protocols=[("sticky", b""), ("roundrobin", b"")]).result["error_code"] == MEMBER_ID_REQUIRED
    assert state(c) is GroupState.STABLE


def test_protocol_selection_by_votes() -> None:
    c = GroupCoordinator(config())
    _, p1 = join_new(c, 0, protocols=[("roundrobin", b"a"), ("range", b"a")])
    _, p2 = join_new(c, 0, protocols=[("range", b"b"), ("roundrobin", b"b")])
    _, p3 = join_new(c, 0, protocols=[("roundrobin", b"c"), ("range", b"c")])
    c.tick(DELAY)
    assert p1.result["protocol_name"] == p2.result["protocol_name"] == p3.result["protocol_name"] == "roundrobin"
    assert [m["metadata"] for m in p1.result["members"]] == [b"a", b"b", b"c"]


def test_group_max_size() -> None:
    c = GroupCoordinator(config(max_size=2))
    m1, _ = join_new(c, 0)
    pending = join(c, 0).result  # a pending member id counts towards the size
    assert pending["error_code"] == MEMBER_ID_REQUIRED
    third = join(c, 0)
    assert third.done and third.result["error_code"] == GROUP_MAX_SIZE_REACHED
    assert join(c, 0, v4=False).result["error_code"] == GROUP_MAX_SIZE_REACHED
    second = join(c, 0, pending["member_id"])
    assert not second.done
    c.tick(DELAY)
    assert second.done and second.result["error_code"] == NONE
    assert len(c.groups[G].members) == 2
    assert join(c, DELAY, instance="static-x").result["error_code"] == GROUP_MAX_SIZE_REACHED


# ---- SyncGroup ---------------------------------------------------------------------------------


def test_sync_barrier_waits_for_leader() -> None:
    c = GroupCoordinator(config())
    m1, p1 = join_new(c, 0)
    m2, p2 = join_new(c, 0)
    m3, p3 = join_new(c, 0)
    c.tick(DELAY)
    gen = p1.result["generation_id"]
    s2 = sync(c, DELAY + 1, m2, gen)
    s3 = sync(c, DELAY + 2, m3, gen)
    assert not s2.done and not s3.done
    assert state(c) is GroupState.COMPLETING_REBALANCE
    # Heartbeats while waiting for the assignment are fine.
    assert hb(c, DELAY + 3, m2, gen) == NONE
    s1 = sync(c, DELAY + 4, m1, gen, {m1: b"A1", m2: b"A2"})  # nothing for m3
    assert s1.done and s2.done and s3.done
    assert (s1.result["error_code"], s1.result["assignment"]) == (NONE, b"A1")
    assert (s2.result["error_code"], s2.result["assignment"]) == (NONE, b"A2")
    assert (s3.result["error_code"], s3.result["assignment"]) == (NONE, b"")
    assert s1.result["protocol_name"] == "range" and s1.result["protocol_type"] == "consumer"
    assert state(c) is GroupState.STABLE
    # SyncGroup again in Stable hands out the same assignment at once.
    again = sync(c, DELAY + 5, m2, gen)
    assert again.done and again.result["assignment"] == b"A2"


def test_sync_errors() -> None:
    s = stable_group(2)
    c = s.coord
    assert sync(c, s.now, "nobody", s.generation).result["error_code"] == UNKNOWN_MEMBER_ID
    assert sync(c, s.now, s.members[1], s.generation + 1).result["error_code"] == ILLEGAL_GENERATION
    assert sync(c, s.now, s.members[1], s.generation, group="no-such-group").result["error_code"] == UNKNOWN_MEMBER_ID
    # During PreparingRebalance, SyncGroup of the current generation is refused.
    join_new(c, s.now)
    assert sync(c, s.now, s.members[1], s.generation).result["error_code"] == REBALANCE_IN_PROGRESS


def test_leader_that_never_syncs_is_dropped_after_rebalance_timeout() -> None:
    c = GroupCoordinator(config())
    m1, p1 = join_new(c, 0)
    m2, p2 = join_new(c, 0)
    c.tick(DELAY)
    gen = p1.result["generation_id"]
    s2 = sync(c, DELAY, m2, gen)
    # The leader stays alive (heartbeats are fine in CompletingRebalance) but never syncs.
    for t in range(DELAY + 5000, DELAY + REBALANCE, 5000):
        assert hb(c, t, m1, gen) == NONE
        c.tick(t)
    c.tick(DELAY + REBALANCE - 1)
    assert not s2.done and state(c) is GroupState.COMPLETING_REBALANCE
    c.tick(DELAY + REBALANCE)
    # The leader is gone; the follower waiting for its assignment is told to rejoin.
    assert s2.done and s2.result["error_code"] == REBALANCE_IN_PROGRESS
    assert list(c.groups[G].members) == [m2]
    assert state(c) is GroupState.PREPARING_REBALANCE
    p2b = join(c, DELAY + REBALANCE + 1, m2)
    assert p2b.done and p2b.result["generation_id"] == gen + 1 and p2b.result["leader"] == m2


# ---- Heartbeat, sessions, LeaveGroup -------------------------------------------------------------


def test_heartbeat_errors() -> None:
    s = stable_group(2)
    c = s.coord
    now = s.now + 100
    assert hb(c, now, s.members[1], s.generation) == NONE
    assert hb(c, now, s.members[1], s.generation - 1) == ILLEGAL_GENERATION
    assert hb(c, now, s.members[1], s.generation + 1) == ILLEGAL_GENERATION
    assert hb(c, now, "client-unknown", s.generation) == UNKNOWN_MEMBER_ID
    assert hb(c, now, s.members[1], s.generation, group="nope") == UNKNOWN_MEMBER_ID
    # A new member starts a rebalance: the current generation's heartbeats say so.
    join_new(c, now)
    assert state(c) is GroupState.PREPARING_REBALANCE
    assert hb(c, now, s.members[0], s.generation) == REBALANCE_IN_PROGRESS
    assert hb(c, now, s.members[1], s.generation) == REBALANCE_IN_PROGRESS
    assert hb(c, now, "client-unknown", s.generation) == UNKNOWN_MEMBER_ID


def test_session_expiry_removes_member_and_rebalances() -> None:
    s = stable_group(2)
    c = s.coord
    m1, m2 = s.members
    t = s.now
    # m1 keeps heart-beating every 3 s, m2 falls silent after its sync at t.
    assert c.next_deadline_ms() == t + SESSION
    for k in range(1, 4):
        assert hb(c, t + 3000 * k, m1, s.generation) == NONE
        c.tick(t + 3000 * k)
    assert state(c) is GroupState.STABLE and set(c.groups[G].members) == {m1, m2}
    c.tick(t + SESSION - 1)
    assert m2 in c.groups[G].members
    c.tick(t + SESSION)
    assert list(c.groups[G].members) == [m1]
    assert state(c) is GroupState.PREPARING_REBALANCE
    assert hb(c, t + SESSION, m1, s.generation) == REBALANCE_IN_PROGRESS
    assert hb(c, t + SESSION, m2, s.generation) == UNKNOWN_MEMBER_ID
    p = join(c, t + SESSION + 1, m1)
    assert p.done and p.result["error_code"] == NONE and p.result["generation_id"] == s.generation + 1
    assert p.result["leader"] == m1
    assert [m["member_id"] for m in p.result["members"]] == [m1]


def test_last_member_expiry_empties_group() -> None:
    s = stable_group(1)
    c = s.coord
    c.tick(s.now + SESSION)
    assert state(c) is GroupState.EMPTY
    g = c.groups[G]
    assert g.members == {} and g.generation == s.generation + 1 and g.leader_id is None
    # Only the offsets' retention is left to wait for.
    assert c.next_deadline_ms() == g.state_timestamp_ms + c.config.offsets_retention_ms


def test_leave_group_single_member() -> None:
    s = stable_group(2)
    c = s.coord
    m1, m2 = s.members
    r = c.leave_group(group_id=G, members=[(m2, None)], now_ms=s.now + 1)
    assert r["error_code"] == NONE
    assert r["members"] == [{"member_id": m2, "group_instance_id": None, "error_code": NONE}]
    assert list(c.groups[G].members) == [m1]
    assert state(c) is GroupState.PREPARING_REBALANCE
    r = c.leave_group(group_id=G, members=[(m2, None)], now_ms=s.now + 2)
    assert r["error_code"] == UNKNOWN_MEMBER_ID
    r = c.leave_group(group_id="nope", members=[(m2, None)], now_ms=s.now + 2)
    assert r["error_code"] == UNKNOWN_MEMBER_ID
    # The last member leaves while the rebalance is under way: the group becomes Empty.
    r = c.leave_group(group_id=G, members=[(m1, None)], now_ms=s.now + 3)
    assert r["error_code"] == NONE
    assert state(c) is GroupState.EMPTY and c.groups[G].members == {}
    assert c.groups[G].generation == s.generation + 1


def test_leave_group_resolves_waiting_joins() -> None:
    s = stable_group(2)
    c = s.coord
    m1, m2 = s.members
    p1 = join(c, s.now + 1, m1)  # leader rejoin: rebalance, m2 has not rejoined yet
    assert not p1.done
    c.leave_group(group_id=G, members=[(m2, None)], now_ms=s.now + 2)
    assert p1.done and p1.result["generation_id"] == s.generation + 1
    assert [m["member_id"] for m in p1.result["members"]] == [m1]


def test_batch_leave_v3_with_group_instance_ids() -> None:
    s = stable_group(3, instances=["inst-a", "inst-b", None])
    c = s.coord
    ma, mb, mc = s.members
    r = c.leave_group(group_id=G, members=[
        ("", "inst-a"),          # by instance id alone
        (mb, "inst-b"),          # member id and its own instance id
        ("", "inst-unknown"),    # unknown instance id
        ("client-x", None),      # unknown member id
    ], now_ms=s.now + 1)
    assert r["error_code"] == NONE  # per-member errors in a batch
    assert [(m["member_id"], m["group_instance_id"], m["error_code"]) for m in r["members"]] == [
        ("", "inst-a", NONE),
        (mb, "inst-b", NONE),
        ("", "inst-unknown", UNKNOWN_MEMBER_ID),
        ("client-x", None, UNKNOWN_MEMBER_ID),
    ]
    assert list(c.groups[G].members) == [mc]
    assert c.groups[G].static_members == {}
    assert state(c) is GroupState.PREPARING_REBALANCE


def test_leave_with_wrong_member_id_for_instance_is_fenced() -> None:
    s = stable_group(2, instances=["inst-a", "inst-b"])
    c = s.coord
    r = c.leave_group(group_id=G, members=[(s.members[1], "inst-a")], now_ms=s.now + 1)
    assert r["error_code"] == FENCED_INSTANCE_ID
    assert r["members"][0]["error_code"] == FENCED_INSTANCE_ID
    assert len(c.groups[G].members) == 2 and state(c) is GroupState.STABLE


def test_leave_of_pending_member() -> None:
    c = GroupCoordinator(config())
    mid = join(c, 0).result["member_id"]
    r = c.leave_group(group_id=G, members=[(mid, None)], now_ms=1)
    assert r["error_code"] == NONE
    assert c.groups[G].pending_member_ids == {}


# ---- static membership ---------------------------------------------------------------------------


def test_static_member_rejoin_in_stable_keeps_generation_and_fences_old_id() -> None:
    s = stable_group(2, instances=["inst-a", "inst-b"])
    c = s.coord
    ma, mb = s.members
    now = s.now + 2000
    # inst-b restarts: it joins with an empty member id and its group.instance.id (v5).
    p = join(c, now, instance="inst-b", client_id="c1-restarted")
    assert p.done, "a known static member in a Stable group must not wait for a rebalance"
    r = p.result
    assert r["error_code"] == NONE
    assert r["generation_id"] == s.generation
    new_b = r["member_id"]
    assert new_b != mb and r["leader"] == ma and r["members"] == []
    assert state(c) is GroupState.STABLE and c.groups[G].generation == s.generation
    assert c.groups[G].static_members == {"inst-a": ma, "inst-b": new_b}
    # Its SyncGroup returns the assignment the old incarnation had.
    sp = sync(c, now, new_b, s.generation, instance="inst-b")
    assert sp.done and sp.result["error_code"] == NONE and sp.result["assignment"] == assignment_for(mb)
    # The other member sees no rebalance.
    assert hb(c, now, ma, s.generation, instance="inst-a") == NONE
    assert hb(c, now, new_b, s.generation, instance="inst-b") == NONE
    # The old member id is fenced everywhere.
    assert hb(c, now, mb, s.generation, instance="inst-b") == FENCED_INSTANCE_ID
    assert sync(c, now, mb, s.generation, instance="inst-b").result["error_code"] == FENCED_INSTANCE_ID
    assert commit(c, now, mb, s.generation, {("t", 0): 1}, instance="inst-b") == {("t", 0): FENCED_INSTANCE_ID}
    assert join(c, now, mb, instance="inst-b").result["error_code"] == FENCED_INSTANCE_ID
    assert state(c) is GroupState.STABLE and c.groups[G].generation == s.generation


def test_static_leader_rejoin_keeps_leadership() -> None:
    s = stable_group(2, instances=["inst-a", "inst-b"])
    c = s.coord
    p = join(c, s.now + 1, instance="inst-a")
    assert p.done and p.result["error_code"] == NONE and p.result["generation_id"] == s.generation
    new_a = p.result["member_id"]
    assert c.groups[G].leader_id == new_a == p.result["leader"]
    assert state(c) is GroupState.STABLE


def test_static_member_rejoin_with_new_metadata_rebalances() -> None:
    s = stable_group(2, instances=["inst-a", "inst-b"])
    c = s.coord
    p = join(c, s.now + 1, instance="inst-b", protocols=[("range", b"other-topics")])
    assert not p.done and state(c) is GroupState.PREPARING_REBALANCE
    assert hb(c, s.now + 2, s.members[0], s.generation, instance="inst-a") == REBALANCE_IN_PROGRESS


def test_static_member_survives_until_session_timeout() -> None:
    s = stable_group(2, instances=["inst-a", "inst-b"])
    c = s.coord
    ma, mb = s.members
    # inst-b is gone without LeaveGroup; inst-a heartbeats; inst-b returns within its session.
    for t in range(s.now + 2000, s.now + SESSION, 2000):
        assert hb(c, t, ma, s.generation) == NONE
        c.tick(t)
    assert mb in c.groups[G].members and state(c) is GroupState.STABLE
    p = join(c, s.now + SESSION - 1, instance="inst-b")
    assert p.done and p.result["generation_id"] == s.generation
    assert state(c) is GroupState.STABLE


# ---- offsets -------------------------------------------------------------------------------------


def test_commit_in_stable_and_errors() -> None:
    s = stable_group(2)
    c = s.coord
    m1, m2 = s.members
    now = s.now + 10
    assert commit(c, now, m2, s.generation, {("t", 0): 42, ("t", 1): 7}) == {("t", 0): NONE, ("t", 1): NONE}
    got = c.fetch_offsets(G, [("t", 0), ("t", 1)])
    assert got[("t", 0)] is not None and got[("t", 1)] is not None
    assert (got[("t", 0)].offset, got[("t", 0)].leader_epoch, got[("t", 0)].metadata,
            got[("t", 0)].commit_timestamp_ms) == (42, 5, "m", now)
    assert commit(c, now, m2, s.generation + 1, {("t", 0): 1}) == {("t", 0): ILLEGAL_GENERATION}
    assert commit(c, now, "client-x", s.generation, {("t", 0): 1}) == {("t", 0): UNKNOWN_MEMBER_ID}
    # A simple (generation -1, no member id) commit into a group with members is refused.
    assert commit(c, now, "", -1, {("t", 0): 1}) == {("t", 0): UNKNOWN_MEMBER_ID}
    # None of those changed anything.
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)].offset == 42  # type: ignore[union-attr]
    # Null metadata is stored as "".
    assert commit(c, now, m1, s.generation, {("t", 2): 3}, metadata=None) == {("t", 2): NONE}
    assert c.fetch_offsets(G, [("t", 2)])[("t", 2)].metadata == ""  # type: ignore[union-attr]


def test_commit_during_completing_rebalance_is_refused() -> None:
    s = stable_group(2)
    c = s.coord
    m1, m2 = s.members
    m3, p3 = join_new(c, s.now)
    assert state(c) is GroupState.PREPARING_REBALANCE
    p1, p2 = join(c, s.now, m1), join(c, s.now, m2)
    assert p1.done and p2.done and p3.done
    assert state(c) is GroupState.COMPLETING_REBALANCE
    gen = p1.result["generation_id"]
    assert gen == s.generation + 1
    assert commit(c, s.now, m2, gen, {("t", 0): 5}) == {("t", 0): REBALANCE_IN_PROGRESS}
    assert commit(c, s.now, m3, gen, {("t", 0): 5}) == {("t", 0): REBALANCE_IN_PROGRESS}
    # The previous generation is over.
    assert commit(c, s.now, m2, s.generation, {("t", 0): 5}) == {("t", 0): ILLEGAL_GENERATION}
    assert c.fetch_offsets(G, [("t", 0)]) == {("t", 0): None}
    sync(c, s.now, m1, gen, {})
    assert state(c) is GroupState.STABLE
    assert commit(c, s.now, m2, gen, {("t", 0): 5}) == {("t", 0): NONE}


def test_commit_during_preparing_rebalance_validates_member_and_generation() -> None:
    """Unknown members and old generations are refused whatever the answer for the current
    generation is (an older reading of the protocol said 27; Kafka stores the offsets: see the test below)."""
    s = stable_group(2)
    c = s.coord
    join_new(c, s.now)
    assert state(c) is GroupState.PREPARING_REBALANCE
    assert commit(c, s.now, "client-x", s.generation, {("t", 0): 6}) == {("t", 0): UNKNOWN_MEMBER_ID}
    assert commit(c, s.now, s.members[1], s.generation - 1, {("t", 0): 6}) == {("t", 0): ILLEGAL_GENERATION}
    assert commit(c, s.now, "", -1, {("t", 0): 6}) == {("t", 0): UNKNOWN_MEMBER_ID}
    assert c.fetch_offsets(G, [("t", 0)]) == {("t", 0): None}


def test_commit_during_preparing_rebalance_accepted_like_kafka() -> None:
    """Kafka's GroupCoordinator.handleCommitOffsets: `case Stable | PreparingRebalance => storeOffsets`
    for a known member of the current generation; only CompletingRebalance answers 27.
    Clients commit in their revoke callback / before rejoining (Java onJoinPrepare,
    kafka-python _on_join_prepare, librdkafka on revoke); refusing those commits turns every
    rebalance into re-delivery of the last uncommitted window."""
    s = stable_group(2)
    c = s.coord
    join_new(c, s.now)
    assert state(c) is GroupState.PREPARING_REBALANCE
    assert commit(c, s.now, s.members[1], s.generation, {("t", 0): 5}) == {("t", 0): NONE}
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)].offset == 5  # type: ignore[union-attr]


def test_offset_metadata_too_large() -> None:
    c = GroupCoordinator(config(offset_metadata_max_bytes=10))
    r = commit(c, 0, "", -1, {("t", 0): 1}, metadata="x" * 11)
    assert r == {("t", 0): 12}  # OFFSET_METADATA_TOO_LARGE
    assert commit(c, 0, "", -1, {("t", 0): 1}, metadata="x" * 10) == {("t", 0): NONE}


def test_simple_commits_for_group_without_members() -> None:
    c = GroupCoordinator(config())
    assert commit(c, 5, "", -1, {("t", 0): 10, ("u", 3): 20}) == {("t", 0): NONE, ("u", 3): NONE}
    assert state(c, G) is GroupState.EMPTY and c.groups[G].members == {}
    got = c.fetch_offsets(G, None)
    assert {tp: o.offset for tp, o in got.items()} == {("t", 0): 10, ("u", 3): 20}
    # Overwrite one.
    assert commit(c, 6, "", -1, {("t", 0): 11}) == {("t", 0): NONE}
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)].offset == 11  # type: ignore[union-attr]
    # Offsets of a group that has become Empty can be committed the simple way too.
    s = stable_group(1, c=c, group="g2", now=100)
    c.leave_group(group_id="g2", members=[(s.members[0], None)], now_ms=s.now + 1)
    assert state(c, "g2") is GroupState.EMPTY
    assert commit(c, s.now + 2, "", -1, {("t", 1): 4}, group="g2") == {("t", 1): NONE}


def test_fetch_of_missing_offsets_is_none() -> None:
    c = GroupCoordinator(config())
    assert c.fetch_offsets("no-group", [("t", 0), ("t", 1)]) == {("t", 0): None, ("t", 1): None}
    assert c.fetch_offsets("no-group", None) == {}
    commit(c, 0, "", -1, {("t", 0): 1})
    got = c.fetch_offsets(G, [("t", 0), ("t", 9), ("x", 0)])
    assert got[("t", 0)] is not None and got[("t", 9)] is None and got[("x", 0)] is None


def txn_offsets(c: GroupCoordinator, producer_id: int, offsets: dict[tuple[str, int], int], *, group: str = G,
                now: int = 0) -> None:
    """TxnOffsetCommit without a member, its record appended: pending until the marker."""
    results, staged = c.txn_commit_offsets(group_id=group, member_id="", generation_id=-1, group_instance_id=None,
                                           offsets=[(t, p, o, -1, "") for (t, p), o in offsets.items()], now_ms=now)
    assert set(results.values()) == {NONE}
    c.add_pending(producer_id, group, staged)


def test_transactional_offsets_are_unstable_until_their_marker() -> None:
    """KIP-447: an OffsetFetch with require_stable must not hand out an offset a pending
    transaction is about to replace (Kafka Streams exactly_once_v2 asks so)."""
    c = GroupCoordinator(config())
    commit(c, 0, "", -1, {("t", 0): 5, ("t", 1): 7})
    txn_offsets(c, 42, {("t", 0): 10})
    txn_offsets(c, 43, {("t", 2): 3}, group="other")
    assert c.unstable_offsets(G) == {("t", 0)} and c.unstable_offsets("other") == {("t", 2)}
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)].offset == 5  # type: ignore[union-attr]
    c.complete_txn(42, True, lambda g: True, 1)
    assert c.unstable_offsets(G) == set()
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)].offset == 10  # type: ignore[union-attr]
    c.complete_txn(43, False, lambda g: True, 2)
    assert c.unstable_offsets("other") == set() and c.fetch_offsets("other", None) == {}


def test_pending_offsets_of_an_unloaded_group_are_not_committed_by_a_later_marker() -> None:
    """A coordinator that lost its offsets partition while a transaction was open never sees
    that transaction's marker (it lands at the new coordinator). Its pending offset must go
    with the partition: kept, the next COMMIT marker of the same producer, after the
    partition came back, would commit that old offset over a newer one."""
    c = GroupCoordinator(config())
    txn_offsets(c, 42, {("t", 0): 10})
    txn_offsets(c, 42, {("t", 3): 1}, group="elsewhere")
    assert c.drop_pending(lambda g: g == G) == 1  # G's offsets partition moved away
    assert c.unstable_offsets(G) == set() and c.unstable_offsets("elsewhere") == {("t", 3)}
    # Back here: the group is loaded from the log (offset 20 committed meanwhile), then
    # the producer's next transaction, on another partition, commits.
    commit(c, 5, "", -1, {("t", 0): 20})
    txn_offsets(c, 42, {("t", 1): 4}, now=6)
    c.complete_txn(42, True, lambda g: g == G, 7)
    assert {tp: o.offset for tp, o in c.fetch_offsets(G, None).items()} == {("t", 0): 20, ("t", 1): 4}


def test_simple_group_offsets_expire_after_retention() -> None:
    retention = 60_000
    c = GroupCoordinator(config(offsets_retention_ms=retention))
    commit(c, 1000, "", -1, {("t", 0): 1})
    commit(c, 5000, "", -1, {("t", 1): 2})
    c.take_records()
    c.tick(1000 + retention - 1)
    assert set(c.fetch_offsets(G, None)) == {("t", 0), ("t", 1)}
    c.tick(1000 + retention)
    assert set(c.fetch_offsets(G, None)) == {("t", 1)}
    recs = c.take_records()
    assert len(recs) == 1 and recs[0].value is None and b'"partition":0' in recs[0].key
    c.tick(5000 + retention)
    assert c.fetch_offsets(G, None) == {}
    # With its last offset gone, the empty group itself is deleted.
    assert G not in c.groups
    assert [r.value for r in c.take_records()] == [None, None]  # offset and group tombstones


def test_offset_expiry_is_scheduled() -> None:
    """The driver only calls tick() at next_deadline_ms(); offset retention must be part of it
    (Kafka runs its offsets cleanup every offsets.retention.check.interval.ms)."""
    retention = 60_000
    c = GroupCoordinator(config(offsets_retention_ms=retention))
    commit(c, 1000, "", -1, {("t", 0): 1})
    deadline = c.next_deadline_ms()
    assert deadline is not None and deadline <= 1000 + retention


def test_offsets_of_live_group_do_not_expire() -> None:
    retention = 60_000
    s = stable_group(1, c=GroupCoordinator(config(offsets_retention_ms=retention)))
    c = s.coord
    commit(c, s.now, s.members[0], s.generation, {("t", 0): 9})
    for t in range(s.now + 5000, s.now + 3 * retention, 5000):
        assert hb(c, t, s.members[0], s.generation) == NONE
        c.tick(t)
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)].offset == 9  # type: ignore[union-attr]


def test_consumer_group_offsets_expire_retention_after_group_became_empty() -> None:
    """Kafka (KIP-211): offsets of an Empty consumer group expire once the retention has passed
    since the group became Empty, however old the commit is.

    Here the member committed at t0, stayed alive (heart-beating) for more than the
    retention, then left. Its offsets must survive another full retention period.
    """
    retention = 60_000
    s = stable_group(1, c=GroupCoordinator(config(offsets_retention_ms=retention)))
    c = s.coord
    m = s.members[0]
    commit(c, s.now, m, s.generation, {("t", 0): 9})
    t = s.now
    while t < s.now + 2 * retention:
        t += 5000
        assert hb(c, t, m, s.generation) == NONE
        c.tick(t)
    c.leave_group(group_id=G, members=[(m, None)], now_ms=t)
    assert state(c) is GroupState.EMPTY
    empty_since = t
    c.tick(empty_since + 1)
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)] is not None, "offsets expired right after the group emptied"
    c.tick(empty_since + retention - 1)
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)] is not None
    c.tick(empty_since + retention)
    assert c.fetch_offsets(G, [("t", 0)])[("t", 0)] is None


def test_delete_offsets_of_topic() -> None:
    c = GroupCoordinator(config())
    commit(c, 0, "", -1, {("t", 0): 1, ("u", 0): 2})
    c.take_records()
    c.delete_offsets_of_topic("t")
    assert set(c.fetch_offsets(G, None)) == {("u", 0)}
    assert [r.value for r in c.take_records()] == [None]


# ---- describe / list / delete ----------------------------------------------------------------------


def test_describe_list_delete() -> None:
    c = GroupCoordinator(config())
    d = c.describe("unknown")
    assert d["error_code"] == NONE and d["group_state"] == "Dead" and d["members"] == []
    assert c.delete_group("unknown", 0) == GROUP_ID_NOT_FOUND

    s = stable_group(2, c=c)
    m1, m2 = s.members
    d = c.describe(G)
    assert d["group_state"] == "Stable" and d["protocol_type"] == "consumer" and d["protocol_data"] == "range"
    assert [(m["member_id"], m["client_id"], m["client_host"], m["member_metadata"], m["member_assignment"])
            for m in d["members"]] == [
        (m1, "c0", "/127.0.0.1", b"meta-range", assignment_for(m1)),
        (m2, "c1", "/127.0.0.1", b"meta-range", assignment_for(m2)),
    ]
    commit(c, s.now, "", -1, {("t", 0): 3}, group="simple")
    assert sorted(c.list_groups()) == [(G, "consumer", "Stable", "classic"), ("simple", "", "Empty", "classic")]
    assert c.delete_group(G, s.now) == NON_EMPTY_GROUP

    # While rebalancing, members are listed without metadata or assignment.
    join_new(c, s.now + 1)
    d = c.describe(G)
    assert d["group_state"] == "PreparingRebalance" and d["protocol_data"] == ""
    assert all(m["member_metadata"] == b"" and m["member_assignment"] == b"" for m in d["members"])
    assert c.delete_group(G, s.now + 1) == NON_EMPTY_GROUP

    c.leave_group(group_id=G, members=[(m1, None), (m2, None)], now_ms=s.now + 2)
    # The pending member (MEMBER_ID_REQUIRED step done) joined the group: remove it too.
    for mid in list(c.groups[G].members):
        c.leave_group(group_id=G, members=[(mid, None)], now_ms=s.now + 2)
    assert state(c) is GroupState.EMPTY
    c.take_records()
    assert c.delete_group(G, s.now + 3) == NONE
    assert G not in c.groups
    assert c.describe(G)["group_state"] == "Dead"
    assert c.delete_group(G, s.now + 4) == GROUP_ID_NOT_FOUND
    recs = c.take_records()
    assert [r.value for r in recs] == [None]  # the group tombstone (it had no offsets)

    assert c.delete_group("simple", s.now + 5) == NONE
    recs = c.take_records()
    assert [r.value for r in recs] == [None, None]  # the offset tombstone, then the group's
    assert c.list_groups() == []
    assert c.fetch_offsets("simple", [("t", 0)]) == {("t", 0): None}


# ---- records and replay ------------------------------------------------------------------------------


def _snapshot(c: GroupCoordinator) -> dict[str, Any]:
    out = {}
    for gid, g in c.groups.items():
        out[gid] = {
            "state": g.state,
            "generation": g.generation,
            "protocol_type": g.protocol_type,
            "protocol_name": g.protocol_name,
            "leader": g.leader_id,
            "static": dict(g.static_members),
            "members": [(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                         m.rebalance_timeout_ms, m.protocols, m.assignment) for m in g.members.values()],
            "offsets": {tp: (o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms)
                        for tp, o in g.offsets.items()},
        }
    return out


def test_records_replay_round_trip() -> None:
    c = GroupCoordinator(config())
    log: list[tuple[bytes | None, bytes | None]] = []

    def drain() -> None:
        log.extend((r.key, r.value) for r in c.take_records())

    s = stable_group(2, c=c, instances=["inst-a", None])
    drain()
    ma, mb = s.members
    now = s.now + 100
    assert commit(c, now, mb, s.generation, {("t", 0): 10, ("t", 1): 11}) == {("t", 0): NONE, ("t", 1): NONE}
    assert commit(c, now + 1, ma, s.generation, {("t", 0): 12}, metadata="über") == {("t", 0): NONE}
    drain()
    # A simple group, a deleted group, and a group that became empty.
    commit(c, now, "", -1, {("x", 0): 1}, group="simple")
    commit(c, now, "", -1, {("x", 0): 1}, group="deleted")
    drain()
    assert c.delete_group("deleted", now) == NONE
    drain()
    e = stable_group(1, c=c, group="emptied", now=now)
    commit(c, e.now, e.members[0], e.generation, {("t", 5): 50}, group="emptied")
    c.leave_group(group_id="emptied", members=[(e.members[0], None)], now_ms=e.now + 1)
    drain()
    # Static member rejoin (swap without rebalance) is persisted too.
    p = join(c, now + 2, instance="inst-a")
    assert p.done and p.result["error_code"] == NONE
    drain()

    assert all(isinstance(k, bytes) for k, _ in log)
    before = _snapshot(c)
    assert set(before) == {G, "simple", "emptied"}
    assert before[G]["offsets"] == {("t", 0): (12, 5, "über", now + 1), ("t", 1): (11, 5, "m", now)}

    rebuilt = replay(log, now_ms=999_999)
    c2 = GroupCoordinator(config())
    c2.load(rebuilt)
    after = _snapshot(c2)
    assert after == before
    # Members get a full session from the replay time; the coordinator goes on from there.
    new_a = p.result["member_id"]
    assert all(m.last_heartbeat_ms == 999_999 for m in c2.groups[G].members.values())
    assert hb(c2, 1_000_000, new_a, s.generation, instance="inst-a") == NONE
    assert hb(c2, 1_000_000, ma, s.generation, instance="inst-a") == FENCED_INSTANCE_ID
    assert sync(c2, 1_000_000, mb, s.generation).result["assignment"] == assignment_for(mb)
    assert commit(c2, 1_000_001, mb, s.generation, {("t", 1): 99}) == {("t", 1): NONE}
    c2.tick(999_999 + SESSION - 1)
    assert len(c2.groups[G].members) == 2


def test_replay_keeps_last_value_per_key_and_skips_junk() -> None:
    c = GroupCoordinator(config())
    log: list[tuple[bytes | None, bytes | None]] = []
    commit(c, 1, "", -1, {("t", 0): 1})
    commit(c, 2, "", -1, {("t", 0): 2})
    commit(c, 3, "", -1, {("t", 1): 3})
    log.extend((r.key, r.value) for r in c.take_records())
    c.delete_offsets_of_topic("t")
    commit(c, 4, "", -1, {("t", 1): 4})
    log.extend((r.key, r.value) for r in c.take_records())
    log += [(None, b"x"), (b"not json", b"{}"), (b'{"v": 99, "type": "offset", "group": "g"}', b"{}")]
    groups = replay(log, now_ms=10)
    assert set(groups) == {G}
    assert {tp: o.offset for tp, o in groups[G].offsets.items()} == {("t", 1): 4}
    assert groups[G].state is GroupState.EMPTY


@pytest.mark.parametrize("n", [1, 3])
def test_generation_increments_per_rebalance(n: int) -> None:
    s = stable_group(n)
    c = s.coord
    gen = s.generation
    for round_ in range(3):
        now = s.now + 1000 * (round_ + 1)
        pendings = [join(c, now, m) for m in s.members]
        assert all(p.done for p in pendings)
        assert {p.result["generation_id"] for p in pendings} == {gen + 1}
        gen += 1
        sync(c, now, s.leader, gen, {m: b"x" for m in s.members})
        assert state(c) is GroupState.STABLE and c.groups[G].generation == gen


def test_unloading_a_group_answers_its_waiting_joins_and_syncs_not_coordinator() -> None:
    """The offsets partition moved away: members parked in JoinGroup (a rebalance waiting for
    another member) or in SyncGroup (waiting for the leader's assignment) are answered
    NOT_COORDINATOR (16) at once, as Kafka's onGroupUnloaded does, not left to time out."""
    st = stable_group(1)
    _, b_join = join_new(st.coord, st.now + 1)    # b's join starts a rebalance that waits for a
    assert not b_join.done
    st.coord.unload(G)
    assert b_join.done and b_join.result["error_code"] == 16
    assert G not in st.coord.groups
    c2 = GroupCoordinator(config())
    x, x_join = join_new(c2, 0)
    y, y_join = join_new(c2, 1)
    for now in (DELAY, 2 * DELAY, 3 * DELAY):
        c2.tick(now)
    assert x_join.done and y_join.done
    follower = y if x_join.result["leader"] == x else x
    waiting = sync(c2, 3 * DELAY + 1, follower, x_join.result["generation_id"])
    assert not waiting.done                   # the leader has not sent the assignment yet
    c2.unload(G)
    assert waiting.done and waiting.result["error_code"] == 16
    c2.unload("no-such-group")
