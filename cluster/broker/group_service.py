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

    # ---- startup: the internal topic and replay ----------------------------------------

    def open(self, now_ms: int) -> None:
        topics = self.broker.topics.topics
        if OFFSETS_TOPIC not in topics:
            info = self.broker.topics.create(OFFSETS_TOPIC, self.num_partitions, {
                "cleanup.policy": "compact",
                "segment.bytes": str(self.broker.config["offsets.topic.segment.bytes"]),
            }, internal=True)
            for p in range(info.partitions):
                self.broker.create_partition(info, p)
        else:
            self.num_partitions = topics[OFFSETS_TOPIC].partitions
        records: list[tuple[bytes | None, bytes | None]] = []
        for p in range(self.num_partitions):
            part = self.broker.partitions.get((OFFSETS_TOPIC, p))
            if part is not None:
                records.extend(self._read_all(part.log))
        groups = replay(records, now_ms)
        self.coordinator.load(groups)
        if groups:
            log.info("loaded %d group(s) from %s (%d records)", len(groups), OFFSETS_TOPIC, len(records))

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
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "node_id": self.broker.node_id, "host": self.broker.advertised_host,
                "port": self.broker.advertised_port}

    async def handle_join_group(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
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
        pending = self.coordinator.sync_group(
            group_id=req.group_id, member_id=req.member_id, generation_id=req.generation_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            assignments={a.member_id: a.assignment for a in req.assignments}, now_ms=now_ms(),
        )
        result = await self._wait(pending)
        return {"throttle_time": 0, "error_code": result["error_code"], "assignment": result.get("assignment", b"")}

    async def handle_heartbeat(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        result = self.coordinator.heartbeat(group_id=req.group_id, member_id=req.member_id,
                                            generation_id=req.generation_id,
                                            group_instance_id=getattr(req, "group_instance_id", None),
                                            now_ms=now_ms())
        self.flush_records()
        return {"throttle_time": 0, **result}

    async def handle_leave_group(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
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
        for t in req.topics:
            for p in t.partitions:
                if (t.name, p.partition_index) not in self.broker.partitions:
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
        results = [{"group_id": g, "error_code": self.coordinator.delete_group(g, now_ms())} for g in req.groups_names]
        self.flush_records()
        return {"throttle_time": 0, "results": results}
