"""The Kafka group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, OffsetDelete, DescribeGroups, ListGroups, DeleteGroups, and
KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe.

Each handler turns its request into calls on the sans-IO group coordinator
(cluster/groups/coordinator.py) through its trio shell (cluster/groups/service.py), which
persists what changed before the answer goes out.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import trio

from cluster.broker.context import RequestContext
from cluster.controller.image import MetadataImage
from cluster.groups.assignors import TopicPartitions
from cluster.groups.consumer_group import HeartbeatRequest
from cluster.groups.group_configs import share_group_config
from cluster.groups.service import GroupService
from cluster.groups.share_group import (
    HEARTBEAT_INTERVAL_MS_DEFAULT,
    SESSION_TIMEOUT_MS_DEFAULT,
    ShareGroup,
)
from cluster.groups.share_group_offsets import add_partitions, uninitialized
from cluster.groups.share_state_records import ShareKey
from cluster.groups.share_state_service import ShareStateService
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import (
    AUTHORIZED_OPERATIONS_OMITTED,
    COORDINATOR_GROUP,
    COORDINATOR_SHARE,
    COORDINATOR_TRANSACTION,
)
from cluster.security.acl import AclOperation, ResourceType

log = logging.getLogger(__name__)

CONSUMER_MEMBER_TYPE = 1  # ConsumerGroupDescribe v1 member_type of a KIP-848 member

# FindCoordinator for a transactional id: (error code, coordinator node or None, message).
FindTxnCoordinator = Callable[[str, RequestContext], Awaitable[tuple[int, int | None, str]]]


def offset_commit_answer(req: Any, results: dict[tuple[str, int], int]) -> dict[str, Any]:
    """OffsetCommit / TxnOffsetCommit answer: every asked partition's error code."""
    return {"throttle_time": 0, "topics": [
        {"name": t.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": results[(t.name, p.partition_index)]}
            for p in t.partitions]}
        for t in req.topics]}


class _SubscribableTopics(Mapping[str, tuple[str, int]]):
    """Topic name → (topic id, partition count) of the topics a member may subscribe to
    (not internal, DESCRIBE allowed), looked up in the image on demand: a heartbeat costs
    its subscription's size, not the cluster's topic count (only a regex walks them all)."""

    def __init__(self, image: MetadataImage, ctx: RequestContext) -> None:
        self._image = image
        self._ctx = ctx

    def _visible(self, name: str) -> tuple[str, int] | None:
        topic = self._image.topic(name)
        if topic is None or topic.internal or not self._ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, name):
            return None
        return topic.topic_id, len(topic.partitions)

    def __getitem__(self, name: str) -> tuple[str, int]:
        found = self._visible(name)
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._visible(name) is not None

    def __iter__(self) -> Iterator[str]:
        return (name for name in list(self._image.topics_by_name) if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _describe_error(group_id: str, code: int, message: str) -> dict[str, Any]:
    """A ConsumerGroupDescribe or ShareGroupDescribe group entry carrying an error."""
    return {"error_code": code, "error_message": message, "group_id": group_id, "group_state": "",
            "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "", "members": [],
            "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}


SHARE_GROUPS_MAX = 10_000  # share groups one coordinator holds (a preview: in memory; empty ones make room)
FIND_COORDINATOR_KEYS_MAX = 10_000  # keys one batched FindCoordinator (v4+) may name


class GroupHandlers:
    def __init__(self, service: GroupService, find_transaction_coordinator: FindTxnCoordinator | None = None,
                 persister: ShareStateService | None = None) -> None:
        self.service = service
        self.find_transaction_coordinator = find_transaction_coordinator
        self.persister = persister  # the share coordinator's calls (None: share state in the leaders' memory only)
        self.share_groups: dict[str, ShareGroup] = {}  # KIP-932, the groups this coordinator holds
        # One initialization of share partitions (a first assignment, an alter, a delete) at a time.
        self.share_init_lock = trio.Lock()

    async def handle_find_coordinator(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """FindCoordinator: one key (v0-3) or a batch of them (v4+, KIP-699) of type GROUP,
        TRANSACTION or SHARE (v6+, KIP-932: "group:topicId:partition", CLUSTER_ACTION only;
        answered with the leader of its `__share_group_state` partition)."""
        key_type = getattr(req, "key_type", COORDINATOR_GROUP)
        if version < 4:
            return {"throttle_time": 0, **await self._find_one(version, key_type, req.key, ctx)}
        keys = list(dict.fromkeys(req.coordinator_keys))
        if len(keys) > FIND_COORDINATOR_KEYS_MAX:
            found = [{"key": k, "node_id": -1, "host": "", "port": -1, "error_code": ErrorCode.invalid_request,
                      "error_message": f"at most {FIND_COORDINATOR_KEYS_MAX} keys"} for k in keys]
        else:
            found = [{"key": k, **await self._find_one(version, key_type, k, ctx)} for k in keys]
        return {"throttle_time": 0, "coordinators": found}

    async def _find_one(self, version: int, key_type: int, key: str, ctx: RequestContext) -> dict[str, Any]:
        code: int
        node: int | None
        if key_type == COORDINATOR_GROUP:
            code, node, message = await self._group_coordinator(key, ctx)
        elif key_type == COORDINATOR_TRANSACTION and self.find_transaction_coordinator is not None:
            code, node, message = await self.find_transaction_coordinator(key, ctx)
        elif key_type == COORDINATOR_SHARE and self.persister is not None:
            code, node, message = await self._share_coordinator(version, key, ctx)
        else:
            code, node, message = ErrorCode.invalid_request, None, f"unknown coordinator key type {key_type}"
        endpoint = self.service.image.brokers[node].endpoint(ctx.listener) if node is not None else None
        if endpoint is None:
            if code == ErrorCode.none:
                code, message = ErrorCode.coordinator_not_available, "the coordinator has no endpoint on this listener"
            return {"error_code": code, "error_message": message, "node_id": -1, "host": "", "port": -1}
        return {"error_code": ErrorCode.none, "error_message": None, "node_id": node, "host": endpoint[0],
                "port": endpoint[1]}

    async def _share_coordinator(self, version: int, key: str, ctx: RequestContext) -> tuple[int, int | None, str]:
        assert self.persister is not None
        if version < 6:
            return ErrorCode.invalid_request, None, "key type SHARE needs FindCoordinator v6"
        if not ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION):
            return ErrorCode.cluster_authorization_failed, None, "share coordinator keys need CLUSTER_ACTION"
        node = await self.persister.find_coordinator(key)
        if node is None:
            if self.persister.parse_key(key) is None:
                return ErrorCode.invalid_request, None, f"{key!r} is not a share coordinator key (group:topicId:partition)"
            return ErrorCode.coordinator_not_available, None, "the share coordinator is not available yet"
        return ErrorCode.none, node, ""

    async def _group_coordinator(self, group_id: str, ctx: RequestContext) -> tuple[int, int | None, str]:
        if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            return ErrorCode.group_authorization_failed, None, f"{ctx.principal} may not use group {group_id}"
        node = await self.service.find_coordinator(group_id)
        if node is None:
            return ErrorCode.coordinator_not_available, None, "the group coordinator is not available yet"
        return ErrorCode.none, node, ""

    async def handle_join_group(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "generation_id": -1,
                    "protocol_name": None, "leader": "", "member_id": req.member_id, "members": []}
        if not self.service.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "generation_id": -1,
                    "protocol_name": None, "leader": "", "member_id": req.member_id, "members": []}
        session_ms = int(req.session_timeout.total_seconds() * 1000)
        rebalance = getattr(req, "rebalance_timeout", None)
        rebalance_ms = int(rebalance.total_seconds() * 1000) if rebalance is not None else session_ms
        pending = self.service.coordinator.join_group(
            group_id=req.group_id, member_id=req.member_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            protocol_type=req.protocol_type, protocols=[(p.name, p.metadata) for p in req.protocols],
            session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
            client_id=ctx.client_id, client_host=ctx.client_host,
            require_known_member_id=version >= 4, now_ms=self.service.clock.now_ms(),
        )
        result = await self.service.wait(pending)
        return {"throttle_time": 0, **result}

    async def handle_sync_group(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "assignment": b""}
        if not self.service.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "assignment": b""}
        pending = self.service.coordinator.sync_group(
            group_id=req.group_id, member_id=req.member_id, generation_id=req.generation_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            assignments={a.member_id: a.assignment for a in req.assignments}, now_ms=self.service.clock.now_ms(),
        )
        result = await self.service.wait(pending)
        return {"throttle_time": 0, "error_code": result["error_code"], "assignment": result.get("assignment", b"")}

    async def handle_heartbeat(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed}
        if not self.service.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator}
        result = self.service.coordinator.heartbeat(group_id=req.group_id, member_id=req.member_id,
                                            generation_id=req.generation_id,
                                            group_instance_id=getattr(req, "group_instance_id", None),
                                            now_ms=self.service.clock.now_ms())
        self.service.flush_records()
        return {"throttle_time": 0, **result}

    async def handle_leave_group(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "members": []}
        if not self.service.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "members": []}
        if version >= 3:
            members = [(m.member_id, m.group_instance_id) for m in req.members]
        else:
            members = [(req.member_id, None)]
        result = self.service.coordinator.leave_group(group_id=req.group_id, members=members,
                                                      now_ms=self.service.clock.now_ms(), batched=version >= 3)
        self.service.flush_records()
        return {"throttle_time": 0, **result}

    def screen_offset_commit(self, req: Any, ctx: RequestContext, first_error: int = ErrorCode.none
                             ) -> tuple[dict[tuple[str, int], int], list[tuple[str, int, int, int, str | None]]]:
        """OffsetCommit and TxnOffsetCommit: the partitions refused (group and topic ACLs,
        coordinator, unknown partitions; `first_error` refuses all) and the offsets to commit."""
        known: list[tuple[str, int, int, int, str | None]] = []
        results: dict[tuple[str, int], int] = {}
        if first_error == ErrorCode.none and not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            first_error = ErrorCode.group_authorization_failed
        if first_error == ErrorCode.none and not self.service.owns(req.group_id):
            first_error = ErrorCode.not_coordinator
        for t in req.topics:
            topic_ok = ctx.allowed(AclOperation.READ, ResourceType.TOPIC, t.name)
            for p in t.partitions:
                if first_error != ErrorCode.none:
                    results[(t.name, p.partition_index)] = first_error
                elif not topic_ok:
                    results[(t.name, p.partition_index)] = ErrorCode.topic_authorization_failed
                elif self.service.image.partition(t.name, p.partition_index) is None:
                    results[(t.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
                else:
                    known.append((t.name, p.partition_index, p.committed_offset,
                                  getattr(p, "committed_leader_epoch", -1), p.committed_metadata))
        return results, known

    async def handle_offset_commit(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        results, known = self.screen_offset_commit(req, ctx)
        if known:
            results.update(self.service.coordinator.commit_offsets(
                group_id=req.group_id, member_id=req.member_id,
                generation_id=getattr(req, "generation_id_or_member_epoch", getattr(req, "generation_id", -1)),
                group_instance_id=getattr(req, "group_instance_id", None), offsets=known, now_ms=self.service.clock.now_ms(),
            ))
        # The answer waits until the offsets are on the in-sync replicas, as Kafka's does.
        durable = await self.service.flush_durable(req.group_id)
        if durable != ErrorCode.none:
            results = {tp: durable if code == ErrorCode.none else code for tp, code in results.items()}
        return offset_commit_answer(req, results)

    async def handle_offset_fetch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "topics": []}
        if not self.service.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "topics": []}
        wanted = None if req.topics is None else [(t.name, p) for t in req.topics for p in t.partition_indexes]
        offsets = self.service.coordinator.fetch_offsets(req.group_id, wanted)
        # v7+ (KIP-447): a read_committed consumer asks for stable offsets only.
        unstable = self.service.coordinator.unstable_offsets(req.group_id) if version >= 7 and req.require_stable \
            else set()
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for (topic, partition), committed in offsets.items():
            if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, topic):
                if wanted is not None:
                    by_topic[topic].append({"partition_index": partition, "committed_offset": -1,
                                            "committed_leader_epoch": -1, "metadata": "",
                                            "error_code": ErrorCode.topic_authorization_failed})
                continue  # all offsets asked for: the topics the principal may not see are left out
            if (topic, partition) in unstable:
                by_topic[topic].append({"partition_index": partition, "committed_offset": -1,
                                        "committed_leader_epoch": -1, "metadata": "",
                                        "error_code": ErrorCode.unstable_offset_commit})
                continue
            by_topic[topic].append({
                "partition_index": partition,
                "committed_offset": committed.offset if committed else -1,
                "committed_leader_epoch": committed.leader_epoch if committed else -1,
                "metadata": committed.metadata if committed else "",
                "error_code": ErrorCode.none,
            })
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()]}

    async def handle_offset_delete(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """OffsetDelete (KIP-496): a group's committed offsets of some partitions go (`kafka-
        consumer-groups --delete-offsets`, AdminClient.deleteConsumerGroupOffsets)."""
        if not ctx.allowed(AclOperation.DELETE, ResourceType.GROUP, req.group_id):
            return {"error_code": ErrorCode.group_authorization_failed, "throttle_time": 0, "topics": []}
        if not self.service.owns(req.group_id):
            return {"error_code": ErrorCode.not_coordinator, "throttle_time": 0, "topics": []}
        results: dict[tuple[str, int], int] = {}
        wanted = []
        for t in req.topics:
            readable = ctx.allowed(AclOperation.READ, ResourceType.TOPIC, t.name)
            for p in t.partitions:
                key = (t.name, p.partition_index)
                if not readable:
                    results[key] = ErrorCode.topic_authorization_failed
                elif self.service.image.partition(*key) is None:
                    results[key] = ErrorCode.unknown_topic_or_partition
                else:
                    wanted.append(key)
        code, deleted = self.service.coordinator.delete_offsets(req.group_id, wanted, self.service.clock.now_ms())
        if code != ErrorCode.none:
            return {"error_code": code, "throttle_time": 0, "topics": []}
        results.update(deleted)
        self.service.flush_records()
        return {"error_code": ErrorCode.none, "throttle_time": 0, "topics": [
            {"name": t.name, "partitions": [{"partition_index": p.partition_index,
                                             "error_code": results[(t.name, p.partition_index)]}
                                            for p in t.partitions]}
            for t in req.topics]}

    async def handle_describe_groups(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        groups = []
        for group_id in req.groups:
            if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
                groups.append({"error_code": ErrorCode.group_authorization_failed, "group_id": group_id,
                               "group_state": "", "protocol_type": "", "protocol_data": "", "members": [],
                               "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED})
                continue
            if not self.service.owns(group_id):
                groups.append({"error_code": ErrorCode.not_coordinator, "group_id": group_id, "group_state": "",
                               "protocol_type": "", "protocol_data": "", "members": [],
                               "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED})
                continue
            described = self.service.coordinator.describe(group_id)
            if version >= 6 and group_id not in self.service.coordinator.groups:
                # KIP-1043: v6 names a group that does not exist (v0-5: state Dead, no error).
                described.update(error_code=ErrorCode.group_id_not_found, error_message=f"Group {group_id} not found.")
            described["authorized_operations"] = ctx.authorized_operations(
                ResourceType.GROUP, group_id, asked=bool(getattr(req, "include_authorized_operations", False)))
            groups.append(described)
        return {"throttle_time": 0, "groups": groups}

    # ---- KIP-848 -----------------------------------------------------------------------

    @staticmethod
    def _by_name(image: MetadataImage, tps: Any) -> TopicPartitions | None:
        """A request's (topic id, partitions) as topic name → partitions; ids of topics that
        are gone are left out."""
        if tps is None:
            return None
        out: TopicPartitions = {}
        for tp in tps:
            topic = image.topics.get(str(tp.topic_id)) if tp.topic_id is not None else None
            if topic is not None:
                out.setdefault(topic.name, set()).update(int(p) for p in tp.partitions)
        return out

    @staticmethod
    def _by_id(image: MetadataImage, tps: TopicPartitions, with_names: bool = False) -> list[dict[str, Any]]:
        out = []
        for name, partitions in sorted(tps.items()):
            topic = image.topic(name)
            if topic is not None and partitions:
                entry: dict[str, Any] = {"topic_id": uuid.UUID(topic.topic_id), "partitions": sorted(partitions)}
                if with_names:
                    entry["topic_name"] = name
                out.append(entry)
        return out

    async def handle_consumer_group_heartbeat(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """ConsumerGroupHeartbeat (KIP-848): join, stay, reconcile and leave in one call."""
        def refused(code: int, message: str | None) -> dict[str, Any]:
            # an error answer carries no member id or epoch (their defaults), as Kafka's
            return {"throttle_time": 0, "error_code": code, "error_message": message, "member_id": None,
                    "member_epoch": 0, "heartbeat_interval": 0, "assignment": None}

        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return refused(ErrorCode.group_authorization_failed, f"{ctx.principal} may not use group {req.group_id}")
        if not self.service.owns(req.group_id):
            return refused(ErrorCode.not_coordinator, "this broker does not coordinate the group")
        names = req.subscribed_topic_names
        if names is not None:
            denied = sorted(n for n in names if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, n))
            if denied:
                return refused(ErrorCode.topic_authorization_failed, f"Topics not authorized: {', '.join(denied)}")
        image = self.service.image
        topics = _SubscribableTopics(image, ctx)
        timeout = req.rebalance_timeout
        answer = self.service.coordinator.consumer_group_heartbeat(HeartbeatRequest(
            group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch,
            instance_id=req.instance_id, rack_id=req.rack_id,
            rebalance_timeout_ms=int(timeout.total_seconds() * 1000) if timeout is not None else -1,
            subscribed_topic_names=None if names is None else tuple(names),
            subscribed_topic_regex=getattr(req, "subscribed_topic_regex", None),
            server_assignor=req.server_assignor, owned=self._by_name(image, req.topic_partitions),
            client_id=ctx.client_id, client_host=ctx.client_host, member_id_from_client=version >= 1,
        ), topics, self.service.clock.now_ms())
        durable = await self.service.flush_durable(req.group_id)
        if durable != ErrorCode.none and answer["error_code"] == ErrorCode.none:
            return refused(durable, f"the group's new state is not on its in-sync replicas ({ErrorCode(durable).name})")
        if answer["error_code"] != ErrorCode.none:
            return refused(answer["error_code"], answer["error_message"])
        assignment = answer["assignment"]
        return {"throttle_time": 0, "error_code": answer["error_code"], "error_message": answer["error_message"],
                "member_id": answer["member_id"], "member_epoch": answer["member_epoch"],
                "heartbeat_interval": answer.get("heartbeat_interval_ms", 0),
                "assignment": None if assignment is None else {"topic_partitions": self._by_id(image, assignment)}}

    async def handle_share_group_heartbeat(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """ShareGroupHeartbeat (KIP-932), a preview: the group's membership lives in its
        coordinator's memory (cluster/groups/share_group.py); a member whose group the
        coordinator does not know (it moved) is answered UNKNOWN_MEMBER_ID and joins again."""
        def refused(code: int, message: str | None) -> dict[str, Any]:
            return {"throttle_time": 0, "error_code": code, "error_message": message, "member_id": None,
                    "member_epoch": 0, "heartbeat_interval": 0, "assignment": None}

        if not req.group_id:
            return refused(ErrorCode.invalid_request, "GroupId can not be empty")
        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return refused(ErrorCode.group_authorization_failed, f"{ctx.principal} may not use group {req.group_id}")
        if not self.service.owns(req.group_id):
            return refused(ErrorCode.not_coordinator, "this broker does not coordinate the group")
        if req.group_id in self.service.coordinator.groups:
            return refused(ErrorCode.group_id_not_found, f"Group {req.group_id} is not a share group.")
        names = req.subscribed_topic_names
        if names is not None:
            denied = sorted(n for n in names if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, n))
            if denied:
                return refused(ErrorCode.topic_authorization_failed, f"Topics not authorized: {', '.join(denied)}")
        now = self.service.clock.now_ms()
        group = self.share_groups.get(req.group_id)
        created = group is None
        if group is None:
            if req.member_epoch != 0:
                return refused(ErrorCode.unknown_member_id, f"member {req.member_id} is not in group {req.group_id}")
            if len(self.share_groups) >= SHARE_GROUPS_MAX and not self._forget_an_empty_share_group(now):
                return refused(ErrorCode.group_max_size_reached, "this coordinator holds no more share groups")
            group = self.share_groups[req.group_id] = ShareGroup(req.group_id)
        group.expire(now)
        image = self.service.image
        # the group's own share.session.timeout.ms / share.heartbeat.interval.ms (group configs)
        config = share_group_config(image, req.group_id)
        group.session_timeout_ms = config.session_timeout_ms or SESSION_TIMEOUT_MS_DEFAULT
        group.heartbeat_interval_ms = config.heartbeat_interval_ms or HEARTBEAT_INTERVAL_MS_DEFAULT
        wanted = {t for m in group.members.values() for t in m.subscribed} | set(names or ())
        topics = {t: topic for t in wanted if (topic := image.topic(t)) is not None}
        partitions = {t: len(topic.partitions) for t, topic in topics.items()}
        if self.persister is not None and req.member_epoch != -1:
            # Kafka's rule: a share partition is initialized at the share coordinator before
            # any member is assigned it (here before this heartbeat's assignment is made).
            missing = uninitialized(group.initialized, {topic.topic_id: len(topic.partitions) for topic in topics.values()})
            if missing:
                code = await self._initialize_share_partitions(group, missing)
                if self.share_groups.get(req.group_id) is not group or not self.service.owns(req.group_id):
                    code = ErrorCode.not_coordinator  # moved or deleted meanwhile: the member asks again
                if code != ErrorCode.none:
                    if created and not group.members and self.share_groups.get(req.group_id) is group:
                        self.share_groups.pop(req.group_id, None)
                    return refused(code, "the share group's share partitions are not initialized yet")
        answer = group.heartbeat(req.member_id or "", req.member_epoch, None if names is None else list(names),
                                 req.rack_id, client_id=ctx.client_id, client_host=ctx.client_host, now_ms=now,
                                 partitions=partitions)
        if created and not group.members:  # a first heartbeat refused: no group was made
            self.share_groups.pop(req.group_id, None)
        if answer.error != ErrorCode.none:
            return refused(answer.error, answer.message)
        assignment = None if answer.assignment is None else {"topic_partitions": [
            {"topic_id": uuid.UUID(topic.topic_id), "partitions": list(parts)}
            for name, parts in answer.assignment.items() if (topic := image.topic(name)) is not None]}
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "member_id": answer.member_id, "member_epoch": answer.member_epoch,
                "heartbeat_interval": answer.heartbeat_interval_ms, "assignment": assignment}

    async def _initialize_share_partitions(self, group: ShareGroup, missing: dict[str, set[int]]) -> int:
        """Initialize the group's share partitions it has not initialized yet: those whose
        state the share coordinator holds already (a group that came back after its
        coordinator moved) are taken as they are, the others made afresh (start offset -1:
        the leader starts them at `share.auto.offset.reset`). NONE, or the retriable error
        the heartbeat answers."""
        assert self.persister is not None
        async with self.share_init_lock:
            # another heartbeat may have initialized some while this one waited for the lock
            missing = {t: left for t, ps in missing.items() if (left := ps - group.initialized.get(t, set()))}
            if not missing:
                return ErrorCode.none
            keys = [ShareKey(group.group_id, t, p) for t, ps in sorted(missing.items()) for p in sorted(ps)]
            summaries = await self.persister.summaries(group.group_id, keys)
            fresh = {k: (max(group.group_epoch, 0), -1) for k in keys if summaries[k] == (ErrorCode.none, None)}
            codes = await self.persister.initialize(group.group_id, fresh) if fresh else {}
            failed: int = ErrorCode.none
            for k in keys:
                code = codes.get(k, summaries[k][0])
                if code == ErrorCode.none:
                    add_partitions(group.initialized, k.topic_id, [k.partition])
                else:
                    failed = code
            if failed != ErrorCode.none:
                log.info("initializing share partitions of group %s: error %s", group.group_id, ErrorCode(failed).name)
                return ErrorCode.coordinator_not_available
            return ErrorCode.none

    def new_share_group(self, group_id: str) -> ShareGroup | None:
        """An empty share group made (AlterShareGroupOffsets of a group that does not exist);
        None when this coordinator holds as many as it may, none of them empty."""
        if len(self.share_groups) >= SHARE_GROUPS_MAX and not self._forget_an_empty_share_group(
                self.service.clock.now_ms()):
            return None
        group = self.share_groups[group_id] = ShareGroup(group_id)
        return group

    def _forget_an_empty_share_group(self, now_ms: int) -> bool:
        """Make room for a new share group: forget the oldest one without members (an empty
        share group holds nothing here but its name). False when every one has members."""
        for group_id, group in self.share_groups.items():
            group.expire(now_ms)
            if not group.members:
                del self.share_groups[group_id]
                return True
        return False

    async def _delete_share_group(self, group_id: str, now_ms: int) -> int:
        """DeleteGroups of a share group: an empty one goes with its share partitions' state
        (DeleteShareGroupState, so a later group of that name starts afresh; the group stays
        when that fails, answered with the share coordinator's error), one with members is
        NON_EMPTY_GROUP (as Kafka)."""
        async with self.share_init_lock:
            group = self.share_groups.get(group_id)
            if group is None:
                return ErrorCode.group_id_not_found
            group.expire(now_ms)
            if group.members:
                return ErrorCode.non_empty_group
            keys = [ShareKey(group_id, t, p) for t, ps in sorted(group.initialized.items()) for p in sorted(ps)]
            if self.persister is not None and keys:
                codes = await self.persister.delete(group_id, keys)
                for k in keys:
                    if codes[k] == ErrorCode.none:
                        group.initialized.get(k.topic_id, set()).discard(k.partition)
                group.initialized = {t: ps for t, ps in group.initialized.items() if ps}
                failed = next((c for c in codes.values() if c != ErrorCode.none), ErrorCode.none)
                if failed != ErrorCode.none:
                    log.warning("deleting share group %s: its share state: error %s", group_id, ErrorCode(failed).name)
                    return failed
            if self.share_groups.get(group_id) is group:
                del self.share_groups[group_id]
            return ErrorCode.none

    def _describe_refused(self, group_id: str, ctx: RequestContext) -> dict[str, Any] | None:
        """ConsumerGroupDescribe's and ShareGroupDescribe's group entry when the group may not
        be described here (no DESCRIBE on it, another coordinator), else None."""
        if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            return _describe_error(group_id, ErrorCode.group_authorization_failed,
                                   f"{ctx.principal} may not describe group {group_id}")
        if not self.service.owns(group_id):
            return _describe_error(group_id, ErrorCode.not_coordinator, "this broker does not coordinate the group")
        return None

    async def handle_share_group_describe(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """ShareGroupDescribe (KIP-932): the share groups this coordinator holds (in memory,
        a preview); GROUP_ID_NOT_FOUND for a classic or consumer group or none."""
        groups = []
        asked = bool(req.include_authorized_operations)
        now = self.service.clock.now_ms()
        for group_id in req.group_ids:
            refused = self._describe_refused(group_id, ctx)
            if refused is not None:
                groups.append(refused)
                continue
            group = self.share_groups.get(group_id)
            if group is not None:
                group.expire(now)
            if group is None:
                other = group_id in self.service.coordinator.groups
                groups.append(_describe_error(group_id, ErrorCode.group_id_not_found,
                                              f"Group {group_id} is not a share group." if other
                                              else f"Group {group_id} not found."))
                continue
            image = self.service.image
            groups.append({
                "error_code": ErrorCode.none, "error_message": None, "group_id": group_id,
                "group_state": group.state, "group_epoch": group.group_epoch,
                "assignment_epoch": group.assignment_epoch, "assignor_name": "simple",
                "members": [{
                    "member_id": m.member_id, "rack_id": m.rack_id, "member_epoch": m.member_epoch,
                    "client_id": m.client_id, "client_host": m.client_host,
                    "subscribed_topic_names": list(m.subscribed),
                    "assignment": {"topic_partitions": self._by_id(image, {t: set(ps) for t, ps in m.assignment.items()},
                                                                   with_names=True)},
                } for m in group.members.values()],
                "authorized_operations": ctx.authorized_operations(ResourceType.GROUP, group_id, asked=asked),
            })
        return {"throttle_time": 0, "groups": groups}

    async def handle_consumer_group_describe(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        groups = []
        asked = bool(req.include_authorized_operations)
        for group_id in req.group_ids:
            refused = self._describe_refused(group_id, ctx)
            if refused is not None:
                groups.append(refused)
                continue
            cg = self.service.coordinator.consumer_group(group_id)
            if cg is None:
                exists = group_id in self.service.coordinator.groups
                groups.append(_describe_error(group_id, ErrorCode.group_id_not_found,
                                              f"Group {group_id} is not a consumer group." if exists
                                              else f"Group {group_id} not found."))
                continue
            image = self.service.image
            groups.append({
                "error_code": ErrorCode.none, "error_message": None, "group_id": group_id,
                "group_state": cg.state_name(), "group_epoch": cg.group_epoch,
                "assignment_epoch": cg.assignment_epoch,
                "assignor_name": self.service.coordinator.consumer.assignor_of(cg),
                "members": [{
                    "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
                    "member_epoch": m.member_epoch, "client_id": m.client_id, "client_host": m.client_host,
                    "subscribed_topic_names": list(m.subscribed_topic_names),
                    "subscribed_topic_regex": m.subscribed_topic_regex,
                    "assignment": {"topic_partitions": self._by_id(image, m.assigned, with_names=True)},
                    "target_assignment": {"topic_partitions": self._by_id(image, cg.target.get(m.member_id, {}),
                                                                          with_names=True)},
                    "member_type": CONSUMER_MEMBER_TYPE,
                } for m in cg.members.values()],
                "authorized_operations": ctx.authorized_operations(ResourceType.GROUP, group_id, asked=asked),
            })
        return {"throttle_time": 0, "groups": groups}

    async def handle_list_groups(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """ListGroups; v4 filters by state (KIP-518), v5 by type and answers each group's type
        ("classic", KIP-848's "consumer" or KIP-932's "share"). Filters are case-insensitive,
        as in Kafka."""
        cluster_ok = ctx.allowed_on_cluster(AclOperation.DESCRIBE)
        states = {s.lower() for s in getattr(req, "states_filter", ())}
        types = {t.lower() for t in getattr(req, "types_filter", ())}
        share = [(g, "share", group.state, "share") for g, group in sorted(self.share_groups.items())
                 if self.service.owns(g)]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": [
            {"group_id": g, "protocol_type": ptype, "group_state": state, "group_type": gtype}
            for g, ptype, state, gtype in [*self.service.coordinator.list_groups(), *share]
            if (not states or state.lower() in states) and (not types or gtype in types)
            and (cluster_ok or ctx.allowed(AclOperation.DESCRIBE, ResourceType.GROUP, g))
        ]}

    async def handle_delete_groups(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """DeleteGroups of classic, consumer and share groups: an empty group goes, one with
        members is NON_EMPTY_GROUP."""
        now = self.service.clock.now_ms()

        async def delete(g: str) -> int:
            if not ctx.allowed(AclOperation.DELETE, ResourceType.GROUP, g):
                return ErrorCode.group_authorization_failed
            if not self.service.owns(g):
                return ErrorCode.not_coordinator
            if g in self.share_groups:
                return await self._delete_share_group(g, now)
            return self.service.coordinator.delete_group(g, now)

        # a group named twice is answered once, as Kafka
        results = [{"group_id": g, "error_code": await delete(g)} for g in dict.fromkeys(req.groups_names)]
        self.service.flush_records()
        return {"throttle_time": 0, "results": results}
