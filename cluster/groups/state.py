"""A consumer group's state: members, generation, committed offsets (Kafka's GroupMetadata).

Plain data shared by the coordinator (coordinator.py), which changes it, and the records of
`__consumer_offsets` (records.py), which persist and replay it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from cluster.groups.consumer_group import ConsumerGroupState


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class Pending:
    """An answer that may not be ready yet; `on_done` lets a driver wake its waiter."""

    __slots__ = ("done", "result", "on_done")

    def __init__(self) -> None:
        self.done = False
        self.result: dict[str, Any] = {}
        self.on_done: Callable[[], None] | None = None

    def complete(self, result: dict[str, Any]) -> None:
        if self.done:
            return
        self.done = True
        self.result = result
        if self.on_done is not None:
            self.on_done()

    @classmethod
    def ready(cls, result: dict[str, Any]) -> Pending:
        p = cls()
        p.complete(result)
        return p


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    last_heartbeat_ms: int
    assignment: bytes = b""
    join_waiter: Pending | None = None
    sync_waiter: Pending | None = None

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


@dataclass
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id → member id
    pending_member_ids: dict[str, int] = field(default_factory=dict)  # member id → deadline
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    state_timestamp_ms: int = 0
    join_deadline_ms: int | None = None
    in_initial_delay: bool = False
    initial_delay_cap_ms: int = 0
    sync_deadline_ms: int | None = None
    # A KIP-848 consumer group (consumer_group.py) when not None; the classic fields above
    # are then unused, and the two kinds share `offsets`.
    consumer: ConsumerGroupState | None = None

    @property
    def group_type(self) -> str:
        """ListGroups v5's type: "consumer" (KIP-848) or "classic"."""
        return "consumer" if self.consumer is not None else "classic"

    @property
    def has_members(self) -> bool:
        return bool(self.members) or bool(self.pending_member_ids) or (
            self.consumer is not None and bool(self.consumer.members))

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp_ms = now_ms

    def all_rejoined(self) -> bool:
        return all(m.join_waiter is not None for m in self.members.values()) and not self.pending_member_ids

    def candidate_protocols(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Each member votes for its most preferred candidate; the most votes win (Kafka's rule)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(sorted(votes), key=lambda name: votes[name])

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        names = {name for name, _ in protocols}
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())
