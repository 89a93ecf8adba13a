"""Classic consumer-group membership (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) and
offset commits, as the Java client and librdkafka do it, so members of every client can
share one group: the "consumer" protocol type, the range and roundrobin assignors, eager
rebalancing (all partitions revoked before rejoining).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio
from tenacity import AsyncRetrying

from cluster.client.assignors import (
    assignor_for,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import KafkaError
from cluster.client.retry import retrying
from cluster.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from cluster.client.consumer import Consumer, TopicPartition

log = logging.getLogger("dcmirror.client.group")

OFFSET_COMMIT = 8
OFFSET_FETCH = 9
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14

COORDINATOR_ERRORS = frozenset({ErrorCode.coordinator_not_available, ErrorCode.not_coordinator,
                                ErrorCode.coordinator_load_in_progress})
REJOIN_ERRORS = frozenset({ErrorCode.rebalance_in_progress, ErrorCode.illegal_generation,
                           ErrorCode.unknown_member_id, ErrorCode.fenced_instance_id})


class CommitFailed(KafkaError):
    """The group rebalanced (or this member was removed) before the commit landed."""


class _Rejoin(Exception):
    pass


async def _coordinator_conn(consumer: Consumer) -> Any:
    node = consumer._coordinator
    if node is None:
        node = consumer._coordinator = await consumer.cluster.coordinator(consumer.group_id)
    try:
        return await consumer.cluster.connection(node, lane="group")
    except KafkaConnectionError:
        consumer._coordinator = None
        raise


def _forget_coordinator(consumer: Consumer) -> None:
    consumer._coordinator = None


async def commit_offsets(consumer: Consumer, offsets: dict[TopicPartition, int]) -> None:
    """OffsetCommit at the coordinator, as the current generation's member when in a group."""
    if not offsets:
        return
    group = consumer.group
    topics: dict[str, list[dict[str, Any]]] = {}
    for (t, p), offset in sorted(offsets.items()):
        topics.setdefault(t, []).append({"partition_index": p, "committed_offset": offset,
                                         "committed_leader_epoch": -1, "committed_metadata": ""})
    body = {"group_id": consumer.group_id,
            "generation_id_or_member_epoch": group.generation if group else -1,
            "member_id": group.member_id if group else "",
            "group_instance_id": (group.instance_id if group else None), "retention_time": -1,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
    what = f"committing offsets of group {consumer.group_id!r}"
    async for attempt in _retrying(consumer):
        with attempt:
            resp = await _coordinator_request(consumer, OFFSET_COMMIT, body)
            codes = {p.error_code for t in resp.topics for p in t.partitions} - {0}
            if not codes:
                return
            code = codes.pop()
            if code in REJOIN_ERRORS:
                if group is not None:
                    group.request_rejoin()
                raise CommitFailed(what + " (the group rebalanced; the new owner resumes from the last commit)", code)
            if code in COORDINATOR_ERRORS:
                _forget_coordinator(consumer)
            raise KafkaError(what, code)


async def _coordinator_request(consumer: Consumer, api_key: int, body: dict[str, Any]) -> Any:
    """One request to the group coordinator; a broken connection forgets the coordinator."""
    try:
        conn = await _coordinator_conn(consumer)
        return await conn.request(api_key, body, timeout_s=consumer.request_timeout_s)
    except KafkaConnectionError:
        _forget_coordinator(consumer)
        raise


def _retrying(consumer: Consumer) -> AsyncRetrying:
    c = consumer.config
    return retrying(consumer.request_timeout_s, c["retry.backoff.ms"], c["retry.backoff.max.ms"],
                    final_codes=REJOIN_ERRORS)


async def fetch_committed(consumer: Consumer, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
    topics: dict[str, list[int]] = {}
    for t, p in tps:
        topics.setdefault(t, []).append(p)
    body = {"group_id": consumer.group_id, "require_stable": False,
            "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}
    async for attempt in _retrying(consumer):
        with attempt:
            resp = await _coordinator_request(consumer, OFFSET_FETCH, body)
            if resp.error_code in COORDINATOR_ERRORS:
                _forget_coordinator(consumer)
            if resp.error_code != 0:
                raise KafkaError(f"fetching committed offsets of group {consumer.group_id!r}", resp.error_code)
    out: dict[TopicPartition, int | None] = {tp: None for tp in tps}
    for t in resp.topics:
        for p in t.partitions:
            if p.error_code == 0 and p.committed_offset >= 0:
                out[(t.name, p.partition_index)] = p.committed_offset
    return out


class GroupMembership:
    """One member of a classic consumer group, run as a task of its consumer."""

    def __init__(self, consumer: Consumer, topics: list[str], pattern: re.Pattern[str] | None,
                 on_assign: Callable[[list[TopicPartition]], Awaitable[None]] | None,
                 on_revoke: Callable[[list[TopicPartition]], Awaitable[None]] | None) -> None:
        c = consumer.config
        self.consumer = consumer
        self.group_id = consumer.group_id
        self.topics = topics
        self.pattern = pattern
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.assignors = assignor_for(c["partition.assignment.strategy"])
        self.instance_id: str | None = c["group.instance.id"] or None
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

    def _subscribed_topics(self) -> list[str]:
        if self.pattern is None:
            return sorted(self.topics)
        return sorted(t for t in self.consumer.cluster.metadata.topics
                      if self.pattern.fullmatch(t) and not t.startswith("__"))

    def _view(self, topics: list[str]) -> tuple[frozenset[str], tuple[tuple[str, int], ...]]:
        meta = self.consumer.cluster.metadata
        return frozenset(topics), tuple(sorted((t, meta.partition_count(t) or 0) for t in topics))

    async def run(self) -> None:
        backoff_s = self.consumer.config["retry.backoff.ms"] / 1000
        while True:
            try:
                await self._join_and_sync()
                backoff_s = self.consumer.config["retry.backoff.ms"] / 1000
                await self._heartbeat_until_rejoin()
            except _Rejoin:
                continue
            except (KafkaConnectionError, KafkaError) as exc:
                log.info("group %s: %s; retrying in %.2f s", self.group_id, exc, backoff_s)
                _forget_coordinator(self.consumer)
                await trio.sleep(backoff_s * random.uniform(0.8, 1.2))
                backoff_s = min(2 * backoff_s, self.consumer.config["retry.backoff.max.ms"] / 1000)

    async def _revoke_all(self) -> None:
        if not self.assigned:
            return
        revoked, self.assigned = self.assigned, []
        self.stable = trio.Event()
        if self.auto_commit:
            offsets = {tp: s.position for tp, s in self.consumer._assigned.items() if s.position is not None}
            try:
                await commit_offsets(self.consumer, offsets)
            except (KafkaConnectionError, KafkaError) as exc:
                log.info("group %s: commit before revocation failed: %s", self.group_id, exc)
        if self.on_revoke is not None:
            await self.on_revoke(revoked)
        self.consumer._set_assignment([])

    async def _join_and_sync(self) -> None:
        await self._revoke_all()
        self._rejoin = trio.Event()
        cluster = self.consumer.cluster
        if self.pattern is not None:
            cluster.want_topics(None)
        else:
            cluster.want_topics(set(self.topics))
        await cluster.refresh()
        topics = self._subscribed_topics()
        metadata = encode_subscription(topics)
        conn = await _coordinator_conn(self.consumer)
        while True:
            resp = await conn.request(JOIN_GROUP, {
                "group_id": self.group_id, "session_timeout": self.session_timeout_ms,
                "rebalance_timeout": self.rebalance_timeout_ms, "member_id": self.member_id,
                "group_instance_id": self.instance_id, "protocol_type": "consumer",
                "protocols": [{"name": a.name, "metadata": metadata} for a in self.assignors]},
                timeout_s=self.rebalance_timeout_ms / 1000 + self.consumer.request_timeout_s)
            if resp.error_code == ErrorCode.member_id_required:
                self.member_id = resp.member_id
                continue
            if resp.error_code == ErrorCode.unknown_member_id:
                self.member_id = ""
                continue
            if resp.error_code == ErrorCode.rebalance_in_progress:
                continue
            if resp.error_code != 0:
                raise KafkaError(f"joining group {self.group_id!r}", resp.error_code)
            break
        self.member_id, self.generation = resp.member_id, resp.generation_id
        self.leader = resp.leader == resp.member_id
        assignments: list[dict[str, Any]] = []
        if self.leader:
            assignments = await self._lead(resp.protocol_name, resp.members)
        sync = await conn.request(SYNC_GROUP, {
            "group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
            "group_instance_id": self.instance_id, "protocol_type": "consumer",
            "protocol_name": resp.protocol_name, "assignments": assignments},
            timeout_s=self.rebalance_timeout_ms / 1000 + self.consumer.request_timeout_s)
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
        self.consumer._set_assignment(self.assigned)
        if self.on_assign is not None:
            await self.on_assign(list(self.assigned))
        self.stable.set()

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
        meta = await self.consumer.cluster.refresh(wanted)
        counts = {t: n for t in wanted if (n := meta.partition_count(t) or 0) > 0}
        plan = assignor.assign(counts, subscriptions)
        return [{"member_id": member, "assignment": encode_assignment(tps)} for member, tps in plan.items()]

    async def _heartbeat_until_rejoin(self) -> None:
        consumer = self.consumer
        next_commit = trio.current_time() + self.auto_commit_s
        next_metadata = trio.current_time() + consumer.config["metadata.max.age.ms"] / 1000
        while True:
            with trio.move_on_after(self.heartbeat_s):
                await self._rejoin.wait()
            if self._rejoin.is_set():
                return
            conn = await _coordinator_conn(consumer)
            resp = await conn.request(HEARTBEAT, {"group_id": self.group_id, "generation_id": self.generation,
                                                  "member_id": self.member_id, "group_instance_id": self.instance_id},
                                      timeout_s=consumer.request_timeout_s)
            if resp.error_code in REJOIN_ERRORS:
                if resp.error_code in (ErrorCode.unknown_member_id, ErrorCode.fenced_instance_id):
                    self.member_id = ""
                log.info("group %s: heartbeat says %s; rejoining", self.group_id,
                         KafkaError("heartbeat", resp.error_code))
                return
            if resp.error_code != 0:
                raise KafkaError(f"heartbeat in group {self.group_id!r}", resp.error_code)
            now = trio.current_time()
            if self.auto_commit and now >= next_commit:
                next_commit = now + self.auto_commit_s
                offsets = {tp: s.position for tp, s in consumer._assigned.items() if s.position is not None}
                try:
                    await commit_offsets(consumer, offsets)
                except (KafkaConnectionError, KafkaError) as exc:
                    log.info("group %s: auto commit failed: %s", self.group_id, exc)
            if now >= next_metadata:
                # New matching topics or added partitions need a new assignment.
                next_metadata = now + consumer.config["metadata.max.age.ms"] / 1000
                await consumer.cluster.refresh()
                if self._view(self._subscribed_topics()) != self._subscribed_view:
                    log.info("group %s: subscribed topics or partitions changed; rejoining", self.group_id)
                    return

    async def leave(self) -> None:
        """Commit (with enable.auto.commit) and leave, so the group rebalances at once."""
        if not self.member_id:
            return
        try:
            await self._revoke_all()
            conn = await _coordinator_conn(self.consumer)
            await conn.request(LEAVE_GROUP, {"group_id": self.group_id, "member_id": self.member_id,
                                             "members": [{"member_id": self.member_id,
                                                          "group_instance_id": self.instance_id}]},
                               timeout_s=self.consumer.request_timeout_s)
        except (KafkaConnectionError, KafkaError) as exc:
            log.info("group %s: leaving failed: %s", self.group_id, exc)
        self.member_id = ""
