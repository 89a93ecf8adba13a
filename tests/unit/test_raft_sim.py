"""Seeded simulation of the metadata quorum (cluster/quorum/raft.py); see tests/quorum_sim.py."""

from __future__ import annotations

import os

import pytest

from tests.quorum_sim import QuorumSim

SEEDS = int(os.environ.get("DCMIRROR_RAFT_SEEDS", "1000"))
REPLAY = os.environ.get("DCMIRROR_RAFT_SEED")
CHUNKS = 8


def _run(seed: int) -> QuorumSim:
    nodes = 3 + 2 * (seed % 2)  # 3- and 5-voter quorums
    observers = (seed // 2) % 3  # 0, 1 or 2 observers (brokers beside dedicated controllers)
    sim = QuorumSim(seed, nodes=nodes, observers=observers).run()
    # After the faults stop (all healed and restarted, 6 s to settle) there is one leader
    # and it committed recent proposals.
    leader = sim.leader()
    assert leader is not None, f"seed {seed}: no leader after the quorum settled"
    assert leader.high_watermark > 0 and len(sim.committed) > 0, f"seed {seed}: nothing committed"
    # Observers found the leader and followed the log: each has at least what was committed
    # when the faults stopped (messages are still dropped while settling, so not the very end).
    for observer_id in sim.ids[nodes:]:
        observer = sim.nodes[observer_id]
        assert observer is not None and observer.high_watermark >= max(1, sim.committed_when_faults_stopped), (
            f"seed {seed}: observer {observer_id} has committed {observer and observer.high_watermark}, "
            f"{sim.committed_when_faults_stopped} were committed when the faults stopped")
    # DescribeQuorum's view: every voter in order (the leader as of now), every observer that
    # fetched from this leader; nobody ahead of the leader, nobody caught up after its last fetch.
    view = leader.quorum_view(sim.now)
    assert view is not None and view.leader_id == leader.node_id and view.high_watermark == leader.high_watermark
    assert [v.replica_id for v in view.voters] == sim.voter_ids
    assert [o.replica_id for o in view.observers] == sim.ids[nodes:]
    for v in (*view.voters, *view.observers):
        assert v.log_end_offset <= leader.log_end_offset and v.caught_up_ms <= v.last_fetch_ms <= sim.now, (seed, v)
    return sim


@pytest.mark.skipif(REPLAY is None, reason="set DCMIRROR_RAFT_SEED to replay one seed")
def test_replay_seed() -> None:
    assert REPLAY is not None
    sim = _run(int(REPLAY))
    print(f"seed {REPLAY}: {sim.stats}, committed {len(sim.committed)}")


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_simulated_quorum_is_safe(chunk: int) -> None:
    """≥ 1,000 seeds across the chunks: safety checkers run throughout each run."""
    totals = {"events": 0, "crashes": 0, "partitions": 0, "elections": 0, "snapshots": 0, "resignations": 0}
    for seed in range(chunk, SEEDS, CHUNKS):
        sim = _run(seed)
        for k, v in sim.stats.items():
            totals[k] += v
    print(f"chunk {chunk}: {totals}")
    # The faults really happened (a simulation that injects nothing proves nothing).
    assert totals["crashes"] > 0 and totals["partitions"] > 0 and totals["elections"] > SEEDS // CHUNKS
    assert totals["resignations"] > 0
