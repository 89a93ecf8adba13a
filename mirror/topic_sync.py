"""What the source says about a mirrored topic beside its batches, followed into the target by
a flow of mirror topics (issue 31; docs/design.md, "Mirror topics keep offsets"): the
committed offsets of chosen consumer groups, the start offsets of chosen share groups, and the
topic's ACLs.

- **Group offsets** (flow key `mirror_groups`, a regex of source group ids; config
  `group.offset.sync.ms`, default 10 s): copied 1:1, since a mirror topic keeps the source's
  offsets, for the partitions of the flow's mirror topics only (a renamed target maps through
  the flow's rename), and only while the group has no members in the target (its state there
  Empty, or no group at all): a group live in the target is its own, never overwritten (the
  target's coordinator refuses a member-less commit into a group with members anyway). An
  offset beyond what the mirror partition holds is held back and tried again next round, so a
  consumer that moves over never starts past the copy. The mirror's own groups (`dcmirror.*`)
  never follow.
- **Share-group start offsets** (KIP-932; the same `mirror_groups` regex and interval): each
  matching source share group's share-partition start offset (SPSO, DescribeShareGroupOffsets)
  of the mirrored partitions is set in the target (AlterShareGroupOffsets) while the share
  group has no members there, never beyond what the mirror partition holds (held back as
  committed offsets are), and never below the target's own start unless the source moved
  back since this worker last saw it (an AlterShareGroupOffsets at the source): a share group
  that moves over after a failover delivers again what the source had accepted or held above
  the start (at least once, as after a crash), nothing below it, and skips nothing.
- **ACLs** (config `acl.sync.ms`, default 10 s; 0: off): each source TOPIC binding that applies
  to a mirrored topic (literal with its name or "*", prefixed with a prefix of it) is created
  in the target as a literal binding on the target topic's name, its principal mapped through
  `acl_principal_map`. The mirror owns, on a mirror topic, the bindings of the principals it
  mirrors (the map's values, the principals the source's bindings name now, and those of any
  binding this worker made sure of since it started): those the source no longer implies are
  deleted. Bindings of other principals (an operator's in the target) and every binding that
  is not a literal one on a mirror topic's name are never touched. A source (or target)
  without an authorizer is said once in the log and skipped.

Sans-IO core: `select_groups`, `plan_group_offsets`, `plan_share_offsets`, `mirrored_acls` and
`plan_acls` take what the two clusters answered and return what to do. `TopicSync` is the trio
driver a TopicMirrorWorker runs beside its copy: every round asks both Admins, plans, applies.

Several workers of a flow run at once; the sync runs only in the one holding partition 0 of
the flow's first mirrored topic (by source name), so two workers do not race each other with
answers of different ages. What it does is idempotent (the same plan twice changes nothing),
so the moment of a rebalance when two believe they hold it costs nothing but a round.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import trio

from cluster.client.admin import LATEST, Admin, AdminError, SharePartitionOffset
from cluster.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.protocol.errors import ErrorCode
from cluster.security.acl import AclBinding, AclFilter, PatternType, ResourceType
from topology.model import MirrorSpec

log = logging.getLogger("dcmirror.mirror.topic_sync")

TopicPartition = tuple[str, int]
T = TypeVar("T")
RETRIABLE = (KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError)
DEFAULT_SYNC_MS = 10_000
GROUPS_PER_ROUND_MAX = 1000  # source groups one round looks at (the first by name)
HELD_BACK_SHOWN_MAX = 20  # held-back partitions listed in the status
SHARE_PARTITIONS_PER_CALL_MAX = 10_000  # share partitions one Describe/AlterShareGroupOffsets names (the broker's limit)
ROUND_TIMEOUT_S = 120.0
OWN_GROUP_PREFIX = "dcmirror."  # the flows' own groups: never copied
# A target group in one of these states, without members, takes the source's offsets
# ("" and Dead: no such group).
IDLE_GROUP_STATES = frozenset({"Empty", "Dead", ""})
# Answers that mean "no ACLs here to read or write": said once, then skipped.
NO_ACLS_CODES = frozenset({ErrorCode.security_disabled, ErrorCode.cluster_authorization_failed})


@dataclass(frozen=True)
class SyncSettings:
    groups: str | None = None
    """Regex matched against whole source group ids (None: no group follows)."""
    principal_map: Mapping[str, str] = field(default_factory=dict)
    group_offset_sync_ms: int = DEFAULT_SYNC_MS
    acl_sync_ms: int = DEFAULT_SYNC_MS

    @classmethod
    def from_flow(cls, flow: MirrorSpec, *, reverse: bool = False) -> SyncSettings:
        """A flow's mirror_groups, acl_principal_map and config group.offset.sync.ms /
        acl.sync.ms; `reverse` (copying from the flow's target back into its source) maps the
        principals the other way."""
        principals = dict(flow.acl_principal_map)
        if reverse:
            principals = {v: k for k, v in principals.items()}
        return cls(flow.mirror_groups, principals,
                   int(flow.config.get("group.offset.sync.ms", DEFAULT_SYNC_MS)),
                   int(flow.config.get("acl.sync.ms", DEFAULT_SYNC_MS)))


def sync_owner(topics: Mapping[str, str]) -> TopicPartition | None:
    """The source partition whose holder runs the sync: partition 0 of the first mirrored
    topic by name (None: no topic is mirrored yet)."""
    return (min(topics), 0) if topics else None


# ---- group offsets ---------------------------------------------------------------------


def select_groups(listed: Iterable[str], pattern: str | None) -> list[str]:
    """The source groups whose offsets follow: `pattern` matches the whole id, the mirror's own
    groups excluded; at most GROUPS_PER_ROUND_MAX, by name."""
    if pattern is None:
        return []
    rx = re.compile(pattern)
    chosen = sorted(g for g in set(listed) if not g.startswith(OWN_GROUP_PREFIX) and rx.fullmatch(g))
    return chosen[:GROUPS_PER_ROUND_MAX]


@dataclass(frozen=True)
class TargetGroup:
    """What the target's coordinator says of a group (DescribeGroups)."""

    state: str
    members: int

    @property
    def live(self) -> bool:
        return self.members > 0 or self.state not in IDLE_GROUP_STATES


NO_GROUP = TargetGroup("Dead", 0)


@dataclass(frozen=True)
class GroupOffsetPlan:
    group: str
    commit: dict[TopicPartition, int]
    """Target partition -> the source's committed offset, where the target has another."""
    held_back: dict[TopicPartition, str]
    """Target partitions not written this round, and why (tried again next round)."""
    unchanged: int
    """Partitions whose target offset already equals the source's."""
    live: bool
    """The group has members in the target: nothing of it is written."""


def plan_group_offsets(group: str, source_committed: Mapping[TopicPartition, int], topics: Mapping[str, str],
                       target_group: TargetGroup, target_committed: Mapping[TopicPartition, int],
                       target_log_ends: Mapping[TopicPartition, int]) -> GroupOffsetPlan:
    """One group's offsets to commit in the target. `source_committed` is the source's
    OffsetFetch (source partition -> offset), `topics` source topic -> mirror topic,
    `target_committed` and `target_log_ends` by target partition (a partition missing from
    `target_log_ends` does not exist in the target yet)."""
    if target_group.live:
        return GroupOffsetPlan(group, {}, {}, 0, True)
    commit: dict[TopicPartition, int] = {}
    held_back: dict[TopicPartition, str] = {}
    unchanged = 0
    for (topic, partition), offset in sorted(source_committed.items()):
        target_topic = topics.get(topic)
        if target_topic is None or offset < 0:
            continue  # not a mirrored topic (or no offset at all)
        tp = (target_topic, partition)
        end = target_log_ends.get(tp)
        if end is None:
            held_back[tp] = "the partition is not in the target yet"
        elif offset > end:
            held_back[tp] = f"committed {offset} at the source, the mirror holds offsets below {end} only"
        elif target_committed.get(tp) == offset:
            unchanged += 1
        else:
            commit[tp] = offset
    return GroupOffsetPlan(group, commit, held_back, unchanged, False)


# ---- share-group start offsets (KIP-932) -------------------------------------------------


@dataclass(frozen=True)
class TargetShareGroup:
    """What the target's coordinator says of a share group (ShareGroupDescribe)."""

    state: str
    members: int

    @property
    def live(self) -> bool:
        return self.members > 0


NO_SHARE_GROUP = TargetShareGroup("", 0)


@dataclass(frozen=True)
class SourceStart:
    """What the sync remembers of one share partition's source start offset between rounds
    (keyed by target partition; kept in memory only, so a worker that starts again knows
    nothing of what came before)."""

    last: int
    """The source's start offset at the last round."""
    moved_back: bool = False
    """The source's start offset went down (an AlterShareGroupOffsets there) since the last
    copy: the target's may then be moved back too."""


@dataclass(frozen=True)
class ShareOffsetPlan:
    group: str
    alter: dict[TopicPartition, int]
    """Target partition -> the source's start offset, where the target starts elsewhere."""
    held_back: dict[TopicPartition, str]
    """Target partitions not written this round, and why (looked at again next round)."""
    unchanged: int
    """Partitions whose target start offset already equals the source's."""
    live: bool
    """The share group has members in the target: nothing of it is written."""
    seen: dict[TopicPartition, SourceStart]
    """The source's start offsets as this round saw them, with the earlier rounds' moves
    back (`remembered` makes the next round's memory of it)."""


def plan_share_offsets(group: str, source_starts: Mapping[TopicPartition, int], topics: Mapping[str, str],
                       target_group: TargetShareGroup, target_starts: Mapping[TopicPartition, int],
                       target_log_ends: Mapping[TopicPartition, int],
                       memory: Mapping[TopicPartition, SourceStart]) -> ShareOffsetPlan:
    """One share group's start offsets to set in the target. `source_starts` is the source's
    DescribeShareGroupOffsets (source partition -> start offset, -1: never started),
    `topics` source topic -> mirror topic, `target_starts` and `target_log_ends` by target
    partition (a partition missing from `target_log_ends` is not in the target yet; one
    missing from `target_starts` has no share state there), `memory` what earlier rounds saw
    at the source (by target partition).

    A start offset is copied only where the mirror holds the offsets below it (<= its log
    end), so a share group moved over never skips a record the copy has not got yet; and
    the target's start is never moved back (a share group that ran in the target settled
    those records there) unless the source's went back since the last copy."""
    seen: dict[TopicPartition, SourceStart] = {}
    mirrored: list[tuple[TopicPartition, int]] = []
    for (topic, partition), start in sorted(source_starts.items()):
        target_topic = topics.get(topic)
        if target_topic is None or start < 0:
            continue  # not a mirrored topic, or the share partition never started at the source
        tp = (target_topic, partition)
        before = memory.get(tp)
        moved_back = before is not None and (before.moved_back or start < before.last)
        seen[tp] = SourceStart(start, moved_back)
        mirrored.append((tp, start))
    if target_group.live:
        return ShareOffsetPlan(group, {}, {}, 0, True, seen)
    alter: dict[TopicPartition, int] = {}
    held_back: dict[TopicPartition, str] = {}
    unchanged = 0
    for tp, start in mirrored:
        end = target_log_ends.get(tp)
        current = target_starts.get(tp, -1)
        if end is None:
            held_back[tp] = "the partition is not in the target yet"
        elif start > end:
            held_back[tp] = f"starts at {start} at the source, the mirror holds offsets below {end} only"
        elif current == start:
            unchanged += 1
        elif current > start and not seen[tp].moved_back:
            held_back[tp] = (f"starts at {current} in the target, past the source's {start}: never moved back "
                             "unless the source moves back")
        else:
            alter[tp] = start
    return ShareOffsetPlan(group, alter, held_back, unchanged, False, seen)


def remembered(plan: ShareOffsetPlan, failed: Iterable[TopicPartition] = ()) -> dict[TopicPartition, SourceStart]:
    """What the next round remembers of the source once `plan` is applied: a copied start
    offset clears the move back; one whose alter `failed` keeps it, to be copied still."""
    failed = set(failed)
    return {tp: SourceStart(s.last, False) if tp in plan.alter and tp not in failed else s
            for tp, s in plan.seen.items()}


# ---- ACLs ------------------------------------------------------------------------------


def _acl_key(b: AclBinding) -> tuple[Any, ...]:
    return (b.resource_name, b.principal, b.host, int(b.operation), int(b.permission), int(b.pattern_type))


def mirrored_acls(source_acls: Iterable[AclBinding], topics: Mapping[str, str],
                  principal_map: Mapping[str, str]) -> frozenset[AclBinding]:
    """The target bindings the source's imply: for every source TOPIC binding and every
    mirrored topic it applies to (literal name or "*", or a matching prefix), a literal
    binding on the mirror topic's name with the principal mapped."""
    out: set[AclBinding] = set()
    for b in source_acls:
        if b.resource_type is not ResourceType.TOPIC:
            continue
        for topic, target_topic in topics.items():
            if b.applies_to(ResourceType.TOPIC, topic):
                out.add(AclBinding(ResourceType.TOPIC, target_topic, PatternType.LITERAL,
                                   principal_map.get(b.principal, b.principal), b.host, b.operation, b.permission))
    return frozenset(out)


@dataclass(frozen=True)
class AclPlan:
    create: tuple[AclBinding, ...]
    delete: tuple[AclBinding, ...]
    wanted: frozenset[AclBinding]
    """Every binding the source implies in the target (created now or already there)."""


def plan_acls(source_acls: Iterable[AclBinding], target_acls: Iterable[AclBinding], topics: Mapping[str, str],
              principal_map: Mapping[str, str], managed: Iterable[AclBinding] = ()) -> AclPlan:
    """Bindings to create and delete in the target. `target_acls` are the target's TOPIC
    bindings; `managed` the bindings this worker made sure of in earlier rounds. Deleted: a
    literal binding on a mirror topic's name that the source no longer implies, whose
    principal is a mirrored one (a value of the map, named by a binding the source implies,
    or by a managed one). Nothing else of the target is touched."""
    wanted = mirrored_acls(source_acls, topics, principal_map)
    mirror_topics = set(topics.values())
    in_scope = {b for b in target_acls if b.resource_type is ResourceType.TOPIC
                and b.pattern_type is PatternType.LITERAL and b.resource_name in mirror_topics}
    principals = set(principal_map.values()) | {b.principal for b in wanted} | {b.principal for b in managed}
    create = tuple(sorted(wanted - in_scope, key=_acl_key))
    delete = tuple(sorted((b for b in in_scope - wanted if b.principal in principals), key=_acl_key))
    return AclPlan(create, delete, wanted)


def exact_filter(b: AclBinding) -> AclFilter:
    """A DeleteAcls filter matching `b` and nothing else."""
    return AclFilter(b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host, b.operation, b.permission)


# ---- the driver ------------------------------------------------------------------------


class TopicSync:
    """Runs the two rounds (group offsets, ACLs) of one worker of a flow of mirror topics, in
    the worker that holds `sync_owner(topics)`; keeps counters and the last round's outcome."""

    def __init__(self, settings: SyncSettings, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings
        self.clock = clock
        self.managed: set[AclBinding] = set()  # bindings made sure of (created or found) since the start
        self.runs_here = False
        self.owner: TopicPartition | None = None
        self.totals = {"offset_rounds": 0, "acl_rounds": 0, "groups_committed": 0, "offsets_copied": 0,
                       "acls_created": 0, "acls_deleted": 0, "errors": 0, "share_offset_rounds": 0,
                       "share_groups_altered": 0, "share_offsets_copied": 0, "share_groups_live": 0}
        self.offsets: dict[str, Any] = {"last_sync_ms": None, "groups": 0, "groups_in_sync": 0, "offsets_copied": 0,
                                        "live_groups": [], "held_back": {}, "last_error": ""}
        self.share_offsets: dict[str, Any] = {"last_sync_ms": None, "groups": 0, "groups_in_sync": 0,
                                              "offsets_copied": 0, "live_groups": [], "held_back": {},
                                              "skipped": "", "last_error": ""}
        # Share group -> what earlier rounds saw of its source start offsets (by target partition).
        self.share_memory: dict[str, dict[TopicPartition, SourceStart]] = {}
        self._live_share_groups: set[str] = set()
        self.acls: dict[str, Any] = {"last_sync_ms": None, "wanted": 0, "created": 0, "deleted": 0,
                                     "skipped": "", "last_error": ""}
        self._said: set[str] = set()

    @classmethod
    def from_flow(cls, flow: MirrorSpec, *, reverse: bool = False, clock: Clock = SYSTEM_CLOCK) -> TopicSync:
        return cls(SyncSettings.from_flow(flow, reverse=reverse), clock=clock)

    async def run(self, source: Admin, target: Admin, topics: Callable[[], Mapping[str, str]],
                  holds: Callable[[TopicPartition], bool]) -> None:
        """Both rounds, each every its interval, for as long as the caller's nursery lives.
        `topics()`: source topic -> mirror topic now; `holds(tp)`: whether this worker holds
        the source partition."""
        s = self.settings
        async with trio.open_nursery() as nursery:
            if s.groups is not None and s.group_offset_sync_ms > 0:
                nursery.start_soon(self._every, s.group_offset_sync_ms, "group offsets", self.offsets,
                                   lambda t: self.sync_group_offsets(source, target, t), topics, holds)
                nursery.start_soon(self._every, s.group_offset_sync_ms, "share-group offsets", self.share_offsets,
                                   lambda t: self.sync_share_offsets(source, target, t), topics, holds)
            if s.acl_sync_ms > 0:
                nursery.start_soon(self._every, s.acl_sync_ms, "ACLs", self.acls,
                                   lambda t: self.sync_acls(source, target, t), topics, holds)

    async def _every(self, interval_ms: int, what: str, status: dict[str, Any],
                     round_of: Callable[[Mapping[str, str]], Any], topics: Callable[[], Mapping[str, str]],
                     holds: Callable[[TopicPartition], bool]) -> None:
        while True:
            await trio.sleep(interval_ms / 1000)
            mapping = dict(topics())
            self.owner = sync_owner(mapping)
            self.runs_here = self.owner is not None and holds(self.owner)
            if not self.runs_here:
                continue
            try:
                with trio.fail_after(ROUND_TIMEOUT_S):
                    await round_of(mapping)
                status["last_error"] = ""
            except (*RETRIABLE, trio.TooSlowError) as exc:
                self.totals["errors"] += 1
                status["last_error"] = f"{type(exc).__name__}: {exc}"
                log.warning("following the source's %s: %s (next round in %.0f s)", what, status["last_error"],
                            interval_ms / 1000)

    def _once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)

    # ---- group offsets ------------------------------------------------------------------

    async def sync_group_offsets(self, source: Admin, target: Admin, topics: Mapping[str, str]) -> list[GroupOffsetPlan]:
        """One round: the chosen groups' committed offsets of the mirrored topics, from the
        source into the target where the plan says so; the plans."""
        groups = select_groups(await source.group_ids(), self.settings.groups)
        committed: dict[str, dict[TopicPartition, int]] = {}
        for group in groups:
            offsets = {tp: o for tp, o in (await source.committed_offsets(group)).items() if tp[0] in topics}
            if offsets:  # a group that never committed a mirrored partition is left alone
                committed[group] = offsets
        wanted = {(topics[t], p) for offsets in committed.values() for t, p in offsets}
        ends = await self._log_ends(target, wanted)
        plans = []
        for group, offsets in committed.items():
            target_group = await _target_group(target, group)
            target_committed = {} if target_group.live else await _committed_or_none(target, group)
            plan = plan_group_offsets(group, offsets, topics, target_group, target_committed, ends)
            if plan.commit:
                try:
                    await target.commit_offsets(group, plan.commit)
                except AdminError as exc:
                    if exc.code != ErrorCode.unknown_member_id:
                        raise
                    # A member joined between the describe and the commit: the group is live.
                    plan = GroupOffsetPlan(group, {}, {}, 0, True)
                else:
                    log.info("group %s: copied %d committed offset(s) into %s", group, len(plan.commit),
                             ", ".join(sorted({t for t, _ in plan.commit})))
            plans.append(plan)
        self._offsets_round(plans)
        return plans

    async def _log_ends(self, target: Admin, partitions: set[TopicPartition]) -> dict[TopicPartition, int]:
        """The target's log end (high watermark) of those `partitions` that exist there."""
        if not partitions:
            return {}
        meta = await target.metadata(sorted({t for t, _ in partitions}))
        existing = {(t.name, p.partition_index) for t in meta.topics if t.error_code == 0 for p in t.partitions}
        present = sorted(partitions & existing)
        return await target.list_offsets(present, LATEST) if present else {}

    def _offsets_round(self, plans: list[GroupOffsetPlan]) -> None:
        copied = sum(len(p.commit) for p in plans)
        self.totals["offset_rounds"] += 1
        self.totals["groups_committed"] += sum(1 for p in plans if p.commit)
        self.totals["offsets_copied"] += copied
        held = {f"{p.group} {t}-{n}": why for p in plans for (t, n), why in sorted(p.held_back.items())}
        self.offsets.update(
            last_sync_ms=self.clock.now_ms(), groups=len(plans), offsets_copied=copied,
            groups_in_sync=sum(1 for p in plans if not p.live and not p.held_back),
            live_groups=sorted(p.group for p in plans if p.live),
            held_back=dict(list(held.items())[:HELD_BACK_SHOWN_MAX]))

    # ---- share-group start offsets ------------------------------------------------------

    async def sync_share_offsets(self, source: Admin, target: Admin,
                                 topics: Mapping[str, str]) -> list[ShareOffsetPlan] | None:
        """One round: the chosen share groups' start offsets of the mirrored partitions, from
        the source into the target where the plan says so; the plans (None: a side serves no
        share-group offsets, said once)."""
        groups = select_groups([g for g, _ in await source.list_share_groups()], self.settings.groups)
        partitions = await _partitions_of(source, sorted(topics)) if groups else {}
        starts: dict[str, dict[TopicPartition, int]] = {}
        refused: dict[str, str] = {}  # "group target-partition" -> the source's error
        for group in groups:
            described = await self._share_starts(source, "source", group, partitions)
            if described is None:
                return None
            for o in described:
                if o.error_code != 0:
                    refused[f"{group} {topics[o.topic]}-{o.partition}"] = f"the source answered {_code_name(o.error_code)}"
            got = {(o.topic, o.partition): o.start_offset for o in described if o.error_code == 0 and o.start_offset >= 0}
            if got:  # a share group that never started a mirrored partition is left alone
                starts[group] = got
        wanted = {(topics[t], p) for got in starts.values() for t, p in got}
        ends = await self._log_ends(target, wanted)
        plans = []
        for group, source_starts in starts.items():
            target_group = await _target_share_group(target, group)
            target_starts: dict[TopicPartition, int] = {}
            if not target_group.live:
                present: dict[str, list[int]] = {}
                for t, p in sorted({(topics[t], p) for t, p in source_starts} & set(ends)):
                    present.setdefault(t, []).append(p)
                described = await self._share_starts(target, "target", group, present) if present else []
                if described is None:
                    return None
                target_starts = {(o.topic, o.partition): o.start_offset for o in described if o.error_code == 0}
            memory = self.share_memory.get(group, {})
            plan = plan_share_offsets(group, source_starts, topics, target_group, target_starts, ends, memory)
            plan, failed = await self._apply_share_plan(target, plan)
            self.share_memory[group] = remembered(plan, failed)
            if plan.live and group not in self._live_share_groups:
                log.info("share group %s has member(s) in the target: its start offsets are not copied while it has "
                         "(a share group live in the target is the target's own)", group)
            plans.append(plan)
        for gone in set(self.share_memory) - set(starts):
            del self.share_memory[gone]
        self._live_share_groups = {p.group for p in plans if p.live}
        self._share_round(plans, refused)
        return plans

    async def _apply_share_plan(self, target: Admin, plan: ShareOffsetPlan
                                ) -> tuple[ShareOffsetPlan, list[TopicPartition]]:
        """The plan's alters in the target: the plan as it turned out (a member that joined
        meanwhile makes it live) and the partitions whose alter failed."""
        if not plan.alter:
            return plan, []
        codes: dict[TopicPartition, int] = {}
        try:
            for chunk in _chunks(sorted(plan.alter.items()), SHARE_PARTITIONS_PER_CALL_MAX):
                codes.update(await target.alter_share_group_offsets(plan.group, dict(chunk)))
        except AdminError as exc:
            if exc.code == ErrorCode.non_empty_group:  # a member joined since the describe: live
                return replace(plan, alter={}, held_back={}, unchanged=0, live=True), list(plan.alter)
            if exc.code != ErrorCode.group_id_not_found:
                raise
            why = f"{plan.group!r} in the target is a consumer group, not a share group"
            self._once(f"share-not-share-{plan.group}", "share group %s: start offsets not copied: %s", plan.group, why)
            return replace(plan, alter={}, held_back={**plan.held_back, **{tp: why for tp in plan.alter}}), \
                list(plan.alter)
        failed = {tp: code for tp, code in codes.items() if code != 0}
        done = {tp: o for tp, o in plan.alter.items() if tp not in failed}
        if failed:
            log.warning("share group %s: the target refused start offsets of %s", plan.group,
                        ", ".join(f"{t}-{n} ({_code_name(c)})" for (t, n), c in sorted(failed.items())))
        if done:
            log.info("share group %s: copied %d start offset(s) into %s (%s)", plan.group, len(done),
                     ", ".join(sorted({t for t, _ in done})),
                     ", ".join(f"{t}-{n} at {o}" for (t, n), o in sorted(done.items())[:HELD_BACK_SHOWN_MAX]))
        held = {**plan.held_back, **{tp: f"the target answered {_code_name(c)}" for tp, c in failed.items()}}
        return replace(plan, alter=done, held_back=held), list(failed)

    async def _share_starts(self, admin: Admin, side: str, group: str, partitions: Mapping[str, Sequence[int]]
                            ) -> list[SharePartitionOffset] | None:
        """DescribeShareGroupOffsets of `partitions` (chunked to the broker's limit); None when
        the cluster does not serve it (said once)."""
        out: list[SharePartitionOffset] = []
        asked = [(t, p) for t, ps in sorted(partitions.items()) for p in ps]
        try:
            for chunk in _chunks(asked, SHARE_PARTITIONS_PER_CALL_MAX):
                by_topic: dict[str, list[int]] = {}
                for t, p in chunk:
                    by_topic.setdefault(t, []).append(p)
                out += await admin.share_group_offsets(group, by_topic)
        except AdminError as exc:
            if exc.code != ErrorCode.unsupported_version:
                raise
            self._once(f"share-{side}", "share-group start offsets are not followed: the %s cluster does not serve "
                       "DescribeShareGroupOffsets (%s)", side, exc)
            self.share_offsets.update(last_sync_ms=self.clock.now_ms(),
                                      skipped=f"the {side} cluster serves no share-group offsets")
            return None
        return out

    def _share_round(self, plans: list[ShareOffsetPlan], refused: Mapping[str, str]) -> None:
        copied = sum(len(p.alter) for p in plans)
        self.totals["share_offset_rounds"] += 1
        self.totals["share_groups_altered"] += sum(1 for p in plans if p.alter)
        self.totals["share_offsets_copied"] += copied
        self.totals["share_groups_live"] += sum(1 for p in plans if p.live)
        held = {**{f"{p.group} {t}-{n}": why for p in plans for (t, n), why in sorted(p.held_back.items())},
                **refused}
        self.share_offsets.update(
            last_sync_ms=self.clock.now_ms(), groups=len(plans), offsets_copied=copied, skipped="",
            groups_in_sync=sum(1 for p in plans if not p.live and not p.held_back),
            live_groups=sorted(p.group for p in plans if p.live),
            held_back=dict(list(held.items())[:HELD_BACK_SHOWN_MAX]))

    # ---- ACLs ---------------------------------------------------------------------------

    async def sync_acls(self, source: Admin, target: Admin, topics: Mapping[str, str]) -> AclPlan | None:
        """One round: the target's bindings on the mirror topics made what the source's
        imply; None when a side has no ACLs to read or write (said once)."""
        source_acls = await self._describe_topic_acls(source, "source")
        if source_acls is None:
            return None
        target_acls = await self._describe_topic_acls(target, "target")
        if target_acls is None:
            return None
        plan = plan_acls(source_acls, target_acls, topics, self.settings.principal_map, self.managed)
        if plan.create:
            await target.create_acls(list(plan.create))
            log.info("created %d ACL(s) on mirror topics: %s", len(plan.create), "; ".join(map(_acl_text, plan.create)))
        if plan.delete:
            await target.delete_acls([exact_filter(b) for b in plan.delete])
            log.info("deleted %d ACL(s) the source no longer has: %s", len(plan.delete),
                     "; ".join(map(_acl_text, plan.delete)))
        self.managed = (self.managed | plan.wanted) - set(plan.delete)
        self.totals["acl_rounds"] += 1
        self.totals["acls_created"] += len(plan.create)
        self.totals["acls_deleted"] += len(plan.delete)
        self.acls.update(last_sync_ms=self.clock.now_ms(), wanted=len(plan.wanted), created=len(plan.create),
                         deleted=len(plan.delete), skipped="")
        return plan

    async def _describe_topic_acls(self, admin: Admin, side: str) -> list[AclBinding] | None:
        try:
            return await admin.describe_acls(AclFilter(resource_type=ResourceType.TOPIC))
        except AdminError as exc:
            if exc.code not in NO_ACLS_CODES:
                raise
            why = ("has no authorizer" if exc.code == ErrorCode.security_disabled
                   else "does not let the flow's principal describe ACLs (DESCRIBE on the cluster)")
            self._once(f"acls-{side}", "ACLs of mirror topics are not followed: the %s cluster %s (%s)", side, why, exc)
            self.acls.update(last_sync_ms=self.clock.now_ms(), skipped=f"the {side} cluster {why}")
            return None

    # ---- status -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"runs_here": self.runs_here,
                "owner_partition": f"{self.owner[0]}-{self.owner[1]}" if self.owner is not None else None,
                "groups": self.settings.groups, "group_offset_sync_ms": self.settings.group_offset_sync_ms,
                "acl_sync_ms": self.settings.acl_sync_ms, "group_offsets": dict(self.offsets),
                "share_group_offsets": dict(self.share_offsets), "acls": dict(self.acls),
                "totals": dict(self.totals)}

    def prometheus_metrics(self, labels: Mapping[str, str]) -> dict[str, tuple[str, str, list[tuple[dict[str, str], float]]]]:
        """Metric families for prometheus_text (the worker's /metrics)."""
        t, base = self.totals, dict(labels)
        last = [(dict(base, kind=k), (v["last_sync_ms"] or 0) / 1000)
                for k, v in (("group_offsets", self.offsets), ("share_group_offsets", self.share_offsets),
                             ("acls", self.acls))]
        return {
            "dcmirror_mirror_topic_sync_offsets_copied_total": (
                "counter", "Committed group offsets copied into mirror topics", [(base, t["offsets_copied"])]),
            "dcmirror_mirror_topic_sync_groups_committed_total": (
                "counter", "Group commits made in the target by the offset sync", [(base, t["groups_committed"])]),
            "dcmirror_mirror_topic_sync_share_offsets_copied_total": (
                "counter", "Share-group start offsets copied into mirror topics", [(base, t["share_offsets_copied"])]),
            "dcmirror_mirror_topic_sync_share_groups_live_total": (
                "counter", "Share groups left alone in a round because they have members in the target",
                [(base, t["share_groups_live"])]),
            "dcmirror_mirror_topic_sync_acls_total": (
                "counter", "ACL bindings created or deleted on mirror topics",
                [(dict(base, change="created"), t["acls_created"]), (dict(base, change="deleted"), t["acls_deleted"])]),
            "dcmirror_mirror_topic_sync_errors_total": (
                "counter", "Sync rounds that failed (tried again next round)", [(base, t["errors"])]),
            "dcmirror_mirror_topic_sync_last_seconds": (
                "gauge", "When the last sync round of each kind finished (unix seconds; 0: never)", last),
        }


async def _target_group(target: Admin, group: str) -> TargetGroup:
    (described,) = await target.describe_groups([group])
    if described.error_code == ErrorCode.group_id_not_found:
        return NO_GROUP
    if described.error_code != 0:
        raise AdminError(f"describing group {group!r} in the target", described.error_code)
    return TargetGroup(described.group_state or "", len(described.members))


async def _committed_or_none(target: Admin, group: str) -> dict[TopicPartition, int]:
    try:
        return await target.committed_offsets(group)
    except AdminError as exc:
        if exc.code == ErrorCode.group_id_not_found:
            return {}
        raise


async def _target_share_group(target: Admin, group: str) -> TargetShareGroup:
    try:
        described = await target.describe_share_group(group)
    except AdminError as exc:
        if exc.code == ErrorCode.group_id_not_found:
            return NO_SHARE_GROUP
        raise
    return TargetShareGroup(described.group_state or "", len(described.members))


async def _partitions_of(admin: Admin, topics: list[str]) -> dict[str, list[int]]:
    """Topic -> its partitions, of those `topics` the cluster has."""
    if not topics:
        return {}
    meta = await admin.metadata(topics)
    return {t.name: sorted(p.partition_index for p in t.partitions) for t in meta.topics if t.error_code == 0}


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


def _acl_text(b: AclBinding) -> str:
    return f"{b.principal} {b.permission.name} {b.operation.name} on {b.resource_name} from {b.host}"
