"""Calls from this broker to the active controller (Kafka's BrokerToControllerChannelManager).

The controller may run here or on another node: `MetadataService.call` finds it. A change
that succeeded is applied to this broker's own metadata image before the call returns, so
this broker's next Metadata answer (and its replicas) already show it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from cluster.controller.service import ControllerUnavailable, MetadataService
from cluster.protocol.errors import ErrorCode
from cluster.replication.partition import AlterIsr

__all__ = ["ControllerChannel", "ControllerUnavailable"]

MAX_ISR_CHANGES_PER_CALL = 500
_UNKNOWN_OPERATION = "unknown controller operation"


class _IsrAnswer:
    """Where a queued ISR change gets its answer: the controller's error code, or why none came."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.code: int = ErrorCode.none
        self.error: ControllerUnavailable | None = None

    def answer(self, code: int) -> None:
        self.code = code
        self.done.set()

    def fail(self, error: ControllerUnavailable) -> None:
        self.error = error
        self.done.set()


class ControllerChannel:
    def __init__(self, metadata: MetadataService, node_id: int, broker_epoch: Callable[[], int]) -> None:
        self.metadata = metadata
        self.node_id = node_id
        self._broker_epoch = broker_epoch
        # ISR changes waiting for the call in flight to end; the task that finds none in
        # flight sends them, all in one call (Kafka's AlterPartitionManager: one request
        # in flight, carrying every pending change).
        self._isr_queue: list[tuple[AlterIsr, _IsrAnswer]] = []
        self._isr_call_in_flight = False
        self._batched_isr_changes = True  # False once a controller did not know alter_partitions

    async def call(self, op: str, args: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        """Run a controller operation; raises ControllerUnavailable."""
        result = await self.metadata.call(op, args, timeout_s=timeout_s)
        if result.get("error_code") == ErrorCode.none and "metadata_offset" in result:
            await self.metadata.wait_for_offset(int(result["metadata_offset"]))
        return result

    async def create_topics(self, specs: list[dict[str, Any]], *, validate_only: bool = False) -> list[dict[str, Any]]:
        """Create topics; per-topic results (name, error_code, error_message, ...)."""
        result = await self.call("create_topics", {"topics": specs, "validate_only": validate_only})
        if result["error_code"] != ErrorCode.none:
            return [{"name": s["name"], "error_code": result["error_code"], "error_message": result.get("error_message")}
                    for s in specs]
        topics: list[dict[str, Any]] = result["topics"]
        return topics

    async def alter_partition(self, change: AlterIsr) -> int:
        """An ISR change a partition leader decided: the controller's error code, once this
        broker has applied it when it committed (see ReplicaManager's IsrChannel). Changes
        asked for while a call is in flight go together in the next one, so restoring a
        hundred ISRs takes a commit or two, not a hundred in a row."""
        answer = _IsrAnswer()
        self._isr_queue.append((change, answer))
        if not self._isr_call_in_flight:
            self._isr_call_in_flight = True
            try:
                while self._isr_queue:
                    batch = self._isr_queue[:MAX_ISR_CHANGES_PER_CALL]
                    del self._isr_queue[:MAX_ISR_CHANGES_PER_CALL]
                    await self._send_isr_changes(batch)
            finally:
                self._isr_call_in_flight = False
                # Cancelled midway (the broker stops): nobody sends what is still queued.
                stranded, self._isr_queue = self._isr_queue, []
                for _, waiting in stranded:
                    waiting.fail(ControllerUnavailable("the ISR change was not sent: its sender stopped"))
        await answer.done.wait()
        if answer.error is not None:
            raise answer.error
        return answer.code

    async def _send_isr_changes(self, batch: list[tuple[AlterIsr, _IsrAnswer]]) -> None:
        """One call for `batch`; every change in it gets its answer, whatever happens."""
        try:
            codes = await self._alter_partitions([change for change, _ in batch])
        except ControllerUnavailable as exc:
            for _, answer in batch:
                answer.fail(exc)
            return
        except BaseException:
            for _, answer in batch:
                answer.fail(ControllerUnavailable("the ISR change's call was cancelled"))
            raise
        for (_, answer), code in zip(batch, codes, strict=True):
            answer.answer(code)

    async def _alter_partitions(self, changes: list[AlterIsr]) -> list[int]:
        items = [{"topic_id": c.topic_id, "partition": c.partition, "leader_epoch": c.leader_epoch,
                  "partition_epoch": c.partition_epoch, "isr": list(c.isr)} for c in changes]
        common = {"broker_id": self.node_id, "broker_epoch": self._broker_epoch()}
        if self._batched_isr_changes:
            result = await self.call("alter_partitions", {**common, "partitions": items}, timeout_s=10.0)
            if result["error_code"] == ErrorCode.none:
                return [int(r["error_code"]) for r in result["partitions"]]
            if _UNKNOWN_OPERATION not in str(result.get("error_message")):
                return [int(result["error_code"])] * len(changes)
            self._batched_isr_changes = False  # a controller from before alter_partitions
        codes = []
        for item in items:
            result = await self.call("alter_partition", {**common, **item}, timeout_s=10.0)
            codes.append(int(result["error_code"]))
        return codes

    async def allocate_producer_ids(self) -> tuple[int, int]:
        """A block of producer ids: (first id, how many)."""
        result = await self.metadata.call("allocate_producer_ids", {"broker_id": self.node_id})
        if result["error_code"] != ErrorCode.none:
            raise ControllerUnavailable(str(result.get("error_message")))
        return int(result["start"]), int(result["length"])
