"""The share-group offset admin APIs (KIP-932) at the share group's coordinator, as Kafka 4.3.1
answers them: DescribeShareGroupOffsets (90; v1 with KIP-1226's lag), AlterShareGroupOffsets
(91) and DeleteShareGroupOffsets (92).

The share partitions' states are the share coordinator's (`__share_group_state`,
cluster/groups/share_state_service.py): a describe reads their summaries
(ReadShareGroupStateSummary) and the partitions' high watermarks (ListOffsets to their
leaders) for the lag; an alter, allowed only while the group has no members, initializes
them afresh at the given offsets under a bumped state epoch (InitializeShareGroupState), so a
share-partition leader still holding the old state is fenced at its next write and reads it
again; a delete, likewise only for an empty group, deletes a topic's share partitions
(DeleteShareGroupState). ACLs as Kafka's: DESCRIBE on the group and the topics to describe,
READ on the group and the topics to alter, DELETE on the group and READ on the topics to
delete. The decisions without I/O are in cluster/groups/share_group_offsets.py.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from cluster.broker.context import RequestContext
from cluster.groups.share_group import ShareGroup
from cluster.groups.share_group_offsets import (
    NO_OFFSET_INFORMATION,
    NON_EMPTY_GROUP,
    OFFSETS_PARTITIONS_MAX,
    UNKNOWN_OFFSET,
    UNKNOWN_TOPIC_OR_PARTITION,
    DescribedPartition,
    add_partitions,
    alter_state_epoch,
    described,
)
from cluster.groups.share_state_records import ShareKey
from cluster.groups.share_state_service import ShareStateService
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.replication.replica_manager import ReplicaManager
from cluster.security.acl import AclOperation, ResourceType

if TYPE_CHECKING:
    from cluster.broker.group_handlers import GroupHandlers

ZERO_UUID = uuid.UUID(int=0)
LATEST_TIMESTAMP = -1  # ListOffsets: the high watermark (read_uncommitted)


class ShareOffsetsHandlers:
    def __init__(self, groups: GroupHandlers, persister: ShareStateService, replicas: ReplicaManager) -> None:
        self.groups = groups
        self.persister = persister
        self.replicas = replicas

    @property
    def _image(self) -> Any:
        return self.groups.service.image

    def _share_group(self, group_id: str) -> ShareGroup | None:
        group = self.groups.share_groups.get(group_id)
        if group is not None:
            group.expire(self.groups.service.clock.now_ms())
        return group

    # ---- DescribeShareGroupOffsets ---------------------------------------------------------

    async def handle_describe_share_group_offsets(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return {"throttle_time": 0, "groups": [await self._describe_group(g, ctx) for g in req.groups]}

    async def _describe_group(self, req: Any, ctx: RequestContext) -> dict[str, Any]:
        group_id = req.group_id

        def refused(code: int, message: str) -> dict[str, Any]:
            return {"group_id": group_id, "topics": [], "error_code": code, "error_message": message}

        if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            return refused(ErrorCode.group_authorization_failed, f"{ctx.principal} may not describe group {group_id}")
        if not self.groups.service.owns(group_id):
            return refused(ErrorCode.not_coordinator, "this broker does not coordinate the group")
        image = self._image
        asked: list[tuple[str, list[int]]]  # (topic name, partitions)
        if req.topics is None:  # all: the group's initialized share partitions the principal may see
            group = self._share_group(group_id)
            asked = []
            for topic_id, initialized in sorted((group.initialized if group is not None else {}).items()):
                topic = image.topics.get(topic_id)
                if topic is not None and ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, topic.name):
                    asked.append((topic.name, sorted(initialized)))
        else:
            if sum(len(t.partitions) for t in req.topics) > OFFSETS_PARTITIONS_MAX:
                return refused(ErrorCode.invalid_request, f"at most {OFFSETS_PARTITIONS_MAX} partitions per group")
            asked = [(t.topic_name, [int(p) for p in t.partitions]) for t in req.topics]
        topics: list[dict[str, Any]] = []
        keys: list[tuple[int, ShareKey]] = []  # (index in topics, key)
        for name, parts in asked:
            topic = image.topic(name)
            if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, name):
                topics.append({"topic_name": name, "topic_id": ZERO_UUID, "partitions": [
                    DescribedPartition(p, error_code=ErrorCode.topic_authorization_failed,
                                       error_message="Topic authorization failed.").as_dict() for p in parts]})
            elif topic is None:  # as OffsetFetch: no data, not an error
                topics.append({"topic_name": name, "topic_id": ZERO_UUID,
                               "partitions": [DescribedPartition(p).as_dict() for p in parts]})
            else:
                topics.append({"topic_name": name, "topic_id": uuid.UUID(topic.topic_id), "partitions": []})
                keys.extend((len(topics) - 1, ShareKey(group_id, topic.topic_id, p)) for p in parts)
        summaries = await self.persister.summaries(group_id, [k for _, k in keys]) if keys else {}
        started = sorted({(self._image.topics[k.topic_id].name, k.partition) for _, k in keys
                          if (s := summaries[k][1]) is not None and s.start_offset != UNKNOWN_OFFSET
                          and s.delivery_complete_count >= 0 and k.topic_id in self._image.topics})
        ends = await self.high_watermarks(started) if started else {}
        for index, k in keys:
            code, s = summaries[k]
            name = topics[index]["topic_name"]
            topics[index]["partitions"].append(described(
                k.partition, code, UNKNOWN_OFFSET if s is None else s.start_offset, 0 if s is None else s.leader_epoch,
                -1 if s is None else s.delivery_complete_count, ends.get((name, k.partition))).as_dict())
        return {"group_id": group_id, "topics": topics, "error_code": ErrorCode.none, "error_message": None}

    async def high_watermarks(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(error, high watermark) of each partition: this broker's own when it leads it, else
        asked of the leader (ListOffsets LATEST, read_uncommitted), as Kafka's group
        coordinator asks for a share partition's lag."""
        out: dict[tuple[str, int], tuple[int, int]] = {}
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for name, index in partitions:
            part, code = self.replicas.leader_partition(name, index)
            if part is not None:
                out[(name, index)] = (ErrorCode.none, part.high_watermark)
                continue
            assignment = self._image.partition(name, index)
            if assignment is None or assignment.leader < 0 or assignment.leader == self.replicas.node_id:
                out[(name, index)] = (code or ErrorCode.leader_not_available, -1)
            else:
                by_leader.setdefault(assignment.leader, []).append((name, index))
        for leader, tps in by_leader.items():
            topics: dict[str, list[dict[str, int]]] = {}
            for name, index in tps:
                topics.setdefault(name, []).append({"partition_index": index, "timestamp": LATEST_TIMESTAMP,
                                                    "current_leader_epoch": -1})
            resp = await self.persister.call(leader, ApiKey.LIST_OFFSETS, {
                "replica_id": -1, "isolation_level": 0,
                "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}, version=None)
            for t in resp.topics if resp is not None else ():
                for p in t.partitions:
                    out[(t.name, int(p.partition_index))] = (int(p.error_code), int(p.offset))
            for tp in tps:
                out.setdefault(tp, (ErrorCode.leader_not_available, -1))
        return out

    # ---- AlterShareGroupOffsets ------------------------------------------------------------

    async def handle_alter_share_group_offsets(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        group_id = req.group_id

        def refused(code: int, message: str) -> dict[str, Any]:
            return {"throttle_time": 0, "error_code": code, "error_message": message, "responses": []}

        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, group_id):
            return refused(ErrorCode.group_authorization_failed, f"{ctx.principal} may not use group {group_id}")
        if not group_id:
            return refused(ErrorCode.invalid_group_id, "The group id is invalid.")
        if not self.groups.service.owns(group_id):
            return refused(ErrorCode.not_coordinator, "this broker does not coordinate the group")
        if sum(len(t.partitions) for t in req.topics) > OFFSETS_PARTITIONS_MAX:
            return refused(ErrorCode.invalid_request, f"at most {OFFSETS_PARTITIONS_MAX} partitions per call")
        if group_id in self.groups.service.coordinator.groups:
            return refused(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group.")
        group = self._share_group(group_id)
        if group is not None and group.members:
            return refused(ErrorCode.non_empty_group, NON_EMPTY_GROUP)
        image = self._image
        responses: list[dict[str, Any]] = []
        wanted: dict[ShareKey, tuple[dict[str, Any], int]] = {}  # key -> (its answer, start offset)
        for t in req.topics:
            topic = image.topic(t.topic_name)
            entry: dict[str, Any] = {"topic_name": t.topic_name,
                                     "topic_id": ZERO_UUID if topic is None else uuid.UUID(topic.topic_id),
                                     "partitions": []}
            responses.append(entry)
            denied = not ctx.allowed(AclOperation.READ, ResourceType.TOPIC, t.topic_name)
            for p in t.partitions:
                answer: dict[str, Any] = {"partition_index": int(p.partition_index), "error_code": ErrorCode.none,
                                          "error_message": None}
                entry["partitions"].append(answer)
                if denied:
                    answer.update(error_code=ErrorCode.topic_authorization_failed,
                                  error_message="Topic authorization failed.")
                elif topic is None or not 0 <= p.partition_index < len(topic.partitions):
                    answer.update(error_code=ErrorCode.unknown_topic_or_partition,
                                  error_message=UNKNOWN_TOPIC_OR_PARTITION)
                else:
                    wanted[ShareKey(group_id, topic.topic_id, int(p.partition_index))] = (answer, int(p.start_offset))
        if not wanted:
            return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "responses": responses}
        async with self.groups.share_init_lock:
            group = self._share_group(group_id)
            if group is not None and group.members:  # a member joined meanwhile
                return refused(ErrorCode.non_empty_group, NON_EMPTY_GROUP)
            if group is None:  # as Kafka: altering the offsets of no group makes an empty share group
                group = self.groups.new_share_group(group_id)
                if group is None:
                    return refused(ErrorCode.group_max_size_reached, "this coordinator holds no more share groups")
            group_epoch = group.group_epoch
            summaries = await self.persister.summaries(group_id, wanted)
            starts = {}
            for k, (answer, start) in wanted.items():
                code, s = summaries[k]
                if code != ErrorCode.none:
                    answer.update(error_code=code, error_message=ErrorCode(code).name)
                else:
                    starts[k] = (alter_state_epoch(group_epoch, None if s is None else s.state_epoch), start)
            codes = await self.persister.initialize(group_id, starts) if starts else {}
            for k, code in codes.items():
                if code == ErrorCode.none:
                    add_partitions(group.initialized, k.topic_id, [k.partition])
                else:
                    wanted[k][0].update(error_code=code, error_message=ErrorCode(code).name)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "responses": responses}

    # ---- DeleteShareGroupOffsets -----------------------------------------------------------

    async def handle_delete_share_group_offsets(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        group_id = req.group_id

        def refused(code: int, message: str) -> dict[str, Any]:
            return {"throttle_time": 0, "error_code": code, "error_message": message, "responses": []}

        if not ctx.allowed(AclOperation.DELETE, ResourceType.GROUP, group_id):
            return refused(ErrorCode.group_authorization_failed, f"{ctx.principal} may not delete group {group_id}")
        if not group_id:
            return refused(ErrorCode.invalid_group_id, "The group id is invalid.")
        if not self.groups.service.owns(group_id):
            return refused(ErrorCode.not_coordinator, "this broker does not coordinate the group")
        if len(req.topics) > OFFSETS_PARTITIONS_MAX:
            return refused(ErrorCode.invalid_request, f"at most {OFFSETS_PARTITIONS_MAX} topics per call")
        responses: list[dict[str, Any]] = []
        allowed = []
        for t in req.topics:
            if ctx.allowed(AclOperation.READ, ResourceType.TOPIC, t.topic_name):
                allowed.append(t.topic_name)
            else:
                responses.append({"topic_name": t.topic_name, "topic_id": ZERO_UUID,
                                  "error_code": ErrorCode.topic_authorization_failed,
                                  "error_message": "Topic authorization failed."})
        if group_id in self.groups.service.coordinator.groups:
            return refused(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group.")
        async with self.groups.share_init_lock:
            group = self._share_group(group_id)
            if group is None:
                return refused(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
            if group.members:
                return refused(ErrorCode.non_empty_group, NON_EMPTY_GROUP)
            image = self._image
            doomed: dict[str, list[ShareKey]] = {}  # topic name -> its initialized share partitions
            for name in dict.fromkeys(allowed):
                topic = image.topic(name)
                if topic is None:
                    responses.append({"topic_name": name, "topic_id": ZERO_UUID,
                                      "error_code": ErrorCode.unknown_topic_or_partition,
                                      "error_message": UNKNOWN_TOPIC_OR_PARTITION})
                elif not group.initialized.get(topic.topic_id):
                    responses.append({"topic_name": name, "topic_id": uuid.UUID(topic.topic_id),
                                      "error_code": ErrorCode.unknown_topic_or_partition,
                                      "error_message": NO_OFFSET_INFORMATION})
                else:
                    doomed[name] = [ShareKey(group_id, topic.topic_id, p)
                                    for p in sorted(group.initialized[topic.topic_id])]
            codes = await self.persister.delete(group_id, [k for ks in doomed.values() for k in ks]) if doomed else {}
            for name, ks in doomed.items():
                failed = next((codes[k] for k in ks if codes[k] != ErrorCode.none), ErrorCode.none)
                topic_id = ks[0].topic_id
                if failed == ErrorCode.none:
                    group.initialized.pop(topic_id, None)
                responses.append({"topic_name": name, "topic_id": uuid.UUID(topic_id), "error_code": failed,
                                  "error_message": None if failed == ErrorCode.none else ErrorCode(failed).name})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "responses": responses}
