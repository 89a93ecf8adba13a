"""MirrorAppend from a mirror worker: source batches into a mirror topic at their offsets.

The worker fetches a source partition at read_uncommitted (data, transactional and
control batches, whole, as the source's log holds them) from the target partition's log
end offset, and hands those bytes here unchanged; the target's leader appends them at
their own offsets (cluster/protocol/internal.py, Log.append_mirrored).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cluster.client.connection import BrokerConnection
from cluster.protocol.internal import MIRROR_APPEND_API_KEY, mirror_append_payload


@dataclass(frozen=True, slots=True)
class MirrorAppendResult:
    """One partition's answer. error_code 0: the batches sent are in the log and below its
    high watermark (acknowledged by every in-sync replica)."""

    partition: int
    error_code: int
    error_message: str | None
    log_end_offset: int
    high_watermark: int
    log_start_offset: int


async def mirror_append(connection: BrokerConnection, topic: str, topic_id: str, batches: Mapping[int, bytes],
                        timeout_s: float, *, log_start_offsets: Mapping[int, int] | None = None
                        ) -> dict[int, MirrorAppendResult]:
    """Send each partition's raw batches to the mirror topic `topic` (whose id, the target
    topic's, must be `topic_id`) on `connection`, the partitions' leader; wait at most
    `timeout_s` for the in-sync replicas. `log_start_offsets`: the source's log start per
    partition, which the mirror follows (up to its high watermark). A request-level
    refusal (malformed, unknown topic or id) comes back as every partition's error."""
    starts = log_start_offsets or {}
    payload = mirror_append_payload(topic, topic_id, int(timeout_s * 1000),
                                    [(p, b, starts.get(p, -1)) for p, b in batches.items()])
    answer = await connection.call_internal(MIRROR_APPEND_API_KEY, payload, timeout_s=timeout_s + 10)
    out = {int(p["partition"]): MirrorAppendResult(int(p["partition"]), int(p["error_code"]), p.get("error_message"),
                                                   int(p["log_end_offset"]), int(p["high_watermark"]),
                                                   int(p["log_start_offset"]))
           for p in answer.get("partitions", [])}
    for p in batches:
        if p not in out:
            out[p] = MirrorAppendResult(p, int(answer.get("error_code", -1)), answer.get("error_message"), -1, -1, -1)
    return out
