"""The Kafka APIs that describe the cluster: Metadata, DescribeCluster, DescribeConfigs.

All answer from this broker's metadata image (cluster/controller/image.py), which it
applies from the metadata log; Metadata may create a topic first (auto.create.topics.enable).
"""

from __future__ import annotations

import uuid
from typing import Any

from cluster.broker.auto_topics import AutoTopicCreation
from cluster.broker.config import BrokerConfig, render_config_value
from cluster.broker.context import RequestContext
from cluster.broker.metadata_cache import MetadataCache
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_STATIC_BROKER,
    CONFIG_SOURCE_TOPIC,
    NO_LEADER,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
)
from cluster.storage.config import TOPIC_CONFIG_DEFS


class MetadataHandlers:
    def __init__(self, cache: MetadataCache, auto_topics: AutoTopicCreation, config: BrokerConfig) -> None:
        self.cache = cache
        self.auto_topics = auto_topics
        self.config = config

    # ---- Metadata --------------------------------------------------------------------

    def _topic_metadata(self, name: str, error: int = ErrorCode.none) -> dict[str, Any]:
        image = self.cache.image
        t = image.topic(name)
        if t is None:
            return {"error_code": error or ErrorCode.unknown_topic_or_partition, "name": name, "is_internal": False,
                    "partitions": [], "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
        live = {b.broker_id for b in image.unfenced_brokers()}
        partitions = []
        for index in sorted(t.partitions):
            p = t.partitions[index]
            partitions.append({
                "error_code": ErrorCode.none if p.leader != NO_LEADER else ErrorCode.leader_not_available,
                "partition_index": index,
                "leader_id": p.leader,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": list(p.replicas),
                "isr_nodes": list(p.isr),
                "offline_replicas": [r for r in p.replicas if r not in live],
            })
        return {"error_code": ErrorCode.none, "name": name, "is_internal": t.internal, "partitions": partitions,
                "topic_id": uuid.UUID(t.topic_id), "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}

    async def handle_metadata(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        requested = req.topics
        image = self.cache.image
        if requested is None or (version == 0 and not requested):
            topics = [self._topic_metadata(n) for n in sorted(image.topics_by_name)]
        else:
            allow_auto = getattr(req, "allow_auto_topic_creation", True)
            topics = []
            for t in requested:
                error: int = ErrorCode.none
                if self.cache.image.topic(t.name) is None:
                    if allow_auto:
                        _, error = await self.auto_topics.topic(t.name)
                    else:
                        error = ErrorCode.unknown_topic_or_partition
                topics.append(self._topic_metadata(t.name, error))
        return {
            "throttle_time": 0,
            "brokers": [{"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack}
                        for b in self.cache.alive_brokers()],
            "cluster_id": self.cache.cluster_id,
            "controller_id": self.cache.controller_id,
            "topics": topics,
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    # ---- DescribeCluster -------------------------------------------------------------

    async def handle_describe_cluster(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "cluster_id": self.cache.cluster_id, "controller_id": self.cache.controller_id, "endpoint_type": 1,
                "brokers": [{"broker_id": r.broker_id, "host": r.host, "port": r.port, "rack": r.rack}
                            for r in self.cache.alive_brokers()],
                "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}

    # ---- DescribeConfigs -------------------------------------------------------------

    async def handle_describe_configs(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        results = []
        node_id = self.cache.node_id
        for r in req.resources:
            keys = set(r.configuration_keys) if r.configuration_keys is not None else None
            result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                      "resource_type": r.resource_type, "resource_name": r.resource_name}
            entries: list[dict[str, Any]] = []
            if r.resource_type == RESOURCE_TOPIC:
                info = self.cache.image.topic(r.resource_name)
                if info is None:
                    result.update(error_code=ErrorCode.unknown_topic_or_partition,
                                  error_message=f"topic {r.resource_name!r} does not exist")
                else:
                    cfg = self.config.log_config(info.configs)
                    for name in TOPIC_CONFIG_DEFS:
                        if keys is not None and name not in keys:
                            continue
                        source = (CONFIG_SOURCE_TOPIC if name in cfg.overrides
                                  else CONFIG_SOURCE_STATIC_BROKER if name in cfg.broker_defaults
                                  else CONFIG_SOURCE_DEFAULT)
                        entries.append({"name": name, "value": render_config_value(cfg[name]), "read_only": False,
                                        "config_source": source, "is_sensitive": False, "synonyms": []})
            elif r.resource_type == RESOURCE_BROKER:
                if r.resource_name not in ("", str(node_id)):
                    result.update(error_code=ErrorCode.invalid_request,
                                  error_message=f"this is broker {node_id}, not {r.resource_name}")
                else:
                    for name, value, is_default in self.config.describe():
                        if keys is not None and name not in keys:
                            continue
                        entries.append({"name": name, "value": value, "read_only": True,
                                        "config_source": CONFIG_SOURCE_DEFAULT if is_default
                                        else CONFIG_SOURCE_STATIC_BROKER,
                                        "is_sensitive": False, "synonyms": []})
            else:
                result.update(error_code=ErrorCode.invalid_request,
                              error_message=f"resource type {r.resource_type} is not supported")
            result["configs"] = entries
            results.append(result)
        return {"throttle_time": 0, "results": results}
