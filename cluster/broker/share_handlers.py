"""ShareFetch and ShareAcknowledge (KIP-932) at partition leaders: the trio shell over the
share sessions (cluster/groups/share_session.py) and the share partitions
(cluster/groups/share_partition.py) of the partitions this broker leads.

A preview: the share partitions live in this broker's memory (a leader change or a restart
starts them again at the log end, `share.auto.offset.reset=latest`). A connection that ends
takes its share sessions with it, and their members' records go back. docs/share_groups.md
says what comes next.
"""

from __future__ import annotations

import uuid
from typing import Any

import trio

from cluster.broker.context import RequestContext
from cluster.groups.share_group import MEMBER_ID_MAX_CHARS
from cluster.groups.share_partition import LOCK_DURATION_MS_DEFAULT, SharePartition
from cluster.groups.share_session import SharePartitionKey, ShareSessionCache
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import iter_headers
from cluster.replication.partition import Partition
from cluster.replication.replica_manager import ReplicaManager
from cluster.security.acl import AclOperation, ResourceType

SHARE_FETCH_WAIT_MAX_S = 1.0  # a ShareFetch that acquired nothing waits at most this for new records
SHARE_FETCH_POLL_S = 0.05
SHARE_FETCH_READ_BYTES = 1 << 20  # log bytes read per partition and fetch
SHARE_FETCH_RECORDS_MAX = 10_000  # MaxRecords is capped here
SHARE_PARTITIONS_MAX = 100_000  # share partitions one broker keeps (groups x partitions)
EXPIRY_CHECK_MS = 100  # how often requests look for locks that ran out


class ShareHandlers:
    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas
        self.sessions = ShareSessionCache()
        self.partitions: dict[tuple[str, str, int], SharePartition] = {}  # (group, topic, partition)
        self.lock_duration_ms = LOCK_DURATION_MS_DEFAULT
        self._expire_at_ms = 0

    # ---- shared steps ------------------------------------------------------------------

    def _name(self, topic_id: str) -> str | None:
        topic = self.replicas.image.topics.get(topic_id)
        return None if topic is None else topic.name

    def _refused(self, code: int, message: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": code, "error_message": message, "responses": [],
                "node_endpoints": [], **(extra or {})}

    def _checked(self, req: Any, ctx: RequestContext) -> tuple[int, str] | None:
        if not req.group_id:
            return ErrorCode.invalid_request, "GroupId must be set"
        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return ErrorCode.group_authorization_failed, f"{ctx.principal} may not use group {req.group_id}"
        if not req.member_id or len(req.member_id) > MEMBER_ID_MAX_CHARS:
            return ErrorCode.invalid_request, "MemberId must be 1 to 36 characters"
        return None

    def _expire(self, now_ms: int) -> None:
        """Locks that ran out, released: checked by the requests that come, at most every
        EXPIRY_CHECK_MS (a walk over every share partition's records in flight)."""
        if now_ms < self._expire_at_ms:
            return
        self._expire_at_ms = now_ms + EXPIRY_CHECK_MS
        for sp in self.partitions.values():
            sp.expire_locks(now_ms)

    def _release(self, released: tuple[tuple[str, str, frozenset[SharePartitionKey]], ...]) -> None:
        for group_id, member_id, keys in released:
            for topic_id, index in keys:
                name = self._name(topic_id)
                sp = self.partitions.get((group_id, name, index)) if name is not None else None
                if sp is not None:
                    sp.release_member(member_id)

    def _acknowledge(self, group_id: str, member_id: str, topics: Any, now_ms: int,
                     ctx: RequestContext) -> dict[SharePartitionKey, int]:
        """Each partition's acknowledgement batches applied: its error code."""
        out: dict[SharePartitionKey, int] = {}
        for t in topics:
            topic_id = str(t.topic_id)
            name = self._name(topic_id)
            for p in t.partitions:
                if not p.acknowledgement_batches:
                    continue
                key = (topic_id, int(p.partition_index))
                if name is None:
                    out[key] = ErrorCode.unknown_topic_id
                elif not ctx.allowed(AclOperation.READ, ResourceType.TOPIC, name):
                    out[key] = ErrorCode.topic_authorization_failed
                else:
                    sp = self.partitions.get((group_id, name, key[1]))
                    batches = [(int(b.first_offset), int(b.last_offset), [int(x) for x in b.acknowledge_types])
                               for b in p.acknowledgement_batches]
                    out[key] = (ErrorCode.invalid_record_state if sp is None
                                else sp.acknowledge(member_id, batches, now_ms, renew_allowed=False))
        return out

    def _leader(self, name: str, index: int) -> dict[str, int]:
        assignment = self.replicas.image.partition(name, index)
        if assignment is None:
            return {"leader_id": -1, "leader_epoch": -1}
        return {"leader_id": assignment.leader, "leader_epoch": assignment.leader_epoch}

    def _acquire(self, group_id: str, member_id: str, name: str, part: Partition, budget: int,
                 now_ms: int) -> tuple[bytes, list[dict[str, int]]]:
        """Records for `member_id` from the share partition: (the log's whole batches holding
        them, the acquired ranges). A new share partition starts at the high watermark."""
        key = (group_id, name, part.index)
        sp = self.partitions.get(key)
        if sp is None:
            if len(self.partitions) >= SHARE_PARTITIONS_MAX:
                return b"", []
            sp = self.partitions[key] = SharePartition(part.high_watermark, lock_duration_ms=self.lock_duration_ms)
        sp.move_log_start(part.log.log_start_offset)
        start = sp.fetch_offset()
        if start is None or budget <= 0:
            return b"", []
        read = part.read_records(start, SHARE_FETCH_READ_BYTES, replica_id=-1, current_leader_epoch=-1,
                                 min_one_batch=True, now_ms=now_ms)
        if read.error != ErrorCode.none or not read.records:
            return b"", []
        data = read.records
        spans: list[tuple[int, int, int, int]] = []  # (position, bytes, base offset, last offset)
        offsets: list[int] = []
        skipped: list[int] = []
        for pos, header in iter_headers(data):
            if header.last_offset < start:
                continue
            spans.append((pos, header.size_bytes, header.base_offset, header.last_offset))
            (skipped if header.is_control else offsets).extend(range(max(header.base_offset, start),
                                                                     header.last_offset + 1))
        got = sp.acquire(member_id, offsets, now_ms, budget, skipped=skipped)
        if not got:
            return b"", []
        first, last = got[0].first_offset, got[-1].last_offset
        used = [(pos, size) for pos, size, base, end in spans if end >= first and base <= last]
        begin, finish = used[0][0], used[-1][0] + used[-1][1]
        return bytes(data[begin:finish]), [{"first_offset": r.first_offset, "last_offset": r.last_offset,
                                            "delivery_count": r.delivery_count} for r in got]

    def connection_closed(self, connection: object) -> None:
        """A client's connection ended (closed, or the client died): its share sessions end
        and what their members held goes back (Kafka's ShareSessionCache does the same)."""
        self._release(tuple(self.sessions.connection_closed(connection)))

    # ---- ShareFetch --------------------------------------------------------------------

    async def handle_share_fetch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        lock = {"acquisition_lock_timeout": self.lock_duration_ms}
        problem = self._checked(req, ctx)
        if problem is not None:
            return self._refused(*problem, lock)
        group_id, member_id, epoch = req.group_id, req.member_id, int(req.share_session_epoch)
        now = self.replicas.clock.now_ms()
        self._expire(now)
        acking = any(p.acknowledgement_batches for t in req.topics for p in t.partitions)
        if epoch == 0 and acking:
            return self._refused(ErrorCode.invalid_request, "a share session's first fetch acknowledges nothing",
                                 lock)
        update = self.sessions.fetch(group_id, member_id, epoch, ctx.connection,
                                     add=[(str(t.topic_id), int(p.partition_index)) for t in req.topics
                                          for p in t.partitions],
                                     forget=[(str(t.topic_id), int(p)) for t in req.forgotten_topics_data
                                             for p in t.partitions])
        if update.error != ErrorCode.none or update.session is None:
            self._release(update.released)
            return self._refused(update.error, f"share session: {ErrorCode(update.error).name}", lock)
        if epoch == 0:
            self._release(update.released)  # the member's previous session: replaced
        acks = self._acknowledge(group_id, member_id, req.topics, now, ctx)
        if epoch == -1:
            self._release(update.released)  # closing: acknowledged first, what is left goes back
        keys = sorted(acks) if epoch == -1 else sorted(update.session.partitions | set(acks))
        answers: dict[SharePartitionKey, dict[str, Any]] = {}
        ready: list[tuple[SharePartitionKey, str, Partition]] = []
        for key in keys:
            topic_id, index = key
            name = self._name(topic_id)
            entry: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.none, "error_message": None,
                                     "acknowledge_error_code": acks.get(key, ErrorCode.none),
                                     "acknowledge_error_message": None,
                                     "current_leader": {"leader_id": -1, "leader_epoch": -1},
                                     "records": b"", "acquired_records": []}
            answers[key] = entry
            if name is None:
                entry["error_code"] = ErrorCode.unknown_topic_id
                continue
            entry["current_leader"] = self._leader(name, index)
            if not ctx.allowed(AclOperation.READ, ResourceType.TOPIC, name):
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            part, code = self.replicas.leader_partition(name, index)
            if part is None:
                entry["error_code"] = code
                continue
            ready.append((key, name, part))
        if epoch != -1 and ready:
            budget = min(max(0, int(req.max_records)), SHARE_FETCH_RECORDS_MAX)
            waited = min(max(0.0, req.max_wait.total_seconds()), SHARE_FETCH_WAIT_MAX_S)
            deadline = trio.current_time() + waited
            while True:
                now = self.replicas.clock.now_ms()
                taken = 0
                for key, name, part in ready:
                    if taken >= budget:
                        break
                    data, acquired = self._acquire(group_id, member_id, name, part, budget - taken, now)
                    if acquired:
                        answers[key]["records"] = data
                        answers[key]["acquired_records"] = acquired
                        taken += sum(r["last_offset"] - r["first_offset"] + 1 for r in acquired)
                if taken or budget == 0 or trio.current_time() >= deadline:
                    break
                await trio.sleep(SHARE_FETCH_POLL_S)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic_id, _), entry in answers.items():
            by_topic.setdefault(topic_id, []).append(entry)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, **lock,
                "responses": [{"topic_id": uuid.UUID(t), "partitions": ps} for t, ps in by_topic.items()],
                "node_endpoints": []}

    # ---- ShareAcknowledge --------------------------------------------------------------

    async def handle_share_acknowledge(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        problem = self._checked(req, ctx)
        if problem is not None:
            return self._refused(*problem)
        group_id, member_id, epoch = req.group_id, req.member_id, int(req.share_session_epoch)
        now = self.replicas.clock.now_ms()
        self._expire(now)
        update = self.sessions.acknowledge(group_id, member_id, epoch)
        if update.error != ErrorCode.none:
            return self._refused(update.error, f"share session: {ErrorCode(update.error).name}")
        acks = self._acknowledge(group_id, member_id, req.topics, now, ctx)
        self._release(update.released)  # a closing session: what its member still holds goes back
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic_id, index), code in sorted(acks.items()):
            name = self._name(topic_id)
            by_topic.setdefault(topic_id, []).append({
                "partition_index": index, "error_code": code, "error_message": None,
                "current_leader": self._leader(name, index) if name is not None else
                {"leader_id": -1, "leader_epoch": -1}})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "responses": [{"topic_id": uuid.UUID(t), "partitions": ps} for t, ps in by_topic.items()],
                "node_endpoints": []}
