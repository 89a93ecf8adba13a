"""What one broker says about its cluster: DescribeCluster (the controller and the brokers
it has registered), Metadata (topics, partitions with leader, replicas and ISR) and
DescribeConfigs (a topic's config values).

For tools that ask *each* broker what it sees — `dcmirror status`, `topology apply`
waiting until every broker shows a change — rather than the cluster view a producer or
consumer keeps (metadata.py). Each call takes an open connection and a time bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.client.connection import BrokerConnection
from cluster.client.errors import KafkaError
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.sentinels import RESOURCE_TOPIC


@dataclass(frozen=True)
class PartitionDescription:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    internal: bool = False

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True)
class TopicDescription:
    name: str
    error_code: int
    partitions: tuple[PartitionDescription, ...]


@dataclass(frozen=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[int, ...]  # registered and unfenced, sorted


async def describe_cluster(conn: BrokerConnection, *, timeout_s: float) -> ClusterDescription:
    resp = await conn.request(ApiKey.DESCRIBE_CLUSTER, {"include_cluster_authorized_operations": False},
                              timeout_s=timeout_s)
    if resp.error_code != 0:
        raise KafkaError("DescribeCluster", resp.error_code)
    return ClusterDescription(resp.cluster_id, resp.controller_id, tuple(sorted(b.broker_id for b in resp.brokers)))


async def describe_topics(conn: BrokerConnection, topics: list[str] | None, *,
                          timeout_s: float) -> dict[str, TopicDescription]:
    """Topics (None: all) as this broker's metadata shows them, partitions in order; never
    creates a topic."""
    resp = await conn.request(ApiKey.METADATA, {
        "topics": None if topics is None else [{"name": n} for n in topics], "allow_auto_topic_creation": False,
        "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False,
    }, timeout_s=timeout_s)
    out = {}
    for t in sorted(resp.topics, key=lambda t: t.name):
        parts = tuple(PartitionDescription(t.name, p.partition_index, p.leader_id, tuple(p.replica_nodes),
                                           tuple(p.isr_nodes), bool(t.is_internal))
                      for p in sorted(t.partitions, key=lambda p: p.partition_index))
        out[t.name] = TopicDescription(t.name, t.error_code, parts)
    return out


async def describe_topic_configs(conn: BrokerConnection, topic: str, keys: list[str] | None, *,
                                 timeout_s: float) -> dict[str, str | None]:
    """A topic's config values as this broker knows them (`keys`, or all)."""
    resp = await conn.request(ApiKey.DESCRIBE_CONFIGS, {
        "resources": [{"resource_type": RESOURCE_TOPIC, "resource_name": topic, "configuration_keys": keys}],
        "include_synonyms": False, "include_documentation": False}, timeout_s=timeout_s)
    (result,) = resp.results
    if result.error_code != 0:
        raise KafkaError(f"describing the configs of {topic}", result.error_code)
    return {c.name: c.value for c in result.configs}
