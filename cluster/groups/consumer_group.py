"""KIP-848 consumer groups: the new consumer rebalance protocol, as a sans-IO state machine.

Members heartbeat (ConsumerGroupHeartbeat) with their subscription; the coordinator keeps
a group epoch (bumped by every change of members, subscriptions or subscribed topics),
computes the target assignment with a server-side assignor (assignors.py) for that epoch
and moves each member towards its target on its own heartbeats, as Kafka's
CurrentAssignmentBuilder does:

- a member that owns partitions outside its target must first revoke them: it stays at its
  epoch (UNREVOKED_PARTITIONS) until a heartbeat's owned partitions show them released, or
  its rebalance timeout fences it;
- then it moves to the target epoch and gets the partitions of its target that nobody else
  still owns; those another member has not yet released follow on later heartbeats
  (UNRELEASED_PARTITIONS).

So no partition is ever owned by two members, and no member stops for a rebalance it is
not part of. The classic protocol is in coordinator.py; a group is one or the other, and
the two share committed offsets. No sockets, clocks or sleeps here: `now_ms` comes in.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import re2

from cluster.groups.assignors import ASSIGNORS, UNIFORM, TopicPartitions
from cluster.protocol.errors import ErrorCode

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2  # a static member leaves for a while and keeps its assignment
MAX_REGEX_LENGTH = 1_024  # bound on a subscribed_topic_regex, checked before compiling


class MemberState(Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(frozen=True)
class ConsumerGroupConfig:
    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    assignors: tuple[str, ...] = (UNIFORM, "range")  # group.consumer.assignors; the first is the default
    max_size: int = 2_147_483_647  # group.consumer.max.size


@dataclass
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300_000
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: TopicPartitions = field(default_factory=dict)  # owned now
    revoking: TopicPartitions = field(default_factory=dict)  # owned until the member releases them
    last_heartbeat_ms: int = 0
    revocation_deadline_ms: int | None = None
    static_left: bool = False  # left with epoch -2: the instance id may come back

    def subscribes_to(self, topic: str) -> bool:
        if topic in self.subscribed_topic_names:
            return True
        return self.subscribed_topic_regex is not None and _regex(self.subscribed_topic_regex).fullmatch(topic) is not None


@dataclass
class ConsumerGroupState:
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, TopicPartitions] = field(default_factory=dict)  # member id → target assignment
    # What the target was computed from: subscribed topic → (topic id, partition count).
    topics: dict[str, tuple[str, int]] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id → member id

    def state_name(self) -> str:
        """Kafka's ConsumerGroupState names, as DescribeGroups and ListGroups report them."""
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        if any(m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE
               for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def subscribed_topics(self, existing: Mapping[str, Any]) -> set[str]:
        """The existing topics some member subscribes to: names looked up, and only a
        regex walks every topic name (once per distinct regex)."""
        names = {t for m in self.members.values() for t in m.subscribed_topic_names if t in existing}
        for pattern in {m.subscribed_topic_regex for m in self.members.values() if m.subscribed_topic_regex}:
            compiled = _regex(pattern)
            names.update(t for t in existing if compiled.fullmatch(t) is not None)
        return names


# Subscribed regexes are RE2, as Kafka's (RE2/J): linear time in the topic name whatever a
# client sends, so no pattern can stall the coordinator (Python's `re` backtracks).
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_REGEX_CACHE: dict[str, Any] = {}


def _regex(pattern: str) -> Any:
    """The compiled pattern; raises re2.error when it is not a valid RE2 expression."""
    compiled = _REGEX_CACHE.get(pattern)
    if compiled is None:
        if len(_REGEX_CACHE) > 1_000:
            _REGEX_CACHE.clear()
        compiled = _REGEX_CACHE[pattern] = re2.compile(pattern, _RE2_OPTIONS)
    return compiled


def _copy(tps: Mapping[str, set[int]]) -> TopicPartitions:
    return {t: set(ps) for t, ps in tps.items() if ps}


def _minus(a: Mapping[str, set[int]], b: Mapping[str, set[int]]) -> TopicPartitions:
    return {t: ps - b.get(t, set()) for t, ps in a.items() if ps - b.get(t, set())}


def _intersect(a: Mapping[str, set[int]], b: Mapping[str, set[int]]) -> TopicPartitions:
    return {t: ps & b.get(t, set()) for t, ps in a.items() if ps & b.get(t, set())}


def _overlaps(a: Mapping[str, set[int]], b: Mapping[str, set[int]]) -> bool:
    return any(ps & b.get(t, set()) for t, ps in a.items())


@dataclass
class HeartbeatRequest:
    """ConsumerGroupHeartbeat's fields; None (or -1 for the timeout) means unchanged."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: TopicPartitions | None = None  # the member's partitions, by topic name
    client_id: str = ""
    client_host: str = ""
    member_id_from_client: bool = True  # v1+: the consumer makes its own member id (KIP-1082)


def _fail(code: int, message: str, member_id: str = "", epoch: int = -1) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "member_id": member_id, "member_epoch": epoch,
            "assignment": None}


def validate(req: HeartbeatRequest, config: ConsumerGroupConfig) -> dict[str, Any] | None:
    """Kafka's request checks; an answer when the request is refused."""
    if not req.group_id:
        return _fail(ErrorCode.invalid_request, "GroupId can't be empty.")
    if req.member_epoch != JOIN_EPOCH or req.member_id_from_client:
        if not req.member_id:
            return _fail(ErrorCode.invalid_request, "MemberId can't be empty.")
    if req.member_epoch == JOIN_EPOCH:
        if req.rebalance_timeout_ms == -1:
            return _fail(ErrorCode.invalid_request, "RebalanceTimeoutMs must be provided in first request.")
        if req.owned is None or any(req.owned.values()):
            return _fail(ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining.")
        if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
            return _fail(ErrorCode.invalid_request,
                         "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
    elif req.member_epoch < STATIC_LEAVE_EPOCH:
        return _fail(ErrorCode.invalid_request, f"MemberEpoch {req.member_epoch} is invalid.")
    elif req.member_epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
        return _fail(ErrorCode.invalid_request, "InstanceId can't be null when leaving with epoch -2.")
    if req.server_assignor is not None and req.server_assignor not in config.assignors:
        return _fail(ErrorCode.unsupported_assignor,
                     f"ServerAssignor {req.server_assignor} is not supported. "
                     f"Supported assignors: {', '.join(config.assignors)}.")
    if req.subscribed_topic_regex is not None:
        if len(req.subscribed_topic_regex) > MAX_REGEX_LENGTH:
            return _fail(ErrorCode.invalid_regular_expression,
                         f"SubscribedTopicRegex is longer than {MAX_REGEX_LENGTH} characters.")
        try:
            _regex(req.subscribed_topic_regex)
        except re2.error as exc:
            reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            return _fail(ErrorCode.invalid_regular_expression, f"SubscribedTopicRegex is invalid: {reason}")
    return None


class ConsumerGroupCoordinator:
    """The KIP-848 rules over one group's `ConsumerGroupState`; the caller owns the
    groups, persists a group whenever a call says it changed, and drives time."""

    def __init__(self, config: ConsumerGroupConfig | None = None) -> None:
        self.config = config or ConsumerGroupConfig()

    # ---- heartbeat -------------------------------------------------------------------

    def heartbeat(self, group: ConsumerGroupState, req: HeartbeatRequest, topics: Mapping[str, tuple[str, int]],
                  now_ms: int) -> tuple[dict[str, Any], bool]:
        """(answer, whether the group changed). `topics`: every topic a member may subscribe
        to → (topic id, partition count)."""
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, req, now_ms)
        changed = False
        if req.member_epoch == JOIN_EPOCH:
            joined = self._join(group, req, now_ms)
            if isinstance(joined, dict):
                return joined, False
            member = joined
            changed = True
        else:
            member_or_error = self._known_member(group, req)
            if isinstance(member_or_error, dict):
                return member_or_error, False
            member = member_or_error
        member.last_heartbeat_ms = now_ms
        if req.client_id:
            member.client_id = req.client_id
        if req.client_host:
            member.client_host = req.client_host
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.rack_id is not None and req.rack_id != member.rack_id:
            member.rack_id = req.rack_id
            changed = True
        if req.server_assignor is not None and req.server_assignor != member.server_assignor:
            member.server_assignor = req.server_assignor
            group.group_epoch += 1
            changed = True
        names = None if req.subscribed_topic_names is None else tuple(sorted(set(req.subscribed_topic_names)))
        if names is not None and names != member.subscribed_topic_names:
            member.subscribed_topic_names = names
            group.group_epoch += 1
            changed = True
        if req.subscribed_topic_regex is not None and req.subscribed_topic_regex != (member.subscribed_topic_regex or ""):
            member.subscribed_topic_regex = req.subscribed_topic_regex or None
            group.group_epoch += 1
            changed = True
        changed |= self.refresh_topics(group, topics)
        changed |= self._maybe_assign(group)
        before = _copy(member.assigned)
        changed |= self._reconcile(group, member, req.owned, now_ms)
        full = req.member_epoch == JOIN_EPOCH or (
            req.rebalance_timeout_ms != -1 and req.subscribed_topic_names is not None and req.owned is not None)
        answer = {"error_code": ErrorCode.none, "error_message": None, "member_id": member.member_id,
                  "member_epoch": member.member_epoch, "heartbeat_interval_ms": self.config.heartbeat_interval_ms,
                  "assignment": _copy(member.assigned) if full or before != member.assigned else None}
        return answer, changed

    def _join(self, group: ConsumerGroupState, req: HeartbeatRequest, now_ms: int) -> ConsumerMember | dict[str, Any]:
        member_id = req.member_id or str(uuid.uuid4())
        if req.instance_id is not None and req.instance_id in group.static_members:
            old_id = group.static_members[req.instance_id]
            old = group.members[old_id]
            if not old.static_left and old_id != member_id:
                return _fail(ErrorCode.unreleased_instance_id,
                             f"Static member {old_id} with instance id {req.instance_id} is not released yet.",
                             member_id)
            # The instance comes back: the new member id takes over its epoch and assignment.
            del group.members[old_id]
            member = ConsumerMember(member_id, req.instance_id, old.rack_id, old.client_id, old.client_host,
                                    old.rebalance_timeout_ms, old.subscribed_topic_names, old.subscribed_topic_regex,
                                    old.server_assignor, old.member_epoch, old.previous_member_epoch, old.state,
                                    old.assigned, old.revoking, now_ms, old.revocation_deadline_ms)
            group.members[member_id] = member
            group.static_members[req.instance_id] = member_id
            if old_id in group.target:
                group.target[member_id] = group.target.pop(old_id)
            return member
        if member_id in group.members:
            # A member that lost its epoch (fenced) rejoins under its id: it starts over.
            self._remove(group, member_id)
        elif len(group.members) >= self.config.max_size:
            return _fail(ErrorCode.group_max_size_reached,
                         f"The consumer group has reached its maximum capacity of {self.config.max_size} members.",
                         member_id)
        member = ConsumerMember(member_id, req.instance_id, last_heartbeat_ms=now_ms)
        group.members[member_id] = member
        if req.instance_id is not None:
            group.static_members[req.instance_id] = member_id
        group.group_epoch += 1
        return member

    def _known_member(self, group: ConsumerGroupState, req: HeartbeatRequest) -> ConsumerMember | dict[str, Any]:
        member = group.members.get(req.member_id)
        if member is None:
            return _fail(ErrorCode.unknown_member_id,
                         f"Member {req.member_id} is not a member of group {req.group_id}.", req.member_id)
        if req.member_epoch > member.member_epoch:
            return _fail(ErrorCode.fenced_member_epoch,
                         f"The consumer group member has a greater member epoch ({req.member_epoch}) than the "
                         f"one known by the group coordinator ({member.member_epoch}). The member must abandon "
                         "all its partitions and rejoin.", req.member_id)
        if req.member_epoch < member.member_epoch:
            # Kafka accepts the previous epoch from a member whose last answer was lost, if it
            # owns no more than what it was given.
            if req.member_epoch != member.previous_member_epoch or req.owned is None \
                    or _minus(req.owned, member.assigned):
                return _fail(ErrorCode.fenced_member_epoch,
                             f"The consumer group member has a smaller member epoch ({req.member_epoch}) than the "
                             f"one known by the group coordinator ({member.member_epoch}). The member must "
                             "abandon all its partitions and rejoin.", req.member_id)
        return member

    def _leave(self, group: ConsumerGroupState, req: HeartbeatRequest, now_ms: int) -> tuple[dict[str, Any], bool]:
        member = group.members.get(req.member_id)
        if member is None and req.instance_id is not None:
            known = group.static_members.get(req.instance_id)
            member = group.members.get(known) if known is not None else None
        if member is None:
            return _fail(ErrorCode.unknown_member_id,
                         f"Member {req.member_id} is not a member of group {req.group_id}.", req.member_id), False
        answer = {"error_code": ErrorCode.none, "error_message": None, "member_id": req.member_id,
                  "member_epoch": req.member_epoch, "heartbeat_interval_ms": 0, "assignment": None}
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            member.static_left = True  # its partitions wait for it until its session ends
            member.last_heartbeat_ms = now_ms
            return answer, True
        self._remove(group, member.member_id)
        return answer, True

    def _remove(self, group: ConsumerGroupState, member_id: str) -> None:
        member = group.members.pop(member_id, None)
        if member is None:
            return
        group.target.pop(member_id, None)
        if member.instance_id is not None and group.static_members.get(member.instance_id) == member_id:
            del group.static_members[member.instance_id]
        group.group_epoch += 1

    # ---- assignment ------------------------------------------------------------------

    def refresh_topics(self, group: ConsumerGroupState, topics: Mapping[str, tuple[str, int]]) -> bool:
        """Bump the group epoch when a subscribed topic appeared, went or changed."""
        wanted = {t: topics[t] for t in group.subscribed_topics(topics)}
        if wanted == group.topics:
            return False
        group.topics = wanted
        group.group_epoch += 1
        return True

    def assignor_of(self, group: ConsumerGroupState) -> str:
        """The assignor most members ask for (ties by name); the configured default else."""
        votes: dict[str, int] = {}
        for m in group.members.values():
            if m.server_assignor is not None:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if not votes:
            return self.config.assignors[0]
        return max(sorted(votes), key=lambda name: votes[name])

    def _maybe_assign(self, group: ConsumerGroupState) -> bool:
        # Every change of members bumps the group epoch, so an assignment of the current
        # epoch covers exactly the members there are.
        if group.group_epoch <= group.assignment_epoch:
            return False
        counts = {t: n for t, (_, n) in group.topics.items()}
        subscriptions = {mid: frozenset(t for t in counts if m.subscribes_to(t)) for mid, m in group.members.items()}
        group.target = ASSIGNORS[self.assignor_of(group)](subscriptions, counts, group.target)
        for mid in group.members:
            group.target.setdefault(mid, {})
        group.assignment_epoch = group.group_epoch
        return True

    def _owners(self, group: ConsumerGroupState) -> dict[tuple[str, int], str]:
        owners: dict[tuple[str, int], str] = {}
        for mid, m in group.members.items():
            for tps in (m.assigned, m.revoking):
                for t, ps in tps.items():
                    for p in ps:
                        owners[(t, p)] = mid
        return owners

    def _reconcile(self, group: ConsumerGroupState, member: ConsumerMember, owned: TopicPartitions | None,
                   now_ms: int) -> bool:
        """Move the member one step towards its target (Kafka's CurrentAssignmentBuilder)."""
        target = group.target.get(member.member_id, {})
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or _overlaps(owned, member.revoking):
                return False  # still waiting for the member to release them
            member.revoking = {}
            member.revocation_deadline_ms = None
        elif member.member_epoch == group.assignment_epoch and member.state is MemberState.STABLE:
            return False
        before = (member.member_epoch, member.state, _copy(member.assigned), _copy(member.revoking))
        keep = _intersect(member.assigned, target)
        revoke = _minus(member.assigned, target)
        if revoke:
            member.assigned = keep
            member.revoking = revoke
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
        else:
            owners = self._owners(group)
            unreleased = False
            for t, ps in target.items():
                for p in ps:
                    owner = owners.get((t, p))
                    if owner is None or owner == member.member_id:
                        keep.setdefault(t, set()).add(p)
                    else:
                        unreleased = True
            member.assigned = keep
            if member.member_epoch != group.assignment_epoch:
                member.previous_member_epoch = member.member_epoch
                member.member_epoch = group.assignment_epoch
            member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
        return before != (member.member_epoch, member.state, member.assigned, member.revoking)

    # ---- time ------------------------------------------------------------------------

    def next_deadline_ms(self, group: ConsumerGroupState) -> int | None:
        deadlines = [m.last_heartbeat_ms + self.config.session_timeout_ms for m in group.members.values()]
        deadlines += [m.revocation_deadline_ms for m in group.members.values() if m.revocation_deadline_ms is not None]
        return min(deadlines) if deadlines else None

    def expire(self, group: ConsumerGroupState, now_ms: int) -> bool:
        """Members whose session ended, or who did not revoke within their rebalance
        timeout, leave (their partitions go to others). Whether any left."""
        gone = [mid for mid, m in group.members.items()
                if now_ms >= m.last_heartbeat_ms + self.config.session_timeout_ms
                or (m.revocation_deadline_ms is not None and now_ms >= m.revocation_deadline_ms)]
        for mid in gone:
            self._remove(group, mid)
        return bool(gone)

    def offset_commit_error(self, group: ConsumerGroupState, member_id: str, member_epoch: int) -> int:
        """OffsetCommit of a member: Kafka answers STALE_MEMBER_EPOCH for any epoch but the
        member's own."""
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none


# ---- persistence (the value of a group's record in `__consumer_offsets`) ----------------

def _tps_doc(tps: Mapping[str, set[int]]) -> dict[str, list[int]]:
    return {t: sorted(ps) for t, ps in sorted(tps.items()) if ps}


def _tps(doc: Mapping[str, list[int]]) -> TopicPartitions:
    return {t: {int(p) for p in ps} for t, ps in doc.items()}


def to_doc(group: ConsumerGroupState) -> dict[str, Any]:
    return {
        "group_epoch": group.group_epoch, "assignment_epoch": group.assignment_epoch,
        "topics": {t: [tid, n] for t, (tid, n) in sorted(group.topics.items())},
        "members": [
            {"member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
             "client_id": m.client_id, "client_host": m.client_host,
             "rebalance_timeout_ms": m.rebalance_timeout_ms, "subscribed_topic_names": list(m.subscribed_topic_names),
             "subscribed_topic_regex": m.subscribed_topic_regex, "server_assignor": m.server_assignor,
             "member_epoch": m.member_epoch, "previous_member_epoch": m.previous_member_epoch,
             "state": m.state.value, "assigned": _tps_doc(m.assigned), "revoking": _tps_doc(m.revoking),
             "target": _tps_doc(group.target.get(m.member_id, {})), "static_left": m.static_left}
            for m in group.members.values()
        ],
    }


def from_doc(doc: Mapping[str, Any], now_ms: int) -> ConsumerGroupState:
    """A group as a new coordinator adopts it: every member gets a full session (and a
    full rebalance timeout to revoke) from now."""
    group = ConsumerGroupState(int(doc["group_epoch"]), int(doc["assignment_epoch"]))
    group.topics = {t: (str(v[0]), int(v[1])) for t, v in doc["topics"].items()}
    for m in doc["members"]:
        member = ConsumerMember(
            m["member_id"], m["instance_id"], m["rack_id"], m["client_id"], m["client_host"],
            int(m["rebalance_timeout_ms"]), tuple(m["subscribed_topic_names"]), m["subscribed_topic_regex"],
            m["server_assignor"], int(m["member_epoch"]), int(m["previous_member_epoch"]), MemberState(m["state"]),
            _tps(m["assigned"]), _tps(m["revoking"]), now_ms, static_left=bool(m["static_left"]))
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
        group.members[member.member_id] = member
        group.target[member.member_id] = _tps(m["target"])
        if member.instance_id is not None:
            group.static_members[member.instance_id] = member.member_id
    return group
