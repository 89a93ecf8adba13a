"""DescribeClientQuotas (48) and AlterClientQuotas (49): client quotas in the metadata log.

Any broker answers: alterations go to the active controller (one ClientQuota record per
changed key), descriptions come from this broker's metadata image. The rules and Kafka's
error messages live in quotas.py; enforcement is in the request router (apis.py).
ACLs as Kafka: DESCRIBE_CONFIGS on the cluster to describe, ALTER_CONFIGS to alter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster.broker.context import RequestContext
from cluster.broker.controller_channel import ControllerChannel, ControllerUnavailable
from cluster.broker.quotas import (
    MAX_ENTRIES_PER_REQUEST,
    MAX_OPS_PER_ENTRY,
    MAX_QUOTA_ENTITIES,
    QuotaEntity,
    QuotaRequestError,
    parse_filter,
    validate_entity,
    validate_value,
)
from cluster.controller.image import MetadataImage
from cluster.protocol.errors import ErrorCode
from cluster.security.acl import AclOperation

_CLUSTER_DENIED = "Cluster authorization failed."


class ClientQuotaHandlers:
    def __init__(self, image: Callable[[], MetadataImage], controller: ControllerChannel) -> None:
        self.image = image
        self.controller = controller

    async def handle_describe_client_quotas(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed_on_cluster(AclOperation.DESCRIBE_CONFIGS):
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": _CLUSTER_DENIED, "entries": None}
        try:
            quota_filter = parse_filter([(c.entity_type, c.match_type, c.match) for c in req.components],
                                        bool(req.strict))
        except QuotaRequestError as exc:
            return {"throttle_time": 0, "error_code": exc.code, "error_message": exc.message, "entries": None}
        entries = [{"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
                    "values": [{"key": k, "value": v} for k, v in sorted(values.items())]}
                   for entity, values in sorted(self.image().client_quotas.items(), key=_sort_key)
                   if quota_filter.matches(entity)]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "entries": entries}

    async def handle_alter_client_quotas(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        def answer(entity: Any, code: int, message: str | None) -> dict[str, Any]:
            return {"error_code": code, "error_message": message,
                    "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entity]}

        if not ctx.allowed_on_cluster(AclOperation.ALTER_CONFIGS):
            return {"throttle_time": 0, "entries": [answer(e.entity, ErrorCode.cluster_authorization_failed,
                                                           _CLUSTER_DENIED) for e in req.entries]}
        if len(req.entries) > MAX_ENTRIES_PER_REQUEST:
            return {"throttle_time": 0, "entries": [answer(
                e.entity, ErrorCode.invalid_request,
                f"{len(req.entries)} entries in one request; at most {MAX_ENTRIES_PER_REQUEST}") for e in req.entries]}
        results: list[dict[str, Any]] = []
        valid: list[tuple[int, QuotaEntity, list[list[Any]]]] = []
        seen: set[QuotaEntity] = set()
        for entry in req.entries:
            try:
                if len(entry.ops) > MAX_OPS_PER_ENTRY:
                    raise QuotaRequestError(ErrorCode.invalid_request,
                                            f"{len(entry.ops)} operations on one entity; at most {MAX_OPS_PER_ENTRY}")
                entity = validate_entity([(e.entity_type, e.entity_name) for e in entry.entity])
                keys = [op.key for op in entry.ops]
                duplicate = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
                if duplicate is not None:
                    raise QuotaRequestError(ErrorCode.invalid_request,
                                            f"Duplicate quota key {duplicate} not updating quota for this entity "
                                            f"{_describe(entity)}")
                if entity in seen:
                    raise QuotaRequestError(ErrorCode.invalid_request, f"Ignoring duplicate entity {_describe(entity)}")
                for op in entry.ops:
                    if not op.remove:
                        validate_value(op.key, float(op.value))
            except QuotaRequestError as exc:
                results.append(answer(entry.entity, exc.code, exc.message))
                continue
            seen.add(entity)
            valid.append((len(results), entity, [[op.key, None if op.remove else float(op.value)]
                                                 for op in entry.ops]))
            results.append(answer(entry.entity, ErrorCode.none, None))
        if valid:
            try:
                result = await self.controller.call("alter_client_quotas", {
                    "entries": [{"entity": [list(p) for p in entity], "ops": ops} for _, entity, ops in valid],
                    "validate_only": bool(req.validate_only), "max_entities": MAX_QUOTA_ENTITIES})
            except ControllerUnavailable as exc:
                result = {"error_code": ErrorCode.request_timed_out, "error_message": str(exc)}
            if result.get("error_code") != ErrorCode.none:
                for i, _, _ in valid:
                    results[i]["error_code"], results[i]["error_message"] = (result["error_code"],
                                                                             result.get("error_message"))
            else:
                for (i, _, _), r in zip(valid, result["results"], strict=True):
                    results[i]["error_code"], results[i]["error_message"] = r["error_code"], r.get("error_message")
        return {"throttle_time": 0, "entries": results}


def _sort_key(item: tuple[QuotaEntity, dict[str, float]]) -> tuple[tuple[str, str], ...]:
    return tuple((t, "" if n is None else "\x01" + n) for t, n in item[0])


def _describe(entity: QuotaEntity) -> str:
    """Kafka's ClientQuotaEntity toString: ClientQuotaEntity(entries={user=alice, client-id=null})."""
    return "ClientQuotaEntity(entries={" + ", ".join(f"{t}={n}" for t, n in entity) + "})"
