"""The trio shell around the group coordinator: Kafka group APIs, persistence, timers.

Committed offsets and group metadata are appended to `__consumer_offsets` (compacted,
`offsets.topic.num.partitions` partitions) before a request is answered; at startup the
coordinator state is replayed from that topic.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import trio

from cluster.broker.clock import now_ms
from cluster.controller.service import ControllerUnavailable
from cluster.groups.coordinator import GroupConfig, GroupCoordinator, Pending
from cluster.groups.records import OFFSETS_TOPIC, GroupRecord, partition_for, replay
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import iter_headers
from cluster.protocol.records import Record, decode_batch, encode_batch

if TYPE_CHECKING:
    from cluster.broker.broker import Broker, RequestContext

log = logging.getLogger(__name__)

COORDINATOR_KEY_GROUP = 0
_REPLAY_READ_BYTES = 4 << 20


class GroupService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.coordinator = GroupCoordinator(GroupConfig(
            min_session_timeout_ms=int(cfg["group.min.session.timeout.ms"]),
            max_session_timeout_ms=int(cfg["group.max.session.timeout.ms"]),
            initial_rebalance_delay_ms=int(cfg["group.initial.rebalance.delay.ms"]),
            max_size=int(cfg["group.max.size"]),
            offsets_retention_ms=int(cfg["offsets.retention.minutes"]) * 60_000,
            offset_metadata_max_bytes=int(cfg["offset.metadata.max.bytes"]),
        ))
        self.num_partitions = int(cfg["offsets.topic.num.partitions"])
        self._state_changed = trio.Event()
        self._opened = False
        self._owned: set[int] = set()

    # ---- ownership: a broker coordinates the groups of the offsets partitions it leads ----

    def open(self, now_ms: int) -> None:
        self._opened = True
        self.on_partitions_changed()

    def on_partitions_changed(self) -> None:
        """Load the groups of offsets partitions this broker now leads; unload the others."""
        if not self._opened:
            return
        t = self.broker.image.topic(OFFSETS_TOPIC)
        if t is not None:
            self.num_partitions = len(t.partitions)
        led = {index for (topic, index), part in self.broker.partitions.items()
               if topic == OFFSETS_TOPIC and part.is_leader}
        for index in sorted(self._owned - led):
            dropped = [g for g in self.coordinator.groups if partition_for(g, self.num_partitions) == index]
            for g in dropped:
                del self.coordinator.groups[g]
            log.info("no longer coordinating %d group(s) of %s-%d", len(dropped), OFFSETS_TOPIC, index)
        for index in sorted(led - self._owned):
            part = self.broker.partitions[(OFFSETS_TOPIC, index)]
            records = self._read_all(part.log)
            groups = replay(records, now_ms())
            self.coordinator.load(groups)
            if groups:
                log.info("loaded %d group(s) from %s-%d (%d records)", len(groups), OFFSETS_TOPIC, index, len(records))
        self._owned = led
        self._state_changed.set()

    def owns(self, group_id: str) -> bool:
        return partition_for(group_id, self.num_partitions) in self._owned

    async def ensure_offsets_topic(self) -> bool:
        """Create `__consumer_offsets` once enough brokers are up for its replication factor."""
        if self.broker.image.topic(OFFSETS_TOPIC) is not None:
            return True
        cfg = self.broker.config
        rf = min(int(cfg["offsets.topic.replication.factor"]), self.broker.cluster_size)
        if len(self.broker.image.active_brokers()) < rf:
            return False  # as Kafka: COORDINATOR_NOT_AVAILABLE until the brokers are there
        results = await self.broker.create_topics([{
            "name": OFFSETS_TOPIC, "num_partitions": int(cfg["offsets.topic.num.partitions"]),
            "replication_factor": rf, "internal": True,
            "configs": {"cleanup.policy": "compact", "segment.bytes": str(cfg["offsets.topic.segment.bytes"])},
        }])
        return results[0]["error_code"] in (ErrorCode.none, ErrorCode.topic_already_exists)

    async def offsets_topic_loop(self) -> None:
        """Create the offsets topic when the cluster can hold it, so coordinators are ready early."""
        while not await self.ensure_offsets_topic():
            await trio.sleep(1.0)

    @staticmethod
    def _read_all(lg: Any) -> list[tuple[bytes | None, bytes | None]]:
        out: list[tuple[bytes | None, bytes | None]] = []
        offset = lg.log_start_offset
        while offset < lg.log_end_offset:
            chunk = lg.read(offset, _REPLAY_READ_BYTES, lg.log_end_offset, min_one_batch=True)
            if not chunk:
                break
            for pos, header in iter_headers(chunk):
                _, recs = decode_batch(chunk, pos)
                out.extend((r.key, r.value) for r in recs)
                offset = header.next_offset
        return out

    # ---- persistence and timers ---------------------------------------------------------

    def flush_records(self) -> None:
        """Append what the coordinator produced; raises nothing the caller must handle."""
        records = self.coordinator.take_records()
        self._state_changed.set()
        if not records:
            return
        by_partition: dict[int, list[GroupRecord]] = defaultdict(list)
        for r in records:
            by_partition[partition_for(r.group_id, self.num_partitions)].append(r)
        now = now_ms()
        for p, recs in by_partition.items():
            batch = encode_batch([Record(i, now, r.key, r.value, ()) for i, r in enumerate(recs)])
            response = self.broker.append(OFFSETS_TOPIC, p, batch)
            if response["error_code"] != ErrorCode.none:
                log.error("could not persist %d group record(s) to %s-%d: error %s",
                          len(recs), OFFSETS_TOPIC, p, response["error_code"])

    async def timer_loop(self) -> None:
        while True:
            deadline = self.coordinator.next_deadline_ms()
            self._state_changed = trio.Event()
            if deadline is None:
                await self._state_changed.wait()
                continue
            delay_s = max(0.0, (deadline - now_ms()) / 1000)
            with trio.move_on_after(delay_s):
                await self._state_changed.wait()
                continue
            self.coordinator.tick(now_ms())
            self.flush_records()

    async def _wait(self, pending: Pending) -> dict[str, Any]:
        self.flush_records()
        if not pending.done:
            event = trio.Event()
            pending.on_done = event.set
            await event.wait()
            self.flush_records()
        return pending.result

    # ---- handlers -----------------------------------------------------------------------

    async def handle_find_coordinator(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        key_type = getattr(req, "key_type", COORDINATOR_KEY_GROUP)
        if key_type != COORDINATOR_KEY_GROUP:
            return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available,
                    "error_message": "transaction coordinators are not supported", "node_id": -1, "host": "",
                    "port": -1}
        unavailable = {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available,
                       "error_message": "the group coordinator is not available yet", "node_id": -1, "host": "",
                       "port": -1}
        try:
            if not await self.ensure_offsets_topic():
                return unavailable
        except ControllerUnavailable:
            return unavailable
        part = self.broker.image.partition(OFFSETS_TOPIC, partition_for(req.key, self.num_partitions))
        leader = self.broker.image.brokers.get(part.leader) if part is not None else None
        if leader is None or leader.fenced:
            return unavailable
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "node_id": leader.broker_id, "host": leader.host, "port": leader.port}

    async def handle_join_group(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not self.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "generation_id": -1,
                    "protocol_name": None, "leader": "", "member_id": req.member_id, "members": []}
        session_ms = int(req.session_timeout.total_seconds() * 1000)
        rebalance = getattr(req, "rebalance_timeout", None)
        rebalance_ms = int(rebalance.total_seconds() * 1000) if rebalance is not None else session_ms
        pending = self.coordinator.join_group(
            group_id=req.group_id, member_id=req.member_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            protocol_type=req.protocol_type, protocols=[(p.name, p.metadata) for p in req.protocols],
            session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
            client_id=ctx.client_id, client_host=ctx.client_host,
            require_known_member_id=version >= 4, now_ms=now_ms(),
        )
        result = await self._wait(pending)
        return {"throttle_time": 0, **result}

    async def handle_sync_group(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not self.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "assignment": b""}
        pending = self.coordinator.sync_group(
            group_id=req.group_id, member_id=req.member_id, generation_id=req.generation_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            assignments={a.member_id: a.assignment for a in req.assignments}, now_ms=now_ms(),
        )
        result = await self._wait(pending)
        return {"throttle_time": 0, "error_code": result["error_code"], "assignment": result.get("assignment", b"")}

    async def handle_heartbeat(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not self.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator}
        result = self.coordinator.heartbeat(group_id=req.group_id, member_id=req.member_id,
                                            generation_id=req.generation_id,
                                            group_instance_id=getattr(req, "group_instance_id", None),
                                            now_ms=now_ms())
        self.flush_records()
        return {"throttle_time": 0, **result}

    async def handle_leave_group(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not self.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "members": []}
        if version >= 3:
            members = [(m.member_id, m.group_instance_id) for m in req.members]
        else:
            members = [(req.member_id, None)]
        result = self.coordinator.leave_group(group_id=req.group_id, members=members, now_ms=now_ms())
        self.flush_records()
        return {"throttle_time": 0, **result}

    async def handle_offset_commit(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        known: list[tuple[str, int, int, int, str | None]] = []
        results: dict[tuple[str, int], int] = {}
        owned = self.owns(req.group_id)
        for t in req.topics:
            for p in t.partitions:
                if not owned:
                    results[(t.name, p.partition_index)] = ErrorCode.not_coordinator
                elif self.broker.image.partition(t.name, p.partition_index) is None:
                    results[(t.name, p.partition_index)] = ErrorCode.unknown_topic_or_partition
                else:
                    known.append((t.name, p.partition_index, p.committed_offset,
                                  getattr(p, "committed_leader_epoch", -1), p.committed_metadata))
        if known:
            results.update(self.coordinator.commit_offsets(
                group_id=req.group_id, member_id=req.member_id,
                generation_id=getattr(req, "generation_id_or_member_epoch", getattr(req, "generation_id", -1)),
                group_instance_id=getattr(req, "group_instance_id", None), offsets=known, now_ms=now_ms(),
            ))
        self.flush_records()
        return {"throttle_time": 0, "topics": [
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "error_code": results[(t.name, p.partition_index)]}
                for p in t.partitions
            ]}
            for t in req.topics
        ]}

    async def handle_offset_fetch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not self.owns(req.group_id):
            return {"throttle_time": 0, "error_code": ErrorCode.not_coordinator, "topics": []}
        wanted = None if req.topics is None else [(t.name, p) for t in req.topics for p in t.partition_indexes]
        offsets = self.coordinator.fetch_offsets(req.group_id, wanted)
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for (topic, partition), committed in offsets.items():
            by_topic[topic].append({
                "partition_index": partition,
                "committed_offset": committed.offset if committed else -1,
                "committed_leader_epoch": committed.leader_epoch if committed else -1,
                "metadata": committed.metadata if committed else "",
                "error_code": ErrorCode.none,
            })
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()]}

    async def handle_describe_groups(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        groups = []
        for group_id in req.groups:
            if not self.owns(group_id):
                groups.append({"error_code": ErrorCode.not_coordinator, "group_id": group_id, "group_state": "",
                               "protocol_type": "", "protocol_data": "", "members": [],
                               "authorized_operations": -2147483648})
                continue
            described = self.coordinator.describe(group_id)
            described["authorized_operations"] = -2147483648
            groups.append(described)
        return {"throttle_time": 0, "groups": groups}

    async def handle_list_groups(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": [
            {"group_id": g, "protocol_type": ptype, "group_state": state}
            for g, ptype, state in self.coordinator.list_groups()
        ]}

    async def handle_delete_groups(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        results = [{"group_id": g, "error_code": self.coordinator.delete_group(g, now_ms()) if self.owns(g)
                    else ErrorCode.not_coordinator} for g in req.groups_names]
        self.flush_records()
        return {"throttle_time": 0, "results": results}
