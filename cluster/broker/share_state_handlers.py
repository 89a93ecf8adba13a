"""Kafka's inter-broker share-state calls (KIP-932), answered by the share coordinator of
this broker (cluster/groups/share_state_service.py): InitializeShareGroupState (83),
ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86) and
ReadShareGroupStateSummary (87). Share-partition leaders send them; they need
CLUSTER_ACTION, as in Kafka.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.broker.context import RequestContext
from cluster.groups.share_coordinator import Decision, ShareCoordinator
from cluster.groups.share_partition import RecordState, StateBatch
from cluster.groups.share_state_records import STATE_BATCHES_MAX, ShareKey, delivery_complete_count
from cluster.groups.share_state_service import ShareStateService
from cluster.protocol.errors import ErrorCode
from cluster.security.acl import AclOperation

PARTITIONS_PER_CALL_MAX = 10_000  # share partitions one share-state call may name


class ShareStateHandlers:
    def __init__(self, service: ShareStateService) -> None:
        self.service = service

    async def _each(self, req: Any, ctx: RequestContext, answer: Callable[[Any, Decision], dict[str, Any]],
                    decide: Callable[[ShareKey, Any], Callable[[ShareCoordinator], Decision] | Decision]
                    ) -> dict[str, Any]:
        """Every named share partition decided in turn; `decide` gives the coordinator call
        or, for a request refused before it reaches the coordinator, the refusal."""
        allowed = ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION)
        too_many = sum(len(t.partitions) for t in req.topics) > PARTITIONS_PER_CALL_MAX
        results = []
        for t in req.topics:
            out = []
            for p in t.partitions:
                key = ShareKey(req.group_id, str(t.topic_id), int(p.partition))
                if not allowed:
                    d = Decision(ErrorCode.cluster_authorization_failed, "share-state calls need CLUSTER_ACTION")
                elif too_many or not req.group_id:
                    d = Decision(ErrorCode.invalid_request, f"a group id and at most {PARTITIONS_PER_CALL_MAX} "
                                 "share partitions per call")
                else:
                    call = decide(key, p)
                    d = call if isinstance(call, Decision) else await self.service.execute(key, call)
                out.append({"partition": key.partition, "error_code": d.error, "error_message": d.message,
                            **answer(p, d)})
            results.append({"topic_id": t.topic_id, "partitions": out})
        return {"results": results}

    async def handle_read_share_group_state(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        def answer(p: Any, d: Decision) -> dict[str, Any]:
            s = d.state
            if s is None:
                return {"state_epoch": -1, "start_offset": -1, "state_batches": []}
            return {"state_epoch": s.state_epoch, "start_offset": s.start_offset, "state_batches": [
                {"first_offset": b.first_offset, "last_offset": b.last_offset, "delivery_state": int(b.state),
                 "delivery_count": b.delivery_count} for b in s.batches]}
        return await self._each(req, ctx, answer, lambda k, p: lambda c: c.read(k, int(p.leader_epoch)))

    async def handle_read_share_group_state_summary(self, version: int, req: Any,
                                                    ctx: RequestContext) -> dict[str, Any]:
        def answer(p: Any, d: Decision) -> dict[str, Any]:
            s = d.state
            if s is None:
                return {"state_epoch": -1, "leader_epoch": -1, "start_offset": -1, "delivery_complete_count": -1}
            return {"state_epoch": s.state_epoch, "leader_epoch": s.leader_epoch, "start_offset": s.start_offset,
                    "delivery_complete_count": delivery_complete_count(s)}
        return await self._each(req, ctx, answer, lambda k, p: lambda c: c.summary(k, int(p.leader_epoch)))

    async def handle_write_share_group_state(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        def decide(k: ShareKey, p: Any) -> Callable[[ShareCoordinator], Decision] | Decision:
            if len(p.state_batches) > STATE_BATCHES_MAX:
                return Decision(ErrorCode.invalid_request, f"at most {STATE_BATCHES_MAX} state batches")
            try:
                batches = tuple(StateBatch(int(b.first_offset), int(b.last_offset), RecordState(int(b.delivery_state)),
                                           int(b.delivery_count)) for b in p.state_batches)
            except ValueError:
                return Decision(ErrorCode.invalid_request, "unknown delivery state")
            return lambda c: c.write(k, int(p.state_epoch), int(p.leader_epoch), int(p.start_offset), batches)
        return await self._each(req, ctx, lambda p, d: {}, decide)

    async def handle_initialize_share_group_state(self, version: int, req: Any,
                                                  ctx: RequestContext) -> dict[str, Any]:
        return await self._each(req, ctx, lambda p, d: {},
                                lambda k, p: lambda c: c.initialize(k, int(p.state_epoch), int(p.start_offset)))

    async def handle_delete_share_group_state(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return await self._each(req, ctx, lambda p, d: {}, lambda k, p: lambda c: c.delete(k))
