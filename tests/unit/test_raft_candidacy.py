"""How long a quorum candidate waits for its votes (cluster/quorum/raft.py, sans-IO).

A vote is made durable (fsynced) by the candidate before its requests go out and by each
voter before its answer does. In the mirror fault test, on a busy disk, that took longer
than the 100-600 ms a candidacy lasted: every candidate gave up just before its votes came,
pre-voted, raised the epoch again, and the quorum went 48 s (epochs 1 to 40) without a
leader, so no broker heartbeat was answered and transactions timed out."""

from __future__ import annotations

import random

from cluster.quorum.raft import DurableState, RaftConfig, RaftNode, Role, VoteRequest, VoteResponse

CONFIG = RaftConfig()  # election timeout 1000 ms, as brokers run


def candidate() -> tuple[RaftNode, int]:
    """Node 1 of three, after its leader went silent: pre-voted, granted by node 2, now a
    candidate in epoch 1 that has sent its vote requests. (the node, the time)"""
    node = RaftNode(1, [1, 2, 3], DurableState(), CONFIG, random.Random(11), 0)
    now = node.next_deadline_ms()
    node.tick(now)
    assert node.role is Role.PROSPECTIVE
    node.take_outbox()
    node.receive(2, VoteResponse(0, 2, True, True), now)
    assert (node.role, node.epoch) == (Role.CANDIDATE, 1)
    requests = node.take_outbox()
    assert sorted(to for to, _ in requests) == [2, 3]
    assert all(isinstance(m, VoteRequest) and not m.pre_vote and m.epoch == 1 for _, m in requests)
    return node, now


def test_a_candidate_waits_for_a_vote_slow_to_be_made_durable() -> None:
    node, start = candidate()
    later = start + 900  # node 2 grants, but its vote took 900 ms to be synced and sent
    for t in range(start, later + 1, 50):
        node.tick(t)
        assert (node.role, node.epoch) == (Role.CANDIDATE, 1), t
    node.receive(2, VoteResponse(1, 2, True, False), later)
    assert (node.role, node.epoch, node.leader_id) == (Role.LEADER, 1, 1)


def test_a_candidacy_a_majority_refused_is_given_up_soon() -> None:
    """A split vote: both other voters voted for another candidate of the same epoch. The
    candidate pre-votes again after the short backoff (at most half an election timeout
    and a tenth), not after a whole one."""
    node, start = candidate()
    node.receive(2, VoteResponse(1, 2, False, False), start + 10)
    node.tick(start + 10)
    assert node.role is Role.CANDIDATE  # one refusal of two possible: it could still win
    node.receive(3, VoteResponse(1, 3, False, False), start + 20)
    backoff_max = CONFIG.election_timeout_ms // 10 + CONFIG.election_timeout_ms // 2
    assert node.next_deadline_ms() <= start + 20 + backoff_max
    node.tick(start + 20 + backoff_max)
    assert node.role is Role.PROSPECTIVE
