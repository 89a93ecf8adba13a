"""This broker's view of its cluster, from the metadata log it applies (Kafka's MetadataCache)."""

from __future__ import annotations

from cluster.controller.image import BrokerRegistration, MetadataImage
from cluster.controller.service import MetadataService


class MetadataCache:
    def __init__(self, metadata: MetadataService, node_id: int, cluster_id: str) -> None:
        self.metadata = metadata
        self.node_id = node_id
        self.cluster_id = cluster_id or "dcmirror-standalone"

    @property
    def image(self) -> MetadataImage:
        return self.metadata.image

    @property
    def controller_id(self) -> int:
        """What Metadata and DescribeCluster answer as the controller."""
        leader = self.metadata.leader_id
        if leader >= 0 and leader in self.image.brokers:
            return leader
        # Never -1 (admin clients loop on it). Dedicated controllers are not reachable by
        # clients: like KRaft, name this broker, which forwards admin requests.
        return self.node_id

    def alive_brokers(self) -> list[BrokerRegistration]:
        return self.image.unfenced_brokers()
