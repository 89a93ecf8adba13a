"""The Kafka APIs that describe the cluster: Metadata, DescribeCluster, DescribeConfigs.

All answer from this broker's metadata image (cluster/controller/image.py), which it
applies from the metadata log; Metadata may create a topic first (auto.create.topics.enable).
"""

from __future__ import annotations

import uuid
from typing import Any

from cluster.broker.auto_topics import AutoTopicCreation
from cluster.broker.config import BrokerConfig, is_sensitive
from cluster.broker.context import RequestContext
from cluster.broker.metadata_cache import MetadataCache
from cluster.common.config_def import render_value
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
from cluster.security.acl import AclOperation, ResourceType
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
            # Every topic the principal may describe; the others are not mentioned.
            topics = [self._topic_metadata(n) for n in sorted(image.topics_by_name)
                      if ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, n)]
        else:
            allow_auto = getattr(req, "allow_auto_topic_creation", True)
            topics = []
            for t in requested:
                error: int = ErrorCode.none
                if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, t.name):
                    topics.append({"error_code": ErrorCode.topic_authorization_failed, "name": t.name,
                                   "is_internal": False, "partitions": [],
                                   "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED})
                    continue
                if self.cache.image.topic(t.name) is None:
                    if allow_auto:
                        _, error = await self.auto_topics.topic(t.name, ctx)
                    else:
                        error = ErrorCode.unknown_topic_or_partition
                topics.append(self._topic_metadata(t.name, error))
        return {
            "throttle_time": 0,
            "brokers": [{"node_id": b.broker_id, "host": e[0], "port": e[1], "rack": b.rack}
                        for b in self.cache.alive_brokers() if (e := b.endpoint(ctx.listener)) is not None],
            "cluster_id": self.cache.cluster_id,
            "controller_id": self.cache.controller_id,
            "topics": topics,
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    # ---- DescribeCluster -------------------------------------------------------------

    async def handle_describe_cluster(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "cluster_id": self.cache.cluster_id, "controller_id": self.cache.controller_id, "endpoint_type": 1,
                "brokers": [{"broker_id": r.broker_id, "host": e[0], "port": e[1], "rack": r.rack}
                            for r in self.cache.alive_brokers() if (e := r.endpoint(ctx.listener)) is not None],
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
            if r.resource_type == RESOURCE_TOPIC and not ctx.allowed(AclOperation.DESCRIBE_CONFIGS,
                                                                     ResourceType.TOPIC, r.resource_name):
                result.update(error_code=ErrorCode.topic_authorization_failed,
                              error_message=f"{ctx.principal} may not describe the configs of {r.resource_name}")
            elif r.resource_type == RESOURCE_BROKER and not ctx.allowed_on_cluster(AclOperation.DESCRIBE_CONFIGS):
                result.update(error_code=ErrorCode.cluster_authorization_failed,
                              error_message="DESCRIBE_CONFIGS on the cluster is needed")
            elif r.resource_type == RESOURCE_TOPIC:
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
                        entries.append({"name": name, "value": render_value(cfg[name]), "read_only": False,
                                        "config_source": source, "is_sensitive": False, "synonyms": []})
            elif r.resource_type == RESOURCE_BROKER:
                if r.resource_name not in ("", str(node_id)):
                    result.update(error_code=ErrorCode.invalid_request,
                                  error_message=f"this is broker {node_id}, not {r.resource_name}")
                else:
                    for name, value, is_default in self.config.describe():
                        if keys is not None and name not in keys:
                            continue
                        hidden = is_sensitive(name)
                        entries.append({"name": name, "value": None if hidden else value, "read_only": True,
                                        "config_source": CONFIG_SOURCE_DEFAULT if is_default
                                        else CONFIG_SOURCE_STATIC_BROKER,
                                        "is_sensitive": hidden, "synonyms": []})
            else:
                result.update(error_code=ErrorCode.invalid_request,
                              error_message=f"resource type {r.resource_type} is not supported")
            result["configs"] = entries
            results.append(result)
        return {"throttle_time": 0, "results": results}
