"""Raft for the metadata quorum, KRaft style, as a sans-IO state machine.

Followers pull the log from the leader with Fetch (KIP-595), the leader answers with
entries or a divergence point, and commits what a majority of voters has fetched in its
own epoch. Elections use pre-vote, randomized timeouts and the log up-to-date check; a
leader that cannot reach a majority for an election timeout resigns (check-quorum), so a
paused leader steps down when it resumes.

Contract with the driver (trio shell or simulation): after every call, persist
`durable_state()` if `dirty` is set, *then* send `take_outbox()`; time only comes in as
`now_ms`; randomness only from the injected `random.Random`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum

from cluster.protocol.sentinels import NO_LEADER


class Role(Enum):
    FOLLOWER = "follower"
    PROSPECTIVE = "prospective"  # pre-voting
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class Entry:
    epoch: int
    data: bytes


# ---- messages --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VoteRequest:
    epoch: int  # the epoch the candidate would lead (current + 1 for a pre-vote)
    candidate_id: int
    last_epoch: int
    last_offset: int  # log end offset
    pre_vote: bool


@dataclass(frozen=True, slots=True)
class VoteResponse:
    epoch: int
    voter_id: int
    granted: bool
    pre_vote: bool
    leader_id: int = NO_LEADER  # the voter's leader, so a lagging node finds it


@dataclass(frozen=True, slots=True)
class BeginQuorumEpoch:
    epoch: int
    leader_id: int


@dataclass(frozen=True, slots=True)
class EndQuorumEpoch:
    """A leader stepping down (shutting down): followers elect a successor at once."""

    epoch: int
    leader_id: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    epoch: int
    replica_id: int
    fetch_offset: int
    last_fetched_epoch: int
    request_id: int = 0  # echoed in the response: only the in-flight fetch's answer counts


@dataclass(frozen=True, slots=True)
class Snapshot:
    end_offset: int  # entries below are folded into `data`
    last_epoch: int
    data: bytes


@dataclass(frozen=True, slots=True)
class FetchResponse:
    epoch: int
    leader_id: int
    base_offset: int
    entries: tuple[Entry, ...]
    high_watermark: int
    diverging_epoch: int = -1  # set: truncate to diverging_end_offset and fetch again
    diverging_end_offset: int = -1
    snapshot: Snapshot | None = None
    not_leader: bool = False
    request_id: int = 0


Message = VoteRequest | VoteResponse | BeginQuorumEpoch | EndQuorumEpoch | FetchRequest | FetchResponse


@dataclass(frozen=True)
class RaftConfig:
    election_timeout_ms: int = 1000  # randomized in [t, 2t)
    fetch_timeout_ms: int = 1000  # leader resigns without majority fetches for this long
    fetch_interval_ms: int = 50  # follower re-fetch when caught up (stands in for long polling)
    request_timeout_ms: int = 500  # an unanswered fetch is sent again
    max_fetch_entries: int = 256


@dataclass
class DurableState:
    epoch: int = 0
    voted_for: int = NO_LEADER
    log_start_offset: int = 0
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None

    def copy(self) -> DurableState:
        return DurableState(self.epoch, self.voted_for, self.log_start_offset, list(self.entries), self.snapshot)


@dataclass
class ReplicaProgress:
    """A replica as the leader last saw it fetch (Kafka's LeaderState.ReplicaState):
    `caught_up_ms` is the last time it had everything the leader had, -1 never."""

    log_end_offset: int = 0
    last_fetch_ms: int = -1
    caught_up_ms: int = -1
    leader_end_at_last_fetch: int = 0


@dataclass(frozen=True)
class ReplicaView:
    replica_id: int
    log_end_offset: int
    last_fetch_ms: int
    caught_up_ms: int


@dataclass(frozen=True)
class QuorumView:
    """The leader's account of the quorum (DescribeQuorum)."""

    leader_id: int
    epoch: int
    high_watermark: int
    voters: tuple[ReplicaView, ...]
    observers: tuple[ReplicaView, ...]


OBSERVERS_MAX = 1000
OBSERVER_SESSION_MS = 300_000  # an observer silent this long is no longer listed (as Kafka)


class RaftNode:
    def __init__(self, node_id: int, voters: list[int], state: DurableState, config: RaftConfig,
                 rng: random.Random, now_ms: int) -> None:
        self.node_id = node_id
        self.voters = sorted(voters)
        # An observer (a broker beside dedicated controllers) fetches the log like a
        # follower but never votes or campaigns; it finds the leader by asking voters.
        self.is_voter = node_id in self.voters
        self.config = config
        self.rng = rng
        self.state = state
        self.role = Role.FOLLOWER
        self.leader_id = NO_LEADER
        self.high_watermark = state.log_start_offset
        self.dirty = False
        self._outbox: list[tuple[int, Message]] = []
        self._votes: set[int] = set()
        self._rejections: set[int] = set()  # candidate: the voters that refused it this epoch
        # A single voter has nobody to wait for: it elects itself at the first tick.
        self._election_deadline = (now_ms if self.voters == [node_id] or not self.is_voter
                                   else now_ms + self._election_timeout())
        # Follower: when the in-flight fetch is considered lost.
        self._fetch_due_ms: int | None = None
        self._abandoned_leader = NO_LEADER  # the leader whose silence started our pre-vote
        self._resigned_leader = NO_LEADER  # the leader whose EndQuorumEpoch this epoch we heard
        # Why the last pre-vote round began (the driver logs it): a resignation or a timeout.
        self.candidacy_cause = ""
        # (leader id, when its last fetch answer came): a new leader tells its controller how
        # long the old one has been silent, so that node's session is not restarted in full.
        self.last_leader_contact: tuple[int, int] = (NO_LEADER, 0)
        self._leader_heard_ms = now_ms  # when this follower last heard from its leader
        self._fetch_request_id = 0
        self._fetch_in_flight: int | None = None
        # Leader: each voter's fetch offset and when it last fetched.
        self._replica_offsets: dict[int, int] = {}
        self._replica_fetch_ms: dict[int, int] = {}
        self._check_quorum_deadline = 0
        # Leader: what DescribeQuorum reports of every replica that fetched in this epoch,
        # voters and observers (at most OBSERVERS_MAX of those, the stalest dropped first).
        self._replication: dict[int, ReplicaProgress] = {}

    # ---- log helpers -----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def log_end_offset(self) -> int:
        return self.state.log_start_offset + len(self.state.entries)

    @property
    def last_epoch(self) -> int:
        if self.state.entries:
            return self.state.entries[-1].epoch
        return self.state.snapshot.last_epoch if self.state.snapshot else 0

    def entry(self, offset: int) -> Entry:
        return self.state.entries[offset - self.state.log_start_offset]

    def epoch_at(self, offset: int) -> int:
        """Epoch of the entry at `offset` (the snapshot's for offset start-1)."""
        if offset < self.state.log_start_offset:
            return self.state.snapshot.last_epoch if self.state.snapshot else 0
        return self.entry(offset).epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch ≤ `epoch` in the log, the end offset of that epoch)."""
        entries = self.state.entries
        for i in range(len(entries) - 1, -1, -1):
            if entries[i].epoch <= epoch:
                return entries[i].epoch, self.state.log_start_offset + i + 1
        snap = self.state.snapshot
        if snap is not None:
            if snap.last_epoch <= epoch:
                return snap.last_epoch, snap.end_offset
            return -1, -1  # that history is folded into the snapshot: unknown
        return 0, self.state.log_start_offset

    def _majority(self) -> int:
        return len(self.voters) // 2 + 1

    def _election_timeout(self) -> int:
        t = self.config.election_timeout_ms
        return t + self.rng.randrange(t)

    def _retry_backoff(self) -> int:
        t = self.config.election_timeout_ms
        return t // 10 + self.rng.randrange(t // 2 + 1)

    def _send(self, to: int, msg: Message) -> None:
        self._outbox.append((to, msg))

    def _broadcast(self, msg: Message) -> None:
        for v in self.voters:
            if v != self.node_id:
                self._send(v, msg)

    def take_outbox(self) -> list[tuple[int, Message]]:
        out, self._outbox = self._outbox, []
        return out

    def durable_state(self) -> DurableState:
        self.dirty = False
        return self.state

    # ---- role changes ----------------------------------------------------------------

    def _become_follower(self, epoch: int, leader_id: int, now_ms: int) -> None:
        if epoch > self.state.epoch:
            self.state.epoch = epoch
            self.state.voted_for = NO_LEADER
            self.dirty = True
            self._abandoned_leader = NO_LEADER
            self._resigned_leader = NO_LEADER
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self._leader_heard_ms = now_ms
        self._votes = set()
        self._election_deadline = now_ms + self._election_timeout()
        self._fetch_due_ms = None
        if leader_id != NO_LEADER:
            self._fetch(now_ms)

    def _start_pre_vote(self, now_ms: int) -> None:
        if self.leader_id != NO_LEADER:
            self._abandoned_leader = self.leader_id
        if self.role is Role.FOLLOWER:
            self.candidacy_cause = (f"leader {self._resigned_leader} resigned" if self._resigned_leader != NO_LEADER
                                    else "no leader heard for an election timeout")
        self.role = Role.PROSPECTIVE
        self.leader_id = NO_LEADER
        self._fetch_due_ms = None
        self._votes = {self.node_id}
        # A failed pre-vote round is retried soon: voters that still heard the leader a
        # moment ago grant it a little later (pre-votes never disturb a healthy quorum).
        self._election_deadline = now_ms + self._retry_backoff()
        if len(self.voters) == 1:
            self._start_election(now_ms)
            return
        self._broadcast(VoteRequest(self.epoch + 1, self.node_id, self.last_epoch, self.log_end_offset, True))

    def _start_election(self, now_ms: int) -> None:
        self.role = Role.CANDIDATE
        self.state.epoch += 1
        self.state.voted_for = self.node_id
        self.dirty = True
        self._votes = {self.node_id}
        self._rejections = set()
        # The votes are waited for a whole election timeout, as Kafka's CandidateState does:
        # each vote is made durable (fsynced) on the candidate and on the voter before it
        # goes out, and on a busy disk that round trip took longer than the short backoff
        # a candidacy used to last; every candidate then gave up just before its votes
        # came, the next one raised the epoch again, and the quorum had no leader for 40 s.
        # A candidacy a majority refused (a split vote) is retried after the short backoff
        # (Kafka's election.backoff.max.ms), see _on_vote_response.
        self._election_deadline = now_ms + self._election_timeout()
        if len(self._votes) >= self._majority():
            self._become_leader(now_ms)
            return
        self._broadcast(VoteRequest(self.epoch, self.node_id, self.last_epoch, self.log_end_offset, False))

    def _become_leader(self, now_ms: int) -> None:
        self.role = Role.LEADER
        self.leader_id = self.node_id
        self._fetch_due_ms = None
        self._replica_offsets = {v: 0 for v in self.voters}
        self._replica_fetch_ms = {v: now_ms for v in self.voters}
        self._replication = {}
        self._check_quorum_deadline = now_ms + self.config.fetch_timeout_ms
        # A leader can only commit entries of its own epoch: append a marker at once.
        self._append(Entry(self.epoch, b""))
        self._broadcast(BeginQuorumEpoch(self.epoch, self.node_id))
        self._advance_high_watermark()

    def _append(self, entry: Entry) -> int:
        offset = self.log_end_offset
        self.state.entries.append(entry)
        self.dirty = True
        self._replica_offsets[self.node_id] = self.log_end_offset
        return offset

    # ---- API -------------------------------------------------------------------------

    def propose(self, data: bytes, now_ms: int) -> int | None:
        """Append to the log if leader; returns the entry's offset (committed later)."""
        if self.role is not Role.LEADER:
            return None
        offset = self._append(Entry(self.epoch, data))
        self._advance_high_watermark()
        return offset

    def next_deadline_ms(self) -> int:
        deadlines = [self._election_deadline] if self.role is not Role.LEADER else [self._check_quorum_deadline]
        if self._fetch_due_ms is not None:
            deadlines.append(self._fetch_due_ms)
        return min(deadlines)

    def tick(self, now_ms: int) -> None:
        if self.role is Role.LEADER:
            if now_ms >= self._check_quorum_deadline:
                recent = sum(1 for v in self.voters
                             if v == self.node_id or now_ms - self._replica_fetch_ms.get(v, 0) < self.config.fetch_timeout_ms)
                if recent < self._majority():
                    # Cut off from a majority: resign so clients look for the real leader.
                    self._become_follower(self.epoch, NO_LEADER, now_ms)
                    return
                self._check_quorum_deadline = now_ms + self.config.fetch_timeout_ms
                # Voters that went quiet (restarted, or missed the first announcement) hear it again.
                for v in self.voters:
                    if v != self.node_id and now_ms - self._replica_fetch_ms.get(v, 0) >= self.config.fetch_timeout_ms // 2:
                        self._send(v, BeginQuorumEpoch(self.epoch, self.node_id))
            return
        if not self.is_voter:
            if now_ms >= self._election_deadline:
                # No word from a leader for an election timeout: ask a voter who leads.
                self.leader_id = NO_LEADER
                self._election_deadline = now_ms + self._election_timeout()
                self._fetch(now_ms)
            elif self._fetch_due_ms is not None and now_ms >= self._fetch_due_ms:
                self._fetch(now_ms)
            return
        if self._fetch_due_ms is not None and now_ms >= self._fetch_due_ms:
            self._fetch(now_ms)
        if now_ms >= self._election_deadline:
            # A failed candidacy goes back to pre-voting, so a node with a stale log cannot
            # keep raising the epoch and deposing healthy leaders.
            self._start_pre_vote(now_ms)

    def resign(self, now_ms: int) -> None:
        """Stop leading (before a shutdown) and tell the voters, so one of them takes over
        without waiting out an election timeout."""
        if self.role is not Role.LEADER:
            return
        self._broadcast(EndQuorumEpoch(self.epoch, self.node_id))
        self.role = Role.FOLLOWER
        self.leader_id = NO_LEADER
        self._fetch_due_ms = None
        # Stand back: a resigned node lets the others elect the successor.
        self._election_deadline = now_ms + 4 * self.config.election_timeout_ms

    def replicated_to_all(self, offset: int, now_ms: int) -> bool:
        """Leader: has every voter that fetched recently fetched from `offset` on?"""
        return all(self._replica_offsets.get(v, 0) >= offset for v in self.voters
                   if v != self.node_id and now_ms - self._replica_fetch_ms.get(v, 0) < self.config.fetch_timeout_ms)

    def snapshot(self, end_offset: int, data: bytes) -> None:
        """Fold committed entries below `end_offset` into a snapshot and drop them."""
        assert end_offset <= self.high_watermark and end_offset > self.state.log_start_offset
        last_epoch = self.epoch_at(end_offset - 1)
        drop = end_offset - self.state.log_start_offset
        self.state.entries = self.state.entries[drop:]
        self.state.log_start_offset = end_offset
        self.state.snapshot = Snapshot(end_offset, last_epoch, data)
        self.dirty = True

    # ---- receive ---------------------------------------------------------------------

    def receive(self, sender: int, msg: Message, now_ms: int) -> None:
        if isinstance(msg, VoteRequest):
            self._on_vote_request(msg, now_ms)
        elif isinstance(msg, VoteResponse):
            self._on_vote_response(msg, now_ms)
        elif isinstance(msg, BeginQuorumEpoch):
            if msg.epoch > self.epoch or (msg.epoch == self.epoch and self.role is not Role.LEADER):
                self._become_follower(msg.epoch, msg.leader_id, now_ms)
        elif isinstance(msg, EndQuorumEpoch):
            if msg.epoch == self.epoch and self.leader_id == msg.leader_id and self.role is Role.FOLLOWER:
                # The leader stepped down: campaign soon (randomized, so voters do not collide).
                self._abandoned_leader = msg.leader_id
                self._resigned_leader = msg.leader_id
                self.leader_id = NO_LEADER
                self._fetch_due_ms = None
                if self.is_voter:
                    self._election_deadline = now_ms + self.rng.randrange(self.config.election_timeout_ms // 4 + 1)
        elif isinstance(msg, FetchRequest):
            self._on_fetch_request(msg, now_ms)
        elif isinstance(msg, FetchResponse):
            self._on_fetch_response(msg, now_ms)

    def _log_up_to_date(self, last_epoch: int, last_offset: int) -> bool:
        return (last_epoch, last_offset) >= (self.last_epoch, self.log_end_offset)

    def _on_vote_request(self, msg: VoteRequest, now_ms: int) -> None:
        if not self.is_voter:
            return
        if msg.pre_vote:
            # Grant only if we have no live leader ourselves (no disruption of a healthy quorum).
            # A follower counts its leader alive until it has been silent for the base election
            # timeout (not this node's randomized deadline, which can be up to twice that):
            # otherwise the voter with the longer log can be refused until its second try.
            has_leader = self.role is Role.LEADER or (
                self.role is Role.FOLLOWER and self.leader_id != NO_LEADER
                and now_ms - self._leader_heard_ms < self.config.election_timeout_ms
            )
            granted = msg.epoch > self.epoch and not has_leader and self._log_up_to_date(msg.last_epoch, msg.last_offset)
            # A pre-vote answer carries the voter's epoch and leader so a lagging node catches up.
            self._send(msg.candidate_id, VoteResponse(self.epoch, self.node_id, granted, True,
                                                      self.leader_id if has_leader else NO_LEADER))
            return
        if msg.epoch < self.epoch:
            self._send(msg.candidate_id, VoteResponse(self.epoch, self.node_id, False, False))
            return
        if msg.epoch > self.epoch:
            self._become_follower(msg.epoch, NO_LEADER, now_ms)
        granted = (self.state.voted_for in (NO_LEADER, msg.candidate_id)
                   and self.role is not Role.LEADER
                   and self._log_up_to_date(msg.last_epoch, msg.last_offset))
        if granted and self.state.voted_for != msg.candidate_id:
            self.state.voted_for = msg.candidate_id
            self.dirty = True
        if granted:
            self._election_deadline = now_ms + self._election_timeout()
        self._send(msg.candidate_id, VoteResponse(self.epoch, self.node_id, granted, False))

    def _on_vote_response(self, msg: VoteResponse, now_ms: int) -> None:
        if msg.pre_vote:
            leader = msg.leader_id if msg.leader_id != self.node_id else NO_LEADER
            if msg.epoch > self.epoch:
                self._become_follower(msg.epoch, leader, now_ms)
            elif (msg.epoch == self.epoch and leader not in (NO_LEADER, self._abandoned_leader)
                  and self.role is Role.PROSPECTIVE):
                # Others still follow a leader we have not heard of: try it before campaigning
                # (but not the one whose silence made us campaign; voters lag in noticing it).
                self._become_follower(self.epoch, leader, now_ms)
            elif self.role is Role.PROSPECTIVE and msg.granted:
                self._votes.add(msg.voter_id)
                if len(self._votes) >= self._majority():
                    self._start_election(now_ms)
            return
        if msg.epoch > self.epoch:
            self._become_follower(msg.epoch, NO_LEADER, now_ms)
            return
        if self.role is Role.CANDIDATE and msg.epoch == self.epoch and msg.granted:
            self._votes.add(msg.voter_id)
            if len(self._votes) >= self._majority():
                self._become_leader(now_ms)
        elif self.role is Role.CANDIDATE and msg.epoch == self.epoch:
            self._rejections.add(msg.voter_id)
            if len(self._rejections) > len(self.voters) - self._majority():
                # This candidacy cannot win: pre-vote again soon, not after a whole timeout.
                self._election_deadline = min(self._election_deadline, now_ms + self._retry_backoff())

    # ---- replication -----------------------------------------------------------------

    def _fetch(self, now_ms: int) -> None:
        target = self.leader_id
        if target == NO_LEADER and not self.is_voter:
            target = self.rng.choice(self.voters)  # an observer discovers the leader through any voter
        if target == NO_LEADER or target == self.node_id:
            self._fetch_due_ms = None
            return
        self._fetch_request_id += 1
        self._fetch_in_flight = self._fetch_request_id
        self._send(target, FetchRequest(self.epoch, self.node_id, self.log_end_offset,
                                                self.epoch_at(self.log_end_offset - 1) if self.log_end_offset else 0,
                                                self._fetch_request_id))
        self._fetch_due_ms = now_ms + self.config.request_timeout_ms

    def _on_fetch_request(self, msg: FetchRequest, now_ms: int) -> None:
        if msg.epoch > self.epoch:
            self._become_follower(msg.epoch, NO_LEADER, now_ms)
        if self.role is not Role.LEADER:
            self._send(msg.replica_id, FetchResponse(self.epoch, self.leader_id, msg.fetch_offset, (), -1,
                                                     not_leader=True, request_id=msg.request_id))
            return
        if msg.epoch < self.epoch:
            # A follower of an older epoch: tell it who leads now; it fetches again.
            self._send(msg.replica_id, FetchResponse(self.epoch, self.node_id, msg.fetch_offset, (), -1,
                                                     request_id=msg.request_id))
            return
        # Any fetch of this epoch shows the voter is alive (check-quorum), even one that is
        # answered with a snapshot or a divergence.
        if msg.replica_id in self._replica_fetch_ms:
            self._replica_fetch_ms[msg.replica_id] = now_ms
        base = msg.fetch_offset
        diverging = (0, 0)
        if base > 0:
            diverging = self.end_offset_for_epoch(msg.last_fetched_epoch)
        if base < self.state.log_start_offset or diverging == (-1, -1):
            # The follower is behind our snapshot, or diverges inside it: send the snapshot.
            snap = self.state.snapshot
            assert snap is not None
            self._send(msg.replica_id, FetchResponse(self.epoch, self.node_id, base, (), self.high_watermark,
                                                     snapshot=snap, request_id=msg.request_id))
            return
        if base > 0:
            epoch, end = diverging
            if epoch != msg.last_fetched_epoch or end < base:
                self._send(msg.replica_id, FetchResponse(self.epoch, self.node_id, base, (), self.high_watermark,
                                                         diverging_epoch=epoch, diverging_end_offset=end,
                                                         request_id=msg.request_id))
                return
        self._note_fetch(msg.replica_id, base, now_ms)
        # The fetch offset is the follower's proof of what it has durably appended.
        if msg.replica_id in self._replica_offsets:
            self._replica_offsets[msg.replica_id] = base
            self._advance_high_watermark()
        start = base - self.state.log_start_offset
        entries = tuple(self.state.entries[start : start + self.config.max_fetch_entries])
        self._send(msg.replica_id, FetchResponse(self.epoch, self.node_id, base, entries, self.high_watermark,
                                                 request_id=msg.request_id))

    def _note_fetch(self, replica_id: int, fetch_offset: int, now_ms: int) -> None:
        """Kafka's ReplicaState.updateFollowerState: caught up when the fetch reaches the
        leader's end now, or the end the leader had at the replica's previous fetch."""
        progress = self._replication.get(replica_id)
        if progress is None:
            if replica_id not in self.voters and len(self._replication) >= OBSERVERS_MAX + len(self.voters):
                stalest = min((r for r in self._replication if r not in self.voters),
                              key=lambda r: self._replication[r].last_fetch_ms)
                del self._replication[stalest]
            progress = self._replication[replica_id] = ReplicaProgress()
        end = self.log_end_offset
        if fetch_offset >= end:
            progress.caught_up_ms = max(progress.caught_up_ms, now_ms)
        elif 0 < progress.leader_end_at_last_fetch <= fetch_offset:
            progress.caught_up_ms = max(progress.caught_up_ms, progress.last_fetch_ms)
        progress.log_end_offset = fetch_offset
        progress.leader_end_at_last_fetch = end
        progress.last_fetch_ms = now_ms

    def quorum_view(self, now_ms: int) -> QuorumView | None:
        """Leader: every voter (this one as of now) and the observers heard from within
        OBSERVER_SESSION_MS; None on any other node."""
        if self.role is not Role.LEADER:
            return None

        def view(replica_id: int) -> ReplicaView:
            if replica_id == self.node_id:
                return ReplicaView(replica_id, self.log_end_offset, now_ms, now_ms)
            p = self._replication.get(replica_id, ReplicaProgress(log_end_offset=-1))
            return ReplicaView(replica_id, p.log_end_offset, p.last_fetch_ms, p.caught_up_ms)

        observers = sorted(r for r, p in self._replication.items()
                           if r not in self.voters and now_ms - p.last_fetch_ms < OBSERVER_SESSION_MS)
        return QuorumView(self.node_id, self.epoch, self.high_watermark, tuple(view(v) for v in self.voters),
                          tuple(view(o) for o in observers))

    def _advance_high_watermark(self) -> None:
        offsets = sorted((self._replica_offsets.get(v, 0) for v in self.voters), reverse=True)
        majority_offset = offsets[self._majority() - 1]
        if majority_offset > self.high_watermark and self.epoch_at(majority_offset - 1) == self.epoch:
            self.high_watermark = majority_offset

    def _on_fetch_response(self, msg: FetchResponse, now_ms: int) -> None:
        leader = msg.leader_id if msg.leader_id != self.node_id else NO_LEADER
        if msg.epoch > self.epoch:
            self._become_follower(msg.epoch, leader, now_ms)  # fetches again if the leader is known
            return
        if msg.epoch < self.epoch or self.role is Role.LEADER:
            return
        if msg.request_id != self._fetch_in_flight:
            return  # a late or duplicated answer to an earlier fetch
        self._fetch_in_flight = None
        if msg.not_leader:
            if self.role is Role.FOLLOWER:
                self.leader_id = leader
                if leader != NO_LEADER or not self.is_voter:
                    self._fetch_due_ms = now_ms + self.config.fetch_interval_ms  # an observer asks again
                else:
                    self._fetch_due_ms = None
            return
        if self.role is not Role.FOLLOWER:
            # A leader of our epoch exists: stop campaigning.
            self._become_follower(msg.epoch, msg.leader_id, now_ms)
            return
        self.leader_id = msg.leader_id
        self.last_leader_contact = (msg.leader_id, now_ms)
        self._leader_heard_ms = now_ms
        self._election_deadline = now_ms + self._election_timeout()
        if msg.high_watermark < 0:
            self._fetch(now_ms)  # the leader told us its epoch only
            return
        assert msg.base_offset == self.log_end_offset, "an in-flight fetch answer matches the log end"
        if msg.snapshot is not None:
            snap = msg.snapshot
            self.state.snapshot = snap
            self.state.log_start_offset = snap.end_offset
            self.state.entries = []
            self.dirty = True
            # Committed entries past the snapshot come back with the next fetches.
            self.high_watermark = snap.end_offset
            self._fetch(now_ms)
            return
        if msg.diverging_epoch >= 0:
            end = max(min(msg.diverging_end_offset, self.end_offset_for_epoch(msg.diverging_epoch)[1]),
                      self.state.log_start_offset)
            self._truncate(end)
            self._fetch(now_ms)
            return
        if msg.entries:
            self.state.entries.extend(msg.entries)
            self.dirty = True
        self.high_watermark = max(self.high_watermark, min(msg.high_watermark, self.log_end_offset))
        if msg.entries:
            self._fetch(now_ms)
        else:
            self._fetch_due_ms = now_ms + self.config.fetch_interval_ms

    def _truncate(self, end_offset: int) -> None:
        keep = end_offset - self.state.log_start_offset
        if keep < len(self.state.entries):
            assert end_offset >= self.high_watermark, "never truncate committed entries"
            del self.state.entries[keep:]
            self.dirty = True
