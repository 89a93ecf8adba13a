"""The share coordinator (KIP-932), sans-IO: the durable state of the share partitions whose
`__share_group_state` partition this broker leads, and the decisions of Kafka's
inter-broker share-state calls over it.

A call is decided here (`read`, `write`, `initialize`, `delete`, `summary`), the record it
needs is appended and replicated by the shell (cluster/groups/share_state_service.py), and
only then `applied`: a state is never answered before it is durable. Fencing, as Kafka's
ShareCoordinatorShard:
- a read or write with a leader epoch below the stored one: FENCED_LEADER_EPOCH (a share
  partition's old leader cannot overwrite what its successor read); a read with a higher
  one records it, so the old leader's later writes are fenced;
- a write or initialize with a state epoch below the stored one: FENCED_STATE_EPOCH (the
  state was reset, by AlterShareGroupOffsets, since that leader read it).

Where Kafka answers a read of a share partition the group coordinator never initialized
with an error, ours answers its start offset as -1 (the leader then starts it by
`share.auto.offset.reset`) and writes the reader's leader epoch: a share group from before
the group coordinator initialized share partitions (it does since DescribeShareGroupOffsets
and its siblings came, cluster/groups/share_group_offsets.py) keeps working.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cluster.groups.share_partition import StateBatch
from cluster.groups.share_state_records import (
    UNINITIALIZED,
    ShareKey,
    ShareStateValue,
    StateRecordError,
    check_batches,
    merge_batches,
)
from cluster.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class StateRecord:
    """What the shell appends for a decision (None value: a tombstone)."""

    key: ShareKey
    value: ShareStateValue | None


@dataclass(frozen=True, slots=True)
class Decision:
    error: ErrorCode
    message: str | None = None
    record: StateRecord | None = None  # appended (and applied) before the answer
    state: ShareStateValue | None = None  # what a read answers


class ShareCoordinator:
    def __init__(self) -> None:
        self.states: dict[ShareKey, ShareStateValue] = {}

    # ---- ownership ----------------------------------------------------------------------

    def load(self, states: dict[ShareKey, ShareStateValue]) -> None:
        self.states.update(states)

    def unload(self, owned: Callable[[ShareKey], bool]) -> int:
        """Forget the share partitions for which `owned` is true; how many."""
        gone = [k for k in self.states if owned(k)]
        for k in gone:
            del self.states[k]
        return len(gone)

    def applied(self, record: StateRecord) -> None:
        """A record is durable: it is the state now."""
        if record.value is None:
            self.states.pop(record.key, None)
        else:
            self.states[record.key] = record.value

    # ---- the calls ----------------------------------------------------------------------

    def read(self, key: ShareKey, leader_epoch: int) -> Decision:
        """ReadShareGroupState: the state (start offset -1 when none), fencing older leaders."""
        stored = self.states.get(key)
        if stored is None:
            stored = ShareStateValue(0, -1, UNINITIALIZED)
        if leader_epoch < stored.leader_epoch:
            return Decision(ErrorCode.fenced_leader_epoch,
                            f"leader epoch {leader_epoch} is older than {stored.leader_epoch}")
        record = None
        if leader_epoch > stored.leader_epoch:
            stored = ShareStateValue(stored.state_epoch, leader_epoch, stored.start_offset, stored.batches)
            record = StateRecord(key, stored)
        return Decision(ErrorCode.none, record=record, state=stored)

    def summary(self, key: ShareKey, leader_epoch: int) -> Decision:
        """ReadShareGroupStateSummary: the state with its batches (the answer counts the
        settled records, not the runs); no state at all for a share partition never
        initialized (the answer's -1s); records nothing. Leader epoch -1 (the group
        coordinator's describe) fences nothing."""
        stored = self.states.get(key)
        if stored is None:
            return Decision(ErrorCode.none)
        if leader_epoch != -1 and leader_epoch < stored.leader_epoch:  # -1: an admin's read, not a leader's
            return Decision(ErrorCode.fenced_leader_epoch,
                            f"leader epoch {leader_epoch} is older than {stored.leader_epoch}")
        return Decision(ErrorCode.none, state=stored)

    def write(self, key: ShareKey, state_epoch: int, leader_epoch: int, start_offset: int,
              batches: tuple[StateBatch, ...]) -> Decision:
        """WriteShareGroupState: the batches merged over the stored ones, the start offset
        moved (-1: unchanged), records below it dropped."""
        stored = self.states.get(key)
        if stored is not None:
            if leader_epoch < stored.leader_epoch:
                return Decision(ErrorCode.fenced_leader_epoch,
                                f"leader epoch {leader_epoch} is older than {stored.leader_epoch}")
            if state_epoch < stored.state_epoch:
                return Decision(ErrorCode.fenced_state_epoch,
                                f"state epoch {state_epoch} is older than {stored.state_epoch}")
        start = start_offset if start_offset != UNINITIALIZED else (
            stored.start_offset if stored is not None else UNINITIALIZED)
        if start == UNINITIALIZED:
            return Decision(ErrorCode.invalid_request, "the share partition's start offset is not known")
        try:
            check_batches(-1, batches)
            merged = merge_batches(stored.batches if stored is not None else (), batches, start)
            value = ShareStateValue(max(state_epoch, 0), max(leader_epoch, stored.leader_epoch if stored else -1),
                                    start, merged)
            check_batches(start, merged)
        except StateRecordError as exc:
            return Decision(ErrorCode.invalid_request, str(exc))
        return Decision(ErrorCode.none, record=StateRecord(key, value))

    def initialize(self, key: ShareKey, state_epoch: int, start_offset: int) -> Decision:
        """InitializeShareGroupState: a fresh state (no batches) at `start_offset` (-1: not
        started, the leader picks it) under `state_epoch`."""
        stored = self.states.get(key)
        if stored is not None and state_epoch < stored.state_epoch:
            return Decision(ErrorCode.fenced_state_epoch,
                            f"state epoch {state_epoch} is older than {stored.state_epoch}")
        if state_epoch < 0 or start_offset < UNINITIALIZED:
            return Decision(ErrorCode.invalid_request, f"state epoch {state_epoch}, start offset {start_offset}")
        leader_epoch = stored.leader_epoch if stored is not None else -1
        return Decision(ErrorCode.none, record=StateRecord(key, ShareStateValue(state_epoch, leader_epoch,
                                                                                start_offset)))

    def delete(self, key: ShareKey) -> Decision:
        """DeleteShareGroupState: a tombstone (nothing to write for an unknown key)."""
        if key not in self.states:
            return Decision(ErrorCode.none)
        return Decision(ErrorCode.none, record=StateRecord(key, None))
