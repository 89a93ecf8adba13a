"""Classic consumer-group coordinator as a sans-IO state machine.

Requests come in as method calls with `now_ms`; each returns a `Pending` answer that is
either complete at once or completed later by another request or by `tick(now_ms)`
(join/sync barriers, session and rebalance timeouts). State that must survive restarts
leaves as `GroupRecord`s (see records.py) which the driver appends to
`__consumer_offsets` before answering. No sockets, no clocks, no sleeps here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cluster.groups.consumer_group import (
    JOIN_EPOCH,
    ConsumerGroupConfig,
    ConsumerGroupCoordinator,
    ConsumerGroupState,
    HeartbeatRequest,
    validate,
)
from cluster.groups.records import (
    GroupRecord,
    consumer_group_record,
    group_metadata_record,
    offset_record,
)
from cluster.groups.state import CommittedOffset, Group, GroupState, Member, Pending
from cluster.protocol.consumer_protocol import (
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from cluster.protocol.errors import ErrorCode


@dataclass(frozen=True)
class GroupConfig:
    min_session_timeout_ms: int = 6_000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    max_size: int = 2_147_483_647  # group.max.size
    offsets_retention_ms: int = 10_080 * 60_000  # offsets.retention.minutes
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    max_groups: int = 100_000  # a bound on coordinator memory


CONSUMER_PROTOCOL_TYPE = "consumer"  # JoinGroup protocol_type of Kafka consumers


def _err(code: int, **extra: Any) -> dict[str, Any]:
    return {"error_code": code, **extra}


class GroupCoordinator:
    """Every group this coordinator owns; call `take_records()` after each request or tick."""

    def __init__(self, config: GroupConfig | None = None, consumer_config: ConsumerGroupConfig | None = None) -> None:
        self.config = config or GroupConfig()
        self.consumer = ConsumerGroupCoordinator(consumer_config)
        self.groups: dict[str, Group] = {}
        self._records: list[GroupRecord] = []
        # TxnOffsetCommit: producer id → offsets that become committed with its COMMIT marker.
        self.pending_txn: dict[int, dict[tuple[str, str, int], CommittedOffset]] = {}

    # ---- persistence -----------------------------------------------------------------

    def take_records(self) -> list[GroupRecord]:
        out, self._records = self._records, []
        return out

    def _persist_group(self, group: Group) -> None:
        self._records.append(group_metadata_record(group))

    def load(self, groups: dict[str, Group]) -> None:
        """Adopt state rebuilt from `__consumer_offsets` (records.replay)."""
        self.groups.update(groups)

    def unload(self, group_id: str) -> None:
        """Stop coordinating `group_id` (its offsets partition moved away): members waiting in
        JoinGroup or SyncGroup are answered NOT_COORDINATOR at once, as Kafka's onGroupUnloaded
        does, so they find the new coordinator instead of waiting out their rebalance timeout."""
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        for member in group.members.values():
            for waiter in (member.join_waiter, member.sync_waiter):
                if waiter is not None and not waiter.done:
                    waiter.complete(_err(ErrorCode.not_coordinator, member_id=member.member_id, generation_id=-1,
                                         protocol_name="", leader="", members=[], assignment=b""))
            member.join_waiter = member.sync_waiter = None

    # ---- helpers ---------------------------------------------------------------------

    def _group(self, group_id: str, *, create: bool, now_ms: int) -> Group | None:
        group = self.groups.get(group_id)
        if group is None and create:
            if len(self.groups) >= self.config.max_groups:
                return None
            group = Group(group_id, state_timestamp_ms=now_ms)
            self.groups[group_id] = group
        return group

    def _new_member_id(self, client_id: str) -> str:
        return f"{client_id or 'member'}-{uuid.uuid4()}"

    def _join_result(self, group: Group, member: Member) -> dict[str, Any]:
        is_leader = member.member_id == group.leader_id
        protocol = group.protocol_name or ""
        members = (
            [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                 "metadata": m.metadata_for(protocol)}
                for m in group.members.values()
            ]
            if is_leader
            else []
        )
        return {
            "error_code": ErrorCode.none,
            "generation_id": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": protocol,
            "leader": group.leader_id or "",
            "member_id": member.member_id,
            "members": members,
        }

    def _prepare_rebalance(self, group: Group, now_ms: int) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            # Members waiting for their assignment must rejoin.
            for m in group.members.values():
                if m.sync_waiter is not None:
                    m.sync_waiter.complete(_err(ErrorCode.rebalance_in_progress, assignment=b""))
                    m.sync_waiter = None
        rebalance_timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        if group.state is GroupState.EMPTY:
            # The first join waits group.initial.rebalance.delay.ms for more members.
            delay = min(self.config.initial_rebalance_delay_ms, rebalance_timeout)
            group.in_initial_delay = delay > 0
            group.join_deadline_ms = now_ms + delay
            group.initial_delay_cap_ms = now_ms + max(rebalance_timeout, delay)
        else:
            group.in_initial_delay = False
            group.join_deadline_ms = now_ms + rebalance_timeout
        group.sync_deadline_ms = None
        group.transition(GroupState.PREPARING_REBALANCE, now_ms)

    def _maybe_complete_join(self, group: Group, now_ms: int) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        if not group.members and not group.pending_member_ids:
            self._complete_join(group, now_ms)
        elif not group.in_initial_delay and group.all_rejoined():
            self._complete_join(group, now_ms)

    def _complete_join(self, group: Group, now_ms: int) -> None:
        for member_id in [mid for mid, m in group.members.items() if m.join_waiter is None]:
            self._remove_member(group, member_id)
        # Member ids handed out with MEMBER_ID_REQUIRED stay pending until their session
        # timeout (as Kafka's pendingMembers): a client that joins with one after this round
        # completes is taken as a new member at once, not sent back for another id.
        group.join_deadline_ms = None
        group.in_initial_delay = False
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            group.transition(GroupState.EMPTY, now_ms)
            self._persist_group(group)
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        group.sync_deadline_ms = now_ms + max(m.rebalance_timeout_ms for m in group.members.values())
        for m in group.members.values():
            waiter, m.join_waiter = m.join_waiter, None
            m.last_heartbeat_ms = now_ms
            m.assignment = b""
            assert waiter is not None
            waiter.complete(self._join_result(group, m))

    def _remove_member(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id, None)
        if member is None:
            return
        if member.group_instance_id is not None and group.static_members.get(member.group_instance_id) == member_id:
            del group.static_members[member.group_instance_id]
        for waiter in (member.join_waiter, member.sync_waiter):
            if waiter is not None:
                waiter.complete(_err(ErrorCode.unknown_member_id, member_id=member_id, generation_id=-1,
                                     protocol_name="", leader="", members=[], assignment=b""))
        if group.leader_id == member_id:
            group.leader_id = next(iter(group.members), None)

    def _member_left(self, group: Group, member_id: str, now_ms: int) -> None:
        self._remove_member(group, member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms)
        self._maybe_complete_join(group, now_ms)

    # ---- JoinGroup -------------------------------------------------------------------

    def join_group(
        self,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        now_ms: int,
    ) -> Pending:
        def fail(code: int) -> Pending:
            return Pending.ready(_err(code, generation_id=-1, protocol_name="", leader="", member_id=member_id,
                                      members=[]))

        if not group_id:
            return fail(ErrorCode.invalid_group_id)
        if not self.config.min_session_timeout_ms <= session_timeout_ms <= self.config.max_session_timeout_ms:
            return fail(ErrorCode.invalid_session_timeout)
        group = self._group(group_id, create=not member_id, now_ms=now_ms)
        if group is None:
            return fail(ErrorCode.unknown_member_id if member_id else ErrorCode.coordinator_not_available)
        if group.state is GroupState.DEAD:
            return fail(ErrorCode.coordinator_not_available)
        if group.consumer is not None:
            if group.consumer.members:
                return fail(ErrorCode.group_id_not_found)  # Kafka: "Group X is not a classic group."
            self._records.append(consumer_group_record(group_id, None))  # empty: it becomes classic
            group.consumer = None
            group.protocol_type = None
        if not group.supports(protocol_type, protocols):
            return fail(ErrorCode.inconsistent_group_protocol)

        if not member_id:
            if group_instance_id is not None and group_instance_id in group.static_members:
                return self._rejoin_static_member(group, group_instance_id, protocols, session_timeout_ms,
                                                  rebalance_timeout_ms, client_id, client_host, now_ms)
            if len(group.members) + len(group.pending_member_ids) >= self.config.max_size:
                return fail(ErrorCode.group_max_size_reached)
            new_id = self._new_member_id(client_id)
            if require_known_member_id and group_instance_id is None:
                group.pending_member_ids[new_id] = now_ms + session_timeout_ms
                return Pending.ready(_err(ErrorCode.member_id_required, generation_id=-1, protocol_name="",
                                          leader="", member_id=new_id, members=[]))
            return self._add_member_and_rebalance(group, new_id, group_instance_id, protocol_type, protocols,
                                                  session_timeout_ms, rebalance_timeout_ms, client_id,
                                                  client_host, now_ms)

        if group_instance_id is not None:
            known = group.static_members.get(group_instance_id)
            if known is not None and known != member_id:
                return fail(ErrorCode.fenced_instance_id)
        if member_id in group.pending_member_ids:
            del group.pending_member_ids[member_id]
            if len(group.members) >= self.config.max_size:
                return fail(ErrorCode.group_max_size_reached)
            return self._add_member_and_rebalance(group, member_id, group_instance_id, protocol_type, protocols,
                                                  session_timeout_ms, rebalance_timeout_ms, client_id,
                                                  client_host, now_ms)
        member = group.members.get(member_id)
        if member is None:
            return fail(ErrorCode.unknown_member_id)
        member.last_heartbeat_ms = now_ms
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            member.protocols = protocols
            return self._await_join(group, member, now_ms)
        unchanged = member.protocols == protocols
        if group.state is GroupState.COMPLETING_REBALANCE and unchanged:
            return Pending.ready(self._join_result(group, member))
        if group.state is GroupState.STABLE and unchanged and member_id != group.leader_id:
            return Pending.ready(self._join_result(group, member))
        member.protocols = protocols
        self._prepare_rebalance(group, now_ms)
        return self._await_join(group, member, now_ms)

    def _await_join(self, group: Group, member: Member, now_ms: int) -> Pending:
        if member.join_waiter is not None:
            member.join_waiter.complete(_err(ErrorCode.rebalance_in_progress, generation_id=-1, protocol_name="",
                                             leader="", member_id=member.member_id, members=[]))
        waiter = Pending()
        member.join_waiter = waiter
        self._maybe_complete_join(group, now_ms)
        return waiter

    def _add_member_and_rebalance(
        self, group: Group, member_id: str, group_instance_id: str | None, protocol_type: str,
        protocols: list[tuple[str, bytes]], session_timeout_ms: int, rebalance_timeout_ms: int,
        client_id: str, client_host: str, now_ms: int,
    ) -> Pending:
        member = Member(member_id, group_instance_id, client_id, client_host, session_timeout_ms,
                        rebalance_timeout_ms, protocol_type, protocols, now_ms)
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member_id] = member
        if group_instance_id is not None:
            group.static_members[group_instance_id] = member_id
        if group.state is GroupState.PREPARING_REBALANCE and group.in_initial_delay:
            # Each new member during the initial delay pushes it out by another delay, never
            # past the rebalance timeout and never earlier than already promised.
            assert group.join_deadline_ms is not None
            extended = now_ms + self.config.initial_rebalance_delay_ms
            group.join_deadline_ms = max(group.join_deadline_ms, min(extended, group.initial_delay_cap_ms))
        elif group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, now_ms)
        waiter = Pending()
        member.join_waiter = waiter
        self._maybe_complete_join(group, now_ms)
        return waiter

    def _rejoin_static_member(
        self, group: Group, instance_id: str, protocols: list[tuple[str, bytes]], session_timeout_ms: int,
        rebalance_timeout_ms: int, client_id: str, client_host: str, now_ms: int,
    ) -> Pending:
        """A known group.instance.id comes back with a new member id: swap it in place."""
        old_id = group.static_members[instance_id]
        old = group.members.pop(old_id)
        for waiter in (old.join_waiter, old.sync_waiter):
            if waiter is not None:
                waiter.complete(_err(ErrorCode.fenced_instance_id, member_id=old_id, generation_id=-1,
                                     protocol_name="", leader="", members=[], assignment=b""))
        new_id = self._new_member_id(client_id)
        member = Member(new_id, instance_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
                        old.protocol_type, protocols, now_ms, assignment=old.assignment)
        group.members[new_id] = member
        group.static_members[instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if group.state is GroupState.STABLE and old.protocols == protocols:
            # No rebalance for the others: the member gets its old assignment on SyncGroup.
            self._persist_group(group)
            return Pending.ready(self._join_result(group, member))
        if group.state is GroupState.PREPARING_REBALANCE:
            return self._await_join(group, member, now_ms)
        self._prepare_rebalance(group, now_ms)
        return self._await_join(group, member, now_ms)

    # ---- SyncGroup -------------------------------------------------------------------

    def _check_member(self, group: Group | None, member_id: str, generation: int,
                      group_instance_id: str | None) -> int:
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.unknown_member_id
        if group.consumer is not None:  # commits of KIP-848 members carry their member epoch
            return self.consumer.offset_commit_error(group.consumer, member_id, generation)
        if group_instance_id is not None:
            known = group.static_members.get(group_instance_id)
            if known is not None and known != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def sync_group(self, *, group_id: str, member_id: str, generation_id: int, group_instance_id: str | None,
                   assignments: dict[str, bytes], now_ms: int) -> Pending:
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, generation_id, group_instance_id)
        if error:
            return Pending.ready(_err(error, assignment=b""))
        assert group is not None
        member = group.members[member_id]
        member.last_heartbeat_ms = now_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            return Pending.ready(_err(ErrorCode.rebalance_in_progress, assignment=b""))
        if group.state is GroupState.STABLE:
            return Pending.ready(_err(ErrorCode.none, assignment=member.assignment,
                                      protocol_type=group.protocol_type, protocol_name=group.protocol_name))
        if group.state is not GroupState.COMPLETING_REBALANCE:
            return Pending.ready(_err(ErrorCode.unknown_member_id, assignment=b""))
        waiter = Pending()
        if member.sync_waiter is not None:
            member.sync_waiter.complete(_err(ErrorCode.rebalance_in_progress, assignment=b""))
        member.sync_waiter = waiter
        if member_id == group.leader_id:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.sync_deadline_ms = None
            group.transition(GroupState.STABLE, now_ms)
            self._persist_group(group)
            for m in group.members.values():
                if m.sync_waiter is not None:
                    w, m.sync_waiter = m.sync_waiter, None
                    w.complete(_err(ErrorCode.none, assignment=m.assignment, protocol_type=group.protocol_type,
                                    protocol_name=group.protocol_name))
        return waiter

    # ---- Heartbeat / LeaveGroup ------------------------------------------------------

    def heartbeat(self, *, group_id: str, member_id: str, generation_id: int, group_instance_id: str | None,
                  now_ms: int) -> dict[str, Any]:
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, generation_id, group_instance_id)
        if error:
            return _err(error)
        assert group is not None
        group.members[member_id].last_heartbeat_ms = now_ms
        if group.state is GroupState.PREPARING_REBALANCE:
            return _err(ErrorCode.rebalance_in_progress)
        return _err(ErrorCode.none)

    def leave_group(self, *, group_id: str, members: list[tuple[str, str | None]], now_ms: int,
                    batched: bool = False) -> dict[str, Any]:
        """LeaveGroup. `batched` (v3+, KIP-345): the answer's own error is only ever the
        group's, each member has its own; before, one member's error is the answer's."""
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return _err(ErrorCode.unknown_member_id, members=[
                {"member_id": m, "group_instance_id": i, "error_code": ErrorCode.unknown_member_id} for m, i in members
            ])
        results: list[dict[str, Any]] = []
        for member_id, instance_id in members:
            target = member_id
            if instance_id is not None:
                known = group.static_members.get(instance_id)
                if known is None:
                    results.append({"member_id": member_id, "group_instance_id": instance_id,
                                    "error_code": ErrorCode.unknown_member_id})
                    continue
                if member_id and known != member_id:
                    results.append({"member_id": member_id, "group_instance_id": instance_id,
                                    "error_code": ErrorCode.fenced_instance_id})
                    continue
                target = known
            if target in group.pending_member_ids:
                del group.pending_member_ids[target]
                self._maybe_complete_join(group, now_ms)
            elif target not in group.members:
                results.append({"member_id": member_id, "group_instance_id": instance_id,
                                "error_code": ErrorCode.unknown_member_id})
                continue
            else:
                self._member_left(group, target, now_ms)
            results.append({"member_id": member_id, "group_instance_id": instance_id, "error_code": ErrorCode.none})
        top: int = ErrorCode.none
        if not batched and len(members) == 1 and results[0]["error_code"] != ErrorCode.none:
            top = int(results[0]["error_code"])
        return _err(top, members=results)

    # ---- offsets ---------------------------------------------------------------------

    def commit_offsets(
        self, *, group_id: str, member_id: str, generation_id: int, group_instance_id: str | None,
        offsets: list[tuple[str, int, int, int, str | None]], now_ms: int,
    ) -> dict[tuple[str, int], int]:
        """Per (topic, partition) error codes; committed offsets leave as records."""
        keys = [(t, p) for t, p, _, _, _ in offsets]
        if not group_id:
            return dict.fromkeys(keys, ErrorCode.invalid_group_id)
        group = self.groups.get(group_id)
        simple = generation_id < 0 and not member_id
        if simple:
            if group is not None and group.has_members:
                return dict.fromkeys(keys, ErrorCode.unknown_member_id)
            group = self._group(group_id, create=True, now_ms=now_ms)
            if group is None:
                return dict.fromkeys(keys, ErrorCode.coordinator_not_available)
        else:
            error = self._check_member(group, member_id, generation_id, group_instance_id)
            if error:
                return dict.fromkeys(keys, error)
            assert group is not None
            # Kafka refuses only while assignments are pending; during PreparingRebalance the
            # commit a consumer makes before rejoining must succeed, or it re-reads its batch.
            if group.state is GroupState.COMPLETING_REBALANCE:
                return dict.fromkeys(keys, ErrorCode.rebalance_in_progress)
            if group.consumer is None:
                group.members[member_id].last_heartbeat_ms = now_ms
        results: dict[tuple[str, int], int] = {}
        for topic, partition, offset, leader_epoch, metadata in offsets:
            meta = metadata or ""
            if len(meta.encode()) > self.config.offset_metadata_max_bytes:
                results[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            committed = CommittedOffset(offset, leader_epoch, meta, now_ms)
            group.offsets[(topic, partition)] = committed
            self._records.append(offset_record(group_id, topic, partition, committed))
            results[(topic, partition)] = ErrorCode.none
        return results

    def txn_commit_offsets(
        self, *, group_id: str, member_id: str, generation_id: int, group_instance_id: str | None,
        offsets: list[tuple[str, int, int, int, str | None]], now_ms: int,
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], CommittedOffset]]:
        """TxnOffsetCommit (KIP-98/447): per-partition errors and the offsets to append in
        the producer's transaction (`offset_record`). They count once its COMMIT marker is
        written (`add_pending`, then `complete_txn`); a member id and generation, when
        given, are checked as for OffsetCommit (KIP-447 fencing of zombie consumers)."""
        keys = [(t, p) for t, p, _, _, _ in offsets]
        if not group_id:
            return dict.fromkeys(keys, ErrorCode.invalid_group_id), {}
        if generation_id >= 0 or member_id:
            error = self._check_member(self.groups.get(group_id), member_id, generation_id, group_instance_id)
            if error:
                return dict.fromkeys(keys, error), {}
        results: dict[tuple[str, int], int] = {}
        staged: dict[tuple[str, int], CommittedOffset] = {}
        for topic, partition, offset, leader_epoch, metadata in offsets:
            meta = metadata or ""
            if len(meta.encode()) > self.config.offset_metadata_max_bytes:
                results[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            staged[(topic, partition)] = CommittedOffset(offset, leader_epoch, meta, now_ms)
            results[(topic, partition)] = ErrorCode.none
        return results, staged

    def add_pending(self, producer_id: int, group_id: str, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        pending = self.pending_txn.setdefault(producer_id, {})
        for (topic, partition), committed in offsets.items():
            pending[(group_id, topic, partition)] = committed

    def complete_txn(self, producer_id: int, commit: bool, owns: Any, now_ms: int) -> int:
        """A marker for `producer_id` landed: its pending offsets of groups `owns(group)`
        become committed (COMMIT) or are dropped (ABORT). How many were pending."""
        pending = self.pending_txn.get(producer_id)
        if not pending:
            return 0
        done = [k for k in pending if owns(k[0])]
        for group_id, topic, partition in done:
            committed = pending.pop((group_id, topic, partition))
            if commit:
                group = self._group(group_id, create=True, now_ms=now_ms)
                if group is not None:
                    group.offsets[(topic, partition)] = committed
        if not pending:
            del self.pending_txn[producer_id]
        return len(done)

    def unstable_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The group's partitions with a transactional offset waiting for its marker: an
        OffsetFetch with require_stable (KIP-447) answers UNSTABLE_OFFSET_COMMIT for them, so
        a consumer taking over does not start from an offset about to change."""
        return {(t, p) for pending in self.pending_txn.values() for (g, t, p) in pending if g == group_id}

    def drop_pending(self, unloaded: Callable[[str], bool]) -> int:
        """Forget the pending transactional offsets of groups `unloaded(group)`: their
        markers now land at another coordinator, and a reload replays what is still open.
        (Kept, a stale one would be committed by a later marker of the same producer.)"""
        dropped = 0
        for producer_id in list(self.pending_txn):
            pending = self.pending_txn[producer_id]
            for key in [k for k in pending if unloaded(k[0])]:
                del pending[key]
                dropped += 1
            if not pending:
                del self.pending_txn[producer_id]
        return dropped

    def fetch_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None) -> dict[tuple[str, int], CommittedOffset | None]:
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        if partitions is None:
            return dict(offsets)
        return {tp: offsets.get(tp) for tp in partitions}

    def delete_offsets_of_topic(self, topic: str) -> None:
        for group in self.groups.values():
            for tp in [tp for tp in group.offsets if tp[0] == topic]:
                del group.offsets[tp]
                self._records.append(offset_record(group.group_id, tp[0], tp[1], None))

    def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]],
                       now_ms: int) -> tuple[int, dict[tuple[str, int], int]]:
        """OffsetDelete (KIP-496), Kafka's rules: (group error, per-partition errors). A
        consumer group's offsets of topics its members subscribe to stay
        (GROUP_SUBSCRIBED_TO_TOPIC); a group of another protocol must be empty
        (NON_EMPTY_GROUP). Deleted offsets leave as tombstones."""
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.group_id_not_found, {}
        if group.consumer is not None and group.consumer.members:
            subscribed = {t for t, _ in partitions
                          if any(m.subscribes_to(t) for m in group.consumer.members.values())}
        elif group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.members:
            subscribed = self.subscribed_topics(group)
        elif group.state is GroupState.EMPTY:
            subscribed = set()
        else:
            return ErrorCode.non_empty_group, {}
        results: dict[tuple[str, int], int] = {}
        for tp in partitions:
            if tp[0] in subscribed:
                results[tp] = ErrorCode.group_subscribed_to_topic
                continue
            results[tp] = ErrorCode.none
            if group.offsets.pop(tp, None) is not None:
                self._records.append(offset_record(group_id, tp[0], tp[1], None))
        return ErrorCode.none, results

    @staticmethod
    def subscribed_topics(group: Group) -> set[str]:
        """Topics the members of a consumer group subscribe to (their JoinGroup metadata in
        the chosen protocol); a member whose metadata cannot be read subscribes to nothing."""
        topics: set[str] = set()
        for m in group.members.values():
            try:
                topics.update(decode_subscription(m.metadata_for(group.protocol_name or "")).topics)
            except ValueError:
                continue
        return topics

    # ---- KIP-848 consumer groups -----------------------------------------------------

    def consumer_group_heartbeat(self, req: HeartbeatRequest, topics: Mapping[str, tuple[str, int]],
                                 now_ms: int) -> dict[str, Any]:
        """ConsumerGroupHeartbeat; `topics`: every topic a member may subscribe to →
        (topic id, partition count)."""
        refused = validate(req, self.consumer.config)
        if refused is not None:
            return refused
        group = self.groups.get(req.group_id)
        if group is None and req.member_epoch == JOIN_EPOCH:
            group = self._group(req.group_id, create=True, now_ms=now_ms)
            if group is None:
                return {"error_code": ErrorCode.coordinator_not_available, "error_message": "too many groups",
                        "member_id": req.member_id, "member_epoch": -1, "assignment": None}
        if group is None or group.state is GroupState.DEAD:
            return {"error_code": ErrorCode.group_id_not_found, "member_id": req.member_id, "member_epoch": -1,
                    "error_message": f"Group {req.group_id} not found.", "assignment": None}
        if group.consumer is None:
            if group.members or group.pending_member_ids:
                return {"error_code": ErrorCode.group_id_not_found, "member_id": req.member_id,
                        "member_epoch": -1, "error_message": f"Group {req.group_id} is not a consumer group.",
                        "assignment": None}
            # An empty classic group (committed offsets only) becomes a consumer group.
            if group.protocol_type is not None:
                self._records.append(group_metadata_record(group, tombstone=True))
            group.consumer = ConsumerGroupState()
            group.protocol_type = CONSUMER_PROTOCOL_TYPE
            group.protocol_name = None
            group.leader_id = None
        answer, changed = self.consumer.heartbeat(group.consumer, req, topics, now_ms)
        if changed:
            self._consumer_group_changed(group, now_ms)
        return answer

    def _consumer_group_changed(self, group: Group, now_ms: int) -> None:
        assert group.consumer is not None
        if not group.consumer.members:
            group.state_timestamp_ms = now_ms  # offsets of an empty group expire from here
        self._records.append(consumer_group_record(group.group_id, group.consumer))

    def consumer_group(self, group_id: str) -> ConsumerGroupState | None:
        group = self.groups.get(group_id)
        return None if group is None or group.state is GroupState.DEAD else group.consumer

    # ---- admin -----------------------------------------------------------------------

    def describe(self, group_id: str) -> dict[str, Any]:
        group = self.groups.get(group_id)
        if group is None:
            return {"error_code": ErrorCode.none, "group_id": group_id, "group_state": GroupState.DEAD.value,
                    "protocol_type": "", "protocol_data": "", "members": []}
        if group.consumer is not None:
            # A KIP-848 group in the classic shape, for tools that only know DescribeGroups.
            cg = group.consumer
            return {"error_code": ErrorCode.none, "group_id": group_id, "group_state": cg.state_name(),
                    "protocol_type": CONSUMER_PROTOCOL_TYPE, "protocol_data": self.consumer.assignor_of(cg),
                    "members": [
                        {"member_id": m.member_id, "group_instance_id": m.instance_id, "client_id": m.client_id,
                         "client_host": m.client_host,
                         "member_metadata": encode_subscription(
                             sorted(t for t in cg.topics if m.subscribes_to(t)) or list(m.subscribed_topic_names)),
                         "member_assignment": encode_assignment({t: sorted(ps) for t, ps in sorted(m.assigned.items())})}
                        for m in cg.members.values()]}
        stable = group.state is GroupState.STABLE
        return {
            "error_code": ErrorCode.none,
            "group_id": group_id,
            "group_state": group.state.value,
            "protocol_type": group.protocol_type or "",
            "protocol_data": group.protocol_name or "" if stable else "",
            "members": [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                 "client_host": m.client_host,
                 "member_metadata": m.metadata_for(group.protocol_name or "") if stable else b"",
                 "member_assignment": m.assignment if stable else b""}
                for m in group.members.values()
            ],
        }

    def list_groups(self) -> list[tuple[str, str, str, str]]:
        """(group id, protocol type, state, group type) of every live group."""
        return [(g.group_id, g.protocol_type or "", g.consumer.state_name() if g.consumer is not None else g.state.value,
                 g.group_type) for g in self.groups.values() if g.state is not GroupState.DEAD]

    def delete_group(self, group_id: str, now_ms: int) -> int:
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.group_id_not_found
        if group.state is not GroupState.EMPTY or group.has_members:
            return ErrorCode.non_empty_group
        self._delete(group, now_ms)
        return ErrorCode.none

    def _delete(self, group: Group, now_ms: int) -> None:
        for (topic, partition) in group.offsets:
            self._records.append(offset_record(group.group_id, topic, partition, None))
        group.offsets.clear()
        group.transition(GroupState.DEAD, now_ms)
        self._records.append(group_metadata_record(group, tombstone=True))
        if group.consumer is not None:
            self._records.append(consumer_group_record(group.group_id, None))
        del self.groups[group.group_id]

    # ---- time ------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        deadlines: list[int] = []
        for g in self.groups.values():
            if g.join_deadline_ms is not None:
                deadlines.append(g.join_deadline_ms)
            if g.sync_deadline_ms is not None:
                deadlines.append(g.sync_deadline_ms)
            deadlines.extend(g.pending_member_ids.values())
            for m in g.members.values():
                if m.join_waiter is None and m.sync_waiter is None:
                    deadlines.append(m.last_heartbeat_ms + m.session_timeout_ms)
            if g.consumer is not None:
                consumer_deadline = self.consumer.next_deadline_ms(g.consumer)
                if consumer_deadline is not None:
                    deadlines.append(consumer_deadline)
            expiry = self._offsets_expiry_ms(g)
            if expiry is not None:
                deadlines.append(expiry)
        return min(deadlines) if deadlines else None

    def _offsets_expiry_ms(self, group: Group) -> int | None:
        """When the group's next offset expires (only empty groups' offsets expire)."""
        if group.state is not GroupState.EMPTY or group.has_members:
            return None
        retention = self.config.offsets_retention_ms
        if group.protocol_type is None:
            if not group.offsets:
                return group.state_timestamp_ms + retention
            return min(c.commit_timestamp_ms for c in group.offsets.values()) + retention
        return group.state_timestamp_ms + retention

    def tick(self, now_ms: int) -> None:
        """Expire sessions, end join and sync phases whose time is up, expire offsets."""
        for group in list(self.groups.values()):
            for member_id, deadline in list(group.pending_member_ids.items()):
                if now_ms >= deadline:
                    del group.pending_member_ids[member_id]
            expired = [m.member_id for m in group.members.values()
                       if m.join_waiter is None and m.sync_waiter is None
                       and now_ms >= m.last_heartbeat_ms + m.session_timeout_ms]
            for member_id in expired:
                self._member_left(group, member_id, now_ms)
            if group.state is GroupState.PREPARING_REBALANCE and group.join_deadline_ms is not None \
                    and now_ms >= group.join_deadline_ms:
                self._complete_join(group, now_ms)
            elif group.state is GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(group, now_ms)
            if group.state is GroupState.COMPLETING_REBALANCE and group.sync_deadline_ms is not None \
                    and now_ms >= group.sync_deadline_ms:
                # Members that never synced are dropped and the rest rebalance.
                laggards = [m.member_id for m in group.members.values() if m.sync_waiter is None]
                for member_id in laggards:
                    self._remove_member(group, member_id)
                self._prepare_rebalance(group, now_ms)
                self._maybe_complete_join(group, now_ms)
            if group.consumer is not None and self.consumer.expire(group.consumer, now_ms):
                self._consumer_group_changed(group, now_ms)
            self._expire_offsets(group, now_ms)

    def _expire_offsets(self, group: Group, now_ms: int) -> None:
        if group.state is not GroupState.EMPTY or group.has_members:
            return
        retention = self.config.offsets_retention_ms
        if group.protocol_type is None and not group.members:
            # Simple (assign-mode) groups: each offset expires on its own commit time.
            for tp, committed in list(group.offsets.items()):
                if now_ms - committed.commit_timestamp_ms >= retention:
                    del group.offsets[tp]
                    self._records.append(offset_record(group.group_id, tp[0], tp[1], None))
        elif now_ms - group.state_timestamp_ms >= retention:
            for tp in list(group.offsets):
                del group.offsets[tp]
                self._records.append(offset_record(group.group_id, tp[0], tp[1], None))
        if not group.offsets and now_ms - group.state_timestamp_ms >= retention:
            self._delete(group, now_ms)
