"""MirrorAppend: a mirror worker's copy of source batches into a mirror topic, at their
source offsets (cluster/protocol/internal.py has the frame; Log.append_mirrored the rules).

It is one of the cluster's own frames, never advertised in ApiVersions, and like them
needs CLUSTER_ACTION on the cluster where an authorizer is configured (the router checks
that before this handler runs): copying at fixed offsets is what a follower does, not a
producer.
"""

from __future__ import annotations

from typing import Any

import trio

from cluster.protocol.errors import ErrorCode, ProtocolError
from cluster.protocol.internal import parse_mirror_append
from cluster.replication.replica_manager import ReplicaManager

# However long a request asks to wait for the in-sync replicas, at most this long.
MIRROR_APPEND_MAX_WAIT_S = 300.0


class MirrorHandlers:
    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas

    async def handle_mirror_append(self, payload: memoryview) -> dict[str, Any]:
        """The orjson answer: {error_code, error_message, partitions: [{partition,
        error_code, error_message, log_end_offset, high_watermark, log_start_offset}]}."""
        try:
            header, partitions = parse_mirror_append(payload)
        except ProtocolError as exc:
            return {"error_code": ErrorCode.invalid_request, "error_message": str(exc), "partitions": []}
        topic = header["topic"]
        info = self.replicas.image.topic(topic)
        refusal: tuple[int, str] | None = None
        if info is None:
            refusal = ErrorCode.unknown_topic_or_partition, f"topic {topic} does not exist"
        elif info.topic_id != header["topic_id"]:
            refusal = (ErrorCode.unknown_topic_id,
                       f"topic {topic} has id {info.topic_id}, not {header['topic_id']} (deleted and created again?)")
        if refusal is not None:
            return {"error_code": refusal[0], "error_message": refusal[1], "partitions": [
                {"partition": p, "error_code": refusal[0], "error_message": refusal[1], "log_end_offset": -1,
                 "high_watermark": -1, "log_start_offset": -1} for p, _, _ in partitions]}
        deadline = trio.current_time() + min(max(0, header["timeout_ms"]) / 1000, MIRROR_APPEND_MAX_WAIT_S)
        answers: dict[int, dict[str, Any]] = {}

        async def one(index: int, records: bytes, log_start: int) -> None:
            answers[index] = await self.replicas.append_mirrored(topic, index, records, log_start, deadline)

        async with trio.open_nursery() as nursery:
            for index, records, log_start in partitions:
                # bytes: the log's writes and the marker reader take it (one copy per partition)
                nursery.start_soon(one, index, bytes(records), log_start)
        return {"error_code": ErrorCode.none, "error_message": None,
                "partitions": [answers[p] for p, _, _ in partitions]}
