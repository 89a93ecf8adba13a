"""An internal state topic and the leaders of its partitions.

The group, transaction and share coordinators each keep their state in a compacted
internal topic (`__consumer_offsets`, `__transaction_state`, `__share_group_state`) and
coordinate the keys of the partitions this broker leads. This is what they share: the
topic is created on first use once enough brokers are up for its replication factor
(capped by the cluster's size), a key's coordinator is its partition's leader in the
metadata image, and the partition count is the image's once the topic exists.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster.controller.image import MetadataImage
from cluster.controller.service import ControllerUnavailable
from cluster.protocol.errors import ErrorCode
from cluster.replication.replica_manager import ReplicaManager

# Creates topics through the controller; per-topic results (name, error_code, error_message).
CreateTopics = Callable[[list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]]


@dataclass(frozen=True, slots=True)
class InternalTopicSpec:
    """How an internal state topic is created (compacted, `internal`)."""

    name: str
    num_partitions: int
    replication_factor: int  # capped by the cluster's size when created
    segment_bytes: int
    min_isr: int | None = None  # min.insync.replicas, capped by the replication factor (None: not set)
    extra_configs: Mapping[str, str] = field(default_factory=dict)  # after the others, as given

    def configs(self, replication_factor: int) -> dict[str, str]:
        out = {"cleanup.policy": "compact", "segment.bytes": str(self.segment_bytes)}
        if self.min_isr is not None:
            out["min.insync.replicas"] = str(max(1, min(self.min_isr, replication_factor)))
        out.update(self.extra_configs)
        return out


class InternalTopic:
    """One internal state topic as its coordinator sees it."""

    def __init__(self, spec: InternalTopicSpec, *, image: Callable[[], MetadataImage],
                 cluster_size: Callable[[], int], create_topics: CreateTopics) -> None:
        self.spec = spec
        self._image = image
        self._cluster_size = cluster_size
        self._create_topics = create_topics
        self.num_partitions = spec.num_partitions  # the image's, once `led` has seen the topic

    @property
    def name(self) -> str:
        return self.spec.name

    async def ensure(self) -> bool:
        """Create the topic once enough brokers are up for its replication factor; True
        when it exists. Raises ControllerUnavailable when no controller answers."""
        image = self._image()
        if image.topic(self.name) is not None:
            return True
        rf = min(self.spec.replication_factor, self._cluster_size())
        if len(image.active_brokers()) < rf:
            return False  # as Kafka: COORDINATOR_NOT_AVAILABLE until the brokers are there
        results = await self._create_topics([{
            "name": self.name, "num_partitions": self.spec.num_partitions,
            "replication_factor": rf, "internal": True, "configs": self.spec.configs(rf),
        }])
        return results[0]["error_code"] in (ErrorCode.none, ErrorCode.topic_already_exists)

    def leader_of(self, index: int) -> int | None:
        """The broker leading partition `index` (None: not known or fenced)."""
        image = self._image()
        part = image.partition(self.name, index)
        leader = image.brokers.get(part.leader) if part is not None else None
        if leader is None or leader.fenced:
            return None
        return leader.broker_id

    async def find_leader(self, index: int) -> int | None:
        """FindCoordinator's answer: the topic created if it must be, then the leader of
        partition `index` (None: not available yet)."""
        try:
            if not await self.ensure():
                return None
        except ControllerUnavailable:
            return None
        return self.leader_of(index)

    def led(self, replicas: ReplicaManager) -> set[int]:
        """The partitions of this topic that `replicas` leads; refreshes `num_partitions`
        from the image first."""
        t = self._image().topic(self.name)
        if t is not None:
            self.num_partitions = len(t.partitions)
        return {index for (topic, index), part in replicas.partitions.items()
                if topic == self.name and part.is_leader}
