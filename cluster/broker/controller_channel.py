"""Calls from this broker to the active controller (Kafka's BrokerToControllerChannelManager).

The controller may run here or on another node: `MetadataService.call` finds it. A change
that succeeded is applied to this broker's own metadata image before the call returns, so
this broker's next Metadata answer (and its replicas) already show it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.controller.service import ControllerUnavailable, MetadataService
from cluster.protocol.errors import ErrorCode
from cluster.replication.partition import AlterIsr

__all__ = ["ControllerChannel", "ControllerUnavailable"]


class ControllerChannel:
    def __init__(self, metadata: MetadataService, node_id: int, broker_epoch: Callable[[], int]) -> None:
        self.metadata = metadata
        self.node_id = node_id
        self._broker_epoch = broker_epoch

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
        broker has applied it when it committed (see ReplicaManager's IsrChannel)."""
        result = await self.call("alter_partition", {
            "broker_id": self.node_id, "broker_epoch": self._broker_epoch(), "topic_id": change.topic_id,
            "partition": change.partition, "leader_epoch": change.leader_epoch,
            "partition_epoch": change.partition_epoch, "isr": list(change.isr),
        }, timeout_s=10.0)
        return int(result["error_code"])

    async def allocate_producer_ids(self) -> tuple[int, int]:
        """A block of producer ids: (first id, how many)."""
        result = await self.metadata.call("allocate_producer_ids", {"broker_id": self.node_id})
        if result["error_code"] != ErrorCode.none:
            raise ControllerUnavailable(str(result.get("error_message")))
        return int(result["start"]), int(result["length"])
