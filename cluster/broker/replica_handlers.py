"""The Kafka APIs of the data path: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
DeleteRecords, DescribeLogDirs.

They translate requests into calls on the replica manager (cluster/replication), which
owns the partitions, and answers back into the response's fields.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from cluster.broker.context import RequestContext
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import produce_records_problem
from cluster.protocol.sentinels import (
    CONSUMER_REPLICA_ID,
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    READ_COMMITTED,
)
from cluster.replication.replica_manager import FetchPartition, ReplicaManager, mirror_topic_refusal
from cluster.security.acl import AclOperation, ResourceType
from cluster.storage.config import MIRROR_SOURCE

if TYPE_CHECKING:
    from cluster.groups.share_state_service import ShareStateService


def _topic_id(image: Any, name: str) -> uuid.UUID | None:
    info = image.topic(name)
    return uuid.UUID(info.topic_id) if info is not None and info.topic_id else None


def _denied_fetch(partition: int) -> dict[str, Any]:
    return {"partition_index": partition, "error_code": ErrorCode.topic_authorization_failed, "high_watermark": -1,
            "last_stable_offset": -1, "log_start_offset": -1, "preferred_read_replica": -1, "records": b"",
            "aborted_transactions": []}


# ListOffsets: the first version that knows each special timestamp (KIP-734 max timestamp,
# KIP-405's earliest local and latest tiered offsets).
LIST_OFFSETS_MAX_VERSION = 9
_LIST_OFFSETS_SINCE = {LATEST_TIMESTAMP: 0, EARLIEST_TIMESTAMP: 0, MAX_TIMESTAMP: 7, EARLIEST_LOCAL_TIMESTAMP: 8,
                       LATEST_TIERED_TIMESTAMP: 9}

# A DeleteRecords answer waits for the in-sync replicas at most this long, whatever timeout
# the request asks for (as the admin APIs' waits are bounded).
DELETE_RECORDS_MAX_WAIT_S = 300.0

Verifier = Callable[[str, int, int, list[tuple[str, int]]], Awaitable[dict[tuple[str, int], int]]]


class ReplicaHandlers:
    def __init__(self, replicas: ReplicaManager, verify_transaction: Verifier | None = None,
                 share_state: ShareStateService | None = None, broker_config: Mapping[str, Any] | None = None) -> None:
        self.replicas = replicas
        # KIP-890: asks the transaction coordinator before a transaction's first batch
        # lands on a partition (a late produce after the abort would otherwise hang open).
        self.verify_transaction = verify_transaction
        from cluster.broker.share_handlers import ShareHandlers

        self.shares = ShareHandlers(replicas, share_state, broker_config)  # broker_config: group.share.*

    # ---- Produce ---------------------------------------------------------------------

    async def handle_produce(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any] | None:
        if req.transactional_id is not None and not ctx.allowed(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                                                req.transactional_id):
            if req.acks == 0:
                return None
            return {"responses": [
                {"name": t.name, "partition_responses": [
                    {"index": p.index, "error_code": ErrorCode.transactional_id_authorization_failed,
                     "base_offset": -1, "log_start_offset": -1}
                    for p in t.partition_data]}
                for t in req.topic_data
            ], "throttle_time": 0}
        responses = []
        metrics = self.replicas.metrics
        for t in req.topic_data:
            if not ctx.allowed(AclOperation.WRITE, ResourceType.TOPIC, t.name):
                responses.append({"name": t.name, "partition_responses": [
                    {"index": p.index, "error_code": ErrorCode.topic_authorization_failed, "base_offset": -1}
                    for p in t.partition_data]})
                continue
            # A topic the metadata lacks is unknown: Kafka's Produce creates no topic (clients
            # ask Metadata first, which does, with auto.create.topics.enable) and reads no name
            info, error = self.replicas.image.topic(t.name), ErrorCode.unknown_topic_or_partition
            if info is not None and info.internal:
                info, error = None, ErrorCode.invalid_topic_exception  # only the broker writes internal topics
            if info is not None and info.configs.get(MIRROR_SOURCE):
                parts = [mirror_topic_refusal(t.name, info.configs[MIRROR_SOURCE], p.index)
                         for p in t.partition_data]
            elif info is None:
                parts = [{"index": p.index, "error_code": error, "base_offset": -1} for p in t.partition_data]
            else:
                refused = {p.index: r for p in t.partition_data if (r := self._refused(info, p, version, req.acks))}
                verdicts = await self._verified(req.transactional_id, t.name,
                                                [p for p in t.partition_data if p.index not in refused])
                parts = []
                for p in t.partition_data:
                    verdict = refused.get(p.index) or verdicts.get(p.index)
                    parts.append(verdict if isinstance(verdict, dict) else self.replicas.append(
                        t.name, p.index, p.records, min_isr_checked=req.acks == -1, verified=verdict))
                failed = sum(p["error_code"] != ErrorCode.none for p in parts)
                if failed:
                    metrics.topic(t.name).produce_errors += failed
            responses.append({"name": t.name, "partition_responses": parts})
        if req.acks == 0:
            return None
        if req.acks == -1:
            await self.replicas.wait_for_acks_all(responses, max(0.0, req.timeout.total_seconds()))
        return {"responses": responses, "throttle_time": 0}

    @staticmethod
    def _refused(info: Any, p: Any, version: int, acks: int) -> dict[str, Any] | None:
        """A partition's answer when Kafka refuses it before the log (KafkaApis and
        ReplicaManager.appendRecords, in their order): a partition the topic does not have,
        records that are not one whole batch of magic 2, acks other than -1, 0 or 1."""
        if p.index not in info.partitions:
            return {"index": p.index, "error_code": ErrorCode.unknown_topic_or_partition, "base_offset": -1}
        problem = produce_records_problem(p.records, version)
        if problem is not None:
            return {"index": p.index, "error_code": problem[0], "base_offset": -1, "log_start_offset": -1,
                    "error_message": problem[1]}
        if acks not in (-1, 0, 1):
            return {"index": p.index, "error_code": ErrorCode.invalid_required_acks, "base_offset": -1,
                    "log_start_offset": -1}
        return None

    async def _verified(self, txn_id: str | None, topic: str, partitions: list[Any]) -> dict[int, Any]:
        """Per partition of `topic` that opens a transaction here: its guard once the
        coordinator confirmed it, or the produce answer (a dict) when it did not."""
        if txn_id is None or self.verify_transaction is None:
            return {}
        starts = {p.index: s for p in partitions
                  if (s := self.replicas.transaction_start(topic, p.index, p.records)) is not None}
        if not starts:
            return {}
        pid, epoch, _ = next(iter(starts.values()))
        codes = await self.verify_transaction(txn_id, pid, epoch, [(topic, i) for i in starts])
        out: dict[int, Any] = {}
        for index, (producer_id, _, guard) in starts.items():
            code = codes.get((topic, index), ErrorCode.not_enough_replicas)
            if code == ErrorCode.producer_fenced:
                # As Kafka's AddPartitionsToTxnManager: a produce answer says INVALID_PRODUCER_EPOCH,
                # which producers handle (the Java producer aborts; PRODUCER_FENCED would be fatal).
                code = ErrorCode.invalid_producer_epoch
            if code == ErrorCode.none:
                out[index] = guard
            else:
                self.replicas.verification_failed(topic, index, producer_id)
                out[index] = {"index": index, "error_code": code, "base_offset": -1, "log_start_offset": -1,
                              "error_message": f"partition {topic}-{index} is not in an ongoing transaction "
                                               f"of {txn_id}" if code == ErrorCode.invalid_txn_state else None}
        return out

    # ---- ShareFetch, ShareAcknowledge (KIP-932, cluster/broker/share_handlers.py) ------

    async def handle_share_fetch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return await self.shares.handle_share_fetch(version, req, ctx)

    async def handle_share_acknowledge(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return await self.shares.handle_share_acknowledge(version, req, ctx)

    # ---- Fetch -----------------------------------------------------------------------

    async def handle_fetch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if req.replica_id >= 0 and not ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION):
            # Only brokers fetch as replicas (they are super users, or hold CLUSTER_ACTION).
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "session_id": 0,
                    "responses": []}
        session = None
        full = True
        names: list[str | None] = []
        follower = req.replica_id >= 0
        if version >= 7:
            # Incremental fetch sessions (KIP-227), for followers and consumers alike.
            session, full, error = self.replicas.fetch_sessions.open(
                req, owner=("replica", req.replica_id) if follower else ("principal", str(ctx.principal)),
                privileged=follower, by_topic_id=version >= 13, now_ms=self.replicas.clock.now_ms())
            if error != ErrorCode.none:
                return {"throttle_time": 0, "error_code": error, "session_id": 0, "responses": []}
        self.replicas.metrics.fetch_request("follower" if follower else "consumer",
                                            "none" if session is None else "full" if full else "incremental",
                                            sum(len(t.partitions) for t in req.topics))
        image = self.replicas.image
        by_topic: dict[str, list[dict[str, Any]]] = {}
        unknown: list[dict[str, Any]] = []
        if session is not None:
            # Every fetch reads (and authorizes) the session's partitions, listed or not.
            key_of: dict[str, str] = {}  # topic name -> the session's key for it
            lost: dict[str, list[dict[str, Any]]] = {}  # topic ids no topic has (deleted, or created again)
            allowed: dict[str, bool] = {}
            wanted = []
            for key, fp in session.partitions.items():
                topic_key, index = key
                name = topic_key
                if session.by_topic_id:
                    found = image.topics.get(topic_key)
                    if found is None:
                        gone = {**_denied_fetch(index), "error_code": ErrorCode.unknown_topic_id}
                        session.include(key, gone, full)  # sent again once the id is known
                        lost.setdefault(topic_key, []).append(gone)
                        continue
                    name = found.name
                key_of[name] = topic_key
                if not follower:
                    if name not in allowed:
                        allowed[name] = ctx.allowed(AclOperation.READ, ResourceType.TOPIC, name)
                    if not allowed[name]:
                        refused = _denied_fetch(index)
                        session.include(key, refused, full)  # sent again once it is allowed
                        by_topic.setdefault(name, []).append(refused)
                        continue
                wanted.append(FetchPartition(name, index, fp.fetch_offset, fp.partition_max_bytes,
                                             fp.current_leader_epoch, fp.log_start_offset))
            unknown = [{"topic": "", "topic_id": uuid.UUID(topic_key), "partitions": parts}
                       for topic_key, parts in lost.items()]
        else:
            names = self._fetch_topic_names(version, req)
            denied = {name for name in names
                      if name is not None and not ctx.allowed(AclOperation.READ, ResourceType.TOPIC, name)}
            if version >= 9:  # current_leader_epoch from v9, log_start_offset from v5: read directly
                wanted = [FetchPartition(name, fp.partition, fp.fetch_offset, fp.partition_max_bytes,
                                         fp.current_leader_epoch, fp.log_start_offset)
                          for t, name in zip(req.topics, names, strict=True)
                          if name is not None and name not in denied for fp in t.partitions]
            else:
                wanted = [FetchPartition(name, fp.partition, fp.fetch_offset, fp.partition_max_bytes,
                                         getattr(fp, "current_leader_epoch", -1), getattr(fp, "log_start_offset", -1))
                          for t, name in zip(req.topics, names, strict=True)
                          if name is not None and name not in denied for fp in t.partitions]
            for t, named in zip(req.topics, names, strict=True):
                if named is None:
                    unknown.append({"topic": "", "topic_id": t.topic_id, "partitions": [
                        {**_denied_fetch(fp.partition), "error_code": ErrorCode.unknown_topic_id}
                        for fp in t.partitions]})
                elif named in denied:
                    by_topic[named] = [_denied_fetch(fp.partition) for fp in t.partitions]
        answers, _ = await self.replicas.fetch(wanted, replica_id=req.replica_id,
                                               max_wait_s=req.max_wait.total_seconds(),
                                               min_bytes=req.min_bytes, max_bytes=req.max_bytes,
                                               read_committed=getattr(req, "isolation_level", 0) == READ_COMMITTED,
                                               # KIP-392: v11+ consumers say their rack and may
                                               # be sent to, and served by, a follower
                                               client_rack=(req.rack_id or "") if version >= 11 and
                                               not follower else None)
        if session is None:
            for topic, resp in answers:
                by_topic.setdefault(topic, []).append(resp)
        else:
            answered = []
            for topic, resp in answers:
                key = (key_of[topic], resp["partition_index"])
                if session.include(key, resp, full):
                    by_topic.setdefault(topic, []).append(resp)
                    answered.append(key)
            session.answered(answered)
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "session_id": session.session_id if session is not None else 0,
                "responses": [{"topic": t, "topic_id": _topic_id(image, t), "partitions": ps}
                              for t, ps in by_topic.items()] + unknown}

    def _fetch_topic_names(self, version: int, req: Any) -> list[str | None]:
        """Each requested topic's name: as written before v13, by its id from v13 on (KIP-516;
        None for an id no topic has: UNKNOWN_TOPIC_ID)."""
        if version < 13:
            return [t.topic for t in req.topics]
        image = self.replicas.image
        out: list[str | None] = []
        for t in req.topics:
            found = image.topics.get(str(t.topic_id)) if t.topic_id is not None else None
            out.append(found.name if found is not None else None)
        return out

    # ---- ListOffsets -----------------------------------------------------------------

    def list_offset(self, topic: str, index: int, timestamp: int, epoch: int,
                    read_committed: bool = False, version: int = LIST_OFFSETS_MAX_VERSION,
                    client: bool = True) -> dict[str, Any]:
        """One partition of ListOffsets. A special timestamp the request's version does not
        know (-3 before v7, -4 before v8, -5 before v9, any other negative one) is
        UNSUPPORTED_VERSION, as Kafka answers it; without tiered storage the local log start
        (-4) is the log start and nothing is tiered (-5: no offset). A client's (replica id
        -1) latest offset, or offset by time, from a new leader whose high watermark still
        lags its epoch's start is OFFSET_NOT_AVAILABLE (retriable), as Kafka's: the answer
        could be below one the old leader gave."""
        out: dict[str, Any] = {"partition_index": index, "timestamp": -1, "offset": -1, "leader_epoch": -1}
        part, code = self.replicas.leader_partition(topic, index, epoch)
        if part is None:
            return {**out, "error_code": code}
        if timestamp < 0 and version < _LIST_OFFSETS_SINCE.get(timestamp, LIST_OFFSETS_MAX_VERSION + 1):
            return {**out, "error_code": ErrorCode.unsupported_version}
        out["error_code"] = ErrorCode.none
        if client and (timestamp == LATEST_TIMESTAMP or timestamp >= 0) and part.high_watermark_lags_epoch_start:
            return {**out, "error_code": ErrorCode.offset_not_available}
        if timestamp == LATEST_TIMESTAMP:
            out["offset"] = part.last_stable_offset if read_committed else part.high_watermark
        elif timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            out["offset"] = part.log.log_start_offset
        elif timestamp == MAX_TIMESTAMP:
            out["offset"], out["timestamp"] = part.log.max_timestamp_offset()
        elif timestamp >= 0:
            found = part.log.offset_for_timestamp(timestamp)
            bound = part.last_stable_offset if read_committed else part.high_watermark
            if found is not None and found[0] < bound:
                out["offset"], out["timestamp"] = found
        if out["offset"] >= 0:
            out["leader_epoch"] = part.leader_epoch
        return out

    async def handle_list_offsets(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        topics = []
        for t in req.topics:
            if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, t.name):
                parts = [{"partition_index": p.partition_index, "error_code": ErrorCode.topic_authorization_failed,
                          "timestamp": -1, "offset": -1, "leader_epoch": -1} for p in t.partitions]
                topics.append({"name": t.name, "partitions": parts})
                continue
            committed = getattr(req, "isolation_level", 0) == READ_COMMITTED
            client = req.replica_id == CONSUMER_REPLICA_ID
            parts = [
                self.list_offset(t.name, p.partition_index, p.timestamp, getattr(p, "current_leader_epoch", -1),
                                 committed, version, client)
                for p in t.partitions
            ]
            topics.append({"name": t.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    # ---- DeleteRecords ---------------------------------------------------------------

    async def handle_delete_records(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """Kafka's DeleteRecords, sent to each partition's leader: the log start moves to the
        given offset (-1: the high watermark), durable and replicated; the answer waits (at
        most the request's timeout) until every in-sync replica's start got there and gives
        the low watermark. Internal topics are refused, as Kafka does, and mirror topics (their
        log start follows their source's, through MirrorAppend) with INVALID_TOPIC_EXCEPTION."""
        timeout_s = min(max(0.0, req.timeout.total_seconds()), DELETE_RECORDS_MAX_WAIT_S)
        deadline = trio.current_time() + timeout_s
        results: dict[tuple[str, int], dict[str, Any]] = {}

        async def one(topic: str, index: int, offset: int) -> None:
            code, low = await self.replicas.delete_records(topic, index, offset, deadline)
            results[(topic, index)] = {"partition_index": index, "low_watermark": low, "error_code": code}

        topics = []
        async with trio.open_nursery() as nursery:
            for t in req.topics:
                topics.append((t.name, [p.partition_index for p in t.partitions]))
                info = self.replicas.image.topic(t.name)
                refusal = (ErrorCode.topic_authorization_failed
                           if not ctx.allowed(AclOperation.DELETE, ResourceType.TOPIC, t.name)
                           else ErrorCode.unknown_topic_or_partition if info is None
                           else ErrorCode.invalid_topic_exception if info.internal or info.configs.get(MIRROR_SOURCE)
                           else None)
                for p in t.partitions:
                    if refusal is not None:
                        results[(t.name, p.partition_index)] = {"partition_index": p.partition_index,
                                                                "low_watermark": -1, "error_code": refusal}
                    else:
                        nursery.start_soon(one, t.name, p.partition_index, p.offset)
        return {"throttle_time": 0, "topics": [
            {"name": name, "partitions": [results[(name, i)] for i in indexes]} for name, indexes in topics]}

    # ---- DescribeLogDirs -------------------------------------------------------------

    async def handle_describe_log_dirs(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """This broker's data directory (it has one, Kafka's log.dirs with one entry): each
        replica's bytes on disk and how far its log end is behind the high watermark (0 on
        the leader), the disk's total and usable bytes (v4). DESCRIBE on the cluster."""
        if not ctx.allowed_on_cluster(AclOperation.DESCRIBE):
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "results": []}
        data_dir = self.replicas.logs.data_dir
        wanted = None if req.topics is None else {t.topic: set(t.partitions) for t in req.topics}
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), part in sorted(self.replicas.partitions.items()):
            if wanted is not None and index not in wanted.get(topic, ()):
                continue
            lg = part.log
            topics.setdefault(topic, []).append({
                "partition_index": index, "partition_size": lg.size_bytes,
                "offset_lag": max(0, part.high_watermark - lg.log_end_offset) if not part.is_leader else 0,
                "is_future_key": False})
        try:
            disk = os.statvfs(data_dir)
            total, usable = disk.f_blocks * disk.f_frsize, disk.f_bavail * disk.f_frsize
            code = ErrorCode.none
        except OSError:
            total = usable = -1
            code = ErrorCode.kafka_storage_error
        return {"throttle_time": 0, "error_code": ErrorCode.none, "results": [
            {"error_code": code, "log_dir": str(data_dir.resolve()), "total_bytes": total, "usable_bytes": usable,
             "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]}]}

    async def handle_alter_replica_log_dirs(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """AlterReplicaLogDirs v1–2, answered as Kafka's ReplicaManager.alterReplicaLogDirs
        with one log directory, this broker's data directory (as DescribeLogDirs names it):
        a replica there stays there (NONE); another directory is LOG_DIR_NOT_FOUND; a partition
        this broker holds no replica of is REPLICA_NOT_AVAILABLE, one that does not exist
        UNKNOWN_TOPIC_OR_PARTITION. ALTER on the cluster."""
        allowed = ctx.allowed_on_cluster(AclOperation.ALTER)
        home = str(self.replicas.logs.data_dir.resolve())
        results: dict[str, dict[int, int]] = {}
        for d in req.dirs:
            for t in d.topics:
                info = self.replicas.image.topic(t.name)
                for index in t.partitions:
                    if not allowed:
                        code = ErrorCode.cluster_authorization_failed
                    elif len(f"{t.name}-{index}.{uuid.UUID(int=0).hex}-future") > 255:
                        code = ErrorCode.invalid_topic_exception  # Kafka's future log's directory name
                    elif d.path != home:
                        code = ErrorCode.log_dir_not_found
                    elif (t.name, index) in self.replicas.partitions:
                        code = ErrorCode.none
                    elif info is not None and index in info.partitions:
                        code = ErrorCode.replica_not_available
                    else:
                        code = ErrorCode.unknown_topic_or_partition
                    results.setdefault(t.name, {})[index] = code
        return {"throttle_time": 0, "results": [
            {"topic_name": name, "partitions": [{"partition_index": i, "error_code": c} for i, c in parts.items()]}
            for name, parts in results.items()]}

    # ---- OffsetForLeaderEpoch --------------------------------------------------------

    async def handle_offset_for_leader_epoch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        topics = []
        replica = getattr(req, "replica_id", -1) >= 0
        if replica and not ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION):
            return {"throttle_time": 0, "topics": [
                {"topic": t.topic, "partitions": [
                    {"partition": p.partition, "error_code": ErrorCode.cluster_authorization_failed,
                     "leader_epoch": -1, "end_offset": -1} for p in t.partitions]} for t in req.topics]}
        for t in req.topics:
            parts = []
            if not replica and not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, t.topic):
                topics.append({"topic": t.topic, "partitions": [
                    {"partition": p.partition, "error_code": ErrorCode.topic_authorization_failed,
                     "leader_epoch": -1, "end_offset": -1} for p in t.partitions]})
                continue
            for p in t.partitions:
                code, epoch, end = self.replicas.end_offset_for_epoch(
                    t.topic, p.partition, getattr(p, "current_leader_epoch", -1), p.leader_epoch)
                parts.append({"partition": p.partition, "error_code": code, "leader_epoch": epoch, "end_offset": end})
            topics.append({"topic": t.topic, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}
