"""Admin APIs that change cluster metadata: each turns into one controller operation.

Any broker accepts them and passes them to the active controller (KRaft forwards them
the same way), then answers once the change has been applied to its own metadata image,
so the client's next Metadata request to this broker already shows it.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cluster.broker.context import RequestContext
from cluster.broker.controller_channel import ControllerChannel, ControllerUnavailable
from cluster.controller.features import SAFE_DOWNGRADE, UPGRADE
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import (
    CONFIG_OP_APPEND,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_OP_SUBTRACT,
    CONFIG_RESOURCE_GROUP,
    ELECTION_PREFERRED,
    ELECTION_UNCLEAN,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
)
from cluster.security.acl import AclOperation, ResourceType

log = logging.getLogger(__name__)

# IncrementalAlterConfigs operations by wire id (AlterConfigs sets every value it names).
_CONFIG_OPS = {CONFIG_OP_SET: "set", CONFIG_OP_DELETE: "delete", CONFIG_OP_APPEND: "append",
               CONFIG_OP_SUBTRACT: "subtract"}


# A created topic's configs as DescribeConfigs lists them (DynamicBrokerConfig.describe_topic).
TopicConfigs = Callable[[Mapping[str, str]], list[dict[str, Any]]]
_CREATED_CONFIG_FIELDS = ("name", "value", "read_only", "config_source", "is_sensitive")


class AdminHandlers:
    def __init__(self, controller: ControllerChannel, topic_configs: TopicConfigs | None = None) -> None:
        self.controller = controller
        self.topic_configs = topic_configs

    async def _call(self, op: str, args: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        try:
            return await self.controller.call(op, args, timeout_s)
        except ControllerUnavailable as exc:
            return {"error_code": ErrorCode.request_timed_out, "error_message": str(exc)}

    @staticmethod
    def _timeout_s(req: Any) -> float:
        timeout = getattr(req, "timeout", None)
        seconds = timeout.total_seconds() if timeout is not None else 30.0
        return max(1.0, min(seconds, 300.0)) if seconds > 0 else 30.0

    @staticmethod
    def _each(result: dict[str, Any], key: str, names: list[str]) -> list[dict[str, Any]]:
        """Per-item results, or the call's own error repeated for every item."""
        if result.get("error_code") != ErrorCode.none:
            return [{"name": n, "error_code": result["error_code"], "error_message": result.get("error_message")}
                    for n in names]
        items: list[dict[str, Any]] = result[key]
        return items

    # ---- topics --------------------------------------------------------------------------

    async def handle_create_topics(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        specs = []
        twice = _twice(t.name for t in req.topics)
        denied = [{"name": n, "error_code": ErrorCode.invalid_request, "error_message": "Duplicate topic name.",
                   "num_partitions": -1, "replication_factor": -1, "configs": None} for n in sorted(twice)]
        cluster_create = ctx.allowed_on_cluster(AclOperation.CREATE)
        for t in req.topics:
            if t.name in twice:
                continue
            if not cluster_create and not ctx.allowed(AclOperation.CREATE, ResourceType.TOPIC, t.name):
                denied.append({"name": t.name, "error_code": ErrorCode.topic_authorization_failed,
                               "error_message": f"{ctx.principal} may not create topic {t.name}",
                               "num_partitions": -1, "replication_factor": -1, "configs": None})
                continue
            assignments = sorted(t.assignments, key=lambda a: a.partition_index)
            if [a.partition_index for a in assignments] != list(range(len(assignments))):
                denied.append({"name": t.name, "error_code": ErrorCode.invalid_replica_assignment,
                               "error_message": "Partitions must be numbered consecutively from 0",
                               "num_partitions": -1, "replication_factor": -1, "configs": None})
                continue
            specs.append({
                "name": t.name,
                "num_partitions": t.num_partitions,
                "replication_factor": t.replication_factor,
                "assignments": [list(a.broker_ids) for a in assignments] or None,
                "configs": {c.name: c.value for c in t.configs},  # a null value is refused (INVALID_CONFIG)
            })
        if not specs:
            return {"throttle_time": 0, "topics": denied}
        result = await self._call("create_topics", {"topics": specs, "validate_only": req.validate_only},
                                  self._timeout_s(req))
        topics = denied
        for r in self._each(result, "topics", [s["name"] for s in specs]):
            created = {"name": r["name"], "error_code": r["error_code"], "error_message": r.get("error_message"),
                       "num_partitions": r.get("num_partitions", -1),
                       "replication_factor": r.get("replication_factor", -1), "configs": None}
            if r["error_code"] == ErrorCode.none:
                if version >= 5 and self.topic_configs is not None:
                    # KIP-525: the topic's configs in force, as the Java Admin client's
                    # CreateTopicsResult.config() hands them out
                    created["configs"] = [{k: e[k] for k in _CREATED_CONFIG_FIELDS}
                                          for e in self.topic_configs(r.get("configs") or {})]
                if r.get("topic_id"):
                    created["topic_id"] = uuid.UUID(r["topic_id"])  # v7
            topics.append(created)
        return {"throttle_time": 0, "topics": topics}

    async def handle_delete_topics(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        twice = _twice(req.topic_names)
        once = [n for n in req.topic_names if n not in twice]
        names = [n for n in once if ctx.allowed(AclOperation.DELETE, ResourceType.TOPIC, n)]
        denied = [{"name": n, "error_code": ErrorCode.invalid_request, "error_message": "Duplicate topic name."}
                  for n in sorted(twice)]
        denied += [{"name": n, "error_code": ErrorCode.topic_authorization_failed,
                    "error_message": f"{ctx.principal} may not delete topic {n}"} for n in once if n not in names]
        if not names:
            return {"throttle_time": 0, "responses": denied}
        result = await self._call("delete_topics", {"names": names}, self._timeout_s(req))
        return {"throttle_time": 0, "responses": denied + [
            {"name": r["name"], "error_code": r["error_code"], "error_message": r.get("error_message")}
            for r in self._each(result, "topics", names)
        ]}

    async def handle_create_partitions(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        twice = _twice(t.name for t in req.topics)
        once = [t for t in req.topics if t.name not in twice]
        specs = [{"name": t.name, "count": t.count,
                  "assignments": [list(a.broker_ids) for a in t.assignments] if t.assignments else None}
                 for t in once if ctx.allowed(AclOperation.ALTER, ResourceType.TOPIC, t.name)]
        denied = [{"name": n, "error_code": ErrorCode.invalid_request, "error_message": "Duplicate topic name."}
                  for n in sorted(twice)]
        denied += [{"name": t.name, "error_code": ErrorCode.topic_authorization_failed,
                    "error_message": f"{ctx.principal} may not alter topic {t.name}"}
                   for t in once if not ctx.allowed(AclOperation.ALTER, ResourceType.TOPIC, t.name)]
        if not specs:
            return {"throttle_time": 0, "results": denied}
        result = await self._call("create_partitions", {"topics": specs, "validate_only": req.validate_only},
                                  self._timeout_s(req))
        return {"throttle_time": 0, "results": denied + [
            {"name": r["name"], "error_code": r["error_code"], "error_message": r.get("error_message")}
            for r in self._each(result, "topics", [s["name"] for s in specs])
        ]}

    # ---- configs -------------------------------------------------------------------------

    async def _alter_configs(self, req: Any, incremental: bool, ctx: RequestContext) -> dict[str, Any]:
        responses: list[dict[str, Any]] = []
        specs: list[dict[str, Any]] = []
        broker_specs: list[dict[str, Any]] = []
        group_specs: list[dict[str, Any]] = []
        for r in req.resources:
            base = {"resource_type": r.resource_type, "resource_name": r.resource_name}
            if r.resource_type == RESOURCE_TOPIC and not ctx.allowed(AclOperation.ALTER_CONFIGS, ResourceType.TOPIC,
                                                                     r.resource_name):
                responses.append({**base, "error_code": ErrorCode.topic_authorization_failed,
                                  "error_message": f"{ctx.principal} may not alter the configs of {r.resource_name}"})
                continue
            if r.resource_type == CONFIG_RESOURCE_GROUP and not ctx.allowed(AclOperation.ALTER_CONFIGS,
                                                                            ResourceType.GROUP, r.resource_name):
                responses.append({**base, "error_code": ErrorCode.group_authorization_failed,
                                  "error_message": f"{ctx.principal} may not alter the configs of group "
                                                   f"{r.resource_name}"})
                continue
            if r.resource_type not in (RESOURCE_TOPIC, CONFIG_RESOURCE_GROUP) and not ctx.allowed_on_cluster(
                    AclOperation.ALTER_CONFIGS):
                responses.append({**base, "error_code": ErrorCode.cluster_authorization_failed,
                                  "error_message": "ALTER_CONFIGS on the cluster is needed"})
                continue
            if r.resource_type not in (RESOURCE_TOPIC, RESOURCE_BROKER, CONFIG_RESOURCE_GROUP):
                responses.append({**base, "error_code": ErrorCode.invalid_request,
                                  "error_message": f"Unknown resource type {r.resource_type}"})
                continue
            bad = self._broker_name_error(r.resource_name) if r.resource_type == RESOURCE_BROKER else None
            if bad is None and not incremental:  # Kafka's ConfigAdminManager.preprocess, for every resource
                nulls = [c.name for c in r.configs if c.value is None]
                bad = f"Null value not supported for : {', '.join(nulls)}" if nulls else None
            if bad is None:
                ops, bad = self._config_ops(r.configs, incremental)
            if bad:
                responses.append({**base, "error_code": ErrorCode.invalid_request, "error_message": bad})
                continue
            spec = {"name": r.resource_name, "ops": ops, "replace": not incremental}
            {RESOURCE_TOPIC: specs, CONFIG_RESOURCE_GROUP: group_specs}.get(r.resource_type, broker_specs).append(spec)
        if specs:
            result = await self._call("alter_configs", {"topics": specs, "validate_only": req.validate_only})
            for r in self._each(result, "topics", [s["name"] for s in specs]):
                responses.append({"resource_type": RESOURCE_TOPIC, "resource_name": r["name"],
                                  "error_code": r["error_code"], "error_message": r.get("error_message")})
        if broker_specs:
            result = await self._call("alter_broker_configs", {"resources": broker_specs,
                                                               "validate_only": req.validate_only})
            for r in self._each(result, "resources", [s["name"] for s in broker_specs]):
                responses.append({"resource_type": RESOURCE_BROKER, "resource_name": r["name"],
                                  "error_code": r["error_code"], "error_message": r.get("error_message")})
        if group_specs:
            result = await self._call("alter_group_configs", {"groups": group_specs,
                                                              "validate_only": req.validate_only})
            for r in self._each(result, "groups", [s["name"] for s in group_specs]):
                responses.append({"resource_type": CONFIG_RESOURCE_GROUP, "resource_name": r["name"],
                                  "error_code": r["error_code"], "error_message": r.get("error_message")})
        return {"throttle_time": 0, "responses": responses}

    def _broker_name_error(self, name: str) -> str | None:
        """A BROKER resource is "" (the cluster-wide default) or this broker's id: a client
        sends a broker's own configs to that broker (Kafka's validateResourceNameIsCurrentNodeId)."""
        if name == "":
            return None
        if not name.lstrip("-").isdigit():
            return f"Node id must be an integer, but it is: {name}"
        if int(name) != self.controller.node_id:
            return f"Unexpected broker id, expected {self.controller.node_id}, but received {name}"
        return None

    @staticmethod
    def _config_ops(configs: list[Any], incremental: bool) -> tuple[list[list[Any]], str | None]:
        """[key, operation, value] for the controller, or what Kafka refuses before a change
        reaches its controller (ConfigAdminManager.preprocess). AlterConfigs replaces the
        whole config (its null values are refused before this)."""
        if not incremental:
            return [[c.name, "set", c.value] for c in configs], None
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            return [], "Error due to duplicate config keys"
        unknown = [c.config_operation for c in configs if c.config_operation not in _CONFIG_OPS]
        if unknown:
            return [], f"config operation {unknown[0]} is not SET (0), DELETE (1), APPEND (2) or SUBTRACT (3)"
        nulls = [c.name for c in configs if c.config_operation != CONFIG_OP_DELETE and c.value is None]
        if nulls:
            return [], f"Null value not supported for : {', '.join(nulls)}"
        return [[c.name, _CONFIG_OPS[c.config_operation], c.value] for c in configs], None

    async def handle_incremental_alter_configs(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return await self._alter_configs(req, True, ctx)

    async def handle_alter_configs(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        return await self._alter_configs(req, False, ctx)

    # ---- leaders and reassignment -----------------------------------------------------------

    async def handle_elect_leaders(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed_on_cluster(AclOperation.ALTER):
            # as Kafka: the request's error, and each partition it names gets it too
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "replica_election_results": [
                        {"topic": t.topic, "partition_result": [
                            {"partition_id": p, "error_code": ErrorCode.cluster_authorization_failed,
                             "error_message": "ALTER on the cluster is needed"} for p in t.partitions]}
                        for t in req.topic_partitions or ()]}
        partitions = None
        if req.topic_partitions is not None:
            partitions = [[t.topic, p] for t in req.topic_partitions for p in t.partitions]
        election_type = getattr(req, "election_type", 0)
        result = await self._call("elect_leaders", {"election_type": election_type, "partitions": partitions},
                                  self._timeout_s(req))
        if result.get("error_code") != ErrorCode.none:
            return {"throttle_time": 0, "error_code": result["error_code"], "replica_election_results": []}
        by_topic: dict[str, list[dict[str, Any]]] = {t: [] for t in result.get("topics") or ()}
        for r in result["partitions"]:
            by_topic.setdefault(r["topic"], []).append({"partition_id": r["partition"], "error_code": r["error_code"],
                                                        "error_message": r.get("error_message")})
        # An election type Kafka does not know fails the request as well as each partition
        top = ErrorCode.none if election_type in (ELECTION_PREFERRED, ELECTION_UNCLEAN) else ErrorCode.invalid_request
        return {"throttle_time": 0, "error_code": top, "replica_election_results": [
            {"topic": topic, "partition_result": parts} for topic, parts in by_topic.items()]}

    async def handle_update_features(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """UpdateFeatures v0–1 (KIP-584; `kafka-features upgrade|downgrade`): forwarded to the
        active controller, which changes finalized levels all or nothing. ALTER on the cluster."""
        names = [u.feature for u in req.feature_updates]
        if not ctx.allowed_on_cluster(AclOperation.ALTER):
            message = "ALTER on the cluster is needed"
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "error_message": message,
                    "results": [{"feature": n, "error_code": ErrorCode.cluster_authorization_failed,
                                 "error_message": message} for n in names]}
        updates = []
        for u in req.feature_updates:
            if version == 0:
                kind = SAFE_DOWNGRADE if u.allow_downgrade else UPGRADE
            else:
                kind = int(u.upgrade_type)
            updates.append({"feature": u.feature, "level": int(u.max_version_level), "upgrade_type": kind})
        # (none at all: Kafka answers NONE and changes nothing)
        result = await self._call("update_features", {"updates": updates,
                                                      "validate_only": bool(getattr(req, "validate_only", False))},
                                  self._timeout_s(req))
        # Kafka's ControllerApis: per-feature results only when every update was taken; a
        # refusal (or no controller) is the top-level error alone.
        results = (result.get("results") or []) if result["error_code"] == ErrorCode.none else []
        return {"throttle_time": 0, "error_code": result["error_code"], "error_message": result.get("error_message"),
                "results": results}

    async def handle_alter_partition_reassignments(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed_on_cluster(AclOperation.ALTER):
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": "ALTER on the cluster is needed", "responses": []}
        specs = [{"topic": t.name, "partition": p.partition_index,
                  "replicas": list(p.replicas) if p.replicas is not None else None}
                 for t in req.topics for p in t.partitions]
        result = await self._call("alter_reassignments", {"partitions": specs}, self._timeout_s(req))
        if result.get("error_code") != ErrorCode.none:
            return {"throttle_time": 0, "error_code": result["error_code"],
                    "error_message": result.get("error_message"), "responses": []}
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in result["partitions"]:
            by_topic[r["topic"]].append({"partition_index": r["partition"], "error_code": r["error_code"],
                                         "error_message": r.get("error_message")})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "responses": [{"name": n, "partitions": parts} for n, parts in by_topic.items()]}

    async def handle_list_partition_reassignments(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed_on_cluster(AclOperation.DESCRIBE):
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": "DESCRIBE on the cluster is needed", "topics": []}
        partitions = None
        if req.topics is not None:
            partitions = [[t.name, p] for t in req.topics for p in t.partition_indexes]
        result = await self._call("list_reassignments", {"partitions": partitions}, self._timeout_s(req))
        if result.get("error_code") != ErrorCode.none:
            return {"throttle_time": 0, "error_code": result["error_code"],
                    "error_message": result.get("error_message"), "topics": []}
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in result["partitions"]:
            by_topic[r["topic"]].append({"partition_index": r["partition"], "replicas": r["replicas"],
                                         "adding_replicas": r["adding"], "removing_replicas": r["removing"]})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                "topics": [{"name": n, "partitions": parts} for n, parts in by_topic.items()]}


def _twice(names: Iterable[str]) -> set[str]:
    """Names a request gives more than once: Kafka answers each once, INVALID_REQUEST, and
    acts on none of them (ControllerApis)."""
    seen: set[str] = set()
    twice: set[str] = set()
    for n in names:
        (twice if n in seen else seen).add(n)
    return twice
