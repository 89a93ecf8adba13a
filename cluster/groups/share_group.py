"""A share group's membership and assignment (KIP-932), sans-IO: ShareGroupHeartbeat's
answers from the members' subscriptions, the topics' partition counts and the time.

Share groups have no exclusive ownership: the share partitions (cluster/groups/
share_partition.py) decide which records each member gets, so a new assignment takes effect at
once (no revocation step) and a partition may be assigned to several members when there are
more members than partitions. Epochs as Kafka's: a member joins with epoch 0 and a member id it
generated, leaves with -1, and is answered the group's assignment epoch; an epoch above its own
is FENCED_MEMBER_EPOCH, one below accepted only as its previous epoch (a lost answer).

The assignor balances first (members' partition counts differ by at most one, within each
topic when subscriptions differ), then keeps what members held (`assign_share_partitions`),
as Kafka's SimpleAssignor does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cluster.protocol.errors import ErrorCode

SESSION_TIMEOUT_MS_DEFAULT = 45_000  # group.share.session.timeout.ms
HEARTBEAT_INTERVAL_MS_DEFAULT = 5_000  # group.share.heartbeat.interval.ms
GROUP_MAX_SIZE_DEFAULT = 200  # group.share.max.size
MEMBER_ID_MAX_CHARS = 36
SUBSCRIBED_TOPICS_MAX = 10_000

TopicPartition = tuple[str, int]
Assignment = dict[str, tuple[int, ...]]
"""Topic name -> partitions, sorted."""


@dataclass
class ShareMember:
    member_id: str
    member_epoch: int
    previous_epoch: int
    subscribed: tuple[str, ...]
    rack_id: str | None
    client_id: str
    client_host: str
    deadline_ms: int
    assignment: Assignment = field(default_factory=dict)


@dataclass(frozen=True)
class ShareHeartbeatAnswer:
    error: ErrorCode
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None
    """None: unchanged since the member's last answer."""
    message: str | None = None


def _as_assignment(partitions: Iterable[TopicPartition]) -> Assignment:
    out: dict[str, list[int]] = {}
    for topic, index in partitions:
        out.setdefault(topic, []).append(index)
    return {t: tuple(sorted(ps)) for t, ps in sorted(out.items())}


def _pairs(assignment: Mapping[str, Iterable[int]]) -> set[TopicPartition]:
    return {(t, p) for t, ps in assignment.items() for p in ps}


def assign_share_partitions(subscriptions: Mapping[str, Iterable[str]], partitions: Mapping[str, int],
                            previous: Mapping[str, Iterable[TopicPartition]]) -> dict[str, set[TopicPartition]]:
    """Members (id -> subscribed topics) to their share partitions. Topics that do not exist
    (not in `partitions`) are left out. When every member subscribes to the same topics their
    partitions are spread as one set, else topic by topic over the members subscribed to it:
    each partition goes to ceil(members / partitions) members, each member's count differs from
    another's by at most one, and a member keeps what it held (`previous`) where that balance
    allows."""
    subs = {m: sorted({t for t in ts if partitions.get(t, 0) > 0}) for m, ts in subscriptions.items()}
    out: dict[str, set[TopicPartition]] = {m: set() for m in subs}
    held = {m: set(previous.get(m, ())) for m in subs}
    if len({tuple(ts) for ts in subs.values()}) <= 1:
        groups = [(list(subs), [(t, p) for t in next(iter(subs.values()), []) for p in range(partitions[t])])]
    else:
        topics = sorted({t for ts in subs.values() for t in ts})
        groups = [([m for m in subs if t in subs[m]], [(t, p) for p in range(partitions[t])]) for t in topics]
    for members, parts in groups:
        for member, got in _balance(sorted(members), parts, held).items():
            out[member] |= got
    return out


def _balance(members: list[str], parts: list[TopicPartition],
             held: Mapping[str, set[TopicPartition]]) -> dict[str, set[TopicPartition]]:
    if not members or not parts:
        return {m: set() for m in members}
    sharing = math.ceil(len(members) / len(parts))
    total = sharing * len(parts)
    # Quotas that differ by at most one; the larger ones to the members that held more.
    order = sorted(members, key=lambda m: (-len(held.get(m, set()) & set(parts)), m))
    base, extra = divmod(total, len(members))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    got: dict[str, set[TopicPartition]] = {m: set() for m in members}
    holders: dict[TopicPartition, int] = {p: 0 for p in parts}
    for m in order:  # keep what was held, within the quotas and the sharing
        for p in sorted(held.get(m, set()) & set(parts)):
            if len(got[m]) < quota[m] and holders[p] < sharing:
                got[m].add(p)
                holders[p] += 1
    for p in parts:  # the partitions short of members, to the members with the most room
        while holders[p] < sharing:
            room = [m for m in members if len(got[m]) < quota[m] and p not in got[m]]
            if room:
                taker = max(room, key=lambda m: (quota[m] - len(got[m]), m))
                got[taker].add(p)
                holders[p] += 1
            elif not _swap_for(p, members, got, quota):
                break  # no exchange helps either: a slight imbalance, as Kafka accepts
            else:
                holders[p] += 1
    return got


def _swap_for(p: TopicPartition, members: list[str], got: dict[str, set[TopicPartition]],
              quota: Mapping[str, int]) -> bool:
    """Every member with room holds `p` already: one of them (x) takes a partition q from a
    member (y) that does not hold p, and y takes p instead (y's count unchanged, x's +1)."""
    for x in members:
        if len(got[x]) >= quota[x]:
            continue
        for y in members:
            if y == x or p in got[y]:
                continue
            for q in sorted(got[y] - got[x]):
                got[y].discard(q)
                got[y].add(p)
                got[x].add(q)
                return True
    return False


@dataclass
class ShareGroup:
    """One share group at its coordinator (see the module's docstring)."""

    group_id: str
    session_timeout_ms: int = SESSION_TIMEOUT_MS_DEFAULT
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS_DEFAULT
    max_size: int = GROUP_MAX_SIZE_DEFAULT
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    _metadata: tuple[tuple[str, int], ...] = ()
    """The subscribed topics' partition counts the assignment was made for."""
    _target: dict[str, Assignment] = field(default_factory=dict)
    initialized: dict[str, set[int]] = field(default_factory=dict)
    """Topic id -> the partitions whose share state the coordinator initialized
    (cluster/groups/share_group_offsets.py): what a describe of all offsets lists and what
    DeleteGroups deletes."""

    @property
    def state(self) -> str:
        """ShareGroupDescribe's GroupState: Empty or Stable (a share group never rebalances)."""
        return "Stable" if self.members else "Empty"

    def heartbeat(self, member_id: str, member_epoch: int, subscribed: list[str] | None, rack_id: str | None,
                  *, client_id: str, client_host: str, now_ms: int,
                  partitions: Mapping[str, int]) -> ShareHeartbeatAnswer:
        """ShareGroupHeartbeat v1. `partitions`: topic name -> partition count of the topics
        that exist (those the member may read)."""
        if not member_id or len(member_id) > MEMBER_ID_MAX_CHARS:
            return ShareHeartbeatAnswer(ErrorCode.invalid_request, message="MemberId must be 1 to 36 characters")
        if rack_id == "":
            return ShareHeartbeatAnswer(ErrorCode.invalid_request, message="RackId can not be empty")
        if subscribed is not None and len(subscribed) > SUBSCRIBED_TOPICS_MAX:
            return ShareHeartbeatAnswer(ErrorCode.invalid_request,
                                        message=f"at most {SUBSCRIBED_TOPICS_MAX} subscribed topics")
        member = self.members.get(member_id)
        bump = False
        if member_epoch < -1:
            return ShareHeartbeatAnswer(ErrorCode.invalid_request, message=f"MemberEpoch {member_epoch} is invalid")
        if member_epoch == -1:
            if member is None:
                return ShareHeartbeatAnswer(ErrorCode.unknown_member_id, message=f"member {member_id} is not in "
                                            f"group {self.group_id}")
            self.remove(member_id)
            return ShareHeartbeatAnswer(ErrorCode.none, member_id, -1, 0)
        if member_epoch == 0:
            if not subscribed:
                return ShareHeartbeatAnswer(ErrorCode.invalid_request,
                                            message="SubscribedTopicNames must be set in first request")
            if member is None and len(self.members) >= self.max_size:
                return ShareHeartbeatAnswer(ErrorCode.group_max_size_reached,
                                            message=f"the group has reached its maximum size ({self.max_size})")
            if member is None:
                member = self.members[member_id] = ShareMember(member_id, 0, 0, (), rack_id, client_id,
                                                               client_host, 0)
                bump = True
        else:
            if member is None:
                return ShareHeartbeatAnswer(ErrorCode.unknown_member_id,
                                            message=f"member {member_id} is not in group {self.group_id}")
            if member_epoch != member.member_epoch and member_epoch != member.previous_epoch:
                return ShareHeartbeatAnswer(ErrorCode.fenced_member_epoch,
                                            message=f"member epoch {member_epoch}, the group's is "
                                                    f"{member.member_epoch}")
        member.deadline_ms = now_ms + self.session_timeout_ms  # one epoch bump per heartbeat at most
        if rack_id is not None:
            member.rack_id = rack_id
        if subscribed is not None and tuple(sorted(set(subscribed))) != member.subscribed:
            member.subscribed = tuple(sorted(set(subscribed)))
            bump = True
        metadata = tuple(sorted((t, partitions[t]) for t in {t for m in self.members.values() for t in m.subscribed}
                                if t in partitions))
        if metadata != self._metadata:
            self._metadata = metadata
            bump = True
        if bump:
            self.group_epoch += 1
        if self.group_epoch > self.assignment_epoch:
            self._assign(dict(metadata))
        before = member.assignment
        target = self._target.get(member_id, {})
        changed = target != before
        if member.member_epoch != self.assignment_epoch:
            member.previous_epoch, member.member_epoch = member.member_epoch, self.assignment_epoch
        member.assignment = target
        full = member_epoch == 0 or subscribed is not None or changed
        return ShareHeartbeatAnswer(ErrorCode.none, member_id, member.member_epoch, self.heartbeat_interval_ms,
                                    dict(target) if full else None)

    def _assign(self, partitions: Mapping[str, int]) -> None:
        got = assign_share_partitions({m: s.subscribed for m, s in self.members.items()}, partitions,
                                      {m: _pairs(s.assignment) for m, s in self.members.items()})
        self._target = {m: _as_assignment(ps) for m, ps in got.items()}
        self.assignment_epoch = self.group_epoch

    def remove(self, member_id: str) -> None:
        """A member left or its session ran out: the others share its partitions."""
        if self.members.pop(member_id, None) is not None:
            self._target.pop(member_id, None)
            self.group_epoch += 1

    def expire(self, now_ms: int) -> list[str]:
        """Members whose session timed out, removed."""
        gone = [m.member_id for m in self.members.values() if m.deadline_ms <= now_ms]
        for member_id in gone:
            self.remove(member_id)
        return gone

    def next_deadline_ms(self) -> int | None:
        return min((m.deadline_ms for m in self.members.values()), default=None)
