"""Share group membership and assignment (cluster/groups/share_group.py, KIP-932): epochs as
Kafka's coordinator checks them, assignments that take effect at once, partitions shared when
members outnumber them, balance and stickiness of the assignor over seeded random groups."""

from __future__ import annotations

import math
import random

import pytest

from cluster.groups.share_group import ShareGroup, assign_share_partitions
from cluster.protocol.errors import ErrorCode

TOPICS = {"jobs": 4, "mail": 2}


def beat(g: ShareGroup, member: str, epoch: int, subscribed: list[str] | None = None, now_ms: int = 0,
         partitions: dict[str, int] | None = None):  # noqa: ANN201 - the answer
    return g.heartbeat(member, epoch, subscribed, None, client_id="c", client_host="/127.0.0.1", now_ms=now_ms,
                       partitions=TOPICS if partitions is None else partitions)


def test_members_join_share_partitions_and_leave() -> None:
    g = ShareGroup("q")
    a = beat(g, "a" * 22, 0, ["jobs"])
    assert (a.error, a.member_epoch, a.heartbeat_interval_ms, a.assignment) == (ErrorCode.none, 1, 5000,
                                                                             {"jobs": (0, 1, 2, 3)})
    assert g.state == "Stable"
    b = beat(g, "b" * 22, 0, ["jobs"])
    assert b.error == ErrorCode.none and b.member_epoch == 2
    # The first member learns its new (smaller) assignment at its next heartbeat, no revocation step.
    a2 = beat(g, "a" * 22, 1)
    assert a2.member_epoch == 2 and a2.assignment is not None and b.assignment is not None
    assert sorted(a2.assignment["jobs"] + b.assignment["jobs"]) == [0, 1, 2, 3]
    assert len(a2.assignment["jobs"]) == 2 and set(a2.assignment["jobs"]) <= {0, 1, 2, 3}
    assert beat(g, "a" * 22, 2).assignment is None  # nothing changed: no assignment sent
    # Leaving: the other takes everything at its next heartbeat.
    left = beat(g, "b" * 22, -1)
    assert (left.error, left.member_epoch) == (ErrorCode.none, -1)
    again = beat(g, "a" * 22, 2)
    assert again.assignment == {"jobs": (0, 1, 2, 3)} and again.member_epoch == 3
    assert beat(g, "a" * 22, -1).error == ErrorCode.none and g.state == "Empty"


def test_epochs_and_requests_are_checked_as_kafka_checks_them() -> None:
    g = ShareGroup("q", max_size=2)
    assert beat(g, "m1", 0).error == ErrorCode.invalid_request               # first request without topics
    assert beat(g, "", 0, ["jobs"]).error == ErrorCode.invalid_request        # no member id
    assert beat(g, "x" * 37, 0, ["jobs"]).error == ErrorCode.invalid_request  # longer than 36
    assert beat(g, "m1", 3).error == ErrorCode.unknown_member_id
    assert beat(g, "m1", -2, ["jobs"]).error == ErrorCode.invalid_request
    assert beat(g, "m1", -1).error == ErrorCode.unknown_member_id
    assert beat(g, "m1", 0, ["jobs"]).member_epoch == 1
    assert beat(g, "m2", 0, ["jobs"]).member_epoch == 2
    assert beat(g, "m3", 0, ["jobs"]).error == ErrorCode.group_max_size_reached
    assert beat(g, "m1", 5).error == ErrorCode.fenced_member_epoch
    assert beat(g, "m1", 1).member_epoch == 2   # its previous epoch: a lost answer, accepted
    assert beat(g, "m1", 0, ["jobs"]).error == ErrorCode.none  # rejoining under its id
    assert g.heartbeat("m1", 2, None, "", client_id="c", client_host="h", now_ms=0,
                       partitions=TOPICS).error == ErrorCode.invalid_request  # an empty rack


def test_sessions_time_out_and_new_partitions_reach_members() -> None:
    g = ShareGroup("q", session_timeout_ms=45_000)
    beat(g, "a", 0, ["jobs", "mail"], now_ms=0)
    b = beat(g, "b", 0, ["mail"], now_ms=10_000)
    assert b.assignment == {"mail": (1,)} or b.assignment == {"mail": (0,)}
    assert g.expire(44_999) == [] and g.expire(45_000) == ["a"]
    assert beat(g, "b", b.member_epoch, now_ms=46_000).assignment == {"mail": (0, 1)}
    # A topic grows: the next heartbeat brings the new partition.
    grown = beat(g, "b", g.members["b"].member_epoch, now_ms=47_000, partitions={"jobs": 4, "mail": 3})
    assert grown.assignment == {"mail": (0, 1, 2)}
    assert g.next_deadline_ms() == 47_000 + 45_000


@pytest.mark.parametrize(("members", "partitions", "counts", "sharing"), [
    (3, 1, [1, 1, 1], 3),        # every member reads the one partition
    (3, 2, [2, 1, 1], 2),        # each partition read by two members
    (4, 6, [2, 2, 1, 1], 1),
    (2, 4, [2, 2], 1),
])
def test_the_assignor_balances_and_shares(members: int, partitions: int, counts: list[int], sharing: int) -> None:
    got = assign_share_partitions({f"m{i}": ["t"] for i in range(members)}, {"t": partitions}, {})
    assert sorted((len(v) for v in got.values()), reverse=True) == counts
    holders = [sum(1 for v in got.values() if ("t", p) in v) for p in range(partitions)]
    assert holders == [sharing] * partitions


def test_the_assignor_is_sticky_and_balanced_over_seeded_groups() -> None:
    """Seeded random membership changes (40 seeds of 25 steps): every partition has ceil(M/P)
    members in a homogeneous group, counts differ by at most one, and while partitions are not
    shared a member that stays keeps all it held when its count need not shrink."""
    for seed in range(40):
        rng = random.Random(seed)
        parts = {"t": rng.randint(1, 12), "u": rng.randint(1, 6)}
        members: list[str] = []
        held: dict[str, set[tuple[str, int]]] = {}
        for _ in range(25):
            if members and rng.random() < 0.4:
                members.remove(rng.choice(members))
            else:
                members.append(f"m{rng.randint(0, 10**6)}")
            members = sorted(set(members))
            got = assign_share_partitions({m: ["t", "u"] for m in members}, parts, held)
            if not members:
                continue
            total = sum(parts.values())
            sharing = math.ceil(len(members) / total)
            all_parts = [(t, p) for t, n in parts.items() for p in range(n)]
            assert all(sum(1 for v in got.values() if tp in v) == sharing for tp in all_parts), seed
            sizes = [len(v) for v in got.values()]
            assert max(sizes) - min(sizes) <= 1, (seed, sizes)
            for m in members:  # stickiness: sure while partitions are not shared (else best effort)
                alone = m in held and not any(held[m] & v for o, v in held.items() if o != m)
                if sharing == 1 and alone and len(held[m]) <= len(got[m]):
                    assert held[m] <= got[m], (seed, m, held[m], got[m])
            held = {m: set(v) for m, v in got.items()}


def test_members_with_different_subscriptions_are_balanced_topic_by_topic() -> None:
    got = assign_share_partitions({"a": ["t", "u"], "b": ["t"], "c": ["u", "missing"]}, {"t": 4, "u": 2}, {})
    assert {p for t, p in got["a"] | got["b"] if t == "t"} == {0, 1, 2, 3}
    assert not any(t == "u" for t, _ in got["b"]) and not any(t == "t" for t, _ in got["c"])
    assert sorted(len([tp for tp in got[m] if tp[0] == "u"]) for m in ("a", "c")) == [1, 1]
