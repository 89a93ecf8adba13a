"""DescribeQuorum (55): the metadata quorum as its leader sees it, what
`kafka-metadata-quorum describe --status / --replication` prints.

Any broker answers: the quorum leader's Raft state is read there (`describe_quorum`, a
controller call that changes nothing), as Kafka's brokers forward the request to the active
controller. The voters are static (kraft.version 0), so directory ids are zero, and each
voter's endpoint is its address on this node's inter-broker listener, where its quorum
frames arrive.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from cluster.broker.context import RequestContext
from cluster.broker.controller_channel import ControllerChannel, ControllerUnavailable
from cluster.protocol.errors import ErrorCode
from cluster.security.acl import AclOperation

METADATA_TOPIC = "__cluster_metadata"
ZERO_UUID = uuid.UUID(int=0)


class QuorumHandlers:
    def __init__(self, controller: ControllerChannel, voters: Mapping[int, tuple[str, int]], listener_name: str) -> None:
        self.controller = controller
        self.voters = voters
        self.listener_name = listener_name

    async def handle_describe_quorum(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if not ctx.allowed_on_cluster(AclOperation.DESCRIBE):
            return _error(ErrorCode.cluster_authorization_failed, "DESCRIBE on the cluster is needed")
        asked = [(t.topic_name, p.partition_index) for t in req.topics for p in t.partitions]
        if asked != [(METADATA_TOPIC, 0)]:
            # One metadata partition, as Kafka (a request naming anything else is invalid).
            return _error(ErrorCode.invalid_request, f"only {METADATA_TOPIC}-0 has a quorum")
        try:
            view = await self.controller.call("describe_quorum", {}, timeout_s=10.0)
        except ControllerUnavailable as exc:
            return _error(ErrorCode.request_timed_out, str(exc))
        if view["error_code"] != ErrorCode.none:
            return _error(int(view["error_code"]), view.get("error_message"))

        def replicas(rows: list[dict[str, int]]) -> list[dict[str, Any]]:
            return [{**r, "replica_directory_id": ZERO_UUID} for r in rows]

        return {
            "error_code": ErrorCode.none, "error_message": None,
            "topics": [{"topic_name": METADATA_TOPIC, "partitions": [{
                "partition_index": 0, "error_code": ErrorCode.none, "error_message": None,
                "leader_id": view["leader_id"], "leader_epoch": view["leader_epoch"],
                "high_watermark": view["high_watermark"], "current_voters": replicas(view["voters"]),
                "observers": replicas(view["observers"]),
            }]}],
            "nodes": [{"node_id": node, "listeners": [{"name": self.listener_name, "host": host, "port": port}]}
                      for node, (host, port) in sorted(self.voters.items())],
        }


def _error(code: int, message: str | None) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "topics": [], "nodes": []}
