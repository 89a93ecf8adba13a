"""MirrorAppend from a mirror worker: source batches into a mirror topic at their offsets.

The worker fetches a source partition at read_uncommitted (data, transactional and
control batches, whole, as the source's log holds them) from the target partition's log
end offset, and hands those bytes here unchanged; the target's leader appends them at
their own offsets (cluster/protocol/internal.py, Log.append_mirrored).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cluster.client.connection import BrokerConnection
from cluster.protocol.internal import MIRROR_APPEND_API_KEY, mirror_append_payload


async def mirror_append(connection: BrokerConnection, topic: str, topic_id: str, batches: Mapping[int, bytes],
                        timeout_s: float, *, log_start_offsets: Mapping[int, int] | None = None
                        ) -> dict[int, dict[str, Any]]:
    """Send each partition's raw batches to the mirror topic `topic` (whose id, the target
    topic's, must be `topic_id`) on `connection`, the partitions' leader; wait at most
    `timeout_s` for the in-sync replicas. `log_start_offsets`: the source's log start per
    partition, which the mirror follows (up to its high watermark).

    The answer per partition: {partition, error_code, error_message, log_end_offset,
    high_watermark, log_start_offset}; error_code 0 means the batches sent are in the log
    below its high watermark (every in-sync replica has them). A refusal of the whole
    request (malformed, unknown topic, another topic id) is every partition's answer."""
    starts = log_start_offsets or {}
    payload = mirror_append_payload(topic, topic_id, int(timeout_s * 1000),
                                    [(p, b, starts.get(p, -1)) for p, b in batches.items()])
    answer = await connection.call_internal(MIRROR_APPEND_API_KEY, payload, timeout_s=timeout_s + 10)
    out: dict[int, dict[str, Any]] = {int(p["partition"]): p for p in answer.get("partitions", [])}
    for p in batches:
        out.setdefault(p, {"partition": p, "error_code": int(answer.get("error_code", -1)),
                           "error_message": answer.get("error_message"), "log_end_offset": -1,
                           "high_watermark": -1, "log_start_offset": -1})
    return out
