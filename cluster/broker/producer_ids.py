"""Producer ids for InitProducerId: blocks of ids handed out by the controller.

Each block is recorded in the metadata log before use, so ids are unique across the
cluster's brokers and across restarts (a restarted broker takes a fresh block).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from cluster.broker.context import RequestContext
from cluster.controller.service import ControllerUnavailable
from cluster.protocol.errors import ErrorCode
from cluster.security.acl import AclOperation, ResourceType

log = logging.getLogger(__name__)


class ProducerIdManager:
    def __init__(self, allocate_block: Callable[[], Awaitable[tuple[int, int]]]) -> None:
        self._allocate_block = allocate_block
        self._next = 0
        self._block_end = 0
        self._lock = trio.Lock()

    async def next_id(self) -> int:
        async with self._lock:
            if self._next >= self._block_end:
                start, length = await self._allocate_block()
                self._next, self._block_end = start, start + length
            pid = self._next
            self._next += 1
            return pid

    async def handle_init_producer_id(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if req.transactional_id is not None:
            return {"throttle_time": 0, "error_code": ErrorCode.transactional_id_authorization_failed,
                    "producer_id": -1, "producer_epoch": -1}
        if not (ctx.allowed_on_cluster(AclOperation.IDEMPOTENT_WRITE)
                or ctx.allowed_on_any(AclOperation.WRITE, ResourceType.TOPIC)):
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "producer_id": -1, "producer_epoch": -1}
        try:
            producer_id = await self.next_id()
        except ControllerUnavailable as exc:
            log.warning("no producer id block: %s", exc)
            return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available,
                    "producer_id": -1, "producer_epoch": -1}
        return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": producer_id, "producer_epoch": 0}
