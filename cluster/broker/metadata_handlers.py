"""The Kafka APIs that describe the cluster: Metadata, DescribeCluster, DescribeConfigs.

All answer from this broker's metadata image (cluster/controller/image.py), which it
applies from the metadata log; Metadata may create a topic first (auto.create.topics.enable).
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from cluster.broker.auto_topics import AutoTopicCreation
from cluster.broker.config import broker_config_def
from cluster.broker.context import RequestContext
from cluster.broker.dynamic_config import DynamicBrokerConfig
from cluster.broker.kafka_configs import KAFKA_BROKER_CONFIGS
from cluster.broker.metadata_cache import MetadataCache
from cluster.common.config_def import ConfigDef
from cluster.controller.image import TopicImage
from cluster.groups.group_configs import GROUP_CONFIG_DEFS, describe_group_configs
from cluster.protocol.answer_writers import (
    describe_partitions_body,
    describe_partitions_topic_entry,
)
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.messages import EncodedBody, encode_body, encode_item, encode_metadata_body
from cluster.protocol.sentinels import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CONFIG_RESOURCE_GROUP,
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_GROUP,
    NO_LEADER,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
)
from cluster.protocol.topic_names import InvalidTopic, validate_topic_name
from cluster.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from cluster.storage.config import topic_config_def


def _topic_error(code: int, name: str | None, topic_id: uuid.UUID | None = None) -> dict[str, Any]:
    """A Metadata topic that cannot be described: its error, no partitions, the zero id."""
    return {"error_code": code, "name": name, "topic_id": topic_id or ZERO_UUID, "is_internal": False,
            "partitions": [], "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}


ZERO_UUID = uuid.UUID(int=0)


class _ById(NamedTuple):
    topic_id: uuid.UUID
    name: None = None


# DescribeConfigs v3+ config_type: Kafka's ConfigEntry.ConfigType ids (0: UNKNOWN).
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7, "CLASS": 8,
                "PASSWORD": 9}


def config_definition(resource_type: int, name: str) -> ConfigDef | None:
    if resource_type == RESOURCE_TOPIC:
        return topic_config_def(name)
    if resource_type == CONFIG_RESOURCE_GROUP:
        return GROUP_CONFIG_DEFS.get(name)
    return broker_config_def(name)


def kafka_config_type(resource_type: int, name: str) -> str:
    """A config's type as Kafka declares it: Kafka's own table for a broker config Kafka
    has (it says PASSWORD, CLASS, ...), else the definition's."""
    if resource_type == RESOURCE_BROKER and name in KAFKA_BROKER_CONFIGS:
        return KAFKA_BROKER_CONFIGS[name][0]
    definition = config_definition(resource_type, name)
    return definition.kafka_type if definition is not None else "UNKNOWN"


def _invalid_topic_name(name: str) -> str | None:
    try:
        validate_topic_name(name)
    except InvalidTopic as exc:
        return str(exc)
    return None


# Metadata answers kept encoded, for the same question at the same metadata offset (per
# principal, client address, listener and version): encoding 10,000 partitions in Python
# took ~300 ms a request, and clients ask again and again while nothing changes.
METADATA_ANSWERS_CACHED = 64
# Topics' encoded Metadata entries (each ~27 bytes a partition), cleared when full.
METADATA_TOPIC_ENTRIES_CACHED = 100_000


class MetadataHandlers:
    def __init__(self, cache: MetadataCache, auto_topics: AutoTopicCreation, config: DynamicBrokerConfig) -> None:
        self.cache = cache
        self.auto_topics = auto_topics
        self.config = config
        self._answers: dict[tuple[Any, ...], EncodedBody] = {}
        # (version, topic id, authorized operations, live brokers) -> (topic, its changes, entry)
        self._topic_entries: dict[tuple[Any, ...], tuple[TopicImage, int, bytes]] = {}
        self._dtp_entries: dict[tuple[Any, ...], tuple[TopicImage, int, bytes]] = {}  # DescribeTopicPartitions
        self._answers_offset = -1

    # ---- Metadata --------------------------------------------------------------------

    def _topic_metadata(self, version: int, name: str, error: int, ctx: RequestContext, with_operations: bool,
                        live: frozenset[int]) -> tuple[bytes, bool]:
        """A topic's entry of a Metadata answer, encoded, and whether it has no error. An
        entry without error is kept per version, authorized operations and live brokers while
        its topic does not change (TopicImage.changes): after any metadata change only the
        topics it touched are encoded again."""
        t = self.cache.image.topic(name)
        if t is None:
            return encode_item(ApiKey.METADATA, version, "topics",
                               _topic_error(error or ErrorCode.unknown_topic_or_partition, name)), False
        operations = ctx.authorized_operations(ResourceType.TOPIC, name, asked=with_operations)
        key = (version, t.topic_id, operations, live)
        kept = self._topic_entries.get(key)
        if kept is not None and kept[0] is t and kept[1] == t.changes:
            return kept[2], True
        entry = encode_item(ApiKey.METADATA, version, "topics", {
            "error_code": ErrorCode.none, "name": name, "is_internal": t.internal,
            "partitions": self._partitions(t, sorted(t.partitions), live),
            "topic_id": uuid.UUID(t.topic_id), "topic_authorized_operations": operations})
        if len(self._topic_entries) >= METADATA_TOPIC_ENTRIES_CACHED:
            self._topic_entries.clear()
        self._topic_entries[key] = (t, t.changes, entry)
        return entry, True

    def _live_brokers(self) -> frozenset[int]:
        return frozenset(b.broker_id for b in self.cache.image.unfenced_brokers())

    def _partitions(self, t: TopicImage, indexes: list[int], live: frozenset[int]) -> list[dict[str, Any]]:
        """The partitions of a Metadata / DescribeTopicPartitions topic, as the image has them."""
        out = []
        for index in indexes:
            p = t.partitions[index]
            out.append({
                "error_code": ErrorCode.none if p.leader != NO_LEADER else ErrorCode.leader_not_available,
                "partition_index": index,
                "leader_id": p.leader,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": list(p.replicas),
                "isr_nodes": list(p.isr),
                "eligible_leader_replicas": list(p.elr),  # KIP-966 (empty while ELR is off)
                "last_known_elr": list(p.last_known_elr),
                "offline_replicas": [r for r in p.replicas if r not in live],
            })
        return out

    async def handle_metadata(self, version: int, req: Any, ctx: RequestContext) -> EncodedBody:
        """Metadata v0–12, encoded once per question and metadata offset (the answer depends on
        nothing else; one that may create a topic is never kept)."""
        image = self.cache.image
        if image.offset != self._answers_offset:
            self._answers.clear()
            self._answers_offset = image.offset
        topics_key = None if req.topics is None else tuple(
            (t.name, str(getattr(t, "topic_id", None))) for t in req.topics)
        key = (version, topics_key, self.cache.controller_id, self.cache.cluster_id, ctx.listener, ctx.principal,
               ctx.client_host, bool(getattr(req, "include_topic_authorized_operations", False)),
               bool(getattr(req, "include_cluster_authorized_operations", False)),
               bool(getattr(req, "allow_auto_topic_creation", True)))
        cached = self._answers.get(key)
        if cached is not None:
            return cached
        offset = image.offset
        raw, topics, all_found = await self._metadata(version, req, ctx)
        answer = encode_metadata_body(version, raw, topics)
        # Kept while the metadata stays; not one with a topic error (one being created, one
        # this request may have started creating: asking again must look again).
        if self.cache.image.offset == offset and all_found:
            if len(self._answers) >= METADATA_ANSWERS_CACHED:
                self._answers.pop(next(iter(self._answers)))
            self._answers[key] = answer
        return answer

    async def _metadata(self, version: int, req: Any, ctx: RequestContext) -> tuple[dict[str, Any], list[bytes], bool]:
        """Metadata v0–12: the answer but its topics, the topics encoded, and whether none has
        an error. v10+ carry topic ids (KIP-516: a topic deleted and created again under its
        name has a new id, so clients drop what they knew of the old one); v12 asks by id
        (UNKNOWN_TOPIC_ID when none has it). Authorized operations when asked (v8+)."""
        requested = req.topics
        image = self.cache.image
        with_operations = bool(getattr(req, "include_topic_authorized_operations", False))
        live = self._live_brokers()
        topics: list[bytes] = []
        all_found = True

        def add(entry: tuple[bytes, bool]) -> None:
            nonlocal all_found
            topics.append(entry[0])
            all_found &= entry[1]

        if requested is None or (version == 0 and not requested):
            # Every topic the principal may describe; the others are not mentioned.
            for n in sorted(image.topics_by_name):
                if ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, n):
                    add(self._topic_metadata(version, n, ErrorCode.none, ctx, with_operations, live))
        else:
            allow_auto = getattr(req, "allow_auto_topic_creation", True)
            ids = list(dict.fromkeys(i for t in requested if (i := getattr(t, "topic_id", None)) is not None and i.int))
            if ids:
                # A request naming any topic by id is a request by id: Kafka looks at nothing else
                requested = [_ById(i) for i in ids]
            for t in requested:
                name = t.name
                by_id = name is None
                if by_id:
                    topic_id = getattr(t, "topic_id", None)
                    found = image.topics.get(str(topic_id)) if topic_id is not None and topic_id.int else None
                    if found is None:
                        add((encode_item(ApiKey.METADATA, version, "topics",
                                         _topic_error(ErrorCode.unknown_topic_id, None, topic_id)), False))
                        continue
                    name = found.name
                error: int = ErrorCode.none
                if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, name):
                    add((encode_item(ApiKey.METADATA, version, "topics",
                                     _topic_error(ErrorCode.topic_authorization_failed, None if by_id else name)),
                         False))
                    continue
                if image.topic(name) is None:
                    if allow_auto:
                        _, error = await self.auto_topics.topic(name, ctx)
                    else:
                        error = ErrorCode.unknown_topic_or_partition
                    # Being created (or not there): asking again must look again.
                    all_found = False
                add(self._topic_metadata(version, name, error, ctx, with_operations, live))
        return {
            "throttle_time": 0,
            "brokers": [{"node_id": b.broker_id, "host": e[0], "port": e[1], "rack": b.rack}
                        for b in self.cache.alive_brokers() if (e := b.endpoint(ctx.listener)) is not None],
            "cluster_id": self.cache.cluster_id,
            "controller_id": self.cache.controller_id,
            "topics": topics,
            "cluster_authorized_operations": ctx.authorized_operations(
                ResourceType.CLUSTER, CLUSTER_NAME, asked=bool(getattr(req, "include_cluster_authorized_operations", False))),
        }, topics, all_found

    # ---- DescribeTopicPartitions -----------------------------------------------------

    async def handle_describe_topic_partitions(self, version: int, req: Any, ctx: RequestContext) -> EncodedBody:
        """DescribeTopicPartitions v0 (KIP-966; kafka-topics --describe in Kafka 3.9 uses it):
        topics in name order, their partitions from the cursor on, at most
        `response_partition_limit` (capped by max.request.partition.size.limit) partitions
        per answer; `next_cursor` says where the next request starts. No topic list: every
        topic the principal may describe. A requested topic that is unknown or not
        describable gets its error; a cursor outside the requested topics is INVALID_REQUEST,
        as Kafka answers it. Each topic's entry is written straight (answer_writers) and kept
        while its topic does not change, as Metadata's are."""
        image = self.cache.image
        requested = [t.name for t in req.topics]
        cursor = req.cursor
        problem = None
        if cursor is not None and requested and cursor.topic_name not in requested:
            problem = f"Cursor topic {cursor.topic_name} does not exist in the requested topics"
        elif cursor is not None and cursor.partition_index < 0:
            problem = "Cursor partition index must be non-negative"
        if problem is not None:
            return encode_body(ApiKey.DESCRIBE_TOPIC_PARTITIONS, version, {
                "throttle_time": 0, "next_cursor": None,
                "topics": [_topic_error(ErrorCode.invalid_request, name) for name in sorted(set(requested))]})
        if requested:
            names = sorted({n for n in requested if cursor is None or n >= cursor.topic_name})
        else:
            names = [n for n in sorted(image.topics_by_name) if cursor is None or n >= cursor.topic_name]
        limit = max(1, min(int(self.config.current["max.request.partition.size.limit"]), req.response_partition_limit))
        live = self._live_brokers()
        topics: list[bytes] = []
        next_cursor = None
        for name in names:
            allowed = ctx.allowed(AclOperation.DESCRIBE, ResourceType.TOPIC, name)
            t = image.topic(name)
            if not allowed or t is None:
                if requested:  # asked for by name: say why; listing all, leave it out
                    topics.append(self._dtp_entry(_topic_error(ErrorCode.topic_authorization_failed if not allowed
                                                               else ErrorCode.unknown_topic_or_partition, name)))
                continue
            if limit == 0:
                next_cursor = {"topic_name": name, "partition_index": 0}
                break
            start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
            indexes = [i for i in sorted(t.partitions) if i >= start]
            taken, rest = indexes[:limit], indexes[limit:]
            limit -= len(taken)
            operations = ctx.authorized_operations(ResourceType.TOPIC, name, asked=True)
            key = (t.topic_id, operations, live, start, len(taken))
            kept = self._dtp_entries.get(key)
            if kept is not None and kept[0] is t and kept[1] == t.changes:
                topics.append(kept[2])
            else:
                entry = self._dtp_entry({"error_code": ErrorCode.none, "name": name,
                                         "topic_id": uuid.UUID(t.topic_id), "is_internal": t.internal,
                                         "partitions": self._partitions(t, taken, live),
                                         "topic_authorized_operations": operations})
                if len(self._dtp_entries) >= METADATA_TOPIC_ENTRIES_CACHED:
                    self._dtp_entries.clear()
                self._dtp_entries[key] = (t, t.changes, entry)
                topics.append(entry)
            if rest:
                next_cursor = {"topic_name": name, "partition_index": rest[0]}
                break
        return EncodedBody(describe_partitions_body(0, topics, next_cursor))

    @staticmethod
    def _dtp_entry(topic: dict[str, Any]) -> bytes:
        written = describe_partitions_topic_entry(topic)
        return written if written is not None else encode_item(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "topics", topic)

    # ---- DescribeCluster -------------------------------------------------------------

    async def handle_describe_cluster(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "cluster_id": self.cache.cluster_id, "controller_id": self.cache.controller_id, "endpoint_type": 1,
                "brokers": [{"broker_id": r.broker_id, "host": e[0], "port": e[1], "rack": r.rack}
                            for r in self.cache.alive_brokers() if (e := r.endpoint(ctx.listener)) is not None],
                "cluster_authorized_operations": ctx.authorized_operations(
                    ResourceType.CLUSTER, CLUSTER_NAME, asked=bool(req.include_cluster_authorized_operations))}

    # ---- DescribeConfigs -------------------------------------------------------------

    async def handle_describe_configs(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """DescribeConfigs v1–4: topics and this broker (its configs in force, or with resource
        name "" the cluster-wide dynamic defaults), each value with its source and, when
        asked, its synonyms; sensitive values are never sent. v3+: each config's type (the
        Java Admin client's ConfigEntry.type()) and, when asked, its documentation."""
        results = []
        node_id = self.cache.node_id
        with_synonyms = bool(getattr(req, "include_synonyms", False))
        with_documentation = bool(getattr(req, "include_documentation", False))
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
            elif r.resource_type == CONFIG_RESOURCE_GROUP and not ctx.allowed(AclOperation.DESCRIBE_CONFIGS,
                                                                              ResourceType.GROUP, r.resource_name):
                result.update(error_code=ErrorCode.group_authorization_failed,
                              error_message=f"{ctx.principal} may not describe the configs of group "
                                            f"{r.resource_name}")
            elif r.resource_type == CONFIG_RESOURCE_GROUP:
                if not r.resource_name:
                    result.update(error_code=ErrorCode.invalid_request,
                                  error_message="Default group resources are not allowed.")
                else:  # a group need not exist: its configs are apart from it, as in Kafka
                    entries = describe_group_configs(
                        self.cache.image.group_configs.get(r.resource_name, {}), self.config.current.values, keys,
                        with_synonyms, source_group=CONFIG_SOURCE_GROUP, source_default=CONFIG_SOURCE_DEFAULT)
            elif r.resource_type == RESOURCE_TOPIC:
                info = self.cache.image.topic(r.resource_name)
                invalid = _invalid_topic_name(r.resource_name) if info is None else None
                if invalid is not None:
                    result.update(error_code=ErrorCode.invalid_topic_exception, error_message=invalid)
                elif info is None:
                    result.update(error_code=ErrorCode.unknown_topic_or_partition,
                                  error_message=f"topic {r.resource_name!r} does not exist")
                else:
                    entries = self.config.describe_topic(info.configs, keys, with_synonyms)
            elif r.resource_type == RESOURCE_BROKER:
                if r.resource_name not in ("", str(node_id)):
                    result.update(error_code=ErrorCode.invalid_request,
                                  error_message=f"Unexpected broker id, expected {node_id} or empty string, "
                                                f"but received {r.resource_name}")
                else:
                    entries = self.config.describe_broker(r.resource_name, keys, with_synonyms)
            else:
                result.update(error_code=ErrorCode.invalid_request,
                              error_message=f"resource type {r.resource_type} is not supported")
            if version >= 3:
                for entry in entries:
                    definition = config_definition(r.resource_type, entry["name"])
                    entry["config_type"] = CONFIG_TYPES.get(kafka_config_type(r.resource_type, entry["name"]), 0)
                    entry["documentation"] = definition.doc if with_documentation and definition else None
            result["configs"] = entries
            results.append(result)
        return {"throttle_time": 0, "results": results}
