"""Classic consumer-group membership (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) and
offset commits, as the Java client and librdkafka do it, so members of every client can
share one group: the "consumer" protocol type, the range and roundrobin assignors, eager
rebalancing (all partitions revoked before rejoining).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from tenacity import AsyncRetrying

from cluster.client.assignors import assignor_for
from cluster.client.config import ClientConfig
from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import KafkaError
from cluster.client.metadata import ClientCluster
from cluster.client.retry import retrying
from cluster.client.topic_partition import TopicPartition
from cluster.common.backoff import Backoff
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from cluster.protocol.errors import ErrorCode

log = logging.getLogger("dcmirror.client.group")

COORDINATOR_ERRORS = frozenset({ErrorCode.coordinator_not_available, ErrorCode.not_coordinator,
                                ErrorCode.coordinator_load_in_progress})
REJOIN_ERRORS = frozenset({ErrorCode.rebalance_in_progress, ErrorCode.illegal_generation,
                           ErrorCode.unknown_member_id, ErrorCode.fenced_instance_id})


class CommitFailed(KafkaError):
    """The group rebalanced (or this member was removed) before the commit landed."""


class FencedInstanceId(KafkaError):
    """Another member joined the group with this member's group.instance.id (Java's
    FencedInstanceIdException): fatal for this member, which stops taking part, so the two
    never fence each other in turn."""


class _Rejoin(Exception):
    pass


class GroupCoordinatorChannel:
    """A consumer's way to its group's coordinator: finds it, keeps one connection to it,
    forgets it when it moves, and runs the offset APIs there."""

    def __init__(self, cluster: ClientCluster, group_id: str, config: ClientConfig) -> None:
        self.cluster = cluster
        self.group_id = group_id
        self.config = config
        self.request_timeout_s: float = config["request.timeout.ms"] / 1000
        self.coordinator: int | None = None

    async def connection(self) -> Any:
        node = self.coordinator
        if node is None:
            node = self.coordinator = await self.cluster.coordinator(self.group_id)
        try:
            return await self.cluster.connection(node, lane="group")
        except KafkaConnectionError:
            self.coordinator = None
            raise

    def forget(self) -> None:
        self.coordinator = None

    async def request(self, api_key: int, body: dict[str, Any], timeout_s: float | None = None) -> Any:
        """One request to the group coordinator; a broken connection forgets the coordinator."""
        try:
            conn = await self.connection()
            return await conn.request(api_key, body, timeout_s=timeout_s or self.request_timeout_s)
        except KafkaConnectionError:
            self.forget()
            raise

    def retrying(self) -> AsyncRetrying:
        c = self.config
        return retrying(self.request_timeout_s, c["retry.backoff.ms"], c["retry.backoff.max.ms"],
                        final_codes=REJOIN_ERRORS)

    async def commit_offsets(self, offsets: Mapping[TopicPartition, int],
                             member: GroupMembership | None = None) -> None:
        """OffsetCommit at the coordinator, as `member`'s current generation when in a group."""
        if not offsets:
            return
        topics: dict[str, list[dict[str, Any]]] = {}
        for (t, p), offset in sorted(offsets.items()):
            topics.setdefault(t, []).append({"partition_index": p, "committed_offset": offset,
                                             "committed_leader_epoch": -1, "committed_metadata": ""})
        body = {"group_id": self.group_id,
                "generation_id_or_member_epoch": member.generation if member else -1,
                "member_id": member.member_id if member else "",
                "group_instance_id": (member.instance_id if member else None), "retention_time": -1,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
        what = f"committing offsets of group {self.group_id!r}"
        async for attempt in self.retrying():
            with attempt:
                resp = await self.request(ApiKey.OFFSET_COMMIT, body)
                codes = {p.error_code for t in resp.topics for p in t.partitions} - {0}
                if not codes:
                    return
                code = codes.pop()
                if code == ErrorCode.fenced_instance_id and member is not None:
                    raise member.fence(what)
                if code in REJOIN_ERRORS:
                    if member is not None:
                        member.request_rejoin()
                    raise CommitFailed(what + " (the group rebalanced; the new owner resumes from the last commit)",
                                       code)
                if code in COORDINATOR_ERRORS:
                    self.forget()
                raise KafkaError(what, code)

    async def fetch_committed(self, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        topics: dict[str, list[int]] = {}
        for t, p in tps:
            topics.setdefault(t, []).append(p)
        body = {"group_id": self.group_id, "require_stable": False,
                "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}
        async for attempt in self.retrying():
            with attempt:
                resp = await self.request(ApiKey.OFFSET_FETCH, body)
                if resp.error_code in COORDINATOR_ERRORS:
                    self.forget()
                if resp.error_code != 0:
                    raise KafkaError(f"fetching committed offsets of group {self.group_id!r}", resp.error_code)
        out: dict[TopicPartition, int | None] = {tp: None for tp in tps}
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code == 0 and p.committed_offset >= 0:
                    out[(t.name, p.partition_index)] = p.committed_offset
        return out


class GroupMembership:
    """One member of a classic consumer group, run as a task of its consumer."""

    def __init__(self, channel: GroupCoordinatorChannel, topics: list[str], pattern: re.Pattern[str] | None,
                 on_assign: Callable[[list[TopicPartition]], Awaitable[None]] | None,
                 on_revoke: Callable[[list[TopicPartition]], Awaitable[None]] | None, *,
                 positions: Callable[[], dict[TopicPartition, int]],
                 set_assignment: Callable[[list[TopicPartition]], None],
                 fail: Callable[[Exception], None] | None = None) -> None:
        c = channel.config
        self.channel = channel
        self.cluster = channel.cluster
        self.group_id = channel.group_id
        self.positions = positions  # what auto commit commits: the consumer's positions
        self.set_assignment = set_assignment
        self.topics = topics
        self.pattern = pattern
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.assignors = assignor_for(c["partition.assignment.strategy"])
        self.instance_id: str | None = c["group.instance.id"] or None
        self.fail = fail  # told a fatal error (the consumer raises it from its next poll)
        self.fenced: FencedInstanceId | None = None
        self.member_id = ""
        self.generation = -1
        self.leader = False
        self.assigned: list[TopicPartition] = []
        self.session_timeout_ms: int = c["session.timeout.ms"]
        self.rebalance_timeout_ms: int = c["max.poll.interval.ms"]
        self.heartbeat_s = c["heartbeat.interval.ms"] / 1000
        self.auto_commit: bool = c["enable.auto.commit"]
        self.auto_commit_s = c["auto.commit.interval.ms"] / 1000
        self._rejoin = trio.Event()
        self._subscribed_view: tuple[frozenset[str], tuple[tuple[str, int], ...]] | None = None
        self.stable = trio.Event()  # set while this member holds a stable assignment

    def resubscribe(self, topics: list[str], pattern: re.Pattern[str] | None) -> None:
        self.topics, self.pattern = topics, pattern
        self.request_rejoin()

    def request_rejoin(self) -> None:
        self._rejoin.set()

    def fence(self, what: str) -> FencedInstanceId:
        """This member's group.instance.id was taken over: drop the assignment (no revocation:
        the partitions are the other member's now), tell the consumer, stop."""
        if self.fenced is None:
            self.fenced = FencedInstanceId(
                f"{what}: another member joined group {self.group_id!r} with group.instance.id "
                f"{self.instance_id!r}; this one stops", ErrorCode.fenced_instance_id)
            log.error("%s", self.fenced)
            self.assigned = []
            self.stable = trio.Event()
            self.set_assignment([])
            if self.fail is not None:
                self.fail(self.fenced)
        self._rejoin.set()
        return self.fenced

    def _subscribed_topics(self) -> list[str]:
        if self.pattern is None:
            return sorted(self.topics)
        return sorted(t for t in self.cluster.metadata.topics
                      if self.pattern.fullmatch(t) and not t.startswith("__"))

    def _view(self, topics: list[str]) -> tuple[frozenset[str], tuple[tuple[str, int], ...]]:
        meta = self.cluster.metadata
        return frozenset(topics), tuple(sorted((t, meta.partition_count(t) or 0) for t in topics))

    async def run(self) -> None:
        c = self.channel.config
        backoff = Backoff(c["retry.backoff.ms"] / 1000, c["retry.backoff.max.ms"] / 1000)
        while self.fenced is None:
            try:
                await self._join_and_sync()
                backoff.reset()
                await self._heartbeat_until_rejoin()
            except _Rejoin:
                continue
            except FencedInstanceId:
                return
            except (KafkaConnectionError, KafkaError) as exc:
                delay_s = backoff.next_delay_s()
                log.info("group %s: %s; retrying in %.2f s", self.group_id, exc, delay_s)
                self.channel.forget()
                await trio.sleep(delay_s)

    async def _revoke_all(self) -> None:
        if not self.assigned:
            return
        revoked, self.assigned = self.assigned, []
        self.stable = trio.Event()
        if self.auto_commit:
            try:
                await self.channel.commit_offsets(self.positions(), self)
            except (KafkaConnectionError, KafkaError) as exc:
                log.info("group %s: commit before revocation failed: %s", self.group_id, exc)
        if self.on_revoke is not None:
            await self.on_revoke(revoked)
        self.set_assignment([])

    async def _join_and_sync(self) -> None:
        await self._revoke_all()
        self._rejoin = trio.Event()
        cluster = self.cluster
        if self.pattern is not None:
            cluster.want_topics(None)
        else:
            cluster.want_topics(set(self.topics))
        await cluster.refresh()
        topics = self._subscribed_topics()
        metadata = encode_subscription(topics)
        conn = await self.channel.connection()
        while True:
            resp = await conn.request(ApiKey.JOIN_GROUP, {
                "group_id": self.group_id, "session_timeout": self.session_timeout_ms,
                "rebalance_timeout": self.rebalance_timeout_ms, "member_id": self.member_id,
                "group_instance_id": self.instance_id, "protocol_type": "consumer",
                "protocols": [{"name": a.name, "metadata": metadata} for a in self.assignors]},
                timeout_s=self.rebalance_timeout_ms / 1000 + self.channel.request_timeout_s)
            if resp.error_code == ErrorCode.member_id_required:
                self.member_id = resp.member_id
                continue
            if resp.error_code == ErrorCode.unknown_member_id:
                self.member_id = ""
                continue
            if resp.error_code == ErrorCode.rebalance_in_progress:
                continue
            if resp.error_code == ErrorCode.fenced_instance_id:
                raise self.fence(f"joining group {self.group_id!r}")
            if resp.error_code != 0:
                raise KafkaError(f"joining group {self.group_id!r}", resp.error_code)
            break
        self.member_id, self.generation = resp.member_id, resp.generation_id
        self.leader = resp.leader == resp.member_id
        assignments: list[dict[str, Any]] = []
        if self.leader:
            assignments = await self._lead(resp.protocol_name, resp.members)
        sync = await conn.request(ApiKey.SYNC_GROUP, {
            "group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
            "group_instance_id": self.instance_id, "protocol_type": "consumer",
            "protocol_name": resp.protocol_name, "assignments": assignments},
            timeout_s=self.rebalance_timeout_ms / 1000 + self.channel.request_timeout_s)
        if sync.error_code == ErrorCode.fenced_instance_id:
            raise self.fence(f"syncing group {self.group_id!r}")
        if sync.error_code in REJOIN_ERRORS:
            if sync.error_code == ErrorCode.unknown_member_id:
                self.member_id = ""
            raise _Rejoin()
        if sync.error_code != 0:
            raise KafkaError(f"syncing group {self.group_id!r}", sync.error_code)
        self.assigned = sorted(decode_assignment(sync.assignment))
        self._subscribed_view = self._view(topics)
        log.info("group %s generation %d: member %s%s assigned %s", self.group_id, self.generation, self.member_id,
                 " (leader)" if self.leader else "", self.assigned)
        self.set_assignment(self.assigned)
        if self.on_assign is not None:
            # As the Java consumer's heartbeat thread: the member stays in the group while its
            # callback works (a mirror worker claiming thousands of partitions takes longer than
            # session.timeout.ms); a heartbeat that says rejoin is kept for after the callback.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeat_while_assigning)
                await self.on_assign(list(self.assigned))
                nursery.cancel_scope.cancel()
            if self.fenced is not None:
                raise self.fenced
        self.stable.set()

    async def _heartbeat_while_assigning(self) -> None:
        while not self._rejoin.is_set():
            await trio.sleep(self.heartbeat_s)
            try:
                if await self._heartbeat() is not None:
                    self._rejoin.set()
            except FencedInstanceId:
                return
            except (KafkaConnectionError, KafkaError) as exc:
                log.info("group %s: heartbeat during the assignment callback failed: %s", self.group_id, exc)

    async def _heartbeat(self) -> int | None:
        """One heartbeat: None, or the error that means rejoin (member id forgotten if unknown)."""
        conn = await self.channel.connection()
        resp = await conn.request(ApiKey.HEARTBEAT, {
            "group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
            "group_instance_id": self.instance_id}, timeout_s=self.channel.request_timeout_s)
        if resp.error_code == ErrorCode.fenced_instance_id:
            raise self.fence(f"heartbeat in group {self.group_id!r}")
        if resp.error_code in REJOIN_ERRORS:
            if resp.error_code == ErrorCode.unknown_member_id:
                self.member_id = ""
            log.info("group %s: heartbeat says %s; rejoining", self.group_id, KafkaError("heartbeat", resp.error_code))
            return int(resp.error_code)
        if resp.error_code != 0:
            raise KafkaError(f"heartbeat in group {self.group_id!r}", resp.error_code)
        return None

    async def _lead(self, protocol: str, members: Any) -> list[dict[str, Any]]:
        """The leader's job: assign every member's subscribed partitions with `protocol`."""
        assignor = next((a for a in self.assignors if a.name == protocol), None)
        if assignor is None:
            raise KafkaError(f"group {self.group_id!r} chose assignor {protocol!r}, which this client lacks",
                             ErrorCode.inconsistent_group_protocol)
        subscriptions = {}
        for m in members:
            sub = decode_subscription(m.metadata)
            if m.group_instance_id:
                sub = dataclasses.replace(sub, group_instance_id=m.group_instance_id)
            subscriptions[m.member_id] = sub
        wanted = {t for s in subscriptions.values() for t in s.topics}
        meta = await self.cluster.refresh(wanted)
        counts = {t: n for t in wanted if (n := meta.partition_count(t) or 0) > 0}
        plan = assignor.assign(counts, subscriptions)
        return [{"member_id": member, "assignment": encode_assignment(tps)} for member, tps in plan.items()]

    async def _heartbeat_until_rejoin(self) -> None:
        metadata_max_age_s = self.channel.config["metadata.max.age.ms"] / 1000
        next_commit = trio.current_time() + self.auto_commit_s
        next_metadata = trio.current_time() + metadata_max_age_s
        while True:
            with trio.move_on_after(self.heartbeat_s):
                await self._rejoin.wait()
            if self._rejoin.is_set():
                return
            if await self._heartbeat() is not None:
                return
            now = trio.current_time()
            if self.auto_commit and now >= next_commit:
                next_commit = now + self.auto_commit_s
                try:
                    await self.channel.commit_offsets(self.positions(), self)
                except (KafkaConnectionError, KafkaError) as exc:
                    log.info("group %s: auto commit failed: %s", self.group_id, exc)
            if now >= next_metadata:
                # New matching topics or added partitions need a new assignment.
                next_metadata = now + metadata_max_age_s
                await self.cluster.refresh()
                if self._view(self._subscribed_topics()) != self._subscribed_view:
                    log.info("group %s: subscribed topics or partitions changed; rejoining", self.group_id)
                    return

    async def leave(self) -> None:
        """Commit (with enable.auto.commit) and leave, so the group rebalances at once."""
        if not self.member_id or self.fenced is not None:
            return
        try:
            await self._revoke_all()
            conn = await self.channel.connection()
            await conn.request(ApiKey.LEAVE_GROUP, {"group_id": self.group_id, "member_id": self.member_id,
                                             "members": [{"member_id": self.member_id,
                                                          "group_instance_id": self.instance_id}]},
                               timeout_s=self.channel.request_timeout_s)
        except (KafkaConnectionError, KafkaError) as exc:
            log.info("group %s: leaving failed: %s", self.group_id, exc)
        self.member_id = ""
