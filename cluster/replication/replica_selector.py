"""Which replica a consumer should read from (KIP-392, fetch from follower).

A leader answers a consumer's Fetch (v11+, which carries the consumer's `rack_id`) with a
`preferred_read_replica` when the configured selector picks another replica; the consumer
then fetches from that follower, which serves records up to the high watermark it knows.
This module is the choice alone, sans-IO: the replica manager hands it the candidates.

Kafka's `replica.selector.class` names the selector; Kafka ships one
(`org.apache.kafka.common.replica.RackAwareReplicaSelector`), which this implements:
- no client rack, or no replica in the client's rack: the leader;
- the leader in the client's rack: the leader;
- otherwise the most caught-up replica in the client's rack (largest log end offset, then
  the one caught up most recently).
Candidates are the leader and the in-sync followers whose log holds the fetch offset
(Kafka's `ReplicaManager.findPreferredReadReplica`), so a lagging follower is never chosen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
# Kafka's default: no selector, consumers read from leaders.
SELECTORS = ("", RACK_AWARE_SELECTOR)


@dataclass(frozen=True, slots=True)
class ReplicaView:
    broker_id: int
    rack: str | None
    log_end_offset: int
    since_caught_up_ms: int  # 0 for the leader


def rack_aware_select(client_rack: str, leader: ReplicaView, followers: Iterable[ReplicaView]) -> int:
    """The broker a consumer in `client_rack` should fetch from (the leader's id or a follower's)."""
    if not client_rack:
        return leader.broker_id
    same_rack = [r for r in (leader, *followers) if r.rack == client_rack]
    if not same_rack or leader in same_rack:
        return leader.broker_id
    best = max(same_rack, key=lambda r: (r.log_end_offset, -r.since_caught_up_ms))
    return best.broker_id


def check_selector(name: str) -> str:
    """A `replica.selector.class` value, or ValueError naming the ones there are."""
    if name not in SELECTORS:
        raise ValueError(f"replica.selector.class {name!r} is not available; use {RACK_AWARE_SELECTOR} "
                         "(rack-aware fetch from follower) or leave it empty (consumers read from leaders)")
    return name
